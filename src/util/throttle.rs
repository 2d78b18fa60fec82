//! Log lines made of what comes from outside the daemon (a child's messages,
//! malformed bus frames, a manifest's text): a per-second budget, past which
//! lines are counted, not logged, so no one outside can flood the log; and
//! escaping, so no one outside can forge a line.

use std::time::Duration;

/// A per-second budget of log lines from one source outside the daemon.
pub struct LogBudget {
    /// Lines allowed per second.
    per_second: u32,
    /// When the current second began.
    since: std::time::Instant,
    /// Lines logged in it.
    used: u32,
    /// Lines not logged since the last report.
    dropped: u64,
}

/// One line a second: for warnings about what a flood repeats (refused
/// connections, failing accepts).
impl Default for LogBudget {
    fn default() -> Self {
        LogBudget::new(1)
    }
}

impl LogBudget {
    pub fn new(per_second: u32) -> LogBudget {
        LogBudget {
            per_second,
            since: std::time::Instant::now(),
            used: 0,
            dropped: 0,
        }
    }

    /// `Some(dropped before this one)` when this line may be logged (then say
    /// how many were dropped, if any), `None` when it is over the budget.
    pub fn take(&mut self) -> Option<u64> {
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

    /// When to say how many lines were dropped if no line comes to say it
    /// (the end of the second they were dropped in); `None` when none were.
    pub fn report_due(&self) -> Option<std::time::Instant> {
        (self.dropped > 0).then(|| self.since + Duration::from_secs(1))
    }

    /// The lines dropped since the last report, now reported.
    pub fn take_dropped(&mut self) -> u64 {
        std::mem::take(&mut self.dropped)
    }
}

/// `text` cut to at most `max` bytes, at a character boundary (a line kept
/// for an operator within a byte bound).
pub fn cut(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// `text` with its control characters escaped (`\n`, `\u{1b}`), so that
/// it is one log line and cannot move a terminal's cursor.
pub fn escape_controls(text: &str) -> std::borrow::Cow<'_, str> {
    if !text.chars().any(char::is_control) {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    std::borrow::Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn a_report_is_due_only_once_lines_were_dropped() {
        let mut budget = LogBudget::new(1);
        assert_eq!(budget.take(), Some(0));
        assert_eq!(budget.report_due(), None, "nothing dropped: no timer");
        assert_eq!(budget.take(), None);
        assert_eq!(
            budget.report_due(),
            Some(budget.since + Duration::from_secs(1))
        );
        assert_eq!(budget.take_dropped(), 1);
        assert_eq!(budget.report_due(), None);
    }

    #[test]
    fn only_control_characters_are_escaped() {
        assert_eq!(escape_controls("a\nb\r\u{1b}[2J"), "a\\nb\\r\\u{1b}[2J");
        assert_eq!(escape_controls("\"type\" twice é"), "\"type\" twice é");
    }
}
