//! One child process: spawn, stdio framing, request multiplexing, exit.
//!
//! A [`Child`] owns the process. Four small tasks serve it: a writer that owns
//! stdin, a reader that owns stdout and routes each response to its waiting
//! caller by JSON-RPC id, a stderr forwarder, and a reaper that waits for the
//! exit and fails every call still in flight with the exit status. Dropping the
//! `Child` kills its whole process group and, where the kernel allows, its
//! cgroup ([`crate::cgroup`]: every process it started, `setsid` ones too), so
//! nothing leaks. The process also gets a parent-death signal, and the
//! daemon's keeper ([`crate::keeper`]) kills its group and cgroup if toolboxd
//! is killed outright.

use std::collections::HashMap;
use std::fmt;
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::process::{ChildStdin, Command};
use tokio::sync::{mpsc, oneshot, watch};

use crate::manifest::Manifest;
use crate::mcp::{self, FrameError, Incoming, RpcError};

/// How a child process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExitInfo {
    /// It exited with this code.
    Code(i32),
    /// A signal killed it.
    Signal(i32),
}

impl ExitInfo {
    /// Whether the exit counts as a failure for `restart.policy = "on-failure"`.
    pub fn is_failure(self) -> bool {
        self != ExitInfo::Code(0)
    }
}

impl fmt::Display for ExitInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ExitInfo::Code(c) => write!(f, "code {c}"),
            ExitInfo::Signal(s) => write!(f, "signal {s}"),
        }
    }
}

impl From<std::process::ExitStatus> for ExitInfo {
    fn from(status: std::process::ExitStatus) -> Self {
        use std::os::unix::process::ExitStatusExt;
        match (status.code(), status.signal()) {
            (Some(code), _) => ExitInfo::Code(code),
            (None, Some(signal)) => ExitInfo::Signal(signal),
            (None, None) => ExitInfo::Code(-1),
        }
    }
}

/// Why a request to a child got no result.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum RpcFailure {
    /// The child answered with a JSON-RPC error.
    #[error("{}", .0.message)]
    Rpc(RpcError),
    /// The process ended before answering.
    #[error("exited ({0})")]
    Exited(ExitInfo),
    /// The child broke the protocol and is being killed.
    #[error("broke the protocol: {0}")]
    Broken(String),
    /// The deadline passed first; the child was told to cancel.
    #[error("did not answer in time")]
    TimedOut,
}

/// Something the child told us that its owner must act on.
#[derive(Debug)]
pub enum ChildEvent {
    /// `notifications/tools/list_changed`.
    ToolsChanged,
}

/// What waits for the answer to one request.
enum Waiter {
    /// A caller.
    Caller(oneshot::Sender<Result<Value, RpcFailure>>),
    /// Nobody any more (its deadline passed), but this stays held — a call
    /// slot, say — until the child answers or is gone: the child is still
    /// working on the request.
    Abandoned(#[allow(dead_code)] Box<dyn Send>),
}

/// Requests waiting for their answer, by request id.
type Pending = HashMap<u64, Waiter>;

/// The state shared by a child's tasks and its callers.
struct Link {
    /// The toolbox this child serves, for every log line.
    toolbox: String,
    /// The process id, for every log line.
    pid: u32,
    /// Next JSON-RPC request id.
    next_id: AtomicU64,
    /// Callers waiting for answers. A plain mutex: it is held only to insert or
    /// remove one entry, never across an await.
    pending: Mutex<Pending>,
    /// Set once the child is gone (or broken): new requests fail at once with it.
    closed: Mutex<Option<RpcFailure>>,
    /// Lines for the writer task, which owns stdin. Always sent through
    /// [`Link::send`], which keeps them within `stdin_budget`.
    stdin: mpsc::UnboundedSender<Vec<u8>>,
    /// Bytes queued for stdin and not yet written: a child that stops reading
    /// makes this grow.
    queued: Arc<std::sync::atomic::AtomicUsize>,
    /// The most bytes that may wait for stdin (`max_message_bytes`); past it
    /// the child is cut off and restarted, so it cannot make the daemon hold
    /// unbounded memory.
    stdin_budget: usize,
    /// Why the child was cut off for breaking the protocol, once it was
    /// (kept apart from `closed`, which its exit status later replaces).
    cut: std::sync::OnceLock<String>,
}

impl Link {
    /// Queues a line for the child's stdin, within the budget. Past it the
    /// child is cut off (every call on it fails, it is killed and restarted).
    fn send(&self, line: Vec<u8>) {
        let n = line.len();
        if n > self.stdin_budget {
            // One request too large for the child's stdin budget: it is not
            // the child's fault. The caller of such a request is refused
            // before it gets here (see `send_request`).
            tracing::warn!(toolbox = %self.toolbox, pid = self.pid, bytes = n, "a line for the child is larger than max_message_bytes; not sent");
            return;
        }
        let queued = self.queued.fetch_add(n, Ordering::Relaxed) + n;
        if queued > self.stdin_budget {
            self.queued.fetch_sub(n, Ordering::Relaxed);
            cut_off(
                self,
                format!(
                    "the child does not read its stdin ({queued} bytes waiting, more than \
                     max_message_bytes = {})",
                    self.stdin_budget
                ),
            );
            return;
        }
        if self.stdin.send(line).is_err() {
            self.queued.fetch_sub(n, Ordering::Relaxed);
        }
    }

    fn lock_pending(&self) -> std::sync::MutexGuard<'_, Pending> {
        // A panic while holding this lock would be a bug in a few lines of map
        // code; the map itself stays consistent, so recover it rather than panic.
        self.pending.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Fails every pending call and every later one with `why`.
    fn close(&self, why: RpcFailure) {
        {
            let mut closed = self.closed.lock().unwrap_or_else(|e| e.into_inner());
            // An exit status is more useful to callers than "broken": keep the
            // exit once it is known.
            if closed.is_none() || matches!(why, RpcFailure::Exited(_)) {
                *closed = Some(why.clone());
            }
        }
        let waiting: Vec<_> = self.lock_pending().drain().map(|(_, w)| w).collect();
        for waiter in waiting {
            if let Waiter::Caller(tx) = waiter {
                let _ = tx.send(Err(why.clone()));
            }
        }
    }
}

/// Removes a request from `pending` if its caller gives up (timeout or drop),
/// and tells the child to cancel it.
struct InFlight<'a> {
    link: &'a Link,
    id: u64,
    done: bool,
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        if !self.done && self.link.lock_pending().remove(&self.id).is_some() {
            let params = serde_json::json!({"requestId": self.id, "reason": "timed out"});
            self.link
                .send(mcp::notification_line("notifications/cancelled", &params));
        }
    }
}

/// A cheap handle for sending requests to one child; clone it freely.
#[derive(Clone)]
pub struct RpcHandle {
    link: Arc<Link>,
}

impl RpcHandle {
    /// Sends a request and waits for its answer. Dropping the future (e.g. on a
    /// timeout) withdraws the request and sends `notifications/cancelled`.
    pub async fn request(&self, method: &str, params: Value) -> Result<Value, RpcFailure> {
        let (_, rx, mut guard) = self.send_request(method, &params)?;
        let answer = rx.await;
        guard.done = true;
        match answer {
            Ok(result) => result,
            Err(_) => Err(self.closed_reason()),
        }
    }

    /// Sends a request and waits for its answer until `deadline`. Past it the
    /// child gets `notifications/cancelled` and the caller `TimedOut` at once,
    /// but `hold` stays held until the child answers anyway or is gone, so a
    /// slot is free only when the child is really done with the request.
    pub async fn request_until(
        &self,
        method: &str,
        params: Value,
        deadline: tokio::time::Instant,
        hold: Box<dyn Send>,
    ) -> Result<Value, RpcFailure> {
        let link = &*self.link;
        let (id, mut rx, mut guard) = self.send_request(method, &params)?;
        let answer = match tokio::time::timeout_at(deadline, &mut rx).await {
            Ok(answer) => answer,
            Err(_) => {
                guard.done = true;
                let abandoned = match link.lock_pending().get_mut(&id) {
                    Some(waiter) => {
                        *waiter = Waiter::Abandoned(hold);
                        true
                    }
                    None => false,
                };
                if abandoned {
                    let params = serde_json::json!({"requestId": id, "reason": "timed out"});
                    link.send(mcp::notification_line("notifications/cancelled", &params));
                    return Err(RpcFailure::TimedOut);
                }
                // Answered (or closed) just as the deadline passed: take that.
                rx.await
            }
        };
        guard.done = true;
        match answer {
            Ok(result) => result,
            Err(_) => Err(self.closed_reason()),
        }
    }

    /// Registers a request and sends it: its id, where its answer will come,
    /// and the guard that withdraws it if the caller gives up. If the writer
    /// is gone the child is dying: the request stays pending and the reaper
    /// answers it with the exit status, like every other.
    #[allow(clippy::type_complexity)]
    fn send_request(
        &self,
        method: &str,
        params: &Value,
    ) -> Result<
        (
            u64,
            oneshot::Receiver<Result<Value, RpcFailure>>,
            InFlight<'_>,
        ),
        RpcFailure,
    > {
        let link = &*self.link;
        let id = link.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        {
            let closed = link.closed.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(why) = closed.as_ref() {
                return Err(why.clone());
            }
            let line = mcp::request_line(id, method, params);
            if line.len() > link.stdin_budget {
                return Err(RpcFailure::Broken(format!(
                    "the request is {} bytes, more than max_message_bytes ({}); the child was \
                     not sent it",
                    line.len(),
                    link.stdin_budget
                )));
            }
            link.lock_pending().insert(id, Waiter::Caller(tx));
            drop(closed);
            link.send(line);
        }
        Ok((
            id,
            rx,
            InFlight {
                link,
                id,
                done: false,
            },
        ))
    }

    /// Sends a notification; a child that is gone is not an error here.
    pub fn notify(&self, method: &str, params: Value) {
        self.link.send(mcp::notification_line(method, &params));
    }

    /// Why the child was cut off, if it broke the protocol (a bad stdout
    /// line, an unread stdin): for the words that report its exit.
    pub fn broken_because(&self) -> Option<String> {
        self.link.cut.get().cloned()
    }

    /// The toolbox this child belongs to and its pid, for log lines.
    pub fn owner(&self) -> (&str, u32) {
        (&self.link.toolbox, self.link.pid)
    }

    /// Whether the child is gone (exited, broken or stopping): a request now
    /// would fail at once without reaching it.
    pub fn is_closed(&self) -> bool {
        self.link
            .closed
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_some()
    }

    /// Requests waiting for an answer right now.
    pub fn in_flight(&self) -> usize {
        self.link.lock_pending().len()
    }

    fn closed_reason(&self) -> RpcFailure {
        self.link
            .closed
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
            .unwrap_or(RpcFailure::Broken("the child's pipes closed".to_owned()))
    }
}

/// Spawning a child failed.
#[derive(Debug, thiserror::Error)]
#[error("cannot start {program}: {source}; check the manifest's command and that it is executable")]
pub struct SpawnError {
    program: String,
    source: std::io::Error,
}

/// The manifest's command, with piped stdio, in a process group of its own,
/// with a parent-death signal, entering the cgroup whose `cgroup.procs` is
/// `enter` (if any) before it runs.
fn command(manifest: &Manifest, enter: Option<std::ffi::CString>) -> Command {
    let parent = std::process::id();
    let mut cmd = Command::new(&manifest.program);
    cmd.args(&manifest.args)
        .current_dir(&manifest.cwd)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    if manifest.env_clear {
        cmd.env_clear();
    }
    cmd.envs(&manifest.env);
    // SAFETY: the closure runs between fork and exec and calls only
    // async-signal-safe functions (prctl, getppid, _exit, open, write, close).
    unsafe {
        cmd.pre_exec(move || {
            // Die with the daemon. The signal fires when the *thread* that
            // forked exits; children are spawned from the runtime's one
            // thread, which lives as long as the daemon.
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            if libc::getppid() as u32 != parent {
                libc::_exit(1);
            }
            if let Some(enter) = &enter {
                crate::cgroup::enter(enter)?;
            }
            Ok(())
        });
    }
    cmd
}

/// A running child process. Dropping it kills the process group.
pub struct Child {
    /// Process id (and process group id).
    pid: u32,
    /// Sends requests to the child.
    rpc: RpcHandle,
    /// Becomes `Some` when the process has exited and been reaped.
    exit: watch::Receiver<Option<ExitInfo>>,
    /// The last stderr lines, for the log line that reports a failure.
    stderr_tail: StderrTail,
    /// Its cgroup, where cgroups are used: killed and removed with the child.
    cgroup: Option<crate::cgroup::Cgroup>,
}

impl Child {
    /// Spawns the manifest's command with piped stdio, in its own process group.
    /// Returns the child and the receiver of its events (closed when it exits).
    pub fn spawn(
        manifest: &Manifest,
    ) -> Result<(Child, mpsc::UnboundedReceiver<ChildEvent>), SpawnError> {
        // The keeper must exist before the child does (it is started once).
        let keeper = crate::keeper::Keeper::get();
        let mut cgroup = crate::cgroup::Cgroups::get().and_then(|cgroups| {
            cgroups
                .new_child(&manifest.id)
                .map_err(|e| {
                    tracing::warn!(toolbox = %manifest.id, "cannot create a cgroup for the child: {e}")
                })
                .ok()
        });
        let enter = cgroup.as_ref().map(crate::cgroup::Cgroup::entry);
        let spawn_error = |source| SpawnError {
            program: manifest.program.display().to_string(),
            source,
        };
        let mut process = match command(manifest, enter).spawn() {
            Ok(process) => process,
            // The move into the cgroup may be what failed (a parent cgroup
            // that refuses it): try once without, and say so if that works.
            Err(first) if cgroup.is_some() => {
                let process = command(manifest, None).spawn().map_err(spawn_error)?;
                tracing::warn!(
                    toolbox = %manifest.id,
                    "started the child without its cgroup ({first}): what it starts may \
                     outlive its stop if it leaves its process group"
                );
                cgroup = None;
                process
            }
            Err(e) => return Err(spawn_error(e)),
        };
        if let (Some(keeper), Some(pid)) = (keeper, process.id()) {
            keeper.watch(pid);
        }
        // invariant: all three pipes were requested above and not yet taken.
        let (Some(stdin), Some(stdout), Some(stderr), Some(pid)) = (
            process.stdin.take(),
            process.stdout.take(),
            process.stderr.take(),
            process.id(),
        ) else {
            return Err(SpawnError {
                program: manifest.program.display().to_string(),
                source: std::io::Error::other("the child's pipes or pid are missing"),
            });
        };

        let (stdin_tx, stdin_rx) = mpsc::unbounded_channel();
        let queued = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let link = Arc::new(Link {
            toolbox: manifest.id.clone(),
            pid,
            next_id: AtomicU64::new(1),
            pending: Mutex::new(HashMap::new()),
            closed: Mutex::new(None),
            stdin: stdin_tx,
            queued: queued.clone(),
            stdin_budget: manifest.limits.max_message_bytes,
            cut: std::sync::OnceLock::new(),
        });
        let (events_tx, events_rx) = mpsc::unbounded_channel();
        let (exit_tx, exit_rx) = watch::channel(None);

        tokio::spawn(write_stdin(stdin, stdin_rx, queued));
        tokio::spawn(read_stdout(
            link.clone(),
            stdout,
            manifest.limits.max_message_bytes,
            events_tx,
            exit_rx.clone(),
        ));
        let stderr_tail = StderrTail::default();
        tokio::spawn(forward_stderr(
            manifest.id.clone(),
            pid,
            stderr,
            stderr_tail.clone(),
        ));
        let reaper_link = link.clone();
        tokio::spawn(async move {
            let exit = match process.wait().await {
                Ok(status) => ExitInfo::from(status),
                Err(e) => {
                    tracing::error!(toolbox = %reaper_link.toolbox, pid, "cannot wait for the child: {e}");
                    ExitInfo::Code(-1)
                }
            };
            reaper_link.close(RpcFailure::Exited(exit));
            let _ = exit_tx.send(Some(exit));
        });

        Ok((
            Child {
                pid,
                rpc: RpcHandle { link },
                exit: exit_rx,
                stderr_tail,
                cgroup,
            },
            events_rx,
        ))
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// A handle for requests to this child.
    pub fn rpc(&self) -> &RpcHandle {
        &self.rpc
    }

    /// The last lines the child wrote to stderr, oldest first.
    pub fn stderr_tail(&self) -> Vec<String> {
        self.stderr_tail
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .cloned()
            .collect()
    }

    /// Waits until the process has exited and been reaped.
    pub async fn exited(&self) -> ExitInfo {
        let mut exit = self.exit.clone();
        loop {
            if let Some(info) = *exit.borrow_and_update() {
                return info;
            }
            if exit.changed().await.is_err() {
                // The reaper never drops its sender before sending.
                return ExitInfo::Code(-1);
            }
        }
    }

    /// Sends `signal` to the child's whole process group.
    pub fn signal_group(&self, signal: nix::sys::signal::Signal) {
        let pgid = nix::unistd::Pid::from_raw(self.pid as i32);
        let _ = nix::sys::signal::killpg(pgid, signal);
    }

    /// Stops the child: close stdin, wait `grace`, SIGTERM the group, wait
    /// `grace`, SIGKILL the group. Returns how it exited.
    pub async fn stop(&self, grace: Duration) -> ExitInfo {
        use nix::sys::signal::Signal;
        // Closing stdin is what MCP's stdio transport defines as "shut down".
        self.rpc
            .link
            .close(RpcFailure::Broken("the toolbox is stopping".to_owned()));
        let _ = self.rpc.link.stdin.send(Vec::new());
        if let Ok(exit) = tokio::time::timeout(grace, self.exited()).await {
            self.signal_group(Signal::SIGKILL); // leftovers in its group
            return exit;
        }
        self.signal_group(Signal::SIGTERM);
        if let Ok(exit) = tokio::time::timeout(grace, self.exited()).await {
            self.signal_group(Signal::SIGKILL);
            return exit;
        }
        self.signal_group(Signal::SIGKILL);
        self.exited().await
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        // The group id stays reserved while any member lives, so this can only
        // reach this child's own leftovers (or nothing).
        self.signal_group(nix::sys::signal::Signal::SIGKILL);
        if let Some(cgroup) = self.cgroup.take() {
            cgroup.kill_and_remove();
        }
        if let Some(keeper) = crate::keeper::Keeper::get() {
            keeper.forget(self.pid);
        }
    }
}

/// Owns stdin: writes each line, flushing when no more are queued. An empty
/// line is the request to close stdin.
async fn write_stdin(
    stdin: ChildStdin,
    mut lines: mpsc::UnboundedReceiver<Vec<u8>>,
    queued: Arc<std::sync::atomic::AtomicUsize>,
) {
    let mut stdin = tokio::io::BufWriter::new(stdin);
    while let Some(line) = lines.recv().await {
        if line.is_empty() {
            break;
        }
        let written = stdin.write_all(&line).await;
        queued.fetch_sub(line.len(), Ordering::Relaxed);
        if written.is_err() {
            return;
        }
        if lines.is_empty() && stdin.flush().await.is_err() {
            return;
        }
    }
    let _ = stdin.flush().await;
    let _ = stdin.shutdown().await;
}

/// Reads one `\n`-terminated line of at most `max` bytes into `buf` (without the
/// newline). `Ok(false)` at end of stream.
async fn read_line_bounded<R: AsyncRead + Unpin>(
    reader: &mut BufReader<R>,
    buf: &mut Vec<u8>,
    max: usize,
) -> Result<bool, String> {
    buf.clear();
    loop {
        let available = reader
            .fill_buf()
            .await
            .map_err(|e| format!("read failed: {e}"))?;
        if available.is_empty() {
            return Ok(!buf.is_empty());
        }
        let (chunk, found) = match available.iter().position(|&b| b == b'\n') {
            Some(i) => (&available[..i], Some(i + 1)),
            None => (available, None),
        };
        if buf.len() + chunk.len() > max {
            return Err(format!(
                "a stdout line is longer than max_message_bytes ({max})"
            ));
        }
        buf.extend_from_slice(chunk);
        let used = found.unwrap_or(chunk.len());
        reader.consume(used);
        if found.is_some() {
            return Ok(true);
        }
    }
}

/// Owns stdout: routes responses to callers, answers the child's requests,
/// forwards notifications. A protocol break closes the link and kills the child.
async fn read_stdout(
    link: Arc<Link>,
    stdout: tokio::process::ChildStdout,
    max: usize,
    events: mpsc::UnboundedSender<ChildEvent>,
    mut exit: watch::Receiver<Option<ExitInfo>>,
) {
    let toolbox = link.toolbox.as_str();
    let pid = link.pid;
    let mut reader = BufReader::with_capacity(64 * 1024, stdout);
    let mut line = Vec::new();
    let mut junk_logged = false;
    let mut unknown_logged = false;
    let mut messages = LogBudget::new(MESSAGES_PER_SECOND);
    let why = loop {
        match read_line_bounded(&mut reader, &mut line, max).await {
            Ok(true) => {}
            Ok(false) => {
                // Usually the process is exiting: let the reaper report the
                // exit status to the callers rather than a closed pipe.
                let exited = exit.wait_for(|e| e.is_some());
                if tokio::time::timeout(EXIT_AFTER_EOF, exited).await.is_ok() {
                    return;
                }
                break "the child closed its stdout but kept running".to_owned();
            }
            Err(e) => break e,
        }
        let trimmed = line.trim_ascii();
        if trimmed.is_empty() {
            continue;
        }
        match mcp::parse_line(trimmed) {
            Ok(Incoming::Response { id, result }) => {
                let waiter = id.and_then(|id| link.lock_pending().remove(&id));
                match waiter {
                    Some(Waiter::Caller(tx)) => {
                        let _ = tx.send(result.map_err(RpcFailure::Rpc));
                    }
                    // The late answer to a call past its deadline: what it
                    // held (its slot) is released now.
                    Some(Waiter::Abandoned(_)) => {
                        tracing::debug!(
                            toolbox,
                            pid,
                            ?id,
                            "late answer to a call past its deadline"
                        );
                    }
                    // A late answer to a call that timed out lands here too.
                    None if !unknown_logged => {
                        unknown_logged = true;
                        tracing::warn!(toolbox, pid, ?id, "ignoring a response to an unknown or withdrawn request id (further ones are logged at debug)");
                    }
                    None => tracing::debug!(
                        toolbox,
                        pid,
                        ?id,
                        "ignoring a response to an unknown or withdrawn request id"
                    ),
                }
            }
            Ok(Incoming::Request { id, method, .. }) => {
                // toolboxd declares no client capabilities; answer at once so
                // the child never waits on us.
                let answer = if method == "ping" {
                    Ok(serde_json::json!({}))
                } else {
                    tracing::debug!(toolbox, pid, %method, "child request refused: method not found");
                    Err((mcp::METHOD_NOT_FOUND, "toolboxd does not offer this method"))
                };
                link.send(mcp::response_line(&id, answer));
            }
            Ok(Incoming::Notification { method, params }) => match method.as_str() {
                "notifications/tools/list_changed" => {
                    let _ = events.send(ChildEvent::ToolsChanged);
                }
                "notifications/message" => {
                    if let Some(dropped) = messages.take() {
                        if dropped > 0 {
                            tracing::warn!(toolbox, pid, dropped, "child log messages not logged (more than {MESSAGES_PER_SECOND} a second)");
                        }
                        log_child_message(toolbox, pid, &params);
                    }
                }
                _ => tracing::trace!(toolbox, pid, %method, "notification ignored"),
            },
            Err(FrameError::Unusable(why)) => break format!("the child sent {why}"),
            Err(e) => {
                if !junk_logged {
                    junk_logged = true;
                    tracing::warn!(
                        toolbox,
                        pid,
                        "ignoring a stdout line that is {e} (further ones are logged at debug): {}",
                        String::from_utf8_lossy(&trimmed[..trimmed.len().min(200)])
                    );
                } else {
                    tracing::debug!(toolbox, pid, "ignoring a stdout line that is {e}");
                }
            }
        }
    };
    // A child that closed stdout or broke framing cannot answer anything more.
    cut_off(&link, why);
}

/// Ends a child that broke the protocol: every call on it fails with `why`,
/// and its group is killed (its actor then restarts it). Said once.
fn cut_off(link: &Link, why: String) {
    let exited = matches!(
        *link.closed.lock().unwrap_or_else(|e| e.into_inner()),
        Some(RpcFailure::Exited(_))
    );
    // Once reaped, its pid may be another process's: never signal it then.
    if exited || link.cut.set(why.clone()).is_err() {
        return;
    }
    tracing::warn!(
        toolbox = %link.toolbox,
        pid = link.pid,
        "{why}; stopping the child"
    );
    link.close(RpcFailure::Broken(why));
    let _ = nix::sys::signal::killpg(
        nix::unistd::Pid::from_raw(link.pid as i32),
        nix::sys::signal::Signal::SIGKILL,
    );
}

/// `notifications/message` logged per second per child; the rest are counted.
const MESSAGES_PER_SECOND: u32 = 100;

/// A per-second budget of log lines from one source outside the daemon.
struct LogBudget {
    /// Lines allowed per second.
    per_second: u32,
    /// When the current second began.
    since: std::time::Instant,
    /// Lines logged in it.
    used: u32,
    /// Lines not logged since the last report.
    dropped: u64,
}

impl LogBudget {
    fn new(per_second: u32) -> LogBudget {
        LogBudget {
            per_second,
            since: std::time::Instant::now(),
            used: 0,
            dropped: 0,
        }
    }

    /// `Some(dropped before this one)` when this line may be logged (then say
    /// how many were dropped, if any), `None` when it is over the budget.
    fn take(&mut self) -> Option<u64> {
        if self.since.elapsed() >= Duration::from_secs(1) {
            self.since = std::time::Instant::now();
            self.used = 0;
        }
        if self.used >= self.per_second {
            self.dropped += 1;
            return None;
        }
        self.used += 1;
        Some(std::mem::take(&mut self.dropped))
    }
}

/// Text from outside made safe for one log line: control characters (a
/// newline could forge a log line; escapes could move a terminal's cursor)
/// escaped, and cut at [`STDERR_LINE_MAX`] characters.
pub fn sanitize(text: &str) -> String {
    let mut out = String::with_capacity(text.len().min(STDERR_LINE_MAX));
    for c in text.chars().take(STDERR_LINE_MAX) {
        if c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

fn log_child_message(toolbox: &str, pid: u32, params: &Value) {
    let level = params
        .get("level")
        .and_then(Value::as_str)
        .unwrap_or("info");
    let data = params.get("data").cloned().unwrap_or(Value::Null);
    let text = sanitize(&match &data {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    });
    match level {
        "debug" => tracing::debug!(toolbox, pid, "{text}"),
        "info" | "notice" => tracing::info!(toolbox, pid, "{text}"),
        "warning" => tracing::warn!(toolbox, pid, "{text}"),
        _ => tracing::error!(toolbox, pid, "{text}"),
    }
}

/// How long a child whose stdout closed may take to exit before it counts as
/// broken.
const EXIT_AFTER_EOF: Duration = Duration::from_secs(2);

/// Longest stderr line logged; the rest of a longer line is cut.
const STDERR_LINE_MAX: usize = 4096;
/// Stderr lines kept for the report of a failed toolbox.
const STDERR_TAIL_LINES: usize = 20;
/// Stderr lines logged per second per child; the rest are counted, not logged.
const STDERR_LINES_PER_SECOND: u32 = 200;

/// The last lines a child wrote to stderr.
type StderrTail = Arc<Mutex<std::collections::VecDeque<String>>>;

/// Forwards stderr lines to the log, tagged with the toolbox and pid, at most
/// [`STDERR_LINES_PER_SECOND`] a second; keeps the last few for failure reports.
/// It always reads on, so a flooding child never blocks on a full pipe.
async fn forward_stderr(
    toolbox: String,
    pid: u32,
    stderr: tokio::process::ChildStderr,
    tail: StderrTail,
) {
    let budget = Arc::new(FloodBudget::default());
    tokio::spawn(report_floods(toolbox.clone(), pid, Arc::downgrade(&budget)));
    let mut reader = BufReader::new(stderr);
    let mut line = Vec::new();
    loop {
        line.clear();
        // Read at most STDERR_LINE_MAX bytes of a line; skip the rest of it.
        match (&mut reader)
            .take(STDERR_LINE_MAX as u64)
            .read_until(b'\n', &mut line)
            .await
        {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
        if line.last() != Some(&b'\n') {
            skip_rest_of_line(&mut reader).await;
        }
        let text = String::from_utf8_lossy(&line);
        let text = sanitize(text.trim_end());
        let text = text.as_str();
        if text.is_empty() {
            continue;
        }
        {
            let mut tail = tail.lock().unwrap_or_else(|e| e.into_inner());
            if tail.len() == STDERR_TAIL_LINES {
                tail.pop_front();
            }
            tail.push_back(text.to_owned());
        }
        if budget.logged.fetch_add(1, Ordering::Relaxed) < STDERR_LINES_PER_SECOND {
            tracing::info!(target: "toolboxd::stderr", toolbox = %toolbox, pid, "{text}");
        } else {
            budget.suppressed.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Stderr lines logged in the current second, and those dropped.
#[derive(Default)]
struct FloodBudget {
    logged: std::sync::atomic::AtomicU32,
    suppressed: AtomicU64,
}

/// Once a second: renews the stderr budget and says how many lines it dropped.
/// Ends with the forwarder (when the budget is gone).
async fn report_floods(toolbox: String, pid: u32, budget: std::sync::Weak<FloodBudget>) {
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.tick().await;
    loop {
        tick.tick().await;
        let Some(budget) = budget.upgrade() else {
            return;
        };
        budget.logged.store(0, Ordering::Relaxed);
        let suppressed = budget.suppressed.swap(0, Ordering::Relaxed);
        if suppressed > 0 {
            tracing::warn!(toolbox = %toolbox, pid, suppressed, "stderr flood: lines not logged (more than {STDERR_LINES_PER_SECOND} a second)");
        }
    }
}

/// Skips the rest of an over-long line in bounded pieces.
async fn skip_rest_of_line<R: AsyncRead + Unpin>(reader: &mut BufReader<R>) {
    let mut rest = Vec::new();
    loop {
        rest.clear();
        match (&mut *reader)
            .take(STDERR_LINE_MAX as u64)
            .read_until(b'\n', &mut rest)
            .await
        {
            Ok(0) | Err(_) => return,
            Ok(_) if rest.last() == Some(&b'\n') => return,
            Ok(_) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outside_text_cannot_forge_a_log_line() {
        assert_eq!(sanitize("a\nb\r\u{1b}[2J"), "a\\nb\\r\\u{1b}[2J");
        assert_eq!(sanitize("plain é"), "plain é");
        assert_eq!(sanitize(&"x".repeat(10_000)).len(), STDERR_LINE_MAX);
    }

    #[test]
    fn the_log_budget_counts_what_it_drops() {
        let mut budget = LogBudget::new(2);
        assert_eq!(budget.take(), Some(0));
        assert_eq!(budget.take(), Some(0));
        assert_eq!(budget.take(), None);
        assert_eq!(budget.take(), None);
        budget.since -= Duration::from_secs(1);
        assert_eq!(budget.take(), Some(2));
    }
}
