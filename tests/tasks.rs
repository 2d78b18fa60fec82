//! MCP tasks and progress, end to end: a real daemon, its embedded bus, and
//! the task fixture (tests/fixtures/task_toolbox.py) as a child in each era.

mod common;

use std::time::Duration;

use common::{mark, repo, Bus, Daemon, TempDir};
use serde_json::json;

/// The task fixture as toolbox `id`, with extra manifest lines.
fn manifest(id: &str, extra: &str) -> String {
    format!(
        "id = \"{id}\"\ncommand = \"python3\"\nargs = [\"{}\"]\n{extra}\n",
        repo("tests/fixtures/task_toolbox.py")
    )
}

/// The task fixture twice in `dir`: `legacy` (pinned to MCP 2025-11-25) and
/// `modern`, both with `extra` manifest lines.
fn both_eras(dir: &TempDir, extra: &str) {
    dir.write(
        "legacy.toml",
        &manifest("legacy", &format!("protocol = \"2025-11-25\"\n{extra}")),
    );
    dir.write("modern.toml", &manifest("modern", extra));
}

#[tokio::test]
async fn task_tools_are_answered_over_the_bus_in_each_era() {
    let dir = TempDir::new("tasks");
    both_eras(&dir, "");
    dir.write("old.toml", &manifest("old", "protocol = \"2025-06-18\""));
    let daemon = Daemon::start(dir.path());
    for (id, era) in [
        ("legacy", "legacy MCP 2025-11-25"),
        ("modern", "modern MCP 2026-07-28"),
        ("old", "legacy MCP 2025-06-18"),
    ] {
        assert_eq!(daemon.status(id)["era"], era);
    }
    let mut bus = Bus::connect(&daemon.url).await;

    for id in ["legacy", "modern"] {
        let m = mark();
        let kwargs = json!({"topic": "otters", "steps": 5});
        let r = bus.call_routed(&m, id, "research", kwargs).await;
        assert_eq!(
            r,
            json!({"toolbox_id": id, "result": {"report": "5 steps on otters"}})
        );
        // An optional task tool is called as a task too.
        let r = bus.call(id, "quick", json!({})).await;
        assert_eq!(r["result"]["content"], "as a task", "{id}: {r}");
        // The call carried a progress token; the legacy task reported
        // progress under it, which reached the caller.
        if id == "legacy" {
            let progress = bus.progress_of(&m);
            assert!(!progress.is_empty(), "no progress on the bus");
            assert_eq!(
                progress[0],
                json!({"toolbox_id": "legacy", "name": "research", "progress": 1,
                       "total": 5, "message": "step 1 of 5"})
            );
        }
    }
    // Every task request went to the child that created the task.
    assert!(!daemon.log_lines_with("task: tasks/result").is_empty());
    assert!(!daemon.log_lines_with("task: tasks/get").is_empty());

    // MCP 2025-06-18 has no tasks: an optional tool runs plain, a required
    // one is refused by the server, as toolboxd warned when it listed it.
    let r = bus.call("old", "quick", json!({})).await;
    assert_eq!(r["result"]["content"], "plain");
    let r = bus
        .call("old", "research", json!({"topic": "otters"}))
        .await;
    assert_eq!(
        r["error"],
        "ToolError: Tool research requires task augmentation"
    );
    let warned = daemon.log_lines_with("require MCP tasks");
    assert_eq!(warned.len(), 1, "{warned:#?}");
    assert_eq!(warned[0]["toolbox"], "old");
}

#[tokio::test]
async fn a_task_past_its_deadline_is_cancelled_and_gives_its_slot_back() {
    let dir = TempDir::new("tasks-cancel");
    let limits = "[limits]\nmax_concurrent_calls = 1\n[limits.tool_timeouts]\nforever = 1";
    both_eras(&dir, limits);
    let daemon = Daemon::start(dir.path());
    let mut bus = Bus::connect(&daemon.url).await;
    for (n, id) in ["legacy", "modern"].into_iter().enumerate() {
        let r = bus.call(id, "forever", json!({})).await;
        assert_eq!(
            r["error"],
            format!("TimeoutError: tool 'forever' in toolbox '{id}' did not answer within 1 s")
        );
        // The child was told, and its task stopped working.
        daemon.wait_for_log("task: tasks/cancel", n + 1, common::ANSWER_DEADLINE);
        daemon.wait_for_log("task: stopped working on", n + 1, common::ANSWER_DEADLINE);
        // Its only slot is free again.
        let r = bus.call(id, "quick", json!({})).await;
        assert_eq!(r["result"]["content"], "as a task", "{id}: {r}");
    }
    let cancels = daemon.log_lines_with("cancelling the task of a call that is over");
    let toolboxes: Vec<&str> = cancels
        .iter()
        .filter_map(|l| l["toolbox"].as_str())
        .collect();
    assert_eq!(toolboxes, ["legacy", "modern"]);
}

#[tokio::test]
async fn a_progress_flood_is_coalesced_within_the_rate() {
    let dir = TempDir::new("tasks-flood");
    dir.write("flood.toml", &manifest("flood", ""));
    let daemon = Daemon::start(dir.path());
    let mut bus = Bus::connect(&daemon.url).await;
    let m = mark();
    let started = std::time::Instant::now();
    let r = bus
        .call_routed(
            &m,
            "flood",
            "flood",
            json!({"count": 2000, "over_s": 1.0, "then_s": 0.5}),
        )
        .await;
    let took = started.elapsed();
    assert_eq!(r["result"]["content"], "sent 2000");
    let progress = bus.progress_of(&m);
    // At most one message per 250 ms of the call (and the first at once).
    let bound = 2 + (took.as_millis() / 250) as usize;
    assert!(
        !progress.is_empty() && progress.len() <= bound,
        "{} progress messages in {took:?}: {progress:#?}",
        progress.len()
    );
    // The last report got through: the flood was coalesced, not cut.
    assert_eq!(
        progress.last().unwrap(),
        &json!({"toolbox_id": "flood", "name": "flood", "progress": 2000, "total": 2000})
    );
    assert!(took >= Duration::from_millis(1500));
}

#[tokio::test]
async fn a_stop_cancels_a_task_on_the_child() {
    let dir = TempDir::new("tasks-stop");
    let limits = "[limits]\nmax_concurrent_calls = 1";
    both_eras(&dir, limits);
    let daemon = Daemon::start(dir.path());
    let mut bus = Bus::connect(&daemon.url).await;
    // Legacy waits on tasks/result, modern polls tasks/get: either request
    // reaching the child says the task exists and the call follows it.
    for (n, (id, follows)) in [
        ("legacy", "task: tasks/result"),
        ("modern", "task: tasks/get"),
    ]
    .into_iter()
    .enumerate()
    {
        let m = mark();
        let session = json!({"session_id": format!("kitchen-{id}")});
        bus.send(
            "ovos.persona.tools.call",
            json!({"toolbox_id": id, "name": "forever", "kwargs": {}}),
            json!({"mark": m, "session": session}),
        )
        .await;
        let before = daemon.log_lines_with(follows).len();
        common::wait_until("the call follows its task", common::ANSWER_DEADLINE, || {
            daemon.log_lines_with(follows).len() > before
        });
        bus.send("mycroft.stop", json!({}), json!({"session": session}))
            .await;
        let answer = bus
            .wait_for(common::ANSWER_DEADLINE, |msg| {
                msg["type"] == "ovos.persona.tools.call.response" && msg["context"]["mark"] == m
            })
            .await
            .expect("the stopped call's answer");
        assert_eq!(
            answer["data"]["error"],
            "CancelledError: call cancelled by stop"
        );
        daemon.wait_for_log("task: tasks/cancel", n + 1, common::ANSWER_DEADLINE);
        daemon.wait_for_log("task: stopped working on", n + 1, common::ANSWER_DEADLINE);
        // Its only slot is free again.
        let r = bus.call(id, "quick", json!({})).await;
        assert_eq!(r["result"]["content"], "as a task", "{id}: {r}");
    }
}
