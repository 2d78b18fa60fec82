//! What one client of the embedded bus may take of what all share
//! (docs/failure-modes.md, "Shares"): the queues of other clients, the
//! connection slots, the daemon's room for calls, and how long a silent
//! connection is kept. Each test replays a quiet attack, shows the others
//! still served while it runs, and the attacker as the one slowed or cut.
//! The attacker of the per-peer tests runs as another user (`nobody`), as a
//! toolbox or a local account would: on loopback a peer is a uid.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{math_manifest, wait_until, Bus, Daemon, TempDir};
use futures_util::{SinkExt, StreamExt};
use serde_json::{json, Value};
use tokio_tungstenite::tungstenite::Message;

/// The uid and gid the attacker runs as.
const NOBODY: u32 = 65534;

/// The bus client of tests/python/ws_peer.py, run as `nobody` with `args`.
fn peer_as_nobody(url: &str, args: &[&str]) -> Child {
    Command::new("/usr/bin/python3")
        .arg(common::repo("tests/python/ws_peer.py"))
        .arg(url)
        .args(args)
        .uid(NOBODY)
        .gid(NOBODY)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("run the python peer as nobody")
}

/// The next line the peer prints, within `within`.
fn line_of(lines: &std::sync::mpsc::Receiver<String>, within: Duration) -> String {
    lines
        .recv_timeout(within)
        .expect("the python peer printed nothing in time")
}

/// The peer's stdout, line by line, on a channel.
fn lines(child: &mut Child) -> std::sync::mpsc::Receiver<String> {
    let stdout = child.stdout.take().expect("piped");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}

#[tokio::test]
async fn a_flooder_is_slowed_to_its_readers_pace_and_nobody_is_dropped() {
    // One flooder of 64 KiB frames got 10 of 10 slower readers dropped
    // after about 61 messages each, and kept its own connection: each
    // reader's queue filled past its bound. Now the flooder is not read
    // while its frames wait for others past its share.
    let dir = TempDir::new("flood");
    dir.write("math.toml", &math_manifest("math"));
    let daemon = Daemon::start(dir.path());
    const FRAMES: usize = 1200; // 75 MiB: far past every queue's bound
    let noise =
        json!({"type": "noise", "data": {"pad": "x".repeat(64 << 10)}, "context": {}}).to_string();
    // Readers slower than the flood: each takes a millisecond a frame.
    let mut readers = Vec::new();
    for _ in 0..3 {
        let (ws, _) = tokio_tungstenite::connect_async(&daemon.url).await.unwrap();
        readers.push(tokio::spawn(async move {
            let (_, mut incoming) = ws.split();
            let mut heard = 0;
            while heard < FRAMES {
                match tokio::time::timeout(Duration::from_secs(30), incoming.next()).await {
                    Ok(Some(Ok(Message::Text(text)))) if text.len() > 60_000 => heard += 1,
                    Ok(Some(Ok(_))) => {}
                    _ => break,
                }
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            heard
        }));
    }
    let (flood, _) = tokio_tungstenite::connect_async(&daemon.url).await.unwrap();
    let (mut flood_out, mut flood_in) = flood.split();
    // The flooder reads its own echoes as fast as they come.
    tokio::spawn(async move { while let Some(Ok(_)) = flood_in.next().await {} });
    let flooding = tokio::spawn(async move {
        for _ in 0..FRAMES {
            flood_out.send(Message::text(noise.clone())).await.unwrap();
        }
        flood_out
    });
    // A neighbour is served while the flood runs (and leaves: it reads
    // only when it waits for an answer).
    let mut bus = Bus::connect(&daemon.url).await;
    bus.assert_math_answers().await;
    drop(bus);
    let _flood_out = flooding.await.unwrap();
    for reader in readers {
        assert_eq!(reader.await.unwrap(), FRAMES, "a reader lost frames");
    }
    assert!(
        daemon
            .log_lines_with("bus client is not reading")
            .is_empty(),
        "a reader was dropped for the flood"
    );
    Bus::connect(&daemon.url).await.assert_math_answers().await;
}

#[tokio::test]
async fn a_silent_connection_is_pinged_then_closed_and_one_that_answers_stays() {
    // 256 idle connections held every slot with no end. Now a silent
    // connection is pinged after 20 s, and closed if nothing comes back in
    // 20 s more; a client that answers pings (every websocket library
    // does, while it reads) stays however long it is idle.
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let dir = TempDir::new("idle");
    dir.write("math.toml", &math_manifest("math"));
    let daemon = Daemon::start(dir.path());
    let addr = daemon
        .url
        .trim_start_matches("ws://")
        .trim_end_matches("/core")
        .to_owned();
    // A handshake by hand, then silence: pings are read, never answered.
    let mut silent = tokio::net::TcpStream::connect(&addr).await.unwrap();
    silent
        .write_all(
            format!(
                "GET /core HTTP/1.1\r\nHost: {addr}\r\nUpgrade: websocket\r\n\
                 Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\
                 Sec-WebSocket-Version: 13\r\n\r\n"
            )
            .as_bytes(),
        )
        .await
        .unwrap();
    // An idle client whose library answers pings as it reads.
    let (answering, _) = tokio_tungstenite::connect_async(&daemon.url).await.unwrap();
    let (answering_out, mut answering_in) = answering.split();
    let pings = tokio::spawn(async move {
        let mut pings = 0;
        while let Some(Ok(frame)) = answering_in.next().await {
            if frame.is_ping() {
                pings += 1;
            }
            if pings == 2 {
                break;
            }
        }
        (pings, answering_in)
    });
    let started = Instant::now();
    let mut seen = Vec::new();
    let closed = tokio::time::timeout(Duration::from_secs(60), async {
        let mut buf = [0u8; 4096];
        loop {
            match silent.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => seen.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await;
    assert!(closed.is_ok(), "the silent connection is still open");
    let after = started.elapsed();
    assert!(
        (Duration::from_secs(35)..Duration::from_secs(50)).contains(&after),
        "closed after {after:?}, not after its ping went unanswered"
    );
    // It was pinged (0x89, no payload) before it was closed.
    assert!(seen.windows(2).any(|w| w == [0x89, 0x00]), "no ping seen");
    // The daemon's log is read by another thread: wait for the line.
    daemon.wait_for_log("did not answer a ping", 1, Duration::from_secs(5));
    assert_eq!(
        daemon.log_lines_with("did not answer a ping").len(),
        1,
        "only the silent one is cut"
    );
    // The idle client that answers pings is still served (pinged twice by
    // now: it has been silent 40 s).
    let (pings, answering_in) = tokio::time::timeout(Duration::from_secs(20), pings)
        .await
        .expect("the answering client is pinged again")
        .unwrap();
    assert_eq!(pings, 2);
    let mut answering = answering_out.reunite(answering_in).unwrap();
    answering
        .send(Message::text(
            json!({"type": "ovos.tools.list", "data": {}, "context": {}}).to_string(),
        ))
        .await
        .unwrap();
    let listed = tokio::time::timeout(common::ANSWER_DEADLINE, async {
        while let Some(Ok(frame)) = answering.next().await {
            if frame
                .to_text()
                .is_ok_and(|t| t.contains("ovos.tools.list.response"))
            {
                return true;
            }
        }
        false
    })
    .await;
    assert_eq!(listed, Ok(true), "the answering idle client was cut");
}

#[tokio::test]
async fn one_user_holding_connections_leaves_a_share_of_the_slots_to_the_others() {
    // 256 idle connections from one client held every slot: nobody else
    // could connect. Now one peer (on loopback, one user) holds three
    // quarters at most.
    let dir = TempDir::new("slots");
    dir.write("math.toml", &math_manifest("math"));
    let daemon = Daemon::start(dir.path());
    let mut attacker = peer_as_nobody(&daemon.url, &["hold", "512"]);
    let out = lines(&mut attacker);
    let held = line_of(&out, Duration::from_secs(60));
    assert_eq!(held, "held 384", "one user's share is 384 of 512 slots");
    wait_until("the refusal is logged", Duration::from_secs(10), || {
        !daemon
            .log_lines_with("uid 65534 holds 384 connections")
            .is_empty()
    });
    // Others still connect and are served, several of them.
    let mut others = Vec::new();
    for _ in 0..8 {
        let mut bus = Bus::connect(&daemon.url).await;
        bus.assert_math_answers().await;
        others.push(bus);
    }
    drop(attacker.stdin.take());
    let _ = attacker.wait();
}

#[tokio::test]
async fn one_users_large_calls_leave_the_room_calls_share_to_the_others() {
    // One client's calls with large arguments to a slow tool took all the
    // room every call shares: nobody else's call was admitted. Now one
    // peer's calls may hold a quarter of it: its next call is the one
    // answered busy, and the others are served.
    let dir = TempDir::new("room");
    dir.write(
        "slow.toml",
        &common::fixture_manifest("slow", "[limits]\nmax_argument_bytes = 8388608"),
    );
    let daemon = Daemon::start(dir.path());
    let big = "x".repeat((1 << 20) - 1024);
    let mut attacker = peer_as_nobody(&daemon.url, &["send"]);
    let out = lines(&mut attacker);
    {
        let stdin = attacker.stdin.as_mut().expect("piped");
        for n in 0..8 {
            let call = json!({"type": "ovos.persona.tools.call",
                              "data": {"toolbox_id": "slow", "name": "slow_whoami",
                                       "kwargs": {"seconds": 4.0, "big": big}},
                              "context": {"n": n}});
            writeln!(stdin, "{call}").unwrap();
        }
        writeln!(stdin).unwrap();
    }
    assert_eq!(line_of(&out, Duration::from_secs(20)), "sent");
    // About 1 MiB of arguments counts 16 times of the 128 MiB: the
    // attacker's share (32 MiB) takes one, and its next calls are refused.
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut refused = 0;
    while refused == 0 && Instant::now() < deadline {
        if let Ok(line) = out.recv_timeout(Duration::from_millis(200)) {
            let answer: Value = serde_json::from_str(&line).unwrap();
            if answer["type"] == "ovos.persona.tools.call.response" {
                let error = answer["error"].as_str().unwrap_or_default();
                assert!(
                    error.starts_with("RuntimeError: toolboxd is busy for this client"),
                    "{answer}"
                );
                assert!(error.contains("uid 65534"), "{error}");
                refused += 1;
            }
        }
    }
    assert!(refused > 0, "none of the attacker's calls was refused");
    // Meanwhile a call of another user with as large arguments is admitted
    // and answered, and small ones too.
    let mut bus = Bus::connect(&daemon.url).await;
    let answer = bus
        .call("slow", "slow_whoami", json!({"seconds": 0.1, "big": big}))
        .await;
    assert!(answer["result"]["pid"].is_u64(), "{answer}");
    for _ in 0..5 {
        let answer = bus.call("slow", "whoami", json!({})).await;
        assert!(answer["result"]["pid"].is_u64(), "{answer}");
    }
    drop(attacker.stdin.take());
    let _ = attacker.wait();
}

#[tokio::test]
async fn a_client_that_writes_before_it_reads_is_held_back_by_nobody() {
    // Backpressure charged a sender for its own echo: a client that sent a
    // few large messages before reading any (one task that writes, then
    // reads) was no longer read, and then cut as not reading. Its own echo
    // is not charged to it: only its readers hold it back.
    let dir = TempDir::new("write-first");
    dir.write("math.toml", &math_manifest("math"));
    let daemon = Daemon::start(dir.path());
    let (mut ws, _) = tokio_tungstenite::connect_async(&daemon.url).await.unwrap();
    let frame =
        json!({"type": "noise", "data": {"pad": "x".repeat(1 << 20)}, "context": {}}).to_string();
    const FRAMES: usize = 24; // 24 MiB: far past a sender's share, within a queue's bound
    tokio::time::timeout(Duration::from_secs(20), async {
        for _ in 0..FRAMES {
            ws.send(Message::text(frame.clone())).await.unwrap();
        }
    })
    .await
    .expect("the bus stopped reading a client that had not read yet");
    let mut echoed = 0;
    while echoed < FRAMES {
        match tokio::time::timeout(common::ANSWER_DEADLINE, ws.next()).await {
            Ok(Some(Ok(Message::Text(text)))) if text.len() > 1 << 20 => echoed += 1,
            Ok(Some(Ok(_))) => {}
            other => panic!("after {echoed} echoes: {other:?}"),
        }
    }
    assert!(daemon
        .log_lines_with("bus client is not reading")
        .is_empty());
    Bus::connect(&daemon.url).await.assert_math_answers().await;
}
