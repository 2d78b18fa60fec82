//! A real `toolboxd run` process: started, waited for, operated, and
//! stopped and reaped on drop.

use super::*;

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

    /// [`Daemon::start`], writing its audit log to `audit`.
    pub fn start_audited(manifests: &Path, audit: &Path) -> Daemon {
        Daemon::start_with(&[
            "--manifests",
            manifests.to_str().unwrap(),
            "--embedded-bus",
            "127.0.0.1:0",
            "--audit-log",
            audit.to_str().unwrap(),
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

    /// A daemon on the manifests in `dir` with an embedded bus, telling the
    /// systemd notify socket at `notify` its state, with a 200 ms watchdog.
    pub fn start_notifying(dir: &Path, notify: &Path) -> Daemon {
        let manifests = dir.to_str().unwrap();
        let args = ["--manifests", manifests, "--embedded-bus", "127.0.0.1:0"];
        let notify = notify.to_str().unwrap();
        Daemon::start_env(
            &args,
            &[("NOTIFY_SOCKET", notify), ("WATCHDOG_USEC", "200000")],
        )
    }

    /// Starts `toolboxd run` and waits until it logs `message` (a line whose
    /// message starts with it); the bus URL is the `--bus` or the one "ready"
    /// names.
    pub fn start_until(args: &[&str], env: &[(&str, &str)], message: &str) -> Daemon {
        Daemon::start_as(None, args, env, message)
    }

    /// [`Daemon::start_until`], the daemon running as `user` (uid, gid) when
    /// given: a daemon that is not root. Its control directory is that user's.
    pub fn start_as(
        user: Option<(u32, u32)>,
        args: &[&str],
        env: &[(&str, &str)],
        message: &str,
    ) -> Daemon {
        let control_dir = TempDir::new("ctl");
        if let Some((uid, gid)) = user {
            std::os::unix::fs::chown(control_dir.path(), Some(uid), Some(gid)).unwrap();
        }
        let given = args
            .iter()
            .position(|a| *a == "--control")
            .map(|i| PathBuf::from(args[i + 1]));
        let control = given
            .clone()
            .unwrap_or_else(|| control_dir.path().join("ctl.sock"));
        let control_arg = control.to_string_lossy().into_owned();
        let extra: &[&str] = match given {
            None => &["--control", &control_arg],
            Some(_) => &[],
        };
        let (mut child, logs, rx) = run_logged(extra, args, env, user);
        let mut url = None;
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let Ok((_, line)) = rx.recv_timeout(left) else {
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
        let (child, logs, lines) = run_logged(&[], args, env, None);
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

/// The first pid `ctl status` shows for toolbox `id`.
pub fn pid_of(daemon: &Daemon, id: &str) -> u64 {
    daemon.status(id)["pids"][0].as_u64().unwrap()
}

/// Fails the test if process `pid`'s resident memory grew by `limit_kib`
/// or more since `before` ([`rss_kib`]).
pub fn assert_rss_grew_less(pid: u32, before: u64, limit_kib: u64) {
    let after = rss_kib(pid);
    assert!(
        after < before + limit_kib,
        "daemon RSS grew from {before} KiB to {after} KiB"
    );
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

/// `toolboxd --log-format json run EXTRA ARGS` with `env`, its stderr read
/// by a thread: every line kept in the returned log and also handed out,
/// with when it arrived (`TOOLBOXD_TEST_LOGS=1` echoes them).
#[allow(clippy::type_complexity)]
fn run_logged(
    extra: &[&str],
    args: &[&str],
    env: &[(&str, &str)],
    user: Option<(u32, u32)>,
) -> (
    Child,
    Arc<Mutex<Vec<String>>>,
    std::sync::mpsc::Receiver<(Instant, String)>,
) {
    let mut command = Command::new(BIN);
    if let Some((uid, gid)) = user {
        use std::os::unix::process::CommandExt;
        // std drops the supplementary groups when root sets a uid.
        command.uid(uid).gid(gid);
    }
    let mut child = command
        .args(["--log-format", "json", "run"])
        .args(extra)
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
    (child, logs, lines)
}
