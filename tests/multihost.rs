//! Several daemons on one bus: toolbox ids stay unique (OVOS-TOOLS-1 §3), and
//! a host-only daemon leaves the flat `ovos.tools.*` topics to another.

mod common;

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
    second_dir.write("math.toml", &math_manifest("math"));
    second_dir.write("text.toml", &text_manifest("text"));
    let second = Daemon::start_with(&[
        "--manifests",
        second_dir.path().to_str().unwrap(),
        "--bus",
        &url,
        "--host-only",
    ]);

    let row = second.status("math");
    assert_eq!(row["state"], "conflict", "{row}");
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
