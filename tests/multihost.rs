//! Several daemons on one bus: toolbox ids stay unique (OVOS-TOOLS-1 §3), and
//! a host-only daemon leaves the flat `ovos.tools.*` topics to another.

mod common;

use std::time::Duration;

use common::{math_manifest, start_bus, text_manifest, Bus, Daemon, TempDir};
use serde_json::json;

#[tokio::test]
async fn a_second_daemon_refuses_a_toolbox_id_the_first_answers_for() {
    let (mut bus_process, port) = start_bus(0);
    let url = format!("ws://127.0.0.1:{port}/core");
    let first_dir = TempDir::new("host1");
    first_dir.write("math.toml", &math_manifest("math"));
    let first = Daemon::start_with(&[
        "--manifests",
        first_dir.path().to_str().unwrap(),
        "--bus",
        &url,
    ]);
    let second_dir = TempDir::new("host2");
    second_dir.write(
        "math.toml",
        &format!("{}on_conflict = \"yield\"\n", math_manifest("math")),
    );
    second_dir.write("text.toml", &text_manifest("text"));
    let second = Daemon::start_with(&[
        "--manifests",
        second_dir.path().to_str().unwrap(),
        "--bus",
        &url,
        "--host-only",
    ]);

    // The check runs beside the serving: the claim, held over both probes,
    // makes the yielding toolbox give way.
    let row = second.wait_for_state("math", "conflict", Duration::from_secs(10));
    assert!(
        row["reason"]
            .as_str()
            .unwrap()
            .contains("another host on the bus already answers for toolbox_id 'math'"),
        "{row}"
    );
    assert!(!second
        .log_lines_with("already answers for toolbox_id 'math'")
        .is_empty());
    assert_eq!(second.status("text")["state"], "ready");
    assert_eq!(first.status("math")["state"], "ready");

    let mut bus = Bus::connect(&url).await;
    // Exactly one answer for math (from the first), one for text (from the second).
    for (id, name, kwargs) in [
        ("math", "add", json!({"a": 1, "b": 2})),
        ("text", "shout", json!({"text": "a"})),
    ] {
        let mark = format!("mh-{id}");
        bus.send(
            "ovos.persona.tools.call",
            json!({"toolbox_id": id, "name": name, "kwargs": kwargs}),
            json!({"mark": mark}),
        )
        .await;
        let answers = bus
            .expect_answers("ovos.persona.tools.call.response", &mark, 1)
            .await;
        assert_eq!(answers.len(), 1, "{id}: {answers:#?}");
        assert!(answers[0]["data"].get("result").is_some(), "{answers:?}");
    }
    // Discover: one answer per toolbox id on the bus.
    let answers = bus.discover(2).await;
    let ids: Vec<&str> = answers.iter().map(|(id, _)| id.as_str()).collect();
    assert_eq!(ids, ["math", "text"]);
    // The flat namespace is answered once, by the first daemon only.
    bus.send("ovos.tools.list", json!({}), json!({"mark": "mh-l"}))
        .await;
    let answers = bus
        .expect_answers("ovos.tools.list.response", "mh-l", 1)
        .await;
    assert_eq!(answers.len(), 1, "{answers:#?}");

    // The refused toolbox is picked up by a reload once the other host is gone.
    drop(first);
    let (code, out, _) = second.ctl(&["reload"]);
    assert_eq!(code, 0, "{out}");
    assert_eq!(second.status("math")["state"], "ready");
    let r = bus
        .request(
            "ovos.persona.tools.call",
            json!({"toolbox_id": "math", "name": "add", "kwargs": {"a": 2, "b": 2}}),
        )
        .await;
    assert_eq!(r["data"]["result"]["result"], 4);
    drop(second);
    bus_process.kill().unwrap();
    bus_process.wait().unwrap();
}

#[tokio::test]
async fn one_forged_answer_to_the_peer_check_stops_nothing() {
    // Any client could answer the daemon's peer probe naming its ids: one
    // forged message put each named toolbox in `conflict`, stopped. Now a
    // claim is reported, and even a toolbox set to yield gives way only to a
    // claim that holds over the whole check.
    let (mut bus_process, port) = start_bus(0);
    let url = format!("ws://127.0.0.1:{port}/core");
    let mut forger = Bus::connect(&url).await;
    let dir = TempDir::new("forged");
    dir.write(
        "math.toml",
        &format!("{}on_conflict = \"yield\"\n", math_manifest("math")),
    );
    dir.write("text.toml", &text_manifest("text"));
    let daemon = Daemon::start_with(&["--manifests", dir.path().to_str().unwrap(), "--bus", &url]);
    // The first probe, answered once for each id, as if another host served them.
    let probe = forger
        .wait_for(Duration::from_secs(10), |m| {
            m["type"] == "ovos.persona.tools.discover" && m["context"]["toolboxd_probe"].is_string()
        })
        .await
        .expect("the daemon probes for other hosts");
    for id in ["math", "text"] {
        forger
            .send(
                "ovos.persona.tools.discover.response",
                json!({"toolbox_id": id, "tools": [{"name": "add"}]}),
                probe["context"].clone(),
            )
            .await;
    }
    common::wait_until("the claims are reported", Duration::from_secs(10), || {
        ["math", "text"]
            .iter()
            .all(|id| daemon.status(id)["conflict"].is_string())
    });
    for id in ["math", "text"] {
        let row = daemon.status(id);
        assert_eq!(row["state"], "ready", "{row}");
        assert!(
            row["conflict"]
                .as_str()
                .unwrap()
                .contains(&format!("also answers for toolbox_id '{id}'")),
            "{row}"
        );
    }
    let mut bus = Bus::connect(&url).await;
    bus.assert_math_answers().await;
    drop(daemon);
    bus_process.kill().unwrap();
    bus_process.wait().unwrap();
}

/// Two daemons on one bus, each with `math` (its manifest ending in
/// `extra`), the second started once the first's own check is over.
fn two_daemons(url: &str, extra: &str) -> (Daemon, Daemon) {
    let manifest = format!("{}{extra}", math_manifest("math"));
    let first_dir = TempDir::new("twice1");
    first_dir.write("math.toml", &manifest);
    let first = Daemon::start_with(&[
        "--manifests",
        first_dir.path().to_str().unwrap(),
        "--bus",
        url,
    ]);
    first.wait_for_log("peer check done", 1, Duration::from_secs(10));
    let second_dir = TempDir::new("twice2");
    second_dir.write("math.toml", &manifest);
    let second = Daemon::start_with(&[
        "--manifests",
        second_dir.path().to_str().unwrap(),
        "--bus",
        url,
        "--host-only",
    ]);
    (first, second)
}

/// How many answers one persona call of math's `add` gets.
async fn answers_to_one_call(url: &str, mark: &str) -> usize {
    let mut bus = Bus::connect(url).await;
    bus.send(
        "ovos.persona.tools.call",
        json!({"toolbox_id": "math", "name": "add", "kwargs": {"a": 1, "b": 2}}),
        json!({"mark": mark}),
    )
    .await;
    let answers = bus
        .expect_answers("ovos.persona.tools.call.response", mark, 1)
        .await;
    assert!(
        answers.iter().all(|a| a["data"]["result"]["result"] == 3),
        "{answers:#?}"
    );
    answers.len()
}

#[tokio::test]
async fn two_daemons_with_one_id_both_report_the_conflict() {
    let (mut bus_process, port) = start_bus(0);
    let url = format!("ws://127.0.0.1:{port}/core");
    let (first, second) = two_daemons(&url, "");
    // The newcomer finds the claim in its own check; the first, told by the
    // newcomer's probe to check again, finds it too. Both keep serving.
    for daemon in [&second, &first] {
        common::wait_until("the conflict is reported", Duration::from_secs(10), || {
            daemon.status("math")["conflict"].is_string()
        });
        assert_eq!(daemon.status("math")["state"], "ready");
    }
    assert_eq!(answers_to_one_call(&url, "warned").await, 2);
    drop((first, second));
    bus_process.kill().unwrap();
    bus_process.wait().unwrap();
}

#[tokio::test]
async fn of_two_daemons_set_to_yield_the_later_starter_withdraws() {
    let (mut bus_process, port) = start_bus(0);
    let url = format!("ws://127.0.0.1:{port}/core");
    let (first, second) = two_daemons(&url, "on_conflict = \"yield\"\n");
    let row = second.wait_for_state("math", "conflict", Duration::from_secs(10));
    assert!(
        row["reason"].as_str().unwrap().contains("already answers"),
        "{row}"
    );
    // The first has the claim of a later starter at most: it keeps serving,
    // also through its own second check.
    first.wait_for_log("peer check done", 2, Duration::from_secs(10));
    assert_eq!(first.status("math")["state"], "ready");
    assert_eq!(
        answers_to_one_call(&url, "yielded").await,
        1,
        "exactly one serves"
    );
    drop((first, second));
    bus_process.kill().unwrap();
    bus_process.wait().unwrap();
}
