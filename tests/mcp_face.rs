//! `toolboxd mcp`, the MCP server face (docs/agents.md, recipes 2 and 3):
//! the official MCP Python SDK's client (tests/requirements.txt) over stdio
//! and streamable HTTP, in the current revision and the previous one; and
//! what a hostile or unlucky client sends, over stdio, answered with
//! JSON-RPC errors while the face serves on.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use common::{math_manifest, repo, text_manifest, Daemon, Reaped, TempDir, BIN};

use serde_json::{json, Value};

fn venv_python() -> std::path::PathBuf {
    let python = common::root().join(".venv/bin/python");
    assert!(python.exists(), "run scripts/test: it makes .venv");
    python
}

/// A daemon serving math (add, sqrt) and the task fixture (flood: progress;
/// forever: until cancelled), and the command that adds a toolbox to it.
struct Served {
    daemon: Daemon,
    dir: TempDir,
}

impl Served {
    fn start() -> Served {
        let dir = TempDir::new("mcp-face");
        dir.write("math.toml", &math_manifest("math"));
        dir.write(
            "tasks.toml",
            &format!(
                "id = \"tasks\"\ncommand = \"python3\"\nargs = [\"{}\"]\n",
                repo("tests/fixtures/task_toolbox.py")
            ),
        );
        let daemon = Daemon::start_audited(dir.path(), &dir.path().join("audit.log"));
        Served { daemon, dir }
    }

    /// The audit log's lines of calls of `tool`.
    fn audited(&self, tool: &str) -> Vec<Value> {
        std::fs::read_to_string(self.dir.path().join("audit.log"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter(|l| l["tool"] == tool)
            .collect()
    }

    /// A shell command that adds toolbox `id` (the text example) and reloads.
    fn reload_cmd(&self, id: &str) -> String {
        let manifest = self
            .dir
            .write(&format!("{id}.toml.new"), &text_manifest(id));
        format!(
            "mv {} {}/{id}.toml && {BIN} ctl --control {} reload",
            manifest.display(),
            self.dir.path().display(),
            self.daemon.control.display()
        )
    }
}

/// One run of an MCP client program (`program` and its first arguments)
/// against `target` in `mode`: the JSON it printed last.
fn client_run(mut program: Command, target: &str, mode: &str, reload_cmd: &str) -> Value {
    let out = common::output_within(
        program
            .args([target, mode])
            .env("TOOLBOXD", BIN)
            .env("RELOAD_CMD", reload_cmd),
        Duration::from_secs(120),
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "the client failed: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_str(stdout.lines().last().unwrap_or("")).unwrap()
}

/// The Python SDK client's run (tests/python/mcp_face_client.py).
fn sdk_client(target: &str, mode: &str, reload_cmd: &str) -> Value {
    let mut program = Command::new(venv_python());
    program.arg(repo("tests/python/mcp_face_client.py"));
    client_run(program, target, mode, reload_cmd)
}

/// What every run of the SDK client must have seen.
fn assert_served(seen: &Value, added: &str) {
    assert_eq!(seen["server"], "toolboxd", "{seen}");
    let tools = seen["tools"].as_array().unwrap();
    for tool in ["add", "sqrt", "flood", "forever"] {
        assert!(tools.contains(&json!(tool)), "{tool} in {seen}");
    }
    assert_eq!(seen["add_schema"]["required"], json!(["a", "b"]), "{seen}");
    assert_eq!(
        seen["add"],
        json!({"structured": {"result": 5}, "is_error": false}),
        "{seen}"
    );
    let progress = seen["flood"]["progress"].as_array().unwrap();
    assert!(!progress.is_empty(), "progress reached the client: {seen}");
    assert_eq!(seen["flood"]["is_error"], false, "{seen}");
    assert_eq!(seen["tool_error"]["is_error"], true, "{seen}");
    assert!(
        seen["tool_error"]["text"][0]
            .as_str()
            .unwrap()
            .contains("Error"),
        "{seen}"
    );
    assert!(
        seen["unknown"]
            .as_str()
            .unwrap()
            .contains("Unknown tool: 'no_such_tool'"),
        "{seen}"
    );
    assert_eq!(seen["cancelled"], true, "{seen}");
    assert_eq!(seen["after_cancel"], json!({"result": 2}), "{seen}");
    if !seen["list_changed"].is_null() {
        assert_eq!(seen["list_changed"], true, "{seen}");
    }
    // The added toolbox's tool is listed; once two added toolboxes own
    // `shout`, each under its toolbox's name.
    let after = seen["tools_after"].as_array().unwrap();
    assert!(
        added.is_empty()
            || after.contains(&json!("shout"))
            || after.contains(&json!(format!("{added}__shout"))),
        "the added toolbox's tool is listed: {seen}"
    );
}

#[test]
fn the_python_sdk_client_is_served_over_stdio_in_both_revisions() {
    let served = Served::start();
    let target = format!("stdio:{}", served.daemon.url);
    let seen = sdk_client(&target, "auto", &served.reload_cmd("added_one"));
    assert_eq!(seen["protocol"], "2026-07-28", "{seen}");
    assert_eq!(seen["list_changed"], true, "{seen}");
    assert_served(&seen, "added_one");
    let seen = sdk_client(&target, "legacy", &served.reload_cmd("added_two"));
    assert_eq!(seen["protocol"], "2025-11-25", "{seen}");
    assert_eq!(seen["list_changed"], true, "{seen}");
    assert_served(&seen, "added_two");
    // Every call went through the daemon's pipeline, the face recorded.
    let mut adds = Vec::new();
    common::wait_until("the calls are audited", Duration::from_secs(10), || {
        adds = served.audited("add");
        adds.len() >= 4
    });
    for line in &adds {
        assert_eq!(line["source"], "toolboxd-mcp", "{line}");
        assert_eq!(line["toolbox"], "math", "{line}");
    }
    let cancelled = served.audited("forever");
    assert!(
        cancelled.iter().any(|l| l["outcome"] == "cancelled"),
        "the cancelled call reached the child and was cancelled there: {cancelled:?}"
    );
}

/// The TypeScript SDK client's run (tests/node/mcp_face_client.mjs).
fn node_client(target: &str, mode: &str, reload_cmd: &str) -> Value {
    let mut program = Command::new("node");
    program
        .arg(repo("tests/node/mcp_face_client.mjs"))
        .current_dir(repo("tests/node"));
    client_run(program, target, mode, reload_cmd)
}

/// What the TypeScript client must have seen.
fn assert_served_to_node(seen: &Value) {
    assert_eq!(seen["server"], "toolboxd", "{seen}");
    assert!(
        seen["tools"].as_array().unwrap().contains(&json!("add")),
        "{seen}"
    );
    assert_eq!(
        seen["add"],
        json!({"structured": {"result": 5}, "is_error": false}),
        "{seen}"
    );
    assert!(
        !seen["flood"]["progress"].as_array().unwrap().is_empty(),
        "{seen}"
    );
    assert_eq!(seen["tool_error"]["is_error"], true, "{seen}");
    assert_eq!(seen["cancelled"], true, "{seen}");
    assert_eq!(seen["after_cancel"], json!({"result": 2}), "{seen}");
}

#[test]
fn the_typescript_sdk_client_is_served_over_stdio_and_streamable_http() {
    let served = Served::start();
    let stdio = format!("stdio:{}", served.daemon.url);
    let seen = node_client(&stdio, "auto", &served.reload_cmd("node_one"));
    assert_eq!(seen["protocol"], "2026-07-28", "{seen}");
    assert_eq!(seen["list_changed"], true, "{seen}");
    assert_served_to_node(&seen);
    let seen = node_client(&stdio, "legacy", "true");
    assert_eq!(seen["protocol"], "2025-11-25", "{seen}");
    assert_served_to_node(&seen);
    let (_face, url) = http_face(&served.daemon.url, &[], &[]);
    let seen = node_client(&url, "auto", &served.reload_cmd("node_two"));
    assert_eq!(seen["protocol"], "2026-07-28", "{seen}");
    assert_served_to_node(&seen);
}

#[test]
fn the_mcp_inspector_cli_lists_and_calls_a_tool() {
    let served = Served::start();
    let home = TempDir::new("inspector-home");
    let inspector = |args: &[&str]| {
        let out = common::output_within(
            Command::new(repo("tests/node/node_modules/.bin/mcp-inspector"))
                .args(["--cli", BIN, "mcp", "--bus", &served.daemon.url])
                .args(args)
                .env("HOME", home.path()),
            Duration::from_secs(60),
        );
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "the inspector failed: {stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_str::<Value>(&stdout).unwrap()
    };
    let listed = inspector(&["--method", "tools/list"]);
    let names: Vec<&str> = listed["tools"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|t| t["name"].as_str())
        .collect();
    assert!(
        names.contains(&"add") && names.contains(&"sqrt"),
        "{listed}"
    );
    let called = inspector(&[
        "--method",
        "tools/call",
        "--tool-name",
        "add",
        "--tool-arg",
        "a=2",
        "b=3",
    ]);
    assert_eq!(
        called["structuredContent"],
        json!({"result": 5}),
        "{called}"
    );
    assert_eq!(called["isError"], false, "{called}");
}

/// `toolboxd mcp --http 127.0.0.1:0`: the address it serves at.
fn http_face(bus: &str, extra: &[&str], env: &[(&str, &str)]) -> (Reaped, String) {
    let mut command = Command::new(BIN);
    command
        .args([
            "--log-format",
            "json",
            "mcp",
            "--bus",
            bus,
            "--http",
            "127.0.0.1:0",
        ])
        .args(extra)
        .env_remove("TOOLBOXD_MCP_TOKEN")
        .stdin(Stdio::null())
        .stderr(Stdio::piped());
    for (key, value) in env {
        command.env(key, value);
    }
    let mut child = command.spawn().unwrap();
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = mpsc::channel::<String>();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let reaped = Reaped(child);
    loop {
        let line = rx
            .recv_timeout(Duration::from_secs(20))
            .expect("toolboxd mcp --http says where it serves");
        let Ok(v) = serde_json::from_str::<Value>(&line) else {
            continue;
        };
        if let Some(addr) = v["addr"].as_str() {
            std::thread::spawn(move || while rx.recv().is_ok() {});
            return (reaped, format!("http://{addr}/mcp"));
        }
    }
}

#[test]
fn the_python_sdk_client_is_served_over_streamable_http_in_both_revisions() {
    let served = Served::start();
    let (_face, url) = http_face(&served.daemon.url, &[], &[]);
    let seen = sdk_client(&url, "auto", &served.reload_cmd("added_three"));
    assert_eq!(seen["protocol"], "2026-07-28", "{seen}");
    assert_eq!(seen["list_changed"], true, "{seen}");
    assert_served(&seen, "added_three");
    let seen = sdk_client(&url, "legacy", "true");
    assert_eq!(seen["protocol"], "2025-11-25", "{seen}");
    assert_served(&seen, "");
}

/// One raw HTTP/1.1 request to `url`'s host: (status, body).
fn http(url: &str, method: &str, headers: &[(&str, &str)], body: &str) -> (u16, String) {
    let rest = url.strip_prefix("http://").unwrap();
    let (host, path) = rest.split_once('/').unwrap();
    let mut stream = std::net::TcpStream::connect(host).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut request = format!(
        "{method} /{path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n\
         Accept: application/json, text/event-stream\r\nContent-Length: {}\r\nConnection: close\r\n",
        body.len()
    );
    for (key, value) in headers {
        request.push_str(&format!("{key}: {value}\r\n"));
    }
    request.push_str("\r\n");
    request.push_str(body);
    stream.write_all(request.as_bytes()).unwrap();
    let mut answer = String::new();
    let _ = std::io::Read::read_to_string(&mut stream, &mut answer);
    let status = answer
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let body = answer.split_once("\r\n\r\n").map(|(_, b)| b).unwrap_or("");
    (status, body.to_owned())
}

#[test]
fn the_http_face_refuses_foreign_origins_and_wants_its_token() {
    let served = Served::start();
    let list = r#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#;
    let (_face, url) = http_face(&served.daemon.url, &[], &[]);
    let (status, body) = http(&url, "POST", &[], list);
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("\"add\""), "{body}");
    let (status, body) = http(&url, "POST", &[("Origin", "http://evil.example")], list);
    assert_eq!(status, 403, "{body}");
    let (status, _) = http(&url, "POST", &[("Origin", "http://localhost:6274")], list);
    assert_eq!(status, 200);
    let (status, _) = http(&url, "GET", &[], "");
    assert_eq!(status, 405);

    let (_face, url) = http_face(&served.daemon.url, &[], &[("TOOLBOXD_MCP_TOKEN", "s3cret")]);
    let (status, _) = http(&url, "POST", &[], list);
    assert_eq!(status, 401);
    let (status, _) = http(&url, "POST", &[("Authorization", "Bearer wrong")], list);
    assert_eq!(status, 401);
    let (status, body) = http(&url, "POST", &[("Authorization", "Bearer s3cret")], list);
    assert_eq!(status, 200, "{body}");
    let (status, _) = http(&url, "POST", &[("Authorization", "bearer s3cret")], list);
    assert_eq!(status, 200, "the scheme is case-insensitive");
    // A body that never comes does not hold the connection.
    let rest = url.strip_prefix("http://").unwrap();
    let (host, _) = rest.split_once('/').unwrap();
    let mut stalled = std::net::TcpStream::connect(host).unwrap();
    stalled
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    stalled
        .write_all(
            format!(
                "POST /mcp HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer s3cret\r\n\
                 Content-Length: 100\r\n\r\n"
            )
            .as_bytes(),
        )
        .unwrap();
    let mut answer = String::new();
    let _ = std::io::Read::read_to_string(&mut stalled, &mut answer);
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");

    // Off loopback, no token: it does not start, and says why.
    let out = common::output_within(
        Command::new(BIN)
            .args(["mcp", "--bus", &served.daemon.url, "--http", "0.0.0.0:0"])
            .env_remove("TOOLBOXD_MCP_TOKEN"),
        Duration::from_secs(20),
    );
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("TOOLBOXD_MCP_TOKEN"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `toolboxd mcp` over stdio, driven line by line.
struct StdioFace {
    process: Reaped,
    stdin: std::process::ChildStdin,
    lines: mpsc::Receiver<String>,
}

impl StdioFace {
    fn start(bus: &str) -> StdioFace {
        let mut child = Command::new(BIN)
            .args(["mcp", "--bus", bus])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let stdin = child.stdin.take().unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        StdioFace {
            process: Reaped(child),
            stdin,
            lines,
        }
    }

    fn send(&mut self, line: &str) {
        self.stdin.write_all(line.as_bytes()).unwrap();
        self.stdin.write_all(b"\n").unwrap();
        self.stdin.flush().unwrap();
    }

    /// The next message that is not a notification.
    fn answer(&mut self) -> Value {
        loop {
            let line = self
                .lines
                .recv_timeout(Duration::from_secs(20))
                .expect("an answer within 20 s");
            let message: Value = serde_json::from_str(&line).unwrap();
            if message.get("method").is_none() {
                return message;
            }
        }
    }

    /// The next message, a notification or not.
    fn ask_first(&mut self, line: &str) -> Value {
        self.send(line);
        let line = self
            .lines
            .recv_timeout(Duration::from_secs(20))
            .expect("a message within 20 s");
        serde_json::from_str(&line).unwrap()
    }

    fn ask(&mut self, line: &str) -> Value {
        self.send(line);
        self.answer()
    }
}

#[test]
fn a_client_that_goes_away_leaves_no_face_behind() {
    let served = Served::start();
    let mut face = StdioFace::start(&served.daemon.url);
    let listening = face.ask_first(
        r#"{"jsonrpc":"2.0","id":1,"method":"subscriptions/listen","params":{"notifications":{"toolsListChanged":true},"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28"}}}"#,
    );
    assert_eq!(
        listening["method"],
        "notifications/subscriptions/acknowledged"
    );
    face.send(r#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"forever","arguments":{}}}"#);
    drop(face.stdin);
    let mut process = face.process;
    let exited = (0..200).find_map(|_| {
        std::thread::sleep(Duration::from_millis(50));
        process.0.try_wait().unwrap()
    });
    assert!(
        exited.is_some(),
        "toolboxd mcp still runs after its client left"
    );
}

#[test]
fn garbage_oversize_unknown_and_a_bus_that_is_down_get_clear_errors_and_the_face_serves_on() {
    let served = Served::start();
    let mut face = StdioFace::start(&served.daemon.url);
    let error = face.ask("this is not json");
    assert_eq!(error["error"]["code"], -32700, "{error}");
    assert_eq!(error["id"], Value::Null);
    let error = face.ask("[1, 2]");
    assert_eq!(error["error"]["code"], -32600, "{error}");
    let error = face.ask(&format!(
        r#"{{"jsonrpc":"2.0","id":9,"method":"tools/call","params":{{"name":"add","arguments":{{"pad":"{}"}}}}}}"#,
        "x".repeat(5 << 20)
    ));
    assert_eq!(error["error"]["code"], -32600, "{error}");
    assert!(error["error"]["message"]
        .as_str()
        .unwrap()
        .contains("longer than"));
    let error = face.ask(r#"{"jsonrpc":"2.0","id":2,"method":"resources/list"}"#);
    assert_eq!(
        (error["id"].clone(), error["error"]["code"].clone()),
        (json!(2), json!(-32601))
    );
    let error = face.ask(
        r#"{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"nope","arguments":{}}}"#,
    );
    assert_eq!(error["error"]["code"], -32602, "{error}");
    let error = face.ask(
        r#"{"jsonrpc":"2.0","id":4,"method":"tools/list","params":{"_meta":{"io.modelcontextprotocol/protocolVersion":"1999-01-01"}}}"#,
    );
    assert_eq!(error["error"]["code"], -32022, "{error}");
    assert!(error["error"]["data"]["supported"]
        .as_array()
        .unwrap()
        .contains(&json!("2026-07-28")));
    // Arguments the tool's schema refuses: the daemon's words, as a tool error.
    let refused = face.ask(
        r#"{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"add","arguments":{"a":"two","b":1}}}"#,
    );
    assert_eq!(refused["result"]["isError"], true, "{refused}");
    assert!(refused["result"]["content"][0]["text"]
        .as_str()
        .unwrap()
        .starts_with("ValueError: Tool input validation failed for 'add' in ToolBox 'math'"));
    // And it serves on.
    let ok = face.ask(
        r#"{"jsonrpc":"2.0","id":6,"method":"tools/call","params":{"name":"add","arguments":{"a":20,"b":22}}}"#,
    );
    assert_eq!(
        ok["result"]["structuredContent"],
        json!({"result": 42}),
        "{ok}"
    );

    // Two requests in flight under one id: the second is refused.
    face.send(r#"{"jsonrpc":"2.0","id":"dup","method":"tools/call","params":{"name":"forever","arguments":{}}}"#);
    let dup = face.ask(r#"{"jsonrpc":"2.0","id":"dup","method":"tools/call","params":{"name":"add","arguments":{"a":1,"b":1}}}"#);
    assert_eq!(dup["error"]["code"], -32600, "{dup}");
    assert!(dup["error"]["message"]
        .as_str()
        .unwrap()
        .contains("in flight already"));
    face.send(
        r#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":"dup"}}"#,
    );

    // The bus goes away (with the daemon that embeds it, killed: a SIGTERM
    // would first drain and stop the toolboxes, and a listing read in the
    // drain truthfully names none): a call is a clear tool error, at once,
    // and the listing the last one known.
    let mut served = served;
    served.daemon.child.kill().unwrap();
    served.daemon.wait_exit(Duration::from_secs(10));
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let call = loop {
        let call = face.ask(
            r#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"add","arguments":{"a":1,"b":1}}}"#,
        );
        if call["result"]["isError"] == true || std::time::Instant::now() > deadline {
            break call;
        }
    };
    let text = call["result"]["content"][0]["text"].as_str().unwrap_or("");
    assert!(
        text.contains("not connected to the bus") && text.contains("The call was not sent"),
        "{call}"
    );
    let listed = face.ask(r#"{"jsonrpc":"2.0","id":8,"method":"tools/list"}"#);
    assert!(
        listed["result"]["tools"].as_array().unwrap().len() >= 4,
        "{listed}"
    );
}
