//! Reload and readiness (docs/operations.md): a manifest reload applied as a
//! diff (by `ctl reload` or SIGHUP), and what systemd hears: `READY=1` only
//! once the toolboxes have started, `RELOADING=1`, the watchdog, `STOPPING=1`.

mod common;

use std::time::Duration;

use common::{fixture_manifest, math_manifest, pid_of, text_manifest, Bus, Daemon, TempDir};
use serde_json::{json, Value};

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
    let owners = bus.listed_owners().await;
    assert!(
        owners.iter().any(|o| o == "added") && !owners.iter().any(|o| o == "remove"),
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
    let mut daemon = Daemon::start_notifying(dir.path(), &path);
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
    let dir = TempDir::writable("slow-ready");
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
