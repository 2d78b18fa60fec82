//! The daemon's client of the bus: a websocket that reconnects with backoff,
//! or, on the bus the daemon serves itself, a link in process.
//!
//! [`run`] owns the connection ([`run_local`] the link): incoming text frames
//! go to a callback that must not block (the service spawns a task per
//! request), outgoing frames come from a channel that outlives reconnections.

use std::time::Duration;

use futures_util::{FutureExt, SinkExt, StreamExt};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, watch};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::Message as WsMessage;
use tokio_tungstenite::WebSocketStream;

use crate::bus::tcp;
use crate::shutdown::Shutdown;

/// Most incoming frames handled in a row before the client looks at what
/// it has to send.
const MAX_BURST: usize = 64;

/// A websocket connection to the bus.
pub type WsStream = WebSocketStream<TcpStream>;

/// An open connection to the bus.
pub struct Connection {
    /// The websocket.
    pub ws: WsStream,
    /// The bus is toolboxd's own (it said so in its handshake answer): it
    /// sets TCP_NODELAY, so delayed ACKs cost nothing and TCP_QUICKACK need
    /// not be re-armed after every read (one system call less per burst).
    pub nodelay_peer: bool,
}

/// Why the bus could not be reached.
#[derive(Debug, thiserror::Error)]
pub enum BusError {
    #[error("bus URL {url:?} is not valid: {why}; use e.g. ws://127.0.0.1:8181/core")]
    BadUrl { url: String, why: String },
    #[error("cannot connect to the bus at {url}: {source}; is the messagebus running?")]
    Connect { url: String, source: std::io::Error },
    #[error("websocket handshake with {url} failed: {why}")]
    Handshake { url: String, why: String },
}

/// How long the bus may take to answer the websocket handshake once the TCP
/// connection is made.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// What a failed handshake says about the bus, and what to do.
fn handshake_failure(e: &tokio_tungstenite::tungstenite::Error) -> String {
    use tokio_tungstenite::tungstenite::error::ProtocolError;
    use tokio_tungstenite::tungstenite::Error;
    match e {
        Error::Http(response) if response.status().as_u16() == 404 => {
            "the bus answered 404: nothing is served at that route; check the route (usually /core)"
                .to_owned()
        }
        Error::Http(response) => {
            let body = response
                .body()
                .as_deref()
                .map(String::from_utf8_lossy)
                .unwrap_or_default();
            format!(
                "the bus refused the websocket with HTTP {}: {}",
                response.status(),
                crate::util::throttle::cut(body.trim(), 200)
            )
        }
        Error::Protocol(ProtocolError::HandshakeIncomplete)
        | Error::ConnectionClosed
        | Error::AlreadyClosed => "the bus closed the connection before answering the handshake \
             (it may be refusing connections: full, or limiting this client); retrying"
            .to_owned(),
        Error::Io(io) => format!(
            "the connection failed during the handshake: {io} (the bus may be refusing \
             connections: full, or limiting this client); retrying"
        ),
        other => format!("{other}; is a messagebus listening there?"),
    }
}

impl BusError {
    /// Nothing listens at the address (so `run` may serve the bus itself).
    pub fn is_refused(&self) -> bool {
        matches!(self, BusError::Connect { source, .. }
            if source.kind() == std::io::ErrorKind::ConnectionRefused)
    }
}

/// Connects once: TCP with TCP_NODELAY and TCP_QUICKACK, then the websocket
/// handshake.
pub async fn connect(url: &str) -> Result<Connection, BusError> {
    let (request, host, port) = parse(url)?;
    let stream = TcpStream::connect((host.as_str(), port))
        .await
        .map_err(|source| BusError::Connect {
            url: url.to_owned(),
            source,
        })?;
    tcp::tune(&stream);
    let handshake =
        tokio_tungstenite::client_async_with_config(request, stream, Some(super::client_config()));
    let handshake = tokio::time::timeout(HANDSHAKE_TIMEOUT, handshake)
        .await
        .map_err(|_| BusError::Handshake {
            url: url.to_owned(),
            why: format!(
                "the bus accepted the connection but did not answer the handshake within \
                 {HANDSHAKE_TIMEOUT:?} (overloaded, or not a messagebus?)"
            ),
        })?;
    let (ws, response) = handshake.map_err(|e| BusError::Handshake {
        url: url.to_owned(),
        why: handshake_failure(&e),
    })?;
    let nodelay_peer = response
        .headers()
        .contains_key(super::server::NODELAY_HEADER);
    Ok(Connection { ws, nodelay_peer })
}

/// The request, host and port of a `ws://` URL.
fn parse(
    url: &str,
) -> Result<
    (
        tokio_tungstenite::tungstenite::handshake::client::Request,
        String,
        u16,
    ),
    BusError,
> {
    let bad = |why: String| BusError::BadUrl {
        url: url.to_owned(),
        why,
    };
    let request = url.into_client_request().map_err(|e| bad(e.to_string()))?;
    let uri = request.uri();
    if uri.scheme_str() != Some("ws") {
        return Err(bad(
            "only ws:// is supported (put a TLS proxy in front for wss://)".to_owned(),
        ));
    }
    let host = uri.host().ok_or_else(|| bad("no host".to_owned()))?;
    let host = host
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_owned();
    let port = uri.port_u16().unwrap_or(80);
    Ok((request, host, port))
}

/// The socket address a `ws://` URL names (for serving a bus there).
pub async fn socket_addr(url: &str) -> Result<std::net::SocketAddr, BusError> {
    let (_, host, port) = parse(url)?;
    let not_found = |why: String| BusError::BadUrl {
        url: url.to_owned(),
        why,
    };
    let mut addrs = tokio::net::lookup_host((host.as_str(), port))
        .await
        .map_err(|e| not_found(e.to_string()))?;
    addrs
        .next()
        .ok_or_else(|| not_found(format!("{host} has no address")))
}

/// Keeps a connection to `url` until shutdown: reconnects with backoff (100 ms
/// doubling to 5 s), hands every incoming text frame to `on_frame` (with no
/// sender: an external bus does not say who sent a frame), sends every
/// frame from `outgoing`. `connected` tells whether a connection is up.
/// `first` is a connection already made.
pub async fn run(
    url: String,
    first: Option<Connection>,
    mut outgoing: mpsc::UnboundedReceiver<String>,
    mut on_frame: impl FnMut(&str, Option<super::server::Peer>),
    connected: watch::Sender<bool>,
    mut shutdown: Shutdown,
) {
    let mut next = first;
    let mut delay = Duration::from_millis(100);
    loop {
        let Connection { ws, nodelay_peer } = match next.take() {
            Some(connection) => connection,
            None => {
                let attempt = tokio::select! {
                    r = connect(&url) => r,
                    _ = shutdown.recv() => return,
                };
                match attempt {
                    Ok(ws) => ws,
                    Err(e) => {
                        tracing::warn!("{e}; retrying in {} ms", delay.as_millis());
                        tokio::select! {
                            _ = tokio::time::sleep(delay) => {}
                            _ = shutdown.recv() => return,
                        }
                        delay = (delay * 2).min(Duration::from_secs(5));
                        continue;
                    }
                }
            }
        };
        delay = Duration::from_millis(100);
        tracing::info!(bus = %url, "connected to the bus");
        let _ = connected.send(true);
        let fd = {
            use std::os::fd::AsRawFd;
            ws.get_ref().as_raw_fd()
        };
        let (mut sink, mut stream) = ws.split();
        let ended = loop {
            tokio::select! {
                frame = stream.next() => {
                    // Every frame already read is handled before the loop
                    // waits again, and the ACK re-armed once for them all:
                    // one system call a burst, not one a frame.
                    let mut frame = frame;
                    let mut handled = 0;
                    let ended = loop {
                        handled += 1;
                        match frame {
                            Some(Ok(WsMessage::Text(text))) => on_frame(text.as_str(), None),
                            Some(Ok(WsMessage::Close(_))) | None => {
                                break Some("the bus closed the connection".to_owned())
                            }
                            Some(Ok(_)) => {}
                            Some(Err(e)) => break Some(format!("bus connection failed: {e}")),
                        }
                        // At most a burst's worth, so sending is never starved.
                        match (handled < MAX_BURST)
                            .then(|| stream.next().now_or_never())
                            .flatten()
                        {
                            Some(next) => frame = next,
                            None => break None,
                        }
                    };
                    if let Some(ended) = ended {
                        break ended;
                    }
                    if !nodelay_peer {
                        tcp::quickack(&tcp::Fd(fd));
                    }
                }
                frame = outgoing.recv() => {
                    let Some(frame) = frame else { return };
                    let mut result = sink.feed(WsMessage::text(frame)).await;
                    // Send whatever else is queued before flushing once.
                    while result.is_ok() {
                        match outgoing.try_recv() {
                            Ok(more) => result = sink.feed(WsMessage::text(more)).await,
                            Err(_) => break,
                        }
                    }
                    if let Err(e) = result.and(sink.flush().await) {
                        break format!("writing to the bus failed: {e}");
                    }
                }
                _ = shutdown.recv() => {
                    // Answers queued by the last calls still go out.
                    while let Ok(frame) = outgoing.try_recv() {
                        if sink.feed(WsMessage::text(frame)).await.is_err() {
                            break;
                        }
                    }
                    let _ = sink.flush().await;
                    let _ = sink.close().await;
                    return;
                }
            }
        };
        let _ = connected.send(false);
        tracing::warn!(bus = %url, "{ended}; reconnecting");
    }
}

/// [`run`] on the bus this process serves (`peer`, from
/// [`super::server::Hub::local`]): the same hand-over of frames, in bursts,
/// each with the peer that sent it (`None` for the daemon's own),
/// with no socket between, until shutdown; nothing to reconnect.
pub async fn run_local(
    url: String,
    mut peer: super::server::LocalPeer,
    mut outgoing: mpsc::UnboundedReceiver<String>,
    mut on_frame: impl FnMut(&str, Option<super::server::Peer>),
    connected: watch::Sender<bool>,
    mut shutdown: Shutdown,
) {
    tracing::info!(bus = %url, in_process = true, "connected to the bus");
    let _ = connected.send(true);
    loop {
        tokio::select! {
            frame = peer.recv() => {
                let Some(frame) = frame else { break };
                on_frame(frame.as_str(), frame.from());
                // At most a burst's worth, so sending is never starved.
                for _ in 1..MAX_BURST {
                    let Some(frame) = peer.try_recv() else { break };
                    on_frame(frame.as_str(), frame.from());
                }
            }
            frame = outgoing.recv() => {
                let Some(frame) = frame else { break };
                peer.send(frame.into()).await;
                // At most a burst's worth, so receiving is never starved.
                for _ in 1..MAX_BURST {
                    let Ok(frame) = outgoing.try_recv() else { break };
                    peer.send(frame.into()).await;
                }
            }
            _ = shutdown.recv() => {
                // Answers queued by the last calls still go out: the bus
                // waits for this peer to leave before it closes.
                while let Ok(frame) = outgoing.try_recv() {
                    peer.send(frame.into()).await;
                }
                break;
            }
        }
    }
    let _ = connected.send(false);
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// What `connect` says of a server that reads the handshake and then
    /// writes `answer` (nothing: it closes).
    async fn refusal(answer: &'static [u8]) -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("ws://{}/core", listener.local_addr().unwrap());
        tokio::spawn(async move {
            let (mut socket, _) = listener.accept().await.unwrap();
            let _ = socket.read(&mut [0u8; 4096]).await;
            let _ = socket.write_all(answer).await;
        });
        match super::connect(&url).await {
            Ok(_) => panic!("a bus that refuses was connected to"),
            Err(e) => e.to_string(),
        }
    }

    #[tokio::test]
    async fn a_failed_handshake_says_what_the_bus_did() {
        let closed = refusal(b"").await;
        assert!(
            closed.contains("closed the connection before answering the handshake"),
            "{closed}"
        );
        assert!(!closed.contains("route"), "{closed}");
        let missing = refusal(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n").await;
        assert!(
            missing.contains("404") && missing.contains("check the route"),
            "{missing}"
        );
        let busy =
            refusal(b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 5\r\n\r\nfull\n").await;
        assert!(busy.contains("503") && busy.contains("full"), "{busy}");
    }
}
