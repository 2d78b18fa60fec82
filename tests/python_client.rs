//! The third-party client example from the ovos-PHAL-plugin-tools README, run
//! unchanged with the real Python `ovos-bus-client`, against toolboxd on its
//! embedded bus and on the real Python `ovos-messagebus`.
//!
//! The Python packages come from tests/requirements.txt, installed into .venv
//! by scripts/test (the README's test command).

mod common;

use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{math_manifest, Daemon, TempDir};

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
    let out = Command::new(venv_python())
        .arg(common::repo("tests/python/readme_client.py"))
        .env("XDG_CONFIG_HOME", home.path())
        .env("XDG_DATA_HOME", home.path().join("data"))
        .env("XDG_CACHE_HOME", home.path().join("cache"))
        .env("XDG_STATE_HOME", home.path().join("state"))
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

fn port_of(url: &str) -> u16 {
    url.rsplit(':')
        .next()
        .unwrap()
        .split('/')
        .next()
        .unwrap()
        .parse()
        .unwrap()
}

#[test]
fn readme_client_runs_unchanged_on_the_embedded_bus() {
    let dir = TempDir::new("py-embedded");
    dir.write("math.toml", &math_manifest("math"));
    let daemon = Daemon::start(dir.path());
    let home = ovos_config(port_of(&daemon.url));
    assert_example_output(&run_readme_example(&home));
}

#[test]
fn readme_client_runs_unchanged_on_the_python_messagebus() {
    // The Python bus reads its port from mycroft.conf, so it must be chosen
    // before the bus starts.
    let port = common::fixed_port();
    let home = ovos_config(port);
    let mut bus = common::Reaped(
        Command::new(venv_python())
            .args(["-m", "ovos_messagebus"])
            .env("XDG_CONFIG_HOME", home.path())
            .env("XDG_DATA_HOME", home.path().join("data"))
            .env("XDG_CACHE_HOME", home.path().join("cache"))
            .env("XDG_STATE_HOME", home.path().join("state"))
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
