//! The restart policy's arithmetic: exponential backoff with jitter, and the
//! restart budget (at most `max_restarts` within `window_s`), in the manner of
//! OTP's supervisor intensity and systemd's StartLimitBurst.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use crate::manifest::{Restart, RestartPolicy};
use crate::process::child::ExitInfo;

/// What to do after a child went down.
#[derive(Debug, PartialEq)]
pub enum Decision {
    /// Start again after this delay.
    RestartAfter(Duration),
    /// The budget is spent: `failed`, and try again after `failed_retry_s`.
    Failed,
    /// The policy says this exit is final.
    StayDown,
}

/// Restart history of one toolbox.
#[derive(Debug, Default)]
pub struct Budget {
    /// Start times of recent restarts, oldest first.
    restarts: VecDeque<Instant>,
    /// Exponent of the next backoff delay.
    step: u32,
}

impl Budget {
    /// Decides what follows an exit after `uptime` of service, and records the
    /// restart if there is one.
    pub fn after_exit(&mut self, knobs: &Restart, exit: ExitInfo, uptime: Duration) -> Decision {
        self.after_exit_at(knobs, exit, uptime, Instant::now())
    }

    /// [`Budget::after_exit`] with the clock read by the caller, so that tests
    /// can place restarts exactly at the window's edge.
    fn after_exit_at(
        &mut self,
        knobs: &Restart,
        exit: ExitInfo,
        uptime: Duration,
        now: Instant,
    ) -> Decision {
        let wanted = match knobs.policy {
            RestartPolicy::Always => true,
            RestartPolicy::OnFailure => exit.is_failure(),
            RestartPolicy::Never => false,
        };
        if !wanted {
            return Decision::StayDown;
        }
        if uptime >= Duration::from_secs(knobs.stable_after_s) {
            self.step = 0;
        }
        let window = Duration::from_secs(knobs.window_s);
        while self
            .restarts
            .front()
            .is_some_and(|t| now.duration_since(*t) > window)
        {
            self.restarts.pop_front();
        }
        if self.restarts.len() >= knobs.max_restarts as usize {
            return Decision::Failed;
        }
        self.restarts.push_back(now);
        let delay = backoff(knobs.backoff_initial_ms, knobs.backoff_max_ms, self.step);
        self.step = self.step.saturating_add(1);
        Decision::RestartAfter(delay)
    }

    /// Forgets the history: after a failed toolbox's cool-down, or an
    /// operator's start.
    pub fn reset(&mut self) {
        self.restarts.clear();
        self.step = 0;
    }
}

/// The delay before restart number `step` (0-based): doubling from `initial_ms`
/// up to `max_ms`, with ±20% jitter so that toolboxes that died together do not
/// restart in lockstep.
pub fn backoff(initial_ms: u64, max_ms: u64, step: u32) -> Duration {
    let base = initial_ms
        .saturating_mul(1u64.checked_shl(step.min(63)).unwrap_or(u64::MAX))
        .min(max_ms);
    let jitter = rand::random_range(0.8..=1.2);
    Duration::from_millis(((base as f64) * jitter).min(max_ms as f64) as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_within_jitter_and_caps() {
        for step in 0..5 {
            let d = backoff(100, 30_000, step).as_millis() as u64;
            let base = 100 << step;
            assert!(d >= base * 8 / 10 && d <= base * 12 / 10, "{step}: {d}");
        }
        assert!(backoff(100, 30_000, 40).as_millis() <= 30_000);
        assert!(backoff(100, 30_000, u32::MAX).as_millis() <= 30_000);
    }

    #[test]
    fn jitter_spreads_delays_over_plus_or_minus_twenty_percent() {
        let delays: Vec<u64> = (0..200)
            .map(|_| backoff(1000, 60_000, 0).as_millis() as u64)
            .collect();
        assert!(
            delays.iter().all(|d| (800..=1200).contains(d)),
            "{delays:?}"
        );
        // Either check fails by chance only if all 200 uniform draws miss its
        // side: odds of (5/8)^200, about 1e-41.
        assert!(delays.iter().any(|&d| d < 950), "{delays:?}");
        assert!(delays.iter().any(|&d| d > 1050), "{delays:?}");
    }

    #[test]
    fn budget_fails_after_max_restarts_in_the_window() {
        let knobs = Restart {
            max_restarts: 3,
            ..Restart::default()
        };
        let mut budget = Budget::default();
        for _ in 0..3 {
            assert!(matches!(
                budget.after_exit(&knobs, ExitInfo::Code(1), Duration::ZERO),
                Decision::RestartAfter(_)
            ));
        }
        assert_eq!(
            budget.after_exit(&knobs, ExitInfo::Code(1), Duration::ZERO),
            Decision::Failed
        );
        budget.reset();
        assert!(matches!(
            budget.after_exit(&knobs, ExitInfo::Code(1), Duration::ZERO),
            Decision::RestartAfter(_)
        ));
    }

    #[test]
    fn policy_decides_which_exits_restart() {
        let mut budget = Budget::default();
        let on_failure = Restart {
            policy: RestartPolicy::OnFailure,
            ..Restart::default()
        };
        assert_eq!(
            budget.after_exit(&on_failure, ExitInfo::Code(0), Duration::ZERO),
            Decision::StayDown
        );
        assert!(matches!(
            budget.after_exit(&on_failure, ExitInfo::Signal(9), Duration::ZERO),
            Decision::RestartAfter(_)
        ));
        let never = Restart {
            policy: RestartPolicy::Never,
            ..Restart::default()
        };
        assert_eq!(
            budget.after_exit(&never, ExitInfo::Code(1), Duration::ZERO),
            Decision::StayDown
        );
    }

    #[test]
    fn restarts_leave_the_budget_only_once_older_than_the_window() {
        let knobs = Restart {
            max_restarts: 2,
            window_s: 60,
            ..Restart::default()
        };
        let crash = |budget: &mut Budget, at: Instant| {
            budget.after_exit_at(&knobs, ExitInfo::Code(1), Duration::ZERO, at)
        };
        let t0 = Instant::now();
        let mut budget = Budget::default();
        assert!(matches!(crash(&mut budget, t0), Decision::RestartAfter(_)));
        let t1 = t0 + Duration::from_secs(1);
        assert!(matches!(crash(&mut budget, t1), Decision::RestartAfter(_)));
        // Exactly a window after the first restart, it still counts.
        let edge = t0 + Duration::from_secs(60);
        assert_eq!(crash(&mut budget, edge), Decision::Failed);
        // A moment later it has left the window, the second has not.
        let past = edge + Duration::from_nanos(1);
        assert!(matches!(
            crash(&mut budget, past),
            Decision::RestartAfter(_)
        ));
        assert_eq!(crash(&mut budget, past), Decision::Failed);
    }

    #[test]
    fn successive_restarts_double_the_delay() {
        let knobs = Restart {
            backoff_initial_ms: 1000,
            stable_after_s: 10,
            ..Restart::default()
        };
        let mut budget = Budget::default();
        for base in [1000u64, 2000, 4000, 8000] {
            let Decision::RestartAfter(d) =
                budget.after_exit(&knobs, ExitInfo::Code(1), Duration::from_secs(9))
            else {
                panic!()
            };
            let ms = d.as_millis() as u64;
            assert!(ms >= base * 8 / 10 && ms <= base * 12 / 10, "{base}: {ms}");
        }
        // Up exactly `stable_after_s` counts as stable.
        let Decision::RestartAfter(d) =
            budget.after_exit(&knobs, ExitInfo::Code(1), Duration::from_secs(10))
        else {
            panic!()
        };
        assert!(d <= Duration::from_millis(1200), "{d:?}");
    }

    #[test]
    fn a_stable_run_resets_the_backoff() {
        let knobs = Restart {
            backoff_initial_ms: 1000,
            stable_after_s: 10,
            ..Restart::default()
        };
        let mut budget = Budget::default();
        for _ in 0..3 {
            budget.after_exit(&knobs, ExitInfo::Code(1), Duration::ZERO);
        }
        let Decision::RestartAfter(d) =
            budget.after_exit(&knobs, ExitInfo::Code(1), Duration::from_secs(60))
        else {
            panic!()
        };
        assert!(d <= Duration::from_millis(1200), "{d:?}");
    }
}
