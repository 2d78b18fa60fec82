//! What `toolboxd ctl` and the log tell an operator about a toolbox's
//! children: their recent stderr (`ctl logs`), the stderr tail in the answer
//! to a failed start or restart, what their process trees use (`ctl
//! status`), and the toolbox and pid on every log line about them.

mod common;

use std::collections::HashMap;
use std::time::Duration;

use serde_json::{json, Value};

use common::{fixture_manifest, pid_of, repo, wait_until, Bus, Daemon, TempDir, ANSWER_DEADLINE};

#[tokio::test]
async fn ctl_logs_prints_the_recent_stderr_of_a_toolbox_across_restarts() {
    let dir = TempDir::new("ctl-logs");
    dir.write("fixture.toml", &fixture_manifest("fixture", ""));
    let daemon = Daemon::start(dir.path());
    let mut bus = Bus::connect(&daemon.url).await;
    let first = bus
        .call("fixture", "log_stderr", json!({"text": "first words"}))
        .await["result"]["pid"]
        .as_u64()
        .expect("a pid");
    bus.call("fixture", "log_stderr", json!({"text": "second words"}))
        .await;
    // The answer can come before the daemon has read the stderr line.
    wait_until("both lines in ctl logs", ANSWER_DEADLINE, || {
        daemon.ctl(&["logs", "fixture"]).1.contains("second words")
    });
    let (code, out, err) = daemon.ctl(&["logs", "fixture"]);
    assert_eq!(code, 0, "{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 2, "{out}");
    assert!(
        lines[0].ends_with(&format!(" [{first}] first words")),
        "{out}"
    );
    // TIME is RFC 3339 UTC.
    assert!(
        lines[0].len() > 24 && lines[0].as_bytes()[10] == b'T' && lines[0].contains("Z ["),
        "{out}"
    );
    let (code, out, _) = daemon.ctl(&["logs", "fixture", "--lines", "1"]);
    assert_eq!(code, 0);
    assert_eq!(out.lines().count(), 1, "{out}");
    assert!(out.contains("second words"), "{out}");

    // A rolling restart: the old child's lines stay, the new one's follow.
    let (code, _, err) = daemon.ctl(&["restart", "fixture"]);
    assert_eq!(code, 0, "{err}");
    let second = bus
        .call(
            "fixture",
            "log_stderr",
            json!({"text": "after the restart"}),
        )
        .await["result"]["pid"]
        .as_u64()
        .expect("a pid");
    assert_ne!(first, second);
    wait_until("the new child's line in ctl logs", ANSWER_DEADLINE, || {
        daemon
            .ctl(&["logs", "fixture"])
            .1
            .contains("after the restart")
    });
    let out = daemon.ctl(&["logs", "fixture"]).1;
    assert!(out.contains(&format!("[{first}] first words")), "{out}");
    assert!(
        out.contains(&format!("[{second}] after the restart")),
        "{out}"
    );

    // Bad requests say what is wrong.
    let (code, _, err) = daemon.ctl(&["logs", "nope"]);
    assert_eq!(code, 1);
    assert!(err.contains("no toolbox \"nope\" is hosted here"), "{err}");
    let (code, _, err) = daemon.ctl(&["logs", "fixture", "--lines", "0"]);
    assert_eq!(code, 2, "clap refuses it: {err}");
}

#[tokio::test]
async fn a_failed_restart_or_start_answers_with_the_childs_stderr_tail() {
    let dir = TempDir::new("ctl-tail");
    let flag = dir.path().join("fail-now");
    dir.write(
        "fixture.toml",
        &fixture_manifest(
            "fixture",
            &format!("env = {{ FAIL_IF_EXISTS = \"{}\" }}", flag.display()),
        ),
    );
    let daemon = Daemon::start(dir.path());
    std::fs::write(&flag, "").unwrap();

    // The fixture says why on stderr, then exits 4.
    let (code, _, err) = daemon.ctl(&["restart", "fixture"]);
    assert_eq!(code, 1);
    assert!(
        err.contains("restart failed") && err.contains("code 4"),
        "{err}"
    );
    assert!(
        err.contains("the child's last stderr lines")
            && err.contains("\n  refusing to start: FAIL_IF_EXISTS exists"),
        "{err}"
    );
    assert_eq!(daemon.status("fixture")["state"], "ready");

    // The same for a start.
    let (code, _, err) = daemon.ctl(&["stop", "fixture"]);
    assert_eq!(code, 0, "{err}");
    let (code, _, err) = daemon.ctl(&["start", "fixture"]);
    assert_eq!(code, 1);
    assert!(
        err.contains("failed to start") && err.contains("refusing to start: FAIL_IF_EXISTS exists"),
        "{err}"
    );
    // And ctl logs has them all (more may follow: the toolbox keeps trying).
    let out = daemon.ctl(&["logs", "fixture"]).1;
    assert!(
        out.matches("refusing to start: FAIL_IF_EXISTS exists")
            .count()
            >= 2,
        "{out}"
    );
}

#[tokio::test]
async fn ctl_status_sums_memory_and_cpu_over_the_childs_whole_tree() {
    let dir = TempDir::writable("ctl-tree");
    let pids = dir.path().join("grandchildren");
    dir.write(
        "faulty.toml",
        &format!(
            "id = \"faulty\"\ncommand = \"python3\"\nargs = [\"{}\"]\n\
             env = {{ GRANDCHILD_PIDS = \"{}\" }}\n[sandbox]\nread_write = [\"{}\"]\n",
            repo("tests/fixtures/faulty_toolbox.py"),
            pids.display(),
            dir.path().display()
        ),
    );
    let daemon = Daemon::start(dir.path());
    let alone = daemon.status("faulty");
    assert_eq!(alone["processes"], 1, "{alone}");
    let mut bus = Bus::connect(&daemon.url).await;
    // Two grandchildren: one in the child's process group, one in a session
    // of its own (still the toolbox's).
    for setsid in [false, true] {
        let r = bus
            .call(
                "faulty",
                "spawn_grandchild",
                serde_json::json!({"die": false, "setsid": setsid}),
            )
            .await;
        assert_eq!(r["result"]["ok"], true, "{r}");
    }
    let tree = daemon.status("faulty");
    assert_eq!(tree["processes"], 3, "{tree}");
    assert!(
        tree["memory_bytes"].as_u64().unwrap() > alone["memory_bytes"].as_u64().unwrap(),
        "{alone} {tree}"
    );
    assert!(tree["cpu_s"].as_f64().unwrap() > 0.0, "{tree}");
    // A stopped toolbox runs nothing.
    assert_eq!(daemon.ctl(&["stop", "faulty"]).0, 0);
    let stopped = daemon.status("faulty");
    assert_eq!(
        (
            &stopped["processes"],
            &stopped["memory_bytes"],
            &stopped["cpu_s"]
        ),
        (
            &serde_json::Value::Null,
            &serde_json::Value::Null,
            &serde_json::Value::Null
        ),
        "{stopped}"
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
