//! The global stop (`mycroft.stop`): the calls in flight, by session, and the
//! token each call watches so that a stop can cancel it (docs/protocol.md).
//!
//! The service registers every call under its session; a stop fires the
//! tokens of that session's calls (of every session when the stop names
//! none). A call's token ends its wait for a slot at once; on the child it is
//! handled like a deadline: `notifications/cancelled`, and the slot stays
//! taken until the child has really let go of the request.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use tokio::sync::oneshot;

/// The session of a call or stop that names none (OVOS's own default).
pub const DEFAULT_SESSION: &str = "default";

/// What one call watches for a stop.
pub struct Cancel {
    /// Fires once when a stop cancels the call; `None` once it can no longer
    /// fire (never registered, or already seen).
    stop: Option<oneshot::Receiver<()>>,
    /// The stop was seen: every later wait ends at once too.
    fired: bool,
}

impl Cancel {
    /// A token no stop reaches (probes, listings, tests).
    pub fn never() -> Cancel {
        Cancel {
            stop: None,
            fired: false,
        }
    }

    /// Resolves when a stop cancels the call; never, if none does.
    pub async fn fired(&mut self) {
        if self.fired {
            return;
        }
        if let Some(stop) = &mut self.stop {
            let stopped = stop.await.is_ok();
            self.stop = None;
            if stopped {
                self.fired = true;
                return;
            }
        }
        std::future::pending().await
    }
}

/// The calls in flight by session.
#[derive(Default)]
pub struct CallsBySession {
    /// session id → (call number → the call's stop).
    calls: Mutex<HashMap<String, HashMap<u64, oneshot::Sender<()>>>>,
    /// Numbers calls, so a finished one removes only its own entry.
    next: AtomicU64,
}

/// A call's place in [`CallsBySession`]; removed when the call ends (dropped).
pub struct Registered<'a> {
    /// Where it is registered.
    in_flight: &'a CallsBySession,
    /// Its session.
    session: String,
    /// Its number.
    number: u64,
}

impl Drop for Registered<'_> {
    fn drop(&mut self) {
        let mut calls = self.in_flight.lock();
        if let Some(session) = calls.get_mut(&self.session) {
            session.remove(&self.number);
            if session.is_empty() {
                calls.remove(&self.session);
            }
        }
    }
}

impl CallsBySession {
    fn lock(
        &self,
    ) -> std::sync::MutexGuard<'_, HashMap<String, HashMap<u64, oneshot::Sender<()>>>> {
        self.calls.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Registers a call of `session` (`None`: the default session): its
    /// token, and its place, to be kept until the call has been answered.
    pub fn register(&self, session: Option<&str>) -> (Cancel, Registered<'_>) {
        let session = session.unwrap_or(DEFAULT_SESSION).to_owned();
        let number = self.next.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        self.lock()
            .entry(session.clone())
            .or_default()
            .insert(number, tx);
        let cancel = Cancel {
            stop: Some(rx),
            fired: false,
        };
        let place = Registered {
            in_flight: self,
            session,
            number,
        };
        (cancel, place)
    }

    /// Cancels the calls of `session`, or of every session for `None`;
    /// returns how many.
    pub fn stop(&self, session: Option<&str>) -> usize {
        let stopped: Vec<oneshot::Sender<()>> = {
            let mut calls = self.lock();
            match session {
                Some(session) => calls
                    .remove(session)
                    .map(|c| c.into_values().collect())
                    .unwrap_or_default(),
                None => calls.drain().flat_map(|(_, c)| c.into_values()).collect(),
            }
        };
        let count = stopped.len();
        for stop in stopped {
            let _ = stop.send(());
        }
        count
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    async fn fires(cancel: &mut Cancel) -> bool {
        tokio::time::timeout(Duration::from_millis(50), cancel.fired())
            .await
            .is_ok()
    }

    #[tokio::test]
    async fn a_stop_cancels_its_sessions_calls_only() {
        let in_flight = CallsBySession::default();
        let (mut a, _a) = in_flight.register(Some("a"));
        let (mut b, _b) = in_flight.register(Some("b"));
        let (mut d, _d) = in_flight.register(None);
        assert_eq!(in_flight.stop(Some("a")), 1);
        assert!(fires(&mut a).await);
        assert!(fires(&mut a).await, "a stop once seen is seen again");
        assert!(!fires(&mut b).await);
        assert!(!fires(&mut d).await);
        assert_eq!(in_flight.stop(Some(DEFAULT_SESSION)), 1);
        assert!(fires(&mut d).await);
        assert_eq!(in_flight.stop(None), 1, "every session's");
        assert!(fires(&mut b).await);
    }

    #[tokio::test]
    async fn a_finished_call_leaves_nothing_behind() {
        let in_flight = CallsBySession::default();
        let (mut cancel, place) = in_flight.register(Some("a"));
        drop(place);
        assert!(in_flight.lock().is_empty());
        assert_eq!(in_flight.stop(None), 0);
        assert!(!fires(&mut cancel).await, "never fires once its call ended");
        assert!(!fires(&mut Cancel::never()).await);
    }
}
