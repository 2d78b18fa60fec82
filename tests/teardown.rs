//! How toolboxes and the daemon end (docs/failure-modes.md, "Nothing a
//! toolbox started outlives it, or the daemon"): stdin closed, then SIGTERM,
//! then SIGKILL; calls in flight drained; no process left behind, whether
//! the daemon stops or is killed.

mod common;
mod faulty;

use std::time::{Duration, Instant};

use common::{math_manifest, start_bus, Bus, Daemon, TempDir, ANSWER_DEADLINE};
use faulty::*;
use serde_json::json;

#[tokio::test]
async fn a_grandchild_left_by_a_dead_child_is_killed_with_its_group() {
    let s = Setup::new("grandchild", "", FAST_RESTART);
    let daemon = Daemon::start(s.dir.path());
    let mut bus = Bus::connect(&daemon.url).await;
    let (data, _) = call(&mut bus, "faulty", "spawn_grandchild", json!({"die": true})).await;
    assert_eq!(
        data["error"],
        "RuntimeError: toolbox 'faulty' exited (code 5) while running 'spawn_grandchild'"
    );
    // The grandchild ran (it wrote its pid) and is gone with the group.
    let grandchildren = s.grandchildren();
    assert_eq!(grandchildren.len(), 1, "{grandchildren:?}");
    let grandchild = nix::unistd::Pid::from_raw(grandchildren[0]);
    common::wait_until("the grandchild is gone", Duration::from_secs(5), || {
        nix::sys::signal::kill(grandchild, None).is_err()
    });
    let (data, _) = call(&mut bus, "faulty", "ok", json!({})).await;
    assert_eq!(data["result"], json!({"ok": true}));
    neighbour_answers(&mut bus).await;
}

async fn daemon_with_a_grandchild(tag: &str) -> (Setup, Daemon) {
    let s = Setup::new(tag, "", "");
    let daemon = Daemon::start(s.dir.path());
    let mut bus = Bus::connect(&daemon.url).await;
    let (data, _) = call(
        &mut bus,
        "faulty",
        "spawn_grandchild",
        json!({"die": false}),
    )
    .await;
    assert_eq!(data["result"], json!({"ok": true}));
    // The fixture child and its grandchild carry the mark, and the
    // grandchild is the one that wrote its pid.
    assert_eq!(
        processes_with(&s.mark).len(),
        2,
        "{:?}",
        processes_with(&s.mark)
    );
    let grandchildren = s.grandchildren();
    assert_eq!(grandchildren.len(), 1);
    assert!(processes_with(&s.mark).contains(&(grandchildren[0] as u32)));
    (s, daemon)
}

#[tokio::test]
async fn sigterm_leaves_no_process_behind_and_exits_0() {
    let (s, mut daemon) = daemon_with_a_grandchild("sigterm").await;
    let status = daemon.stop();
    assert!(status.success(), "{status:?}");
    wait_until_gone(&s.mark, Duration::from_secs(5));
}

#[tokio::test]
async fn sigkill_of_the_daemon_leaves_no_process_behind() {
    let (s, mut daemon) = daemon_with_a_grandchild("sigkill-daemon").await;
    daemon.child.kill().unwrap();
    daemon.child.wait().unwrap();
    wait_until_gone(&s.mark, Duration::from_secs(5));
}

#[tokio::test]
async fn sigterm_lets_calls_in_flight_finish_before_exiting() {
    let (mut bus_process, port) = start_bus(0);
    let url = format!("ws://127.0.0.1:{port}/core");
    let dir = TempDir::new("drain");
    dir.write("math.toml", &math_manifest("math"));
    let daemon = Daemon::start_with(&["--manifests", dir.path().to_str().unwrap(), "--bus", &url]);
    a_call_in_flight_is_answered_before_the_exit(daemon).await;
    bus_process.kill().unwrap();
    bus_process.wait().unwrap();
}

#[tokio::test]
async fn sigterm_lets_calls_in_flight_finish_on_the_daemons_own_bus() {
    // The answer goes out on the bus that shuts down with the daemon.
    let dir = TempDir::new("drain-own");
    dir.write("math.toml", &math_manifest("math"));
    a_call_in_flight_is_answered_before_the_exit(Daemon::start(dir.path())).await;
}

#[tokio::test]
async fn a_connection_silent_in_its_handshake_does_not_hold_up_the_exit() {
    let dir = TempDir::new("silent-handshake");
    dir.write("math.toml", &math_manifest("math"));
    let mut daemon = Daemon::start(dir.path());
    let sockets = || {
        std::fs::read_dir(format!("/proc/{}/fd", daemon.pid()))
            .unwrap()
            .filter_map(|fd| std::fs::read_link(fd.ok()?.path()).ok())
            .filter(|target| target.to_string_lossy().starts_with("socket:"))
            .count()
    };
    let before = sockets();
    let addr = daemon
        .url
        .trim_start_matches("ws://")
        .trim_end_matches("/core");
    let _silent = std::net::TcpStream::connect(addr).unwrap();
    // Readiness: the bus has accepted it (one socket more), and it waits
    // for a handshake that never comes (10 s allowed).
    common::wait_until(
        "the bus accepts the connection",
        Duration::from_secs(5),
        || sockets() > before,
    );
    let stopping = Instant::now();
    assert!(daemon.stop().success());
    assert!(
        stopping.elapsed() < Duration::from_secs(5),
        "the exit took {:?}",
        stopping.elapsed()
    );
}

/// Calls `sleep` on `math`, stops the daemon once the call runs: the answer
/// arrives, and the daemon exits 0.
async fn a_call_in_flight_is_answered_before_the_exit(mut daemon: Daemon) {
    let mut bus = Bus::connect(&daemon.url).await;
    bus.send(
        "ovos.tools.invoke",
        json!({"name": "sleep", "args": {"seconds": 1}}),
        json!({"mark": "long"}),
    )
    .await;
    // Readiness: the daemon counts the call in flight.
    let deadline = Instant::now() + Duration::from_secs(5);
    while daemon.status("math")["in_flight"] != 1 {
        assert!(Instant::now() < deadline, "the call never started");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let stopping = std::thread::spawn(move || daemon.stop());
    let answers = bus
        .expect_answers("ovos.tools.invoke.response", "long", 1)
        .await;
    assert_eq!(answers.len(), 1);
    assert_eq!(answers[0]["data"]["result"], json!({"slept": 1}));
    assert!(stopping.join().unwrap().success());
}

/// CLOCK_MONOTONIC in seconds: the clock the fixture notes its events on.
fn monotonic_s() -> f64 {
    let t = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC).unwrap();
    t.tv_sec() as f64 + t.tv_nsec() as f64 / 1e9
}

/// Seconds between two events the stubborn fixture noted.
fn between(events: &[(String, f64)], from: &str, to: &str) -> f64 {
    let at = |name: &str| {
        events
            .iter()
            .find(|(e, _)| e == name)
            .unwrap_or_else(|| panic!("no {name} event in {events:?}"))
            .1
    };
    at(to) - at(from)
}

#[tokio::test]
async fn ctl_stop_closes_stdin_then_sigterms_then_sigkills() {
    let s = Setup::new("ctlstop", "stubborn", "");
    let daemon = Daemon::start(s.dir.path());
    assert_eq!(processes_with(&s.mark).len(), 1, "the child alone");
    let started = Instant::now();
    let (code, out, err) = daemon.ctl(&["stop", "faulty"]);
    let took = started.elapsed();
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("stopped"), "{out}");
    // Each step waits 3 s for a child that ignores the one before.
    let events = s.events();
    let term_after = between(&events, "stdin_closed", "sigterm");
    assert!(
        (2.5..4.5).contains(&term_after),
        "SIGTERM {term_after} s after stdin closed"
    );
    assert!(
        took >= Duration::from_millis(5500),
        "ctl stop returned after {took:?}"
    );
    wait_until_gone(&s.mark, Duration::from_secs(2));
    assert_eq!(daemon.status("faulty")["state"], "stopped");
}

#[tokio::test]
async fn sigterm_drains_refuses_new_calls_and_escalates_to_sigkill() {
    let (mut bus_process, port) = start_bus(0);
    let url = format!("ws://127.0.0.1:{port}/core");
    let s = Setup::new(
        "term-escalate",
        "stubborn",
        "[limits]\ndrain_timeout_s = 2\n",
    );
    let mut daemon =
        Daemon::start_with(&["--manifests", s.dir.path().to_str().unwrap(), "--bus", &url]);
    let mut bus = Bus::connect(&url).await;
    bus.send(
        "ovos.persona.tools.call",
        json!({"toolbox_id": "faulty", "name": "hang", "kwargs": {}}),
        json!({"mark": "inflight"}),
    )
    .await;
    s.wait_received_call("hang", 1).await;
    let term_sent = monotonic_s();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(daemon.pid() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    daemon.wait_for_log("shutting down", 1, ANSWER_DEADLINE);
    // While it drains the toolbox is stopped, so no longer hosted: the tool
    // service no longer knows the tool; persona calls get no answer.
    let r = bus
        .request("ovos.tools.invoke", json!({"name": "ok", "args": {}}))
        .await;
    assert_eq!(
        r["data"]["error"], "Unknown tool: 'ok'",
        "a new call during the drain: {r}"
    );
    bus.send(
        "ovos.persona.tools.call",
        json!({"toolbox_id": "faulty", "name": "ok", "kwargs": {}}),
        json!({"mark": "late"}),
    )
    .await;
    let status = daemon.wait_exit(Duration::from_secs(20));
    assert!(status.success(), "{status:?}");
    // drain (2 s) -> stdin closed -> 3 s -> SIGTERM -> 3 s -> SIGKILL.
    let events = s.events();
    let drained = events.iter().find(|(e, _)| e == "stdin_closed").unwrap().1 - term_sent;
    assert!(
        (1.9..4.0).contains(&drained),
        "stdin closed {drained} s after SIGTERM (drain_timeout_s = 2)"
    );
    let term_after = between(&events, "stdin_closed", "sigterm");
    assert!(
        (2.5..4.5).contains(&term_after),
        "SIGTERM {term_after} s after stdin closed"
    );
    wait_until_gone(&s.mark, Duration::from_secs(2));
    // The persona call that came during the drain was never answered, and the
    // call in flight was answered once (it could not finish: with an error).
    bus.listen(common::SILENCE_WINDOW).await;
    assert!(bus.answers_marked("late").is_empty());
    let inflight = bus.answers_marked("inflight");
    assert_eq!(inflight.len(), 1, "{inflight:#?}");
    assert!(inflight[0]["data"]["error"].is_string(), "{inflight:#?}");
    bus_process.kill().unwrap();
    bus_process.wait().unwrap();
}

/// The pids whose parent is `parent`.
fn children_of(parent: u32) -> Vec<u32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .ok()
                .and_then(|stat| {
                    // "PID (COMM) STATE PPID ...": the comm may hold spaces.
                    let after = &stat[stat.rfind(')')? + 2..];
                    after.split_whitespace().nth(1)?.parse::<u32>().ok()
                })
                == Some(parent)
        })
        .collect()
}

#[tokio::test]
async fn one_process_per_toolbox_and_nothing_outlives_a_killed_daemon() {
    let s = Setup::new("tree", "", "");
    let mut daemon = Daemon::start(s.dir.path());
    let mut bus = Bus::connect(&daemon.url).await;
    let grandchild = setsid_grandchild(&mut bus, &s).await;
    // Status shows each toolbox's own pid...
    let (who, _) = call(&mut bus, "faulty", "whoami", json!({})).await;
    let faulty = common::pid_of(&daemon, "faulty") as u32;
    let math = common::pid_of(&daemon, "math") as u32;
    assert_eq!(who["result"]["pid"].as_u64(), Some(faulty as u64));
    // ...and the daemon's children are the two toolboxes and at most one helper.
    let children = children_of(daemon.pid());
    assert!(
        children.contains(&faulty) && children.contains(&math),
        "{children:?} lacks {faulty} or {math}"
    );
    assert!(children.len() <= 3, "children of the daemon: {children:?}");
    // SIGKILL the daemon: every toolbox process, the setsid grandchild
    // included, ends.
    daemon.child.kill().unwrap();
    daemon.child.wait().unwrap();
    for pid in [faulty as i32, math as i32, grandchild] {
        common::wait_until(
            &format!("process {pid} ends with the daemon"),
            Duration::from_secs(5),
            || nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None).is_err(),
        );
    }
    wait_until_gone(&s.mark, Duration::from_secs(5));
}

#[tokio::test]
async fn a_setsid_grandchild_ends_with_ctl_stop() {
    let s = Setup::new("setsid-stop", "", "");
    let daemon = Daemon::start(s.dir.path());
    let mut bus = Bus::connect(&daemon.url).await;
    let grandchild = nix::unistd::Pid::from_raw(setsid_grandchild(&mut bus, &s).await);
    assert!(nix::sys::signal::kill(grandchild, None).is_ok());
    let (code, out, err) = daemon.ctl(&["stop", "faulty"]);
    assert_eq!(code, 0, "{out}{err}");
    common::wait_until("the setsid grandchild ends", Duration::from_secs(5), || {
        nix::sys::signal::kill(grandchild, None).is_err()
    });
    neighbour_answers(&mut bus).await;
}

/// Has the fixture start a grandchild in a session (and process group) of
/// its own, and returns its pid.
async fn setsid_grandchild(bus: &mut Bus, s: &Setup) -> i32 {
    let (data, _) = call(
        bus,
        "faulty",
        "spawn_grandchild",
        json!({"die": false, "setsid": true}),
    )
    .await;
    assert_eq!(data["result"], json!({"ok": true}));
    s.grandchildren()[0]
}
