//! The control socket: a Unix socket (mode 0600) speaking line-delimited
//! JSON-RPC, through which `toolboxd ctl` reads status and logs and restarts,
//! stops, starts and reloads toolboxes; and that client.
//!
//! The server only decodes requests into [`Operation`]s and hands them to the
//! operator channel ([`crate::operator`]), which carries them out.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};

use crate::operator::{Operation, Operators};
use crate::shutdown::Shutdown;

/// Why the control socket cannot be served or reached.
#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    #[error("another toolboxd is running on the control socket {0}; stop it first, or give this one another --control PATH")]
    InUse(PathBuf),
    #[error("{0} exists and is not a socket; toolboxd removes only a stale socket there: remove it yourself, or give another --control PATH")]
    NotASocket(PathBuf),
    #[error("no place for the control socket: XDG_RUNTIME_DIR is unset and this is not root; set XDG_RUNTIME_DIR or give --control PATH (in a directory only you can write)")]
    NoDefault,
    #[error("cannot create the control socket {path}: {source}")]
    Bind {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot reach toolboxd on {path}: {source}; is the daemon running with this --control path?")]
    Connect {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("control socket {path}: {why}")]
    Protocol { path: PathBuf, why: String },
}

/// The runtime directory root uses when `XDG_RUNTIME_DIR` is unset.
const ROOT_RUNTIME_DIR: &str = "/run/toolboxd";

/// Where the control socket lives unless `--control` says otherwise:
/// `$XDG_RUNTIME_DIR/toolboxd.sock`, else `/run/toolboxd/toolboxd.sock` for
/// root. Never a predictable name in a shared directory such as /tmp, which
/// another user could take first: without either, `--control` is required.
pub fn default_path() -> Result<PathBuf, ControlError> {
    if let Some(dir) = std::env::var_os("XDG_RUNTIME_DIR").filter(|d| !d.is_empty()) {
        return Ok(Path::new(&dir).join("toolboxd.sock"));
    }
    if nix::unistd::getuid().is_root() {
        return Ok(Path::new(ROOT_RUNTIME_DIR).join("toolboxd.sock"));
    }
    Err(ControlError::NoDefault)
}

/// Creates the socket with mode 0600. A live daemon on the path is an error; a
/// socket left by a dead one is replaced, but nothing else is ever removed (a
/// regular file or a symlink there is an error). Root's default directory is
/// created private (0700).
pub async fn bind(path: &Path) -> Result<UnixListener, ControlError> {
    use std::os::unix::fs::{DirBuilderExt, FileTypeExt};
    if path.parent() == Some(Path::new(ROOT_RUNTIME_DIR)) {
        let _ = std::fs::DirBuilder::new()
            .mode(0o700)
            .create(ROOT_RUNTIME_DIR);
    }
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        if !meta.file_type().is_socket() {
            return Err(ControlError::NotASocket(path.to_owned()));
        }
        match UnixStream::connect(path).await {
            Ok(_) => return Err(ControlError::InUse(path.to_owned())),
            // Only a refused connection means nobody listens; anything else
            // (a full backlog, say) may be a live daemon: leave it.
            Err(e) if e.kind() != std::io::ErrorKind::ConnectionRefused => {
                return Err(ControlError::InUse(path.to_owned()))
            }
            Err(_) => {
                tracing::info!(path = %path.display(), "removing a stale control socket");
                let _ = std::fs::remove_file(path);
            }
        }
    }
    // The socket is created with the process umask: make it private from the
    // first moment rather than chmod it afterwards.
    let old = nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o177));
    let bound = UnixListener::bind(path);
    nix::sys::stat::umask(old);
    bound.map_err(|source| ControlError::Bind {
        path: path.to_owned(),
        source,
    })
}

/// Serves connections until shutdown, then removes the socket file.
pub async fn serve(
    listener: UnixListener,
    path: PathBuf,
    operators: Operators,
    mut shutdown: Shutdown,
) {
    let open = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    loop {
        let accepted = tokio::select! {
            a = listener.accept() => a,
            _ = shutdown.recv() => break,
        };
        match accepted {
            Ok((stream, _)) => {
                if let Err(why) = peer_allowed(&stream) {
                    tracing::warn!("control socket: refused a connection: {why}");
                    continue;
                }
                let Ok(slot) = open.clone().try_acquire_owned() else {
                    tracing::warn!(
                        "control socket: refused a connection: {MAX_CONNECTIONS} are open already"
                    );
                    continue;
                };
                let operators = operators.clone();
                tokio::spawn(async move {
                    connection(stream, operators).await;
                    drop(slot);
                });
            }
            Err(e) => {
                tracing::warn!("control socket accept failed: {e}");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
        }
    }
    let _ = std::fs::remove_file(&path);
}

/// Control connections served at once; more are refused (logged).
const MAX_CONNECTIONS: usize = 32;
/// How long a control connection may stay silent before it is closed.
const IDLE: std::time::Duration = std::time::Duration::from_secs(60);

/// Admits a peer of the daemon's own user (or root) that runs outside every
/// toolbox: the socket's mode already keeps other users out, and a toolbox
/// (which may run as the daemon's user) must not operate the daemon.
fn peer_allowed(stream: &UnixStream) -> Result<(), String> {
    let cred = stream
        .peer_cred()
        .map_err(|e| format!("cannot read the peer's credentials: {e}"))?;
    let ours = nix::unistd::getuid().as_raw();
    if cred.uid() != ours && cred.uid() != 0 {
        return Err(format!(
            "uid {} is neither the daemon's ({ours}) nor root",
            cred.uid()
        ));
    }
    let Some(pid) = cred.pid() else {
        return Ok(());
    };
    // A peer that is gone cannot be told from a toolbox's (one that
    // connected, passed the socket on and exited): refused, as is any whose
    // process cannot be read.
    if std::fs::metadata(format!("/proc/{pid}/status")).is_err() {
        return Err(format!(
            "pid {pid} is gone (or hidden): a peer must be alive to be checked"
        ));
    }
    if let Some(cgroups) = crate::process::cgroup::Cgroups::get_if_created() {
        if cgroups.holds(pid) {
            return Err(format!("pid {pid} runs inside a toolbox"));
        }
    }
    // Also where a child runs outside its cgroup (one the kernel refused
    // it): whatever the daemon started is a toolbox's.
    let peer = u32::try_from(pid).unwrap_or(0);
    if crate::process::proctree::descends_from(peer, std::process::id()) {
        return Err(format!("pid {pid} was started by the daemon (a toolbox's)"));
    }
    // And where it left the daemon's tree and has no cgroup (a daemon that
    // is not root, re-parented by `setsid` and a double fork): every process
    // of a standard-profile toolbox carries the seccomp filter the daemon
    // gave it, which no process can shed, on top of the daemon's own.
    if let (Some(theirs), Some(ours)) = (seccomp_filters(peer), seccomp_filters(std::process::id()))
    {
        if theirs > ours {
            return Err(format!(
                "pid {pid} runs under more seccomp filters ({theirs}) than the daemon ({ours}): \
                 a toolbox's process"
            ));
        }
    }
    // Checked last, so that a peer that exited during the checks (each of
    // which read nothing and passed) is refused all the same.
    if std::fs::metadata(format!("/proc/{pid}/status")).is_err() {
        return Err(format!("pid {pid} exited while it was checked"));
    }
    Ok(())
}

/// How many seccomp filters process `pid` runs under (Linux 5.9 and later
/// say; `None` before, or when it is gone).
fn seccomp_filters(pid: u32) -> Option<u32> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let count = status
        .lines()
        .find_map(|l| l.strip_prefix("Seccomp_filters:"))?;
    count.trim().parse().ok()
}

/// Longest request line accepted.
const MAX_REQUEST: u64 = 64 * 1024;

async fn connection(stream: UnixStream, operators: Operators) {
    let (read, mut write) = stream.into_split();
    let mut lines = BufReader::new(tokio::io::AsyncReadExt::take(read, MAX_REQUEST)).lines();
    // A connection that asks nothing for IDLE is closed: it holds a slot.
    while let Ok(Ok(Some(line))) = tokio::time::timeout(IDLE, lines.next_line()).await {
        let answer = answer(&line, &operators).await;
        let mut out = answer.to_string();
        out.push('\n');
        if write.write_all(out.as_bytes()).await.is_err() {
            return;
        }
    }
}

/// Decodes one request line: the id to answer with (null when the line has
/// none) and the operation it asks for, or the JSON-RPC error code and
/// message to answer instead (-32700 not JSON, -32602 no operation).
pub fn decode_request(line: &str) -> (Value, Result<Operation, (i64, String)>) {
    let request: Value = match serde_json::from_str(line) {
        Ok(v) => v,
        Err(e) => return (Value::Null, Err((-32700, format!("not JSON: {e}")))),
    };
    let id = request.get("id").cloned().unwrap_or(Value::Null);
    let operation = Operation::from_request(&request).map_err(|e| (-32602, e.to_string()));
    (id, operation)
}

async fn answer(line: &str, operators: &Operators) -> Value {
    let (id, operation) = decode_request(line);
    let operation = match operation {
        Ok(operation) => operation,
        Err((code, message)) => return rpc_error(id, code, &message),
    };
    match operators.ask(operation).await {
        Ok(outcome) => json!({"jsonrpc": "2.0", "id": id, "result": outcome.into_json()}),
        Err(refused) => rpc_error(id, -32000, &refused.to_string()),
    }
}

fn rpc_error(id: Value, code: i64, message: &str) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}})
}

/// The request line (without its newline) that asks for `operation`.
pub fn request_line(operation: &Operation) -> String {
    json!({"jsonrpc": "2.0", "id": 1, "method": operation.name(), "params": operation.params()})
        .to_string()
}

/// Sends `operation` to the daemon on `path` and returns its result.
pub async fn request(path: &Path, operation: &Operation) -> Result<Value, ControlError> {
    let stream = UnixStream::connect(path)
        .await
        .map_err(|source| ControlError::Connect {
            path: path.to_owned(),
            source,
        })?;
    let (read, mut write) = stream.into_split();
    let mut line = request_line(operation);
    line.push('\n');
    let protocol = |why: String| ControlError::Protocol {
        path: path.to_owned(),
        why,
    };
    write
        .write_all(line.as_bytes())
        .await
        .map_err(|e| protocol(e.to_string()))?;
    let answer = BufReader::new(read)
        .lines()
        .next_line()
        .await
        .map_err(|e| protocol(e.to_string()))?
        .ok_or_else(|| protocol("the daemon closed the connection".to_owned()))?;
    let answer: Value = serde_json::from_str(&answer).map_err(|e| protocol(e.to_string()))?;
    if let Some(error) = answer.get("error") {
        let message = error
            .get("message")
            .and_then(Value::as_str)
            .unwrap_or("error");
        return Err(protocol(message.to_owned()));
    }
    Ok(answer.get("result").cloned().unwrap_or(Value::Null))
}

/// `ctl logs`: one line per stderr line, `TIME [PID] TEXT`.
pub fn log_lines(lines: &Value) -> String {
    let mut out = String::new();
    for line in lines.as_array().into_iter().flatten() {
        out.push_str(&format!(
            "{} [{}] {}\n",
            line["time"].as_str().unwrap_or("-"),
            line["pid"]
                .as_u64()
                .map_or("-".to_owned(), |p| p.to_string()),
            line["text"].as_str().unwrap_or("")
        ));
    }
    out
}

/// `ctl status` as a table.
pub fn status_table(rows: &Value) -> String {
    let mut out = format!(
        "{:<16} {:<10} {:>8} {:>8} {:>8} {:>8} {:>5} {:>8} {:>9} {:>9} {:>6} {:>8} {:>8}  {}\n",
        "ID",
        "STATE",
        "PID",
        "UPTIME",
        "MEM_MIB",
        "CPU_S",
        "TOOLS",
        "RESTARTS",
        "CALLS_OK",
        "CALLS_ERR",
        "FLIGHT",
        "P50_MS",
        "P99_MS",
        "LAST_EXIT"
    );
    for r in rows.as_array().into_iter().flatten() {
        let num = |k: &str| r[k].as_u64().map_or("-".to_owned(), |v| v.to_string());
        let ms = |k: &str| r[k].as_f64().map_or("-".to_owned(), |v| format!("{v:.2}"));
        let pids = r["pids"]
            .as_array()
            .map(|p| {
                p.iter()
                    .map(|v| v.to_string())
                    .collect::<Vec<_>>()
                    .join(",")
            })
            .filter(|p| !p.is_empty())
            .unwrap_or_else(|| "-".to_owned());
        let uptime = r["uptime_s"]
            .as_u64()
            .map_or("-".to_owned(), |s| format!("{s}s"));
        // The last column says what most needs saying: why the state, a
        // conflict with another host, a toolbox that serves nothing, or how
        // the last child ended.
        let last = r["reason"]
            .as_str()
            .or(r["conflict"].as_str())
            .or(r["note"].as_str())
            .or(r["last_exit"].as_str())
            .unwrap_or("-");
        let memory = r["memory_bytes"]
            .as_u64()
            .map_or("-".to_owned(), |b| format!("{:.1}", b as f64 / 1048576.0));
        let cpu = r["cpu_s"]
            .as_f64()
            .map_or("-".to_owned(), |s| format!("{s:.2}"));
        out.push_str(&format!(
            "{:<16} {:<10} {:>8} {:>8} {:>8} {:>8} {:>5} {:>8} {:>9} {:>9} {:>6} {:>8} {:>8}  {}\n",
            r["id"].as_str().unwrap_or("?"),
            r["state"].as_str().unwrap_or("?"),
            pids,
            uptime,
            memory,
            cpu,
            num("tools"),
            num("restarts"),
            num("calls_ok"),
            num("calls_err"),
            num("in_flight"),
            ms("p50_ms"),
            ms("p99_ms"),
            last
        ));
        // What its sandbox refused, explained: under its row.
        for hint in r["sandbox_refused"].as_array().into_iter().flatten() {
            out.push_str(&format!("    {}\n", hint.as_str().unwrap_or("?")));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::operator::{Performed, Refused};
    use crate::shutdown::ShutdownTrigger;

    /// A private directory for one test's socket, removed at the end.
    struct Dir(PathBuf);

    impl Dir {
        fn new(tag: &str) -> Dir {
            let dir =
                std::env::temp_dir().join(format!("toolboxd-control-{tag}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).expect("a temporary directory");
            Dir(dir)
        }
    }

    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    /// Serves a control socket in `dir` whose operations a stand-in carries
    /// out: status has one row, restart knows no toolbox, the rest are done.
    async fn serve_stand_in(dir: &Dir) -> (PathBuf, ShutdownTrigger) {
        let path = dir.0.join("ctl.sock");
        let listener = bind(&path).await.expect("bind");
        let (operators, mut inbox) = crate::operator::channel();
        let (trigger, shutdown) = ShutdownTrigger::new();
        tokio::spawn(serve(listener, path.clone(), operators, shutdown));
        tokio::spawn(async move {
            while let Some(request) = inbox.recv().await {
                let answer = match request.operation().clone() {
                    Operation::Status => Ok(Performed::Status(json!([{"id": "stand-in"}]))),
                    Operation::Restart(id) => Err(Refused::NotHosted(id)),
                    other => Ok(Performed::Done(format!("{} done", other.name()))),
                };
                request.answer(answer);
            }
        });
        (path, trigger)
    }

    /// Sends each line on one connection and returns the answers.
    async fn exchange(path: &Path, lines: &[&str]) -> Vec<Value> {
        let stream = UnixStream::connect(path).await.expect("connect");
        let (read, mut write) = stream.into_split();
        let mut answers = BufReader::new(read).lines();
        let mut out = Vec::new();
        for line in lines {
            write
                .write_all(format!("{line}\n").as_bytes())
                .await
                .expect("write");
            let answer = answers.next_line().await.expect("read").expect("a line");
            out.push(serde_json::from_str(&answer).expect("JSON"));
        }
        out
    }

    #[tokio::test]
    async fn the_socket_answers_operations_and_bad_requests_exactly() {
        let dir = Dir::new("answers");
        let (path, trigger) = serve_stand_in(&dir).await;
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&path)
            .expect("the socket")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        let answers = exchange(
            &path,
            &[
                r#"{"jsonrpc":"2.0","id":1,"method":"status","params":null}"#,
                r#"{"jsonrpc":"2.0","id":2,"method":"frobnicate"}"#,
                r#"{"jsonrpc":"2.0","id":3,"method":"stop","params":{}}"#,
                r#"{"jsonrpc":"2.0","id":4,"params":{}}"#,
                r#"{"jsonrpc":"2.0","id":5,"method":"restart","params":{"id":"nope"}}"#,
                r#"{"jsonrpc":"2.0","id":6,"method":"start","params":{"id":"math"}}"#,
                "not json",
            ],
        )
        .await;
        let error = |id: Value, code: i64, message: &str| json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}});
        assert_eq!(
            answers[0],
            json!({"jsonrpc": "2.0", "id": 1, "result": [{"id": "stand-in"}]})
        );
        assert_eq!(
            answers[1],
            error(
                json!(2),
                -32602,
                "unknown method \"frobnicate\"; use status, restart, stop, start, reload or logs"
            )
        );
        assert_eq!(
            answers[2],
            error(json!(3), -32602, "stop needs params.id (a toolbox id)")
        );
        assert_eq!(answers[3], error(json!(4), -32602, "no method"));
        assert_eq!(
            answers[4],
            error(
                json!(5),
                -32000,
                "no toolbox \"nope\" is hosted here; see toolboxd ctl status"
            )
        );
        assert_eq!(
            answers[5],
            json!({"jsonrpc": "2.0", "id": 6, "result": "start done"})
        );
        assert_eq!(answers[6]["id"], Value::Null);
        assert_eq!(answers[6]["error"]["code"], -32700);
        assert!(answers[6]["error"]["message"]
            .as_str()
            .is_some_and(|m| m.starts_with("not JSON: ")));

        trigger.trigger();
        for _ in 0..100 {
            if !path.exists() {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        assert!(!path.exists(), "the socket is removed at shutdown");
    }

    #[tokio::test]
    async fn the_client_sends_the_wire_names_and_reads_results_and_errors() {
        let dir = Dir::new("client");
        let (path, _trigger) = serve_stand_in(&dir).await;
        let rows = request(&path, &Operation::Status).await.expect("status");
        assert_eq!(rows, json!([{"id": "stand-in"}]));
        let done = request(&path, &Operation::Stop("math".to_owned()))
            .await
            .expect("stop");
        assert_eq!(done, json!("stop done"));
        let refused = request(&path, &Operation::Restart("nope".to_owned()))
            .await
            .expect_err("no such toolbox");
        assert_eq!(
            refused.to_string(),
            format!(
                "control socket {}: no toolbox \"nope\" is hosted here; see toolboxd ctl status",
                path.display()
            )
        );
    }

    #[tokio::test]
    async fn a_second_server_on_a_live_socket_is_refused() {
        let dir = Dir::new("in-use");
        let (path, _trigger) = serve_stand_in(&dir).await;
        assert!(matches!(bind(&path).await, Err(ControlError::InUse(p)) if p == path));
    }
}
