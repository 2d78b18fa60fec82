//! A stand-in toolbox for the tests of what lies above a toolbox (the
//! pipeline, the bus face): a handle whose one child serves from the
//! start, a stand-in child (`process/child/stand_in.rs`), with no actor
//! behind it: it never restarts, and operator commands find it gone.

use std::sync::atomic::{AtomicU32, AtomicU64};
use std::sync::Arc;
use std::time::Instant;

use tokio::sync::{mpsc, watch, Notify, Semaphore};

use super::serving::{Serving, Slot};
use super::{CallLimits, Replica, Stats, ToolboxHandle};
use crate::manifest::Manifest;
use crate::session::Session;

/// A toolbox serving through `session` as `manifest` says (its `[limits]`
/// hold); kept alive while this is.
pub(crate) struct StandInToolbox {
    /// Where its calls go.
    pub(crate) handle: ToolboxHandle,
    /// Publishes its serving child (kept: a caller takes a dropped one as
    /// a stopped toolbox).
    _slot: watch::Sender<Slot>,
    /// Publishes its limits (kept for the same reason).
    _limits: watch::Sender<Arc<CallLimits>>,
}

impl StandInToolbox {
    /// Toolbox `manifest.id`, its one child serving through `session`.
    pub(crate) fn new(manifest: &Manifest, session: Session) -> StandInToolbox {
        let limits = &manifest.limits;
        let serving = Arc::new(Serving {
            session,
            pid: 0,
            permits: Semaphore::new(limits.max_concurrent_calls),
            max_calls: limits.max_concurrent_calls,
            settled: Notify::new(),
            since: Instant::now(),
            timeouts_in_a_row: AtomicU32::new(0),
            answers: AtomicU64::new(0),
            max_timeouts_in_a_row: limits.max_timeouts_in_a_row,
            wedged: Notify::new(),
            last_active: AtomicU64::new(0),
        });
        let (slot_tx, slot) = watch::channel(Slot::Serving(serving));
        let (limits_tx, limits) = watch::channel(CallLimits::of(manifest));
        // No actor reads its commands: one sent finds the toolbox gone.
        let (commands, _) = mpsc::channel(1);
        let replica = Replica {
            commands,
            slot,
            wake: Arc::new(Notify::new()),
        };
        StandInToolbox {
            handle: ToolboxHandle {
                id: manifest.id.as_str().into(),
                replicas: Arc::new([replica]),
                limits,
                stats: Arc::new(Stats::default()),
            },
            _slot: slot_tx,
            _limits: limits_tx,
        }
    }
}
