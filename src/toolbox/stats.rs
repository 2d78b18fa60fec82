//! A toolbox's counters and recent history, for status: shared by its
//! handles (callers count calls) and its actors (restarts, era, sandbox).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Calls whose latency is kept for the percentiles in status.
const LATENCY_SAMPLES: usize = 1024;

/// Counters and recent history, for status.
#[derive(Debug, Default)]
pub struct Stats {
    /// Calls answered with a result (counted by whoever answers the caller).
    pub calls_ok: AtomicU64,
    /// Calls answered with an error by the child, a deadline or a crash.
    pub calls_err: AtomicU64,
    /// Calls waiting for or running on a child right now.
    pub in_flight: AtomicU64,
    /// Restarts since the daemon started (crashes and operator restarts).
    pub restarts: AtomicU64,
    /// The same, by [`RestartReason`] (in the order of `RestartReason::ALL`).
    restarts_by: [AtomicU64; RestartReason::ALL.len()],
    /// The recent stderr of its children, for `ctl logs` and failure reports.
    pub stderr: Arc<crate::process::child::StderrLog>,
    /// What status shows beyond the counters.
    detail: Mutex<Detail>,
    /// When a prewarm topic last started a child (for its rate).
    last_prewarm: Mutex<Option<std::time::Instant>>,
}

#[derive(Debug, Default)]
struct Detail {
    /// How the last child ended, in words.
    last_exit: Option<String>,
    /// The MCP era and version the serving child speaks.
    era: Option<String>,
    /// What confines the serving child, mechanism by mechanism.
    sandbox: Vec<String>,
    /// How long the last start took, spawn to tools listed: what the first
    /// call to an idle toolbox waits.
    cold_start: Option<Duration>,
    /// Durations of the latest calls, in microseconds.
    latencies: VecDeque<u32>,
}

/// A point-in-time view of a toolbox's counters.
#[derive(Debug, Clone, PartialEq)]
pub struct StatsSnapshot {
    pub calls_ok: u64,
    pub calls_err: u64,
    pub in_flight: u64,
    pub restarts: u64,
    pub last_exit: Option<String>,
    pub era: Option<String>,
    /// What confines the serving child (`["off"]` when nothing does).
    pub sandbox: Vec<String>,
    /// How long the last start took, spawn to tools listed.
    pub cold_start: Option<Duration>,
    /// Median and 99th percentile of recent call latencies.
    pub p50: Option<Duration>,
    pub p99: Option<Duration>,
}

impl Stats {
    /// Whether a prewarm may start a child now (none within `interval`);
    /// if so, now is noted as the last.
    pub fn prewarm_due(&self, interval: std::time::Duration) -> bool {
        let mut last = self.last_prewarm.lock().unwrap_or_else(|e| e.into_inner());
        let now = std::time::Instant::now();
        if last.is_some_and(|at| now.duration_since(at) < interval) {
            return false;
        }
        *last = Some(now);
        true
    }

    fn detail(&self) -> std::sync::MutexGuard<'_, Detail> {
        self.detail.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Counts a finished call: answered with a result (`ok`) or an error,
    /// `took` after it arrived.
    pub fn record_call(&self, ok: bool, took: Duration) {
        let counter = if ok { &self.calls_ok } else { &self.calls_err };
        counter.fetch_add(1, Ordering::Relaxed);
        self.record_latency(took);
    }

    fn record_latency(&self, took: Duration) {
        let mut d = self.detail();
        if d.latencies.len() == LATENCY_SAMPLES {
            d.latencies.pop_front();
        }
        d.latencies
            .push_back(took.as_micros().min(u32::MAX as u128) as u32);
    }

    /// Records what the child now serving speaks and how it is confined.
    pub(super) fn set_serving(&self, era: String, sandbox: Vec<String>) {
        let mut d = self.detail();
        d.era = Some(era);
        d.sandbox = sandbox;
    }

    pub(super) fn set_cold_start(&self, took: Duration) {
        self.detail().cold_start = Some(took);
    }

    /// Counts a restart, and why.
    pub(super) fn restarted(&self, reason: RestartReason) {
        self.restarts.fetch_add(1, Ordering::Relaxed);
        if let Some(i) = RestartReason::ALL.iter().position(|&r| r == reason) {
            self.restarts_by[i].fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Restarts by reason, every reason listed.
    pub fn restarts_by_reason(&self) -> impl Iterator<Item = (RestartReason, u64)> + '_ {
        RestartReason::ALL
            .iter()
            .zip(&self.restarts_by)
            .map(|(&reason, count)| (reason, count.load(Ordering::Relaxed)))
    }

    pub(super) fn set_last_exit(&self, text: String) {
        self.detail().last_exit = Some(text);
    }

    /// The counters now.
    pub fn snapshot(&self) -> StatsSnapshot {
        let d = self.detail();
        let mut sorted: Vec<u32> = d.latencies.iter().copied().collect();
        sorted.sort_unstable();
        let pick = |q: f64| {
            (!sorted.is_empty()).then(|| {
                let i = ((sorted.len() as f64 - 1.0) * q).round() as usize;
                Duration::from_micros(sorted[i] as u64)
            })
        };
        StatsSnapshot {
            calls_ok: self.calls_ok.load(Ordering::Relaxed),
            calls_err: self.calls_err.load(Ordering::Relaxed),
            in_flight: self.in_flight.load(Ordering::Relaxed),
            restarts: self.restarts.load(Ordering::Relaxed),
            last_exit: d.last_exit.clone(),
            era: d.era.clone(),
            sandbox: d.sandbox.clone(),
            cold_start: d.cold_start,
            p50: pick(0.5),
            p99: pick(0.99),
        }
    }
}

/// Why a toolbox's child was replaced (the `reason` of the restarts metric).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RestartReason {
    /// The child exited by itself (crash or not); a new one was started.
    Exited,
    /// The daemon killed it (missed probes, wedged, broke the protocol).
    Killed,
    /// A start did not get as far as a tool list; tried again.
    StartFailed,
    /// `ctl restart`: a rolling restart.
    Operator,
    /// A reload with a changed manifest: a rolling restart into it.
    Reload,
}

impl RestartReason {
    /// Every reason, in the order metrics list them.
    pub const ALL: [RestartReason; 5] = [
        RestartReason::Exited,
        RestartReason::Killed,
        RestartReason::StartFailed,
        RestartReason::Operator,
        RestartReason::Reload,
    ];

    /// The reason's name, as the metric's label.
    pub fn name(self) -> &'static str {
        match self {
            RestartReason::Exited => "exited",
            RestartReason::Killed => "killed",
            RestartReason::StartFailed => "start_failed",
            RestartReason::Operator => "operator",
            RestartReason::Reload => "reload",
        }
    }
}
