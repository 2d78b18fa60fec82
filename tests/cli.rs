//! The command line: `check` (with and without `--probe`), `list`, `call`,
//! `bus`, and `run`'s default bus selection.

mod common;

use std::process::Command;

use common::{math_manifest, start_bus, text_manifest, Bus, Daemon, TempDir, BIN};
use serde_json::{json, Value};

fn toolboxd(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(BIN).args(args).output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn check_accepts_the_shipped_manifests_and_probes_them() {
    let dir = common::repo("manifests");
    let (code, out, err) = toolboxd(&["check", "--manifests", &dir]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.contains("ok    math") && out.contains("ok    text"),
        "{out}"
    );
    let (code, out, err) = toolboxd(&["check", "--probe", "--manifests", &dir]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.contains("modern MCP 2026-07-28, 4 tools: add, echo, sqrt, sleep"),
        "{out}"
    );
    assert!(
        out.contains("legacy MCP 2025-06-18, 2 tools: shout, word_count"),
        "{out}"
    );
}

#[test]
fn check_reports_each_bad_file_with_line_and_fix_and_exits_1() {
    let dir = TempDir::new("check");
    dir.write("good.toml", &math_manifest("good"));
    dir.write(
        "typo.toml",
        "id = \"typo\"\ncommand = \"sh\"\ncomand = \"x\"\n",
    );
    dir.write("badid.toml", "id = \"a.b\"\ncommand = \"sh\"\n");
    dir.write("nobin.toml", "id = \"nobin\"\ncommand = \"./missing.sh\"\n");
    dir.write("dup.toml", &math_manifest("good"));
    // Two wrong values in one file: both are named, each at its line.
    dir.write(
        "two.toml",
        "id = \"two\"\ncommand = \"sh\"\n[limits]\ncall_timeout_s = 0\nprobe_interval_s = \"often\"\n",
    );
    let (code, out, _) = toolboxd(&["check", "--manifests", dir.path().to_str().unwrap()]);
    assert!(
        out.contains("two.toml:4: call_timeout_s = 0 must be between"),
        "{out}"
    );
    assert!(
        out.contains("two.toml:5: invalid type: string \"often\""),
        "{out}"
    );
    assert_eq!(code, 1, "{out}");
    let line = |file: &str| {
        out.lines()
            .find(|l| l.contains(file))
            .unwrap_or_else(|| panic!("{file} missing: {out}"))
            .to_owned()
    };
    assert!(
        line("typo.toml").contains("typo.toml:3: unknown field `comand`"),
        "{out}"
    );
    assert!(
        line("badid.toml").contains("badid.toml:1: id \"a.b\" is not a valid toolbox_id"),
        "{out}"
    );
    assert!(
        line("nobin.toml").contains("nobin.toml:2: command")
            && line("nobin.toml").contains("does not exist"),
        "{out}"
    );
    // Files are read in name order: dup.toml claims the id first.
    assert!(
        line("good.toml:1").contains("id \"good\" is already used by")
            && line("good.toml:1").contains("dup.toml"),
        "{out}"
    );
    assert!(out.contains("ok    good"), "{out}");
}

#[test]
fn check_probe_reports_a_child_that_does_not_speak_mcp() {
    let dir = TempDir::new("probe");
    dir.write("silent.toml", "id = \"silent\"\ncommand = \"sh\"\nargs = [\"-c\", \"echo hello; exit 3\"]\n[limits]\nprobe_timeout_s = 1\ncall_timeout_s = 2\n");
    let (code, out, _) = toolboxd(&[
        "check",
        "--probe",
        "--manifests",
        dir.path().to_str().unwrap(),
    ]);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("error") && out.contains("toolbox silent: handshake"),
        "{out}"
    );
}

#[test]
fn list_and_call_print_json_and_exit_1_on_error_answers() {
    let dir = TempDir::new("cli");
    dir.write("math.toml", &math_manifest("math"));
    dir.write("text.toml", &text_manifest("text"));
    let daemon = Daemon::start(dir.path());
    let run = |args: &[&str]| {
        let mut full = args.to_vec();
        full.extend(["--bus", &daemon.url]);
        let (code, out, err) = toolboxd(&full);
        let json = serde_json::from_str::<Value>(&out).unwrap_or(Value::Null);
        (code, json, err)
    };
    let (code, out, err) = run(&["call", "add", "--args", r#"{"a":2,"b":3}"#]);
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(out, json!({"name": "add", "result": {"result": 5}}));
    let (code, out, _) = run(&[
        "call",
        "shout",
        "--toolbox",
        "text",
        "--args",
        r#"{"text":"a"}"#,
    ]);
    assert_eq!(code, 0);
    assert_eq!(out, json!({"toolbox_id": "text", "result": {"text": "A"}}));
    let (code, out, _) = run(&["call", "sqrt", "--args", r#"{"number":-1}"#]);
    assert_eq!(code, 1);
    assert_eq!(
        out["error"],
        "ValueError: cannot take the square root of -1"
    );
    let (code, out, _) = run(&["list"]);
    assert_eq!(code, 0);
    assert_eq!(out["tools"].as_array().unwrap().len(), 6);
    // A persona call nobody answers: exit 1 with a message, not a hang.
    let (code, _, err) = run(&["call", "add", "--toolbox", "nobody", "--timeout", "1"]);
    assert_eq!(code, 1);
    assert!(
        err.contains("no answer") && err.contains("'nobody'"),
        "{err}"
    );
}

#[tokio::test]
async fn bus_command_relays_to_every_client_including_the_sender() {
    let (mut bus, port) = start_bus(0);
    let url = format!("ws://127.0.0.1:{port}/core");
    let mut a = Bus::connect(&url).await;
    let mut b = Bus::connect(&url).await;
    for c in [&mut a, &mut b] {
        let hello = c.next(std::time::Duration::from_secs(5)).await.unwrap();
        assert_eq!(hello["type"], "connected");
    }
    a.send("x.y", json!({"n": 1}), json!({})).await;
    for c in [&mut a, &mut b] {
        let m = c.next(std::time::Duration::from_secs(5)).await.unwrap();
        assert_eq!(m["type"], "x.y");
        assert_eq!(m["data"]["n"], 1);
    }
    // Any other route is refused.
    assert!(
        tokio_tungstenite::connect_async(format!("ws://127.0.0.1:{port}/other"))
            .await
            .is_err()
    );
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(bus.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    );
    assert!(bus.wait().unwrap().success());
}

#[tokio::test]
async fn run_joins_the_bus_it_embeds_in_process_not_over_a_socket() {
    let dir = TempDir::new("own-bus");
    dir.write("math.toml", &math_manifest("math"));
    let daemon = Daemon::start(dir.path());
    let connected = daemon.log_lines_with("connected to the bus");
    assert_eq!(connected.len(), 1, "{connected:?}");
    assert_eq!(connected[0]["in_process"], true, "{connected:?}");
    let port: u16 = daemon
        .url
        .trim_end_matches("/core")
        .rsplit(':')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    // No TCP connection to the bus: the daemon is its only client.
    assert_eq!(connections_to(port), 0);
    let mut client = Bus::connect(&daemon.url).await;
    let r = add(&mut client, 4, 5).await;
    assert_eq!(r["data"]["result"]["result"], 9, "{r}");
    // The client's connection, both of its ends, and nothing else.
    assert_eq!(connections_to(port), 2);
}

/// `ovos.tools.invoke` of `add` on the bus `client` is on: the response.
async fn add(client: &mut Bus, a: i64, b: i64) -> Value {
    client
        .request(
            "ovos.tools.invoke",
            json!({"name": "add", "args": {"a": a, "b": b}}),
        )
        .await
}

/// Established TCP connections on this machine with `port` at either end.
fn connections_to(port: u16) -> usize {
    common::established_tcp()
        .into_iter()
        .filter(|&(local, remote)| local == port || remote == port)
        .count()
}

#[tokio::test]
async fn run_reports_a_bad_manifest_and_serves_the_good_ones() {
    let dir = TempDir::new("runbad");
    dir.write("math.toml", &math_manifest("math"));
    dir.write("bad.toml", "id = \"bad\"\n");
    let mut daemon = Daemon::start(dir.path());
    let errors = daemon.log_lines_with("missing field `command`");
    assert_eq!(errors.len(), 1, "{:?}", daemon.logs.lock().unwrap());
    assert!(errors[0]["message"]
        .as_str()
        .unwrap()
        .contains("bad.toml:1"));
    // The good one serves.
    assert_eq!(daemon.status("math")["state"], "ready");
    let mut bus = Bus::connect(&daemon.url).await;
    let r = add(&mut bus, 2, 3).await;
    assert_eq!(r["data"]["result"]["result"], 5, "{r}");
    assert!(daemon.stop().success());
}

#[tokio::test]
async fn run_reconnects_when_the_bus_comes_back() {
    let (mut bus, port) = start_bus(0);
    let url = format!("ws://127.0.0.1:{port}/core");
    let dir = TempDir::new("reconnect");
    dir.write("math.toml", &math_manifest("math"));
    let daemon = Daemon::start_with(&["--manifests", dir.path().to_str().unwrap(), "--bus", &url]);
    let mut client = Bus::connect(&url).await;
    let r = add(&mut client, 1, 1).await;
    assert_eq!(r["data"]["result"]["result"], 2);

    bus.kill().unwrap();
    bus.wait().unwrap();
    daemon.wait_for_log("reconnecting", 1, std::time::Duration::from_secs(10));
    // The bus comes back on the same address (the only way to test a
    // reconnect; the port was ours a moment ago).
    let (mut bus, _) = start_bus(port);
    daemon.wait_for_log(
        "connected to the bus",
        2,
        std::time::Duration::from_secs(15),
    );
    let mut client = Bus::connect(&url).await;
    let r = add(&mut client, 2, 2).await;
    assert_eq!(r["data"]["result"]["result"], 4);
    drop(daemon);
    bus.kill().unwrap();
    bus.wait().unwrap();
}

#[tokio::test]
async fn new_writes_toolboxes_that_pass_probe_and_answer() {
    let dir = TempDir::new("new");
    let d = dir.path().to_str().unwrap();
    for (name, lang) in [("pyhello", "python"), ("shhello", "shell")] {
        let (code, out, err) = toolboxd(&["new", name, "--lang", lang, "--dir", d]);
        assert_eq!(code, 0, "{out}{err}");
        assert!(out.contains(&format!("{name}.toml")), "{out}");
        // Closed to the network, with a comment on how to open it.
        let manifest = std::fs::read_to_string(dir.path().join(format!("{name}.toml"))).unwrap();
        assert!(
            manifest.contains("network = \"none\"") && manifest.contains("network = \"full\""),
            "{manifest}"
        );
    }
    let (code, out, _) = toolboxd(&["new", "pyhello", "--dir", d]);
    assert_eq!(code, 1, "refuses to overwrite: {out}");
    // A manifests directory that is not there yet is made.
    let fresh = dir.path().join("fresh/manifests");
    let (code, out, err) = toolboxd(&["new", "first", "--dir", fresh.to_str().unwrap()]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(fresh.join("first.toml").exists());
    std::fs::remove_dir_all(dir.path().join("fresh")).unwrap();
    // One that cannot be: the reason, said once.
    let blocked = dir.write("a-file", "");
    let (code, _, err) = toolboxd(&["new", "x", "--dir", &format!("{}/sub", blocked.display())]);
    assert_eq!(code, 1, "{err}");
    assert_eq!(err.matches("Not a directory").count(), 1, "{err}");
    let (code, out, err) = toolboxd(&["check", "--probe", "--manifests", d]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.contains("ok    pyhello") && out.contains("ok    shhello"),
        "{out}"
    );

    let daemon = Daemon::start(dir.path());
    let mut bus = Bus::connect(&daemon.url).await;
    for name in ["pyhello", "shhello"] {
        let r = bus
            .request(
                "ovos.persona.tools.call",
                json!({"toolbox_id": name, "name": "hello", "kwargs": {"name": "Ada"}}),
            )
            .await;
        assert_eq!(
            r["data"]["result"],
            json!({"greeting": "Hello, Ada!"}),
            "{name}"
        );
        let r = bus
            .request(
                "ovos.persona.tools.call",
                json!({"toolbox_id": name, "name": "hello", "kwargs": {"name": " "}}),
            )
            .await;
        assert_eq!(
            r["data"]["error"], "ValueError: name must not be blank",
            "{name}"
        );
    }
}

#[test]
fn call_shows_the_progress_of_its_call_on_stderr() {
    let dir = TempDir::new("cli-progress");
    dir.write(
        "tasks.toml",
        &format!(
            "id = \"tasks\"\ncommand = \"python3\"\nargs = [\"{}\"]\n",
            common::repo("tests/fixtures/task_toolbox.py")
        ),
    );
    let daemon = Daemon::start(dir.path());
    let (code, out, err) = toolboxd(&[
        "call",
        "flood",
        "--args",
        r#"{"count": 4, "over_s": 1.2, "then_s": 0.3}"#,
        "--bus",
        &daemon.url,
    ]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("sent 4"), "the answer on stdout: {out}");
    let progress: Vec<&str> = err.lines().filter(|l| l.starts_with("progress ")).collect();
    assert!(!progress.is_empty(), "{err}");
    assert!(progress.iter().all(|l| l.contains("/4")), "{err}");
}

/// An OVOS config home (user file) and a system file, with these contents.
fn ovos_configs(user: &str, system: &str) -> TempDir {
    let home = TempDir::new("cfg");
    std::fs::create_dir_all(home.path().join("mycroft")).unwrap();
    home.write("mycroft/mycroft.conf", user);
    home.write("system.conf", system);
    home
}

#[tokio::test]
async fn the_bus_is_found_in_mycroft_conf_user_over_system() {
    let port = common::fixed_port();
    let home = ovos_configs(
        &format!("{{\n  // user settings win\n  \"websocket\": {{\"port\": {port}}}\n}}"),
        "{\"websocket\": {\"host\": \"127.0.0.1\", \"port\": 1, \"route\": \"/core\"}}",
    );
    let env = [
        ("XDG_CONFIG_HOME", home.path().to_str().unwrap().to_owned()),
        (
            "MYCROFT_SYSTEM_CONFIG",
            home.path().join("system.conf").to_str().unwrap().to_owned(),
        ),
    ];
    let env_refs: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let dir = TempDir::new("cfg-run");
    dir.write("math.toml", &math_manifest("math"));
    // No bus flag: the daemon reads the config, finds nothing listening, embeds there.
    let daemon = Daemon::start_env(&["--manifests", dir.path().to_str().unwrap()], &env_refs);
    assert_eq!(daemon.url, format!("ws://127.0.0.1:{port}/core"));
    assert!(!daemon
        .log_lines_with("serving an embedded bus there")
        .is_empty());
    // The client commands read the same files.
    let out = std::process::Command::new(BIN)
        .args(["call", "add", "--args", r#"{"a":1,"b":2}"#])
        .envs(env_refs.iter().copied())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        serde_json::from_slice::<Value>(&out.stdout).unwrap()["result"]["result"],
        3
    );

    // A malformed user file is reported, and the system file still counts.
    home.write("mycroft/mycroft.conf", "{\"websocket\": {\"port\": ");
    home.write(
        "system.conf",
        &format!("{{\"websocket\": {{\"port\": {port}}}}}"),
    );
    let out = std::process::Command::new(BIN)
        .args(["list"])
        .envs(env_refs.iter().copied())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("mycroft.conf is not valid JSON"), "{err}");
}

#[test]
fn sigterm_stops_a_daemon_still_waiting_for_its_bus() {
    let dir = TempDir::new("nobus");
    dir.write("math.toml", &math_manifest("math"));
    let control = dir.path().join("ctl.sock");
    let (_held, port) = common::refusing_port();
    let url = format!("ws://127.0.0.1:{port}/core");
    let mut daemon = std::process::Command::new(BIN)
        .args([
            "run",
            "--bus",
            &url,
            "--manifests",
            dir.path().to_str().unwrap(),
            "--control",
            control.to_str().unwrap(),
        ])
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Readiness of the wait: the log says it is retrying the bus.
    let stderr = daemon.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufRead::lines(std::io::BufReader::new(stderr)).map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let waiting = std::time::Instant::now() + common::ANSWER_DEADLINE;
    loop {
        let left = waiting.saturating_duration_since(std::time::Instant::now());
        match rx.recv_timeout(left) {
            Ok(line) if line.contains("retrying") => break,
            Ok(_) => {}
            Err(_) => {
                let _ = daemon.kill();
                panic!("the daemon never said it is retrying the bus");
            }
        }
    }
    std::thread::spawn(move || while rx.recv().is_ok() {});
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(daemon.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        if let Some(status) = daemon.try_wait().unwrap() {
            assert!(status.success(), "{status:?}");
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "SIGTERM did not stop it"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// The delay a "retrying in N ms" log line announces.
fn retry_delay_ms(line: &Value) -> Option<u64> {
    let message = line["message"].as_str()?;
    let (_, rest) = message.rsplit_once("; retrying in ")?;
    rest.strip_suffix(" ms")?.parse().ok()
}

/// Seconds since midnight (UTC) of a JSON log line's RFC 3339 `timestamp`.
fn log_time_s(line: &Value) -> f64 {
    let stamp = line["timestamp"].as_str().expect("a timestamp");
    let time = stamp
        .split_once('T')
        .expect("an RFC 3339 timestamp")
        .1
        .trim_end_matches('Z');
    let parts: Vec<f64> = time.split(':').map(|p| p.parse().unwrap()).collect();
    parts[0] * 3600.0 + parts[1] * 60.0 + parts[2]
}

#[tokio::test]
async fn run_with_bus_never_embeds_and_retries_from_100_ms_doubling_to_5_s() {
    use std::time::Duration;
    let dir = TempDir::new("backoff");
    dir.write("math.toml", &math_manifest("math"));
    let control = dir.path().join("ctl.sock");
    let (held, port) = common::refusing_port();
    let url = format!("ws://127.0.0.1:{port}/core");
    let starting = common::Starting::spawn(
        &[
            "--manifests",
            dir.path().to_str().unwrap(),
            "--bus",
            &url,
            "--control",
            control.to_str().unwrap(),
        ],
        &[],
        &control,
    );
    // Every attempt is refused; each says how long it waits before the next.
    let expected = [100, 200, 400, 800, 1600, 3200, 5000, 5000];
    let mut retries: Vec<(f64, u64)> = Vec::new();
    while retries.len() < expected.len() {
        let (_, line) = starting.expect_line("retrying in", Duration::from_secs(15));
        let message = line["message"].as_str().unwrap();
        assert!(
            message.contains(&format!("cannot connect to the bus at {url}")),
            "{line}"
        );
        retries.push((
            log_time_s(&line),
            retry_delay_ms(&line).expect("a delay in ms"),
        ));
    }
    let delays: Vec<u64> = retries.iter().map(|(_, d)| *d).collect();
    assert_eq!(delays, expected, "the announced delays");
    // And it waits that long: by the daemon's own clock, each attempt comes
    // at least the announced delay after the one before (the elapsed time is
    // what is tested here).
    for pair in retries.windows(2) {
        let gap_ms = (pair[1].0 - pair[0].0).rem_euclid(86_400.0) * 1000.0;
        let announced = pair[0].1 as f64;
        assert!(
            gap_ms >= announced - 1.0 && gap_ms < announced + 3000.0,
            "{gap_ms:.1} ms between attempts after announcing {announced} ms"
        );
    }
    // It never served a bus of its own, and is not ready without one.
    for line in starting.logs.lock().unwrap().iter() {
        let v: Value = serde_json::from_str(line).unwrap_or_default();
        let message = v["message"].as_str().unwrap_or_default();
        assert!(
            !message.contains("embedded bus") && message != "ready",
            "{line}"
        );
    }
    // The bus comes up on that address: the next retry connects and the
    // daemon serves there.
    drop(held);
    let (_bus, _) = start_bus(port);
    let daemon = starting.ready();
    assert_eq!(daemon.url, url);
    let mut client = Bus::connect(&url).await;
    let r = add(&mut client, 2, 3).await;
    assert_eq!(r["data"]["result"]["result"], 5, "{r}");
    assert!(daemon.log_lines_with("embedded bus").is_empty());
}

#[test]
fn check_probe_rejects_tools_whose_schemas_do_not_compile() {
    let dir = TempDir::new("probe-schema");
    dir.write("math.toml", &math_manifest("math"));
    dir.write(
        "badschema.toml",
        &format!(
            "id = \"badschema\"\ncommand = \"python3\"\nargs = [\"{}\"]\n",
            common::repo("tests/fixtures/bad_schema_toolbox.py")
        ),
    );
    let (code, out, err) = toolboxd(&[
        "check",
        "--probe",
        "--manifests",
        dir.path().to_str().unwrap(),
    ]);
    assert_eq!(code, 1, "{out}{err}");
    let errors: Vec<&str> = out.lines().filter(|l| l.starts_with("error")).collect();
    assert_eq!(errors.len(), 2, "{out}");
    for (tool, schema) in [("bad_input", "inputSchema"), ("bad_output", "outputSchema")] {
        assert!(
            errors
                .iter()
                .any(|l| l.contains("badschema.toml: toolbox badschema: ")
                    && l.contains(&format!("tool {tool:?}: its {schema} does not compile"))),
            "{tool}: {out}"
        );
    }
    assert!(
        !out.contains("\"fine\""),
        "the sound tool is not blamed: {out}"
    );
    // The other toolbox passes.
    assert!(out.contains("ok    math"), "{out}");
}

#[tokio::test]
async fn run_without_a_bus_flag_joins_a_bus_already_on_the_default_address() {
    use std::time::Duration;
    // The OVOS default address must be free for the test's own bus.
    if let Err(e) = std::net::TcpListener::bind("127.0.0.1:8181") {
        panic!(
            "this test needs 127.0.0.1:8181 (the default bus address) free to start a bus \
             there, but it is taken: {e}"
        );
    }
    let (mut bus, port) = start_bus(8181);
    assert_eq!(port, 8181);
    // No mycroft.conf anywhere: the default address applies.
    let config = TempDir::new("no-conf");
    let xdg = config.path().to_str().unwrap().to_owned();
    let system = config.path().join("absent.conf");
    let dir = TempDir::new("default-bus");
    dir.write("math.toml", &math_manifest("math"));
    let daemon = Daemon::start_env(
        &["--manifests", dir.path().to_str().unwrap()],
        &[
            ("XDG_CONFIG_HOME", &xdg),
            ("MYCROFT_SYSTEM_CONFIG", system.to_str().unwrap()),
        ],
    );
    let url = "ws://127.0.0.1:8181/core";
    assert_eq!(daemon.url, url);
    let connected = daemon.log_lines_with("connected to the bus");
    assert_eq!(connected.len(), 1, "{connected:?}");
    assert_eq!(connected[0]["bus"], url);
    assert!(
        daemon.log_lines_with("embedded bus").is_empty(),
        "{:?}",
        daemon.logs.lock().unwrap()
    );
    let mut client = Bus::connect(url).await;
    let r = add(&mut client, 4, 5).await;
    assert_eq!(r["data"]["result"]["result"], 9, "{r}");
    // The bus was ours, not the daemon's: once it is gone, the daemon
    // reconnects and nothing listens on 8181 any more.
    bus.kill().unwrap();
    bus.wait().unwrap();
    daemon.wait_for_log("reconnecting", 1, Duration::from_secs(10));
    assert!(
        tokio_tungstenite::connect_async(url).await.is_err(),
        "something still serves {url}"
    );
}

#[tokio::test]
async fn check_probe_and_run_agree_on_a_child_that_needs_the_legacy_fallback() {
    // A legacy-only server that dies of the modern era probe: both `check
    // --probe` and `run` start it again as legacy MCP, through one launcher.
    let dir = TempDir::new("legacy-fallback");
    dir.write(
        "faulty.toml",
        &format!(
            "id = \"faulty\"\ncommand = \"python3\"\nargs = [\"{}\"]\nenv = {{ FAULT = \"legacy_dies_on_discover\" }}\n",
            common::repo("tests/fixtures/faulty_toolbox.py")
        ),
    );
    let (code, out, err) = toolboxd(&[
        "check",
        "--probe",
        "--manifests",
        dir.path().to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{out}{err}");
    let summary = out
        .lines()
        .find_map(|l| l.split_once("faulty.toml: ").map(|(_, s)| s.to_owned()))
        .unwrap_or_else(|| panic!("{out}"));
    let (era, tools) = summary.split_once(", ").unwrap();
    assert!(era.starts_with("legacy MCP "), "{summary}");
    let count: u64 = tools.split(' ').next().unwrap().parse().unwrap();
    let daemon = Daemon::start(dir.path());
    let row = daemon.status("faulty");
    assert_eq!(
        (row["era"].as_str(), row["tools"].as_u64()),
        (Some(era), Some(count)),
        "{row}"
    );
    let mut bus = Bus::connect(&daemon.url).await;
    assert_eq!(
        bus.call("faulty", "ok", json!({})).await["result"],
        json!({"ok": true})
    );
}
