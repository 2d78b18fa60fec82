//! The embedded messagebus: a broadcast websocket server, a drop-in for the
//! Python ovos-messagebus on one machine.
//!
//! Like the Python bus it serves one route (`/core`), greets each client with a
//! `connected` message and relays every text frame, unparsed, to every client,
//! the sender included. Unlike it, every socket sets TCP_NODELAY, and each client
//! has a bounded queue: a client that stops reading is disconnected rather than
//! allowed to grow the bus's memory without bound.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use futures_util::{SinkExt, StreamExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::handshake::server::{ErrorResponse, Request, Response};
use tokio_tungstenite::tungstenite::http::StatusCode;
use tokio_tungstenite::tungstenite::{Message as WsMessage, Utf8Bytes};

use crate::bus::tcp;
use crate::shutdown::Shutdown;

/// The route clients connect to.
pub const ROUTE: &str = "/core";
/// Frames queued for one client before it counts as stuck and is dropped.
const CLIENT_QUEUE: usize = 16 * 1024;
/// What a client receives first, as from the Python ovos-messagebus.
const CONNECTED: &str =
    r#"{"type": "connected", "data": {}, "context": {"session": {"session_id": "default"}}}"#;

/// Every connected client's queue, by connection number.
#[derive(Default)]
struct Clients {
    /// Queues of frames waiting to be written to each client.
    queues: RwLock<HashMap<u64, mpsc::Sender<Utf8Bytes>>>,
    /// Numbers connections.
    next: AtomicU64,
}

impl Clients {
    /// Relays one frame to every client; returns the clients that were stuck.
    fn broadcast(&self, frame: &Utf8Bytes) -> Vec<u64> {
        let queues = self.queues.read().unwrap_or_else(|e| e.into_inner());
        queues
            .iter()
            .filter(|(_, q)| q.try_send(frame.clone()).is_err())
            .map(|(&id, _)| id)
            .collect()
    }

    fn remove(&self, id: u64) {
        self.queues
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&id);
    }
}

/// Serves the bus on `listener` until shutdown. Browsers are kept out: a
/// connection with an `Origin` header is accepted only from a loopback
/// origin, unless `any_origin`.
pub async fn serve(listener: TcpListener, mut shutdown: Shutdown, any_origin: bool) {
    let clients = Arc::new(Clients::default());
    loop {
        let accepted = tokio::select! {
            a = listener.accept() => a,
            _ = shutdown.recv() => return,
        };
        match accepted {
            Ok((stream, peer)) => {
                tokio::spawn(client(
                    stream,
                    peer,
                    clients.clone(),
                    shutdown.clone(),
                    any_origin,
                ));
            }
            Err(e) => {
                // Out of fds and the like: back off a little instead of spinning.
                tracing::warn!("bus accept failed: {e}");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
        }
    }
}

// The signature is tungstenite's handshake callback; its error type is theirs.
#[allow(clippy::result_large_err)]
fn check_request(
    request: &Request,
    response: Response,
    any_origin: bool,
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
            tracing::warn!(
                origin,
                "bus: refused a connection from a web page (non-loopback Origin)"
            );
            return refuse(
                StatusCode::FORBIDDEN,
                "web pages may not use this bus (its Origin is not loopback)\n".to_owned(),
            );
        }
    }
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

async fn client(
    stream: TcpStream,
    peer: SocketAddr,
    clients: Arc<Clients>,
    mut shutdown: Shutdown,
    any_origin: bool,
) {
    tcp::tune(&stream);
    // The signature is tungstenite's handshake callback; its error type is theirs.
    #[allow(clippy::result_large_err)]
    let check =
        move |request: &Request, response: Response| check_request(request, response, any_origin);
    let ws = match tokio_tungstenite::accept_hdr_async_with_config(
        stream,
        check,
        Some(super::ws_config()),
    )
    .await
    {
        Ok(ws) => ws,
        Err(e) => {
            tracing::debug!(%peer, "bus handshake failed: {e}");
            return;
        }
    };
    let id = clients.next.fetch_add(1, Ordering::Relaxed);
    let (tx, mut rx) = mpsc::channel::<Utf8Bytes>(CLIENT_QUEUE);
    let _ = tx.try_send(Utf8Bytes::from_static(CONNECTED));
    clients
        .queues
        .write()
        .unwrap_or_else(|e| e.into_inner())
        .insert(id, tx);
    tracing::debug!(%peer, id, "bus client connected");
    // Re-armed after every read, so no client waits on a delayed ACK from us
    // (the embedded bus stalls no client, Nagle or not).
    let fd = std::os::fd::AsRawFd::as_raw_fd(ws.get_ref());
    let (mut sink, mut source) = ws.split();

    let writer = async {
        while let Some(frame) = rx.recv().await {
            if sink.feed(WsMessage::Text(frame)).await.is_err() {
                return;
            }
            while let Ok(more) = rx.try_recv() {
                if sink.feed(WsMessage::Text(more)).await.is_err() {
                    return;
                }
            }
            if sink.flush().await.is_err() {
                return;
            }
        }
        // The queue was dropped: this client was removed as stuck.
        let _ = sink.close().await;
    };
    let reader = async {
        while let Some(frame) = source.next().await {
            tcp::quickack(&tcp::Fd(fd));
            match frame {
                Ok(WsMessage::Text(text)) => {
                    for stuck in clients.broadcast(&text) {
                        tracing::warn!(id = stuck, "bus client is not reading; disconnecting it");
                        clients.remove(stuck);
                    }
                }
                Ok(WsMessage::Close(_)) => return,
                Ok(_) => {}
                Err(e) => {
                    tracing::debug!(%peer, id, "bus client error: {e}");
                    return;
                }
            }
        }
    };
    tokio::select! {
        _ = writer => {}
        _ = reader => {}
        _ = shutdown.recv() => {}
    }
    clients.remove(id);
    tracing::debug!(%peer, id, "bus client disconnected");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_loopback_origins_pass() {
        for ok in [
            "http://localhost:8080",
            "http://127.0.0.1",
            "https://[::1]:3000",
            "http://127.8.9.1",
        ] {
            assert!(loopback_origin(ok), "{ok}");
        }
        for bad in [
            "null",
            "http://evil.example",
            "http://192.168.1.5",
            "http://localhost.evil.example",
            "",
        ] {
            assert!(!loopback_origin(bad), "{bad}");
        }
    }
}
