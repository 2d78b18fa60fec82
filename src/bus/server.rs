//! The embedded messagebus: a broadcast websocket server, a drop-in for the
//! Python ovos-messagebus on one machine.
//!
//! Like the Python bus it serves one route (`/core`), greets each client with a
//! `connected` message and relays every text frame, unparsed, to every client,
//! the sender included. Unlike it, every socket sets TCP_NODELAY, and nothing a
//! client does can grow the bus's memory without bound, or take from the
//! others what all share:
//! - what waits to be written to a client is bounded ([`queue`]): a sender
//!   whose frames wait for others past its share is not read until they are
//!   written (a flooder is slowed, its readers are not dropped); a client
//!   that takes nothing for [`STUCK_TIMEOUT`], or lets
//!   [`CLIENT_QUEUE_BYTES`] pile up, is disconnected; the daemon's own
//!   client, in process ([`Hub::local`]), is never dropped, its senders wait
//!   instead;
//! - a message is at most [`MAX_FRAME_BYTES`], and what all clients have sent
//!   of messages not yet complete is bounded ([`PARTIAL_BYTES`], of which
//!   each may always use [`PARTIAL_SHARE_BYTES`]) and must be finished
//!   within [`PARTIAL_TIMEOUT`] of its first byte;
//! - connections are capped ([`MAX_CLIENTS`], of which one peer may hold
//!   [`MAX_PER_PEER`]), must finish their handshake within
//!   [`HANDSHAKE_TIMEOUT`], and are pinged after [`IDLE_PING`] of silence
//!   and closed if that ping is not answered within [`PING_TIMEOUT`].
//!
//! At shutdown the daemon's own client leaves first (its last answers
//! relayed), then every connection is written what is queued for it and
//! closed, within [`DRAIN_TIMEOUT`].

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use futures_util::SinkExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::handshake::server::{ErrorResponse, Request, Response};
use tokio_tungstenite::tungstenite::http::StatusCode;
use tokio_tungstenite::tungstenite::Utf8Bytes;

use super::MAX_FRAME_BYTES;
use crate::bus::tcp;
use crate::shutdown::Shutdown;
pub use peer::Peer;
use queue::{Behind, Budget, Inbox, Origin, Queue};
pub use queue::{Relayed, CLIENT_QUEUE_BYTES, SENDER_SHARE_BYTES, STUCK_TIMEOUT};
use reading::Reading;
use wire::{Wire, Writer};

mod peer;
mod queue;
mod reading;
mod wire;

/// The route clients connect to.
pub const ROUTE: &str = "/core";
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
/// Connections served at once; more are closed at once (logged). Room for
/// a few hundred clients of one user within its share, and for everyone
/// else's beside them; a connection costs the bus its 32 KiB read buffer
/// while it is open.
pub const MAX_CLIENTS: usize = 512;
/// Connections one peer ([`Peer`]: on loopback, one user) may hold: the
/// others always have a quarter of [`MAX_CLIENTS`].
pub const MAX_PER_PEER: usize = MAX_CLIENTS * 3 / 4;
/// How long a connection may take to finish its websocket handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Silence from a client (no frame read) after which the bus pings it.
pub const IDLE_PING: Duration = Duration::from_secs(20);
/// How long a pinged client has to send anything (its pong) before it is
/// closed as gone.
pub const PING_TIMEOUT: Duration = Duration::from_secs(20);
/// At shutdown: how long the daemon's own client may take to leave, and then
/// each connection to be written what is queued for it and closed.
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(1);
/// Said in every handshake answer: this bus sets TCP_NODELAY on its sockets,
/// so its clients need not hurry their ACKs (see `bus::tcp`).
pub const NODELAY_HEADER: &str = "x-toolboxd-nodelay";
/// What a client receives first, as from the Python ovos-messagebus.
const CONNECTED: &str =
    r#"{"type": "connected", "data": {}, "context": {"session": {"session_id": "default"}}}"#;
/// A ping with no payload, as the bus sends it (unmasked, RFC 6455 §5.5.2).
const PING: [u8; 2] = [0x89, 0x00];

/// Every connected client's queue, by connection number.
#[derive(Default)]
struct Clients {
    /// Queues of frames waiting to be written to each client.
    queues: RwLock<HashMap<u64, Queue>>,
    /// Numbers connections.
    next: AtomicU64,
    /// Connections open now (handshake included), for [`MAX_CLIENTS`].
    open: AtomicUsize,
    /// Connections open now by peer, for [`MAX_PER_PEER`].
    by_peer: std::sync::Mutex<HashMap<Peer, usize>>,
    /// Bytes of unfinished messages, over every client, for [`PARTIAL_BYTES`].
    partial: Arc<AtomicUsize>,
    /// In-process clients attached ([`Hub::local`]): shutdown waits for
    /// them to leave, so that their last frames are relayed.
    locals: tokio::sync::watch::Sender<usize>,
    /// Refused connections logged: one line a second, with how many were
    /// not, so that a client reconnecting in a loop cannot flood the log.
    refusals: std::sync::Mutex<crate::util::throttle::LogBudget>,
}

impl Clients {
    /// Logs a refused connection, within [`Clients::refusals`].
    fn refused(&self, peer: SocketAddr, why: &str) {
        let mut refusals = self.refusals.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(repeated) = refusals.take() {
            tracing::warn!(%peer, repeated, "bus: refused a connection: {why}");
        }
    }

    /// Counts one more connection of `peer`; false (nothing counted) when
    /// it holds its share already.
    fn join(&self, peer: Peer) -> bool {
        let mut by_peer = self.by_peer.lock().unwrap_or_else(|e| e.into_inner());
        let held = by_peer.entry(peer).or_default();
        if *held >= MAX_PER_PEER {
            return false;
        }
        *held += 1;
        true
    }

    /// A connection of `peer` ended.
    fn leave(&self, peer: Peer) {
        let mut by_peer = self.by_peer.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(held) = by_peer.get_mut(&peer) {
            *held -= 1;
            if *held == 0 {
                by_peer.remove(&peer);
            }
        }
    }

    /// Relays one frame, sent by `origin` (`None`: the daemon's own client),
    /// to every client: clients whose queue it would push past
    /// [`CLIENT_QUEUE_BYTES`] are disconnected; the daemon's own client is
    /// waited for — except for the echo of its own frames, which is skipped
    /// when its queue is full, so that its connection never waits on itself.
    async fn broadcast(&self, frame: &Utf8Bytes, origin: Option<&Arc<Origin>>) {
        let mut stuck = Vec::new();
        let mut own = Vec::new();
        {
            let queues = self.queues.read().unwrap_or_else(|e| e.into_inner());
            for (&id, queue) in queues.iter() {
                match &queue.budget {
                    Budget::Drop(behind) => {
                        if !behind.take_in(frame.len()) {
                            stuck.push(id);
                        } else if let Err(refused) = queue
                            .tx
                            .send(Relayed::new(frame.clone(), origin.filter(|o| o.id != id)))
                        {
                            behind.queued.fetch_sub(frame.len(), Ordering::Relaxed);
                            drop(refused);
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
            let taken = if origin.is_none() {
                room.try_acquire_many(n).ok()
            } else {
                room.acquire_many(n).await.ok()
            };
            if let Some(permit) = taken {
                permit.forget(); // given back as the frame is taken (Inbox)
                if tx.send(Relayed::new(frame.clone(), origin)).is_err() {
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
            Some(Budget::Drop(behind)) => behind.kick.notify_one(),
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
    pub async fn recv(&mut self) -> Option<Relayed> {
        self.inbox.recv().await
    }

    /// A frame already relayed to this client, without waiting.
    pub fn try_recv(&mut self) -> Option<Relayed> {
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
        self.clients.broadcast(&frame, None).await;
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
    let mut accept_errors = crate::util::throttle::LogBudget::new(1);
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
                crate::util::throttle::cut(origin, 200)
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
    addr: SocketAddr,
    clients: Arc<Clients>,
    mut shutdown: Shutdown,
    any_origin: bool,
) {
    let _open = Open(&clients.open);
    let who = match stream.local_addr() {
        Ok(local) => Peer::of(addr, local),
        Err(_) => Peer::Addr(addr.ip()),
    };
    if !clients.join(who) {
        clients.refused(
            addr,
            &format!("{who} holds {MAX_PER_PEER} connections already, its share of {MAX_CLIENTS}"),
        );
        return;
    }
    let _joined = Joined {
        clients: &clients,
        peer: who,
    };
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
            clients.refused(addr, why)
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
            tracing::debug!(peer = %addr, "bus handshake failed: {e}");
            return;
        }
        Err(_) => {
            tracing::debug!(peer = %addr, "bus handshake not finished within {HANDSHAKE_TIMEOUT:?}; closing");
            return;
        }
    };
    // The handshake is not a message: an idle client owes nothing.
    Wire::settle(&unfinished, &clients.partial);
    // From here on the bus writes the socket, tungstenite only reads it.
    let Some(wire::Detached {
        out,
        control,
        pinger,
    }) = ws.get_mut().detach()
    else {
        return;
    };
    let mut writer = Writer::new(out, control);
    let (tx, rx) = mpsc::unbounded_channel();
    // The greeting, queued first, is counted like any frame.
    let behind = Behind::new(CONNECTED.len());
    let _ = tx.send(Relayed::new(Utf8Bytes::from_static(CONNECTED), None));
    let budget = Budget::Drop(behind.clone());
    let mut rx = Inbox {
        rx,
        budget: budget.clone(),
    };
    let id = clients.register(Queue { tx, budget });
    let registered = Registered {
        clients: &clients,
        id,
    };
    tracing::debug!(peer = %addr, %who, id, "bus client connected");
    let reading = Reading {
        clients: &clients,
        origin: Origin::new(who, id),
        unfinished,
        since,
        pinger,
        fd,
        addr,
        id,
    };

    // Boxed, so that it can be finished after the select and then dropped.
    // It ends when the queue is taken away (this client was removed as
    // stuck, or the bus is draining and everything queued is written), or
    // when the socket fails.
    let mut writing = Box::pin(writer.run(&mut rx));
    // Whether what is queued for the client is still written.
    let finish = tokio::select! {
        _ = &mut writing => false,
        // It closed, or broke the protocol: the frame being written, and
        // what is queued, go out first (a client that reads gets them and
        // the reply to its close).
        _ = reading.run(&mut ws) => true,
        // Removed as stuck: what is queued is dropped with the connection.
        _ = behind.kick.notified() => false,
        _ = behind.stuck() => {
            tracing::warn!(
                peer = %addr, id,
                "bus client is not reading (it took nothing of what waits for it for \
                 {STUCK_TIMEOUT:?}); disconnecting it"
            );
            false
        }
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
    tracing::debug!(peer = %addr, id, "bus client disconnected");
}

/// Counts a connection against its peer's share until dropped.
struct Joined<'a> {
    clients: &'a Clients,
    peer: Peer,
}

impl Drop for Joined<'_> {
    fn drop(&mut self) {
        self.clients.leave(self.peer);
    }
}

#[cfg(test)]
mod tests;
