//! The serving child's liveness: a probe on a timer, and a kill when it
//! misses too many in a row or wedges (the exit then restarts it).

use std::time::Duration;

use super::Actor;
use crate::process::child::RpcFailure;
use crate::toolbox::running::Running;

/// Liveness probes missed in a row before the child is killed.
const MAX_MISSED_PROBES: u32 = 3;

impl Actor {
    /// The serving child let too many calls in a row run past their
    /// deadline: it is killed (and restarted).
    pub(super) fn wedged(&self, running: &mut Running) {
        let why = format!(
            "{} calls in a row ran past their deadline",
            self.manifest.limits.max_timeouts_in_a_row
        );
        let pid = running.child.pid();
        tracing::error!(toolbox = self.id(), pid, "{why}; killing the child");
        Self::kill(running, why);
    }

    /// Kills the serving child because `why` (said again with its exit); the
    /// exit then restarts it.
    pub(super) fn kill(running: &mut Running, why: String) {
        running.killed_for = Some(why);
        running
            .child
            .signal_group(nix::sys::signal::Signal::SIGKILL);
    }

    /// One liveness probe: `MAX_MISSED_PROBES` missed in a row kill the child.
    pub(super) async fn probe(&self, running: &mut Running) {
        self.check_state_size(running).await;
        let limit = Duration::from_secs(self.manifest.limits.probe_timeout_s);
        match tokio::time::timeout(limit, running.serving.session.probe()).await {
            // An error answer is still an answer: the child is alive.
            Ok(Ok(())) | Ok(Err(RpcFailure::Rpc(_))) => running.missed = 0,
            _ => {
                running.missed += 1;
                let (pid, missed) = (running.child.pid(), running.missed);
                tracing::warn!(toolbox = self.id(), pid, missed, "liveness probe missed");
                if missed >= MAX_MISSED_PROBES {
                    tracing::error!(
                        toolbox = self.id(),
                        pid,
                        "child stopped answering its liveness probe; killing it"
                    );
                    let why = format!("it missed {MAX_MISSED_PROBES} liveness probes in a row");
                    Self::kill(running, why);
                }
            }
        }
    }

    /// Kills the child whose state directory passed its `state_max_mib`
    /// (measured off the runtime's thread, within the probe's timeout): its
    /// next start is refused, saying why, until the directory is emptied.
    async fn check_state_size(&self, running: &mut Running) {
        let max = self.manifest.sandbox.state_max_mib;
        let Some(dir) = crate::process::sandbox::state_dir_of(&self.manifest).filter(|_| max > 0)
        else {
            return;
        };
        let limit = Duration::from_secs(self.manifest.limits.probe_timeout_s);
        let measured =
            tokio::task::spawn_blocking(move || crate::process::sandbox::state_over(&dir, max));
        if let Ok(Ok(Some(why))) = tokio::time::timeout(limit, measured).await {
            tracing::error!(
                toolbox = self.id(),
                pid = running.child.pid(),
                "{why}; killing the child"
            );
            Self::kill(running, why);
        }
    }
}
