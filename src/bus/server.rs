//! The embedded messagebus: a broadcast websocket server, a drop-in for the
//! Python ovos-messagebus on one machine.
//!
//! Like the Python bus it serves one route (`/core`), greets each client with a
//! `connected` message and relays every text frame, unparsed, to every client,
//! the sender included. Unlike it, every socket sets TCP_NODELAY, and nothing a
//! client does can grow the bus's memory without bound:
//! - what waits to be written to a client is bounded in bytes
//!   ([`CLIENT_QUEUE_BYTES`]): a client that stops reading is disconnected;
//!   the daemon's own client, in process ([`Hub::local`]), is never dropped,
//!   its senders wait instead;
//! - a message is at most [`MAX_FRAME_BYTES`], and what all clients have sent
//!   of messages not yet complete is bounded ([`PARTIAL_BYTES`]) and must be
//!   finished within [`PARTIAL_TIMEOUT`];
//! - connections are capped ([`MAX_CLIENTS`]) and must finish their handshake
//!   within [`HANDSHAKE_TIMEOUT`].
//!
//! At shutdown the daemon's own client leaves first (its last answers
//! relayed), then every connection is written what is queued for it and
//! closed, within [`DRAIN_TIMEOUT`].

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::handshake::server::{ErrorResponse, Request, Response};
use tokio_tungstenite::tungstenite::http::StatusCode;
use tokio_tungstenite::tungstenite::{Message as WsMessage, Utf8Bytes};

use super::MAX_FRAME_BYTES;
use crate::bus::tcp;
use crate::shutdown::Shutdown;
use wire::{Wire, Writer};

mod wire;

/// The route clients connect to.
pub const ROUTE: &str = "/core";
/// Bytes waiting to be written to one client before it counts as stuck and is
/// disconnected: room for a few of the largest messages.
pub const CLIENT_QUEUE_BYTES: usize = 4 * MAX_FRAME_BYTES;
/// Bytes waiting for the daemon's own client before its senders wait.
const OWN_QUEUE_BYTES: usize = 4 * MAX_FRAME_BYTES;
/// Bytes of messages not yet complete, summed over every client: past it,
/// a client whose own unfinished message is larger than
/// [`PARTIAL_SHARE_BYTES`] is disconnected (the one filling the pool, never
/// the one sending a small message into it).
pub const PARTIAL_BYTES: usize = 4 * MAX_FRAME_BYTES;
/// What every client may have unfinished whatever the others hold: its
/// handshake and any ordinary message always fit (over every connection,
/// `MAX_CLIENTS` times this on top of [`PARTIAL_BYTES`] at most).
pub const PARTIAL_SHARE_BYTES: usize = 64 * 1024;
/// How long a client may take to finish a message it started, from the
/// first byte of it.
pub const PARTIAL_TIMEOUT: Duration = Duration::from_secs(30);
/// Connections served at once; more are closed at once (logged).
pub const MAX_CLIENTS: usize = 256;
/// How long a connection may take to finish its websocket handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// At shutdown: how long the daemon's own client may take to leave, and then
/// each connection to be written what is queued for it and closed.
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(1);
/// Said in every handshake answer: this bus sets TCP_NODELAY on its sockets,
/// so its clients need not hurry their ACKs (see `bus::tcp`).
pub const NODELAY_HEADER: &str = "x-toolboxd-nodelay";
/// What a client receives first, as from the Python ovos-messagebus.
const CONNECTED: &str =
    r#"{"type": "connected", "data": {}, "context": {"session": {"session_id": "default"}}}"#;

/// Where frames for one client wait: a channel to its writer, bounded in bytes.
struct Queue {
    /// Frames for the writer task.
    tx: mpsc::UnboundedSender<Utf8Bytes>,
    /// How the bytes waiting are bounded.
    budget: Budget,
}

/// How the bytes waiting for one client are bounded.
#[derive(Clone)]
enum Budget {
    /// A socket client: bytes queued and not yet written; past
    /// [`CLIENT_QUEUE_BYTES`] the client is disconnected: its queue is taken
    /// away and `kick` ends its connection (its writer may be blocked on a
    /// socket nobody reads).
    Drop {
        queued: Arc<AtomicUsize>,
        kick: Arc<tokio::sync::Notify>,
    },
    /// The daemon's own client: room left, in bytes ([`OWN_QUEUE_BYTES`]);
    /// when there is none its senders wait.
    Wait(Arc<tokio::sync::Semaphore>),
}

impl Budget {
    /// A frame of `n` bytes left the queue.
    fn release(&self, n: usize) {
        match self {
            Budget::Drop { queued, .. } => {
                queued.fetch_sub(n, Ordering::Relaxed);
            }
            Budget::Wait(room) => room.add_permits(n),
        }
    }
}

/// Every connected client's queue, by connection number.
#[derive(Default)]
struct Clients {
    /// Queues of frames waiting to be written to each client.
    queues: RwLock<HashMap<u64, Queue>>,
    /// Numbers connections.
    next: AtomicU64,
    /// Connections open now (handshake included), for [`MAX_CLIENTS`].
    open: AtomicUsize,
    /// Bytes of unfinished messages, over every client, for [`PARTIAL_BYTES`].
    partial: Arc<AtomicUsize>,
    /// In-process clients attached ([`Hub::local`]): shutdown waits for
    /// them to leave, so that their last frames are relayed.
    locals: tokio::sync::watch::Sender<usize>,
    /// Refused connections logged: one line a second, with how many were
    /// not, so that a client reconnecting in a loop cannot flood the log.
    refusals: std::sync::Mutex<crate::throttle::LogBudget>,
}

impl Clients {
    /// Logs a refused connection, within [`Clients::refusals`].
    fn refused(&self, peer: SocketAddr, why: &str) {
        let mut refusals = self.refusals.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(repeated) = refusals.take() {
            tracing::warn!(%peer, repeated, "bus: refused a connection: {why}");
        }
    }

    /// Relays one frame to every client: clients whose queue it would push
    /// past [`CLIENT_QUEUE_BYTES`] are disconnected; the daemon's own client
    /// is waited for — except for the echo of its own frames (`from_own`),
    /// which is skipped when its queue is full, so that its connection never
    /// waits on itself.
    async fn broadcast(&self, frame: &Utf8Bytes, from_own: bool) {
        let mut stuck = Vec::new();
        let mut own = Vec::new();
        {
            let queues = self.queues.read().unwrap_or_else(|e| e.into_inner());
            for (&id, queue) in queues.iter() {
                match &queue.budget {
                    Budget::Drop { queued, .. } => {
                        let n = frame.len();
                        let after = queued.fetch_add(n, Ordering::Relaxed) + n;
                        if after > CLIENT_QUEUE_BYTES || queue.tx.send(frame.clone()).is_err() {
                            queued.fetch_sub(n, Ordering::Relaxed);
                            stuck.push(id);
                        }
                    }
                    Budget::Wait(room) => own.push((queue.tx.clone(), room.clone())),
                }
            }
        }
        for id in stuck {
            tracing::warn!(
                id,
                "bus client is not reading (more than {CLIENT_QUEUE_BYTES} bytes waiting for \
                 it); disconnecting it"
            );
            self.remove(id);
        }
        // A frame is at most MAX_FRAME_BYTES, far below u32::MAX.
        let n = frame.len() as u32;
        for (tx, room) in own {
            let taken = if from_own {
                room.try_acquire_many(n).ok()
            } else {
                room.acquire_many(n).await.ok()
            };
            if let Some(permit) = taken {
                permit.forget(); // given back by Budget::release
                if tx.send(frame.clone()).is_err() {
                    room.add_permits(n as usize);
                }
            }
        }
    }

    /// Adds a client's queue; its number among the clients.
    fn register(&self, queue: Queue) -> u64 {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        self.queues
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id, queue);
        id
    }

    /// Takes a client's queue away: its writer ends once it has written
    /// what was queued, whoever waits for room in it stops waiting, and
    /// its connection is told to end (unless it is draining the queue).
    fn remove(&self, id: u64) {
        let queue = self
            .queues
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&id);
        match queue.map(|queue| queue.budget) {
            Some(Budget::Drop { kick, .. }) => kick.notify_one(),
            Some(Budget::Wait(room)) => room.close(),
            None => {}
        }
    }
}

/// Counts a connection as open until dropped.
struct Open<'a>(&'a AtomicUsize);

impl Drop for Open<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Takes a connection's queue away when dropped, however its task ends (a
/// panic included), so no broadcast keeps filling it.
struct Registered<'a> {
    /// The clients it is among.
    clients: &'a Clients,
    /// Its number there.
    id: u64,
}

impl Drop for Registered<'_> {
    fn drop(&mut self) {
        self.clients.remove(self.id);
    }
}

/// The embedded bus's clients: what its connections share, and what the
/// daemon joins in process ([`Hub::local`]) when it serves the bus itself.
#[derive(Clone, Default)]
pub struct Hub {
    /// Every client's queue.
    clients: Arc<Clients>,
}

impl Hub {
    /// A bus with no client yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Joins the bus from inside this process, as the daemon's own client
    /// (never dropped: when its queue is full, other senders wait). Frames
    /// pass as shared buffers: no socket, no websocket framing, no copy.
    /// One per bus: a second one's frames would be skipped by the first when
    /// its queue is full, as its own echoes are.
    pub fn local(&self) -> LocalPeer {
        self.clients.locals.send_modify(|n| *n += 1);
        let (tx, rx) = mpsc::unbounded_channel();
        let budget = Budget::Wait(Arc::new(tokio::sync::Semaphore::new(OWN_QUEUE_BYTES)));
        let id = self.clients.register(Queue {
            tx,
            budget: budget.clone(),
        });
        tracing::debug!(id, "bus client connected in process");
        LocalPeer {
            id,
            inbox: Inbox { rx, budget },
            clients: self.clients.clone(),
        }
    }
}

/// The daemon's own client of the bus it serves, in process: what
/// [`Hub::local`] gives. Leaves the bus when dropped.
pub struct LocalPeer {
    /// Its number among the clients.
    id: u64,
    /// The frames relayed to it.
    inbox: Inbox,
    /// The clients it sends to.
    clients: Arc<Clients>,
}

impl LocalPeer {
    /// The next frame relayed to this client (never `None` while the peer
    /// lives: only its drop takes its queue away).
    pub async fn recv(&mut self) -> Option<Utf8Bytes> {
        self.inbox.recv().await
    }

    /// A frame already relayed to this client, without waiting.
    pub fn try_recv(&mut self) -> Option<Utf8Bytes> {
        self.inbox.try_recv()
    }

    /// Relays `frame` to every client, this one included, as a frame it sent
    /// over a socket would be. Never waits on this client's own queue. A
    /// frame over [`MAX_FRAME_BYTES`] is not sent (a websocket client could
    /// not send it either): the daemon's answers are kept within it before.
    pub async fn send(&self, frame: Utf8Bytes) {
        if frame.len() > MAX_FRAME_BYTES {
            tracing::error!(
                bytes = frame.len(),
                "not relaying a frame of the daemon's over {MAX_FRAME_BYTES} bytes, the bus's limit"
            );
            return;
        }
        self.clients.broadcast(&frame, true).await;
    }
}

impl Drop for LocalPeer {
    fn drop(&mut self) {
        self.clients.remove(self.id);
        self.clients.locals.send_modify(|n| *n -= 1);
    }
}

/// Serves the bus on `listener` until shutdown, to the clients of `hub`;
/// then drains it (see the module's doc) and returns once every connection
/// is closed. Browsers are kept out: a connection with an `Origin` header is
/// accepted only from a loopback origin, unless `any_origin`.
pub async fn serve(listener: TcpListener, hub: Hub, mut shutdown: Shutdown, any_origin: bool) {
    let clients = hub.clients;
    let (drain, draining) = crate::shutdown::ShutdownTrigger::new();
    let mut connections = tokio::task::JoinSet::new();
    let mut accept_errors = crate::throttle::LogBudget::new(1);
    loop {
        let accepted = tokio::select! {
            a = listener.accept() => a,
            Some(_) = connections.join_next(), if !connections.is_empty() => continue,
            _ = shutdown.recv() => break,
        };
        match accepted {
            Ok((stream, peer)) => {
                if clients.open.fetch_add(1, Ordering::Relaxed) >= MAX_CLIENTS {
                    clients.open.fetch_sub(1, Ordering::Relaxed);
                    clients.refused(
                        peer,
                        &format!("{MAX_CLIENTS} clients are connected already"),
                    );
                    continue;
                }
                connections.spawn(client(
                    stream,
                    peer,
                    clients.clone(),
                    draining.clone(),
                    any_origin,
                ));
            }
            Err(e) => {
                // Out of fds and the like: back off a little instead of
                // spinning, and say so once a second at most.
                if let Some(dropped) = accept_errors.take() {
                    tracing::warn!(repeated = dropped, "bus accept failed: {e}");
                }
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
        }
    }
    drop(listener);
    // The daemon's own client relays its last answers as it leaves.
    let mut locals = clients.locals.subscribe();
    let gone = locals.wait_for(|n| *n == 0);
    if tokio::time::timeout(DRAIN_TIMEOUT, gone).await.is_err() {
        tracing::warn!(
            "the daemon's bus client did not leave within {DRAIN_TIMEOUT:?}; closing the bus"
        );
    }
    drain.trigger();
    while connections.join_next().await.is_some() {}
}

// The signature is tungstenite's handshake callback; its error type is theirs.
#[allow(clippy::result_large_err)]
fn check_request(
    request: &Request,
    response: Response,
    any_origin: bool,
    refused: impl FnOnce(&str),
) -> Result<Response, ErrorResponse> {
    let refuse = |status: StatusCode, why: String| {
        let mut refusal = ErrorResponse::new(Some(why));
        *refusal.status_mut() = status;
        Err(refusal)
    };
    let path = request.uri().path();
    if path != ROUTE && path != "/core/" {
        return refuse(
            StatusCode::NOT_FOUND,
            format!("no bus at {path}; connect to {ROUTE}\n"),
        );
    }
    if let Some(origin) = request.headers().get("origin") {
        let origin = origin.to_str().unwrap_or("");
        if !any_origin && !loopback_origin(origin) {
            refused(&format!(
                "it comes from a web page (Origin {:?} is not loopback)",
                crate::throttle::cut(origin, 200)
            ));
            return refuse(
                StatusCode::FORBIDDEN,
                "web pages may not use this bus (its Origin is not loopback)\n".to_owned(),
            );
        }
    }
    let mut response = response;
    response.headers_mut().insert(
        NODELAY_HEADER,
        tokio_tungstenite::tungstenite::http::HeaderValue::from_static("1"),
    );
    Ok(response)
}

/// Whether a browser `Origin` (`scheme://host[:port]`) is on this machine's
/// loopback. `null` (a local file, a sandboxed frame) is not.
fn loopback_origin(origin: &str) -> bool {
    let Some((_, rest)) = origin.split_once("://") else {
        return false;
    };
    let host = if let Some(v6) = rest.strip_prefix('[') {
        v6.split(']').next().unwrap_or("")
    } else {
        rest.split(':').next().unwrap_or("")
    };
    host.eq_ignore_ascii_case("localhost")
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// Serves one connection, from its handshake to its close.
async fn client(
    stream: TcpStream,
    peer: SocketAddr,
    clients: Arc<Clients>,
    mut shutdown: Shutdown,
    any_origin: bool,
) {
    let _open = Open(&clients.open);
    tcp::tune(&stream);
    // Re-armed after every read, so no client waits on a delayed ACK from us
    // (the embedded bus stalls no client, Nagle or not).
    let fd = tcp::Fd(std::os::fd::AsRawFd::as_raw_fd(&stream));
    let stream = Wire::new(stream, clients.partial.clone());
    let unfinished = stream.unfinished.clone();
    let since = stream.since.clone();
    // The signature is tungstenite's handshake callback; its error type is theirs.
    #[allow(clippy::result_large_err)]
    let check = |request: &Request, response: Response| {
        check_request(request, response, any_origin, |why| {
            clients.refused(peer, why)
        })
    };
    let handshake = tokio_tungstenite::accept_hdr_async_with_config(
        stream,
        check,
        Some(super::server_config()),
    );
    let handshake = tokio::select! {
        done = tokio::time::timeout(HANDSHAKE_TIMEOUT, handshake) => done,
        // The bus is closing: a handshake never holds it up.
        _ = shutdown.recv() => return,
    };
    let mut ws = match handshake {
        Ok(Ok(ws)) => ws,
        Ok(Err(e)) => {
            tracing::debug!(%peer, "bus handshake failed: {e}");
            return;
        }
        Err(_) => {
            tracing::debug!(%peer, "bus handshake not finished within {HANDSHAKE_TIMEOUT:?}; closing");
            return;
        }
    };
    // The handshake is not a message: an idle client owes nothing.
    Wire::settle(&unfinished, &clients.partial);
    // From here on the bus writes the socket, tungstenite only reads it.
    let Some((out, control)) = ws.get_mut().detach() else {
        return;
    };
    let mut writer = Writer::new(out, control);
    let (tx, rx) = mpsc::unbounded_channel();
    let kick = Arc::new(tokio::sync::Notify::new());
    // The greeting, queued first, is counted like any frame.
    let budget = Budget::Drop {
        queued: Arc::new(AtomicUsize::new(CONNECTED.len())),
        kick: kick.clone(),
    };
    let _ = tx.send(Utf8Bytes::from_static(CONNECTED));
    let mut rx = Inbox {
        rx,
        budget: budget.clone(),
    };
    let id = clients.register(Queue { tx, budget });
    let registered = Registered {
        clients: &clients,
        id,
    };
    tracing::debug!(%peer, id, "bus client connected");

    // Boxed, so that it can be finished after the select and then dropped.
    // It ends when the queue is taken away (this client was removed as
    // stuck, or the bus is draining and everything queued is written), or
    // when the socket fails.
    let mut writing = Box::pin(writer.run(&mut rx));
    let reader = async {
        loop {
            // A client in the middle of a message must finish it within
            // PARTIAL_TIMEOUT of its first byte, whenever that came: the
            // wait is woken at that deadline, or every PARTIAL_TIMEOUT.
            let mut next = ws.next();
            let frame = loop {
                let deadline = match unfinished.load(Ordering::Relaxed) {
                    0 => tokio::time::Instant::now() + PARTIAL_TIMEOUT,
                    _ => Wire::started(&since) + PARTIAL_TIMEOUT,
                };
                match tokio::time::timeout_at(deadline, &mut next).await {
                    Ok(frame) => break frame,
                    Err(_)
                        if unfinished.load(Ordering::Relaxed) > 0
                            && Wire::started(&since) + PARTIAL_TIMEOUT
                                <= tokio::time::Instant::now() =>
                    {
                        tracing::warn!(%peer, id, "bus client left a message unfinished for {PARTIAL_TIMEOUT:?}; disconnecting it");
                        return;
                    }
                    Err(_) => {}
                }
            };
            let Some(frame) = frame else { return };
            tcp::quickack(&fd);
            match &frame {
                // A ping or pong may come between the fragments of a
                // message, which stays unfinished: only the control
                // frame's own bytes (a masked client frame: 6 + payload)
                // are given back.
                Ok(WsMessage::Ping(payload) | WsMessage::Pong(payload)) => {
                    Wire::release(&unfinished, &clients.partial, 6 + payload.len())
                }
                _ => Wire::settle(&unfinished, &clients.partial),
            }
            match frame {
                Ok(WsMessage::Text(text)) => clients.broadcast(&text, false).await,
                Ok(WsMessage::Close(_)) => return,
                Ok(_) => {}
                Err(e) => {
                    tracing::debug!(%peer, id, "bus client error: {e}");
                    return;
                }
            }
        }
    };
    // Whether what is queued for the client is still written.
    let finish = tokio::select! {
        _ = &mut writing => false,
        // It closed, or broke the protocol: the frame being written, and
        // what is queued, go out first (a client that reads gets them and
        // the reply to its close).
        _ = reader => true,
        // Removed as stuck: what is queued is dropped with the connection.
        _ = kick.notified() => false,
        // The bus is closing: what was queued for this client (the daemon's
        // last answers among it) is written first.
        _ = shutdown.recv() => true,
    };
    // Its queue closes: the writer ends once what is queued is written.
    drop(registered);
    // Never waits long on a client that does not read.
    let deadline = tokio::time::Instant::now() + DRAIN_TIMEOUT;
    if finish {
        let _ = tokio::time::timeout_at(deadline, &mut writing).await;
    }
    drop(writing);
    // Answers a client's Close (RFC 6455 §5.5.1: tungstenite has the reply
    // ready, the flush hands it to the writer), or says goodbye.
    let _ = tokio::time::timeout_at(deadline, ws.flush()).await;
    let _ = tokio::time::timeout_at(deadline, writer.goodbye()).await;
    tracing::debug!(%peer, id, "bus client disconnected");
}

/// The receiving end of a client's queue.
struct Inbox {
    /// Frames to write.
    rx: mpsc::UnboundedReceiver<Utf8Bytes>,
    /// Given back what each frame took, as it leaves.
    budget: Budget,
}

impl Inbox {
    async fn recv(&mut self) -> Option<Utf8Bytes> {
        let frame = self.rx.recv().await;
        self.taken(frame)
    }

    fn try_recv(&mut self) -> Option<Utf8Bytes> {
        let frame = self.rx.try_recv().ok();
        self.taken(frame)
    }

    /// A frame left the queue: it no longer counts against the client.
    fn taken(&self, frame: Option<Utf8Bytes>) -> Option<Utf8Bytes> {
        if let Some(frame) = &frame {
            self.budget.release(frame.len());
        }
        frame
    }
}

#[cfg(test)]
mod tests;
