//! `toolboxd run --audit-log PATH`: one JSON line per finished call, from real
//! calls over the real bus; arguments only where the manifest opts in;
//! reopened on SIGHUP.

mod common;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use serde_json::{json, Value};

use common::{
    math_manifest, output_within, wait_until, Bus, Daemon, TempDir, ANSWER_DEADLINE, BIN,
};

/// A daemon on `manifests`, auditing to `log`.
fn start(manifests: &Path, log: &Path) -> Daemon {
    Daemon::start_env(
        &[
            "--manifests",
            manifests.to_str().unwrap(),
            "--embedded-bus",
            "127.0.0.1:0",
            "--audit-log",
            log.to_str().unwrap(),
        ],
        &[],
    )
}

/// The JSON lines of the file at `path`.
fn lines(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect()
}

/// A persona call of `name` in `toolbox` from session `session`: the answer's data.
async fn call_from(
    bus: &mut Bus,
    session: &str,
    toolbox: &str,
    name: &str,
    kwargs: Value,
) -> Value {
    let mark = common::mark();
    bus.send(
        "ovos.persona.tools.call",
        json!({"toolbox_id": toolbox, "name": name, "kwargs": kwargs}),
        json!({"mark": mark, "session": {"session_id": session}}),
    )
    .await;
    bus.wait_for(ANSWER_DEADLINE, |m| {
        m["type"] == "ovos.persona.tools.call.response" && m["context"]["mark"] == mark.as_str()
    })
    .await
    .expect("an answer")["data"]
        .clone()
}

#[tokio::test]
async fn one_line_per_call_with_its_outcome_and_arguments_only_when_opted_in() {
    let dir = TempDir::new("audit");
    let manifests = dir.path().join("manifests");
    std::fs::create_dir(&manifests).unwrap();
    let log = dir.path().join("audit.log");
    std::fs::write(manifests.join("math.toml"), math_manifest("math")).unwrap();
    std::fs::write(
        manifests.join("open.toml"),
        format!("{}audit_arguments = true\n", math_manifest("open")),
    )
    .unwrap();
    let mut daemon = start(&manifests, &log);
    let mut bus = Bus::connect(&daemon.url).await;

    let ok = call_from(&mut bus, "s-1", "math", "add", json!({"a": 2, "b": 3})).await;
    assert_eq!(ok["result"]["result"], 5, "{ok}");
    let invalid = call_from(&mut bus, "s-1", "math", "add", json!({"a": "x", "b": 3})).await;
    assert!(invalid["error"].is_string(), "{invalid}");
    let error = call_from(&mut bus, "s-2", "math", "sqrt", json!({"number": -1})).await;
    assert!(error["error"].is_string(), "{error}");
    let opened = call_from(&mut bus, "s-3", "open", "add", json!({"a": 20, "b": 1})).await;
    assert_eq!(opened["result"]["result"], 21, "{opened}");
    let r = bus
        .request(
            "ovos.tools.invoke",
            json!({"name": "echo", "args": {"text": "x"}}),
        )
        .await;
    // Two toolboxes list `echo`: ambiguous, answered without a call.
    assert!(
        r["data"]["error"]
            .as_str()
            .unwrap()
            .starts_with("Ambiguous"),
        "{r}"
    );
    // A tool nobody lists is answered and audited too, though no child had
    // it: under its toolbox, with no tool named.
    let unknown = call_from(&mut bus, "s-1", "math", "nope", json!({})).await;
    assert!(unknown["error"].is_string());

    // Shutdown writes out what is queued.
    assert!(daemon.stop().success());
    let lines = lines(&log);
    assert_eq!(lines.len(), 6, "{lines:#?}");
    // The calls that ended before a child had them, in order: the
    // ambiguous invoke (no toolbox to name), the unknown tool.
    let (ambiguous, nope) = (&lines[4], &lines[5]);
    assert_eq!(
        (
            &ambiguous["topic"],
            &ambiguous["toolbox"],
            &ambiguous["tool"],
            &ambiguous["outcome"]
        ),
        (
            &json!("ovos.tools.invoke"),
            &json!(""),
            &json!(""),
            &json!("error")
        ),
        "{ambiguous}"
    );
    assert!(
        ambiguous["error"]
            .as_str()
            .unwrap()
            .starts_with("Ambiguous"),
        "{ambiguous}"
    );
    assert_eq!(
        (
            &nope["toolbox"],
            &nope["tool"],
            &nope["session"],
            &nope["outcome"]
        ),
        (&json!("math"), &json!(""), &json!("s-1"), &json!("error")),
        "{nope}"
    );
    let lines = &lines[..4];
    let expect = [
        ("math", "add", "s-1", "ok"),
        ("math", "add", "s-1", "invalid"),
        ("math", "sqrt", "s-2", "error"),
        ("open", "add", "s-3", "ok"),
    ];
    for (line, (toolbox, tool, session, outcome)) in lines.iter().zip(expect) {
        assert_eq!(
            (
                &line["toolbox"],
                &line["tool"],
                &line["session"],
                &line["outcome"]
            ),
            (
                &json!(toolbox),
                &json!(tool),
                &json!(session),
                &json!(outcome)
            ),
            "{line}"
        );
        assert_eq!(line["topic"], "ovos.persona.tools.call", "{line}");
        assert!(line["duration_ms"].as_f64().unwrap() > 0.0, "{line}");
        assert!(line["time"].as_str().unwrap().ends_with('Z'), "{line}");
    }
    // Errors say what the caller was told; no arguments nor results unless
    // the manifest opted in.
    assert_eq!(lines[1]["error"], invalid["error"]);
    assert_eq!(lines[2]["error"], error["error"]);
    for line in &lines[..3] {
        assert!(
            line.get("arguments").is_none() && line.get("result").is_none(),
            "{line}"
        );
    }
    assert_eq!(lines[3]["arguments"], json!({"a": 20, "b": 1}));
    assert_eq!(lines[3]["result"], json!({"result": 21}));
    assert!(lines[0].get("error").is_none());
    // The file is the operator's alone.
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&log).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600);
}

#[tokio::test]
async fn sighup_reopens_the_audit_log_for_logrotate() {
    let dir = TempDir::new("audit-hup");
    let manifests = dir.path().join("manifests");
    std::fs::create_dir(&manifests).unwrap();
    std::fs::write(manifests.join("math.toml"), math_manifest("math")).unwrap();
    let log = dir.path().join("audit.log");
    let mut daemon = start(&manifests, &log);
    let mut bus = Bus::connect(&daemon.url).await;
    bus.call("math", "add", json!({"a": 1, "b": 1})).await;
    wait_until("the first line written", ANSWER_DEADLINE, || {
        lines(&log).len() == 1
    });
    let rotated = dir.path().join("audit.log.1");
    std::fs::rename(&log, &rotated).unwrap();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(daemon.pid() as i32),
        nix::sys::signal::Signal::SIGHUP,
    )
    .unwrap();
    daemon.wait_for_log("audit log reopened", 1, ANSWER_DEADLINE);
    bus.call("math", "add", json!({"a": 2, "b": 2})).await;
    assert!(daemon.stop().success());
    assert_eq!(lines(&rotated).len(), 1);
    let new = lines(&log);
    assert_eq!(new.len(), 1, "{new:?}");
    assert_eq!(new[0]["tool"], "add");
}

#[test]
fn an_audit_log_that_cannot_be_opened_fails_the_start_with_the_reason() {
    let dir = TempDir::new("audit-bad");
    std::fs::write(dir.path().join("math.toml"), math_manifest("math")).unwrap();
    let fifo = dir.path().join("fifo");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    for (path, why) in [
        (
            dir.path().join("no/such/dir/audit.log"),
            "No such file or directory",
        ),
        (fifo, "it is a FIFO, not a regular file"),
    ] {
        let out = output_within(
            Command::new(BIN)
                .args(["run", "--embedded-bus", "127.0.0.1:0", "--manifests"])
                .arg(dir.path())
                .arg("--control")
                .arg(dir.path().join("ctl.sock"))
                .arg("--audit-log")
                .arg(&path),
            Duration::from_secs(30),
        );
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{err}");
        assert!(
            err.contains(&format!("cannot open the audit log {}", path.display()))
                && err.contains(why)
                && err.contains("give another --audit-log PATH"),
            "{err}"
        );
    }
}
