//! Reading one client after its handshake: its messages relayed to every
//! client, and what cuts it: an unfinished message past its deadline, a
//! ping not answered. While what it sent waits for others past its share
//! ([`super::queue`]), it is not read: backpressure.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use futures_util::StreamExt;
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::Message as WsMessage;

use super::queue::Origin;
use super::wire::Wire;
use super::{Clients, IDLE_PING, PARTIAL_TIMEOUT, PING, PING_TIMEOUT};
use crate::bus::tcp;

/// The reading side of a connection after its handshake.
pub(super) struct Reading<'a> {
    /// Whom its messages are relayed to.
    pub(super) clients: &'a Clients,
    /// The connection as a sender: what of its frames waits for others.
    pub(super) origin: Arc<Origin>,
    /// Bytes of the message it has not finished ([`Wire`]).
    pub(super) unfinished: Arc<AtomicUsize>,
    /// When that message started ([`Wire`]).
    pub(super) since: Arc<AtomicU64>,
    /// Where the bus's pings go (the writer's control frames).
    pub(super) pinger: mpsc::Sender<Vec<u8>>,
    /// The socket, for re-arming its quick ACKs.
    pub(super) fd: tcp::Fd,
    /// The client's address and number, for the log.
    pub(super) addr: SocketAddr,
    pub(super) id: u64,
}

/// Why a connection's reading stopped waiting for its next frame.
enum Due {
    /// Its unfinished message passed [`PARTIAL_TIMEOUT`].
    Unfinished,
    /// It was silent for [`IDLE_PING`]: ping it.
    Ping,
    /// It did not answer a ping within [`PING_TIMEOUT`].
    Gone,
}

impl Reading<'_> {
    /// Reads and relays the client's messages until it closes, fails, or
    /// is due to be cut: its unfinished message passed its deadline, or it
    /// did not answer a ping. While what it sent waits for others past its
    /// share, it is not read.
    pub(super) async fn run(&self, ws: &mut tokio_tungstenite::WebSocketStream<Wire>) {
        let (addr, id) = (self.addr, self.id);
        let mut heard = tokio::time::Instant::now();
        let mut pinged = None;
        loop {
            let mut next = ws.next();
            let frame = loop {
                let (deadline, due) = self.deadline(heard, pinged);
                if let Ok(frame) = tokio::time::timeout_at(deadline, &mut next).await {
                    break frame;
                }
                match due {
                    Due::Unfinished => {
                        tracing::warn!(peer = %addr, id, "bus client left a message unfinished for {PARTIAL_TIMEOUT:?}; disconnecting it");
                        return;
                    }
                    Due::Gone => {
                        tracing::warn!(peer = %addr, id, "bus client did not answer a ping within {PING_TIMEOUT:?} (silent for {:?}); disconnecting it", IDLE_PING + PING_TIMEOUT);
                        return;
                    }
                    Due::Ping => {
                        // A full control queue means pongs are waiting for
                        // it: the client is not silent to us then.
                        let _ = self.pinger.try_send(PING.to_vec());
                        pinged = Some(tokio::time::Instant::now());
                    }
                }
            };
            let Some(frame) = frame else { return };
            (heard, pinged) = (tokio::time::Instant::now(), None);
            tcp::quickack(&self.fd);
            match &frame {
                // A ping or pong may come between the fragments of a
                // message, which stays unfinished: only the control
                // frame's own bytes (a masked client frame: 6 + payload)
                // are given back.
                Ok(WsMessage::Ping(payload) | WsMessage::Pong(payload)) => {
                    Wire::release(&self.unfinished, &self.clients.partial, 6 + payload.len())
                }
                _ => Wire::settle(&self.unfinished, &self.clients.partial),
            }
            match frame {
                Ok(WsMessage::Text(text)) => {
                    self.clients.broadcast(&text, Some(&self.origin)).await;
                    // Backpressure: not read again until its readers have
                    // taken enough of what it sent. Silence while it waits
                    // is the bus's, not the client's.
                    self.origin.within_share().await;
                    heard = tokio::time::Instant::now();
                }
                Ok(WsMessage::Close(_)) => return,
                Ok(_) => {}
                Err(e) => {
                    tracing::debug!(peer = %addr, id, "bus client error: {e}");
                    return;
                }
            }
        }
    }

    /// What the wait for the next frame is bounded by: the unfinished
    /// message's deadline (from its first byte), or the ping's.
    fn deadline(
        &self,
        heard: tokio::time::Instant,
        pinged: Option<tokio::time::Instant>,
    ) -> (tokio::time::Instant, Due) {
        let silence = match pinged {
            Some(at) => (at + PING_TIMEOUT, Due::Gone),
            None => (heard + IDLE_PING, Due::Ping),
        };
        if self.unfinished.load(Ordering::Relaxed) == 0 {
            return silence;
        }
        let unfinished = Wire::started(&self.since) + PARTIAL_TIMEOUT;
        if unfinished <= silence.0 {
            (unfinished, Due::Unfinished)
        } else {
            silence
        }
    }
}
