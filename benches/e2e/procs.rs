//! The processes a benchmark starts: buses, daemons, the echo responder,
//! the Python service; each ended (killed and reaped) when dropped.

use super::*;

/// A child process, stopped (SIGTERM, then SIGKILL after 5 s) on drop.
pub(crate) struct Proc(pub(crate) Child);

impl Proc {
    pub(crate) fn pid(&self) -> u32 {
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
pub(crate) fn wait_line(
    stream: impl std::io::Read + Send + 'static,
    needle: &str,
    what: &str,
) -> String {
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

pub(crate) fn tempdir(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("toolboxd-bench-{}/{tag}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("creating a temporary directory");
    dir
}

/// A bus and the URL to reach it.
pub(crate) struct Bus {
    pub(crate) proc: Proc,
    pub(crate) url: String,
    /// "embedded" or "Python".
    pub(crate) name: &'static str,
}

/// `toolboxd bus` on an ephemeral loopback port, read back from its log.
pub(crate) fn embedded_bus() -> Bus {
    let mut child = Command::new(TOOLBOXD)
        .args(["--log-format", "json", "bus", "--listen", "127.0.0.1:0"])
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting toolboxd bus");
    let stderr = child.stderr.take().expect("piped stderr");
    let proc = Proc(child);
    let line = wait_line(stderr, "messagebus listening", "toolboxd bus");
    let addr = log_field(&line, "addr");
    Bus {
        proc,
        url: format!("ws://{addr}/core"),
        name: "embedded",
    }
}

/// A private XDG home for the Python processes (configuration, logs).
pub(crate) fn xdg_home() -> PathBuf {
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

pub(crate) fn python(script: &str, home: &Path) -> Command {
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
pub(crate) fn python_bus(home: &Path) -> Bus {
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
pub(crate) fn python_service(url: &str, home: &Path, toolboxes: usize) -> Proc {
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
pub(crate) fn daemon(url: &str, dir: &Path) -> Proc {
    daemon_with(url, dir, &[])
}

/// toolboxd on `url` with the manifests in `dir` and `flags` for `run`;
/// returns once it is ready.
pub(crate) fn daemon_with(url: &str, dir: &Path, flags: &[&str]) -> Proc {
    daemon_env(url, dir, &dir.join("ctl.sock"), flags, &[]).0
}

/// toolboxd on `url` with the manifests in `dir`, its control socket at
/// `socket`, `flags` for `run` and `env` set; returns once it is ready, with
/// its `ready` log line.
pub(crate) fn daemon_env(
    url: &str,
    dir: &Path,
    socket: &Path,
    flags: &[&str],
    env: &[(&str, &Path)],
) -> (Proc, String) {
    run_daemon(&["--bus", url], dir, socket, flags, env)
}

/// toolboxd serving its own embedded bus on an ephemeral loopback port, with
/// the manifests in `dir`: the daemon is the bus (its URL read back from the
/// `ready` line).
pub(crate) fn daemon_embedding(dir: &Path) -> Bus {
    let bus = ["--embedded-bus", "127.0.0.1:0"];
    let (proc, ready) = run_daemon(&bus, dir, &dir.join("ctl.sock"), &[], &[]);
    Bus {
        proc,
        url: log_field(&ready, "bus"),
        name: "toolboxd's own",
    }
}

/// The text field `key` of a JSON log line.
fn log_field(line: &str, key: &str) -> String {
    serde_json::from_str::<Value>(line)
        .ok()
        .and_then(|v| v[key].as_str().map(str::to_owned))
        .unwrap_or_else(|| panic!("no {key} in the log line {line}"))
}

/// `toolboxd run` with `bus` (the bus flags) and the rest as for [`daemon_env`].
fn run_daemon(
    bus: &[&str],
    dir: &Path,
    socket: &Path,
    flags: &[&str],
    env: &[(&str, &Path)],
) -> (Proc, String) {
    let mut child = Command::new(TOOLBOXD)
        .args(["--log-format", "json", "run"])
        .args(bus)
        .arg("--manifests")
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
pub(crate) fn echo_responder(url: &str) -> Proc {
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
pub(crate) async fn run_echo_responder(url: &str) {
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
pub(crate) struct Variant {
    /// How the tables name it.
    pub(crate) label: &'static str,
    pub(crate) command: PathBuf,
    pub(crate) args: Vec<String>,
    /// Tools it lists.
    pub(crate) tools: usize,
}

impl Variant {
    pub(crate) fn manifest(&self, dir: &Path, id: &str, extra: &str) {
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
