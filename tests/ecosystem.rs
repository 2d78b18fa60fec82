//! Toolboxes nobody on this project wrote, run unchanged: the reference MCP
//! servers `mcp-server-time` (Python) and `@modelcontextprotocol/server-everything`
//! (Node), servers on the official MCP Python SDK's 2.x and 1.x lines, and an
//! OVOS ToolBox plugin served by examples/python/opm_host.py. scripts/test
//! installs them: .venv (tests/requirements.txt), .venv-mcp1
//! (tests/requirements-mcp1.txt), tests/node (its package-lock.json).

mod common;

use common::{mark, repo, Bus, Daemon, TempDir};
use serde_json::{json, Value};

/// A file the test set-up installed, under the repository.
fn installed(path: &str) -> String {
    let path = common::root().join(path);
    assert!(
        path.exists(),
        "{} is missing: run scripts/test",
        path.display()
    );
    path.display().to_string()
}

fn venv_bin(name: &str) -> String {
    installed(&format!(".venv/bin/{name}"))
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
    // The SDK server's title and hints travel with its tool's definition; a
    // tool with none has no annotations key.
    assert_eq!(
        tools["sdk"][0]["annotations"],
        json!({"title": "Add two numbers", "readOnlyHint": true, "idempotentHint": true}),
        "{:?}",
        tools["sdk"][0]
    );
    assert!(
        tools["sdk"][1].get("annotations").is_none(),
        "{:?}",
        tools["sdk"][1]
    );
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

/// The reference Node server, `@modelcontextprotocol/server-everything`, as
/// its package installs it, twice: with the default limits, and with one
/// slot and a 1 s deadline for its task tool.
fn everything() -> (TempDir, Daemon) {
    let dir = TempDir::new("eco-node");
    let server = installed("tests/node/node_modules/.bin/mcp-server-everything");
    dir.write(
        "everything.toml",
        &format!("id = \"everything\"\ncommand = \"{server}\"\nargs = [\"stdio\"]\n"),
    );
    dir.write(
        "everything_short.toml",
        &format!(
            "id = \"everything_short\"\ncommand = \"{server}\"\nargs = [\"stdio\"]\n\
             [limits]\nmax_concurrent_calls = 1\n\
             [limits.tool_timeouts]\nsimulate-research-query = 1\n"
        ),
    );
    let daemon = Daemon::start(dir.path());
    (dir, daemon)
}

#[tokio::test]
async fn the_reference_node_server_is_listed_and_called_its_task_tool_included() {
    let (_dir, daemon) = everything();
    for id in ["everything", "everything_short"] {
        let row = daemon.status(id);
        assert_eq!(
            (row["state"].as_str(), row["era"].as_str()),
            (Some("ready"), Some("legacy MCP 2025-11-25")),
            "{row}"
        );
    }
    let mut bus = Bus::connect(&daemon.url).await;
    let answers = bus.discover(2).await;
    let names: Vec<&str> = answers[0]
        .1
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "echo",
            "get-annotated-message",
            "get-env",
            "get-resource-links",
            "get-resource-reference",
            "get-structured-content",
            "get-sum",
            "get-tiny-image",
            "gzip-file-as-resource",
            "toggle-simulated-logging",
            "toggle-subscriber-updates",
            "trigger-long-running-operation",
            // Shown to a client that declares roots, as toolboxd does for a
            // confined child.
            "get-roots-list",
            "simulate-research-query",
        ]
    );
    // Its roots are the directories its sandbox lets it keep files in.
    let r = bus.call("everything", "get-roots-list", json!({})).await;
    assert!(r.to_string().contains("test-state/everything/state"), "{r}");

    let r = bus
        .call("everything", "echo", json!({"message": "hi"}))
        .await;
    assert_eq!(r["result"]["content"], "Echo: hi", "{r}");
    let r = bus
        .call("everything", "get-sum", json!({"a": 2, "b": 3}))
        .await;
    assert_eq!(r["result"]["content"], "The sum of 2 and 3 is 5.", "{r}");
    let r = bus
        .call(
            "everything",
            "get-structured-content",
            json!({"location": "Chicago"}),
        )
        .await;
    assert!(r["result"]["temperature"].is_number(), "{r}");

    // The task tool: created, waited for, answered once.
    let m = mark();
    let r = bus
        .call_routed(
            &m,
            "everything",
            "simulate-research-query",
            json!({"topic": "otters"}),
        )
        .await;
    let report = r["result"]["content"].as_str().unwrap_or_default();
    assert!(report.starts_with("# Research Report: otters"), "{r}");

    // Progress notifications reach the caller.
    let m = mark();
    let r = bus
        .call_routed(
            &m,
            "everything",
            "trigger-long-running-operation",
            json!({"duration": 1, "steps": 4}),
        )
        .await;
    assert_eq!(
        r["result"]["content"],
        "Long running operation completed. Duration: 1 seconds, Steps: 4."
    );
    let progress = bus.progress_of(&m);
    assert!(!progress.is_empty(), "no progress on the bus");
    for p in &progress {
        assert_eq!(
            (&p["toolbox_id"], &p["name"], &p["total"]),
            (
                &json!("everything"),
                &json!("trigger-long-running-operation"),
                &json!(4)
            ),
            "{p}"
        );
    }

    // Past its deadline the task is cancelled, and its one slot serves again.
    let r = bus
        .call(
            "everything_short",
            "simulate-research-query",
            json!({"topic": "x"}),
        )
        .await;
    assert_eq!(
        r["error"],
        "TimeoutError: tool 'simulate-research-query' in toolbox 'everything_short' did not \
         answer within 1 s"
    );
    daemon.wait_for_log(
        "cancelling the task of a call that is over",
        1,
        common::ANSWER_DEADLINE,
    );
    let r = bus
        .call("everything_short", "echo", json!({"message": "again"}))
        .await;
    assert_eq!(r["result"]["content"], "Echo: again", "{r}");
}

#[tokio::test]
async fn a_server_on_the_python_sdk_1x_line_is_listed_and_called() {
    let dir = TempDir::new("eco-mcp1");
    let python = installed(".venv-mcp1/bin/python");
    dir.write(
        "fastmcp1.toml",
        &format!(
            "id = \"fastmcp1\"\ncommand = \"{python}\"\nargs = [\"{}\"]\n",
            repo("tests/fixtures/fastmcp1_toolbox.py")
        ),
    );
    let daemon = Daemon::start(dir.path());
    let row = daemon.status("fastmcp1");
    assert_eq!(row["era"], "legacy MCP 2025-11-25", "{row}");
    let mut bus = Bus::connect(&daemon.url).await;
    let answers = bus.discover(1).await;
    let names: Vec<&str> = answers[0]
        .1
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["add", "greet", "refuse", "countdown"]);

    let r = bus.call("fastmcp1", "add", json!({"a": 2, "b": 3})).await;
    assert_eq!(r["result"], json!({"total": 5}));
    let r = bus.call("fastmcp1", "greet", json!({"name": "Ada"})).await;
    assert_eq!(r["result"]["content"], "Hello, Ada!");
    let r = bus
        .call("fastmcp1", "refuse", json!({"reason": "not today"}))
        .await;
    assert_eq!(
        r["error"],
        "ToolError: Error executing tool refuse: not today"
    );

    // The SDK's Context.report_progress reaches the caller.
    let m = mark();
    let r = bus
        .call_routed(&m, "fastmcp1", "countdown", json!({"steps": 5}))
        .await;
    assert_eq!(r["result"]["content"], "liftoff");
    let progress = bus.progress_of(&m);
    assert!(!progress.is_empty(), "no progress on the bus");
    // Numbers as the SDK sends them (floats).
    assert_eq!(
        progress[0],
        json!({"toolbox_id": "fastmcp1", "name": "countdown", "progress": 1.0, "total": 5.0,
               "message": "4 to go"})
    );
}

#[tokio::test]
async fn an_opm_plugin_gets_its_configuration_logs_to_its_stderr_and_one_serving_nothing_is_flagged(
) {
    let dir = TempDir::new("eco-opm");
    let python = venv_bin("python");
    let host = repo("examples/python/opm_host.py");
    dir.write(
        "greeter.toml",
        &format!(
            "id = \"greeter\"\ncommand = \"{python}\"\nargs = [\"{host}\", \"test-math-tools\", \
             '{{\"greeting\": \"hello from the manifest\"}}']\n\
             [annotations.greet]\ntitle = \"Say hello\"\nreadOnlyHint = true\n"
        ),
    );
    dir.write(
        "empty.toml",
        &format!(
            "id = \"empty\"\ncommand = \"{python}\"\nargs = [\"{host}\", \"test-math-tools\", \
             '{{\"tools\": \"none\"}}']\n"
        ),
    );
    // check --probe warns of the one that serves nothing.
    let out = common::output_within(
        std::process::Command::new(common::BIN)
            .args(["check", "--probe", "--manifests"])
            .arg(dir.path()),
        std::time::Duration::from_secs(120),
    );
    let printed = String::from_utf8_lossy(&out.stdout);
    assert!(
        printed
            .lines()
            .any(|l| l.starts_with("warn  empty") && l.contains("serves no tools")),
        "{printed}"
    );
    assert!(
        printed
            .lines()
            .any(|l| l.starts_with("ok    greeter") && l.contains("greet")),
        "{printed}"
    );

    let daemon = Daemon::start(dir.path());
    let mut bus = Bus::connect(&daemon.url).await;
    // The manifest's annotations are the plugin's tool's on the bus.
    let listed = bus.request("ovos.tools.list", json!({})).await;
    let greet = listed["data"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "greet")
        .cloned()
        .unwrap();
    assert_eq!(
        greet["annotations"],
        json!({"title": "Say hello", "readOnlyHint": true}),
        "{greet}"
    );
    // The configuration reached the plugin.
    let greeted = bus.call("greeter", "greet", json!({})).await;
    assert_eq!(
        greeted["result"]["text"], "hello from the manifest",
        "{greeted}"
    );
    // The OVOS logger wrote to stdout, the protocol channel: every line is
    // now the toolbox's stderr, and the protocol unharmed.
    for n in 0..3 {
        let added = bus.call("greeter", "add", json!({"a": n, "b": 1})).await;
        assert_eq!(added["result"]["result"], n + 1, "{added}");
    }
    let (code, logs, _) = daemon.ctl(&["logs", "greeter"]);
    assert_eq!(code, 0);
    for n in 0..3 {
        assert!(logs.contains(&format!("adding {n} and 1")), "{logs}");
    }
    let row = daemon.status("empty");
    assert_eq!(row["tools"], 0, "{row}");
    assert!(
        row["note"]
            .as_str()
            .unwrap_or("")
            .starts_with("serves no tools"),
        "{row}"
    );
    let (_, table, _) = daemon.ctl(&["status"]);
    assert!(table.contains("serves no tools"), "{table}");
    assert!(daemon.status("greeter")["note"].is_null());
}

/// Runs `git` in `dir` (the test's own, as root or the test's user).
fn git(dir: &std::path::Path, args: &[&str]) {
    let out = std::process::Command::new("git")
        .args(["-c", "user.name=t", "-c", "user.email=t@example.org"])
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap();
    assert!(out.status.success(), "git {args:?}: {out:?}");
}

#[tokio::test]
async fn git_filesystem_and_memory_servers_work_under_the_default_sandbox() {
    // Three popular servers, installed from PyPI and npm, each with a
    // manifest that names only its data (docs/authoring.md): a git
    // repository it may read, a directory it may write, a file in its state
    // directory. Their data sits outside /tmp and outside this repository.
    let repository = TempDir::outside("eco-git");
    std::fs::write(repository.path().join("README"), "hello\n").unwrap();
    git(repository.path(), &["init", "-q", "-b", "main"]);
    git(repository.path(), &["add", "README"]);
    git(repository.path(), &["commit", "-q", "-m", "first words"]);
    let notes = TempDir::outside("eco-files");
    {
        use std::os::unix::fs::PermissionsExt;
        // The toolbox's own user must be able to write there.
        std::fs::set_permissions(notes.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    }
    std::fs::write(notes.path().join("todo.md"), "milk\n").unwrap();
    let modules = installed("tests/node/node_modules/@modelcontextprotocol");
    let dir = TempDir::new("eco-real");
    let repo_path = repository.path().display().to_string();
    dir.write(
        "git.toml",
        &format!(
            "id = \"git\"\ncommand = \"{}\"\nargs = [\"--repository\", \"{repo_path}\"]\n\
             env = {{ GIT_CONFIG_COUNT = \"1\", GIT_CONFIG_KEY_0 = \"safe.directory\", \
             GIT_CONFIG_VALUE_0 = \"{repo_path}\" }}\n",
            venv_bin("mcp-server-git")
        ),
    );
    let notes_path = notes.path().display().to_string();
    dir.write(
        "files.toml",
        &format!(
            "id = \"files\"\ncommand = \"node\"\n\
             args = [\"{modules}/server-filesystem/dist/index.js\", \"{notes_path}\"]\n\
             [sandbox]\nread_write = [\"{notes_path}\"]\n"
        ),
    );
    dir.write(
        "memory.toml",
        &format!(
            "id = \"memory\"\ncommand = \"node\"\n\
             args = [\"{modules}/server-memory/dist/index.js\"]\n\
             env = {{ MEMORY_FILE_PATH = \"$TOOLBOXD_STATE_DIR/memory.jsonl\" }}\n"
        ),
    );
    let daemon = Daemon::start(dir.path());
    for id in ["git", "files", "memory"] {
        let row = daemon.status(id);
        assert_eq!(row["state"], "ready", "{row}");
        assert_eq!(row["sandbox"][0], "standard", "{row}");
    }
    let mut bus = Bus::connect(&daemon.url).await;

    let r = bus
        .call(
            "git",
            "git_log",
            json!({"repo_path": repo_path, "max_count": 5}),
        )
        .await;
    assert!(r.to_string().contains("first words"), "{r}");
    let r = bus
        .call("git", "git_status", json!({"repo_path": repo_path}))
        .await;
    assert!(r.to_string().contains("On branch main"), "{r}");

    // It asked for MCP roots, and was given where it may keep files.
    let r = bus
        .call("files", "list_allowed_directories", json!({}))
        .await;
    let allowed = r.to_string();
    assert!(allowed.contains(&notes_path), "{r}");
    assert!(allowed.contains("test-state/files/state"), "{r}");
    let r = bus
        .call("files", "list_directory", json!({"path": notes_path}))
        .await;
    assert!(r.to_string().contains("todo.md"), "{r}");
    let written = format!("{notes_path}/shopping.md");
    let r = bus
        .call(
            "files",
            "write_file",
            json!({"path": written, "content": "eggs\n"}),
        )
        .await;
    assert!(r["error"].is_null(), "{r}");
    assert_eq!(std::fs::read_to_string(&written).unwrap(), "eggs\n");

    let entity = json!({"entities": [{"name": "Ada", "entityType": "person",
                                     "observations": ["wrote the first program"]}]});
    let r = bus.call("memory", "create_entities", entity).await;
    assert!(r["error"].is_null(), "{r}");
    let r = bus.call("memory", "read_graph", json!({})).await;
    assert!(r.to_string().contains("wrote the first program"), "{r}");
    // Its store is in its state directory, where the manifest pointed it.
    let state = common::root().join("target/test-state/memory/state/memory.jsonl");
    let stored =
        std::fs::read_to_string(&state).unwrap_or_else(|e| panic!("{}: {e}", state.display()));
    assert!(stored.contains("Ada"), "{stored}");
    // Nothing of this was refused.
    for id in ["git", "files", "memory"] {
        let row = daemon.status(id);
        assert_eq!(row["sandbox_refused"], json!([]), "{row}");
    }
}
