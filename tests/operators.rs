//! Operators (`toolboxd ctl`, docs/operations.md): the control socket, status,
//! rolling restart under load, stop/start and instances. Reload and the
//! systemd notifications: `reload.rs`; what the log says of a toolbox:
//! `ctl_observability.rs`.

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
        "calls_ok": 5, "calls_err": 1, "in_flight": 0, "conflict": null, "note": null,
        "sandbox_refused": [],
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
    bus.assert_math_answers().await;
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
