//! The child that serves a toolbox's calls as callers see it ([`Serving`]),
//! what a caller finds when it looks for one ([`Slot`]), and the call slot
//! it holds while the child has its call ([`SlotHold`]).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::Semaphore;

use crate::session::Session;

/// The child currently serving calls, as callers see it.
pub(super) struct Serving {
    /// Its MCP session.
    pub(super) session: Session,
    /// Its pid, for status.
    pub(super) pid: u32,
    /// `max_concurrent_calls` permits; tokio's semaphore is fair, so waiting
    /// calls are served in arrival order.
    pub(super) permits: Semaphore,
    /// `max_concurrent_calls`: when all permits are back, no call is on the child.
    pub(super) max_calls: usize,
    /// Woken whenever a call gives its slot back, for a drain waiting on the last.
    pub(super) settled: tokio::sync::Notify,
    /// When it became ready, for uptime in status.
    pub(super) since: Instant,
    /// Calls that ran past their deadline since the last answered one.
    pub(super) timeouts_in_a_row: std::sync::atomic::AtomicU32,
    /// Calls it answered, to tell a child that answers slowly from one that
    /// answers nothing.
    pub(super) answers: AtomicU64,
    /// `max_timeouts_in_a_row`: this many in a row and the child is wedged.
    pub(super) max_timeouts_in_a_row: u32,
    /// Tells the actor the child is wedged: it kills and restarts it.
    pub(super) wedged: tokio::sync::Notify,
    /// When a call last took or gave back a slot, in microseconds after
    /// `since`: the actor stops a child idle for `idle_stop_s`.
    pub(super) last_active: AtomicU64,
}

impl Serving {
    /// A call took or gave back a slot: the child is not idle.
    pub(super) fn touch(&self) {
        let now = self.since.elapsed().as_micros().min(u128::from(u64::MAX)) as u64;
        self.last_active.store(now, Ordering::Relaxed);
    }

    /// When a call last took or gave back a slot.
    pub(super) fn last_active(&self) -> Instant {
        self.since + Duration::from_micros(self.last_active.load(Ordering::Relaxed))
    }

    /// Whether a call holds one of its slots.
    pub(super) fn busy(&self) -> bool {
        self.permits.available_permits() < self.max_calls
    }

    /// The child answered a call: it is not wedged.
    pub(super) fn answered(&self) {
        self.answers.fetch_add(1, Ordering::Relaxed);
        self.timeouts_in_a_row.store(0, Ordering::Relaxed);
    }

    /// A call timed out on this child, or waiting for one of its slots: the
    /// `max_timeouts_in_a_row`-th in a row (no answer between) wedges it.
    pub(super) fn timed_out(&self) {
        let in_a_row = self.timeouts_in_a_row.fetch_add(1, Ordering::Relaxed) + 1;
        if in_a_row == self.max_timeouts_in_a_row {
            self.wedged.notify_one();
        }
    }
}

/// What a caller finds when it looks for a child.
#[derive(Clone)]
pub(super) enum Slot {
    /// No child yet (starting or restarting): wait.
    Waiting,
    /// No child until one is asked for: wake the actor, then wait.
    Idle,
    /// This child serves.
    Serving(Arc<Serving>),
    /// Failed: answer at once with this reason.
    Failed(String),
    /// Stopped: not hosted.
    Stopped,
}

/// One call slot (a `max_concurrent_calls` permit) of a serving child, given
/// back when dropped: when the child has answered, or is gone.
pub(super) struct SlotHold(pub(super) Arc<Serving>);

impl Drop for SlotHold {
    fn drop(&mut self) {
        self.0.touch();
        self.0.permits.add_permits(1);
        self.0.settled.notify_waiters();
    }
}
