//! Toolboxes nobody on this project wrote, run unchanged: the reference MCP
//! server `mcp-server-time`, a server on the official MCP Python SDK, and an
//! OVOS ToolBox plugin served by examples/python/opm_host.py. All installed
//! from PyPI into .venv by scripts/test (tests/requirements.txt).

mod common;

use common::{repo, Bus, Daemon, TempDir};
use serde_json::{json, Value};

fn venv_bin(name: &str) -> String {
    let path = common::root().join(".venv/bin").join(name);
    assert!(
        path.exists(),
        "{} is missing: run scripts/test",
        path.display()
    );
    path.display().to_string()
}

fn ecosystem() -> (TempDir, Daemon) {
    let dir = TempDir::new("eco");
    let time = venv_bin("mcp-server-time");
    let python = venv_bin("python");
    dir.write(
        "time.toml",
        &format!("id = \"time\"\ncommand = \"{time}\"\nargs = [\"--local-timezone\", \"UTC\"]\n"),
    );
    dir.write(
        "time_legacy.toml",
        &format!("id = \"time_legacy\"\ncommand = \"{time}\"\nargs = [\"--local-timezone\", \"UTC\"]\nprotocol = \"2025-11-25\"\n"),
    );
    dir.write(
        "sdk.toml",
        &format!(
            "id = \"sdk\"\ncommand = \"{python}\"\nargs = [\"{}\"]\n",
            repo("tests/fixtures/sdk_toolbox.py")
        ),
    );
    dir.write(
        "opm.toml",
        &format!(
            "id = \"test-math-tools\"\ncommand = \"{python}\"\nargs = [\"{}\", \"test-math-tools\"]\n",
            repo("examples/python/opm_host.py")
        ),
    );
    let daemon = Daemon::start(dir.path());
    (dir, daemon)
}

#[tokio::test]
async fn third_party_servers_and_an_opm_plugin_are_listed_and_called() {
    let (_dir, daemon) = ecosystem();
    for (id, era) in [
        ("time", "modern MCP 2026-07-28"),
        ("time_legacy", "legacy MCP 2025-11-25"),
        ("sdk", "modern MCP 2026-07-28"),
        ("test-math-tools", "modern MCP 2026-07-28"),
    ] {
        let row = daemon.status(id);
        assert_eq!(
            (row["state"].as_str(), row["era"].as_str()),
            (Some("ready"), Some(era)),
            "{row}"
        );
    }
    let mut bus = Bus::connect(&daemon.url).await;

    // Listed with their schemas, on discover.
    let answers = bus.discover(4).await;
    assert_eq!(answers.len(), 4, "{answers:#?}");
    let tools: std::collections::HashMap<String, Vec<Value>> = answers.into_iter().collect();
    assert_eq!(tools.len(), 4);
    let names = |id: &str| {
        tools[id]
            .iter()
            .map(|t| t["name"].as_str().unwrap().to_owned())
            .collect::<Vec<_>>()
    };
    assert_eq!(names("time"), ["get_current_time", "convert_time"]);
    assert_eq!(names("sdk"), ["add", "greet", "refuse"]);
    assert_eq!(names("test-math-tools"), ["add", "divide"]);
    let opm_add = &tools["test-math-tools"][0];
    assert_eq!(opm_add["argument_schema"]["title"], "AddArgs");
    assert_eq!(opm_add["output_schema"]["title"], "AddOutput");
    let time_get = &tools["time"][0];
    assert!(
        time_get["argument_schema"]["properties"]["timezone"].is_object(),
        "{time_get}"
    );

    // The reference server, in both eras.
    for id in ["time", "time_legacy"] {
        let r = bus
            .call(id, "get_current_time", json!({"timezone": "Europe/Lisbon"}))
            .await;
        assert_eq!(r["result"]["timezone"], "Europe/Lisbon", "{id}: {r}");
        assert!(r["result"]["datetime"].as_str().unwrap().len() >= 19, "{r}");
        let r = bus
            .call(
                id,
                "get_current_time",
                json!({"timezone": "Nowhere/Nothing"}),
            )
            .await;
        let e = r["error"].as_str().unwrap();
        assert!(
            e.starts_with("ToolError: ") && e.contains("Nowhere/Nothing"),
            "{id}: {e}"
        );
    }

    // The SDK server: structured output, the generic shape, and a tool error.
    let r = bus.call("sdk", "add", json!({"a": 2, "b": 3})).await;
    assert_eq!(r["result"], json!({"total": 5}));
    let r = bus.call("sdk", "greet", json!({"name": "Ada"})).await;
    assert_eq!(r["result"]["content"], "Hello, Ada!");
    assert_eq!(r["result"]["is_error"], false);
    assert_eq!(r["result"]["raw"][0]["type"], "text");
    let r = bus
        .call("sdk", "refuse", json!({"reason": "not today"}))
        .await;
    assert_eq!(
        r["error"],
        "ToolError: Error executing tool refuse: not today"
    );

    // The OPM plugin in its own process.
    let r = bus
        .call("test-math-tools", "add", json!({"a": 10, "b": 32}))
        .await;
    assert_eq!(r["result"], json!({"result": 42}));
    let r = bus
        .call("test-math-tools", "divide", json!({"a": 1, "b": 0}))
        .await;
    assert_eq!(r["error"], "ZeroDivisionError: cannot divide by zero");
    let r = bus
        .call("test-math-tools", "add", json!({"a": "ten", "b": 32}))
        .await;
    assert!(
        r["error"].as_str().unwrap().starts_with(
            "ValueError: Tool input validation failed for 'add' in ToolBox 'test-math-tools': /a: "
        ),
        "{r}"
    );
}
