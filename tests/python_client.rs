//! The third-party client example from the ovos-PHAL-plugin-tools README, run
//! unchanged with the real Python `ovos-bus-client`, against toolboxd on its
//! embedded bus and on the real Python `ovos-messagebus`; and toolboxd's
//! answers side by side with those of ovos-PHAL-plugin-tools itself.
//!
//! The Python packages come from tests/requirements.txt, installed into .venv
//! by scripts/test (the README's test command).

mod common;

use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{math_manifest, Daemon, TempDir};
use serde_json::{json, Value};

fn venv_python() -> PathBuf {
    let python = std::env::var_os("TOOLBOXD_TEST_VENV")
        .map(PathBuf::from)
        .unwrap_or_else(|| common::root().join(".venv"))
        .join("bin/python");
    assert!(
        python.exists(),
        "{} is missing: run scripts/test, which installs tests/requirements.txt into .venv",
        python.display()
    );
    python
}

/// An OVOS config home whose mycroft.conf points the bus client (and the
/// Python bus) at `port`.
fn ovos_config(port: u16) -> TempDir {
    let home = TempDir::new("xdg");
    std::fs::create_dir_all(home.path().join("mycroft")).unwrap();
    let conf = serde_json::json!({"websocket": {"host": "127.0.0.1", "port": port, "route": "/core", "ssl": false}});
    home.write("mycroft/mycroft.conf", &conf.to_string());
    home
}

fn run_readme_example(home: &TempDir) -> String {
    let mut command = Command::new(venv_python());
    let out = common::ovos_home(&mut command, home.path())
        .arg(common::repo("tests/python/readme_client.py"))
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "example failed: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

fn assert_example_output(stdout: &str) {
    assert!(stdout.contains("add - Add two integers."), "{stdout}");
    assert!(
        stdout.contains("echo - Return the text unchanged."),
        "{stdout}"
    );
    assert!(
        stdout.contains("'name': 'add'") && stdout.contains("'toolbox_id': 'math'"),
        "{stdout}"
    );
    assert!(stdout.contains("Result: {'result': 42}"), "{stdout}");
}

#[test]
fn readme_client_runs_unchanged_on_the_embedded_bus() {
    let dir = TempDir::new("py-embedded");
    dir.write("math.toml", &math_manifest("math"));
    let daemon = Daemon::start(dir.path());
    let home = ovos_config(common::port_of(&daemon.url));
    assert_example_output(&run_readme_example(&home));
}

#[test]
fn readme_client_runs_unchanged_on_the_python_messagebus() {
    // The Python bus reads its port from mycroft.conf, so it must be chosen
    // before the bus starts.
    let port = common::fixed_port();
    let home = ovos_config(port);
    let mut command = Command::new(venv_python());
    let mut bus = common::Reaped(
        common::ovos_home(&mut command, home.path())
            .args(["-m", "ovos_messagebus"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    // Readiness: the port accepts connections.
    let deadline = Instant::now() + Duration::from_secs(30);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            Instant::now() < deadline,
            "ovos-messagebus did not listen on {port}"
        );
        assert!(bus.try_wait().unwrap().is_none(), "ovos-messagebus exited");
        std::thread::sleep(Duration::from_millis(50));
    }
    let dir = TempDir::new("py-bus");
    dir.write("math.toml", &math_manifest("math"));
    let url = format!("ws://127.0.0.1:{port}/core");
    let daemon = Daemon::start_with(&["--manifests", dir.path().to_str().unwrap(), "--bus", &url]);
    assert_eq!(daemon.url, url);
    let stdout = run_readme_example(&home);
    drop(daemon);
    let _ = bus.kill();
    let _ = bus.wait();
    assert_example_output(&stdout);
}

/// ovos-PHAL-plugin-tools, the Python service toolboxd replaces, on the bus at
/// `port`, serving the installed ToolBox plugin `test-math-tools` in process
/// (tests/python/phal_service.py); returned once it says it is on the bus.
fn python_service(port: u16, home: &TempDir) -> common::Reaped {
    let mut command = Command::new(venv_python());
    common::ovos_home(&mut command, home.path())
        .arg(common::repo("tests/python/phal_service.py"))
        .args(["127.0.0.1", &port.to_string()])
        .stdin(Stdio::null())
        .stderr(Stdio::null());
    // (OVOS logs to stdout too.)
    let (service, line) = common::Reaped::spawn_until(&mut command, Duration::from_secs(60), |l| {
        l.starts_with("ready ")
    });
    assert_eq!(line, "ready test-math-tools");
    service
}

/// How toolboxd's answer may differ from the Python service's, as documented.
#[derive(Clone, Copy, Debug)]
enum Differs {
    /// Not at all (but for the Python service writing unset session fields
    /// as null).
    No,
    /// The error text goes on: validation errors list the violations
    /// (docs/protocol.md).
    ErrorListsViolations,
    /// The error is the tool's own exception, where the Python service
    /// words a generic one (examples/python/opm_host.py).
    ErrorIsTheToolsOwn,
}

/// Sends each request (marked with its mark) to a bus, waits for its answer,
/// then listens for extra ones: the answers, one per request, in request order.
async fn answers_of(url: &str, requests: &[(&str, Value)], marks: &[String]) -> Vec<Value> {
    let mut bus = common::Bus::connect(url).await;
    for ((topic, data), m) in requests.iter().zip(marks) {
        let context = json!({"mark": m, "source": "tester", "destination": "tools",
                             "session": {"session_id": "side-by-side"}});
        bus.send(topic, data.clone(), context).await;
    }
    let mut answers = Vec::new();
    for ((topic, _), m) in requests.iter().zip(marks) {
        let response = format!("{topic}.response");
        let found = bus
            .wait_for(common::ANSWER_DEADLINE, |msg| {
                msg["type"] == response.as_str() && msg["context"]["mark"] == m.as_str()
            })
            .await;
        answers.push(found.unwrap_or_else(|| panic!("{url}: no answer to {topic}")));
    }
    bus.listen(common::SILENCE_WINDOW).await;
    for ((topic, _), m) in requests.iter().zip(marks) {
        assert_eq!(
            bus.answers_marked(m).len(),
            1,
            "{url}: {topic} answered more than once"
        );
    }
    answers
}

#[tokio::test]
async fn answers_match_the_python_service_frame_for_frame() {
    // The same ToolBox plugin twice, each on its own bus: in process in the
    // Python service, and in its own process under toolboxd (opm_host.py).
    let (_python_bus, port) = common::start_bus(0);
    let home = ovos_config(port);
    let _service = python_service(port, &home);
    let python_url = format!("ws://127.0.0.1:{port}/core");
    let dir = TempDir::new("side-by-side");
    dir.write(
        "opm.toml",
        &format!(
            "id = \"test-math-tools\"\ncommand = \"{}\"\nargs = [\"{}\", \"test-math-tools\"]\n",
            venv_python().display(),
            common::repo("examples/python/opm_host.py")
        ),
    );
    let daemon = Daemon::start(dir.path());

    let call = |name: &str, kwargs: Value| json!({"toolbox_id": "test-math-tools", "name": name, "kwargs": kwargs});
    let cases: Vec<(&str, Value, Differs)> = vec![
        ("ovos.persona.tools.discover", json!({}), Differs::No),
        (
            "ovos.persona.tools.call",
            call("add", json!({"a": 2, "b": 3})),
            Differs::No,
        ),
        (
            "ovos.persona.tools.call",
            call("divide", json!({"a": 7, "b": 2})),
            Differs::No,
        ),
        (
            "ovos.persona.tools.call",
            call("nope", json!({})),
            Differs::No,
        ),
        (
            "ovos.persona.tools.call",
            call("add", json!({"a": "x", "b": 3})),
            Differs::ErrorListsViolations,
        ),
        (
            "ovos.persona.tools.call",
            call("divide", json!({"a": 1, "b": 0})),
            Differs::ErrorIsTheToolsOwn,
        ),
        ("ovos.tools.list", json!({}), Differs::No),
        ("ovos.tools.get", json!({"name": "divide"}), Differs::No),
        ("ovos.tools.get", json!({"name": "nope"}), Differs::No),
        ("ovos.tools.get", json!({}), Differs::No),
        (
            "ovos.tools.invoke",
            json!({"name": "add", "args": {"a": 2, "b": 3}}),
            Differs::No,
        ),
        (
            "ovos.tools.invoke",
            json!({"name": "nope", "args": {}}),
            Differs::No,
        ),
        ("ovos.tools.invoke", json!({"args": {}}), Differs::No),
        (
            "ovos.tools.invoke",
            json!({"name": "divide", "args": {"a": 1, "b": 0}}),
            Differs::ErrorIsTheToolsOwn,
        ),
    ];
    let requests: Vec<(&str, Value)> = cases.iter().map(|(t, d, _)| (*t, d.clone())).collect();
    let marks: Vec<String> = requests.iter().map(|_| common::mark()).collect();
    let python = answers_of(&python_url, &requests, &marks).await;
    let ours = answers_of(&daemon.url, &requests, &marks).await;

    // The Python service writes the session's unset fields (`lang`) as null.
    let without_nulls = |context: &Value| {
        let mut context = context.clone();
        if let Some(session) = context["session"].as_object_mut() {
            session.retain(|_, v| !v.is_null());
        }
        context
    };
    for (((topic, request, differs), py), rs) in cases.iter().zip(&python).zip(&ours) {
        let what = format!("{topic} {request}:\n python:  {py}\n toolboxd: {rs}");
        assert_eq!(rs["type"], py["type"], "{what}");
        assert_eq!(
            without_nulls(&rs["context"]),
            without_nulls(&py["context"]),
            "{what}"
        );
        let (mut py_data, mut rs_data) = (py["data"].clone(), rs["data"].clone());
        match differs {
            Differs::No => {}
            Differs::ErrorListsViolations | Differs::ErrorIsTheToolsOwn => {
                let py_error = py_data["error"].take();
                let rs_error = rs_data["error"].take();
                let (py_error, rs_error) = (py_error.as_str(), rs_error.as_str());
                assert!(py_error.is_some() && rs_error.is_some(), "{what}");
                if let Differs::ErrorListsViolations = differs {
                    assert!(
                        rs_error
                            .unwrap()
                            .starts_with(&format!("{}: /", py_error.unwrap())),
                        "{what}"
                    );
                } else {
                    assert_eq!(rs_error, Some("ZeroDivisionError: cannot divide by zero"));
                }
            }
        }
        assert_eq!(rs_data, py_data, "{what}");
    }
    // Neither answers a persona call for a toolbox it does not host.
    for url in [&python_url, &daemon.url] {
        let mut bus = common::Bus::connect(url).await;
        let m = common::mark();
        bus.send(
            "ovos.persona.tools.call",
            json!({"toolbox_id": "nobody", "name": "add", "kwargs": {"a": 1, "b": 1}}),
            json!({"mark": m}),
        )
        .await;
        bus.assert_silence(&[&m]).await;
    }
}
