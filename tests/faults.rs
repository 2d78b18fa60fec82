//! Fault injection (docs/failure-modes.md): one fixture child per fault. Each test checks
//! what the caller gets (text and how fast), the toolbox's state, and that the
//! neighbour toolbox kept answering. How toolboxes and the daemon end:
//! `teardown.rs`.

mod common;
mod faulty;

use std::time::{Duration, Instant};

use common::{fixture_manifest, math_manifest, repo, Bus, Daemon, TempDir};
use faulty::*;
use serde_json::{json, Value};

#[tokio::test]
async fn crash_mid_call_fails_that_call_at_once_and_restarts() {
    let s = Setup::new("crash", "", SLOW_RESTART);
    let daemon = Daemon::start(s.dir.path());
    let mut bus = Bus::connect(&daemon.url).await;
    let pid = common::pid_of(&daemon, "faulty");
    let (data, took) = call(&mut bus, "faulty", "crash", json!({"code": 3})).await;
    assert_eq!(
        data["error"],
        "RuntimeError: toolbox 'faulty' exited (code 3) while running 'crash'"
    );
    assert!(took < Duration::from_secs(2), "{took:?}");
    // Now it waits out the backoff (1.5 s ± 20%): `restarting`, still hosted.
    let row = daemon.status("faulty");
    assert_eq!(row["state"], "restarting", "{row}");
    assert!(row["pids"].as_array().unwrap().is_empty(), "{row}");
    // Still listed, with its last known tools, on both surfaces.
    let listed = bus.request("ovos.tools.list", json!({})).await;
    assert!(
        listed["data"]["tools"]
            .as_array()
            .unwrap()
            .iter()
            .any(|t| t["toolbox_id"] == "faulty" && t["name"] == "ok"),
        "{listed}"
    );
    let ids: Vec<String> = bus
        .discover(2)
        .await
        .into_iter()
        .map(|(id, _)| id)
        .collect();
    assert_eq!(ids, ["faulty", "math"]);
    // A call that arrives now waits for the new child instead of failing.
    let row = daemon.status("faulty");
    assert_eq!(
        row["state"], "restarting",
        "the call must arrive while restarting: {row}"
    );
    let (data, waited) = call(&mut bus, "faulty", "whoami", json!({})).await;
    assert!(data["result"]["pid"].is_u64(), "{data}");
    assert!(waited > Duration::from_millis(100), "it waited: {waited:?}");
    neighbour_answers(&mut bus).await;
    let row = daemon.wait_for_state("faulty", "ready", Duration::from_secs(10));
    assert_eq!(row["restarts"], 1);
    assert_eq!(row["last_exit"], "exited (code 3)");
    assert_ne!(row["pids"][0].as_u64().unwrap(), pid);
    assert_eq!(daemon.status("faulty")["calls_err"], 1);
}

#[tokio::test]
async fn a_crash_fails_every_call_in_flight_on_that_child() {
    let s = Setup::new("crash-many", "", FAST_RESTART);
    let daemon = Daemon::start(s.dir.path());
    let mut bus = Bus::connect(&daemon.url).await;
    for i in 0..3 {
        bus.send(
            "ovos.persona.tools.call",
            json!({"toolbox_id": "faulty", "name": "hang", "kwargs": {}}),
            json!({"mark": format!("hang{i}")}),
        )
        .await;
    }
    s.wait_received_call("hang", 3).await;
    let (data, _) = call(&mut bus, "faulty", "crash", json!({"code": 7})).await;
    assert_eq!(
        data["error"],
        "RuntimeError: toolbox 'faulty' exited (code 7) while running 'crash'"
    );
    for i in 0..3 {
        let answers = bus
            .expect_answers("ovos.persona.tools.call.response", &format!("hang{i}"), 1)
            .await;
        assert_eq!(answers.len(), 1, "{answers:#?}");
        assert_eq!(
            answers[0]["data"]["error"],
            "RuntimeError: toolbox 'faulty' exited (code 7) while running 'hang'"
        );
    }
    daemon.wait_for_state("faulty", "ready", Duration::from_secs(10));
    assert_eq!(daemon.status("faulty")["calls_err"], 4);
    neighbour_answers(&mut bus).await;
}

#[tokio::test]
async fn sigkill_from_outside_fails_in_flight_calls_with_the_signal() {
    let s = Setup::new("sigkill", "", FAST_RESTART);
    let daemon = Daemon::start(s.dir.path());
    let mut bus = Bus::connect(&daemon.url).await;
    let (who, _) = call(&mut bus, "faulty", "whoami", json!({})).await;
    let child_pid = who["result"]["pid"].as_i64().unwrap() as i32;
    bus.send(
        "ovos.persona.tools.call",
        json!({"toolbox_id": "faulty", "name": "hang", "kwargs": {}}),
        json!({"mark": "hung"}),
    )
    .await;
    // The hang call is in flight once the child has recorded it.
    s.wait_received_call("hang", 1).await;
    let killed = Instant::now();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child_pid),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let answers = bus
        .expect_answers("ovos.persona.tools.call.response", "hung", 1)
        .await;
    assert_eq!(answers.len(), 1);
    assert_eq!(
        answers[0]["data"]["error"],
        "RuntimeError: toolbox 'faulty' exited (signal 9) while running 'hang'"
    );
    let (data, _) = call(&mut bus, "faulty", "whoami", json!({})).await;
    assert_ne!(data["result"]["pid"].as_i64().unwrap() as i32, child_pid);
    assert!(killed.elapsed() < Duration::from_secs(6));
    neighbour_answers(&mut bus).await;
    assert_eq!(daemon.status("faulty")["state"], "ready");
}

#[tokio::test]
async fn exit_during_handshake_exhausts_the_budget_and_fails_fast() {
    let s = Setup::new(
        "handshake",
        "exit_in_handshake",
        &format!("{FAST_RESTART}max_restarts = 2\n"),
    );
    let daemon = Daemon::start(s.dir.path());
    let row = daemon.wait_for_state("faulty", "failed", Duration::from_secs(15));
    let reason = row["reason"].as_str().unwrap();
    assert!(
        reason.contains("failed to start") && reason.contains("code 4"),
        "{reason}"
    );
    assert!(reason.contains("more than 2 restarts"), "{reason}");
    let mut bus = Bus::connect(&daemon.url).await;
    let (data, took) = call(&mut bus, "faulty", "ok", json!({})).await;
    let e = data["error"].as_str().unwrap();
    assert!(
        e.starts_with("RuntimeError: toolbox 'faulty' is failed: "),
        "{e}"
    );
    assert!(took < Duration::from_millis(500), "{took:?}");
    // A failed toolbox is hosted but not listed (the neighbour is).
    let owners = bus.listed_owners().await;
    assert!(
        !owners.is_empty() && owners.iter().all(|o| *o == "math"),
        "{owners:?}"
    );
    let ids: Vec<String> = bus
        .discover(1)
        .await
        .into_iter()
        .map(|(id, _)| id)
        .collect();
    assert_eq!(ids, ["math"]);
    neighbour_answers(&mut bus).await;
}

#[tokio::test]
async fn a_crash_loop_goes_to_failed_with_the_last_exit_and_stderr() {
    let s = Setup::new(
        "loop",
        "exit_at_start",
        &format!("{FAST_RESTART}max_restarts = 3\nwindow_s = 60\n"),
    );
    let daemon = Daemon::start(s.dir.path());
    let row = daemon.wait_for_state("faulty", "failed", Duration::from_secs(15));
    assert_eq!(row["restarts"], 3);
    assert!(
        row["last_exit"].as_str().unwrap().contains("code 3"),
        "{row}"
    );
    let failed = daemon.log_lines_with("failed: ");
    let line = failed
        .iter()
        .find(|l| {
            l["toolbox"] == "faulty" && l["message"].as_str().unwrap().starts_with("failed: ")
        })
        .expect("failed logged");
    assert!(
        line["stderr_tail"]
            .as_str()
            .unwrap()
            .contains("dying on purpose at start"),
        "{line}"
    );
    let mut bus = Bus::connect(&daemon.url).await;
    neighbour_answers(&mut bus).await;
    // An operator can start it again; it fails again, and says so.
    let (code, _, err) = daemon.ctl(&["start", "faulty"]);
    assert_eq!(code, 1);
    assert!(err.contains("code 3"), "{err}");
}

#[tokio::test]
async fn a_hung_call_times_out_and_is_cancelled_on_the_child() {
    let s = Setup::new(
        "hang",
        "",
        "[limits]\ncall_timeout_s = 10\n[limits.tool_timeouts]\nhang = 1\n",
    );
    let daemon = Daemon::start(s.dir.path());
    let mut bus = Bus::connect(&daemon.url).await;
    let (data, took) = call(&mut bus, "faulty", "hang", json!({})).await;
    assert_eq!(
        data["error"],
        "TimeoutError: tool 'hang' in toolbox 'faulty' did not answer within 1 s"
    );
    assert!(
        took >= Duration::from_secs(1) && took < Duration::from_secs(3),
        "{took:?}"
    );
    // The child was told, and keeps serving.
    let deadline = Instant::now() + Duration::from_secs(3);
    loop {
        let cancels: Vec<Value> = s
            .received()
            .into_iter()
            .filter(|m| m["method"] == "notifications/cancelled")
            .collect();
        if let Some(c) = cancels.first() {
            assert!(c["params"]["requestId"].is_u64(), "{c}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no notifications/cancelled reached the child"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (data, _) = call(&mut bus, "faulty", "ok", json!({})).await;
    assert_eq!(data["result"], json!({"ok": true}));
    assert_eq!(daemon.status("faulty")["restarts"], 0);
    neighbour_answers(&mut bus).await;
}

#[tokio::test]
async fn a_child_that_ignores_its_liveness_probe_is_killed_and_restarted() {
    let s = Setup::new(
        "probe",
        "no_probe",
        &format!("protocol = \"2025-06-18\"\n{FAST_RESTART}[limits]\nprobe_interval_s = 1\nprobe_timeout_s = 1\n"),
    );
    let daemon = Daemon::start(s.dir.path());
    let first = common::pid_of(&daemon, "faulty");
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let row = daemon.status("faulty");
        if row["restarts"].as_u64().unwrap() >= 1 && row["state"] == "ready" {
            assert_ne!(row["pids"][0].as_u64().unwrap(), first);
            assert!(
                row["last_exit"].as_str().unwrap().contains("signal 9"),
                "{row}"
            );
            break;
        }
        assert!(Instant::now() < deadline, "never restarted: {row}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(!daemon
        .log_lines_with("stopped answering its liveness probe")
        .is_empty());
    let mut bus = Bus::connect(&daemon.url).await;
    neighbour_answers(&mut bus).await;
}

#[tokio::test]
async fn an_oversize_line_is_a_protocol_break() {
    let s = Setup::new(
        "oversize",
        "",
        &format!("{FAST_RESTART}[limits]\nmax_message_bytes = 16384\n"),
    );
    let daemon = Daemon::start(s.dir.path());
    let mut bus = Bus::connect(&daemon.url).await;
    let (data, took) = call(&mut bus, "faulty", "oversize", json!({"size": 100000})).await;
    let e = data["error"].as_str().unwrap();
    assert!(
        e.starts_with("RuntimeError: toolbox 'faulty' failed while running 'oversize': "),
        "{e}"
    );
    assert!(e.contains("longer than max_message_bytes (16384)"), "{e}");
    assert!(took < Duration::from_secs(2), "{took:?}");
    let (data, _) = call(&mut bus, "faulty", "ok", json!({})).await;
    assert_eq!(data["result"], json!({"ok": true}));
    assert_eq!(daemon.status("faulty")["restarts"], 1);
    neighbour_answers(&mut bus).await;
}

#[tokio::test]
async fn garbage_lines_are_logged_once_and_ignored() {
    let s = Setup::new("garbage", "", "");
    let daemon = Daemon::start(s.dir.path());
    let mut bus = Bus::connect(&daemon.url).await;
    for _ in 0..3 {
        let (data, _) = call(&mut bus, "faulty", "garbage", json!({})).await;
        assert_eq!(data["result"], json!({"ok": true}));
    }
    assert_eq!(daemon.log_lines_with("ignoring a stdout line").len(), 1);
    assert_eq!(
        daemon
            .log_lines_with("unknown or withdrawn request id")
            .len(),
        1
    );
    let row = daemon.status("faulty");
    assert_eq!(
        (row["state"].as_str(), row["restarts"].as_u64()),
        (Some("ready"), Some(0))
    );
    neighbour_answers(&mut bus).await;
}

#[tokio::test]
async fn a_closed_stdout_is_a_protocol_break() {
    let s = Setup::new("stdout", "", FAST_RESTART);
    let daemon = Daemon::start(s.dir.path());
    let mut bus = Bus::connect(&daemon.url).await;
    let (data, took) = call(&mut bus, "faulty", "close_stdout", json!({})).await;
    let e = data["error"].as_str().unwrap();
    assert!(e.contains("closed its stdout but kept running"), "{e}");
    assert!(took < Duration::from_secs(4), "{took:?}");
    let (data, _) = call(&mut bus, "faulty", "ok", json!({})).await;
    assert_eq!(data["result"], json!({"ok": true}));
    neighbour_answers(&mut bus).await;
}

#[tokio::test]
async fn a_stderr_flood_neither_stalls_the_daemon_nor_floods_the_log() {
    let s = Setup::new("flood", "", "");
    let daemon = Daemon::start(s.dir.path());
    let mut bus = Bus::connect(&daemon.url).await;
    let started = Instant::now();
    bus.send(
        "ovos.persona.tools.call",
        json!({"toolbox_id": "faulty", "name": "flood", "kwargs": {"lines": 200000}}),
        json!({"mark": "flood"}),
    )
    .await;
    // While it floods, the neighbour answers.
    neighbour_answers(&mut bus).await;
    let answers = bus
        .expect_answers("ovos.persona.tools.call.response", "flood", 1)
        .await;
    assert_eq!(answers[0]["data"]["result"], json!({"ok": true}));
    // Every line is either logged or counted as not logged.
    let count = || {
        let logged = daemon
            .logs
            .lock()
            .unwrap()
            .iter()
            .filter(|l| l.contains("stderr flood line"))
            .count() as u64;
        let suppressed: u64 = daemon
            .log_lines_with("stderr flood: lines not logged")
            .iter()
            .map(|l| l["suppressed"].as_u64().unwrap())
            .sum();
        (logged, suppressed)
    };
    common::wait_until(
        "every flood line accounted for",
        Duration::from_secs(20),
        || {
            let (logged, suppressed) = count();
            logged + suppressed == 200_000
        },
    );
    let (logged, _) = count();
    // At most 200 lines a second were logged over the flood, counting a
    // partial second at each end.
    let seconds = started.elapsed().as_secs() + 2;
    assert!(
        logged <= 200 * seconds,
        "{logged} lines logged in under {seconds} s"
    );
    assert!(logged >= 200, "the first 200 lines are logged: {logged}");
    neighbour_answers(&mut bus).await;
}

#[tokio::test]
async fn a_childs_own_requests_are_refused_at_once_and_list_changes_are_followed() {
    let s = Setup::new("requests", "", "");
    let daemon = Daemon::start(s.dir.path());
    let mut bus = Bus::connect(&daemon.url).await;
    // The child asks toolboxd for sampling mid-call: "method not found", at once.
    let (data, took) = call(&mut bus, "faulty", "ask_client", json!({})).await;
    assert_eq!(data["result"], json!({"code": -32601}), "{data}");
    assert!(took < Duration::from_secs(2), "{took:?}");
    // notifications/tools/list_changed makes the daemon list the tools again.
    let (data, _) = call(&mut bus, "faulty", "grow", json!({})).await;
    assert_eq!(data["result"], json!({"ok": true}));
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let r = bus
            .request("ovos.tools.get", json!({"name": "grown"}))
            .await;
        if r["data"]["toolbox_id"] == "faulty" {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the new tool never appeared: {r}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (data, _) = call(&mut bus, "faulty", "grown", json!({})).await;
    assert_eq!(data["result"], json!({"ok": true}));
}

#[tokio::test]
async fn restart_policy_never_and_on_failure_leave_the_toolbox_failed() {
    let dir = TempDir::new("policy");
    let toolbox = |id: &str, policy: &str| {
        format!(
            "id = \"{id}\"\ncommand = \"python3\"\nargs = [\"{}\"]\n[restart]\npolicy = \"{policy}\"\nbackoff_initial_ms = 50\n",
            repo("tests/fixtures/faulty_toolbox.py")
        )
    };
    dir.write("never.toml", &toolbox("never", "never"));
    dir.write("onfail.toml", &toolbox("onfail", "on-failure"));
    dir.write("onfail2.toml", &toolbox("onfail2", "on-failure"));
    let daemon = Daemon::start(dir.path());
    let mut bus = Bus::connect(&daemon.url).await;
    // never: even a failure is not restarted.
    let (data, _) = call(&mut bus, "never", "crash", json!({"code": 3})).await;
    assert!(
        data["error"].as_str().unwrap().contains("exited (code 3)"),
        "{data}"
    );
    let row = daemon.wait_for_state("never", "failed", Duration::from_secs(5));
    assert!(
        row["reason"]
            .as_str()
            .unwrap()
            .contains("restart policy Never does not restart it"),
        "{row}"
    );
    let (data, took) = call(&mut bus, "never", "ok", json!({})).await;
    let e = data["error"].as_str().unwrap();
    assert!(
        e.starts_with("RuntimeError: toolbox 'never' is failed: the child exited (code 3)"),
        "{e}"
    );
    assert!(took < Duration::from_secs(1), "{took:?}");
    // on-failure: a clean exit stays down...
    let (data, _) = call(&mut bus, "onfail", "crash", json!({"code": 0})).await;
    assert!(
        data["error"].as_str().unwrap().contains("exited (code 0)"),
        "{data}"
    );
    let row = daemon.wait_for_state("onfail", "failed", Duration::from_secs(5));
    assert!(
        row["reason"]
            .as_str()
            .unwrap()
            .contains("restart policy OnFailure does not restart it"),
        "{row}"
    );
    // ...and a failure is restarted.
    let (data, _) = call(&mut bus, "onfail2", "crash", json!({"code": 2})).await;
    assert!(
        data["error"].as_str().unwrap().contains("exited (code 2)"),
        "{data}"
    );
    let (data, _) = call(&mut bus, "onfail2", "ok", json!({})).await;
    assert_eq!(data["result"], json!({"ok": true}));
    assert_eq!(daemon.status("onfail2")["restarts"], 1);
}

#[tokio::test]
async fn restarts_older_than_window_s_leave_the_budget() {
    let s = Setup::new(
        "window",
        "",
        "[restart]\nbackoff_initial_ms = 50\nbackoff_max_ms = 50\nmax_restarts = 1\nwindow_s = 3\n",
    );
    let daemon = Daemon::start(s.dir.path());
    let mut bus = Bus::connect(&daemon.url).await;
    let (data, _) = call(&mut bus, "faulty", "crash", json!({"code": 3})).await;
    assert!(data["error"].is_string());
    let first_crash = Instant::now();
    // The budget (1 restart in 3 s) is spent; once that restart is older
    // than window_s, another crash is restarted again.
    daemon.wait_for_state("faulty", "ready", Duration::from_secs(10));
    let expired = Duration::from_millis(3300).saturating_sub(first_crash.elapsed());
    tokio::time::sleep(expired).await; // the window itself is what is tested
    let (data, _) = call(&mut bus, "faulty", "crash", json!({"code": 3})).await;
    assert!(data["error"].is_string());
    let row = daemon.wait_for_state("faulty", "ready", Duration::from_secs(10));
    assert_eq!(row["restarts"], 2);
    // A third crash inside the window of the second is over the budget.
    let (data, _) = call(&mut bus, "faulty", "crash", json!({"code": 3})).await;
    assert!(data["error"].is_string());
    let row = daemon.wait_for_state("faulty", "failed", Duration::from_secs(5));
    assert!(
        row["reason"]
            .as_str()
            .unwrap()
            .contains("more than 1 restarts within 3 s"),
        "{row}"
    );
}

/// A manifests directory whose `fixture` refuses to start while `flag` exists.
fn refusing_fixture(tag: &str, restart: &str) -> (TempDir, std::path::PathBuf) {
    let dir = TempDir::new(tag);
    let flag = dir.path().join("refuse");
    std::fs::write(&flag, "").unwrap();
    dir.write(
        "fixture.toml",
        &fixture_manifest(
            "fixture",
            &format!(
                "env = {{ FAIL_IF_EXISTS = \"{}\" }}\n[restart]\nbackoff_initial_ms = 50\nmax_restarts = 1\n{restart}",
                flag.display()
            ),
        ),
    );
    dir.write("math.toml", &math_manifest("math"));
    (dir, flag)
}

#[tokio::test]
async fn a_failed_toolbox_is_tried_again_after_failed_retry_s() {
    let (dir, flag) = refusing_fixture("retry", "failed_retry_s = 2\n");
    let daemon = Daemon::start(dir.path());
    daemon.wait_for_state("fixture", "failed", Duration::from_secs(10));
    let failed_at = Instant::now();
    std::fs::remove_file(&flag).unwrap();
    let row = daemon.wait_for_state("fixture", "ready", Duration::from_secs(10));
    let after = failed_at.elapsed();
    assert!(
        after >= Duration::from_millis(1000),
        "tried again {after:?} after failing, before the 2 s cool-down"
    );
    assert!(row["pids"].as_array().unwrap().len() == 1, "{row}");
    let mut bus = Bus::connect(&daemon.url).await;
    assert_eq!(
        bus.call("fixture", "add", json!({"a": 1, "b": 1})).await["result"]["result"],
        2
    );
}

#[tokio::test]
async fn ctl_start_brings_a_failed_toolbox_back_at_once() {
    let (dir, flag) = refusing_fixture("ctlstart", "failed_retry_s = 300\n");
    let daemon = Daemon::start(dir.path());
    daemon.wait_for_state("fixture", "failed", Duration::from_secs(10));
    std::fs::remove_file(&flag).unwrap();
    let (code, out, err) = daemon.ctl(&["start", "fixture"]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("started, pid"), "{out}");
    assert_eq!(daemon.status("fixture")["state"], "ready");
    let mut bus = Bus::connect(&daemon.url).await;
    assert_eq!(
        bus.call("fixture", "add", json!({"a": 2, "b": 2})).await["result"]["result"],
        4
    );
}

#[tokio::test]
async fn calls_in_flight_fail_when_the_liveness_probe_kills_the_child() {
    let s = Setup::new(
        "probe-inflight",
        "no_probe",
        &format!("protocol = \"2025-06-18\"\n{FAST_RESTART}[limits]\nprobe_interval_s = 1\nprobe_timeout_s = 1\n"),
    );
    let daemon = Daemon::start(s.dir.path());
    let mut bus = Bus::connect(&daemon.url).await;
    let (data, took) = call(&mut bus, "faulty", "hang", json!({})).await;
    assert_eq!(
        data["error"],
        "RuntimeError: toolbox 'faulty' exited (signal 9) while running 'hang'"
    );
    assert!(took < Duration::from_secs(15), "{took:?}");
    neighbour_answers(&mut bus).await;
}

#[tokio::test]
async fn a_modern_child_is_probed_with_server_discover() {
    let s = Setup::new(
        "probe-modern",
        "no_probe_after_start",
        &format!("{FAST_RESTART}[limits]\nprobe_interval_s = 1\nprobe_timeout_s = 1\n"),
    );
    let daemon = Daemon::start(s.dir.path());
    let row = daemon.status("faulty");
    assert_eq!(row["era"], "modern MCP 2026-07-28", "{row}");
    let first = row["pids"][0].as_u64().unwrap();
    common::wait_until(
        "the silent child is restarted",
        Duration::from_secs(15),
        || {
            let row = daemon.status("faulty");
            row["state"] == "ready" && row["pids"][0].as_u64().is_some_and(|p| p != first)
        },
    );
    assert!(daemon.status("faulty")["last_exit"]
        .as_str()
        .unwrap()
        .contains("signal 9"));
    // The probe was server/discover (after the listing), never ping.
    let methods: Vec<String> = s
        .received()
        .iter()
        .filter_map(|m| m["method"].as_str().map(str::to_owned))
        .collect();
    let listed = methods.iter().position(|m| m == "tools/list").unwrap();
    assert!(
        methods[listed..].iter().any(|m| m == "server/discover"),
        "{methods:?}"
    );
    assert!(!methods.iter().any(|m| m == "ping"), "{methods:?}");
}

#[tokio::test]
async fn a_probe_answered_after_its_deadline_still_decides_the_era_and_costs_no_restart() {
    // server/discover answered 2 s late (probe_timeout_s = 1), and
    // initialize refused once the probe was seen: the late answer decides.
    let dir = TempDir::new("late-probe");
    dir.write(
        "late.toml",
        &common::fixture_manifest(
            "late",
            "env = { DISCOVER_DELAY_S = \"2\" }\n[limits]\nprobe_timeout_s = 1\n",
        ),
    );
    let daemon = Daemon::start(dir.path());
    let row = daemon.status("late");
    assert_eq!(row["state"], "ready", "{row}");
    assert_eq!(row["era"], "modern MCP 2026-07-28", "{row}");
    assert_eq!(row["restarts"], 0, "{row}");
    assert_eq!(row["last_exit"], Value::Null, "{row}");
}

#[tokio::test]
async fn each_instance_has_its_own_restart_budget() {
    let s = Setup::new(
        "instance-budget",
        "",
        "instances = 2\n[restart]\nbackoff_initial_ms = 50\nmax_restarts = 1\nwindow_s = 60\n",
    );
    let daemon = Daemon::start(s.dir.path());
    let pids = |daemon: &Daemon| -> Vec<i32> {
        daemon.status("faulty")["pids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p.as_i64().unwrap() as i32)
            .collect()
    };
    let kill = |pid: i32| {
        nix::sys::signal::killpg(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        )
        .unwrap()
    };
    let start = pids(&daemon);
    assert_eq!(start.len(), 2);
    // Instance A dies twice: its budget of one restart is spent.
    kill(start[0]);
    common::wait_until("instance A restarted", Duration::from_secs(10), || {
        let now = pids(&daemon);
        now.len() == 2 && !now.contains(&start[0])
    });
    let a2 = *pids(&daemon).iter().find(|p| **p != start[1]).unwrap();
    kill(a2);
    common::wait_until("instance A failed", Duration::from_secs(10), || {
        daemon.status("faulty")["restarts"] == 1 && pids(&daemon) == [start[1]]
    });
    // Instance B's budget is untouched: its first death is restarted.
    kill(start[1]);
    common::wait_until("instance B restarted", Duration::from_secs(10), || {
        let now = pids(&daemon);
        now.len() == 1 && now[0] != start[1]
    });
    let row = daemon.status("faulty");
    assert_eq!(row["state"], "ready", "{row}");
    assert_eq!(row["restarts"], 2, "{row}");
    let mut bus = Bus::connect(&daemon.url).await;
    let (data, _) = call(&mut bus, "faulty", "ok", json!({})).await;
    assert_eq!(data["result"], json!({"ok": true}));
}

#[tokio::test]
async fn the_era_found_is_kept_and_a_later_start_of_the_same_toolbox_does_not_probe() {
    let s = Setup::new("era-kept", "", "");
    let methods = |s: &Setup| -> Vec<String> {
        s.received()
            .iter()
            .filter_map(|m| m["method"].as_str().map(str::to_owned))
            .collect()
    };
    let mut daemon = Daemon::start(s.dir.path());
    let era = daemon.status("faulty")["era"].clone();
    daemon.stop();
    let first = methods(&s);
    assert_eq!(
        first.first().map(String::as_str),
        Some("server/discover"),
        "{first:?}"
    );
    std::fs::remove_file(s.dir.path().join("received.jsonl")).unwrap();
    // The same toolbox, started again by a new daemon: no probe.
    let daemon = Daemon::start(s.dir.path());
    assert_eq!(daemon.status("faulty")["era"], era);
    let second = methods(&s);
    let listed = second.iter().position(|m| m == "tools/list").unwrap();
    assert!(
        !second[..listed].iter().any(|m| m == "server/discover"),
        "{second:?}"
    );
}
