//! A call's progress (`notifications/progress`, docs/protocol.md): the
//! token each call that asks for progress is given ([`ProgressWatch`]), and
//! where the child's notifications for it go.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use serde_json::Value;
use tokio::sync::watch;

use super::{Link, RpcHandle};
use crate::mcp::{self, Progress};

/// Where a call's progress goes: the latest `notifications/progress` of the
/// call replaces any its reader has not taken yet, so a child that floods
/// progress costs one value per call, never a queue.
pub type ProgressSender = watch::Sender<Option<Progress>>;

impl Link {
    /// Hands a `notifications/progress` to the call that sent its token.
    /// Every progress notification from a child passes here; one for no call
    /// (late, or made up) is dropped.
    pub(super) fn progress(&self, params: &Value) {
        let Some((token, progress)) = mcp::parse_progress(params) else {
            tracing::trace!(toolbox = %self.toolbox, pid = self.pid, "malformed notifications/progress ignored");
            return;
        };
        let calls = self.progress.lock().unwrap_or_else(|e| e.into_inner());
        match calls.get(&token) {
            Some(sender) => {
                sender.send_replace(Some(progress));
            }
            None => tracing::trace!(
                toolbox = %self.toolbox,
                pid = self.pid,
                token,
                "progress for no call in flight ignored"
            ),
        }
    }
}

/// A call's `progressToken`, registered while this lives.
pub struct ProgressWatch {
    /// Where the token is registered.
    link: Arc<Link>,
    /// The token the call sends in `_meta.progressToken`.
    token: u64,
}

impl ProgressWatch {
    /// The token to send.
    pub fn token(&self) -> u64 {
        self.token
    }
}

impl Drop for ProgressWatch {
    fn drop(&mut self) {
        self.link
            .progress
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&self.token);
    }
}

impl RpcHandle {
    /// Registers a call's progress token: the child's progress
    /// notifications for it go to `sender` until the watch is dropped.
    pub fn watch_progress(&self, sender: ProgressSender) -> ProgressWatch {
        let token = self.link.next_id.fetch_add(1, Ordering::Relaxed);
        self.link
            .progress
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(token, sender);
        ProgressWatch {
            link: self.link.clone(),
            token,
        }
    }
}
