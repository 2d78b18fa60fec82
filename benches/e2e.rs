//! End-to-end benchmark, side by side in one run: toolboxd against a bare echo
//! responder on the same bus (the physical limit), against the Python tool
//! service it replaces (with Python toolboxes on both sides, and the other
//! variants as extra rows), and the embedded bus against the stock Python bus.
//! Run it with `scripts/bench`, which builds what it needs and prepares .venv.
//!
//! Every answer is matched to its request by a unique context mark and checked
//! (result value, no `error` key) within a deadline; a wrong answer, an error or
//! a timeout fails the run. Rates count answered calls. Memory (PSS) and CPU are
//! summed over each service's whole process tree, and again without the
//! toolboxes (toolboxd and its `__keeper` helper only). A failed /proc read is
//! an error, never a zero.
//!
//! Modes (the arguments after `cargo bench --bench e2e --`):
//!
//! - `[--json PATH] [--check] [--brief]`: run, write the figures to PATH
//!   (default target/bench/e2e.json), print the tables (`--brief`: a summary).
//! - `--report [--check] FILE...`: print the tables of earlier runs, with the
//!   range of each target's figure over the files.
//! - `--doc [--doc-file PATH] FILE...`: rewrite the generated part of
//!   docs/performance.md (between `<!-- bench:begin -->` and
//!   `<!-- bench:end -->`) from FILE....
//!
//! Exit status 1 when a run had an error, or, with `--check`, when a target
//! was missed.

use std::collections::HashSet;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::time::{Duration, Instant, SystemTime};

use futures_util::{SinkExt, StreamExt};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use tokio_tungstenite::tungstenite::Message as WsMessage;
use toolboxd::bus::envelope::Message;
use toolboxd::bus::{client, tcp};

#[path = "e2e/scale.rs"]
mod scale;

const TOOLBOXD: &str = env!("CARGO_BIN_EXE_toolboxd");
/// Measured time per load run, after a warm-up.
const RUN: Duration = Duration::from_secs(2);
const WARMUP: Duration = Duration::from_millis(300);
/// Every request's deadline.
const DEADLINE: Duration = Duration::from_secs(5);
/// How long a process may take to say it is ready.
const START_DEADLINE: Duration = Duration::from_secs(120);
/// Report format version.
const FORMAT: u32 = 1;
const BEGIN: &str = "<!-- bench:begin -->";
const END: &str = "<!-- bench:end -->";

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn echo_child() -> PathBuf {
    let path = root().join("target/release/examples/echo_toolbox");
    assert!(
        path.exists(),
        "{} is missing: run scripts/bench",
        path.display()
    );
    path
}

fn venv_python() -> PathBuf {
    let path = root().join(".venv/bin/python");
    assert!(
        path.exists(),
        "{} is missing: run scripts/bench",
        path.display()
    );
    path
}

// ---------------------------------------------------------------------------
// Processes

/// A child process, stopped (SIGTERM, then SIGKILL after 5 s) on drop.
struct Proc(Child);

impl Proc {
    fn pid(&self) -> u32 {
        self.0.id()
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.0.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.0.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Waits (at most START_DEADLINE) for a line containing `needle` on `stream`,
/// then drains the stream in the background.
fn wait_line(stream: impl std::io::Read + Send + 'static, needle: &str, what: &str) -> String {
    let (tx, rx) = std::sync::mpsc::channel();
    let wanted = needle.to_owned();
    std::thread::spawn(move || {
        let mut lines = BufReader::new(stream).lines();
        for line in lines.by_ref().map_while(Result::ok) {
            if line.contains(&wanted) {
                let _ = tx.send(line);
                break;
            }
        }
        lines.for_each(drop);
    });
    rx.recv_timeout(START_DEADLINE)
        .unwrap_or_else(|e| panic!("{what} never printed {needle:?} ({e})"))
}

fn tempdir(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("toolboxd-bench-{}/{tag}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("creating a temporary directory");
    dir
}

/// A bus and the URL to reach it.
struct Bus {
    proc: Proc,
    url: String,
    /// "embedded" or "Python".
    name: &'static str,
}

/// `toolboxd bus` on an ephemeral loopback port, read back from its log.
fn embedded_bus() -> Bus {
    let mut child = Command::new(TOOLBOXD)
        .args(["--log-format", "json", "bus", "--listen", "127.0.0.1:0"])
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting toolboxd bus");
    let stderr = child.stderr.take().expect("piped stderr");
    let proc = Proc(child);
    let line = wait_line(stderr, "messagebus listening", "toolboxd bus");
    let addr = serde_json::from_str::<Value>(&line)
        .ok()
        .and_then(|v| v["addr"].as_str().map(str::to_owned))
        .unwrap_or_else(|| panic!("no addr in the bus's log line {line}"));
    Bus {
        proc,
        url: format!("ws://{addr}/core"),
        name: "embedded",
    }
}

/// A private XDG home for the Python processes (configuration, logs).
fn xdg_home() -> PathBuf {
    let home = tempdir("xdg");
    std::fs::create_dir_all(home.join("mycroft")).expect("creating the XDG home");
    std::fs::write(
        home.join("mycroft/mycroft.conf"),
        json!({"websocket": {"host": "127.0.0.1", "port": 8181, "route": "/core", "ssl": false}})
            .to_string(),
    )
    .expect("writing mycroft.conf");
    home
}

fn python(script: &str, home: &Path) -> Command {
    let mut command = Command::new(venv_python());
    command.arg(root().join("bench").join(script));
    for var in [
        "XDG_CONFIG_HOME",
        "XDG_DATA_HOME",
        "XDG_CACHE_HOME",
        "XDG_STATE_HOME",
    ] {
        command.env(var, home);
    }
    command
}

/// The stock Python messagebus on an ephemeral loopback port (bench/python_bus.py).
fn python_bus(home: &Path) -> Bus {
    let mut child = python("python_bus.py", home)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("starting the Python bus");
    let stdout = child.stdout.take().expect("piped stdout");
    let proc = Proc(child);
    let port: u16 = wait_line(stdout, "", "the Python bus")
        .trim()
        .parse()
        .expect("the Python bus prints its port first");
    Bus {
        proc,
        url: format!("ws://127.0.0.1:{port}/core"),
        name: "Python",
    }
}

/// The Python tool service with `toolboxes` instances of the test plugin.
fn python_service(url: &str, home: &Path, toolboxes: usize) -> Proc {
    let addr = url
        .strip_prefix("ws://")
        .and_then(|rest| rest.strip_suffix("/core"))
        .expect("a ws://HOST:PORT/core URL");
    let (host, port) = addr.rsplit_once(':').expect("HOST:PORT");
    let mut child = python("python_service.py", home)
        .args([host, port])
        .arg(toolboxes.to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("starting the Python service");
    let stdout = child.stdout.take().expect("piped stdout");
    let proc = Proc(child);
    wait_line(stdout, "ready", "the Python service");
    proc
}

/// toolboxd on `url` with the manifests in `dir`; returns once it is ready.
fn daemon(url: &str, dir: &Path) -> Proc {
    daemon_with(url, dir, &[])
}

/// toolboxd on `url` with the manifests in `dir` and `flags` for `run`;
/// returns once it is ready.
fn daemon_with(url: &str, dir: &Path, flags: &[&str]) -> Proc {
    daemon_env(url, dir, &dir.join("ctl.sock"), flags, &[]).0
}

/// toolboxd on `url` with the manifests in `dir`, its control socket at
/// `socket`, `flags` for `run` and `env` set; returns once it is ready, with
/// its `ready` log line.
fn daemon_env(
    url: &str,
    dir: &Path,
    socket: &Path,
    flags: &[&str],
    env: &[(&str, &Path)],
) -> (Proc, String) {
    let mut child = Command::new(TOOLBOXD)
        .args(["--log-format", "json", "run", "--bus", url, "--manifests"])
        .arg(dir)
        .arg("--control")
        .arg(socket)
        .args(flags)
        .envs(env.iter().copied())
        .env("RUST_LOG", "warn,toolboxd::daemon=info")
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting toolboxd run");
    let stderr = child.stderr.take().expect("piped stderr");
    let proc = Proc(child);
    let ready = wait_line(stderr, "\"message\":\"ready\"", "toolboxd run");
    (proc, ready)
}

/// This benchmark binary, as a bare echo responder on `url`.
fn echo_responder(url: &str) -> Proc {
    let mut child = Command::new(std::env::current_exe().expect("the benchmark's own path"))
        .args(["--echo-responder", url])
        .stdout(Stdio::piped())
        .spawn()
        .expect("starting the echo responder");
    let stdout = child.stdout.take().expect("piped stdout");
    let proc = Proc(child);
    wait_line(stdout, "ready", "the echo responder");
    proc
}

/// The baseline: answers `bench.echo` with its response derivation, as cheaply
/// as a Rust bus client can.
async fn run_echo_responder(url: &str) {
    let mut ws = client::connect(url)
        .await
        .expect("the echo responder cannot connect")
        .ws;
    println!("ready");
    while let Some(Ok(frame)) = ws.next().await {
        tcp::quickack(ws.get_ref());
        let WsMessage::Text(text) = frame else {
            continue;
        };
        let Ok(m) = Message::decode(text.as_str()) else {
            continue;
        };
        if m.msg_type == "bench.echo" {
            let reply = m.response(m.data.clone());
            if ws.send(WsMessage::text(reply.encode())).await.is_err() {
                return;
            }
        }
    }
}

/// A toolbox program, for manifests.
struct Variant {
    /// How the tables name it.
    label: &'static str,
    command: PathBuf,
    args: Vec<String>,
    /// Tools it lists.
    tools: usize,
}

impl Variant {
    fn manifest(&self, dir: &Path, id: &str, extra: &str) {
        let args: Vec<String> = self.args.iter().map(|a| format!("{a:?}")).collect();
        std::fs::write(
            dir.join(format!("{id}.toml")),
            format!(
                "id = \"{id}\"\ncommand = {:?}\nargs = [{}]\n{extra}\n",
                self.command.display().to_string(),
                args.join(", ")
            ),
        )
        .expect("writing a manifest");
    }
}

// ---------------------------------------------------------------------------
// /proc: process trees, CPU and memory

mod procfs {
    use std::collections::HashMap;
    use std::time::Duration;

    use anyhow::{anyhow, bail, Context, Result};

    #[derive(Clone, Copy)]
    struct Stat {
        ppid: u32,
        /// utime + stime, in clock ticks.
        ticks: u64,
        /// cutime + cstime: children waited for.
        reaped: u64,
    }

    fn parse_stat(text: &str) -> Option<Stat> {
        let rest = text.rsplit_once(')')?.1;
        let f: Vec<&str> = rest.split_whitespace().collect();
        let num = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok());
        Some(Stat {
            ppid: u32::try_from(num(1)?).ok()?,
            ticks: num(11)? + num(12)?,
            reaped: num(13)? + num(14)?,
        })
    }

    fn gone(e: &std::io::Error) -> bool {
        e.kind() == std::io::ErrorKind::NotFound || e.raw_os_error() == Some(libc::ESRCH)
    }

    /// Every process's stat.
    fn scan() -> Result<HashMap<u32, Stat>> {
        let mut all = HashMap::new();
        for entry in std::fs::read_dir("/proc").context("reading /proc")? {
            let entry = entry.context("reading /proc")?;
            let Some(pid) = entry
                .file_name()
                .to_str()
                .and_then(|n| n.parse::<u32>().ok())
            else {
                continue;
            };
            let path = format!("/proc/{pid}/stat");
            match std::fs::read_to_string(&path) {
                Ok(text) => {
                    let stat = parse_stat(&text)
                        .ok_or_else(|| anyhow!("{path}: cannot parse {text:?}"))?;
                    all.insert(pid, stat);
                }
                // Exited between the listing and the read; if it belonged to a
                // tree we watch, its parent's `reaped` has its time.
                Err(e) if gone(&e) => {}
                Err(e) => return Err(e).with_context(|| format!("reading {path}")),
            }
        }
        Ok(all)
    }

    fn is_helper(pid: u32) -> Result<bool> {
        let path = format!("/proc/{pid}/cmdline");
        let raw = std::fs::read(&path).with_context(|| format!("reading {path}"))?;
        Ok(raw.split(|&b| b == 0).nth(1) == Some(toolboxd::keeper::SUBCOMMAND.as_bytes()))
    }

    /// A process tree: the service's own processes (the root and the
    /// `__keeper` helper under it) and the rest (toolboxes and their
    /// descendants).
    struct Tree {
        own: Vec<u32>,
        children: Vec<u32>,
        stats: HashMap<u32, Stat>,
    }

    fn tree(root: u32) -> Result<Tree> {
        let stats = scan()?;
        if !stats.contains_key(&root) {
            bail!("process {root} is gone");
        }
        let mut kids: HashMap<u32, Vec<u32>> = HashMap::new();
        for (&pid, stat) in &stats {
            kids.entry(stat.ppid).or_default().push(pid);
        }
        let (mut own, mut children) = (vec![root], Vec::new());
        let mut stack = vec![(root, true)];
        while let Some((pid, own_part)) = stack.pop() {
            for &kid in kids.get(&pid).map(Vec::as_slice).unwrap_or_default() {
                let helper = own_part && is_helper(kid)?;
                if helper {
                    own.push(kid);
                } else {
                    children.push(kid);
                }
                stack.push((kid, helper));
            }
        }
        Ok(Tree {
            own,
            children,
            stats,
        })
    }

    /// CPU used so far by a tree, and by its own part.
    #[derive(Clone, Copy)]
    pub(crate) struct Cpu {
        pub(crate) tree: Duration,
        pub(crate) own: Duration,
    }

    fn ticks(n: u64) -> Duration {
        // SAFETY: sysconf has no preconditions.
        let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
        let hz = u64::try_from(hz).unwrap_or(100).max(1);
        Duration::from_micros(n * 1_000_000 / hz)
    }

    /// The machine's busy CPU time so far, all CPUs (/proc/stat).
    pub(crate) fn machine_busy() -> Result<Duration> {
        let text = std::fs::read_to_string("/proc/stat").context("reading /proc/stat")?;
        let line = text
            .lines()
            .find(|l| l.starts_with("cpu "))
            .ok_or_else(|| anyhow!("/proc/stat: no cpu line"))?;
        let f: Vec<u64> = line
            .split_whitespace()
            .skip(1)
            .map(|v| v.parse().context("/proc/stat: a field is not a number"))
            .collect::<Result<_>>()?;
        // user nice system idle iowait irq softirq steal: user, nice, system
        // and steal. Interrupt time is left out: much of it is the loopback
        // traffic of the benchmark itself.
        let busy = [0, 1, 2, 7].iter().filter_map(|&i| f.get(i)).sum();
        Ok(ticks(busy))
    }

    /// Utime + stime of every process in the tree, plus the time of the
    /// children they reaped (so a toolbox that exits keeps counting).
    pub(crate) fn cpu(root: u32) -> Result<Cpu> {
        let t = tree(root)?;
        let sum = |pids: &[u32], with_reaped: bool| -> u64 {
            pids.iter()
                .filter_map(|p| t.stats.get(p))
                .map(|s| s.ticks + if with_reaped { s.reaped } else { 0 })
                .sum()
        };
        Ok(Cpu {
            tree: ticks(sum(&t.own, true) + sum(&t.children, true)),
            own: ticks(sum(&t.own, false)),
        })
    }

    /// Memory of a tree and of its own part, in KiB.
    pub(crate) struct Memory {
        pub(crate) tree_kib: u64,
        pub(crate) own_kib: u64,
        pub(crate) processes: usize,
        /// RSS was read instead of PSS (no smaps_rollup on this kernel).
        pub(crate) rss: bool,
    }

    fn field_kib(text: &str, key: &str) -> Option<u64> {
        text.lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
    }

    /// PSS (proportional set size) of one process, or RSS where the kernel
    /// has no smaps_rollup; the bool says RSS.
    fn pss_kib(pid: u32) -> Result<(u64, bool)> {
        let path = format!("/proc/{pid}/smaps_rollup");
        match std::fs::read_to_string(&path) {
            Ok(text) => field_kib(&text, "Pss:")
                .map(|v| (v, false))
                .ok_or_else(|| anyhow!("{path}: no Pss line (a zombie?)")),
            Err(e)
                if e.kind() == std::io::ErrorKind::NotFound
                    && std::path::Path::new(&format!("/proc/{pid}/stat")).exists() =>
            {
                let status = format!("/proc/{pid}/status");
                let text = std::fs::read_to_string(&status)
                    .with_context(|| format!("reading {status}"))?;
                let rss =
                    field_kib(&text, "VmRSS:").ok_or_else(|| anyhow!("{status}: no VmRSS line"))?;
                Ok((rss, true))
            }
            Err(e) => Err(e).with_context(|| format!("reading {path}")),
        }
    }

    pub(crate) fn memory(root: u32) -> Result<Memory> {
        let t = tree(root)?;
        let mut rss = false;
        let mut sum = |pids: &[u32]| -> Result<u64> {
            let mut total = 0;
            for &pid in pids {
                let (kib, fallback) = pss_kib(pid)?;
                rss |= fallback;
                total += kib;
            }
            Ok(total)
        };
        let own_kib = sum(&t.own)?;
        let children_kib = sum(&t.children)?;
        Ok(Memory {
            tree_kib: own_kib + children_kib,
            own_kib,
            processes: t.own.len() + t.children.len(),
            rss,
        })
    }
}

// ---------------------------------------------------------------------------
// Load

/// What a load sends, and how its answers are checked.
#[derive(Clone, Copy, PartialEq)]
enum Call {
    /// `bench.echo` to the echo responder: the answer's data is the request's.
    Echo,
    /// `add` {a: n, b: connection}: the answer's result is {"result": a + b}.
    Add,
    /// `burn` {ms: 5}: {"spun_ms": 5}.
    Burn,
}

impl Call {
    fn topic(self) -> &'static str {
        match self {
            Call::Echo => "bench.echo",
            Call::Add | Call::Burn => "ovos.tools.invoke",
        }
    }

    fn data(self, conn: u64, n: u64) -> Value {
        match self {
            Call::Echo | Call::Add => json!({"name": "add", "args": {"a": n, "b": conn}}),
            Call::Burn => json!({"name": "burn", "args": {"ms": 5}}),
        }
    }

    fn check(self, sent: &Value, answer: &Value) -> Result<(), String> {
        if let Some(e) = answer.get("error") {
            return Err(format!("error answer: {e}"));
        }
        let expected = match self {
            Call::Echo if answer == sent => return Ok(()),
            Call::Echo => return Err(format!("echo {answer}, sent {sent}")),
            Call::Add => {
                let arg = |k: &str| sent["args"][k].as_u64().unwrap_or(0);
                json!({"result": arg("a") + arg("b")})
            }
            Call::Burn => json!({"spun_ms": 5}),
        };
        if answer.get("name") == sent.get("name") && answer.get("result") == Some(&expected) {
            Ok(())
        } else {
            Err(format!("answer {answer}, expected result {expected}"))
        }
    }
}

/// Failures seen while checking answers.
#[derive(Default)]
struct Faults {
    errors: u64,
    timeouts: u64,
    /// The first few, in words.
    texts: Vec<String>,
}

impl Faults {
    fn error(&mut self, text: String) {
        self.errors += 1;
        self.note(text);
    }

    fn timeout(&mut self, text: String) {
        self.timeouts += 1;
        self.note(text);
    }

    fn note(&mut self, text: String) {
        if self.texts.len() < 5 {
            self.texts.push(text);
        }
    }

    fn merge(&mut self, other: Faults) {
        self.errors += other.errors;
        self.timeouts += other.timeouts;
        for t in other.texts {
            self.note(t);
        }
    }
}

#[derive(Default)]
struct Connection {
    /// Of the calls sent in the window and answered correctly.
    latencies: Vec<Duration>,
    /// Correct answers received in the window.
    answered: u64,
    faults: Faults,
}

/// One connection of the closed loop: one request in flight until `end`.
async fn connection(
    url: String,
    call: Call,
    conn: u64,
    start: Instant,
    end: Instant,
) -> Connection {
    let mut out = Connection::default();
    let mut ws = match client::connect(&url).await {
        Ok(connection) => connection.ws,
        Err(e) => {
            out.faults.error(format!("connect to {url}: {e}"));
            return out;
        }
    };
    let response = format!("{}.response", call.topic());
    // Every frame carrying one of this connection's marks has this in it.
    let ours = format!("\"bench-{conn}-");
    let mut timed_out = HashSet::new();
    let mut n = 0u64;
    'calls: while Instant::now() < end {
        n += 1;
        let mark = format!("bench-{conn}-{n}");
        let data = call.data(conn, n);
        let frame = json!({"type": call.topic(), "data": data, "context": {"mark": mark}});
        let sent = Instant::now();
        if let Err(e) = ws.send(WsMessage::text(frame.to_string())).await {
            out.faults.error(format!("{mark}: send: {e}"));
            break;
        }
        let deadline = tokio::time::Instant::from_std(sent + DEADLINE);
        let answer = loop {
            let frame = match tokio::time::timeout_at(deadline, ws.next()).await {
                Err(_) => {
                    out.faults
                        .timeout(format!("{mark}: no answer within {DEADLINE:?}"));
                    timed_out.insert(mark);
                    continue 'calls;
                }
                Ok(None) => {
                    out.faults.error(format!("{mark}: connection closed"));
                    break 'calls;
                }
                Ok(Some(Err(e))) => {
                    out.faults.error(format!("{mark}: receive: {e}"));
                    break 'calls;
                }
                Ok(Some(Ok(frame))) => frame,
            };
            tcp::quickack(ws.get_ref());
            let WsMessage::Text(text) = frame else {
                continue;
            };
            // Cheap filter before parsing: most frames are others' traffic.
            if !text.as_str().contains(&ours) {
                continue;
            }
            let v: Value = match serde_json::from_str(text.as_str()) {
                Ok(v) => v,
                Err(e) => {
                    out.faults.error(format!("{mark}: unparseable frame: {e}"));
                    continue;
                }
            };
            if v["type"] != response.as_str() {
                continue; // our request, relayed back by the bus
            }
            let got = v["context"]["mark"].as_str().unwrap_or_default();
            if got == mark {
                break v;
            }
            // A late answer to a request already counted as timed out is not
            // counted twice; any other is a duplicate or a stranger.
            if !timed_out.remove(got) {
                out.faults
                    .error(format!("{mark}: unexpected answer marked {got:?}: {v}"));
            }
        };
        let at = Instant::now();
        match call.check(&data, &answer["data"]) {
            Ok(()) => {
                if sent >= start && sent < end {
                    out.latencies.push(at - sent);
                }
                if at >= start && at < end {
                    out.answered += 1;
                }
            }
            Err(e) => out.faults.error(format!("{mark}: {e}")),
        }
    }
    close(ws).await;
    out
}

/// CPU of the service's tree and of the bus, at one instant.
type CpuSample = anyhow::Result<(procfs::Cpu, Option<procfs::Cpu>)>;

fn sample_cpu(service: u32, bus: Option<u32>) -> CpuSample {
    Ok((procfs::cpu(service)?, bus.map(procfs::cpu).transpose()?))
}

/// Results of one closed-loop run.
struct LoadResult {
    answered: u64,
    latencies: Vec<Duration>,
    faults: Faults,
    /// CPU used in the window: the service's tree, its own part, the bus.
    cpu: anyhow::Result<(procfs::Cpu, Option<Duration>)>,
}

/// `conns` connections, each with one request in flight, for RUN after WARMUP;
/// the CPU of `service`'s tree and of `bus` is sampled at the window's ends.
async fn load(url: &str, call: Call, conns: usize, service: u32, bus: Option<u32>) -> LoadResult {
    let start = Instant::now() + WARMUP;
    let end = start + RUN;
    let sampler = tokio::spawn(async move {
        tokio::time::sleep_until(start.into()).await;
        let before = tokio::task::spawn_blocking(move || sample_cpu(service, bus)).await;
        tokio::time::sleep_until(end.into()).await;
        let after = tokio::task::spawn_blocking(move || sample_cpu(service, bus)).await;
        let (before, after) = (
            before.expect("the CPU sampler panicked")?,
            after.expect("the CPU sampler panicked")?,
        );
        let service = procfs::Cpu {
            tree: after.0.tree.saturating_sub(before.0.tree),
            own: after.0.own.saturating_sub(before.0.own),
        };
        let bus = after
            .1
            .zip(before.1)
            .map(|(a, b)| a.tree.saturating_sub(b.tree));
        anyhow::Ok((service, bus))
    });
    let tasks: Vec<_> = (0..conns as u64)
        .map(|c| tokio::spawn(connection(url.to_owned(), call, c, start, end)))
        .collect();
    let mut result = LoadResult {
        answered: 0,
        latencies: Vec::new(),
        faults: Faults::default(),
        cpu: Err(anyhow::anyhow!("not sampled")),
    };
    for t in tasks {
        let c = t.await.expect("a load connection panicked");
        result.answered += c.answered;
        result.latencies.extend(c.latencies);
        result.faults.merge(c.faults);
    }
    result.cpu = sampler.await.expect("the CPU sampler panicked");
    result.latencies.sort();
    result
}

/// Closes a connection cleanly: the stock Python bus drops *other* clients
/// when one resets its connection abruptly.
async fn close(mut ws: client::WsStream) {
    let _ = ws.close(None).await;
    let _ = tokio::time::timeout(Duration::from_secs(1), async {
        while let Some(Ok(_)) = ws.next().await {}
    })
    .await;
}

/// `ovos.tools.list` 21 times (the first as a warm-up): the median round trip,
/// the number of tools listed and when the first answer came.
async fn list_round_trip(url: &str) -> Result<(Duration, usize, Instant), String> {
    let mut ws = client::connect(url)
        .await
        .map_err(|e| format!("connect: {e}"))?
        .ws;
    let mut times = Vec::new();
    let mut tools = 0;
    let mut first = None;
    for i in 0..21 {
        let mark = format!("list-{i}");
        let sent = Instant::now();
        ws.send(WsMessage::text(
            json!({"type": "ovos.tools.list", "data": {}, "context": {"mark": mark}}).to_string(),
        ))
        .await
        .map_err(|e| format!("send: {e}"))?;
        let deadline = tokio::time::Instant::from_std(sent + DEADLINE);
        loop {
            let frame = tokio::time::timeout_at(deadline, ws.next())
                .await
                .map_err(|_| format!("{mark}: no answer within {DEADLINE:?}"))?
                .ok_or("connection closed")?
                .map_err(|e| format!("receive: {e}"))?;
            tcp::quickack(ws.get_ref());
            let WsMessage::Text(text) = frame else {
                continue;
            };
            // A full parse of the answer, without building a tree of it.
            #[derive(Deserialize)]
            struct Answer {
                #[serde(rename = "type")]
                topic: String,
                data: Tools,
                context: Value,
            }
            #[derive(Deserialize)]
            struct Tools {
                tools: Option<Vec<serde::de::IgnoredAny>>,
                error: Option<Value>,
            }
            let Ok(a) = serde_json::from_str::<Answer>(text.as_str()) else {
                continue;
            };
            if a.topic == "ovos.tools.list.response" && a.context["mark"] == mark.as_str() {
                if let Some(e) = a.data.error {
                    return Err(format!("{mark}: error answer: {e}"));
                }
                tools = a
                    .data
                    .tools
                    .ok_or(format!("{mark}: no tools in the answer"))?
                    .len();
                break;
            }
        }
        first.get_or_insert_with(Instant::now);
        if i > 0 {
            times.push(sent.elapsed());
        }
    }
    close(ws).await;
    times.sort();
    let first = first.ok_or("no answer")?;
    Ok((times[times.len() / 2], tools, first))
}

/// A child's own start: spawn, initialize, every page of tools/list. Returns
/// the time and the number of tools.
fn child_startup(command: &str, args: &[&str], cwd: &Path) -> (Duration, usize) {
    let started = Instant::now();
    let mut child = Command::new(command)
        .args(args)
        .current_dir(cwd)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("starting {command}: {e}"));
    let mut stdin = child.stdin.take().expect("piped stdin");
    let send = |stdin: &mut std::process::ChildStdin, msg: Value| {
        writeln!(stdin, "{msg}").unwrap_or_else(|e| panic!("writing to {command}: {e}"));
    };
    send(
        &mut stdin,
        json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": "bench", "version": "0"}}}),
    );
    send(
        &mut stdin,
        json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
    );
    send(
        &mut stdin,
        json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": {}}),
    );
    let mut tools = 0;
    let mut lines = BufReader::new(child.stdout.take().expect("piped stdout")).lines();
    while let Some(Ok(line)) = lines.next() {
        let Ok(v) = serde_json::from_str::<Value>(&line) else {
            continue;
        };
        let Some(id) = v["id"].as_u64().filter(|&id| id >= 2) else {
            continue;
        };
        tools += v["result"]["tools"].as_array().map_or(0, Vec::len);
        match v["result"]["nextCursor"].as_str() {
            Some(cursor) => send(
                &mut stdin,
                json!({"jsonrpc": "2.0", "id": id + 1, "method": "tools/list",
                       "params": {"cursor": cursor}}),
            ),
            None => break,
        }
    }
    let took = started.elapsed();
    drop(stdin);
    let _ = child.kill();
    let _ = child.wait();
    (took, tools)
}

// ---------------------------------------------------------------------------
// The report

/// A figure for a whole process tree and for its part without the toolboxes.
#[derive(Serialize, Deserialize, Clone, Copy)]
struct Split {
    tree: f64,
    without_children: f64,
}

#[derive(Serialize, Deserialize, Clone)]
struct LoadRecord {
    id: String,
    scenario: String,
    service: String,
    bus: String,
    conns: usize,
    /// Correct answers received in the measured window.
    answered: u64,
    calls_per_s: f64,
    p50_us: Option<f64>,
    p99_us: Option<f64>,
    errors: u64,
    timeouts: u64,
    /// The service's CPU in the window over the answered calls.
    cpu_per_call_us: Option<Split>,
    /// The bus's.
    bus_cpu_per_call_us: Option<f64>,
    /// The service's memory after the load.
    memory_mib: Option<Split>,
    processes: Option<usize>,
}

#[derive(Serialize, Deserialize, Clone)]
struct MemoryRecord {
    id: String,
    scenario: String,
    service: String,
    toolboxes: usize,
    processes: usize,
    memory_mib: Split,
}

#[derive(Serialize, Deserialize, Clone, Copy, PartialEq)]
#[serde(rename_all = "snake_case")]
enum Op {
    AtLeast,
    AtMost,
}

#[derive(Serialize, Deserialize, Clone)]
struct Target {
    op: Op,
    value: f64,
    text: String,
}

impl Target {
    fn at_least(value: f64, text: &str) -> Option<Self> {
        Some(Self {
            op: Op::AtLeast,
            value,
            text: text.to_owned(),
        })
    }

    fn at_most(value: f64, text: &str) -> Option<Self> {
        Some(Self {
            op: Op::AtMost,
            value,
            text: text.to_owned(),
        })
    }

    fn met(&self, value: f64) -> bool {
        match self.op {
            Op::AtLeast => value >= self.value,
            Op::AtMost => value <= self.value,
        }
    }
}

/// One line of the targets table: a comparison, with its target if it has one.
#[derive(Serialize, Deserialize, Clone)]
struct Row {
    id: String,
    scenario: String,
    what: String,
    figure: String,
    value: Option<f64>,
    target: Option<Target>,
    /// None for a row without a target.
    pass: Option<bool>,
}

#[derive(Serialize, Deserialize, Clone)]
struct Report {
    format: u32,
    finished: String,
    commit: Option<String>,
    /// Uncommitted changes to the measured code (src, examples, benches, bench, Cargo.*).
    uncommitted: Vec<String>,
    kernel: Option<String>,
    cpus: usize,
    /// "PSS", or "RSS" where the kernel has no smaps_rollup.
    memory_measure: String,
    /// The share of the machine's CPU used during the run by processes
    /// other than the benchmark's own tree: load that skews the figures.
    other_cpu_share: Option<f64>,
    run_ms: u64,
    warmup_ms: u64,
    deadline_ms: u64,
    rows: Vec<Row>,
    loads: Vec<LoadRecord>,
    memory: Vec<MemoryRecord>,
    /// Wrong answers, errors, timeouts and failed measurements.
    failures: u64,
    /// The first of them, in words.
    errors: Vec<String>,
}

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

fn ratio(a: f64, b: f64) -> Option<f64> {
    let r = a / b;
    (b > 0.0 && r.is_finite()).then_some(r)
}

fn fmt_ratio(r: Option<f64>) -> String {
    r.map_or("n/a".into(), |r| format!("{}×", fmt_value(r)))
}

/// A ratio or count: three significant digits up to 100 (so that a figure
/// near its target never rounds across it), whole numbers as such.
fn fmt_value(v: f64) -> String {
    if v.fract() == 0.0 || v.abs() >= 100.0 {
        format!("{v:.0}")
    } else if v.abs() >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

fn thousands(x: f64) -> String {
    let s = format!("{:.0}", x.max(0.0));
    let mut out = String::new();
    for (i, ch) in s.chars().enumerate() {
        if i > 0 && (s.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(ch);
    }
    out
}

fn fmt_us(us: Option<f64>) -> String {
    match us {
        None => "n/a".into(),
        Some(us) if us < 1_000.0 => format!("{us:.0} µs"),
        Some(us) if us < 10_000.0 => format!("{:.2} ms", us / 1e3),
        Some(us) if us < 1_000_000.0 => format!("{:.1} ms", us / 1e3),
        Some(us) => format!("{:.2} s", us / 1e6),
    }
}

fn fmt_mib(m: f64) -> String {
    format!("{m:.1} MiB")
}

/// "a / b", or "a" when both are the same (no children).
fn fmt_split(s: Option<Split>, f: impl Fn(f64) -> String) -> String {
    match s {
        None => "n/a".into(),
        Some(s) if f(s.tree) == f(s.without_children) => f(s.tree),
        Some(s) => format!("{} / {}", f(s.tree), f(s.without_children)),
    }
}

fn commit() -> (Option<String>, Vec<String>) {
    let git = |args: &[&str]| {
        Command::new("git")
            .args(args)
            .current_dir(root())
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
    };
    let head = git(&["rev-parse", "--short=12", "HEAD"]).map(|s| s.trim().to_owned());
    let dirty = git(&[
        "status",
        "--porcelain",
        "--",
        "src",
        "examples",
        "benches",
        "bench",
        "Cargo.toml",
        "Cargo.lock",
    ])
    .map(|s| {
        s.lines()
            .map(|l| l.get(3..).unwrap_or(l).to_owned())
            .collect()
    })
    .unwrap_or_default();
    (head, dirty)
}

/// UTC "YYYY-MM-DD HH:MM" of a SystemTime.
fn utc(t: SystemTime) -> String {
    let secs = t
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let (days, rem) = ((secs / 86_400) as i64, secs % 86_400);
    // Civil from days (H. Hinnant).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02} UTC",
        rem / 3600,
        rem % 3600 / 60
    )
}

/// The run in progress: what has been measured so far.
struct Bench {
    report: Report,
    home: PathBuf,
}

impl Bench {
    fn new(home: PathBuf) -> Self {
        let (commit, uncommitted) = commit();
        Self {
            report: Report {
                format: FORMAT,
                finished: String::new(),
                commit,
                uncommitted,
                kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease")
                    .ok()
                    .map(|s| s.trim().to_owned()),
                cpus: std::thread::available_parallelism().map_or(0, usize::from),
                memory_measure: "PSS".into(),
                other_cpu_share: None,
                run_ms: RUN.as_millis() as u64,
                warmup_ms: WARMUP.as_millis() as u64,
                deadline_ms: DEADLINE.as_millis() as u64,
                rows: Vec::new(),
                loads: Vec::new(),
                memory: Vec::new(),
                failures: 0,
                errors: Vec::new(),
            },
            home,
        }
    }

    fn fail(&mut self, text: String) {
        eprintln!("  ERROR: {text}");
        self.report.failures += 1;
        if self.report.errors.len() < 50 {
            self.report.errors.push(text);
        }
    }

    fn faults(&mut self, what: &str, faults: Faults) {
        let (count, texts) = (faults.errors + faults.timeouts, faults.texts);
        if count == 0 {
            return;
        }
        eprintln!(
            "  ERROR: {what}: {} errors, {} timeouts",
            faults.errors, faults.timeouts
        );
        self.report.failures += count;
        for t in texts {
            if self.report.errors.len() < 50 {
                self.report.errors.push(format!("{what}: {t}"));
            }
        }
    }

    /// The memory of `pid`'s tree, or None after recording the failure.
    fn memory_of(&mut self, what: &str, pid: u32) -> Option<procfs::Memory> {
        match procfs::memory(pid) {
            Ok(m) => {
                if m.rss {
                    self.report.memory_measure = "RSS (no /proc/PID/smaps_rollup)".into();
                }
                Some(m)
            }
            Err(e) => {
                self.fail(format!("{what}: memory: {e:#}"));
                None
            }
        }
    }

    /// A load on `bus`, measuring the tree of `pid` (the service) and the bus.
    async fn load(
        &mut self,
        scenario: &str,
        service: &str,
        bus: &Bus,
        call: Call,
        conns: usize,
        pid: u32,
    ) -> LoadRecord {
        let what = format!("{scenario}: {service}, {} bus, C={conns}", bus.name);
        let r = load(&bus.url, call, conns, pid, Some(bus.proc.pid())).await;
        let (errors, timeouts) = (r.faults.errors, r.faults.timeouts);
        self.faults(&what, r.faults);
        let answered = r.answered.max(1) as f64;
        let per_call = |d: Duration| d.as_secs_f64() * 1e6 / answered;
        let (cpu, bus_cpu) = match r.cpu {
            Ok((cpu, bus_cpu)) if r.answered > 0 => (
                Some(Split {
                    tree: per_call(cpu.tree),
                    without_children: per_call(cpu.own),
                }),
                bus_cpu.map(per_call),
            ),
            Ok(_) => (None, None),
            Err(e) => {
                self.fail(format!("{what}: CPU: {e:#}"));
                (None, None)
            }
        };
        let memory = self.memory_of(&what, pid);
        let pick = |q: f64| {
            let n = r.latencies.len();
            (n > 0).then(|| r.latencies[((n - 1) as f64 * q) as usize].as_secs_f64() * 1e6)
        };
        let record = LoadRecord {
            id: format!(
                "{scenario}-{}-{}-c{conns}",
                service
                    .split(|c: char| !c.is_alphanumeric())
                    .filter(|w| !w.is_empty())
                    .collect::<Vec<_>>()
                    .join("-")
                    .to_lowercase(),
                bus.name.to_lowercase()
            ),
            scenario: scenario.into(),
            service: service.into(),
            bus: bus.name.into(),
            conns,
            answered: r.answered,
            calls_per_s: r.answered as f64 / RUN.as_secs_f64(),
            p50_us: pick(0.5),
            p99_us: pick(0.99),
            errors,
            timeouts,
            cpu_per_call_us: cpu,
            bus_cpu_per_call_us: bus_cpu,
            memory_mib: memory.as_ref().map(|m| Split {
                tree: mib(m.tree_kib),
                without_children: mib(m.own_kib),
            }),
            processes: memory.as_ref().map(|m| m.processes),
        };
        eprintln!(
            "{what}: {} calls/s, p50 {}, p99 {}, CPU/call {}",
            thousands(record.calls_per_s),
            fmt_us(record.p50_us),
            fmt_us(record.p99_us),
            fmt_split(record.cpu_per_call_us, |v| fmt_us(Some(v)))
        );
        self.report.loads.push(record.clone());
        record
    }

    fn memory(
        &mut self,
        scenario: &str,
        service: &str,
        toolboxes: usize,
        pid: u32,
    ) -> Option<Split> {
        let what = format!("{scenario}: {service}");
        let m = self.memory_of(&what, pid)?;
        let split = Split {
            tree: mib(m.tree_kib),
            without_children: mib(m.own_kib),
        };
        eprintln!(
            "{what}: {} process(es), {} ({} without children)",
            m.processes,
            fmt_mib(split.tree),
            fmt_mib(split.without_children)
        );
        self.report.memory.push(MemoryRecord {
            id: format!("{scenario}-{}", self.report.memory.len()),
            scenario: scenario.into(),
            service: service.into(),
            toolboxes,
            processes: m.processes,
            memory_mib: split,
        });
        Some(split)
    }

    fn row(
        &mut self,
        id: &str,
        what: &str,
        value: Option<f64>,
        figure: String,
        target: Option<Target>,
    ) {
        let pass = target.as_ref().map(|t| value.is_some_and(|v| t.met(v)));
        let scenario = match id.split('-').next().unwrap_or(id) {
            "0" => "all".to_owned(),
            s => s.to_owned(),
        };
        eprintln!(
            "  {id}: {figure}{}",
            match (&target, pass) {
                (Some(t), Some(true)) => format!(" (target {}: met)", t.text),
                (Some(t), _) => format!(" (target {}: MISSED)", t.text),
                _ => String::new(),
            }
        );
        self.report.rows.push(Row {
            id: id.into(),
            scenario,
            what: what.into(),
            figure,
            value,
            target,
            pass,
        });
    }

    fn rate_row(
        &mut self,
        id: &str,
        what: &str,
        a: &LoadRecord,
        b: &LoadRecord,
        target: Option<Target>,
    ) {
        let r = ratio(a.calls_per_s, b.calls_per_s);
        let figure = format!(
            "{} ({} vs {} /s)",
            fmt_ratio(r),
            thousands(a.calls_per_s),
            thousands(b.calls_per_s)
        );
        self.row(id, what, r, figure, target);
    }

    /// a's p50 over b's.
    fn p50_row(
        &mut self,
        id: &str,
        what: &str,
        a: &LoadRecord,
        b: &LoadRecord,
        target: Option<Target>,
    ) {
        let r = a.p50_us.zip(b.p50_us).and_then(|(x, y)| ratio(x, y));
        let figure = format!(
            "{} ({} vs {})",
            fmt_ratio(r),
            fmt_us(a.p50_us),
            fmt_us(b.p50_us)
        );
        self.row(id, what, r, figure, target);
    }

    fn cpu_row(&mut self, id: &str, what: &str, a: Option<f64>, b: Option<f64>) {
        let r = a.zip(b).and_then(|(x, y)| ratio(x, y));
        let figure = format!("{} ({} vs {} per call)", fmt_ratio(r), fmt_us(a), fmt_us(b));
        self.row(id, what, r, figure, None);
    }

    fn memory_row(
        &mut self,
        id: &str,
        what: &str,
        a: Option<f64>,
        b: Option<f64>,
        target: Option<Target>,
    ) {
        let r = a.zip(b).and_then(|(x, y)| ratio(x, y));
        let figure = format!(
            "{} ({} vs {})",
            r.map_or("n/a".into(), fmt_value),
            a.map_or("n/a".into(), fmt_mib),
            b.map_or("n/a".into(), fmt_mib)
        );
        self.row(id, what, r, figure, target);
    }

    /// toolboxd with one `variant` (id `box`) and `flags` for `run`.
    fn daemon_flags(&self, url: &str, tag: &str, variant: &Variant, flags: &[&str]) -> Proc {
        let dir = tempdir(tag);
        variant.manifest(&dir, "box", "");
        daemon_with(url, &dir, flags)
    }

    /// toolboxd with `count` copies of `variant` (ids t0, t1, ...).
    fn daemon(&self, url: &str, tag: &str, variant: &Variant, count: usize, extra: &str) -> Proc {
        let dir = tempdir(tag);
        for i in 0..count {
            let id = if count == 1 {
                "box".to_owned()
            } else {
                format!("t{i}")
            };
            variant.manifest(&dir, &id, extra);
        }
        daemon(url, &dir)
    }

    /// Lists the tools and checks their number: the median round trip and
    /// when the first answer came.
    async fn listed(
        &mut self,
        what: &str,
        url: &str,
        expected: usize,
    ) -> Option<(Duration, Instant)> {
        match list_round_trip(url).await {
            Ok((rt, n, first)) if n == expected => Some((rt, first)),
            Ok((_, n, _)) => {
                self.fail(format!("{what}: {n} tools listed, {expected} expected"));
                None
            }
            Err(e) => {
                self.fail(format!("{what}: ovos.tools.list: {e}"));
                None
            }
        }
    }
}

// ---------------------------------------------------------------------------
// The scenarios

async fn bench(b: &mut Bench) {
    let py = venv_python();
    let examples = root().join("examples");
    let compiled = Variant {
        label: "compiled child (Rust)",
        command: echo_child(),
        args: vec![],
        tools: 4,
    };
    let python_child = Variant {
        label: "Python child (examples/python)",
        command: py.clone(),
        args: vec![examples
            .join("python/math_toolbox.py")
            .display()
            .to_string()],
        tools: 4,
    };
    let plugin_child = Variant {
        label: "the plugin, as a child (opm_host.py)",
        command: py.clone(),
        args: vec![
            examples.join("python/opm_host.py").display().to_string(),
            "test-math-tools".into(),
        ],
        tools: 2,
    };
    let home = b.home.clone();

    // 1 and 4 (embedded half): toolboxd -> compiled child vs bare echo,
    // embedded bus. Each side is measured alone on the bus: every client gets
    // every frame, so a bystander (the other side, idle) would spend CPU on
    // the measured side's traffic, on a machine with two cores.
    let bus = embedded_bus();
    let mut embedded_echo = Vec::new();
    let mut compiled_c8 = None;
    for conns in [1, 8] {
        let echo = echo_responder(&bus.url);
        let e = b
            .load(
                "1",
                "bare echo responder (Rust)",
                &bus,
                Call::Echo,
                conns,
                echo.pid(),
            )
            .await;
        drop(echo);
        let d = b.daemon(&bus.url, "compiled", &compiled, 1, "");
        let t = b
            .load(
                "1",
                "toolboxd → compiled child",
                &bus,
                Call::Add,
                conns,
                d.pid(),
            )
            .await;
        drop(d);
        b.rate_row(
            &format!("1-c{conns}-rate"),
            &format!("C={conns}: calls/s, toolboxd → compiled child ÷ bare echo responder (both Rust), embedded bus"),
            &t,
            &e,
            // C=8: the edge-device target (0.8); C=1 keeps 0.5 (the 1.0×
            // set beside it was measured with a slower client than ours).
            if conns == 8 {
                Target::at_least(0.8, "≥ 0.80")
            } else {
                Target::at_least(0.5, "≥ 0.50")
            },
        );
        b.p50_row(
            &format!("1-c{conns}-p50"),
            &format!("C={conns}: p50, toolboxd → compiled child ÷ bare echo responder"),
            &t,
            &e,
            Target::at_most(2.0, "≤ 2×"),
        );
        embedded_echo.push(e);
        compiled_c8 = Some(t);
    }

    // 2: toolboxd with Python children vs the Python service (its plugin in process), C=8.
    let mut s2 = Vec::new();
    for (tag, variant) in [("python", &python_child), ("plugin", &plugin_child)] {
        let d = b.daemon(&bus.url, tag, variant, 1, "");
        let service = format!("toolboxd → {}", variant.label);
        s2.push(b.load("2", &service, &bus, Call::Add, 8, d.pid()).await);
    }
    let svc = python_service(&bus.url, &home, 1);
    let p = b
        .load(
            "2",
            "Python service (the plugin in process)",
            &bus,
            Call::Add,
            8,
            svc.pid(),
        )
        .await;
    drop(svc);
    b.rate_row(
        "2-rate",
        "C=8: calls/s, toolboxd → Python child ÷ the Python service (Python plugin), embedded bus",
        &s2[0],
        &p,
        Target::at_least(3.0, "≥ 3×"),
    );
    b.rate_row(
        "2-rate-plugin",
        "the same, toolboxd → the same plugin run as a child (opm_host.py)",
        &s2[1],
        &p,
        None,
    );
    if let Some(c8) = &compiled_c8 {
        b.rate_row(
            "2-rate-compiled",
            "the same, toolboxd → compiled child (scenario 1, C=8)",
            c8,
            &p,
            None,
        );
    }
    let tree = |l: &LoadRecord| l.cpu_per_call_us.map(|s| s.tree);
    let own = |l: &LoadRecord| l.cpu_per_call_us.map(|s| s.without_children);
    b.cpu_row(
        "2-cpu",
        "C=8: CPU per call, whole tree (toolboxd + keeper + Python child) ÷ the Python service's process",
        tree(&s2[0]),
        tree(&p),
    );
    b.cpu_row(
        "2-cpu-plugin",
        "the same, with the plugin as a child (opm_host.py)",
        tree(&s2[1]),
        tree(&p),
    );
    b.cpu_row(
        "2-cpu-own",
        "C=8: CPU per call without children (toolboxd + keeper) ÷ the Python service's process",
        own(&s2[0]),
        tree(&p),
    );
    drop(bus);

    // 3 and 4 (Python half): on the stock Python bus, a caller that quick-ACKs.
    let pybus = python_bus(&home);
    let echo = echo_responder(&pybus.url);
    let mut python_echo = Vec::new();
    for conns in [1, 8] {
        python_echo.push(
            b.load(
                "4",
                "bare echo responder (Rust)",
                &pybus,
                Call::Echo,
                conns,
                echo.pid(),
            )
            .await,
        );
    }
    drop(echo);
    let svc = python_service(&pybus.url, &home, 1);
    let p = b
        .load(
            "3",
            "Python service (the plugin in process)",
            &pybus,
            Call::Add,
            1,
            svc.pid(),
        )
        .await;
    drop(svc);
    let mut s3 = Vec::new();
    for (tag, variant) in [
        ("pybus-python", &python_child),
        ("pybus-plugin", &plugin_child),
        ("pybus-compiled", &compiled),
    ] {
        let d = b.daemon(&pybus.url, tag, variant, 1, "");
        let service = format!("toolboxd → {}", variant.label);
        s3.push(b.load("3", &service, &pybus, Call::Add, 1, d.pid()).await);
    }
    b.p50_row(
        "3-p50",
        "Python bus, C=1: p50, the Python service ÷ toolboxd → Python child",
        &p,
        &s3[0],
        Target::at_least(40.0, "≥ 40×"),
    );
    b.p50_row(
        "3-p50-plugin",
        "the same, toolboxd → the same plugin as a child (opm_host.py)",
        &p,
        &s3[1],
        None,
    );
    b.p50_row(
        "3-p50-compiled",
        "the same, toolboxd → compiled child",
        &p,
        &s3[2],
        None,
    );
    for (i, conns) in [1, 8].into_iter().enumerate() {
        b.rate_row(
            &format!("4-c{conns}"),
            &format!("C={conns}: calls/s, bare echo, embedded bus ÷ Python bus"),
            &embedded_echo[i],
            &python_echo[i],
            if conns == 1 {
                Target::at_least(1.4, "≥ 1.4×")
            } else {
                Target::at_least(7.0, "≥ 7×")
            },
        );
    }
    b.cpu_row(
        "4-c8-cpu",
        "C=8: the bus's CPU per call, Python bus ÷ embedded bus",
        python_echo[1].bus_cpu_per_call_us,
        embedded_echo[1].bus_cpu_per_call_us,
    );
    drop(pybus);

    // 5: memory at 20 toolboxes, both whole services.
    let bus = embedded_bus();
    let mut s5 = Vec::new();
    for (tag, variant) in [
        ("twenty-compiled", &compiled),
        ("twenty-python", &python_child),
        ("twenty-plugin", &plugin_child),
    ] {
        let d = b.daemon(&bus.url, tag, variant, 20, "");
        let service = format!("toolboxd + 20 × {}", variant.label);
        b.listed(&service, &bus.url, 20 * variant.tools).await;
        s5.push(b.memory("5", &service, 20, d.pid()));
    }
    let svc = python_service(&bus.url, &home, 20);
    let service = "Python service + 20 × the plugin (in process)";
    b.listed(service, &bus.url, 40).await;
    let p = b.memory("5", service, 20, svc.pid());
    drop(svc);
    let tree = |s: &Option<Split>| s.map(|s| s.tree);
    b.memory_row(
        "5-mem",
        "20 toolboxes: memory of the whole service, toolboxd + 20 Python children ÷ the Python service + 20 plugins",
        tree(&s5[1]),
        tree(&p),
        Target::at_most(1.0 / 3.0, "≤ 1/3"),
    );
    b.memory_row(
        "5-mem-plugin",
        "the same, toolboxd + 20 × the plugin as a child (opm_host.py)",
        tree(&s5[2]),
        tree(&p),
        None,
    );
    b.memory_row(
        "5-mem-compiled",
        "the same, toolboxd + 20 compiled children",
        tree(&s5[0]),
        tree(&p),
        None,
    );
    b.memory_row(
        "5-mem-own",
        "the same, toolboxd without children (daemon + keeper)",
        s5[1].map(|s| s.without_children),
        tree(&p),
        None,
    );
    let own = s5[0].map(|s| s.without_children);
    b.row(
        "5-mem-added",
        "20 compiled toolboxes up: memory of everything toolboxd adds (daemon + keeper, not the toolboxes), in MiB",
        own,
        own.map_or("n/a".into(), fmt_mib),
        Target::at_most(15.0, "≤ 15 MiB"),
    );

    // 6: start -> first ovos.tools.list with every example tool, vs the slowest
    // child's own start; medians of STARTS starts each.
    const STARTS: usize = 3;
    let median = |mut v: Vec<Duration>| {
        v.sort();
        v.get(v.len() / 2).copied()
    };
    let manifests = root().join("manifests");
    let (mut math, mut text, mut tools) = (Vec::new(), Vec::new(), 0);
    for _ in 0..STARTS {
        let (t, math_tools) = child_startup(
            "python3",
            &["../examples/python/math_toolbox.py"],
            &manifests,
        );
        math.push(t);
        let (t, text_tools) = child_startup("../examples/shell/text_toolbox.sh", &[], &manifests);
        text.push(t);
        tools = math_tools + text_tools;
    }
    let (math, text) = (
        median(math).unwrap_or_default(),
        median(text).unwrap_or_default(),
    );
    let slowest = math.max(text);
    let dir = tempdir("startup");
    for f in ["math.toml", "text.toml"] {
        let text = std::fs::read_to_string(manifests.join(f))
            .expect("reading an example manifest")
            .replace("../examples", &examples.display().to_string());
        std::fs::write(dir.join(f), text).expect("writing a manifest");
    }
    let mut starts = Vec::new();
    for _ in 0..STARTS {
        let started = Instant::now();
        let d = daemon(&bus.url, &dir);
        if let Some((_, first)) = b.listed("6: the example toolboxes", &bus.url, tools).await {
            starts.push(first - started);
        }
        drop(d);
    }
    let to_list = median(starts.clone()).filter(|_| starts.len() == STARTS);
    let r = to_list.and_then(|t| ratio(t.as_secs_f64(), slowest.as_secs_f64()));
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    b.row(
        "6-start",
        &format!("start → first `ovos.tools.list` with every example tool ÷ the slowest example child's own start (medians of {STARTS})"),
        r,
        format!(
            "{} ({} ms vs {:.0} ms; math {:.0} ms, text {:.0} ms)",
            fmt_ratio(r),
            to_list.map_or("n/a".into(), |t| format!("{:.0}", ms(t))),
            ms(slowest),
            ms(math),
            ms(text)
        ),
        Target::at_most(1.2, "≤ 1.2×"),
    );

    // 6 (compiled): start -> every tool listed, 1 and 20 compiled toolboxes,
    // against the compiled child's own start: what the daemon adds, in ms.
    let own = median(
        (0..STARTS)
            .map(|_| child_startup(&compiled.command.display().to_string(), &[], &manifests).0)
            .collect(),
    )
    .unwrap_or_default();
    for count in [1usize, 20] {
        let dir = tempdir(&format!("startup-compiled-{count}"));
        for i in 0..count {
            compiled.manifest(&dir, &format!("c{i}"), "");
        }
        let mut starts = Vec::new();
        for _ in 0..STARTS {
            let started = Instant::now();
            let d = daemon(&bus.url, &dir);
            let what = format!("6: {count} compiled toolboxes");
            if let Some((_, first)) = b.listed(&what, &bus.url, count * compiled.tools).await {
                starts.push(first - started);
            }
            drop(d);
        }
        let to_list = median(starts.clone()).filter(|_| starts.len() == STARTS);
        let added = to_list.map(|t| ms(t) - ms(own));
        b.row(
            &format!("6-start-compiled-{count}"),
            &format!(
                "start → every tool listed, {count} compiled toolbox{}: what the daemon adds to the child's own start, in ms (medians of {STARTS})",
                if count == 1 { "" } else { "es" }
            ),
            added,
            format!(
                "{} ms ({} ms vs the child's own {:.1} ms)",
                added.map_or("n/a".into(), |a| format!("+{a:.0}")),
                to_list.map_or("n/a".into(), |t| format!("{:.0}", ms(t))),
                ms(own)
            ),
            Target::at_most(20.0, "≤ +20 ms"),
        );
    }

    // 7: 200 toolboxes x 10 tools vs 2 x 10: list round trip and memory.
    let mut s7 = Vec::new();
    for count in [2usize, 200] {
        let d = b.daemon(
            &bus.url,
            &format!("many{count}"),
            &compiled,
            count,
            "env = { EXTRA_TOOLS = \"6\" }",
        );
        let service = format!("toolboxd + {count} compiled children × 10 tools");
        let rt = b
            .listed(&format!("7: {service}"), &bus.url, count * 10)
            .await
            .map(|(rt, _)| rt);
        let mem = b.memory("7", &service, count, d.pid());
        s7.push((rt, mem));
        drop(d);
    }
    let r = s7[1]
        .0
        .zip(s7[0].0)
        .and_then(|(l, s)| ratio(l.as_secs_f64(), s.as_secs_f64()));
    let us = |d: Option<Duration>| d.map(|d| d.as_secs_f64() * 1e6);
    b.row(
        "7-list",
        "`ovos.tools.list` round trip, 200 toolboxes × 10 tools ÷ 2 × 10 (100× the data)",
        r,
        format!(
            "{} ({} vs {})",
            fmt_ratio(r),
            fmt_us(us(s7[1].0)),
            fmt_us(us(s7[0].0))
        ),
        Target::at_most(10.0, "≤ 10×"),
    );
    let per_box = |f: fn(&Split) -> f64| s7[1].1.zip(s7[0].1).map(|(l, s)| (f(&l) - f(&s)) / 198.0);
    let (tree_per, own_per) = (per_box(|s| s.tree), per_box(|s| s.without_children));
    b.row(
        "7-mem",
        "memory per added toolbox (2 → 200 compiled children), whole tree",
        tree_per,
        format!(
            "{} a toolbox ({} of it toolboxd's: daemon + keeper)",
            tree_per.map_or("n/a".into(), |m| format!("{:.2} MiB", m)),
            own_per.map_or("n/a".into(), |m| format!("{:.2} MiB", m))
        ),
        None,
    );

    // 8: a CPU-bound Python tool, instances = 2 vs 1.
    let cpu_toolbox = Variant {
        label: "CPU-bound Python child",
        command: py.clone(),
        args: vec![root().join("bench/cpu_toolbox.py").display().to_string()],
        tools: 1,
    };
    let mut s8 = Vec::new();
    for instances in [1, 2] {
        let d = b.daemon(
            &bus.url,
            &format!("cpu{instances}"),
            &cpu_toolbox,
            1,
            &format!("instances = {instances}"),
        );
        let service = format!("toolboxd → CPU-bound Python child (5 ms), instances = {instances}");
        s8.push(b.load("8", &service, &bus, Call::Burn, 8, d.pid()).await);
    }
    b.rate_row(
        "8-instances",
        "CPU-bound Python tool (5 ms), C=8: calls/s, `instances = 2` ÷ `1`",
        &s8[1],
        &s8[0],
        Target::at_least(1.7, "≥ 1.7×"),
    );

    // 9: 100 concurrent 0.2 s calls to one toolbox.
    let d = b.daemon(
        &bus.url,
        "concurrent",
        &compiled,
        1,
        "[limits]\nmax_concurrent_calls = 128\n",
    );
    let (took, faults) = concurrent(&bus.url, 100, 200).await;
    drop(d);
    let ok = faults.errors + faults.timeouts == 0;
    b.faults("9: 100 concurrent calls", faults);
    let r = took
        .filter(|_| ok)
        .and_then(|t| ratio(t.as_secs_f64(), 0.2));
    b.row(
        "9-concurrent",
        "100 concurrent 0.2 s calls to one toolbox (`max_concurrent_calls = 128`): all answered ÷ one call",
        r,
        format!(
            "{} ({})",
            fmt_ratio(r),
            fmt_us(took.map(|t| t.as_secs_f64() * 1e6))
        ),
        Target::at_most(2.0, "≤ 2×"),
    );

    // 10: the cost of `--metrics`: C=8 on the compiled child, with and
    // without, in alternating runs so that both share the machine's noise.
    let addr = free_loopback_addr();
    let (mut off, mut on) = (Vec::new(), Vec::new());
    for run in 1..=METRICS_RUNS {
        for metrics in [false, true] {
            let flags: &[&str] = if metrics { &["--metrics", &addr] } else { &[] };
            let d = b.daemon_flags(&bus.url, "metrics", &compiled, flags);
            if metrics {
                if let Err(e) = scrape(&addr) {
                    b.fail(format!("10: GET /metrics: {e}"));
                }
            }
            let service = format!(
                "toolboxd → compiled child, metrics {} (run {run})",
                if metrics { "on" } else { "off" }
            );
            let r = b.load("10", &service, &bus, Call::Add, 8, d.pid()).await;
            if metrics { &mut on } else { &mut off }.push(r.calls_per_s);
        }
    }
    let (on, off) = (on.iter().sum::<f64>(), off.iter().sum::<f64>());
    let r = ratio(on, off);
    let runs = METRICS_RUNS as f64;
    b.row(
        "10-metrics",
        &format!("C=8: calls/s, toolboxd → compiled child with `--metrics` ÷ without ({METRICS_RUNS} alternating runs each, embedded bus)"),
        r,
        format!(
            "{} ({} vs {} /s)",
            fmt_ratio(r),
            thousands(on / runs),
            thousands(off / runs)
        ),
        Target::at_least(0.95, "≥ 0.95"),
    );

    // 11: 10,000 manifests, and the installed binary.
    scale::scale(b, &bus, &compiled);
    drop(bus);

    let failures = b.report.failures;
    let calls: u64 = b.report.loads.iter().map(|l| l.answered).sum();
    b.row(
        "0-checked",
        "every answer checked (mark, result, no `error`) within its deadline: wrong answers, errors, timeouts, failed measurements",
        Some(failures as f64),
        format!("{failures} (of {} calls answered in the windows, and the list and concurrency calls)", thousands(calls as f64)),
        Target::at_most(0.0, "0"),
    );
}

/// Runs of each side in scenario 10 (metrics on vs off).
const METRICS_RUNS: usize = 3;

/// A loopback address with a port free a moment ago, for `--metrics`.
fn free_loopback_addr() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a free loopback port");
    let addr = listener.local_addr().expect("its address");
    addr.to_string()
}

/// `GET /metrics` on `addr`: that it answers 200 with the calls metric's family.
fn scrape(addr: &str) -> Result<(), String> {
    use std::io::Read;
    let mut stream = std::net::TcpStream::connect(addr).map_err(|e| e.to_string())?;
    stream
        .set_read_timeout(Some(DEADLINE))
        .map_err(|e| e.to_string())?;
    stream
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: bench\r\nConnection: close\r\n\r\n")
        .map_err(|e| e.to_string())?;
    let mut answer = String::new();
    stream
        .read_to_string(&mut answer)
        .map_err(|e| e.to_string())?;
    if answer.starts_with("HTTP/1.1 200") && answer.contains("toolboxd_bus_connected 1") {
        Ok(())
    } else {
        Err(format!("unexpected answer: {:.200}", answer))
    }
}

/// `n` concurrent `sleep` calls of `ms` on one connection: the time until the
/// last correct answer, and the failures.
async fn concurrent(url: &str, n: usize, ms: u64) -> (Option<Duration>, Faults) {
    let mut faults = Faults::default();
    let mut ws = match client::connect(url).await {
        Ok(connection) => connection.ws,
        Err(e) => {
            faults.error(format!("connect: {e}"));
            return (None, faults);
        }
    };
    let started = Instant::now();
    let mut pending = HashSet::new();
    for i in 0..n {
        let mark = format!("conc-{i}");
        let frame = json!({"type": "ovos.tools.invoke", "data": {"name": "sleep", "args": {"ms": ms}}, "context": {"mark": mark}});
        if let Err(e) = ws.send(WsMessage::text(frame.to_string())).await {
            faults.error(format!("{mark}: send: {e}"));
            return (None, faults);
        }
        pending.insert(mark);
    }
    let deadline = tokio::time::Instant::from_std(started + DEADLINE);
    let expected = json!({"slept_ms": ms});
    while !pending.is_empty() {
        let frame = match tokio::time::timeout_at(deadline, ws.next()).await {
            Err(_) => {
                faults.timeouts += pending.len() as u64;
                faults.note(format!(
                    "{} calls unanswered within {DEADLINE:?}",
                    pending.len()
                ));
                break;
            }
            Ok(None) => {
                faults.error("connection closed".into());
                break;
            }
            Ok(Some(Err(e))) => {
                faults.error(format!("receive: {e}"));
                break;
            }
            Ok(Some(Ok(frame))) => frame,
        };
        tcp::quickack(ws.get_ref());
        let WsMessage::Text(text) = frame else {
            continue;
        };
        if !text.as_str().contains("\"conc-") {
            continue;
        }
        let Ok(v) = serde_json::from_str::<Value>(text.as_str()) else {
            faults.error("unparseable frame".into());
            continue;
        };
        if v["type"] != "ovos.tools.invoke.response" {
            continue;
        }
        let mark = v["context"]["mark"].as_str().unwrap_or_default();
        if !pending.remove(mark) {
            faults.error(format!("unexpected answer marked {mark:?}"));
        } else if v["data"].get("error").is_some() || v["data"]["result"] != expected {
            faults.error(format!(
                "{mark}: answer {}, expected result {expected}",
                v["data"]
            ));
        }
    }
    let took = started.elapsed();
    close(ws).await;
    (pending.is_empty().then_some(took), faults)
}

// ---------------------------------------------------------------------------
// Tables, checks and the document

/// The targets table (with the range over the runs when there are several),
/// then the loads and memory tables of the last run.
fn tables(reports: &[Report]) -> String {
    let Some(last) = reports.last() else {
        return String::new();
    };
    let several = reports.len() > 1;
    let mut out = String::new();
    let mut line = |s: String| {
        out.push_str(&s);
        out.push('\n');
    };
    let shares: Vec<String> = reports
        .iter()
        .map(|r| {
            r.other_cpu_share
                .map_or("n/a".into(), |s| format!("{:.0}%", s * 100.0))
        })
        .collect();
    line(format!(
        "Other processes used {} of the machine's CPU during the run{} (/proc/stat, less the benchmark's own process tree); above a few percent, they skew the figures.",
        shares.join(", "),
        if reports.len() > 1 { "s" } else { "" }
    ));
    line(String::new());
    line("### Targets".into());
    line(String::new());
    if several {
        line(format!(
            "| # | comparison | target | last run | pass | range over {} runs | passed in |",
            reports.len()
        ));
        line("| --- | --- | --- | --- | --- | --- | --- |".into());
    } else {
        line("| # | comparison | target | result | pass |".into());
        line("| --- | --- | --- | --- | --- |".into());
    }
    for row in &last.rows {
        let target = row.target.as_ref().map_or("-".into(), |t| t.text.clone());
        let pass = match row.pass {
            Some(true) => "yes",
            Some(false) => "**no**",
            None => "-",
        };
        let mut cells = format!(
            "| {} | {} | {target} | {} | {pass} |",
            row.scenario, row.what, row.figure
        );
        if several {
            let same: Vec<&Row> = reports
                .iter()
                .filter_map(|r| r.rows.iter().find(|x| x.id == row.id))
                .collect();
            let values: Vec<f64> = same.iter().filter_map(|r| r.value).collect();
            let lo = values.iter().copied().fold(f64::INFINITY, f64::min);
            let hi = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let range = if values.is_empty() {
                "n/a".into()
            } else {
                format!("{}–{}", fmt_value(lo), fmt_value(hi))
            };
            let passed = if row.target.is_some() {
                format!(
                    "{}/{}",
                    same.iter().filter(|r| r.pass == Some(true)).count(),
                    reports.len()
                )
            } else {
                "-".into()
            };
            cells.push_str(&format!(" {range} | {passed} |"));
        }
        line(cells);
    }
    line(String::new());
    line("### Loads".into());
    line(String::new());
    line(format!(
        "Closed loop, one request in flight per connection (C); {} s measured after a {} ms warm-up. \
         \"Tree\" is the whole process tree of the service; \"own\" leaves out its toolbox children (toolboxd and its keeper). \
         Memory ({}) after the load.",
        last.run_ms as f64 / 1e3,
        last.warmup_ms,
        last.memory_measure
    ));
    line(String::new());
    line("| # | service | bus | C | calls/s | p50 | p99 | CPU/call: tree / own | bus CPU/call | memory: tree / own | errors + timeouts |".into());
    line("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |".into());
    let mut loads: Vec<&LoadRecord> = last.loads.iter().collect();
    loads.sort_by(|a, b| a.scenario.cmp(&b.scenario));
    for l in loads {
        line(format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            l.scenario,
            l.service,
            l.bus,
            l.conns,
            thousands(l.calls_per_s),
            fmt_us(l.p50_us),
            fmt_us(l.p99_us),
            fmt_split(l.cpu_per_call_us, |v| fmt_us(Some(v))),
            fmt_us(l.bus_cpu_per_call_us),
            fmt_split(l.memory_mib, fmt_mib),
            l.errors + l.timeouts
        ));
    }
    line(String::new());
    line("### Memory".into());
    line(String::new());
    line(format!(
        "{}, summed over the process tree.",
        last.memory_measure
    ));
    line(String::new());
    line("| # | service | toolboxes | processes | whole tree | without children |".into());
    line("| --- | --- | --- | --- | --- | --- |".into());
    for m in &last.memory {
        line(format!(
            "| {} | {} | {} | {} | {} | {} |",
            m.scenario,
            m.service,
            m.toolboxes,
            m.processes,
            fmt_mib(m.memory_mib.tree),
            fmt_mib(m.memory_mib.without_children)
        ));
    }
    if !last.errors.is_empty() {
        line(String::new());
        line(format!("### Errors ({})", last.failures));
        line(String::new());
        for e in &last.errors {
            line(format!("- {e}"));
        }
    }
    out
}

/// Runs with errors, and missed targets, in words.
fn verdict(reports: &[Report], files: &[PathBuf]) -> (Vec<String>, Vec<String>) {
    let (mut errors, mut missed) = (Vec::new(), Vec::new());
    for (r, f) in reports.iter().zip(files) {
        let run = f.display();
        if r.failures > 0 {
            errors.push(format!(
                "{run}: {} failures (wrong answers, errors, timeouts, failed measurements)",
                r.failures
            ));
        }
        for row in &r.rows {
            if let (Some(t), Some(false)) = (&row.target, row.pass) {
                missed.push(format!(
                    "{run}: {} ({}): {}, target {}",
                    row.id, row.what, row.figure, t.text
                ));
            }
        }
    }
    (errors, missed)
}

fn read_reports(files: &[PathBuf]) -> Vec<Report> {
    files
        .iter()
        .map(|f| {
            let text = std::fs::read_to_string(f)
                .unwrap_or_else(|e| panic!("reading {}: {e}", f.display()));
            let r: Report = serde_json::from_str(&text)
                .unwrap_or_else(|e| panic!("{}: not a benchmark report: {e}", f.display()));
            assert!(
                r.format == FORMAT,
                "{}: report format {}, this benchmark reads {FORMAT}",
                f.display(),
                r.format
            );
            r
        })
        .collect()
}

/// Prints the verdict; the exit code for it.
fn conclude(reports: &[Report], files: &[PathBuf], check: bool) -> ExitCode {
    let (errors, missed) = verdict(reports, files);
    let targets = reports
        .iter()
        .map(|r| r.rows.iter().filter(|x| x.target.is_some()).count())
        .sum::<usize>();
    println!();
    if missed.is_empty() {
        println!(
            "targets: all {targets} checks met ({} run(s))",
            reports.len()
        );
    } else {
        println!(
            "targets: {} of {targets} checks missed ({} run(s)):",
            missed.len(),
            reports.len()
        );
        for m in &missed {
            println!("  MISSED {m}");
        }
    }
    for e in &errors {
        println!("  FAILED {e}");
    }
    if !errors.is_empty() || (check && !missed.is_empty()) {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

/// The generated part of docs/performance.md.
fn doc_section(reports: &[Report], files: &[PathBuf]) -> String {
    let last = reports.last().expect("at least one report");
    let names: Vec<String> = files
        .iter()
        .map(|f| f.strip_prefix(root()).unwrap_or(f).display().to_string())
        .collect();
    let first = reports
        .first()
        .map_or(String::new(), |r| r.finished.clone());
    let when = if reports.len() > 1 {
        format!("{} runs, {first} to {}", reports.len(), last.finished)
    } else {
        format!("one run, {}", last.finished)
    };
    let commit = match (&last.commit, last.uncommitted.is_empty()) {
        (Some(c), true) => format!("commit `{c}`"),
        (Some(c), false) => format!(
            "commit `{c}` with uncommitted changes to {}",
            last.uncommitted.join(", ")
        ),
        (None, _) => "no git commit".into(),
    };
    let mut out = String::new();
    out.push_str(&format!(
        "{BEGIN}\n<!-- Generated by `scripts/bench --doc` from {}; do not edit by hand. -->\n\n",
        names.join(", ")
    ));
    out.push_str(&format!(
        "Generated from {when}: {commit}; Linux {}, {} CPUs; memory as {}; every answer checked, {} s deadline.\n\n",
        last.kernel.as_deref().unwrap_or("?"),
        last.cpus,
        last.memory_measure,
        last.deadline_ms as f64 / 1e3
    ));
    out.push_str(&tables(reports));
    let (errors, missed) = verdict(reports, files);
    out.push('\n');
    if missed.is_empty() && errors.is_empty() {
        out.push_str("Every target met, no errors.\n");
    } else {
        let ids: Vec<String> = last
            .rows
            .iter()
            .filter(|r| {
                reports.iter().any(|rep| {
                    rep.rows
                        .iter()
                        .any(|x| x.id == r.id && x.pass == Some(false))
                })
            })
            .map(|r| format!("`{}`", r.id))
            .collect();
        if !ids.is_empty() {
            out.push_str(&format!("Missed: {}.\n", ids.join(", ")));
        }
        if !errors.is_empty() {
            out.push_str(&format!("Runs with failures: {}.\n", errors.len()));
        }
    }
    out.push_str(END);
    out
}

fn write_doc(doc: &Path, reports: &[Report], files: &[PathBuf]) {
    let text =
        std::fs::read_to_string(doc).unwrap_or_else(|e| panic!("reading {}: {e}", doc.display()));
    let (Some(b), Some(e)) = (text.find(BEGIN), text.find(END)) else {
        panic!("{}: no {BEGIN} ... {END} markers", doc.display());
    };
    assert!(b < e, "{}: {END} before {BEGIN}", doc.display());
    let new = format!(
        "{}{}{}",
        &text[..b],
        doc_section(reports, files),
        &text[e + END.len()..]
    );
    std::fs::write(doc, new).unwrap_or_else(|e| panic!("writing {}: {e}", doc.display()));
    println!("rewrote the generated tables of {}", doc.display());
}

// ---------------------------------------------------------------------------

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("building the tokio runtime")
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let Some(i) = args.iter().position(|a| a == "--echo-responder") {
        let url = args.get(i + 1).expect("--echo-responder URL");
        runtime().block_on(run_echo_responder(url));
        return ExitCode::SUCCESS;
    }
    if args.iter().any(|a| a == "--list" || a == "--test") {
        return ExitCode::SUCCESS; // `cargo test --benches` / `cargo bench -- --list`: nothing to list
    }
    let flag = |name: &str| args.iter().any(|a| a == name);
    let value = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .map(|i| {
                args.get(i + 1)
                    .unwrap_or_else(|| panic!("{name} needs a value"))
            })
            .map(PathBuf::from)
    };
    let check = flag("--check");
    // Positional arguments: report files. `--bench` is cargo's.
    let mut files = Vec::new();
    let mut skip = false;
    for a in &args {
        if skip {
            skip = false;
        } else if a == "--json" || a == "--doc-file" {
            skip = true;
        } else if !a.starts_with("--") {
            files.push(PathBuf::from(a));
        }
    }
    if flag("--report") || flag("--doc") {
        assert!(!files.is_empty(), "--report and --doc need report files");
        let reports = read_reports(&files);
        if flag("--doc") {
            let doc = value("--doc-file").unwrap_or_else(|| root().join("docs/performance.md"));
            write_doc(&doc, &reports, &files);
            return ExitCode::SUCCESS;
        }
        print!("{}", tables(&reports));
        return conclude(&reports, &files, check);
    }

    let json_path = value("--json").unwrap_or_else(|| root().join("target/bench/e2e.json"));
    let home = xdg_home();
    let mut b = Bench::new(home);
    // The CPU others use meanwhile: the machine's busy time less this
    // process's tree (every process the benchmark starts is reaped into it).
    let cpu_now = || -> anyhow::Result<(Duration, Duration, Instant)> {
        Ok((
            procfs::machine_busy()?,
            procfs::cpu(std::process::id())?.tree,
            Instant::now(),
        ))
    };
    let before = cpu_now();
    runtime().block_on(bench(&mut b));
    match before.and_then(|b0| Ok((b0, cpu_now()?))) {
        Ok(((busy0, own0, t0), (busy1, own1, t1))) => {
            let others = busy1
                .saturating_sub(busy0)
                .saturating_sub(own1.saturating_sub(own0));
            let capacity = (t1 - t0).as_secs_f64() * b.report.cpus.max(1) as f64;
            b.report.other_cpu_share = ratio(others.as_secs_f64(), capacity);
        }
        Err(e) => b.fail(format!("the machine's CPU: {e:#}")),
    }
    b.report.finished = utc(SystemTime::now());
    let _ = std::fs::remove_dir_all(
        std::env::temp_dir().join(format!("toolboxd-bench-{}", std::process::id())),
    );
    if let Some(dir) = json_path.parent() {
        std::fs::create_dir_all(dir).unwrap_or_else(|e| panic!("creating {}: {e}", dir.display()));
    }
    let text = serde_json::to_string_pretty(&b.report).expect("serializing the report");
    std::fs::write(&json_path, text + "\n")
        .unwrap_or_else(|e| panic!("writing {}: {e}", json_path.display()));
    let reports = [b.report];
    let files = [json_path.clone()];
    if flag("--brief") {
        let (errors, missed) = verdict(&reports, &files);
        println!(
            "{}: {} missed targets, {} failures",
            json_path.display(),
            missed.len(),
            reports[0].failures
        );
        return if !errors.is_empty() || (check && !missed.is_empty()) {
            ExitCode::FAILURE
        } else {
            ExitCode::SUCCESS
        };
    }
    println!();
    print!("{}", tables(&reports));
    println!("\nfigures written to {}", json_path.display());
    conclude(&reports, &files, check)
}
