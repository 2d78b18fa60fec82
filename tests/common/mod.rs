//! Shared test harness: a real `toolboxd run` process with an embedded bus on
//! port 0, manifest directories in temp folders, and a websocket bus client.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::{SinkExt, StreamExt};
use serde_json::{json, Value};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::Message as WsMessage;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

pub const BIN: &str = env!("CARGO_BIN_EXE_toolboxd");

/// The repository root.
pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// A path inside the repository.
pub fn repo(path: &str) -> String {
    root().join(path).display().to_string()
}

/// A temporary directory removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        static COUNTER: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir =
            std::env::temp_dir().join(format!("toolboxd-test-{tag}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }

    pub fn write(&self, name: &str, text: &str) -> PathBuf {
        let path = self.0.join(name);
        std::fs::write(&path, text).unwrap();
        path
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Manifest text for the example math toolbox under `id`.
pub fn math_manifest(id: &str) -> String {
    format!(
        "id = \"{id}\"\ncommand = \"python3\"\nargs = [\"{}\"]\n",
        repo("examples/python/math_toolbox.py")
    )
}

/// Manifest text for the example bash + jq toolbox under `id`.
pub fn text_manifest(id: &str) -> String {
    format!(
        "id = \"{id}\"\ncommand = \"{}\"\n",
        repo("examples/shell/text_toolbox.sh")
    )
}

/// Manifest text for the test fixture toolbox under `id`, with extra lines.
pub fn fixture_manifest(id: &str, extra: &str) -> String {
    format!(
        "id = \"{id}\"\ncommand = \"python3\"\nargs = [\"{}\"]\n{extra}\n",
        repo("tests/fixtures/fixture_toolbox.py")
    )
}

/// A running daemon; SIGTERMed and reaped on drop.
pub struct Daemon {
    pub child: Child,
    pub url: String,
    /// Its control socket.
    pub control: PathBuf,
    /// Holds the control socket's directory.
    _control_dir: TempDir,
    /// Every stderr line so far (JSON log lines).
    pub logs: Arc<Mutex<Vec<String>>>,
}

impl Daemon {
    /// Starts `toolboxd run` on an embedded bus (port 0) and waits for "ready".
    pub fn start(manifests: &Path) -> Daemon {
        Daemon::start_with(&[
            "--manifests",
            manifests.to_str().unwrap(),
            "--embedded-bus",
            "127.0.0.1:0",
        ])
    }

    /// Starts `toolboxd run` with these arguments and waits for "ready".
    pub fn start_with(args: &[&str]) -> Daemon {
        Daemon::start_env(args, &[])
    }

    /// Starts `toolboxd run` with these arguments and extra environment, and
    /// waits for "ready".
    pub fn start_env(args: &[&str], env: &[(&str, &str)]) -> Daemon {
        Daemon::start_until(args, env, "ready")
    }

    /// Starts `toolboxd run` and waits until it logs `message` (a line whose
    /// message starts with it); the bus URL is the `--bus` or the one "ready"
    /// names.
    pub fn start_until(args: &[&str], env: &[(&str, &str)], message: &str) -> Daemon {
        let control_dir = TempDir::new("ctl");
        let given = args
            .iter()
            .position(|a| *a == "--control")
            .map(|i| PathBuf::from(args[i + 1]));
        let control = given
            .clone()
            .unwrap_or_else(|| control_dir.path().join("ctl.sock"));
        let mut command = Command::new(BIN);
        command.arg("--log-format").arg("json").arg("run");
        if given.is_none() {
            command.arg("--control").arg(&control);
        }
        let mut child = command
            .args(args)
            .env("RUST_LOG", "info")
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn toolboxd");
        let stderr = child.stderr.take().unwrap();
        let logs = Arc::new(Mutex::new(Vec::new()));
        let (tx, rx) = std::sync::mpsc::channel::<String>();
        let sink = logs.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if std::env::var_os("TOOLBOXD_TEST_LOGS").is_some() {
                    eprintln!("{line}");
                }
                sink.lock().unwrap().push(line.clone());
                let _ = tx.send(line);
            }
        });
        let mut url = None;
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let Ok(line) = rx.recv_timeout(left) else {
                // Do not leave a half-started daemon behind.
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "toolboxd did not become ready; log:\n{}",
                    logs.lock().unwrap().join("\n")
                );
            };
            let Ok(v) = serde_json::from_str::<Value>(&line) else {
                continue;
            };
            if v["message"] == "ready" && v["bus"].is_string() {
                url = url.or_else(|| v["bus"].as_str().map(str::to_owned));
            }
            if v["message"]
                .as_str()
                .is_some_and(|m| m.starts_with(message))
            {
                url = url.or_else(|| {
                    let i = args.iter().position(|a| *a == "--bus")?;
                    Some(args[i + 1].to_owned())
                });
                break;
            }
        }
        // Keep draining stderr in the background thread (it owns rx's sender).
        std::thread::spawn(move || while rx.recv().is_ok() {});
        Daemon {
            child,
            url: url.expect("the bus URL: --bus, or the ready line"),
            control,
            _control_dir: control_dir,
            logs,
        }
    }

    /// `toolboxd ctl --control <ours> ARGS`: (exit code, stdout, stderr);
    /// fails the test if it takes over `ANSWER_DEADLINE`.
    pub fn ctl(&self, args: &[&str]) -> (i32, String, String) {
        let out = output_within(
            Command::new(BIN)
                .arg("ctl")
                .arg("--control")
                .arg(&self.control)
                .args(args),
            ANSWER_DEADLINE,
        );
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    /// `ctl status --json`, the row of toolbox `id`.
    pub fn status(&self, id: &str) -> Value {
        self.status_of(id)
            .unwrap_or_else(|rows| panic!("no {id} in status: {rows}"))
    }

    /// `ctl status --json`, the row of toolbox `id`, or every row if it has none.
    pub fn status_of(&self, id: &str) -> Result<Value, String> {
        let (code, out, err) = self.ctl(&["status", "--json"]);
        assert_eq!(code, 0, "ctl status failed: {err}");
        let rows: Value = serde_json::from_str(&out).unwrap();
        rows.as_array()
            .unwrap()
            .iter()
            .find(|r| r["id"] == id)
            .cloned()
            .ok_or(out)
    }

    /// Waits until toolbox `id` is in `state` (polling status; a toolbox not
    /// hosted yet, e.g. during a reload, is waited for too).
    pub fn wait_for_state(&self, id: &str, state: &str, timeout: Duration) -> Value {
        let deadline = Instant::now() + timeout;
        loop {
            let row = self.status_of(id);
            if let Ok(row) = &row {
                if row["state"] == state {
                    return row.clone();
                }
            }
            assert!(
                Instant::now() < deadline,
                "{id} never became {state}: {row:?}"
            );
            std::thread::sleep(Duration::from_millis(25));
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Log lines whose JSON has `message` containing `text`.
    pub fn log_lines_with(&self, text: &str) -> Vec<Value> {
        self.logs
            .lock()
            .unwrap()
            .iter()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter(|v| v["message"].as_str().is_some_and(|m| m.contains(text)))
            .collect()
    }

    /// Waits until `count` log lines contain `text` (polling the captured log).
    pub fn wait_for_log(&self, text: &str, count: usize, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        while self.log_lines_with(text).len() < count {
            assert!(
                Instant::now() < deadline,
                "no {count}x {text:?} in the log:\n{}",
                self.logs.lock().unwrap().join("\n")
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGTERM and wait (SIGKILL and fail the test after 30 s); returns the
    /// exit status.
    pub fn stop(&mut self) -> std::process::ExitStatus {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.child.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        self.wait_exit(Duration::from_secs(30))
    }

    /// Waits for the daemon to exit; SIGKILLs it and fails the test after `within`.
    pub fn wait_exit(&mut self, within: Duration) -> std::process::ExitStatus {
        let deadline = Instant::now() + within;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            if Instant::now() >= deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                panic!("toolboxd did not exit within {within:?}");
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(self.child.id() as i32),
                nix::sys::signal::Signal::SIGTERM,
            );
            let deadline = Instant::now() + Duration::from_secs(30);
            while self.child.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(10));
            }
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

type Ws = WebSocketStream<MaybeTlsStream<TcpStream>>;

/// How long any single expected answer may take before a test fails. Generous,
/// because a loaded 2-core machine can be slow; a test never waits this long
/// when things work, since answers are awaited by matching, not by windows.
pub const ANSWER_DEADLINE: Duration = Duration::from_secs(20);

/// How long a test listens for an answer that must *not* come. Silence can
/// only be shown over a window; every silence check first sends a request that
/// is answered (a sentinel) and checks the whole record, so a late or early
/// wrong answer is seen wherever it arrived.
pub const SILENCE_WINDOW: Duration = Duration::from_millis(700);

/// A test's own connection to the bus. Every frame it receives is kept in
/// `inbox`, so no check can miss an answer because another wait consumed it.
pub struct Bus {
    ws: Ws,
    /// Every decoded message received so far, in arrival order.
    inbox: Vec<Value>,
    /// Messages already handed out by `next`: the index into `inbox`.
    cursor: usize,
}

static MARKS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

/// The first pid `ctl status` shows for toolbox `id`.
pub fn pid_of(daemon: &Daemon, id: &str) -> u64 {
    daemon.status(id)["pids"][0].as_u64().unwrap()
}

/// A process's resident memory, in KiB.
pub fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

/// A fresh unique mark for a request's context.
pub fn mark() -> String {
    format!(
        "m{}",
        MARKS.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    )
}

impl Bus {
    pub async fn connect(url: &str) -> Bus {
        let (ws, _) = tokio::time::timeout(ANSWER_DEADLINE, tokio_tungstenite::connect_async(url))
            .await
            .unwrap_or_else(|_| panic!("connecting to {url} took over {ANSWER_DEADLINE:?}"))
            .expect("connect to bus");
        Bus {
            ws,
            inbox: Vec::new(),
            cursor: 0,
        }
    }

    pub async fn send_raw(&mut self, text: &str) {
        self.ws
            .send(WsMessage::text(text.to_owned()))
            .await
            .unwrap();
    }

    /// Sends {type, data, context}.
    pub async fn send(&mut self, topic: &str, data: Value, context: Value) {
        let frame = json!({"type": topic, "data": data, "context": context});
        self.send_raw(&frame.to_string()).await;
    }

    /// Reads one more message into the inbox; false after `timeout` or when
    /// the connection ended.
    async fn pump(&mut self, timeout: Duration) -> bool {
        let Ok(Some(Ok(frame))) = tokio::time::timeout(timeout, self.ws.next()).await else {
            return false;
        };
        if let WsMessage::Text(text) = frame {
            if let Ok(v) = serde_json::from_str::<Value>(text.as_str()) {
                self.inbox.push(v);
            }
        }
        true
    }

    /// The next message not handed out before, or None after `timeout`.
    /// (It stays in the inbox for later checks.)
    pub async fn next(&mut self, timeout: Duration) -> Option<Value> {
        let end = Instant::now() + timeout;
        while self.cursor >= self.inbox.len() {
            let left = end.checked_duration_since(Instant::now())?;
            if !self.pump(left).await {
                return None;
            }
        }
        self.cursor += 1;
        Some(self.inbox[self.cursor - 1].clone())
    }

    /// The first message (received before or within `timeout`) that `pred`
    /// accepts.
    pub async fn wait_for(
        &mut self,
        timeout: Duration,
        pred: impl Fn(&Value) -> bool,
    ) -> Option<Value> {
        let end = Instant::now() + timeout;
        let mut seen = 0;
        loop {
            if let Some(m) = self.inbox[seen..].iter().find(|m| pred(m)) {
                return Some(m.clone());
            }
            seen = self.inbox.len();
            let left = end.checked_duration_since(Instant::now())?;
            if !self.pump(left).await {
                return None;
            }
        }
    }

    /// Every message received so far (any topic) whose context carries `mark`
    /// and which is an answer (its topic ends in `.response`).
    pub fn answers_marked(&self, mark: &str) -> Vec<Value> {
        self.inbox
            .iter()
            .filter(|m| {
                m["context"]["mark"] == mark
                    && m["type"].as_str().is_some_and(|t| t.ends_with(".response"))
            })
            .cloned()
            .collect()
    }

    /// Every message received so far whose context carries `mark`, any
    /// topic, in arrival order.
    pub fn marked(&self, mark: &str) -> Vec<Value> {
        self.inbox
            .iter()
            .filter(|m| m["context"]["mark"] == mark)
            .cloned()
            .collect()
    }

    /// Keeps reading for `window`, then returns every message of `topic`
    /// carrying `mark` received since the connection opened.
    pub async fn collect(&mut self, topic: &str, mark: &str, window: Duration) -> Vec<Value> {
        self.listen(window).await;
        self.inbox
            .iter()
            .filter(|m| m["type"] == topic && m["context"]["mark"] == mark)
            .cloned()
            .collect()
    }

    /// Reads everything that arrives for `window` into the inbox.
    pub async fn listen(&mut self, window: Duration) {
        let end = Instant::now() + window;
        while let Some(left) = end.checked_duration_since(Instant::now()) {
            if !self.pump(left).await {
                break;
            }
        }
    }

    /// Waits until `count` messages of `topic` carrying `mark` have arrived
    /// (failing after `ANSWER_DEADLINE`), listens `SILENCE_WINDOW` more for
    /// extra ones, and returns them all: the way to count answers exactly.
    pub async fn expect_answers(&mut self, topic: &str, mark: &str, count: usize) -> Vec<Value> {
        let end = Instant::now() + ANSWER_DEADLINE;
        let matching = |inbox: &[Value]| {
            inbox
                .iter()
                .filter(|m| m["type"] == topic && m["context"]["mark"] == mark)
                .count()
        };
        while matching(&self.inbox) < count {
            let left = end
                .checked_duration_since(Instant::now())
                .unwrap_or_else(|| {
                    panic!(
                        "{} of {count} {topic} answers marked {mark} within {ANSWER_DEADLINE:?}",
                        matching(&self.inbox)
                    )
                });
            assert!(self.pump(left).await, "the bus connection ended");
        }
        self.collect(topic, mark, SILENCE_WINDOW).await
    }

    /// Asserts that no answer carrying any of `marks` arrives: sends a
    /// sentinel request that must be answered (so every frame sent before it
    /// has been read by the daemon), listens `SILENCE_WINDOW` more, then
    /// checks every message received since the connection opened.
    pub async fn assert_silence(&mut self, marks: &[&str]) {
        let r = self.request("ovos.tools.list", json!({})).await;
        assert!(r["data"]["tools"].is_array(), "sentinel: {r}");
        self.listen(SILENCE_WINDOW).await;
        for m in marks {
            let heard = self.answers_marked(m);
            assert!(heard.is_empty(), "expected silence for {m}, got {heard:#?}");
        }
    }

    /// Sends a persona call marked `m`, as a skill in session `s-7` would
    /// (`source`, `destination`, `session` in its context); returns the data
    /// of its one answer, failing the test unless exactly one comes.
    pub async fn call_routed(
        &mut self,
        m: &str,
        toolbox: &str,
        name: &str,
        kwargs: Value,
    ) -> Value {
        let context = json!({"mark": m, "source": "skill-x", "destination": "toolboxd",
                             "session": {"session_id": "s-7"}});
        let data = json!({"toolbox_id": toolbox, "name": name, "kwargs": kwargs});
        self.send("ovos.persona.tools.call", data, context).await;
        let answers = self
            .expect_answers("ovos.persona.tools.call.response", m, 1)
            .await;
        assert_eq!(answers.len(), 1, "one answer: {answers:#?}");
        answers[0]["data"].clone()
    }

    /// The data of the progress messages of a [`Bus::call_routed`] call
    /// marked `m`, failing the test if one came after the answer or is not
    /// routed like it.
    pub fn progress_of(&self, m: &str) -> Vec<Value> {
        let marked = self.marked(m);
        let answer_at = marked
            .iter()
            .position(|msg| msg["type"] == "ovos.persona.tools.call.response")
            .expect("the answer");
        marked
            .iter()
            .enumerate()
            .filter(|(_, msg)| msg["type"] == "ovos.persona.tools.call.progress")
            .map(|(i, msg)| {
                assert!(i < answer_at, "progress after the answer: {marked:#?}");
                assert_eq!(
                    msg["context"],
                    json!({"mark": m, "source": "toolboxd", "destination": "skill-x",
                           "session": {"session_id": "s-7"}}),
                    "routed like the answer"
                );
                msg["data"].clone()
            })
            .collect()
    }

    /// Sends `ovos.persona.tools.discover`, waits for `expected` answers and
    /// a silence window for extra ones: (toolbox_id, tools) of every answer,
    /// sorted by id, duplicates kept.
    pub async fn discover(&mut self, expected: usize) -> Vec<(String, Vec<Value>)> {
        let m = mark();
        self.send("ovos.persona.tools.discover", json!({}), json!({"mark": m}))
            .await;
        let mut answers: Vec<(String, Vec<Value>)> = self
            .expect_answers("ovos.persona.tools.discover.response", &m, expected)
            .await
            .into_iter()
            .map(|a| {
                let id = a["data"]["toolbox_id"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned();
                (
                    id,
                    a["data"]["tools"].as_array().cloned().unwrap_or_default(),
                )
            })
            .collect();
        answers.sort_by(|a, b| a.0.cmp(&b.0));
        answers
    }

    /// `ovos.persona.tools.call` of `name` in `toolbox`: the answer's data.
    pub async fn call(&mut self, toolbox: &str, name: &str, kwargs: Value) -> Value {
        let data = json!({"toolbox_id": toolbox, "name": name, "kwargs": kwargs});
        self.request("ovos.persona.tools.call", data).await["data"].clone()
    }

    /// Sends a request marked uniquely and returns the first matching
    /// response; fails the test after `ANSWER_DEADLINE`.
    pub async fn request(&mut self, topic: &str, data: Value) -> Value {
        self.request_within(topic, data, ANSWER_DEADLINE)
            .await
            .unwrap_or_else(|| panic!("no answer to {topic} within {ANSWER_DEADLINE:?}"))
    }

    /// Sends a request marked uniquely; its response, or None after `wait`.
    pub async fn request_within(
        &mut self,
        topic: &str,
        data: Value,
        wait: Duration,
    ) -> Option<Value> {
        let m = mark();
        self.send(topic, data, json!({"mark": m})).await;
        let response = format!("{topic}.response");
        self.wait_for(wait, |msg| {
            msg["type"] == response.as_str() && msg["context"]["mark"] == m.as_str()
        })
        .await
    }
}

/// Waits until `cond` holds, polling every 10 ms; fails the test with `what`
/// after `within`.
pub fn wait_until(what: &str, within: Duration, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !cond() {
        assert!(Instant::now() < deadline, "{what}: not within {within:?}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A loopback port for a server that must be told its port before it starts
/// (a bus restarted on the same address, a port written into mycroft.conf).
/// Everything else binds port 0 and reads the port back. The port is picked
/// below the kernel's ephemeral range (where outgoing connections never take
/// ports) and checked free, so only an explicit bind elsewhere can race it.
pub fn fixed_port() -> u16 {
    static NEXT: std::sync::atomic::AtomicU16 = std::sync::atomic::AtomicU16::new(0);
    let base = 20_000 + (std::process::id() % 500) as u16 * 20;
    for _ in 0..1000 {
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let port = base + n % 10_000;
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free loopback port below the ephemeral range");
}

/// A process a test started, SIGKILLed and reaped when dropped, so that a
/// failing test leaves nothing running.
pub struct Reaped(pub Child);

impl std::ops::Deref for Reaped {
    type Target = Child;
    fn deref(&self) -> &Child {
        &self.0
    }
}

impl std::ops::DerefMut for Reaped {
    fn deref_mut(&mut self) -> &mut Child {
        &mut self.0
    }
}

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `toolboxd bus` listening on 127.0.0.1:`port` (0: any), the port it
/// listens on, once it says so.
pub fn start_bus(port: u16) -> (Reaped, u16) {
    let mut bus = Command::new(BIN)
        .args(["--log-format", "json", "bus", "--listen"])
        .arg(format!("127.0.0.1:{port}"))
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = bus.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let deadline = Instant::now() + ANSWER_DEADLINE;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let Ok(line) = rx.recv_timeout(left) else {
            let _ = bus.kill();
            let _ = bus.wait();
            panic!("toolboxd bus never said it listens");
        };
        let Ok(v) = serde_json::from_str::<Value>(&line) else {
            continue;
        };
        if v["message"] == "messagebus listening" {
            let addr: std::net::SocketAddr = v["addr"].as_str().unwrap().parse().unwrap();
            std::thread::spawn(move || while rx.recv().is_ok() {});
            return (Reaped(bus), addr.port());
        }
    }
}

/// Runs `command` to completion, failing the test after `within`.
pub fn output_within(command: &mut Command, within: Duration) -> std::process::Output {
    let child = command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let (tx, rx) = std::sync::mpsc::channel();
    let pid = child.id();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(within) {
        Ok(out) => out.expect("wait for command"),
        Err(_) => {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid as i32),
                nix::sys::signal::Signal::SIGKILL,
            );
            panic!("{command:?} did not finish within {within:?}");
        }
    }
}

/// A loopback port held bound but not listening, so connections to it are
/// refused and no other process can take it while the guard lives: an address
/// where, for sure, no bus is.
pub fn refusing_port() -> (std::os::fd::OwnedFd, u16) {
    use std::os::fd::FromRawFd;
    // SAFETY: plain socket calls on a descriptor this function owns; every
    // return value is checked.
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
        assert!(fd >= 0, "socket: {}", std::io::Error::last_os_error());
        let owned = std::os::fd::OwnedFd::from_raw_fd(fd);
        let mut addr: libc::sockaddr_in = std::mem::zeroed();
        addr.sin_family = libc::AF_INET as libc::sa_family_t;
        addr.sin_addr.s_addr = u32::from(std::net::Ipv4Addr::LOCALHOST).to_be();
        let len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
        let rc = libc::bind(fd, std::ptr::addr_of!(addr).cast(), len);
        assert_eq!(rc, 0, "bind: {}", std::io::Error::last_os_error());
        let mut out_len = len;
        let rc = libc::getsockname(fd, std::ptr::addr_of_mut!(addr).cast(), &mut out_len);
        assert_eq!(rc, 0, "getsockname: {}", std::io::Error::last_os_error());
        (owned, u16::from_be(addr.sin_port))
    }
}

/// A `toolboxd --log-format json run ARGS` started without waiting for it and
/// without an added `--control` (the caller says where its control socket
/// will be). Every stderr line is kept in `logs` and also handed out, with
/// when it arrived, by `next_line`. SIGKILLed and reaped on drop unless it
/// became a [`Daemon`].
pub struct Starting {
    child: Option<Child>,
    control: PathBuf,
    pub logs: Arc<Mutex<Vec<String>>>,
    lines: std::sync::mpsc::Receiver<(Instant, String)>,
}

impl Starting {
    pub fn spawn(args: &[&str], env: &[(&str, &str)], control: &Path) -> Starting {
        let mut child = Command::new(BIN)
            .args(["--log-format", "json", "run"])
            .args(args)
            .env("RUST_LOG", "info")
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn toolboxd");
        let stderr = child.stderr.take().unwrap();
        let logs = Arc::new(Mutex::new(Vec::new()));
        let (tx, lines) = std::sync::mpsc::channel();
        let sink = logs.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                let at = Instant::now();
                if std::env::var_os("TOOLBOXD_TEST_LOGS").is_some() {
                    eprintln!("{line}");
                }
                sink.lock().unwrap().push(line.clone());
                let _ = tx.send((at, line));
            }
        });
        Starting {
            child: Some(child),
            control: control.to_owned(),
            logs,
            lines,
        }
    }

    /// The next JSON log line and when it arrived; None after `within` or
    /// once stderr has closed.
    pub fn next_line(&self, within: Duration) -> Option<(Instant, Value)> {
        let end = Instant::now() + within;
        loop {
            let left = end.checked_duration_since(Instant::now())?;
            let (at, line) = self.lines.recv_timeout(left).ok()?;
            if let Ok(v) = serde_json::from_str::<Value>(&line) {
                return Some((at, v));
            }
        }
    }

    /// The next JSON log line whose `message` contains `text`; fails the test
    /// after `within`.
    pub fn expect_line(&self, text: &str, within: Duration) -> (Instant, Value) {
        let end = Instant::now() + within;
        loop {
            let left = end.saturating_duration_since(Instant::now());
            let Some((at, v)) = self.next_line(left) else {
                panic!(
                    "no {text:?} in the log within {within:?}:\n{}",
                    self.logs.lock().unwrap().join("\n")
                );
            };
            if v["message"].as_str().is_some_and(|m| m.contains(text)) {
                return (at, v);
            }
        }
    }

    /// Waits for the "ready" line (30 s at most): the running daemon.
    pub fn ready(mut self) -> Daemon {
        let end = Instant::now() + Duration::from_secs(30);
        // "toolbox ready" lines come first; the daemon's own line is "ready".
        let line = loop {
            let (_, v) = self.expect_line("ready", end.saturating_duration_since(Instant::now()));
            if v["message"] == "ready" {
                break v;
            }
        };
        let url = line["bus"]
            .as_str()
            .expect("ready line names the bus")
            .to_owned();
        let Starting {
            child,
            control,
            logs,
            lines,
        } = &mut self;
        // Keep draining stderr in the background.
        let (_, dead) = std::sync::mpsc::channel();
        let lines = std::mem::replace(lines, dead);
        std::thread::spawn(move || while lines.recv().is_ok() {});
        Daemon {
            child: child.take().unwrap(),
            url,
            control: control.clone(),
            _control_dir: TempDir::new("ctl-unused"),
            logs: logs.clone(),
        }
    }
}

impl Drop for Starting {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
