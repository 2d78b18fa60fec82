//! What `toolboxd ctl` tells an operator about a toolbox's children: their
//! recent stderr (`ctl logs`), the stderr tail in the answer to a failed
//! start or restart, what their process trees use (`ctl status`).

mod common;

use serde_json::json;

use common::{fixture_manifest, repo, wait_until, Bus, Daemon, TempDir, ANSWER_DEADLINE};

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
    let dir = TempDir::new("ctl-tree");
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
