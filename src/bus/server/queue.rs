//! What waits to be written to one client, and who sent it.
//!
//! Every frame in a client's queue is charged twice: to the client it waits
//! for ([`Budget`]: a client that takes nothing for [`STUCK_TIMEOUT`], or
//! lets [`CLIENT_QUEUE_BYTES`] pile up, is the one disconnected) and to the
//! connection that sent it ([`Origin`]: a sender whose frames wait in the
//! queues of others for more than [`SENDER_SHARE_BYTES`] is not read until
//! they are written; its own echo is not charged to it). So a flooder is slowed to the pace of its slowest
//! reader, and a slow reader is not dropped for someone else's flood.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, Notify, Semaphore};
use tokio_tungstenite::tungstenite::Utf8Bytes;

use super::peer::Peer;
use crate::bus::MAX_FRAME_BYTES;

/// Bytes waiting to be written to one client before it counts as stuck and is
/// disconnected: room for a few of the largest messages.
pub const CLIENT_QUEUE_BYTES: usize = 4 * MAX_FRAME_BYTES;
/// Bytes of one connection's frames that may wait in the queues of every
/// client (each queue counted) before that connection is no longer read:
/// reading resumes once its readers have taken enough of them.
pub const SENDER_SHARE_BYTES: usize = 4 * 1024 * 1024;
/// How long a client may take nothing from its queue while frames wait in
/// it before it counts as stuck and is disconnected (the senders whose
/// frames wait for it are held back that long at most).
pub const STUCK_TIMEOUT: Duration = Duration::from_secs(15);

/// The instant the bus's times are counted from, in milliseconds (the first
/// call): they fit an atomic.
pub(super) fn epoch() -> tokio::time::Instant {
    static EPOCH: std::sync::OnceLock<tokio::time::Instant> = std::sync::OnceLock::new();
    *EPOCH.get_or_init(tokio::time::Instant::now)
}

/// Now, in milliseconds since [`epoch`].
pub(super) fn now_ms() -> u64 {
    let since = tokio::time::Instant::now().saturating_duration_since(epoch());
    u64::try_from(since.as_millis()).unwrap_or(u64::MAX)
}

/// The instant `ms` milliseconds after [`epoch`].
pub(super) fn at_ms(ms: u64) -> tokio::time::Instant {
    epoch() + Duration::from_millis(ms)
}

/// The connection a frame came from: who it is, and how much of what it sent
/// still waits for its readers.
pub(super) struct Origin {
    /// The peer behind the connection, for the shares each peer has
    /// (connections, the daemon's room for calls).
    pub(super) peer: Peer,
    /// The connection's number: the echo of its own frames, in its own
    /// queue, is not charged to it (a client that writes before it reads is
    /// held back by its readers, never by itself; its own queue is bounded
    /// on its own).
    pub(super) id: u64,
    /// Bytes of this connection's frames waiting in any client's queue,
    /// counted once per queue.
    queued: AtomicUsize,
    /// Woken when `queued` falls to [`SENDER_SHARE_BYTES`] or below.
    drained: Notify,
}

impl Origin {
    pub(super) fn new(peer: Peer, id: u64) -> Arc<Origin> {
        Arc::new(Origin {
            peer,
            id,
            queued: AtomicUsize::new(0),
            drained: Notify::new(),
        })
    }

    /// Returns once this connection's frames waiting for others are within
    /// [`SENDER_SHARE_BYTES`]: until then the connection is not read, so its
    /// sender is slowed by TCP to what its readers take.
    pub(super) async fn within_share(&self) {
        // The common case, without registering a wait.
        if self.queued.load(Ordering::Relaxed) <= SENDER_SHARE_BYTES {
            return;
        }
        loop {
            let drained = self.drained.notified();
            tokio::pin!(drained);
            drained.as_mut().enable();
            if self.queued.load(Ordering::Relaxed) <= SENDER_SHARE_BYTES {
                return;
            }
            drained.await;
        }
    }

    /// `n` bytes of its frames left one queue.
    fn release(&self, n: usize) {
        let before = self.queued.fetch_sub(n, Ordering::Relaxed);
        if before > SENDER_SHARE_BYTES && before - n <= SENDER_SHARE_BYTES {
            self.drained.notify_waiters();
        }
    }
}

/// A frame in one client's queue, charged to the connection that sent it
/// (none for the daemon's own frames) until it leaves the queue, written or
/// dropped.
pub struct Relayed {
    /// The frame, shared by every queue it is in.
    pub(super) frame: Utf8Bytes,
    /// Its sender, charged the frame's size while it waits here.
    origin: Option<Arc<Origin>>,
}

impl Relayed {
    /// A frame from `origin`, charged to it (the caller queues it).
    pub(super) fn new(frame: Utf8Bytes, origin: Option<&Arc<Origin>>) -> Relayed {
        if let Some(origin) = origin {
            origin.queued.fetch_add(frame.len(), Ordering::Relaxed);
        }
        Relayed {
            frame,
            origin: origin.cloned(),
        }
    }

    /// The frame's text.
    pub fn as_str(&self) -> &str {
        self.frame.as_str()
    }

    /// Who sent it: `None` for the daemon's own frames.
    pub fn from(&self) -> Option<Peer> {
        self.origin.as_ref().map(|origin| origin.peer)
    }
}

impl Drop for Relayed {
    fn drop(&mut self) {
        if let Some(origin) = &self.origin {
            origin.release(self.frame.len());
        }
    }
}

/// Where frames for one client wait: a channel to its writer, bounded in bytes.
pub(super) struct Queue {
    /// Frames for the writer task.
    pub(super) tx: mpsc::UnboundedSender<Relayed>,
    /// How the bytes waiting are bounded.
    pub(super) budget: Budget,
}

/// How the bytes waiting for one client are bounded.
#[derive(Clone)]
pub(super) enum Budget {
    /// A socket client, disconnected when it falls too far behind: its queue
    /// is taken away and `kick` ends its connection (its writer may be
    /// blocked on a socket nobody reads).
    Drop(Arc<Behind>),
    /// The daemon's own client: room left, in bytes ([`super::OWN_QUEUE_BYTES`]);
    /// when there is none its senders wait.
    Wait(Arc<Semaphore>),
}

/// How far behind a socket client is.
pub(super) struct Behind {
    /// Bytes queued and not yet taken by its writer; past
    /// [`CLIENT_QUEUE_BYTES`] it is disconnected.
    pub(super) queued: AtomicUsize,
    /// When its writer last took a frame, or a frame came into its empty
    /// queue (ms since [`epoch`]): frames waiting since more than
    /// [`STUCK_TIMEOUT`] mean it is stuck.
    since: AtomicU64,
    /// Ends its connection.
    pub(super) kick: Notify,
}

impl Behind {
    /// `initial` bytes already queued (its greeting).
    pub(super) fn new(initial: usize) -> Arc<Behind> {
        Arc::new(Behind {
            queued: AtomicUsize::new(initial),
            since: AtomicU64::new(now_ms()),
            kick: Notify::new(),
        })
    }

    /// Counts a frame of `n` bytes into the queue; false (and nothing
    /// counted) when it would pass [`CLIENT_QUEUE_BYTES`].
    pub(super) fn take_in(&self, n: usize) -> bool {
        let before = self.queued.fetch_add(n, Ordering::Relaxed);
        if before + n > CLIENT_QUEUE_BYTES {
            self.queued.fetch_sub(n, Ordering::Relaxed);
            return false;
        }
        if before == 0 {
            self.since.store(now_ms(), Ordering::Relaxed);
        }
        true
    }

    /// Returns once frames have waited in the queue for [`STUCK_TIMEOUT`]
    /// without the writer taking any (checked a few times a timeout).
    pub(super) async fn stuck(&self) {
        loop {
            tokio::time::sleep(STUCK_TIMEOUT / 5).await;
            let since = at_ms(self.since.load(Ordering::Relaxed));
            if self.queued.load(Ordering::Relaxed) > 0 && since.elapsed() >= STUCK_TIMEOUT {
                return;
            }
        }
    }
}

/// The receiving end of a client's queue.
pub(super) struct Inbox {
    /// Frames to write.
    pub(super) rx: mpsc::UnboundedReceiver<Relayed>,
    /// Given back what each frame took, as it leaves.
    pub(super) budget: Budget,
}

impl Inbox {
    pub(super) async fn recv(&mut self) -> Option<Relayed> {
        let frame = self.rx.recv().await;
        self.taken(frame)
    }

    pub(super) fn try_recv(&mut self) -> Option<Relayed> {
        let frame = self.rx.try_recv().ok();
        self.taken(frame)
    }

    /// A frame left the queue: it no longer counts against the client (its
    /// sender is charged until it is dropped).
    fn taken(&self, frame: Option<Relayed>) -> Option<Relayed> {
        if let Some(relayed) = &frame {
            let n = relayed.frame.len();
            match &self.budget {
                Budget::Drop(behind) => {
                    behind.queued.fetch_sub(n, Ordering::Relaxed);
                    behind.since.store(now_ms(), Ordering::Relaxed);
                }
                Budget::Wait(room) => room.add_permits(n),
            }
        }
        frame
    }
}
