//! The daemon run inside the test process (`daemon::run` with a shutdown
//! trigger), not as a spawned binary.

mod common;

use std::time::Duration;

use serde_json::json;
use tokio::sync::oneshot;

use common::{text_manifest, Bus, TempDir, ANSWER_DEADLINE, BIN};
use toolboxd::control;
use toolboxd::daemon::{self, BusMode, RunOptions};
use toolboxd::operator::Operation;
use toolboxd::shutdown::ShutdownTrigger;

/// Whether process `pid` still exists (a zombie counts).
fn exists(pid: i32) -> bool {
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None).is_ok()
}

// A current-thread runtime, as the binary's: the children's parent-death
// signal is tied to the thread that spawns them, this test's thread.
#[tokio::test]
async fn a_daemon_in_process_serves_reloads_and_stops_cleanly() {
    // The keeper runs from the toolboxd binary, never from this test binary.
    toolboxd::process::keeper::install(BIN.into());
    let manifests = TempDir::new("in-process");
    manifests.write("text.toml", &text_manifest("text"));
    let control_dir = TempDir::new("in-process-ctl");
    let (ready_tx, ready_rx) = oneshot::channel();
    let options = RunOptions {
        manifests: vec![manifests.path().to_owned()],
        bus: BusMode::Embedded("127.0.0.1:0".parse().expect("an address")),
        control: control_dir.path().join("ctl.sock"),
        host_only: false,
        peer_probe: Duration::from_millis(50),
        bus_any_origin: false,
        observability: Default::default(),
        ready: Some(ready_tx),
    };
    let (trigger, shutdown) = ShutdownTrigger::new();
    let running = tokio::spawn(daemon::run(options, shutdown));
    let ready = tokio::time::timeout(Duration::from_secs(30), ready_rx)
        .await
        .expect("ready within 30 s")
        .expect("the daemon reports ready");
    assert!(
        ready.bus.starts_with("ws://127.0.0.1:") && !ready.bus.starts_with("ws://127.0.0.1:0/"),
        "{}",
        ready.bus
    );

    let mut bus = Bus::connect(&ready.bus).await;
    let list = bus.request("ovos.tools.list", json!({})).await;
    let mut names: Vec<&str> = list["data"]["tools"]
        .as_array()
        .expect("tools")
        .iter()
        .filter_map(|t| t["name"].as_str())
        .collect();
    names.sort();
    assert_eq!(names, ["shout", "word_count"], "{list}");
    let answer = bus
        .request(
            "ovos.tools.invoke",
            json!({"name": "shout", "args": {"text": "in process"}}),
        )
        .await;
    assert_eq!(answer["data"]["result"]["text"], "IN PROCESS", "{answer}");

    let rows = control::request(&ready.control, &Operation::Status)
        .await
        .expect("status");
    let pid = rows[0]["pids"][0].as_i64().expect("a pid") as i32;
    assert!(exists(pid));
    let keeper = toolboxd::process::keeper::Keeper::get().expect("the keeper runs");
    assert_eq!(
        std::fs::read_link(format!("/proc/{}/exe", keeper.pid())).expect("the keeper's exe"),
        std::fs::canonicalize(BIN).expect("the toolboxd binary")
    );

    // The three doors of the operator channel, at once: SIGHUP, the bus
    // topic and the control socket. A new manifest is there before any of
    // them, so whichever reload answers them loads it.
    manifests.write("more.toml", &text_manifest("more"));
    nix::sys::signal::raise(nix::sys::signal::Signal::SIGHUP).expect("SIGHUP");
    let mut other = Bus::connect(&ready.bus).await;
    let (on_bus, on_socket) = tokio::join!(
        other.request("ovos.tools.reload", json!({})),
        control::request(&ready.control, &Operation::Reload),
    );
    assert_eq!(
        on_bus["data"]["loaded"],
        json!(["more", "text"]),
        "{on_bus}"
    );
    assert_eq!(on_bus["data"]["total_tools"], 4, "{on_bus}");
    assert_eq!(
        on_socket.expect("reload"),
        json!({"loaded": ["more", "text"], "errors": []})
    );
    let refused = control::request(&ready.control, &Operation::Stop("nope".to_owned()))
        .await
        .expect_err("no such toolbox");
    assert!(
        refused
            .to_string()
            .ends_with("no toolbox \"nope\" is hosted here; see toolboxd ctl status"),
        "{refused}"
    );
    let rows = control::request(&ready.control, &Operation::Status)
        .await
        .expect("status");
    let pids: Vec<i32> = rows
        .as_array()
        .expect("rows")
        .iter()
        .filter_map(|r| r["pids"][0].as_i64())
        .map(|p| p as i32)
        .collect();
    assert_eq!(pids.len(), 2, "{rows}");

    trigger.trigger();
    let outcome = tokio::time::timeout(ANSWER_DEADLINE, running)
        .await
        .expect("run returns after shutdown")
        .expect("run does not panic");
    assert!(outcome.is_ok(), "{outcome:?}");
    for pid in pids {
        assert!(!exists(pid), "toolbox child {pid} outlived the daemon");
    }
    assert!(!ready.control.exists(), "the control socket is removed");
    let url = ready.bus.trim_start_matches("ws://");
    let addr = url.split('/').next().expect("host:port");
    assert!(
        tokio::net::TcpStream::connect(addr).await.is_err(),
        "the embedded bus is closed"
    );
}
