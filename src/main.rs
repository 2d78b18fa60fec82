//! The `toolboxd` command line: a thin clap layer, one function per
//! subcommand, each handing its work to the library (`daemon`, `control`,
//! `cli/`).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::{Args, Parser, Subcommand, ValueEnum};
use serde_json::Value;

use toolboxd::bus::envelope::Object;
use toolboxd::daemon::{self, BusMode, RunOptions};
use toolboxd::operator::Operation;

#[derive(Parser)]
#[command(
    name = "toolboxd",
    version,
    about = "Supervises MCP-stdio toolboxes and serves them on the OVOS messagebus"
)]
struct Cli {
    /// Log format on stderr (filter with RUST_LOG).
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, ValueEnum)]
enum NewLang {
    Python,
    Shell,
}

#[derive(Clone, Copy, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Subcommand)]
enum CtlAction {
    /// One row per toolbox: state, pids, uptime, restarts, calls, latency.
    Status {
        /// Print a JSON array instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Rolling restart of one toolbox: no call fails.
    Restart { id: String },
    /// Drain and stop one toolbox.
    Stop { id: String },
    /// Start a stopped or failed toolbox.
    Start { id: String },
    /// Re-read the manifests and apply the difference.
    Reload,
    /// The recent stderr of one toolbox's children, oldest first.
    Logs {
        id: String,
        /// How many of the last lines (the daemon keeps at most 500 per toolbox).
        #[arg(long, default_value_t = toolboxd::operator::DEFAULT_LOG_LINES,
              value_parser = clap::builder::RangedU64ValueParser::<usize>::new()
                  .range(1..=toolboxd::process::child::LOG_LINES as u64))]
        lines: usize,
    },
}

#[derive(Subcommand)]
enum Command {
    /// Run the daemon.
    Run(RunArgs),
    /// Operate a running daemon through its control socket.
    Ctl(CtlArgs),
    /// Validate manifests; --probe also starts each child and lists its tools.
    Check(CheckArgs),
    /// List every tool on the bus (ovos.tools.list).
    List(ListArgs),
    /// Call a tool (ovos.tools.invoke, or ovos.persona.tools.call with --toolbox).
    Call(CallArgs),
    /// Write a new toolbox and its manifest, ready for `check --probe`.
    New(NewArgs),
    /// Run only the embedded messagebus.
    Bus(BusArgs),
    /// Serve the bus's tools to MCP clients, over stdio (or streamable HTTP).
    Mcp(McpArgs),
}

#[derive(Args)]
struct McpArgs {
    /// The bus (default: from mycroft.conf, else ws://127.0.0.1:8181/core).
    #[arg(long)]
    bus: Option<String>,
    /// Serve streamable HTTP at http://ADDR/mcp instead of stdio (e.g.
    /// 127.0.0.1:8765; off loopback TOOLBOXD_MCP_TOKEN is required).
    #[arg(long, value_name = "ADDR")]
    http: Option<SocketAddr>,
    /// The bearer token HTTP clients must send.
    #[arg(long, env = "TOOLBOXD_MCP_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// Seconds a call waits for its answer from the bus.
    #[arg(long, default_value_t = 300)]
    call_timeout: u64,
}

#[derive(Args)]
struct RunArgs {
    /// A directory of *.toml manifests (repeatable).
    #[arg(long = "manifests", default_value = "manifests")]
    manifests: Vec<PathBuf>,
    /// Connect to this bus (retrying); never embed one.
    #[arg(long, conflicts_with = "embedded_bus")]
    bus: Option<String>,
    /// Serve an embedded bus on this address (port 0 picks a free port).
    #[arg(long)]
    embedded_bus: Option<SocketAddr>,
    /// The control socket (default: $XDG_RUNTIME_DIR/toolboxd.sock, or
    /// /run/toolboxd/toolboxd.sock as root).
    #[arg(long)]
    control: Option<PathBuf>,
    /// Let web pages of any origin use the embedded bus (by default a
    /// connection that names a non-loopback Origin is refused).
    #[arg(long)]
    bus_allow_any_origin: bool,
    /// Host toolboxes only (persona topics); leave ovos.tools.* to another
    /// daemon on the bus.
    #[arg(long)]
    host_only: bool,
    /// Milliseconds each of the two probes for other hosts' toolbox ids
    /// listens, after start and every reload, beside the serving (0: do
    /// not ask).
    #[arg(long, default_value_t = 100)]
    peer_probe_ms: u64,
    /// Serve Prometheus metrics at http://ADDR/metrics (e.g.
    /// 127.0.0.1:9464; port 0 picks a free port). Off by default.
    #[arg(long, value_name = "ADDR")]
    metrics: Option<SocketAddr>,
    /// Append a JSON line per finished call to PATH (reopened on
    /// SIGHUP). Off by default.
    #[arg(long, value_name = "PATH")]
    audit_log: Option<PathBuf>,
}

#[derive(Args)]
struct CtlArgs {
    /// The daemon's control socket (default as for `run`).
    #[arg(long)]
    control: Option<PathBuf>,
    #[command(subcommand)]
    action: CtlAction,
}

#[derive(Args)]
struct CheckArgs {
    /// A directory of *.toml manifests (repeatable).
    #[arg(long = "manifests", default_value = "manifests")]
    manifests: Vec<PathBuf>,
    /// Start each child, do the handshake, list and compile its tools.
    #[arg(long)]
    probe: bool,
    /// Say per toolbox which confinement mechanisms hold on this machine.
    #[arg(long)]
    sandbox: bool,
}

#[derive(Args)]
struct ListArgs {
    /// The bus (default: from mycroft.conf, else ws://127.0.0.1:8181/core).
    #[arg(long)]
    bus: Option<String>,
    /// Seconds to wait for the answer.
    #[arg(long, default_value_t = 10)]
    timeout: u64,
}

#[derive(Args)]
struct CallArgs {
    /// The tool's name.
    tool: String,
    /// The toolbox that owns it (needed when two toolboxes share the name).
    #[arg(long)]
    toolbox: Option<String>,
    /// The arguments, a JSON object.
    #[arg(long, default_value = "{}")]
    args: String,
    /// The bus (default: from mycroft.conf, else ws://127.0.0.1:8181/core).
    #[arg(long)]
    bus: Option<String>,
    /// Seconds to wait for the answer.
    #[arg(long, default_value_t = 60)]
    timeout: u64,
}

#[derive(Args)]
struct NewArgs {
    /// The toolbox id (also the file names).
    name: String,
    #[arg(long, value_enum, default_value_t = NewLang::Python)]
    lang: NewLang,
    /// The manifests directory to write into.
    #[arg(long, default_value = "manifests")]
    dir: PathBuf,
}

#[derive(Args)]
struct BusArgs {
    #[arg(long, default_value = "127.0.0.1:8181")]
    listen: SocketAddr,
    /// Let web pages of any origin use the bus (by default a connection
    /// that names a non-loopback Origin is refused).
    #[arg(long)]
    allow_any_origin: bool,
}

fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()));
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().flatten_event(true).init(),
    }
}

fn main() -> ExitCode {
    // The daemon's keeper (src/process/keeper.rs): no runtime, no logging, just wait
    // for the daemon's end.
    let mut raw = std::env::args_os().skip(1);
    if raw.next().as_deref() == Some(std::ffi::OsStr::new(toolboxd::process::keeper::SUBCOMMAND)) {
        toolboxd::process::keeper::run(toolboxd::process::keeper::cgroup_arg(raw.next()));
    }
    let cli = Cli::parse();
    if let Ok(exe) = std::env::current_exe() {
        toolboxd::process::keeper::install(exe);
    }
    init_logging(cli.log_format);
    // One thread: a single-threaded runtime is the faster one for a relay
    // like this (see docs/performance.md). Children are started on spawner
    // threads of their own (child/spawner.rs).
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("toolboxd: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(dispatch(cli.command)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("toolboxd: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn dispatch(command: Command) -> anyhow::Result<ExitCode> {
    match command {
        Command::Run(args) => run(args).await,
        Command::Ctl(args) => ctl(args).await,
        Command::Check(args) => check(args).await,
        Command::List(args) => list(args).await,
        Command::Call(args) => call(args).await,
        Command::New(args) => new(args),
        Command::Bus(args) => bus(args).await,
        Command::Mcp(args) => mcp(args).await,
    }
}

/// `toolboxd run`: the daemon, until SIGTERM or SIGINT.
async fn run(args: RunArgs) -> anyhow::Result<ExitCode> {
    let control = match args.control {
        Some(path) => path,
        None => toolboxd::control::default_path()?,
    };
    let bus = match (args.bus, args.embedded_bus) {
        (Some(url), _) => BusMode::Connect(url),
        (None, Some(addr)) => BusMode::Embedded(addr),
        (None, None) => BusMode::Auto,
    };
    daemon::run_until_signalled(RunOptions {
        manifests: args.manifests,
        bus,
        control,
        host_only: args.host_only,
        peer_probe: Duration::from_millis(args.peer_probe_ms),
        bus_any_origin: args.bus_allow_any_origin,
        observability: daemon::Observability {
            metrics: args.metrics,
            audit_log: args.audit_log,
        },
        ready: None,
    })
    .await?;
    Ok(ExitCode::SUCCESS)
}

/// `toolboxd ctl`: one operation over the control socket; exit 1 when it
/// failed (a reload that reported errors included).
async fn ctl(args: CtlArgs) -> anyhow::Result<ExitCode> {
    let path = match args.control {
        Some(path) => path,
        None => toolboxd::control::default_path()?,
    };
    let action = args.action;
    let operation = match &action {
        CtlAction::Status { .. } => Operation::Status,
        CtlAction::Restart { id } => Operation::Restart(id.clone()),
        CtlAction::Stop { id } => Operation::Stop(id.clone()),
        CtlAction::Start { id } => Operation::Start(id.clone()),
        CtlAction::Reload => Operation::Reload,
        CtlAction::Logs { id, lines } => Operation::Logs {
            id: id.clone(),
            lines: *lines,
        },
    };
    let result = toolboxd::control::request(&path, &operation).await?;
    match (&action, &result) {
        (CtlAction::Status { json: false }, rows) => emit(&toolboxd::control::status_table(rows))?,
        (CtlAction::Logs { .. }, lines) => emit(&toolboxd::control::log_lines(lines))?,
        (_, Value::String(text)) => emit(&format!("{text}\n"))?,
        (_, other) => emit(&format!("{}\n", serde_json::to_string_pretty(other)?))?,
    }
    let reload_failed = matches!(action, CtlAction::Reload)
        && result["errors"].as_array().is_some_and(|e| !e.is_empty());
    Ok(exit_code(!reload_failed))
}

/// `toolboxd check`: exit 1 when a manifest (or a probed child) is bad.
async fn check(args: CheckArgs) -> anyhow::Result<ExitCode> {
    let ok = toolboxd::cli::check::check(
        &args.manifests,
        args.probe,
        args.sandbox,
        &mut std::io::stdout(),
    )
    .await;
    Ok(exit_code(ok))
}

/// `toolboxd list`: `ovos.tools.list` on the bus.
async fn list(args: ListArgs) -> anyhow::Result<ExitCode> {
    let data = toolboxd::cli::bus_request::request(
        &bus_url(args.bus),
        "ovos.tools.list",
        Object::new(),
        Duration::from_secs(args.timeout),
        |_| {},
    )
    .await?;
    print_answer(data)
}

/// `toolboxd call`: `ovos.tools.invoke`, or `ovos.persona.tools.call` with
/// `--toolbox`.
async fn call(args: CallArgs) -> anyhow::Result<ExitCode> {
    let arguments: Value = serde_json::from_str(&args.args)
        .with_context(|| format!("--args is not JSON: {}", args.args))?;
    anyhow::ensure!(
        arguments.is_object(),
        "--args must be a JSON object, e.g. '{{\"a\": 2}}'"
    );
    let mut data = Object::new();
    data.insert("name".into(), Value::String(args.tool));
    let topic = match args.toolbox {
        Some(id) => {
            data.insert("toolbox_id".into(), Value::String(id));
            data.insert("kwargs".into(), arguments);
            "ovos.persona.tools.call"
        }
        None => {
            data.insert("args".into(), arguments);
            "ovos.tools.invoke"
        }
    };
    let data = toolboxd::cli::bus_request::request(
        &bus_url(args.bus),
        topic,
        data,
        Duration::from_secs(args.timeout),
        print_progress,
    )
    .await?;
    print_answer(data)
}

/// `toolboxd new`: a toolbox and its manifest from templates.
fn new(args: NewArgs) -> anyhow::Result<ExitCode> {
    let lang = match args.lang {
        NewLang::Python => toolboxd::cli::scaffold::Lang::Python,
        NewLang::Shell => toolboxd::cli::scaffold::Lang::Shell,
    };
    for path in toolboxd::cli::scaffold::new_toolbox(&args.name, lang, &args.dir)? {
        emit(&format!("wrote {}\n", path.display()))?;
    }
    emit(&format!(
        "next: toolboxd check --probe --manifests {}\n",
        args.dir.display()
    ))?;
    Ok(ExitCode::SUCCESS)
}

/// `toolboxd bus`: the embedded messagebus alone, until SIGTERM or SIGINT.
async fn bus(args: BusArgs) -> anyhow::Result<ExitCode> {
    let (trigger, shutdown) = toolboxd::shutdown::ShutdownTrigger::new();
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("cannot listen on {}", args.listen))?;
    let addr = listener.local_addr().unwrap_or(args.listen);
    tracing::info!(%addr, "messagebus listening");
    let server = tokio::spawn(toolboxd::bus::server::serve(
        listener,
        toolboxd::bus::server::Hub::new(),
        shutdown,
        args.allow_any_origin,
    ));
    wait_for_stop_signal().await?;
    trigger.trigger();
    let _ = server.await;
    Ok(ExitCode::SUCCESS)
}

/// `toolboxd mcp`: the MCP face, until stdin ends (stdio) or SIGTERM or
/// SIGINT (HTTP).
async fn mcp(args: McpArgs) -> anyhow::Result<ExitCode> {
    let (trigger, shutdown) = toolboxd::shutdown::ShutdownTrigger::new();
    let options = toolboxd::mcp_face::McpOptions {
        bus: bus_url(args.bus),
        http: args.http,
        token: args.token,
        call_wait: Duration::from_secs(args.call_timeout),
    };
    let served = toolboxd::mcp_face::serve(options, shutdown);
    tokio::pin!(served);
    tokio::select! {
        served = &mut served => served?,
        stopped = wait_for_stop_signal() => {
            stopped?;
            trigger.trigger();
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// A call's progress, on stderr (stdout is the answer's): `progress 3/10:
/// message`.
fn print_progress(report: &Object) {
    let number = |key: &str| report.get(key).map(|v| v.to_string());
    let mut line = format!("progress {}", number("progress").unwrap_or_default());
    if let Some(total) = number("total") {
        line.push_str(&format!("/{total}"));
    }
    if let Some(message) = report.get("message").and_then(Value::as_str) {
        line.push_str(&format!(
            ": {}",
            toolboxd::util::throttle::escape_controls(message)
        ));
    }
    eprintln!("{line}");
}

/// Exit 0 when `ok`, else 1.
fn exit_code(ok: bool) -> ExitCode {
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

async fn wait_for_stop_signal() -> anyhow::Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).context("installing SIGTERM handler")?;
    let mut int = signal(SignalKind::interrupt()).context("installing SIGINT handler")?;
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
    Ok(())
}

/// Writes `text` to stdout. A reader that went away (`| head -c1`) ends the
/// program quietly, as SIGPIPE would (exit status 141), instead of a panic.
fn emit(text: &str) -> std::io::Result<()> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => std::process::exit(141),
        other => other,
    }
}

/// Prints an answer's data as JSON; exit 1 when it is an error answer.
fn print_answer(data: Object) -> anyhow::Result<ExitCode> {
    let failed = data.contains_key("error");
    emit(&format!(
        "{}\n",
        serde_json::to_string_pretty(&Value::Object(data))?
    ))?;
    Ok(exit_code(!failed))
}

/// `--bus`, else the bus mycroft.conf names (its problems reported on stderr).
fn bus_url(given: Option<String>) -> String {
    given.unwrap_or_else(|| {
        let settings = toolboxd::bus::config::lookup();
        for warning in settings.warnings {
            eprintln!("toolboxd: {warning}");
        }
        settings.url
    })
}
