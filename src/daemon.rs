//! `toolboxd run`, read top-down as its phases: find the bus, start up,
//! serve, shut down. [`run`] runs the daemon until a [`Shutdown`];
//! [`run_until_signalled`], what the binary runs, makes SIGTERM and SIGINT
//! that shutdown. SIGHUP asks for a reload in both, and reopens the audit log.
//!
//! The daemon can run inside another program (a test, say): see [`run`].

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use tokio::net::{TcpListener, UnixListener};
use tokio::signal::unix::{signal, Signal, SignalKind};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;

use crate::bus::{self, client, server};
use crate::control;
use crate::notify::Notifier;
use crate::observe::audit::{Audit, AuditError};
use crate::observe::metrics::{self, Metrics};
use crate::observe::Observer;
use crate::operator::{self, Operation, Operator, Operators, Requests};
use crate::peers::Peers;
use crate::registry::Registry;
use crate::service::Service;
use crate::shutdown::{Shutdown, ShutdownTrigger};
use crate::supervisor::Supervisor;

/// Which bus the daemon uses.
#[derive(Debug, Clone)]
pub enum BusMode {
    /// Connect to the default address; serve an embedded bus there if nothing listens.
    Auto,
    /// Connect to this URL, retrying; never embed.
    Connect(String),
    /// Serve an embedded bus on this address and use it.
    Embedded(SocketAddr),
}

/// Options of `toolboxd run`.
#[derive(Debug)]
pub struct RunOptions {
    /// Directories of `*.toml` manifests.
    pub manifests: Vec<PathBuf>,
    /// The bus to use.
    pub bus: BusMode,
    /// Where the control socket is created.
    pub control: PathBuf,
    /// Answer only the persona topics, leaving `ovos.tools.*` to another daemon.
    pub host_only: bool,
    /// How long to listen for other hosts' toolbox ids at start and reload
    /// (zero: do not ask).
    pub peer_probe: std::time::Duration,
    /// Let web pages of any origin use the embedded bus (default: loopback
    /// origins only).
    pub bus_any_origin: bool,
    /// Metrics and the audit log, each off unless asked for.
    pub observability: Observability,
    /// Told where the daemon serves once it is ready: with an embedded bus on
    /// port 0, the only way for the caller to learn the port.
    pub ready: Option<oneshot::Sender<Ready>>,
}

/// What the daemon tells operators beyond its log (docs/operations.md).
#[derive(Debug, Default, Clone)]
pub struct Observability {
    /// `--metrics ADDR`: serve Prometheus metrics at `/metrics` there.
    pub metrics: Option<SocketAddr>,
    /// `--audit-log PATH`: a JSON line per finished call, appended there.
    pub audit_log: Option<PathBuf>,
}

/// Where a ready daemon serves.
#[derive(Debug, Clone)]
pub struct Ready {
    /// The bus URL (for an embedded bus, with the port it was given).
    pub bus: String,
    /// The control socket.
    pub control: PathBuf,
    /// Where `/metrics` is served (with port 0 asked, the port it was given).
    pub metrics: Option<SocketAddr>,
}

/// Why the daemon could not run.
#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    #[error("cannot serve the embedded bus on {addr}: {source}; pick another address or stop what uses it")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error(transparent)]
    Bus(#[from] client::BusError),
    #[error(transparent)]
    Control(#[from] control::ControlError),
    #[error(transparent)]
    Metrics(#[from] metrics::server::BindError),
    #[error(transparent)]
    Audit(#[from] AuditError),
    #[error("cannot install signal handlers: {0}")]
    Signals(std::io::Error),
    #[error(
        "{part} ended while the daemon was serving ({how}); toolboxd stopped its toolboxes and \
         exits so that its service manager starts it again. This is a bug: please report it \
         with the log"
    )]
    PartEnded { part: &'static str, how: String },
}

/// Runs the daemon until SIGTERM or SIGINT.
pub async fn run_until_signalled(options: RunOptions) -> Result<(), DaemonError> {
    let mut terminate = signal(SignalKind::terminate()).map_err(DaemonError::Signals)?;
    let mut interrupt = signal(SignalKind::interrupt()).map_err(DaemonError::Signals)?;
    let (trigger, shutdown) = ShutdownTrigger::new();
    let daemon = run(options, shutdown);
    tokio::pin!(daemon);
    tokio::select! {
        result = &mut daemon => return result,
        _ = terminate.recv() => {}
        _ = interrupt.recv() => {}
    }
    trigger.trigger();
    daemon.await
}

/// Runs the daemon until `stop`: finds the bus, starts up, serves, shuts down.
/// Returns once every toolbox has stopped and the bus and the control socket
/// are closed. A `stop` during start-up (the bus may be slow to come) cuts it
/// short.
///
/// Run it on a current-thread runtime, as the binary does: a child gets a
/// parent-death signal tied to the thread that spawned it. The keeper (see
/// [`crate::process::keeper`]) runs only once [`crate::process::keeper::install`] has named the
/// `toolboxd` executable; a program that embeds the daemon (a test) names the
/// `toolboxd` binary there, never itself, or goes without a keeper.
pub async fn run(options: RunOptions, mut stop: Shutdown) -> Result<(), DaemonError> {
    let RunOptions {
        manifests,
        bus,
        control,
        host_only,
        peer_probe,
        bus_any_origin,
        observability,
        ready,
    } = options;
    // First, so that a second daemon on the same socket refuses before it
    // starts anything.
    let control_listener = control::bind(&control).await?;
    // Before anything starts too: a taken port fails the start.
    let metrics_listener = match observability.metrics {
        Some(addr) => Some(metrics::server::bind(addr).await?),
        None => None,
    };
    let audit = match &observability.audit_log {
        Some(path) => {
            let audit = Arc::new(Audit::open(path)?);
            tracing::info!(path = %path.display(), "audit log open");
            Some(audit)
        }
        None => None,
    };
    // Before anything starts: an early SIGHUP must not end the daemon.
    let hangup = signal(SignalKind::hangup()).map_err(DaemonError::Signals)?;
    // No toolbox (nor any process of the same user) may read its memory or
    // environment through /proc.
    crate::process::sandbox::make_daemon_undumpable();
    // Headroom, so that bus connections never leave it unable to spawn a child.
    match crate::process::child::raise_descriptor_limit() {
        Ok(limit) => tracing::debug!(limit, "descriptor limit"),
        Err(e) => tracing::warn!("cannot raise the descriptor limit: {e}"),
    }
    let (finish, finished) = ShutdownTrigger::new();
    let bus = find_bus(bus, bus_any_origin, &finished).await?;
    let mut daemon = start(Start {
        manifests,
        bus,
        control,
        control_listener,
        metrics_listener,
        audit,
        host_only,
        peer_probe,
        finish,
        finished,
    });
    let mut stopping = match start_up(&mut daemon, &mut stop).await {
        Ok(true) => serve(daemon, stop, hangup, ready).await,
        up => {
            let failure = up.err();
            if failure.is_none() {
                tracing::info!("stopped before start-up finished");
            }
            Stopping {
                supervisor: Some(daemon.supervisor),
                audit: daemon.audit,
                closing: daemon.closing,
                finish: daemon.finish,
                failure,
            }
        }
    };
    let failure = stopping.failure.take();
    shut_down(stopping).await;
    failure.map_or(Ok(()), Err)
}

/// How the daemon is on the bus when it starts.
enum Link {
    /// Over a websocket, which `client::run` keeps: the connection made
    /// while looking for the bus, if one was.
    Remote(Option<Box<client::Connection>>),
    /// In process: the daemon serves the bus itself.
    Local(server::LocalPeer),
}

/// The bus the daemon found.
struct FoundBus {
    /// Its URL.
    url: String,
    /// How the daemon is on the bus so far.
    link: Link,
    /// The embedded bus, if the daemon serves one; ends after `finished`.
    server: Option<JoinHandle<()>>,
}

/// Finds the bus: connects, or serves an embedded one (until `finished`).
async fn find_bus(
    mode: BusMode,
    any_origin: bool,
    finished: &Shutdown,
) -> Result<FoundBus, DaemonError> {
    let url = match mode {
        BusMode::Embedded(addr) => return embed(addr, finished, any_origin).await,
        BusMode::Connect(url) => {
            return Ok(FoundBus {
                url,
                link: Link::Remote(None),
                server: None,
            })
        }
        BusMode::Auto => configured_url(),
    };
    match client::connect(&url).await {
        Ok(connection) => Ok(FoundBus {
            url,
            link: Link::Remote(Some(Box::new(connection))),
            server: None,
        }),
        Err(e) if e.is_refused() => {
            tracing::info!(
                "no messagebus at {url}; serving an embedded bus there (for a machine \
                 where toolboxd is the only bus user)"
            );
            let addr = client::socket_addr(&url).await?;
            embed(addr, finished, any_origin).await
        }
        Err(e) => Err(e.into()),
    }
}

/// The bus mycroft.conf names (its problems and sources logged).
fn configured_url() -> String {
    let settings = bus::config::lookup();
    for warning in &settings.warnings {
        tracing::warn!("{warning}");
    }
    if !settings.sources.is_empty() {
        let files: Vec<String> = settings
            .sources
            .iter()
            .map(|p| p.display().to_string())
            .collect();
        tracing::info!(bus = %settings.url, "bus address from {}", files.join(", "));
    }
    settings.url
}

/// Starts an embedded bus on `addr`, until `finished`.
async fn embed(
    addr: SocketAddr,
    finished: &Shutdown,
    any_origin: bool,
) -> Result<FoundBus, DaemonError> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|source| DaemonError::Bind { addr, source })?;
    let local = listener.local_addr().unwrap_or(addr);
    let hub = server::Hub::new();
    // The daemon joins the bus it serves in process, not over a socket.
    let own = hub.local();
    let serving = tokio::spawn(server::serve(listener, hub, finished.clone(), any_origin));
    tracing::info!(addr = %local, "embedded bus listening");
    Ok(FoundBus {
        url: format!("ws://{local}{}", server::ROUTE),
        link: Link::Local(own),
        server: Some(serving),
    })
}

/// What [`start`] needs.
struct Start {
    /// Directories of manifests.
    manifests: Vec<PathBuf>,
    /// The bus found.
    bus: FoundBus,
    /// The control socket's path, removed when it closes.
    control: PathBuf,
    /// The control socket, bound.
    control_listener: UnixListener,
    /// `--metrics`: the endpoint's socket, bound.
    metrics_listener: Option<TcpListener>,
    /// `--audit-log`: the audit log, open.
    audit: Option<Arc<Audit>>,
    /// Leave `ovos.tools.*` to another daemon.
    host_only: bool,
    /// How long to listen for other hosts' toolbox ids.
    peer_probe: std::time::Duration,
    /// Closes the bus connection, the embedded bus and the control socket.
    finish: ShutdownTrigger,
    /// What `finish` flips.
    finished: Shutdown,
}

/// The daemon between start and shutdown.
struct Daemon {
    /// The bus in use.
    url: String,
    /// The control socket's path.
    control: PathBuf,
    /// Where `/metrics` is served, if it is.
    metrics: Option<SocketAddr>,
    /// The audit log: reopened on SIGHUP, closed last.
    audit: Option<Arc<Audit>>,
    /// The catalog of hosted toolboxes.
    registry: Arc<Registry>,
    /// The set of toolboxes (the operator's while the daemon serves).
    supervisor: Supervisor,
    /// The check for other hosts' toolbox ids.
    peers: Arc<Peers>,
    /// The operator channel: the doors (control socket, bus) hold clones;
    /// SIGHUP uses this one.
    operators: Operators,
    /// Requests through the operator channel, for the operator once it runs.
    inbox: Requests,
    /// Whether the bus connection is up.
    connected: watch::Receiver<bool>,
    /// The bus connection, the embedded bus, the control socket and the
    /// metrics endpoint: they end after `finish`, and only then.
    closing: Vec<Part>,
    /// Closes the bus connection, the embedded bus and the control socket.
    finish: ShutdownTrigger,
}

/// A part of the daemon that runs as a task of its own until shutdown.
struct Part {
    /// What it is, for the error if it ends before its time.
    name: &'static str,
    /// The task.
    task: JoinHandle<()>,
}

/// Waits until one of `parts` ends and takes it out of the list; returns
/// its name and how it ended (never, if the list is empty). Each part runs
/// until shutdown, so one that ends before has panicked: a bug. Without
/// this watch, the daemon would go on without its bus or its control
/// socket, alive to its service manager and useless.
async fn part_ended(parts: &mut Vec<Part>) -> (&'static str, String) {
    if parts.is_empty() {
        return std::future::pending().await;
    }
    let tasks = parts.iter_mut().map(|part| &mut part.task);
    let (ended, index, _) = futures_util::future::select_all(tasks).await;
    let part = parts.swap_remove(index);
    (part.name, how_it_ended(ended).1)
}

/// A finished task's output, if it returned one, and its end in words (its
/// panic's message, if it panicked).
fn how_it_ended<T>(ended: Result<T, tokio::task::JoinError>) -> (Option<T>, String) {
    match ended {
        Ok(output) => (Some(output), "it returned".to_owned()),
        Err(e) if e.is_panic() => {
            let payload = e.into_panic();
            let message = payload
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "no message".to_owned());
            (None, format!("it panicked: {message}"))
        }
        Err(e) => (None, e.to_string()),
    }
}

/// Starts every piece: the toolboxes (not yet on the bus), the service and
/// its bus connection, the control socket.
fn start(start: Start) -> Daemon {
    let Start {
        manifests,
        bus,
        control,
        control_listener,
        metrics_listener,
        audit,
        host_only,
        peer_probe,
        finish,
        finished,
    } = start;
    let registry = Arc::new(Registry::default());
    let (connected_tx, connected) = watch::channel(false);
    let metrics = metrics_listener.map(|listener| {
        let metrics = Arc::new(Metrics::new(registry.clone(), connected.clone()));
        let addr = listener.local_addr().ok();
        let task = tokio::spawn(metrics::server::serve(
            listener,
            metrics.clone(),
            finished.clone(),
        ));
        if let Some(addr) = addr {
            tracing::info!(%addr, path = metrics::server::PATH, "metrics listening");
        }
        (metrics, addr, task)
    });
    let (metrics, metrics_addr, metrics_task) = match metrics {
        Some((metrics, addr, task)) => (Some(metrics), addr, Some(task)),
        None => (None, None, None),
    };
    let (supervisor, errors) = Supervisor::start(manifests, registry.clone());
    for e in &errors {
        tracing::error!("{e}");
    }
    let (operators, inbox) = operator::channel();
    let (out_tx, out_rx) = mpsc::unbounded_channel();
    let peers = Arc::new(Peers::new(out_tx.clone(), peer_probe));
    let service = Service::new(
        registry.clone(),
        out_tx,
        operators.clone(),
        peers.clone(),
        !host_only,
        Observer::new(metrics, audit.clone()),
    );
    let url = bus.url.clone();
    let on_frame = move |frame: &str, from| service.dispatch(frame, from);
    let bus_task = match bus.link {
        Link::Local(peer) => tokio::spawn(client::run_local(
            url,
            peer,
            out_rx,
            on_frame,
            connected_tx,
            finished.clone(),
        )),
        Link::Remote(first) => tokio::spawn(client::run(
            url,
            first.map(|first| *first),
            out_rx,
            on_frame,
            connected_tx,
            finished.clone(),
        )),
    };
    let control_task = tokio::spawn(control::serve(
        control_listener,
        control.clone(),
        operators.clone(),
        finished,
    ));
    tracing::info!(path = %control.display(), "control socket listening");
    Daemon {
        url: bus.url,
        control,
        metrics: metrics_addr,
        audit,
        registry,
        supervisor,
        peers,
        operators,
        inbox,
        connected,
        closing: [
            Some(("the bus connection", bus_task)),
            Some(("the control socket", control_task)),
            bus.server.map(|task| ("the embedded bus", task)),
            metrics_task.map(|task| ("the metrics endpoint", task)),
        ]
        .into_iter()
        .flatten()
        .map(|(name, task)| Part { name, task })
        .collect(),
        finish,
    }
}

/// Waits for the bus, puts the toolboxes on it (but those another host
/// already answers for) and waits for them to finish starting. `false` if
/// `stop` came first; an error if a part of the daemon ended (a bug).
async fn start_up(daemon: &mut Daemon, stop: &mut Shutdown) -> Result<bool, DaemonError> {
    let Daemon {
        connected,
        supervisor,
        closing,
        ..
    } = daemon;
    let started = async {
        let _ = connected.wait_for(|up| *up).await;
        // Served at once; the check for other hosts' ids runs beside, once
        // the operator serves (see `Operator::run`).
        supervisor.admit();
        tracing::info!("taking calls; waiting for the toolboxes to finish starting");
        supervisor.wait_started().await;
    };
    tokio::select! {
        _ = started => Ok(true),
        _ = stop.recv() => Ok(false),
        (part, how) = part_ended(closing) => Err(part_failed(part, how)),
    }
}

/// The error for a part of the daemon that ended before shutdown, logged.
fn part_failed(part: &'static str, how: String) -> DaemonError {
    let error = DaemonError::PartEnded { part, how };
    tracing::error!("{error}");
    error
}

/// Serves until `stop`: the operator carries out operator requests in a task
/// of its own, and this loop, which turns SIGHUP into a reload and pings the
/// watchdog, never waits on a toolbox or a reload. Returns what shutdown
/// needs.
async fn serve(
    daemon: Daemon,
    mut stop: Shutdown,
    mut hangup: Signal,
    ready: Option<oneshot::Sender<Ready>>,
) -> Stopping {
    let catalog = daemon.registry.snapshot();
    tracing::info!(
        bus = %daemon.url,
        toolboxes = catalog.toolboxes().count(),
        tools = catalog.listed_tool_count(),
        "ready"
    );
    let notifier = Arc::new(Notifier::from_env());
    notifier.send(&format!(
        "READY=1\nSTATUS=serving {} toolboxes",
        catalog.toolboxes().count()
    ));
    if let Some(ready) = ready {
        let _ = ready.send(Ready {
            bus: daemon.url.clone(),
            control: daemon.control.clone(),
            metrics: daemon.metrics,
        });
    }
    let (stop_operating, operating) = ShutdownTrigger::new();
    let operator = Operator::new(
        daemon.supervisor,
        daemon.registry.clone(),
        daemon.peers.clone(),
        notifier.clone(),
    );
    let mut operator = tokio::spawn(operator.run(daemon.inbox, operating));
    // The operator's end, if it came before shutdown (a panic): what it
    // left of the toolboxes.
    let mut operator_ended: Option<Option<Supervisor>> = None;
    let mut closing = daemon.closing;
    let mut failure = None;
    // The watchdog is pinged from this loop, so a stuck loop stops the pings.
    let mut watchdog = notifier.watchdog_interval().map(tokio::time::interval);
    loop {
        tokio::select! {
            _ = stop.recv() => break,
            (part, how) = part_ended(&mut closing) => {
                failure = Some(part_failed(part, how));
                break;
            }
            ended = &mut operator => {
                let (supervisor, how) = how_it_ended(ended);
                operator_ended = Some(supervisor);
                failure = Some(part_failed("the operator (which holds the toolboxes)", how));
                break;
            }
            _ = hangup.recv() => {
                tracing::info!("SIGHUP: reloading manifests");
                if let Some(audit) = &daemon.audit {
                    audit.reopen();
                }
                daemon.operators.tell(Operation::Reload);
            }
            _ = async { watchdog.as_mut()?.tick().await; Some(()) }, if watchdog.is_some() => {
                notifier.send("WATCHDOG=1");
            }
        }
    }
    notifier.send("STOPPING=1");
    tracing::info!("shutting down: draining calls and stopping toolboxes");
    stop_operating.trigger();
    let supervisor = match operator_ended {
        Some(supervisor) => supervisor,
        None => operator.await.ok(),
    };
    Stopping {
        supervisor,
        audit: daemon.audit,
        closing,
        finish: daemon.finish,
        failure,
    }
}

/// What shutdown stops.
struct Stopping {
    /// The toolboxes (`None` if the operator that held them panicked).
    supervisor: Option<Supervisor>,
    /// The audit log, closed once the last call is answered.
    audit: Option<Arc<Audit>>,
    /// The bus connection, the embedded bus, the control socket and the
    /// metrics endpoint.
    closing: Vec<Part>,
    /// Closes the bus connection, the embedded bus and the control socket.
    finish: ShutdownTrigger,
    /// Why the daemon stops, if not for a stop asked for: `run`'s error.
    failure: Option<DaemonError>,
}

/// Stops every toolbox (in-flight calls drain), then closes the bus and the
/// control socket (whose file is removed) and waits until they are closed.
async fn shut_down(stopping: Stopping) {
    if let Some(supervisor) = stopping.supervisor {
        supervisor.shutdown().await;
    }
    if let Some(audit) = stopping.audit {
        audit.close().await;
    }
    // Every toolbox is stopped: the limit cgroups of the toolboxes can go.
    let _ =
        tokio::task::spawn_blocking(crate::process::sandbox::limits::remove_daemon_groups).await;
    stopping.finish.trigger();
    futures_util::future::join_all(stopping.closing.into_iter().map(|part| part.task)).await;
    tracing::info!("stopped");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_part_that_panics_is_reported_by_name_and_taken_out() {
        let mut parts = vec![
            Part {
                name: "the bus connection",
                task: tokio::spawn(std::future::pending()),
            },
            Part {
                name: "the control socket",
                task: tokio::spawn(async { panic!("a bug") }),
            },
        ];
        let (part, how) = part_ended(&mut parts).await;
        assert_eq!(part, "the control socket");
        assert_eq!(how, "it panicked: a bug");
        // The one still running stays, for shutdown to wait on.
        assert_eq!(parts.len(), 1);
        assert_eq!(parts[0].name, "the bus connection");
        let error = DaemonError::PartEnded { part, how }.to_string();
        assert!(error.contains("the control socket ended"), "{error}");
        assert!(error.contains("service manager starts it again"), "{error}");
    }

    #[tokio::test]
    async fn with_no_parts_nothing_ends() {
        let waited = tokio::time::timeout(
            std::time::Duration::from_millis(20),
            part_ended(&mut Vec::new()),
        )
        .await;
        assert!(waited.is_err());
    }
}
