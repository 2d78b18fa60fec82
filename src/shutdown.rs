//! Shutdown, as one small type: a trigger that flips once, and receivers that
//! any task can clone and await.

use tokio::sync::watch;

/// Flips every [`Shutdown`] made from it.
pub struct ShutdownTrigger {
    /// `true` once shutdown has begun.
    tx: watch::Sender<bool>,
}

/// Awaits the start of shutdown; clone one per task.
#[derive(Clone)]
pub struct Shutdown {
    /// Becomes `true` once; a dropped trigger also counts as shutdown.
    rx: watch::Receiver<bool>,
}

impl ShutdownTrigger {
    /// A trigger and its first receiver.
    pub fn new() -> (ShutdownTrigger, Shutdown) {
        let (tx, rx) = watch::channel(false);
        (ShutdownTrigger { tx }, Shutdown { rx })
    }

    /// Begins shutdown.
    pub fn trigger(&self) {
        let _ = self.tx.send(true);
    }
}

impl Shutdown {
    /// Returns once shutdown has begun. Cancel-safe.
    pub async fn recv(&mut self) {
        let _ = self.rx.wait_for(|down| *down).await;
    }

    /// The next connection on `listener`, or `None` once shutdown begins. A
    /// failed accept (out of descriptors, say) is logged as `what`'s and
    /// tried again shortly, never a busy loop.
    pub async fn accept(
        &mut self,
        listener: &tokio::net::TcpListener,
        what: &str,
    ) -> Option<tokio::net::TcpStream> {
        loop {
            let accepted = tokio::select! {
                accepted = listener.accept() => accepted,
                _ = self.recv() => return None,
            };
            match accepted {
                Ok((stream, _)) => return Some(stream),
                Err(e) => {
                    tracing::warn!("{what}: accept failed: {e}");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                }
            }
        }
    }

    /// Whether shutdown has begun, without waiting.
    pub fn is_down(&self) -> bool {
        *self.rx.borrow() || self.rx.has_changed().is_err()
    }
}
