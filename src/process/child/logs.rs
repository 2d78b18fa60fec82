//! What a child says outside the protocol: its stderr and its
//! `notifications/message`, forwarded to the log within a rate, made safe for
//! one log line; and each toolbox's recent stderr ([`StderrLog`]), kept for
//! `ctl logs` and failure reports.

use std::sync::{Arc, Mutex};

use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, BufReader};

use crate::util::or_never::or_never;
use crate::util::throttle::cut;

/// `notifications/message` logged per second per child; the rest are counted.
pub(super) const MESSAGES_PER_SECOND: u32 = 100;

pub(super) use crate::util::throttle::LogBudget;

/// Text from outside made safe for one log line: control characters (a
/// newline could forge a log line; escapes could move a terminal's cursor)
/// escaped, and cut at [`STDERR_LINE_MAX`] characters.
pub(super) fn sanitize(text: &str) -> String {
    let cut = text
        .char_indices()
        .nth(STDERR_LINE_MAX)
        .map_or(text, |(end, _)| &text[..end]);
    crate::util::throttle::escape_controls(cut).into_owned()
}

pub(super) fn log_child_message(toolbox: &str, pid: u32, params: &Value) {
    let level = params
        .get("level")
        .and_then(Value::as_str)
        .unwrap_or("info");
    // Cut before it is made safe: a child's message is logged as one line
    // of at most STDERR_LINE_MAX, like its stderr.
    let text = match params.get("data") {
        Some(Value::String(s)) => sanitize(crate::util::throttle::cut(s, STDERR_LINE_MAX)),
        Some(other) => sanitize(crate::util::throttle::cut(
            &other.to_string(),
            STDERR_LINE_MAX,
        )),
        None => sanitize("null"),
    };
    match level {
        "debug" => tracing::debug!(toolbox, pid, "{text}"),
        "info" | "notice" => tracing::info!(toolbox, pid, "{text}"),
        "warning" => tracing::warn!(toolbox, pid, "{text}"),
        _ => tracing::error!(toolbox, pid, "{text}"),
    }
}

/// Longest stderr line logged; the rest of a longer line is cut.
const STDERR_LINE_MAX: usize = 4096;
/// Stderr lines logged per second per child; the rest are counted, not logged.
const STDERR_LINES_PER_SECOND: u32 = 200;
/// Stderr lines a toolbox keeps for `ctl logs` (over all its children).
pub const LOG_LINES: usize = 500;
/// Bytes of stderr text a toolbox keeps for `ctl logs`: the older lines go
/// first when a flood of long lines would pass it.
const LOG_BYTES: usize = 128 * 1024;
/// Stderr lines of one child in a failure report.
pub const TAIL_LINES: usize = 20;
/// Bytes of stderr text in a failure report (older lines are dropped first,
/// and one line longer than this is cut).
const TAIL_BYTES: usize = 4 * 1024;

/// One stderr line, as `ctl logs` shows it.
#[derive(Debug, Clone, PartialEq)]
pub struct LogLine {
    /// When the daemon read it.
    pub at: std::time::SystemTime,
    /// The child that wrote it (a toolbox's children share one log).
    pub pid: u32,
    /// The line, made safe for one log line (see `sanitize`).
    pub text: String,
}

/// A toolbox's recent stderr, over all its children (restarts and instances
/// included), bounded in lines and bytes: what `ctl logs` prints and what a
/// failure report quotes.
#[derive(Debug, Default)]
pub struct StderrLog {
    /// The lines, oldest first, and their text's total size.
    ring: Mutex<(std::collections::VecDeque<LogLine>, usize)>,
    /// Paths its sandbox refused, explained: read from these lines.
    pub refusals: crate::process::sandbox::refusal::Refusals,
}

impl StderrLog {
    /// Keeps a line child `pid` wrote, dropping the oldest past the bounds.
    pub fn push(&self, pid: u32, text: String) {
        let mut ring = self.ring.lock().unwrap_or_else(|e| e.into_inner());
        let (lines, bytes) = &mut *ring;
        *bytes += text.len();
        lines.push_back(LogLine {
            at: std::time::SystemTime::now(),
            pid,
            text,
        });
        while lines.len() > LOG_LINES || (*bytes > LOG_BYTES && lines.len() > 1) {
            if let Some(old) = lines.pop_front() {
                *bytes -= old.text.len();
            }
        }
    }

    /// Reads a tool's error text of toolbox `toolbox` (its serving child
    /// `pid`): a path its sandbox refused is explained, here and in the log.
    pub fn read_tool_error(&self, toolbox: &str, pid: u32, text: &str) {
        if let Some(hint) = self.refusals.read(toolbox, text) {
            self.push(pid, format!("toolboxd: a tool's error: {hint}"));
        }
    }

    /// The last `n` lines, oldest first.
    pub fn recent(&self, n: usize) -> Vec<LogLine> {
        let ring = self.ring.lock().unwrap_or_else(|e| e.into_inner());
        let lines = &ring.0;
        lines
            .iter()
            .skip(lines.len().saturating_sub(n))
            .cloned()
            .collect()
    }

    /// The last lines child `pid` wrote, oldest first: at most `TAIL_LINES`
    /// and `TAIL_BYTES`, for a failure report.
    pub fn tail_of(&self, pid: u32) -> Vec<String> {
        let ring = self.ring.lock().unwrap_or_else(|e| e.into_inner());
        let mut tail = Vec::new();
        let mut bytes = 0;
        for line in ring.0.iter().rev().filter(|l| l.pid == pid) {
            if tail.len() == TAIL_LINES {
                break;
            }
            let text = cut(&line.text, TAIL_BYTES);
            if !tail.is_empty() && bytes + text.len() > TAIL_BYTES {
                break;
            }
            bytes += text.len();
            tail.push(text.to_owned());
        }
        tail.reverse();
        tail
    }
}

/// Forwards stderr lines to the log, tagged with the toolbox and pid, at most
/// [`STDERR_LINES_PER_SECOND`] a second; keeps them in the toolbox's `log`.
/// It always reads on, so a flooding child never blocks on a full pipe. Says
/// `closed` when the pipe ends (every writer is gone).
///
/// Lines past the budget are counted, and the count logged at the next line
/// logged or at the end of their second, whichever comes first: a timer runs
/// only while there is a count to report, so a quiet child costs no wake-up.
pub(super) async fn forward_stderr(
    toolbox: String,
    pid: u32,
    stderr: tokio::process::ChildStderr,
    log: Arc<StderrLog>,
    closed: tokio::sync::watch::Sender<bool>,
) {
    let mut budget = LogBudget::new(STDERR_LINES_PER_SECOND);
    let flood = |suppressed: u64| {
        if suppressed > 0 {
            tracing::warn!(toolbox = %toolbox, pid, suppressed, "stderr flood: lines not logged (more than {STDERR_LINES_PER_SECOND} a second)");
        }
    };
    let mut reader = BufReader::new(stderr);
    let mut line = Vec::new();
    loop {
        // Read at most STDERR_LINE_MAX bytes of a line; skip the rest of it.
        // A read cut short by the report keeps what it read in `line`.
        let limit = STDERR_LINE_MAX.saturating_sub(line.len()) as u64;
        let due = budget.report_due();
        let mut part = (&mut reader).take(limit);
        let read = tokio::select! {
            read = part.read_until(b'\n', &mut line) => read,
            () = or_never(due.map(|at| tokio::time::sleep_until(at.into()))) => {
                flood(budget.take_dropped());
                continue;
            }
        };
        match read {
            Ok(0) if line.is_empty() => break,
            Err(_) => break,
            Ok(_) => {}
        }
        if line.last() != Some(&b'\n') {
            skip_rest_of_line(&mut reader).await;
        }
        let text = String::from_utf8_lossy(&line);
        let text = sanitize(text.trim_end());
        line.clear();
        if text.is_empty() {
            continue;
        }
        if let Some(dropped) = budget.take() {
            flood(dropped);
            tracing::info!(target: "toolboxd::stderr", toolbox = %toolbox, pid, "{text}");
        }
        let hint = log.refusals.read(&toolbox, &text);
        log.push(pid, text);
        if let Some(hint) = hint {
            log.push(pid, format!("toolboxd: {hint}"));
        }
    }
    flood(budget.take_dropped());
    let _ = closed.send(true);
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
    fn the_log_is_bounded_in_lines_and_bytes() {
        let log = StderrLog::default();
        for i in 0..LOG_LINES + 10 {
            log.push(1, format!("line {i}"));
        }
        let all = log.recent(usize::MAX);
        assert_eq!(all.len(), LOG_LINES);
        assert_eq!(all[0].text, "line 10");
        assert_eq!(
            log.recent(2)
                .iter()
                .map(|l| l.text.as_str())
                .collect::<Vec<_>>(),
            [
                format!("line {}", LOG_LINES + 8),
                format!("line {}", LOG_LINES + 9)
            ]
        );
        // Long lines: the bytes bound holds, the newest line is always kept.
        for _ in 0..100 {
            log.push(2, "y".repeat(STDERR_LINE_MAX));
        }
        let all = log.recent(usize::MAX);
        assert!(all.iter().map(|l| l.text.len()).sum::<usize>() <= LOG_BYTES);
        assert_eq!(all.len(), LOG_BYTES / STDERR_LINE_MAX);
        let huge = "z".repeat(LOG_BYTES * 2);
        log.push(3, huge.clone());
        assert_eq!(log.recent(usize::MAX).len(), 1);
    }

    #[test]
    fn a_failure_tail_is_one_childs_last_lines_within_its_bounds() {
        let log = StderrLog::default();
        for i in 0..30 {
            log.push(7, format!("seven {i}"));
            log.push(8, format!("eight {i}"));
        }
        let tail = log.tail_of(7);
        assert_eq!(tail.len(), TAIL_LINES);
        assert_eq!(tail.first().map(String::as_str), Some("seven 10"));
        assert_eq!(tail.last().map(String::as_str), Some("seven 29"));
        assert!(log.tail_of(9).is_empty());
        for _ in 0..3 {
            log.push(9, "é".repeat(TAIL_BYTES));
        }
        let tail = log.tail_of(9);
        assert_eq!(tail.len(), 1, "one line, cut to the bound");
        assert!(tail[0].len() <= TAIL_BYTES && tail[0].len() > TAIL_BYTES - 2);
    }
}
