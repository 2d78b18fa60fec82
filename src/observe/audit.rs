//! `--audit-log PATH`: one JSON line per finished call (docs/operations.md,
//! "Audit log"): when, which toolbox and tool, the caller's session and topic,
//! how long, how it ended, the error text; the arguments and the result only
//! for a toolbox whose manifest says `audit_arguments = true`.
//!
//! A call never waits for the file: its line goes into a queue bounded in
//! lines and bytes, and a thread of its own writes the queue out. When the
//! queue is full the line is dropped and counted (the
//! `toolboxd_audit_dropped_lines_total` metric, and a log line). SIGHUP makes
//! the writer reopen the path, for logrotate.
//!
//! Bounded whatever the callers send: a refusal (`invalid`, `busy`) is
//! written once a second per outcome, the others of that second counted in
//! one `repeated` line; texts are cut (a session id at 256 bytes); and past
//! [`MAX_FILE_BYTES`] the file rotates itself (`PATH` becomes `PATH.1`,
//! replacing the one before), so the log never takes more than twice that.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::Serialize;
use serde_json::Value;

use crate::observe::ending::Finished;
use crate::util::throttle::{cut, LogBudget};

/// Lines that may wait for the writer.
const MAX_QUEUED_LINES: usize = 10_000;
/// Bytes that may wait for the writer.
const MAX_QUEUED_BYTES: usize = 16 * 1024 * 1024;
/// Longest line: a longer one (large arguments or result) is written without
/// its arguments and result, marked `"truncated": true`.
const MAX_LINE_BYTES: usize = 256 * 1024;
/// Longest error text and topic written (cut at a character).
const MAX_TEXT_BYTES: usize = 4096;
/// Longest session id written (OVOS's are UUIDs).
const MAX_SESSION_BYTES: usize = 256;
/// Size past which the file rotates itself.
pub const MAX_FILE_BYTES: u64 = 64 * 1024 * 1024;
/// How often a refusal of one outcome is written in full.
const REFUSAL_EVERY: Duration = Duration::from_secs(1);
/// How long shutdown waits for the writer to write what is queued.
const CLOSE_WAIT: Duration = Duration::from_secs(5);

/// Why the audit log cannot be used.
#[derive(Debug, thiserror::Error)]
#[error("cannot open the audit log {path}: {why}; check that its directory exists and is writable, or give another --audit-log PATH")]
pub struct AuditError {
    /// The path given.
    pub path: PathBuf,
    /// What went wrong.
    pub why: String,
}

/// What goes to the writer thread.
enum Message {
    /// One line, without its newline.
    Line(String),
    /// Look at the reopen flag now.
    Wake,
    /// Write what is queued, then end.
    Close,
}

/// Opens where the lines go (the file at the path, each time it is
/// reopened), with how many bytes it holds already.
type Opener = Box<dyn FnMut() -> Result<(Box<dyn Write + Send>, u64), String> + Send>;

/// Moves the full file aside (`PATH` to `PATH.1`), before the next open.
type Rotator = Box<dyn FnMut() -> Result<(), String> + Send>;

/// The audit log: cheap to share, never blocks a call.
pub struct Audit {
    /// The queue to the writer thread (bounded in lines).
    tx: SyncSender<Message>,
    /// Bytes queued and not yet written (the queue's bound in bytes).
    queued: Arc<AtomicUsize>,
    /// Set on SIGHUP: the writer reopens the path before its next line.
    reopen: Arc<AtomicBool>,
    /// Lines dropped so far.
    dropped: AtomicU64,
    /// Drops are logged at most once a second.
    drop_log: Mutex<LogBudget>,
    /// The refusals of this second, per refused outcome.
    refusals: Mutex<[Refusals; 2]>,
    /// The writer thread, until it is closed.
    writer: Mutex<Option<std::thread::JoinHandle<()>>>,
}

/// One audit line as written.
#[derive(Serialize)]
struct Line<'a> {
    time: String,
    toolbox: &'a str,
    tool: &'a str,
    session: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    source: Option<&'a str>,
    topic: &'a str,
    duration_ms: f64,
    outcome: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    arguments: Option<&'a Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    result: Option<&'a Value>,
    #[serde(skip_serializing_if = "is_false")]
    truncated: bool,
}

fn is_false(b: &bool) -> bool {
    !b
}

/// Refusals of one outcome in the current second.
#[derive(Debug, Default)]
struct Refusals {
    /// When its line was written in full.
    since: Option<std::time::Instant>,
    /// How many were not written since.
    repeated: u64,
}

/// The line that says how many refusals of `outcome` were not written.
#[derive(Serialize)]
struct Repeated<'a> {
    time: String,
    outcome: &'a str,
    repeated: u64,
    note: &'a str,
}

impl Audit {
    /// Opens (creating, mode 0600) the regular file at `path` for appending
    /// and starts its writer.
    pub fn open(path: &Path) -> Result<Audit, AuditError> {
        let error = |why: String| AuditError {
            path: path.to_owned(),
            why,
        };
        let first = open_file(path).map_err(error)?;
        let mut first = Some(first);
        let opened = path.to_owned();
        let opener: Opener = Box::new(move || match first.take() {
            Some(file) => Ok(file),
            None => open_file(&opened).map_err(|why| format!("{}: {why}", opened.display())),
        });
        let (from, to) = (path.to_owned(), rotated(path));
        let rotator: Rotator = Box::new(move || {
            std::fs::rename(&from, &to)
                .map_err(|e| format!("cannot move it to {}: {e}", to.display()))
        });
        Ok(Audit::start(opener, Some(rotator), MAX_QUEUED_LINES))
    }

    /// Starts the writer thread on what `open` gives (rotated by `rotate`
    /// past [`MAX_FILE_BYTES`]), with a queue of `lines`.
    fn start(mut open: Opener, rotate: Option<Rotator>, lines: usize) -> Audit {
        let (tx, rx) = sync_channel(lines);
        let queued = Arc::new(AtomicUsize::new(0));
        let reopen = Arc::new(AtomicBool::new(false));
        let out = open();
        let writer = {
            let (queued, reopen) = (queued.clone(), reopen.clone());
            std::thread::Builder::new()
                .name("audit-log".to_owned())
                .spawn(move || write_lines(out, open, rotate, rx, &queued, &reopen))
        };
        let writer = match writer {
            Ok(handle) => Some(handle),
            Err(e) => {
                tracing::error!(
                    "audit log: cannot start its writer thread: {e}; no line will be written"
                );
                None
            }
        };
        Audit {
            tx,
            queued,
            reopen,
            dropped: AtomicU64::new(0),
            drop_log: Mutex::new(LogBudget::new(1)),
            refusals: Mutex::new(Default::default()),
            writer: Mutex::new(writer),
        }
    }

    /// Queues the line of a finished call; `false` when it was dropped
    /// because the writer is behind. Never waits.
    pub fn record(&self, call: &Finished<'_>) -> bool {
        let refused = match call.outcome {
            crate::observe::ending::Ending::Invalid => Some(0),
            crate::observe::ending::Ending::Busy => Some(1),
            _ => None,
        };
        if let Some(kind) = refused {
            let mut all = self.refusals.lock().unwrap_or_else(|e| e.into_inner());
            let Some(window) = all.get_mut(kind) else {
                return false;
            };
            let now = std::time::Instant::now();
            if window
                .since
                .is_some_and(|at| now.duration_since(at) < REFUSAL_EVERY)
            {
                window.repeated += 1;
                return true;
            }
            window.since = Some(now);
            let repeated = std::mem::take(&mut window.repeated);
            drop(all);
            self.queue_repeated(call.outcome.name(), repeated);
        }
        self.queue(encode(call))
    }

    /// Queues the count of `repeated` refusals of `outcome` not written.
    fn queue_repeated(&self, outcome: &str, repeated: u64) {
        if repeated == 0 {
            return;
        }
        let line = Repeated {
            time: crate::util::clock::rfc3339(std::time::SystemTime::now()),
            outcome,
            repeated,
            note: "refusals of this outcome not written since the last one that was (one a \
                   second is)",
        };
        self.queue(serde_json::to_string(&line).unwrap_or_default());
    }

    /// Queues one line; `false` when it was dropped (the writer is behind).
    fn queue(&self, line: String) -> bool {
        let bytes = line.len() + 1;
        if self.queued.fetch_add(bytes, Ordering::Relaxed) + bytes > MAX_QUEUED_BYTES {
            self.queued.fetch_sub(bytes, Ordering::Relaxed);
            return self.dropped();
        }
        match self.tx.try_send(Message::Line(line)) {
            Ok(()) => true,
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => {
                self.queued.fetch_sub(bytes, Ordering::Relaxed);
                self.dropped()
            }
        }
    }

    /// Counts and (within a budget) logs a dropped line; `false`.
    fn dropped(&self) -> bool {
        let total = self.dropped.fetch_add(1, Ordering::Relaxed) + 1;
        let mut budget = self.drop_log.lock().unwrap_or_else(|e| e.into_inner());
        if budget.take().is_some() {
            tracing::warn!(
                dropped_total = total,
                "audit log: a line was dropped, the writer is behind (is the disk slow or full?)"
            );
        }
        false
    }

    /// Lines dropped so far (the metric reads the counter itself).
    #[cfg(test)]
    pub fn dropped_lines(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    /// Reopens the path before the next line (after logrotate moved the file).
    pub fn reopen(&self) {
        self.reopen.store(true, Ordering::Relaxed);
        let _ = self.tx.try_send(Message::Wake);
    }

    /// Writes what is queued and stops the writer (waits at most a few
    /// seconds, off the runtime's thread).
    pub async fn close(self: Arc<Self>) {
        // The counts no later refusal carried out: written before the end.
        let pending: Vec<u64> = {
            let mut all = self.refusals.lock().unwrap_or_else(|e| e.into_inner());
            all.iter_mut()
                .map(|w| std::mem::take(&mut w.repeated))
                .collect()
        };
        for (outcome, repeated) in [
            crate::observe::ending::Ending::Invalid,
            crate::observe::ending::Ending::Busy,
        ]
        .iter()
        .zip(pending)
        {
            self.queue_repeated(outcome.name(), repeated);
        }
        let closing = tokio::task::spawn_blocking(move || {
            if self.tx.send(Message::Close).is_err() {
                return;
            }
            let writer = self.writer.lock().unwrap_or_else(|e| e.into_inner()).take();
            if let Some(writer) = writer {
                let _ = writer.join();
            }
        });
        if tokio::time::timeout(CLOSE_WAIT, closing).await.is_err() {
            tracing::warn!(
                "audit log: the writer did not finish within {CLOSE_WAIT:?}; lines may be lost"
            );
        }
    }
}

/// The writer thread: writes lines as they come, flushes whenever the queue
/// is empty, reopens when asked, ends on `Close` (or when every sender is gone).
fn write_lines(
    first: Result<(Box<dyn Write + Send>, u64), String>,
    mut open: Opener,
    mut rotate: Option<Rotator>,
    rx: Receiver<Message>,
    queued: &AtomicUsize,
    reopen: &AtomicBool,
) {
    // Bytes in the open file, for its rotation.
    let mut size = 0;
    let mut out = match first {
        Ok((out, held)) => {
            size = held;
            Some(std::io::BufWriter::new(out))
        }
        Err(why) => {
            tracing::error!("audit log: {why}");
            None
        }
    };
    let mut failing = LogBudget::new(1);
    let mut next = rx.recv().ok();
    while let Some(message) = next {
        if reopen.swap(false, Ordering::Relaxed) {
            if let Some(old) = out.as_mut() {
                let _ = old.flush();
            }
            match open() {
                Ok((new, held)) => {
                    out = Some(std::io::BufWriter::new(new));
                    size = held;
                    tracing::info!("audit log reopened");
                }
                Err(why) => tracing::error!(
                    "audit log: cannot reopen {why}; writing on to the file already open"
                ),
            }
        }
        match message {
            Message::Line(line) => {
                queued.fetch_sub(line.len() + 1, Ordering::Relaxed);
                let written = match out.as_mut() {
                    Some(out) => out
                        .write_all(line.as_bytes())
                        .and_then(|()| out.write_all(b"\n")),
                    None => Err(std::io::Error::other("no file is open")),
                };
                match written {
                    Ok(()) => size += line.len() as u64 + 1,
                    Err(e) => {
                        if let Some(dropped) = failing.take() {
                            tracing::error!(dropped, "audit log: cannot write a line: {e}");
                        }
                    }
                }
                if size > MAX_FILE_BYTES {
                    if let Some(rotate) = rotate.as_mut() {
                        if let Some(old) = out.as_mut() {
                            let _ = old.flush();
                        }
                        let rotated = rotate().and_then(|()| open());
                        match rotated {
                            Ok((new, held)) => {
                                out = Some(std::io::BufWriter::new(new));
                                size = held;
                                tracing::info!(
                                    "audit log passed {MAX_FILE_BYTES} bytes: moved to .1, a new one begun"
                                );
                            }
                            Err(why) => {
                                if let Some(dropped) = failing.take() {
                                    tracing::error!(dropped, "audit log: cannot rotate: {why}");
                                }
                            }
                        }
                    }
                }
            }
            Message::Wake => {}
            Message::Close => break,
        }
        next = match rx.try_recv() {
            Ok(message) => Some(message),
            Err(_) => {
                if let Some(out) = out.as_mut() {
                    let _ = out.flush();
                }
                rx.recv().ok()
            }
        };
    }
    if let Some(out) = out.as_mut() {
        let _ = out.flush();
    }
}

/// Opens `path` to append (creating it, mode 0600), refusing anything but a
/// regular file (a FIFO would block the writer, a device would take the
/// lines elsewhere).
fn open_file(path: &Path) -> Result<(Box<dyn Write + Send>, u64), String> {
    use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
    let opened = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .mode(0o600)
        // Never through a link planted at the path (the daemon may be
        // root and the directory another user's).
        .custom_flags(libc::O_NONBLOCK | libc::O_NOFOLLOW)
        .open(path);
    if matches!(&opened, Err(e) if e.raw_os_error() == Some(libc::ELOOP)) {
        return Err(
            "it is a symbolic link; give the audit log's real path (a link there is never \
             followed)"
                .to_owned(),
        );
    }
    // A FIFO without a reader refuses a non-blocking open: say what is there.
    let kind = match &opened {
        Ok(file) => file.metadata().map(|m| m.file_type()),
        Err(_) => std::fs::metadata(path).map(|m| m.file_type()),
    };
    let file = match (opened, kind) {
        (Ok(file), Ok(kind)) if kind.is_file() => file,
        (Err(e), Ok(kind)) if kind.is_file() => return Err(e.to_string()),
        (Err(e), Err(_)) | (Ok(_), Err(e)) => return Err(e.to_string()),
        (_, Ok(kind)) => {
            let what = if kind.is_fifo() {
                "a FIFO"
            } else if kind.is_char_device() || kind.is_block_device() {
                "a device"
            } else if kind.is_dir() {
                "a directory"
            } else {
                "a socket or another special file"
            };
            return Err(format!("it is {what}, not a regular file"));
        }
    };
    let held = file.metadata().map_or(0, |m| m.len());
    Ok((Box::new(file), held))
}

/// The JSON line of `call` (without its newline), within [`MAX_LINE_BYTES`].
fn encode(call: &Finished<'_>) -> String {
    let mut line = Line {
        time: crate::util::clock::rfc3339(std::time::SystemTime::now()),
        toolbox: call.toolbox,
        tool: call.tool,
        session: call.session.map(|s| cut(s, MAX_SESSION_BYTES)),
        source: call.source.map(|s| cut(s, MAX_SESSION_BYTES)),
        topic: cut(call.topic, MAX_TEXT_BYTES),
        duration_ms: (call.took.as_secs_f64() * 1e6).round() / 1e3,
        outcome: call.outcome.name(),
        error: call.error.map(|e| cut(e, MAX_TEXT_BYTES)),
        arguments: call.arguments,
        result: call.arguments.and(call.result),
        truncated: false,
    };
    let text = serde_json::to_string(&line).unwrap_or_default();
    if text.len() <= MAX_LINE_BYTES {
        return text;
    }
    line.arguments = None;
    line.result = None;
    line.truncated = true;
    serde_json::to_string(&line).unwrap_or_default()
}

/// Where a full audit log is moved: `PATH.1`.
fn rotated(path: &Path) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(".1");
    PathBuf::from(name)
}

#[cfg(test)]
mod tests;
