//! The way in for OVOS agent loops (docs/agents.md, recipe 1):
//! ovos-agentic-loop's ReAct engine, on the real packages (.venv-agents,
//! from tests/requirements-agents.txt), with only the toolboxd ToolBox
//! plugin of python/ovos-toolboxd, found by the plugin manager's finder;
//! a scripted chat engine stands in for the model. The tools it calls run
//! in sandboxed toolboxd children; the audit log records each call, with
//! the plugin as its source.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use common::{math_manifest, start_bus, Daemon, Reaped, TempDir};
use serde_json::{json, Value};

/// How long one conversation may take.
const TURN: Duration = Duration::from_secs(60);

fn agents_python() -> PathBuf {
    let python = common::root().join(".venv-agents/bin/python");
    assert!(
        python.exists(),
        "{} is missing: run scripts/test, which installs tests/requirements-agents.txt",
        python.display()
    );
    python
}

/// The agent loop of tests/python/agent_loop.py, talking to the bus on `port`.
struct AgentLoop {
    _process: Reaped,
    stdin: ChildStdin,
    lines: mpsc::Receiver<String>,
    stderr: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
}

impl AgentLoop {
    fn start(port: u16) -> AgentLoop {
        let home = TempDir::new("agent-xdg");
        let mut command = Command::new(agents_python());
        let mut process = common::ovos_home(&mut command, home.path())
            .arg(common::repo("tests/python/agent_loop.py"))
            .arg(port.to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        std::mem::forget(home);
        let stdin = process.stdin.take().unwrap();
        let stdout = process.stdout.take().unwrap();
        let stderr_pipe = process.stderr.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            // The OVOS log goes to stdout too; the driver marks its lines.
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if let Some(said) = line.strip_prefix("@@ ") {
                    let _ = tx.send(said.to_owned());
                }
            }
        });
        let stderr = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let kept = stderr.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr_pipe).lines().map_while(Result::ok) {
                kept.lock().unwrap().push(line);
            }
        });
        let mut agent = AgentLoop {
            _process: Reaped(process),
            stdin,
            lines,
            stderr,
        };
        let ready = agent.next();
        assert_eq!(ready, json!({"ready": true}));
        agent
    }

    fn next(&mut self) -> Value {
        match self.lines.recv_timeout(TURN) {
            Ok(line) => serde_json::from_str(&line).unwrap(),
            Err(_) => panic!(
                "the agent loop said nothing within {TURN:?}; its stderr:\n{}",
                self.stderr.lock().unwrap().join("\n")
            ),
        }
    }

    /// One conversation in which the model asks for `tool` with `args`.
    fn turn(&mut self, tool: &str, args: Value) -> Value {
        let line = json!({"tool": tool, "args": args}).to_string();
        writeln!(self.stdin, "{line}").unwrap();
        self.stdin.flush().unwrap();
        self.next()
    }
}

/// The audit log's lines.
fn audit_lines(path: &std::path::Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

/// Waits (10 s) for an audit line of `tool` in `toolbox`, and returns it.
fn audited(path: &std::path::Path, toolbox: &str, tool: &str, nth: usize) -> Value {
    let mut found = None;
    common::wait_until(
        "the call is in the audit log",
        Duration::from_secs(10),
        || {
            found = audit_lines(path)
                .into_iter()
                .filter(|l| l["toolbox"] == toolbox && l["tool"] == tool)
                .nth(nth);
            found.is_some()
        },
    );
    found.unwrap()
}

#[test]
fn the_react_engine_with_only_the_plugin_calls_a_confined_tool_and_the_call_is_audited() {
    let dir = TempDir::new("agents-one");
    dir.write("math.toml", &math_manifest("math"));
    let audit = dir.path().join("audit.log");
    let daemon = Daemon::start_audited(dir.path(), &audit);
    // The tool runs confined, as every default toolbox does.
    let sandbox = daemon.status("math")["sandbox"].clone();
    assert_eq!(sandbox[0], "standard", "{sandbox}");
    let mut agent = AgentLoop::start(common::port_of(&daemon.url));
    let turn = agent.turn("add", json!({"a": 2, "b": 3}));
    assert!(
        turn["tools"].as_array().unwrap().contains(&json!("add")),
        "{turn}"
    );
    let reply = turn["reply"].as_str().unwrap();
    eprintln!("the agent replied: {reply}");
    assert!(
        reply.contains('5'),
        "the tool's answer is in the reply: {reply}"
    );
    let line = audited(&audit, "math", "add", 0);
    assert_eq!(line["outcome"], "ok", "{line}");
    assert_eq!(line["source"], "toolboxd-opm", "{line}");
    assert_eq!(line["topic"], "ovos.persona.tools.call", "{line}");
}

#[test]
fn two_toolboxes_of_one_tool_name_stay_apart_and_a_restarted_daemon_serves_the_next_call() {
    let (_bus, port) = start_bus(0);
    let bus = format!("ws://127.0.0.1:{port}/core");
    let dir = TempDir::new("agents-two");
    dir.write("math.toml", &math_manifest("math"));
    dir.write("calc.toml", &math_manifest("calc"));
    let audit = dir.path().join("audit.log");
    let args = [
        "--manifests",
        dir.path().to_str().unwrap(),
        "--bus",
        &bus,
        "--audit-log",
        audit.to_str().unwrap(),
    ];
    let mut daemon = Daemon::start_with(&args);
    let mut agent = AgentLoop::start(port);
    let turn = agent.turn("calc__add", json!({"a": 20, "b": 22}));
    let tools = turn["tools"].as_array().unwrap().clone();
    assert!(
        tools.contains(&json!("math__add")) && tools.contains(&json!("calc__add")),
        "{turn}"
    );
    assert!(!tools.contains(&json!("add")), "{turn}");
    assert!(turn["reply"].as_str().unwrap().contains("42"), "{turn}");
    audited(&audit, "calc", "add", 0);
    let turn = agent.turn("math__add", json!({"a": 1, "b": 1}));
    assert!(turn["reply"].as_str().unwrap().contains('2'), "{turn}");
    audited(&audit, "math", "add", 0);

    // The daemon goes away and comes back; the agent loop, untouched,
    // calls again.
    daemon.stop();
    let _daemon = Daemon::start_with(&args);
    let turn = agent.turn("math__add", json!({"a": 3, "b": 4}));
    assert!(turn["reply"].as_str().unwrap().contains('7'), "{turn}");
    audited(&audit, "math", "add", 1);
}

#[test]
fn the_plugin_converts_schemas_and_says_when_the_bus_or_the_daemon_is_away() {
    let (_no_bus, no_bus_port) = common::refusing_port();
    let (_bus, bare_port) = start_bus(0);
    let home = TempDir::new("plugin-unit-xdg");
    let mut command = Command::new(agents_python());
    let out = common::output_within(
        common::ovos_home(&mut command, home.path())
            .args(["-m", "unittest", "discover", "-v", "-s"])
            .arg(common::repo("python/ovos-toolboxd/tests"))
            .env("TOOLBOXD_TEST_NO_BUS", no_bus_port.to_string())
            .env("TOOLBOXD_TEST_BARE_BUS", bare_port.to_string()),
        Duration::from_secs(120),
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("Ran 6 tests"), "{stderr}");
}

#[test]
fn the_ask_skill_answers_yes_no_silence_an_enum_and_an_unaskable_schema() {
    // python/ovos-skill-toolboxd-ask's own tests: ovos-workshop's skill
    // class on a FakeBus, the person's words scripted.
    let home = TempDir::new("ask-skill-xdg");
    let mut command = Command::new(agents_python());
    let out = common::output_within(
        common::ovos_home(&mut command, home.path())
            .args(["-m", "unittest", "discover", "-v", "-s"])
            .arg(common::repo("python/ovos-skill-toolboxd-ask/tests")),
        Duration::from_secs(120),
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("Ran 10 tests"), "{stderr}");
    for test in [
        "test_yes_approves_and_the_answer_goes_back_to_the_asking_session",
        "test_no_declines",
        "test_silence_cancels",
        "test_an_enum_is_chosen_from_its_values",
        "test_an_unaskable_schema_is_declined_with_a_reason",
    ] {
        assert!(stderr.contains(&format!("{test} (")), "{test}: {stderr}");
    }
}
