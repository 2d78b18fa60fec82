//! A toolbox's child while it serves ([`Running`]), how it is let go
//! ([`drain_and_stop`]), and how one that went down is described to the
//! restart policy ([`Down`]).

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::mpsc;

use super::Serving;
use crate::launch::LaunchError;
use crate::manifest::Manifest;
use crate::process::child::{Child, ChildEvent, ExitInfo};

/// How long a child gets to exit after its stdin closes, and again after SIGTERM.
const STOP_GRACE: Duration = Duration::from_secs(3);

/// The child serving calls.
pub(super) struct Running {
    /// The process.
    pub(super) child: Child,
    /// What the child tells its owner (tool list changes).
    pub(super) events: mpsc::UnboundedReceiver<ChildEvent>,
    /// What callers use to reach it.
    pub(super) serving: Arc<Serving>,
    /// When it started serving; a long run resets the backoff.
    pub(super) started: Instant,
    /// Liveness probe ticks (`probe_interval_s`).
    pub(super) probe: tokio::time::Interval,
    /// Probes missed in a row.
    pub(super) missed: u32,
    /// Why we killed the child, once we did: said with its exit.
    pub(super) killed_for: Option<String>,
    /// When to list its tools again, if it said they changed too soon
    /// after the last listing.
    pub(super) refresh_due: Option<tokio::time::Instant>,
    /// Stop it after this long without a call (`[start] idle_stop_s`; zero
    /// for the one listing start of a lazy toolbox with no cached catalog).
    pub(super) idle_stop: Option<Duration>,
    /// When to look next at whether it is idle: fixed once armed, so that
    /// news from the child cannot put the look off.
    pub(super) idle_due: Option<tokio::time::Instant>,
    /// The turn of a lazy toolbox's one listing start: held until this
    /// child stops, or until the first look at its idleness finds it in use
    /// (so that few such children live at once, and none keeps a turn).
    pub(super) listing_turn: Option<tokio::sync::SemaphorePermit<'static>>,
}

/// A child that went down, as the restart policy and the failure report need it.
pub(super) struct Down {
    /// How it ended (`Code(-1)` when it never ran).
    pub(super) exit: ExitInfo,
    /// How long it had served; a long run resets the backoff.
    pub(super) uptime: Duration,
    /// What happened, in words, for status and errors.
    pub(super) text: String,
    /// Its last stderr lines.
    pub(super) stderr: Vec<String>,
    /// It could not even be spawned, for want of descriptors, processes or
    /// memory: tried again without charging the restart budget.
    pub(super) short_of_resources: bool,
    /// Why a restart follows, if one does.
    pub(super) reason: super::RestartReason,
}

impl Down {
    /// What happened, with the child's last stderr lines when it wrote any:
    /// the answer an operator gets over `ctl`.
    pub(super) fn report(&self) -> String {
        if self.stderr.is_empty() {
            return self.text.clone();
        }
        let mut text = format!(
            "{}\nthe child's last stderr lines (toolboxd ctl logs shows more):",
            self.text
        );
        for line in &self.stderr {
            text.push_str("\n  ");
            text.push_str(line);
        }
        text
    }

    /// A child that could not finish its start: make sure it is gone, say why.
    pub(super) async fn of_failed_start(failed: LaunchError) -> Down {
        let (exit, stderr) = failed.reap().await;
        let text = match failed.child {
            Some(_) => format!("failed to start ({}; child {exit})", failed.why),
            None => format!("failed to start: {}", failed.why),
        };
        Down {
            exit,
            uptime: Duration::ZERO,
            text,
            stderr,
            short_of_resources: failed.short_of_resources,
            reason: super::RestartReason::StartFailed,
        }
    }
}

/// Lets a child that no longer receives new calls finish the ones it has
/// (within `drain_timeout_s`), then stops it. Returns how it exited.
pub(super) async fn drain_and_stop(running: Running, manifest: &Manifest) -> ExitInfo {
    let serving = &running.serving;
    // Callers still queued for a slot look for the serving child again.
    serving.permits.close();
    let drain = Duration::from_secs(manifest.limits.drain_timeout_s);
    let deadline = tokio::time::Instant::now() + drain;
    loop {
        // Registered before the check, so a slot given back in between wakes us.
        let settled = serving.settled.notified();
        if serving.permits.available_permits() >= serving.max_calls {
            break;
        }
        tokio::select! {
            _ = settled => {}
            _ = running.child.exited() => break,
            _ = tokio::time::sleep_until(deadline) => break,
        }
    }
    let exit = running.child.stop(STOP_GRACE).await;
    tracing::info!(
        toolbox = %manifest.id,
        pid = running.child.pid(),
        "child stopped ({exit})"
    );
    exit
}
