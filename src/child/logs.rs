//! What a child says outside the protocol: its stderr and its
//! `notifications/message`, forwarded to the log within a rate, made safe for
//! one log line, and the last stderr lines kept for failure reports.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, BufReader};

/// `notifications/message` logged per second per child; the rest are counted.
pub(super) const MESSAGES_PER_SECOND: u32 = 100;

pub(super) use crate::throttle::LogBudget;

/// Text from outside made safe for one log line: control characters (a
/// newline could forge a log line; escapes could move a terminal's cursor)
/// escaped, and cut at [`STDERR_LINE_MAX`] characters.
pub(super) fn sanitize(text: &str) -> String {
    let cut = text
        .char_indices()
        .nth(STDERR_LINE_MAX)
        .map_or(text, |(end, _)| &text[..end]);
    crate::throttle::escape_controls(cut).into_owned()
}

pub(super) fn log_child_message(toolbox: &str, pid: u32, params: &Value) {
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

/// Longest stderr line logged; the rest of a longer line is cut.
const STDERR_LINE_MAX: usize = 4096;
/// Stderr lines kept for the report of a failed toolbox.
const STDERR_TAIL_LINES: usize = 20;
/// Stderr lines logged per second per child; the rest are counted, not logged.
const STDERR_LINES_PER_SECOND: u32 = 200;

/// The last lines a child wrote to stderr.
pub(super) type StderrTail = Arc<Mutex<std::collections::VecDeque<String>>>;

/// Forwards stderr lines to the log, tagged with the toolbox and pid, at most
/// [`STDERR_LINES_PER_SECOND`] a second; keeps the last few for failure reports.
/// It always reads on, so a flooding child never blocks on a full pipe.
pub(super) async fn forward_stderr(
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
}
