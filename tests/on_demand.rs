//! What runs only when needed, and stops when told (DESIGN §3 `[start]`, §6
//! global stop): the global stop cancels a session's calls; lazy toolboxes
//! are listed from their cached catalog with no process running; idle ones
//! are stopped and started again by the next call; `prewarm_on` topics start
//! them ahead of their first call.

mod common;

use std::time::Duration;

use common::*;
use serde_json::{json, Value};

/// The context of a request from `session`, marked.
fn in_session(mark: &str, session: &str) -> Value {
    json!({"mark": mark, "session": {"session_id": session}})
}

/// Sends a persona call of `slow_whoami` from `session`; returns its mark.
async fn slow_call(bus: &mut Bus, session: &str, seconds: f64) -> String {
    let m = mark();
    let data = json!({"toolbox_id": "fixture", "name": "slow_whoami",
                      "kwargs": {"seconds": seconds}});
    bus.send("ovos.persona.tools.call", data, in_session(&m, session))
        .await;
    m
}

/// The answer to the request marked `m`.
async fn answer(bus: &mut Bus, m: &str, within: Duration) -> Value {
    bus.wait_for(within, |msg| {
        msg["type"] == "ovos.persona.tools.call.response" && msg["context"]["mark"] == m
    })
    .await
    .unwrap_or_else(|| panic!("no answer to {m} within {within:?}"))["data"]
        .clone()
}

#[tokio::test]
async fn the_global_stop_cancels_its_sessions_calls_and_not_anothers() {
    let dir = TempDir::new("stop");
    dir.write("fixture.toml", &fixture_manifest("fixture", ""));
    let daemon = Daemon::start(dir.path());
    let mut bus = Bus::connect(&daemon.url).await;

    let kitchen = slow_call(&mut bus, "kitchen", 8.0).await;
    let bedroom = slow_call(&mut bus, "bedroom", 1.5).await;
    wait_until(
        "both calls are on the child",
        Duration::from_secs(10),
        || daemon.status("fixture")["in_flight"] == 2,
    );
    bus.send("mycroft.stop", json!({}), in_session(&mark(), "kitchen"))
        .await;
    let stopped = answer(&mut bus, &kitchen, Duration::from_secs(4)).await;
    assert_eq!(stopped["error"], "CancelledError: call cancelled by stop");
    let served = answer(&mut bus, &bedroom, Duration::from_secs(10)).await;
    assert!(served["result"]["pid"].is_u64(), "{served}");
    assert!(
        !daemon.log_lines_with("calls cancelled by stop").is_empty(),
        "the stop is logged"
    );

    // A stop naming no session cancels every session's calls.
    let one = slow_call(&mut bus, "one", 8.0).await;
    let two = slow_call(&mut bus, "two", 8.0).await;
    wait_until(
        "both calls are on the child",
        Duration::from_secs(10),
        || daemon.status("fixture")["calls_err"] == 1 && daemon.status("fixture")["in_flight"] == 2,
    );
    bus.send("mycroft.stop", json!({}), json!({})).await;
    for m in [one, two] {
        let stopped = answer(&mut bus, &m, Duration::from_secs(4)).await;
        assert_eq!(stopped["error"], "CancelledError: call cancelled by stop");
    }
    // The toolbox serves on.
    let r = bus.call("fixture", "add", json!({"a": 1, "b": 2})).await;
    assert_eq!(r["result"]["result"], 3, "{r}");
}
