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

    /// Starts `toolboxd run` with these arguments and extra environment.
    pub fn start_env(args: &[&str], env: &[(&str, &str)]) -> Daemon {
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
                break;
            }
        }
        // Keep draining stderr in the background thread (it owns rx's sender).
        std::thread::spawn(move || while rx.recv().is_ok() {});
        Daemon {
            child,
            url: url.expect("ready line names the bus"),
            control,
            _control_dir: control_dir,
            logs,
        }
    }

    /// `toolboxd ctl --control <ours> ARGS`: (exit code, stdout, stderr).
    pub fn ctl(&self, args: &[&str]) -> (i32, String, String) {
        let out = Command::new(BIN)
            .arg("ctl")
            .arg("--control")
            .arg(&self.control)
            .args(args)
            .output()
            .unwrap();
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    /// `ctl status --json`, the row of toolbox `id`.
    pub fn status(&self, id: &str) -> Value {
        let (code, out, err) = self.ctl(&["status", "--json"]);
        assert_eq!(code, 0, "ctl status failed: {err}");
        let rows: Value = serde_json::from_str(&out).unwrap();
        rows.as_array()
            .unwrap()
            .iter()
            .find(|r| r["id"] == id)
            .cloned()
            .unwrap_or_else(|| panic!("no {id} in status: {out}"))
    }

    /// Waits until toolbox `id` is in `state` (polling status).
    pub fn wait_for_state(&self, id: &str, state: &str, timeout: Duration) -> Value {
        let deadline = Instant::now() + timeout;
        loop {
            let row = self.status(id);
            if row["state"] == state {
                return row;
            }
            assert!(
                Instant::now() < deadline,
                "{id} never became {state}: {row}"
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

    /// SIGTERM and wait; returns the exit status.
    pub fn stop(&mut self) -> std::process::ExitStatus {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.child.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        self.child.wait().unwrap()
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            self.stop();
        }
    }
}

type Ws = WebSocketStream<MaybeTlsStream<TcpStream>>;

/// A test's own connection to the bus.
pub struct Bus {
    ws: Ws,
}

static MARKS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

/// A fresh unique mark for a request's context.
pub fn mark() -> String {
    format!(
        "m{}",
        MARKS.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    )
}

impl Bus {
    pub async fn connect(url: &str) -> Bus {
        let (ws, _) = tokio_tungstenite::connect_async(url)
            .await
            .expect("connect to bus");
        Bus { ws }
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

    /// Next decoded message, or None after `timeout`.
    pub async fn next(&mut self, timeout: Duration) -> Option<Value> {
        loop {
            let frame = tokio::time::timeout(timeout, self.ws.next())
                .await
                .ok()??
                .ok()?;
            if let WsMessage::Text(text) = frame {
                if let Ok(v) = serde_json::from_str::<Value>(text.as_str()) {
                    return Some(v);
                }
            }
        }
    }

    /// Every message of `topic` whose context carries `mark`, collected for `window`.
    pub async fn collect(&mut self, topic: &str, mark: &str, window: Duration) -> Vec<Value> {
        let end = Instant::now() + window;
        let mut found = Vec::new();
        while let Some(left) = end.checked_duration_since(Instant::now()) {
            match self.next(left).await {
                Some(m) if m["type"] == topic && m["context"]["mark"] == mark => found.push(m),
                Some(_) => {}
                None => break,
            }
        }
        found
    }

    /// Sends `ovos.persona.tools.discover` and collects every answer for
    /// `window`: (toolbox_id, tools), sorted by id, duplicates kept.
    pub async fn discover(&mut self, window: Duration) -> Vec<(String, Vec<Value>)> {
        let m = mark();
        self.send("ovos.persona.tools.discover", json!({}), json!({"mark": m}))
            .await;
        let mut answers: Vec<(String, Vec<Value>)> = self
            .collect("ovos.persona.tools.discover.response", &m, window)
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

    /// Sends a request marked uniquely and returns the first matching response.
    pub async fn request(&mut self, topic: &str, data: Value) -> Value {
        self.request_within(topic, data, Duration::from_secs(20))
            .await
            .unwrap_or_else(|| panic!("no answer to {topic}"))
    }

    pub async fn request_within(
        &mut self,
        topic: &str,
        data: Value,
        wait: Duration,
    ) -> Option<Value> {
        let m = mark();
        self.send(topic, data, json!({"mark": m})).await;
        let response = format!("{topic}.response");
        let end = Instant::now() + wait;
        loop {
            let left = end.checked_duration_since(Instant::now())?;
            let msg = self.next(left).await?;
            if msg["type"] == response.as_str() && msg["context"]["mark"] == m.as_str() {
                return Some(msg);
            }
        }
    }
}

/// A free loopback port (bound to port 0 and read back, then released).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Starts `toolboxd bus` on `port` and waits until it says it listens.
pub fn start_bus(port: u16) -> Child {
    let mut bus = Command::new(BIN)
        .args(["bus", "--listen", &format!("127.0.0.1:{port}")])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = bus.stderr.take().unwrap();
    let mut lines = BufReader::new(stderr).lines();
    assert!(lines
        .by_ref()
        .map_while(Result::ok)
        .any(|l| l.contains("messagebus listening")));
    std::thread::spawn(move || lines.for_each(drop));
    bus
}
