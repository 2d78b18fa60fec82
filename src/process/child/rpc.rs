//! A child's JSON-RPC: requests multiplexed by id over its stdin and stdout,
//! lines bounded in length, what waits for stdin bounded in bytes, and a child
//! that breaks the protocol cut off.
//!
//! Nothing here knows about processes: the two streams are any
//! [`AsyncWrite`] and [`AsyncRead`], and cutting a child off only fails its
//! calls and calls the kill hook its owner gave [`Link::new`] (the process
//! layer, [`super`], signals the process group).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::sync::{mpsc, oneshot, watch};

mod long_line;
mod progress;
mod questions;
mod request;

pub use progress::{ProgressSender, ProgressWatch};
use questions::{ask_the_person, Registered};
pub use questions::{Answering, QuestionWatch, Questioner};
pub use request::{Kept, RpcFailure};

use super::logs::{log_child_message, LogBudget, MESSAGES_PER_SECOND};
use super::{ChildEvent, ExitInfo};
use crate::cancel::Cancel;
use crate::mcp::{self, FrameError, Incoming};
use long_line::{peek_long, LongLine, MAX_LOG_MESSAGE_BYTES};

/// What a request does when its deadline passes (or a stop cancels it)
/// before its answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PastDeadline {
    /// Tell the child to drop it (`notifications/cancelled`).
    Cancel,
    /// Leave it to finish: the answer ends something the caller still
    /// holds (a task's result, or the answer to a `tasks/get`), and the
    /// caller ends the work itself (`tasks/cancel`).
    LetFinish,
}

/// What waits for the answer to one request.
enum Waiter {
    /// A caller.
    Caller(oneshot::Sender<Result<Value, RpcFailure>>),
    /// Nobody any more (its deadline passed), but this stays held — a call
    /// slot, say — until the child answers or is gone: the child is still
    /// working on the request.
    Abandoned {
        /// Given back when the child answers or is gone.
        _kept: Kept,
    },
}

/// Requests waiting for their answer, by request id.
type Pending = HashMap<u64, Waiter>;

/// What ends the child when it is cut off; called at most once.
pub(super) type Kill = Box<dyn Fn() + Send + Sync>;

/// The state shared by a child's tasks and its callers.
pub(super) struct Link {
    /// The toolbox this child serves, for every log line.
    pub(super) toolbox: String,
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
    pub(super) stdin: mpsc::UnboundedSender<Vec<u8>>,
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
    /// Ends the child once it is cut off: its owner knows what the child is
    /// (a process group) and how to end it safely.
    kill: Kill,
    /// Calls that asked for progress, by the `progressToken` they sent.
    progress: Mutex<HashMap<u64, ProgressSender>>,
    /// The answer to its `roots/list` (the directories its sandbox lets it
    /// keep files in, and those its arguments name); `None`, and no roots
    /// declared, when it is not confined.
    roots: Option<Value>,
    /// Whether it may ask the person questions (its manifest's
    /// `elicitation`): declared to it only then.
    elicitation: bool,
    /// The calls in flight that may ask.
    questioners: Mutex<Vec<Registered>>,
}

impl Link {
    /// The link of child `pid` of `toolbox`, whose stdin lines go to
    /// `stdin` within `stdin_budget` bytes, and which `kill` ends if it is cut
    /// off; also the count of queued bytes, for the writer to lower.
    pub(super) fn new(
        toolbox: String,
        pid: u32,
        stdin: mpsc::UnboundedSender<Vec<u8>>,
        stdin_budget: usize,
        kill: Kill,
        roots: Option<Value>,
        elicitation: bool,
    ) -> (Arc<Link>, Arc<std::sync::atomic::AtomicUsize>) {
        let queued = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let link = Arc::new(Link {
            toolbox,
            pid,
            next_id: AtomicU64::new(1),
            pending: Mutex::new(HashMap::new()),
            closed: Mutex::new(None),
            stdin,
            queued: queued.clone(),
            stdin_budget,
            cut: std::sync::OnceLock::new(),
            kill,
            progress: Mutex::new(HashMap::new()),
            roots,
            elicitation,
            questioners: Mutex::new(Vec::new()),
        });
        (link, queued)
    }

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
    pub(super) fn close(&self, why: RpcFailure) {
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
struct PendingGuard<'a> {
    link: &'a Link,
    id: u64,
    done: bool,
}

impl Drop for PendingGuard<'_> {
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
    pub(super) link: Arc<Link>,
}

impl RpcHandle {
    /// Its roots (`roots/list`'s result), where it has them (declared in
    /// the handshake then).
    pub fn roots(&self) -> Option<&Value> {
        self.link.roots.as_ref()
    }

    /// Whether the child may ask the person questions (declared then).
    pub fn offers_elicitation(&self) -> bool {
        self.link.elicitation
    }

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

    /// Sends a request and waits for its answer until `deadline`, or until
    /// `cancel` fires (a stop). Then the child gets `notifications/cancelled`
    /// and the caller `TimedOut` or `Cancelled` at once, but `hold` stays
    /// held until the child answers anyway or is gone, so a slot is free only
    /// when the child is really done with the request.
    pub async fn request_until<P: serde::Serialize + ?Sized>(
        &self,
        method: &str,
        params: &P,
        deadline: tokio::time::Instant,
        cancel: &mut Cancel,
        hold: Kept,
    ) -> Result<Value, RpcFailure> {
        self.request_until_then(method, params, deadline, cancel, hold, PastDeadline::Cancel)
            .await
    }

    /// [`RpcHandle::request_until`], saying what happens to the request when
    /// the caller gives up on it (deadline or stop): either way the caller
    /// gets `TimedOut` or `Cancelled` at once and `hold` stays held until the
    /// child answers or is gone.
    pub async fn request_until_then<P: serde::Serialize + ?Sized>(
        &self,
        method: &str,
        params: &P,
        deadline: tokio::time::Instant,
        cancel: &mut Cancel,
        hold: Kept,
        past_deadline: PastDeadline,
    ) -> Result<Value, RpcFailure> {
        let link = &*self.link;
        let (id, mut rx, mut guard) = self.send_request(method, params)?;
        let (failure, reason) = tokio::select! {
            biased;
            answer = &mut rx => {
                guard.done = true;
                return answer.unwrap_or_else(|_| Err(self.closed_reason()));
            }
            () = tokio::time::sleep_until(deadline) => (RpcFailure::TimedOut, "timed out"),
            () = cancel.fired() => (RpcFailure::Cancelled, "cancelled by stop"),
        };
        guard.done = true;
        let abandoned = match link.lock_pending().get_mut(&id) {
            Some(waiter) => {
                *waiter = Waiter::Abandoned { _kept: hold };
                true
            }
            None => false,
        };
        if abandoned {
            if past_deadline == PastDeadline::Cancel {
                let params = serde_json::json!({"requestId": id, "reason": reason});
                link.send(mcp::notification_line("notifications/cancelled", &params));
            }
            return Err(failure);
        }
        // Answered (or closed) just as the call gave up: take that.
        rx.await.unwrap_or_else(|_| Err(self.closed_reason()))
    }

    /// Registers a request and sends it: its id, where its answer will come,
    /// and the guard that withdraws it if the caller gives up. If the writer
    /// is gone the child is dying: the request stays pending and the reaper
    /// answers it with the exit status, like every other.
    #[allow(clippy::type_complexity)]
    fn send_request<P: serde::Serialize + ?Sized>(
        &self,
        method: &str,
        params: &P,
    ) -> Result<
        (
            u64,
            oneshot::Receiver<Result<Value, RpcFailure>>,
            PendingGuard<'_>,
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
                return Err(RpcFailure::TooLarge {
                    bytes: line.len(),
                    limit: link.stdin_budget,
                });
            }
            link.lock_pending().insert(id, Waiter::Caller(tx));
            drop(closed);
            link.send(line);
        }
        Ok((
            id,
            rx,
            PendingGuard {
                link,
                id,
                done: false,
            },
        ))
    }

    /// Sends a request nobody waits for (a `tasks/cancel` when its call is
    /// over): `hold` stays held until the child answers it or is gone.
    pub fn request_detached(&self, method: &str, params: &Value, hold: Kept) {
        if let Ok((id, _answer, mut guard)) = self.send_request(method, params) {
            guard.done = true;
            if let Some(waiter) = self.link.lock_pending().get_mut(&id) {
                *waiter = Waiter::Abandoned { _kept: hold };
            }
        }
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

/// How long a child whose stdout closed may take to exit before it counts as
/// broken.
const EXIT_AFTER_EOF: Duration = Duration::from_secs(2);

/// Owns stdin: writes each line, flushing when no more are queued. An empty
/// line is the request to close stdin.
pub(super) async fn write_stdin<W: AsyncWrite + Unpin>(
    stdin: W,
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
pub(super) async fn read_stdout<R: AsyncRead + Unpin>(
    link: Arc<Link>,
    stdout: R,
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
        // A long line is built into a tree only when it is an answer some
        // call waits for: a child sending large notifications, requests or
        // stray answers kept the daemon's thread decoding them.
        if trimmed.len() > MAX_LOG_MESSAGE_BYTES {
            match peek_long(trimmed) {
                LongLine::Notification(method) if method == "notifications/message" => {
                    if let Some(dropped) = messages.take() {
                        tracing::warn!(
                            toolbox,
                            pid,
                            bytes = trimmed.len(),
                            dropped,
                            "child log message not logged: over {MAX_LOG_MESSAGE_BYTES} bytes"
                        );
                    }
                    continue;
                }
                LongLine::Notification(method) => {
                    tracing::debug!(toolbox, pid, %method, bytes = trimmed.len(), "long notification ignored");
                    continue;
                }
                LongLine::Request(id) => {
                    tracing::debug!(
                        toolbox,
                        pid,
                        bytes = trimmed.len(),
                        "long child request refused"
                    );
                    let refusal = (mcp::METHOD_NOT_FOUND, "toolboxd does not offer this method");
                    link.send(mcp::response_line(&id, Err(refusal)));
                    continue;
                }
                LongLine::Answer(Some(id)) if !link.lock_pending().contains_key(&id) => {
                    tracing::debug!(
                        toolbox,
                        pid,
                        id,
                        "long answer to a request nobody waits for, ignored"
                    );
                    continue;
                }
                LongLine::Answer(_) | LongLine::Unreadable => {}
            }
        }
        match mcp::parse_line(trimmed) {
            Ok(Incoming::Response { id, result }) => {
                let waiter = id.and_then(|id| link.lock_pending().remove(&id));
                match waiter {
                    Some(Waiter::Caller(tx)) => {
                        let _ = tx.send(result.map_err(RpcFailure::Rpc));
                    }
                    // The late answer to a call past its deadline, or to a
                    // request nobody waits for: what it held (its slot) is
                    // released now.
                    Some(Waiter::Abandoned { .. }) => {
                        tracing::debug!(
                            toolbox,
                            pid,
                            ?id,
                            "answer to a request nobody waits for any more"
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
            Ok(Incoming::Request { id, method, params }) => {
                if method == "elicitation/create" && link.elicitation {
                    ask_the_person(&link, id, params);
                    continue;
                }
                // Answered at once, so the child never waits on us: roots
                // where it has them, nothing else toolboxd offers.
                let answer = if method == "ping" {
                    Ok(serde_json::json!({}))
                } else if let (true, Some(roots)) = (method == "roots/list", &link.roots) {
                    Ok(roots.clone())
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
                "notifications/progress" => link.progress(&params),
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
/// and its kill hook ends it (its actor then restarts it). Said once.
fn cut_off(link: &Link, why: String) {
    let exited = matches!(
        *link.closed.lock().unwrap_or_else(|e| e.into_inner()),
        Some(RpcFailure::Exited(_))
    );
    // A child that exited is gone already: nothing to cut off or to kill.
    if exited || link.cut.set(why.clone()).is_err() {
        return;
    }
    tracing::warn!(
        toolbox = %link.toolbox,
        pid = link.pid,
        "{why}; stopping the child"
    );
    link.close(RpcFailure::Broken(why));
    (link.kill)();
}

#[cfg(test)]
mod over_pipes;
#[cfg(test)]
pub(super) use over_pipes::over_pipes;
#[cfg(test)]
mod tests;
