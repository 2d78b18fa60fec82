//! The embedded bus: its handshake, the in-process client, shutdown, origins.

use super::*;
use futures_util::StreamExt;
use tokio_tungstenite::tungstenite::Message as WsMessage;

#[tokio::test]
async fn the_handshake_says_this_bus_sets_nodelay() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("ws://{}{ROUTE}", listener.local_addr().unwrap());
    let (trigger, shutdown) = crate::shutdown::ShutdownTrigger::new();
    let bus = tokio::spawn(serve(listener, Hub::new(), shutdown, false));
    let connection = crate::bus::client::connect(&url).await.unwrap();
    assert!(
        connection.nodelay_peer,
        "a client of this bus skips QUICKACK"
    );
    drop(connection);
    trigger.trigger();
    let _ = bus.await;
}

/// A bus on a loopback port with the daemon's in-process client on it,
/// a websocket client past its greeting, and the bus's shutdown.
async fn bus_with_a_local_peer() -> (
    LocalPeer,
    crate::bus::client::WsStream,
    (crate::shutdown::ShutdownTrigger, Shutdown),
    tokio::task::JoinHandle<()>,
) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("ws://{}{ROUTE}", listener.local_addr().unwrap());
    let (trigger, shutdown) = crate::shutdown::ShutdownTrigger::new();
    let hub = Hub::new();
    let peer = hub.local();
    let bus = tokio::spawn(serve(listener, hub, shutdown.clone(), false));
    let mut ws = crate::bus::client::connect(&url).await.unwrap().ws;
    let hello = ws.next().await.unwrap().unwrap();
    assert!(hello.to_text().unwrap().contains("connected"));
    (peer, ws, (trigger, shutdown), bus)
}

#[tokio::test]
async fn the_local_peer_and_a_socket_client_hear_each_other() {
    let (mut peer, mut ws, (trigger, _), bus) = bus_with_a_local_peer().await;
    ws.send(WsMessage::text("from the socket")).await.unwrap();
    assert_eq!(peer.recv().await.unwrap().as_str(), "from the socket");
    peer.send(Utf8Bytes::from_static("from inside")).await;
    // Relayed to every client, the sender included.
    let echoed = ws.next().await.unwrap().unwrap();
    assert_eq!(echoed.to_text().unwrap(), "from the socket");
    let heard = ws.next().await.unwrap().unwrap();
    assert_eq!(heard.to_text().unwrap(), "from inside");
    assert_eq!(peer.recv().await.unwrap().as_str(), "from inside");
    // Gone once dropped: the socket client's frames reach only itself.
    drop(peer);
    ws.send(WsMessage::text("alone")).await.unwrap();
    let own = ws.next().await.unwrap().unwrap();
    assert_eq!(own.to_text().unwrap(), "alone");
    trigger.trigger();
    let _ = bus.await;
}

#[tokio::test]
async fn at_shutdown_the_bus_relays_the_daemons_last_answer_then_closes() {
    let (peer, mut ws, (trigger, mut down), bus) = bus_with_a_local_peer().await;
    // The daemon's last answer, sent a while after shutdown woke it: the
    // bus waits for its in-process client to leave.
    let last = tokio::spawn(async move {
        down.recv().await;
        tokio::time::sleep(Duration::from_millis(50)).await;
        peer.send(Utf8Bytes::from_static("the last answer")).await;
    });
    trigger.trigger();
    // The bus is done (every connection drained and closed) before the
    // client reads anything.
    tokio::time::timeout(2 * DRAIN_TIMEOUT, bus)
        .await
        .expect("the bus closes within its drain timeout")
        .unwrap();
    last.await.unwrap();
    let frame = ws.next().await.unwrap().unwrap();
    assert_eq!(frame.to_text().unwrap(), "the last answer");
    let close = ws.next().await.unwrap().unwrap();
    assert!(close.is_close(), "{close:?}");
}

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

#[tokio::test]
async fn a_client_that_closes_during_a_large_frame_gets_all_of_it_then_the_reply() {
    let (peer, mut ws, (trigger, _), bus) = bus_with_a_local_peer().await;
    // 8 MiB: far more than the sockets hold, so the bus is still writing it
    // when the close arrives (the client reads nothing until then).
    let large = "x".repeat(8 << 20);
    peer.send(Utf8Bytes::from(large.clone())).await;
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    ws.close(None).await.unwrap();
    let frame = ws.next().await.unwrap().unwrap();
    assert_eq!(frame.len(), large.len(), "the frame whole");
    let reply = ws.next().await.unwrap().unwrap();
    assert!(reply.is_close(), "{reply:?}");
    trigger.trigger();
    drop(peer);
    let _ = bus.await;
}
