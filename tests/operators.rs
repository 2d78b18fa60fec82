//! Operators (`toolboxd ctl`, docs/operations.md): the control socket, rolling restart under
//! load, stop/start, manifest reload as a diff, and systemd notifications.

mod common;

use std::collections::HashMap;
use std::os::unix::fs::PermissionsExt;
use std::time::{Duration, Instant};

use common::{fixture_manifest, math_manifest, text_manifest, Bus, Daemon, TempDir, BIN};
use serde_json::{json, Value};

#[test]
fn the_control_socket_is_private_and_a_second_daemon_refuses_it() {
    let dir = TempDir::new("ctl-sock");
    dir.write("math.toml", &math_manifest("math"));
    let daemon = Daemon::start(dir.path());
    let mode = std::fs::metadata(&daemon.control)
        .unwrap()
        .permissions()
        .mode()
        & 0o777;
    assert_eq!(mode, 0o600, "control socket mode {mode:o}");

    let out = std::process::Command::new(BIN)
        .args(["run", "--embedded-bus", "127.0.0.1:0", "--manifests"])
        .arg(dir.path())
        .arg("--control")
        .arg(&daemon.control)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("another toolboxd is running on the control socket"),
        "{err}"
    );
    // The first daemon is untouched.
    assert_eq!(daemon.status("math")["state"], "ready");
}

#[test]
fn a_stale_control_socket_is_recovered() {
    let dir = TempDir::new("ctl-stale");
    dir.write("math.toml", &math_manifest("math"));
    let sock_dir = TempDir::new("stale");
    let path = sock_dir.path().join("ctl.sock");
    drop(std::os::unix::net::UnixListener::bind(&path).unwrap()); // leaves the file behind
    assert!(path.exists());
    let mut daemon = Daemon::start_with(&[
        "--manifests",
        dir.path().to_str().unwrap(),
        "--embedded-bus",
        "127.0.0.1:0",
        "--control",
        path.to_str().unwrap(),
    ]);
    assert_eq!(daemon.status("math")["state"], "ready");
    assert!(daemon.stop().success());
    assert!(!path.exists(), "the socket is removed on exit");
}

#[tokio::test]
async fn status_shows_every_column_as_table_and_json() {
    let dir = TempDir::new("status");
    dir.write("math.toml", &math_manifest("math"));
    dir.write("text.toml", &text_manifest("text"));
    let daemon = Daemon::start(dir.path());
    let mut bus = Bus::connect(&daemon.url).await;
    for i in 0..5 {
        assert_eq!(
            bus.call("math", "add", json!({"a": i, "b": 1})).await["result"]["result"],
            i + 1
        );
    }
    assert!(bus.call("math", "sqrt", json!({"number": -1})).await["error"].is_string());
    let row = daemon.status("math");
    let pid = row["pids"][0].as_u64().expect("one pid");
    assert!(row["uptime_s"].is_u64(), "{row}");
    assert!(
        row["p50_ms"].as_f64().unwrap() > 0.0
            && row["p99_ms"].as_f64().unwrap() >= row["p50_ms"].as_f64().unwrap(),
        "{row}"
    );
    // Every documented field, with its value (null only where documented).
    let mut expected = json!({
        "id": "math", "state": "ready", "reason": null, "pids": [pid], "instances": 1,
        "era": "modern MCP 2026-07-28", "tools": 4, "restarts": 0, "last_exit": null,
        "calls_ok": 5, "calls_err": 1, "in_flight": 0, "conflict": null,
    });
    for key in [
        "uptime_s",
        "p50_ms",
        "p99_ms",
        "sandbox",
        "cold_start_ms",
        "processes",
        "memory_bytes",
        "cpu_s",
    ] {
        expected[key] = row[key].clone();
    }
    assert_eq!(row, expected);
    assert_eq!(row["sandbox"][0], "standard", "{row}");
    // The child's tree: one Python process, megabytes of memory, some CPU.
    assert_eq!(row["processes"], 1, "{row}");
    assert!(row["memory_bytes"].as_u64().unwrap() > 1 << 20, "{row}");
    assert!(row["cpu_s"].as_f64().unwrap() > 0.0, "{row}");
    let text = daemon.status("text");
    assert_eq!(text["era"], "legacy MCP 2025-06-18", "{text}");
    assert_eq!(text["tools"], 2, "{text}");

    // The table: its header, and the math row column by column.
    let (code, table, _) = daemon.ctl(&["status"]);
    assert_eq!(code, 0);
    let header: Vec<&str> = table.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(
        header,
        [
            "ID",
            "STATE",
            "PID",
            "UPTIME",
            "MEM_MIB",
            "CPU_S",
            "TOOLS",
            "RESTARTS",
            "CALLS_OK",
            "CALLS_ERR",
            "FLIGHT",
            "P50_MS",
            "P99_MS",
            "LAST_EXIT"
        ]
    );
    let math: Vec<&str> = table
        .lines()
        .find(|l| l.starts_with("math "))
        .unwrap_or_else(|| panic!("no math row: {table}"))
        .split_whitespace()
        .collect();
    let pid = pid.to_string();
    assert_eq!(
        (&math[..3], &math[6..11], math[13]),
        (
            &["math", "ready", pid.as_str()][..],
            &["4", "0", "5", "1", "0"][..],
            "-"
        ),
        "{table}"
    );
    assert!(
        math[3].ends_with('s')
            && math[4].parse::<f64>().is_ok_and(|m| m > 1.0)
            && math[5].parse::<f64>().is_ok()
            && math[11].parse::<f64>().is_ok(),
        "{table}"
    );
    assert!(table.lines().any(|l| l.starts_with("text ")), "{table}");
    let (code, _, err) = daemon.ctl(&["restart", "nope"]);
    assert_eq!(code, 1);
    assert!(err.contains("no toolbox \"nope\""), "{err}");
}

/// Closed-loop load on `fixture.add` from several connections until `stop`;
/// returns (answers by mark, calls sent).
async fn load(
    url: String,
    conn: usize,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> (HashMap<String, Vec<Value>>, usize) {
    let mut bus = Bus::connect(&url).await;
    let mut answers: HashMap<String, Vec<Value>> = HashMap::new();
    let mut sent = 0;
    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
        let mark = format!("l{conn}-{sent}");
        bus.send(
            "ovos.persona.tools.call",
            json!({"toolbox_id": "fixture", "name": "add", "kwargs": {"a": sent, "b": 1}}),
            json!({"mark": mark}),
        )
        .await;
        sent += 1;
        loop {
            let m = bus
                .next(common::ANSWER_DEADLINE)
                .await
                .expect("an answer within the deadline");
            if m["type"] == "ovos.persona.tools.call.response" {
                if let Some(k) = m["context"]["mark"].as_str() {
                    if k.starts_with(&format!("l{conn}-")) {
                        answers
                            .entry(k.to_owned())
                            .or_default()
                            .push(m["data"].clone());
                        if k == mark {
                            break;
                        }
                    }
                }
            }
        }
    }
    // Late duplicates, if any.
    while let Some(m) = bus.next(common::SILENCE_WINDOW).await {
        if let Some(k) = m["context"]["mark"].as_str() {
            if k.starts_with(&format!("l{conn}-"))
                && m["type"] == "ovos.persona.tools.call.response"
            {
                answers
                    .entry(k.to_owned())
                    .or_default()
                    .push(m["data"].clone());
            }
        }
    }
    (answers, sent)
}

/// How long the call that spans a rolling restart runs.
const SLOW_S: f64 = 5.0;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rolling_restart_under_load_fails_no_call() {
    let dir = TempDir::new("rolling");
    dir.write("fixture.toml", &fixture_manifest("fixture", ""));
    let daemon = Daemon::start(dir.path());
    let mut bus = Bus::connect(&daemon.url).await;
    let before = bus.call("fixture", "whoami", json!({})).await["result"]["pid"].clone();
    // A call that lasts longer than the swap.
    let slow_sent = Instant::now();
    bus.send(
        "ovos.persona.tools.call",
        json!({"toolbox_id": "fixture", "name": "slow_whoami", "kwargs": {"seconds": SLOW_S}}),
        json!({"mark": "slow"}),
    )
    .await;

    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let loads: Vec<_> = (0..4)
        .map(|c| tokio::spawn(load(daemon.url.clone(), c, stop.clone())))
        .collect();
    // Let the load run, then restart in the middle of it.
    let deadline = Instant::now() + Duration::from_secs(10);
    while daemon.status("fixture")["calls_ok"].as_u64().unwrap() < 200 {
        assert!(Instant::now() < deadline, "load never got going");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (code, out, err) = tokio::task::spawn_blocking({
        let control = daemon.control.clone();
        move || {
            let o = std::process::Command::new(BIN)
                .args([
                    "ctl",
                    "--control",
                    control.to_str().unwrap(),
                    "restart",
                    "fixture",
                ])
                .output()
                .unwrap();
            (
                o.status.code(),
                String::from_utf8_lossy(&o.stdout).into_owned(),
                String::from_utf8_lossy(&o.stderr).into_owned(),
            )
        }
    })
    .await
    .unwrap();
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(out.contains("restarted: pid"), "{out}");
    // The swap happened while the slow call was still running (it cannot
    // finish before SLOW_S), so it overlapped the restart.
    let swapped = slow_sent.elapsed();
    assert!(
        swapped < Duration::from_secs_f64(SLOW_S),
        "the swap came {swapped:?} after the slow call: no overlap"
    );
    let ok_at_restart = daemon.status("fixture")["calls_ok"].as_u64().unwrap();
    // Keep the load going well past the swap.
    let deadline = Instant::now() + common::ANSWER_DEADLINE;
    while daemon.status("fixture")["calls_ok"].as_u64().unwrap() < ok_at_restart + 200 {
        assert!(Instant::now() < deadline, "the load stalled after the swap");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut total = 0;
    for (c, task) in loads.into_iter().enumerate() {
        let (answers, sent) = task.await.unwrap();
        assert_eq!(
            answers.len(),
            sent,
            "connection {c}: {} answers for {sent} calls",
            answers.len()
        );
        for (mark, got) in &answers {
            assert_eq!(got.len(), 1, "{mark} answered {} times", got.len());
            assert!(got[0].get("error").is_none(), "{mark}: {}", got[0]);
            let i: u64 = mark.rsplit('-').next().unwrap().parse().unwrap();
            assert_eq!(got[0]["result"]["result"], i + 1);
        }
        total += sent;
    }
    assert!(total >= 400, "{total} calls");

    // The long call finished on the old child; new calls go to the new one.
    let slow = bus
        .expect_answers("ovos.persona.tools.call.response", "slow", 1)
        .await;
    assert_eq!(slow.len(), 1);
    assert_eq!(
        slow[0]["data"]["result"]["pid"], before,
        "the slow call ran on the old child"
    );
    let after = bus.call("fixture", "whoami", json!({})).await["result"]["pid"].clone();
    assert_ne!(after, before);
    let row = daemon.status("fixture");
    assert_eq!(row["restarts"], 1);
    assert_eq!(row["calls_err"], 0);
}

#[tokio::test]
async fn a_restart_that_cannot_start_leaves_the_old_child_serving() {
    let dir = TempDir::new("restart-fail");
    let flag = dir.path().join("fail-now");
    dir.write(
        "fixture.toml",
        &fixture_manifest(
            "fixture",
            &format!("env = {{ FAIL_IF_EXISTS = \"{}\" }}", flag.display()),
        ),
    );
    let daemon = Daemon::start(dir.path());
    let mut bus = Bus::connect(&daemon.url).await;
    let before = bus.call("fixture", "whoami", json!({})).await["result"]["pid"].clone();
    std::fs::write(&flag, "").unwrap();
    let (code, _, err) = daemon.ctl(&["restart", "fixture"]);
    assert_eq!(code, 1);
    assert!(
        err.contains("restart failed") && err.contains("keeps serving") && err.contains("code 4"),
        "{err}"
    );
    assert_eq!(
        bus.call("fixture", "whoami", json!({})).await["result"]["pid"],
        before
    );
    assert_eq!(daemon.status("fixture")["state"], "ready");
}

#[tokio::test]
async fn stop_and_start_one_toolbox() {
    let dir = TempDir::new("stopstart");
    dir.write("math.toml", &math_manifest("math"));
    dir.write("text.toml", &text_manifest("text"));
    let daemon = Daemon::start(dir.path());
    let (code, out, _) = daemon.ctl(&["stop", "math"]);
    assert_eq!(code, 0);
    assert!(out.contains("stopped"), "{out}");
    assert_eq!(daemon.status("math")["state"], "stopped");
    let mut bus = Bus::connect(&daemon.url).await;
    // Not hosted: silence on the persona topic, unknown on the tool service.
    bus.send(
        "ovos.persona.tools.call",
        json!({"toolbox_id": "math", "name": "add", "kwargs": {"a": 1, "b": 1}}),
        json!({"mark": "to-stopped"}),
    )
    .await;
    bus.assert_silence(&["to-stopped"]).await;
    let r = bus
        .request(
            "ovos.tools.invoke",
            json!({"name": "add", "args": {"a": 1, "b": 1}}),
        )
        .await;
    assert_eq!(r["data"]["error"], "Unknown tool: 'add'");
    // The neighbour never noticed.
    assert_eq!(
        bus.call("text", "shout", json!({"text": "x"})).await["result"]["text"],
        "X"
    );
    let (code, out, _) = daemon.ctl(&["start", "math"]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("started, pid"), "{out}");
    assert_eq!(
        bus.call("math", "add", json!({"a": 1, "b": 1})).await["result"]["result"],
        2
    );
}

fn pid_of(daemon: &Daemon, id: &str) -> u64 {
    daemon.status(id)["pids"][0].as_u64().unwrap()
}

#[tokio::test]
async fn reload_applies_the_manifest_diff() {
    let dir = TempDir::new("reload");
    dir.write("keep.toml", &text_manifest("keep"));
    dir.write("change.toml", &math_manifest("change"));
    dir.write("remove.toml", &fixture_manifest("remove", ""));
    let daemon = Daemon::start(dir.path());
    let mut bus = Bus::connect(&daemon.url).await;
    let keep_pid = pid_of(&daemon, "keep");
    let change_pid = pid_of(&daemon, "change");

    dir.write("added.toml", &fixture_manifest("added", ""));
    dir.write(
        "change.toml",
        &format!("{}env = {{ CHANGED = \"1\" }}\n", math_manifest("change")),
    );
    std::fs::remove_file(dir.path().join("remove.toml")).unwrap();
    let (code, out, err) = daemon.ctl(&["reload"]);
    assert_eq!(code, 0, "{out}{err}");
    let report: Value = serde_json::from_str(&out).unwrap();
    let mut loaded: Vec<&str> = report["loaded"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    loaded.sort();
    assert_eq!(loaded, ["added", "change", "keep"]);

    assert_eq!(
        pid_of(&daemon, "keep"),
        keep_pid,
        "untouched toolbox kept its child"
    );
    assert_ne!(
        pid_of(&daemon, "change"),
        change_pid,
        "changed toolbox got a new child"
    );
    let r = bus.request("ovos.tools.list", json!({})).await;
    let owners: Vec<&str> = r["data"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["toolbox_id"].as_str().unwrap())
        .collect();
    assert!(
        owners.contains(&"added") && !owners.contains(&"remove"),
        "{owners:?}"
    );
    assert_eq!(
        bus.call("added", "add", json!({"a": 1, "b": 2})).await["result"]["result"],
        3
    );
    let (_, rows, _) = daemon.ctl(&["status", "--json"]);
    assert!(!rows.contains("\"remove\""), "{rows}");

    // A manifest that became invalid: reported, and its toolbox keeps serving.
    dir.write(
        "keep.toml",
        &format!("{}bogus_key = 1\n", text_manifest("keep")),
    );
    let (code, out, _) = daemon.ctl(&["reload"]);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("keep.toml") && out.contains("bogus_key"),
        "{out}"
    );
    assert_eq!(pid_of(&daemon, "keep"), keep_pid);
    assert_eq!(
        bus.call("keep", "shout", json!({"text": "still"})).await["result"]["text"],
        "STILL"
    );

    // The bus topic reports the same error, with the Python service's fields.
    let r = bus.request("ovos.tools.reload", json!({})).await;
    let errors = r["data"]["errors"].as_array().unwrap();
    assert!(
        errors
            .iter()
            .any(|e| e["manifest"].as_str().unwrap().ends_with("keep.toml")),
        "{errors:?}"
    );
    assert!(r["data"]["total_tools"].as_u64().unwrap() > 0);
}

#[tokio::test]
async fn sighup_reloads() {
    let dir = TempDir::new("sighup");
    dir.write("math.toml", &math_manifest("math"));
    let daemon = Daemon::start(dir.path());
    dir.write("text.toml", &text_manifest("text"));
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(daemon.pid() as i32),
        nix::sys::signal::Signal::SIGHUP,
    )
    .unwrap();
    daemon.wait_for_state("text", "ready", Duration::from_secs(10));
}

#[test]
fn systemd_hears_ready_reloading_watchdog_and_stopping() {
    let dir = TempDir::new("notify");
    dir.write("math.toml", &math_manifest("math"));
    let sock_dir = TempDir::new("notify-sock");
    let path = sock_dir.path().join("notify.sock");
    let systemd = std::os::unix::net::UnixDatagram::bind(&path).unwrap();
    systemd
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut daemon = Daemon::start_env(
        &[
            "--manifests",
            dir.path().to_str().unwrap(),
            "--embedded-bus",
            "127.0.0.1:0",
        ],
        &[
            ("NOTIFY_SOCKET", path.to_str().unwrap()),
            ("WATCHDOG_USEC", "200000"),
        ],
    );
    let mut buf = [0u8; 512];
    let mut next = || {
        let n = systemd.recv(&mut buf).expect("a notification");
        String::from_utf8_lossy(&buf[..n]).into_owned()
    };
    let first = next();
    assert!(first.starts_with("READY=1"), "{first}");
    assert_eq!(next(), "WATCHDOG=1");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(daemon.pid() as i32),
        nix::sys::signal::Signal::SIGHUP,
    )
    .unwrap();
    let mut seen = Vec::new();
    while !seen.iter().any(|m: &String| m == "READY=1") {
        seen.push(next());
    }
    let reloading = seen
        .iter()
        .position(|m| m.starts_with("RELOADING=1\nMONOTONIC_USEC="))
        .expect("RELOADING=1");
    assert!(reloading < seen.len() - 1, "{seen:?}");
    assert!(daemon.stop().success());
    let mut tail = Vec::new();
    while let Ok(n) = systemd.recv(&mut buf) {
        tail.push(String::from_utf8_lossy(&buf[..n]).into_owned());
        if tail.last().unwrap() == "STOPPING=1" {
            break;
        }
    }
    assert_eq!(
        tail.last().map(String::as_str),
        Some("STOPPING=1"),
        "{tail:?}"
    );
}

#[tokio::test]
async fn instances_share_the_calls_and_survive_each_other() {
    let dir = TempDir::new("replicas");
    dir.write(
        "fixture.toml",
        &fixture_manifest(
            "fixture",
            "instances = 2\n[restart]\nbackoff_initial_ms = 50\n",
        ),
    );
    let daemon = Daemon::start(dir.path());
    let row = daemon.status("fixture");
    assert_eq!(row["instances"], 2);
    assert_eq!(row["pids"].as_array().unwrap().len(), 2, "{row}");
    let mut bus = Bus::connect(&daemon.url).await;
    // Concurrent slow calls spread over both children.
    for i in 0..8 {
        bus.send(
            "ovos.persona.tools.call",
            json!({"toolbox_id": "fixture", "name": "slow_whoami", "kwargs": {"seconds": 0.3}}),
            json!({"mark": format!("r{i}")}),
        )
        .await;
    }
    let mut pids = std::collections::HashSet::new();
    let mut answered = 0;
    while answered < 8 {
        let m = bus.next(common::ANSWER_DEADLINE).await.expect("answers");
        if m["type"] == "ovos.persona.tools.call.response"
            && m["context"]["mark"]
                .as_str()
                .is_some_and(|k| k.starts_with('r'))
        {
            pids.insert(m["data"]["result"]["pid"].as_i64().unwrap());
            answered += 1;
        }
    }
    assert_eq!(pids.len(), 2, "calls went to {pids:?}");
    // One child dies: once the daemon has noticed, the other answers at once
    // while the dead one restarts.
    let victim = *pids.iter().next().unwrap();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(victim as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while daemon.status("fixture")["restarts"] != 1 {
        assert!(Instant::now() < deadline, "the death was never noticed");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    for _ in 0..5 {
        let started = Instant::now();
        let r = bus.call("fixture", "whoami", json!({})).await;
        assert!(
            r["result"]["pid"].is_i64() && r["result"]["pid"] != victim,
            "{r}"
        );
        assert!(started.elapsed() < Duration::from_secs(1));
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while daemon.status("fixture")["pids"].as_array().unwrap().len() < 2 {
        assert!(
            Instant::now() < deadline,
            "the dead instance never came back"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // A rolling restart rolls every instance.
    let (code, out, err) = daemon.ctl(&["restart", "fixture"]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.contains("instance 0: restarted") && out.contains("instance 1: restarted"),
        "{out}"
    );
}

/// CLOCK_MONOTONIC in seconds (Python's time.monotonic() on Linux).
fn monotonic_now_s() -> f64 {
    let t = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC).unwrap();
    t.tv_sec() as f64 + t.tv_nsec() as f64 / 1e9
}

/// Whether process `pid` or any process of its group still exists (a
/// toolbox's pid is its group leader, and the group id).
fn group_alive(pid: u64) -> bool {
    let pid = nix::unistd::Pid::from_raw(pid as i32);
    nix::sys::signal::kill(pid, None).is_ok() || nix::sys::signal::killpg(pid, None).is_ok()
}

fn pids_of(daemon: &Daemon, id: &str) -> Vec<u64> {
    daemon.status(id)["pids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p.as_u64().unwrap())
        .collect()
}

#[test]
fn ready_is_sent_only_once_a_slow_toolbox_has_finished_starting() {
    let dir = TempDir::new("slow-ready");
    let note = dir.path().join("serving");
    dir.write("math.toml", &math_manifest("math"));
    dir.write(
        "slow.toml",
        &fixture_manifest(
            "slow",
            &format!(
                "env = {{ START_DELAY_S = \"2\", SERVING_NOTE = \"{}\" }}\n\
                 [sandbox]\nread_write = [\"{}\"]",
                note.display(),
                dir.path().display()
            ),
        ),
    );
    let sock_dir = TempDir::new("ready-sock");
    let path = sock_dir.path().join("notify.sock");
    let systemd = std::os::unix::net::UnixDatagram::bind(&path).unwrap();
    systemd
        .set_read_timeout(Some(common::ANSWER_DEADLINE))
        .unwrap();
    // When READY=1 arrives, on the clock the fixture notes its start on.
    let (tx, ready) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut buf = [0u8; 512];
        while let Ok(n) = systemd.recv(&mut buf) {
            let at = monotonic_now_s();
            if buf[..n].starts_with(b"READY=1") {
                let _ = tx.send(at);
                return;
            }
        }
    });
    let spawned = monotonic_now_s();
    let daemon = Daemon::start_env(
        &[
            "--manifests",
            dir.path().to_str().unwrap(),
            "--embedded-bus",
            "127.0.0.1:0",
        ],
        &[("NOTIFY_SOCKET", path.to_str().unwrap())],
    );
    let ready_at = ready
        .recv_timeout(common::ANSWER_DEADLINE)
        .expect("READY=1");
    let serving: f64 = std::fs::read_to_string(&note)
        .expect("the slow toolbox noted when it started serving")
        .trim()
        .strip_prefix("serving ")
        .unwrap()
        .parse()
        .unwrap();
    assert!(
        ready_at >= serving,
        "READY=1 came {:.3} s before the slow toolbox began to serve",
        serving - ready_at
    );
    assert!(
        ready_at - spawned >= 2.0,
        "READY=1 came {:.3} s after the daemon was started; the slow toolbox takes 2 s",
        ready_at - spawned
    );
    for id in ["slow", "math"] {
        let row = daemon.status(id);
        assert_eq!(row["state"], "ready", "{row}");
        assert_eq!(row["pids"].as_array().unwrap().len(), 1, "{row}");
    }
}

#[test]
fn the_control_socket_defaults_to_xdg_runtime_dir() {
    let dir = TempDir::new("ctl-default");
    dir.write("math.toml", &math_manifest("math"));
    let runtime = TempDir::new("xdg-runtime");
    let xdg = runtime.path().to_str().unwrap();
    let expected = runtime.path().join("toolboxd.sock");
    let mut daemon = common::Starting::spawn(
        &[
            "--manifests",
            dir.path().to_str().unwrap(),
            "--embedded-bus",
            "127.0.0.1:0",
        ],
        &[("XDG_RUNTIME_DIR", xdg)],
        &expected,
    )
    .ready();
    let listening = daemon.log_lines_with("control socket listening");
    assert_eq!(listening.len(), 1, "{listening:?}");
    assert_eq!(listening[0]["path"], expected.to_str().unwrap());
    let meta = std::fs::metadata(&expected).expect("the socket exists");
    assert!(
        std::os::unix::fs::FileTypeExt::is_socket(&meta.file_type()),
        "{meta:?}"
    );
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    // `ctl` without --control finds it the same way.
    let ctl = |runtime_dir: &str| {
        common::output_within(
            std::process::Command::new(BIN)
                .args(["ctl", "status", "--json"])
                .env("XDG_RUNTIME_DIR", runtime_dir),
            common::ANSWER_DEADLINE,
        )
    };
    let out = ctl(xdg);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rows: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(rows[0]["id"], "math", "{rows}");
    assert_eq!(rows[0]["state"], "ready", "{rows}");
    // Another runtime directory: another socket, where no daemon is.
    let elsewhere = TempDir::new("xdg-elsewhere");
    let out = ctl(elsewhere.path().to_str().unwrap());
    assert_eq!(out.status.code(), Some(1));
    assert!(daemon.stop().success());
    assert!(!expected.exists(), "the socket is removed on exit");
}

#[tokio::test]
async fn calls_err_counts_timeouts_and_crashes() {
    let dir = TempDir::new("calls-err");
    dir.write(
        "faulty.toml",
        &format!(
            "id = \"faulty\"\ncommand = \"python3\"\nargs = [\"{}\"]\n\
             [restart]\nbackoff_initial_ms = 50\n\
             [limits]\ncall_timeout_s = 10\n[limits.tool_timeouts]\nhang = 1\n",
            common::repo("tests/fixtures/faulty_toolbox.py")
        ),
    );
    let daemon = Daemon::start(dir.path());
    let mut bus = Bus::connect(&daemon.url).await;
    assert_eq!(
        bus.call("faulty", "ok", json!({})).await["result"],
        json!({"ok": true})
    );
    let timed_out = bus.call("faulty", "hang", json!({})).await;
    assert_eq!(
        timed_out["error"],
        "TimeoutError: tool 'hang' in toolbox 'faulty' did not answer within 1 s",
        "{timed_out}"
    );
    let crashed = bus.call("faulty", "crash", json!({"code": 3})).await;
    assert_eq!(
        crashed["error"], "RuntimeError: toolbox 'faulty' exited (code 3) while running 'crash'",
        "{crashed}"
    );
    let row = daemon.wait_for_state("faulty", "ready", Duration::from_secs(10));
    assert_eq!(
        (&row["calls_ok"], &row["calls_err"], &row["in_flight"]),
        (&json!(1), &json!(2), &json!(0)),
        "{row}"
    );
}

#[tokio::test]
async fn reload_disables_replaces_and_removes_toolboxes_and_their_processes_end() {
    let dir = TempDir::new("reload-procs");
    dir.write("off.toml", &text_manifest("off"));
    dir.write("grow.toml", &fixture_manifest("grow", ""));
    dir.write("gone.toml", &math_manifest("gone"));
    let daemon = Daemon::start(dir.path());
    let mut bus = Bus::connect(&daemon.url).await;
    let off_pid = pid_of(&daemon, "off");
    let grow_pid = pid_of(&daemon, "grow");
    let gone_pid = pid_of(&daemon, "gone");
    assert_eq!(
        bus.call("off", "shout", json!({"text": "on"})).await["result"]["text"],
        "ON"
    );

    dir.write(
        "off.toml",
        &format!("{}enabled = false\n", text_manifest("off")),
    );
    dir.write("grow.toml", &fixture_manifest("grow", "instances = 2"));
    std::fs::remove_file(dir.path().join("gone.toml")).unwrap();
    let (code, out, err) = daemon.ctl(&["reload"]);
    assert_eq!(code, 0, "{out}{err}");

    // enabled = false: stopped, not hosted, and its process is gone.
    let row = daemon.status("off");
    assert_eq!(row["state"], "stopped", "{row}");
    assert!(row["pids"].as_array().unwrap().is_empty(), "{row}");
    let m = common::mark();
    bus.send(
        "ovos.persona.tools.call",
        json!({"toolbox_id": "off", "name": "shout", "kwargs": {"text": "x"}}),
        json!({"mark": m}),
    )
    .await;
    bus.assert_silence(&[&m]).await;
    let r = bus
        .request(
            "ovos.tools.invoke",
            json!({"name": "shout", "args": {"text": "x"}}),
        )
        .await;
    assert_eq!(r["data"]["error"], "Unknown tool: 'shout'", "{r}");
    common::wait_until(
        "the disabled toolbox's process ends",
        Duration::from_secs(10),
        || !group_alive(off_pid),
    );

    // instances 1 -> 2: stopped and started again, with two new children.
    let row = daemon.wait_for_state("grow", "ready", Duration::from_secs(10));
    assert_eq!(row["instances"], 2, "{row}");
    let pids = pids_of(&daemon, "grow");
    assert_eq!(pids.len(), 2, "{row}");
    assert!(!pids.contains(&grow_pid), "{pids:?} still has {grow_pid}");
    common::wait_until(
        "the replaced toolbox's old process ends",
        Duration::from_secs(10),
        || !group_alive(grow_pid),
    );
    for pid in &pids {
        assert!(group_alive(*pid), "new child {pid} is not running");
    }
    assert_eq!(
        bus.call("grow", "add", json!({"a": 1, "b": 2})).await["result"]["result"],
        3
    );

    // Removed: gone from status and the catalog, and its process ends.
    let (_, rows, _) = daemon.ctl(&["status", "--json"]);
    assert!(!rows.contains("\"gone\""), "{rows}");
    let r = bus
        .request(
            "ovos.tools.invoke",
            json!({"name": "sqrt", "args": {"number": 4}}),
        )
        .await;
    assert_eq!(r["data"]["error"], "Unknown tool: 'sqrt'", "{r}");
    common::wait_until(
        "the removed toolbox's process ends",
        Duration::from_secs(10),
        || !group_alive(gone_pid),
    );
}

#[tokio::test]
async fn every_log_line_about_a_toolbox_carries_toolbox_and_its_pid() {
    let dir = TempDir::new("log-fields");
    let flag = dir.write("refuse", "");
    dir.write(
        "tbx.toml",
        &fixture_manifest("tbx", "[restart]\nbackoff_initial_ms = 50\n"),
    );
    // A toolbox whose only start fails (its stderr says why).
    dir.write(
        "broken.toml",
        &fixture_manifest(
            "broken",
            &format!(
                "env = {{ FAIL_IF_EXISTS = \"{}\" }}\n[restart]\nmax_restarts = 0\n",
                flag.display()
            ),
        ),
    );
    let mut daemon = Daemon::start(dir.path());
    let mut bus = Bus::connect(&daemon.url).await;
    assert_eq!(daemon.status("broken")["state"], "failed");
    let first = pid_of(&daemon, "tbx");
    let said = bus
        .call(
            "tbx",
            "log_stderr",
            json!({"text": "words of the first child"}),
        )
        .await;
    assert!(said["result"]["pid"].is_u64(), "{said}");
    // A crash (the whole group killed), and the restart.
    nix::sys::signal::killpg(
        nix::unistd::Pid::from_raw(first as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    common::wait_until("tbx restarted", Duration::from_secs(10), || {
        let row = daemon.status("tbx");
        row["state"] == "ready" && row["pids"][0].as_u64().is_some_and(|p| p != first)
    });
    let second = pid_of(&daemon, "tbx");
    bus.call(
        "tbx",
        "log_stderr",
        json!({"text": "words of the second child"}),
    )
    .await;
    // An operator's restart, then the daemon's stop.
    let (code, out, err) = daemon.ctl(&["restart", "tbx"]);
    assert_eq!(code, 0, "{out}{err}");
    let third = pid_of(&daemon, "tbx");
    daemon.wait_for_log("child stopped", 1, Duration::from_secs(10));
    assert!(daemon.stop().success());

    let lines: Vec<Value> = daemon
        .logs
        .lock()
        .unwrap()
        .iter()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    // The daemon's own lines; every other one is about a toolbox.
    let daemon_wide = [
        "embedded bus listening",
        "control socket listening",
        "connected to the bus",
        "taking calls; waiting for the toolboxes to finish starting",
        "ready",
        "shutting down: draining calls and stopping toolboxes",
        "stopped",
        "peer check done: ids other hosts also answer for",
    ];
    let mut spawned: HashMap<String, Vec<u64>> = HashMap::new();
    for line in &lines {
        let message = line["message"].as_str().unwrap_or_default();
        if daemon_wide.contains(&message) {
            continue;
        }
        let toolbox = line["toolbox"]
            .as_str()
            .unwrap_or_else(|| panic!("no toolbox field: {line}"));
        assert!(["tbx", "broken"].contains(&toolbox), "{line}");
        if message == "child spawned" {
            spawned
                .entry(toolbox.to_owned())
                .or_default()
                .push(line["pid"].as_u64().unwrap_or_else(|| panic!("{line}")));
        }
    }
    assert_eq!(spawned["tbx"], [first, second, third], "{spawned:?}");
    // (A child that dies during the era probe is started once more, as legacy.)
    assert!(!spawned["broken"].is_empty(), "{spawned:?}");
    // Lines about one child carry its pid.
    let about_a_child = |line: &Value| {
        let message = line["message"].as_str().unwrap_or_default();
        line["target"] == "toolboxd::stderr"
            || [
                "child spawned",
                "toolbox ready",
                "child exited",
                "child stopped",
            ]
            .iter()
            .any(|m| message.starts_with(m))
    };
    let with_pid = |toolbox: &str, text: &str| -> Vec<u64> {
        lines
            .iter()
            .filter(|l| l["toolbox"] == toolbox)
            .filter(|l| l["message"].as_str().is_some_and(|m| m.starts_with(text)))
            .map(|l| l["pid"].as_u64().unwrap_or_else(|| panic!("no pid: {l}")))
            .collect()
    };
    for line in lines.iter().filter(|l| about_a_child(l)) {
        let pid = line["pid"]
            .as_u64()
            .unwrap_or_else(|| panic!("no pid: {line}"));
        let toolbox = line["toolbox"].as_str().unwrap();
        assert!(
            spawned[toolbox].contains(&pid),
            "not one of its children: {line}"
        );
    }
    assert_eq!(with_pid("tbx", "words of the first child"), [first]);
    assert_eq!(with_pid("tbx", "words of the second child"), [second]);
    assert_eq!(with_pid("tbx", "child exited (signal 9)"), [first]);
    let mut stopped = with_pid("tbx", "child stopped");
    stopped.sort();
    let mut expected = vec![second, third];
    expected.sort();
    assert_eq!(stopped, expected);
    assert_eq!(with_pid("tbx", "toolbox ready"), [first, second, third]);
    assert_eq!(
        with_pid("broken", "refusing to start: FAIL_IF_EXISTS exists"),
        spawned["broken"]
    );
    // The toolbox-wide lines of the crash and the failure name the toolbox.
    let named = |toolbox: &str, text: &str| {
        lines.iter().any(|l| {
            l["toolbox"] == toolbox && l["message"].as_str().is_some_and(|m| m.contains(text))
        })
    };
    assert!(named("tbx", "restarting after the child exited (signal 9)"));
    assert!(named("broken", "failed: "));
}

#[test]
fn the_unknown_mcp_version_warning_carries_toolbox_and_pid() {
    let dir = TempDir::new("odd-version");
    dir.write(
        "odd.toml",
        &fixture_manifest(
            "odd",
            "protocol = \"2025-06-18\"\nenv = { INITIALIZE_VERSION = \"2099-01-01\" }",
        ),
    );
    let daemon = Daemon::start(dir.path());
    let row = daemon.status("odd");
    assert_eq!(row["era"], "legacy MCP 2099-01-01", "{row}");
    let lines = daemon.log_lines_with("unknown to toolboxd");
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert_eq!(lines[0]["toolbox"], "odd", "{}", lines[0]);
    assert_eq!(lines[0]["pid"], row["pids"][0], "{}", lines[0]);
}
