//! Fault injection (DESIGN §6): one fixture child per fault. Each test checks
//! what the caller gets (text and how fast), the toolbox's state, and that the
//! neighbour toolbox kept answering.

mod common;

use std::time::{Duration, Instant};

use common::{free_port, math_manifest, repo, start_bus, Bus, Daemon, TempDir};
use serde_json::{json, Value};

/// A manifests directory with the fault fixture (`faulty`) and a neighbour (`math`).
struct Setup {
    dir: TempDir,
    mark: String,
}

impl Setup {
    fn new(tag: &str, fault: &str, extra: &str) -> Setup {
        let dir = TempDir::new(tag);
        let mark = format!("toolboxd-fixture-{tag}-{}", std::process::id());
        let record = dir.path().join("received.jsonl");
        dir.write("math.toml", &math_manifest("math"));
        dir.write(
            "faulty.toml",
            &format!(
                "id = \"faulty\"\ncommand = \"python3\"\nargs = [\"{}\", \"{mark}\"]\n\
                 env = {{ FAULT = \"{fault}\", FIXTURE_MARK = \"{mark}\", MCP_TOOLBOX_RECORD = \"{}\" }}\n{extra}\n",
                repo("tests/fixtures/faulty_toolbox.py"),
                record.display()
            ),
        );
        Setup { dir, mark }
    }

    fn received(&self) -> Vec<Value> {
        std::fs::read_to_string(self.dir.path().join("received.jsonl"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }
}

const FAST_RESTART: &str = "[restart]\nbackoff_initial_ms = 50\nbackoff_max_ms = 200\n";

/// A persona call and how long its answer took.
async fn call(bus: &mut Bus, toolbox: &str, name: &str, kwargs: Value) -> (Value, Duration) {
    let started = Instant::now();
    let data = bus.call(toolbox, name, kwargs).await;
    (data, started.elapsed())
}

async fn neighbour_answers(bus: &mut Bus) {
    let (data, took) = call(bus, "math", "add", json!({"a": 20, "b": 22})).await;
    assert_eq!(data["result"]["result"], 42, "neighbour: {data}");
    assert!(took < Duration::from_secs(2), "neighbour took {took:?}");
}

/// Pids of processes whose command line contains `mark`.
fn processes_with(mark: &str) -> Vec<u32> {
    let me = std::process::id();
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| pid != me)
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .map(|c| String::from_utf8_lossy(&c).contains(mark))
                .unwrap_or(false)
        })
        .filter(|pid| {
            // A zombie is gone for our purposes only once reaped; count it.
            std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok()
        })
        .collect()
}

fn wait_until_gone(mark: &str, within: Duration) {
    let deadline = Instant::now() + within;
    loop {
        let left = processes_with(mark);
        if left.is_empty() {
            return;
        }
        let described: Vec<String> = left
            .iter()
            .map(|pid| {
                let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
                let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
                format!(
                    "{pid}: {} [{}]",
                    String::from_utf8_lossy(&cmd).replace('\0', " "),
                    stat.trim()
                )
            })
            .collect();
        assert!(
            Instant::now() < deadline,
            "processes left behind: {described:#?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[tokio::test]
async fn crash_mid_call_fails_that_call_at_once_and_restarts() {
    let s = Setup::new("crash", "", FAST_RESTART);
    let daemon = Daemon::start(s.dir.path());
    let mut bus = Bus::connect(&daemon.url).await;
    let pid = daemon.status("faulty")["pids"][0].as_u64().unwrap();
    let (data, took) = call(&mut bus, "faulty", "crash", json!({"code": 3})).await;
    assert_eq!(
        data["error"],
        "RuntimeError: toolbox 'faulty' exited (code 3) while running 'crash'"
    );
    assert!(took < Duration::from_secs(2), "{took:?}");
    neighbour_answers(&mut bus).await;
    // The next call waits for the new child instead of failing.
    let (data, _) = call(&mut bus, "faulty", "ok", json!({})).await;
    assert_eq!(data["result"], json!({"ok": true}));
    let row = daemon.wait_for_state("faulty", "ready", Duration::from_secs(10));
    assert_eq!(row["restarts"], 1);
    assert_eq!(row["last_exit"], "exited (code 3)");
    assert_ne!(row["pids"][0].as_u64().unwrap(), pid);
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
    let deadline = Instant::now() + Duration::from_secs(5);
    while !s.received().iter().any(|m| m["params"]["name"] == "hang") {
        assert!(Instant::now() < deadline);
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let killed = Instant::now();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child_pid),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let answers = bus
        .collect(
            "ovos.persona.tools.call.response",
            "hung",
            Duration::from_secs(3),
        )
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
    // A failed toolbox is hosted but not listed.
    let r = bus.request("ovos.tools.list", json!({})).await;
    assert!(r["data"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .all(|t| t["toolbox_id"] == "math"));
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
    let first = daemon.status("faulty")["pids"][0].as_u64().unwrap();
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
        &format!("{FAST_RESTART}[limits]\nmax_message_bytes = 4096\n"),
    );
    let daemon = Daemon::start(s.dir.path());
    let mut bus = Bus::connect(&daemon.url).await;
    let (data, took) = call(&mut bus, "faulty", "oversize", json!({"size": 100000})).await;
    let e = data["error"].as_str().unwrap();
    assert!(
        e.starts_with("RuntimeError: toolbox 'faulty' failed while running 'oversize': "),
        "{e}"
    );
    assert!(e.contains("longer than max_message_bytes (4096)"), "{e}");
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
    bus.send(
        "ovos.persona.tools.call",
        json!({"toolbox_id": "faulty", "name": "flood", "kwargs": {"lines": 200000}}),
        json!({"mark": "flood"}),
    )
    .await;
    // While it floods, the neighbour answers.
    neighbour_answers(&mut bus).await;
    let answers = bus
        .collect(
            "ovos.persona.tools.call.response",
            "flood",
            Duration::from_secs(20),
        )
        .await;
    assert_eq!(answers[0]["data"]["result"], json!({"ok": true}));
    let logged = daemon
        .logs
        .lock()
        .unwrap()
        .iter()
        .filter(|l| l.contains("stderr flood line"))
        .count();
    assert!(logged < 20_000, "{logged} of 200000 lines logged");
    assert!(!daemon
        .log_lines_with("stderr flood: lines not logged")
        .is_empty());
    neighbour_answers(&mut bus).await;
}

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
    // The grandchild (its command line ends with the mark) is gone.
    wait_until_gone(
        &format!("time.sleep(300)\0{}", s.mark),
        Duration::from_secs(5),
    );
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
    // The leader, the fixture child and its grandchild all carry the mark.
    assert_eq!(
        processes_with(&s.mark).len(),
        3,
        "{:?}",
        processes_with(&s.mark)
    );
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
    let port = free_port();
    let mut bus_process = start_bus(port);
    let url = format!("ws://127.0.0.1:{port}/core");
    let dir = TempDir::new("drain");
    dir.write("math.toml", &math_manifest("math"));
    let mut daemon =
        Daemon::start_with(&["--manifests", dir.path().to_str().unwrap(), "--bus", &url]);
    let mut bus = Bus::connect(&url).await;
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
        .collect("ovos.tools.invoke.response", "long", Duration::from_secs(5))
        .await;
    assert_eq!(answers.len(), 1);
    assert_eq!(answers[0]["data"]["result"], json!({"slept": 1}));
    assert!(stopping.join().unwrap().success());
    bus_process.kill().unwrap();
    bus_process.wait().unwrap();
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
