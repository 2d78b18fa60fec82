//! `toolboxd run --metrics ADDR`: the Prometheus endpoint, scraped over HTTP
//! after a known mix of calls on real children over the real bus.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use serde_json::{json, Value};

use common::{math_manifest, repo, wait_until, Bus, Daemon, TempDir, ANSWER_DEADLINE};

/// Manifest text for the fault fixture under `id`, with extra lines.
fn faulty(id: &str, extra: &str) -> String {
    format!(
        "id = \"{id}\"\ncommand = \"python3\"\nargs = [\"{}\"]\n{extra}\n",
        repo("tests/fixtures/faulty_toolbox.py")
    )
}

/// A daemon serving metrics on a port of its choice, and that address.
fn start(dir: &TempDir) -> (Daemon, SocketAddr) {
    start_with(dir, &[])
}

/// [`start`] with `more` arguments for `toolboxd run`.
fn start_with(dir: &TempDir, more: &[&str]) -> (Daemon, SocketAddr) {
    let mut args = vec![
        "--manifests",
        dir.path().to_str().unwrap(),
        "--embedded-bus",
        "127.0.0.1:0",
        "--metrics",
        "127.0.0.1:0",
    ];
    args.extend_from_slice(more);
    let daemon = Daemon::start_env(&args, &[]);
    let line = daemon.log_lines_with("metrics listening");
    let addr = line[0]["addr"]
        .as_str()
        .expect("the address")
        .parse()
        .unwrap();
    (daemon, addr)
}

/// One HTTP/1.1 exchange: (status line, headers and body).
fn http(addr: SocketAddr, request: &str) -> (String, String) {
    let mut stream = TcpStream::connect(addr).expect("connect to the metrics endpoint");
    stream.set_read_timeout(Some(ANSWER_DEADLINE)).unwrap();
    stream.write_all(request.as_bytes()).unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).expect("an answer");
    let (status, rest) = answer.split_once("\r\n").unwrap_or((&answer, ""));
    (status.to_owned(), rest.to_owned())
}

/// `GET /metrics`: the body.
fn scrape(addr: SocketAddr) -> String {
    let (status, rest) = http(
        addr,
        "GET /metrics HTTP/1.1\r\nHost: toolboxd\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(status, "HTTP/1.1 200 OK", "{rest}");
    assert!(
        rest.to_ascii_lowercase()
            .contains("content-type: text/plain; version=0.0.4"),
        "{rest}"
    );
    rest.split_once("\r\n\r\n").expect("a body").1.to_owned()
}

/// The value of the sample `series` (name and labels, exactly as written).
fn value(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|v| v.parse().ok())
}

/// `toolboxd_calls_total` of (toolbox, tool, outcome).
fn calls(text: &str, toolbox: &str, tool: &str, outcome: &str) -> f64 {
    let series = format!(
        "toolboxd_calls_total{{toolbox=\"{toolbox}\",tool=\"{tool}\",outcome=\"{outcome}\"}}"
    );
    value(text, &series).unwrap_or(0.0)
}

#[tokio::test]
async fn metrics_count_a_known_mix_of_calls() {
    let dir = TempDir::new("metrics");
    dir.write("f.toml", &faulty("f", ""));
    // One slot, no queue, a 1 s deadline for `hang`: a timeout, and a busy.
    dir.write(
        "slow.toml",
        &faulty(
            "slow",
            "[limits]\nmax_concurrent_calls = 1\nmax_queued_calls = 0\ndrain_timeout_s = 0\n\
             [limits.tool_timeouts]\nhang = 1\n",
        ),
    );
    dir.write("math.toml", &math_manifest("math"));
    let (daemon, addr) = start(&dir);
    let mut bus = Bus::connect(&daemon.url).await;

    let before = scrape(addr);
    assert_eq!(
        value(&before, "toolboxd_bus_connected"),
        Some(1.0),
        "{before}"
    );
    assert_eq!(
        value(
            &before,
            "toolboxd_toolbox_state{toolbox=\"f\",state=\"ready\"}"
        ),
        Some(1.0)
    );
    assert_eq!(
        value(
            &before,
            "toolboxd_toolbox_state{toolbox=\"f\",state=\"failed\"}"
        ),
        Some(0.0)
    );
    assert!(value(&before, "process_resident_memory_bytes").unwrap() > 1e6);
    assert!(value(&before, "process_open_fds").unwrap() >= 3.0);
    assert_eq!(
        value(&before, "toolboxd_audit_dropped_lines_total"),
        Some(0.0)
    );
    assert!(
        !before.contains("toolboxd_calls_total{"),
        "no call yet: {before}"
    );

    for _ in 0..3 {
        assert_eq!(bus.call("f", "ok", json!({})).await["result"]["ok"], true);
    }
    let invalid = bus.call("f", "crash", json!({"code": "x"})).await;
    assert!(
        invalid["error"].as_str().unwrap().starts_with("ValueError"),
        "{invalid}"
    );
    let crash = bus.call("f", "crash", json!({})).await;
    assert!(
        crash["error"].as_str().unwrap().contains("exited"),
        "{crash}"
    );
    let error = bus.call("math", "sqrt", json!({"number": -1})).await;
    assert!(error["error"].is_string(), "{error}");
    // Names the catalog does not know make no series.
    let unknown = bus.call("f", "no_such_tool", json!({})).await;
    assert!(unknown["error"].as_str().unwrap().contains("Unknown tool"));
    let r = bus
        .request("ovos.tools.invoke", json!({"name": "nor_this", "args": {}}))
        .await;
    assert!(r["data"]["error"].is_string());

    // `hang` takes the one slot; seen in flight, a second call is busy.
    bus.send(
        "ovos.persona.tools.call",
        json!({"toolbox_id": "slow", "name": "hang", "kwargs": {}}),
        json!({"mark": "hang"}),
    )
    .await;
    wait_until("hang in flight", ANSWER_DEADLINE, || {
        value(&scrape(addr), "toolboxd_calls_in_flight{toolbox=\"slow\"}") == Some(1.0)
    });
    let busy = bus.call("slow", "ok", json!({})).await;
    assert!(busy["error"].as_str().unwrap().contains("busy"), "{busy}");
    let timeout = bus
        .wait_for(ANSWER_DEADLINE, |m| {
            m["type"] == "ovos.persona.tools.call.response" && m["context"]["mark"] == "hang"
        })
        .await
        .expect("the hang call's answer");
    assert!(
        timeout["data"]["error"]
            .as_str()
            .unwrap()
            .starts_with("TimeoutError"),
        "{timeout}"
    );
    // An operator reading the log at INFO sees both.
    daemon.wait_for_log(
        "call busy: RuntimeError: toolbox 'slow' is busy",
        1,
        ANSWER_DEADLINE,
    );
    daemon.wait_for_log(
        "call timeout: TimeoutError: tool 'hang'",
        1,
        ANSWER_DEADLINE,
    );
    // The crashed child was replaced.
    wait_until("the crash counted as a restart", ANSWER_DEADLINE, || {
        let text = scrape(addr);
        value(
            &text,
            "toolboxd_restarts_total{toolbox=\"f\",reason=\"exited\"}",
        ) == Some(1.0)
            && value(
                &text,
                "toolboxd_toolbox_state{toolbox=\"f\",state=\"ready\"}",
            ) == Some(1.0)
    });

    let text = scrape(addr);
    let expected = [
        ("f", "ok", "ok", 3.0),
        ("f", "crash", "invalid", 1.0),
        ("f", "crash", "crash", 1.0),
        ("f", "crash", "ok", 0.0),
        ("math", "sqrt", "error", 1.0),
        ("slow", "hang", "timeout", 1.0),
        ("slow", "ok", "busy", 1.0),
        // Ended before a child had them, under no made-up name: the unknown
        // tool of `f`, and the invoke of a name nobody lists.
        ("f", "", "error", 1.0),
        ("", "", "error", 1.0),
    ];
    for (toolbox, tool, outcome, count) in expected {
        assert_eq!(
            calls(&text, toolbox, tool, outcome),
            count,
            "{toolbox}/{tool}/{outcome}:\n{text}"
        );
    }
    let total: f64 = text
        .lines()
        .filter(|l| l.starts_with("toolboxd_calls_total{"))
        .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
        .sum();
    assert_eq!(total, 10.0, "every call counted once:\n{text}");
    assert!(
        !text.contains("no_such_tool") && !text.contains("nor_this"),
        "{text}"
    );
    let histogram = |toolbox: &str, tool: &str, suffix: &str| {
        let series = format!(
            "toolboxd_call_duration_seconds_{suffix}{{toolbox=\"{toolbox}\",tool=\"{tool}\"}}"
        );
        value(&text, &series)
    };
    assert_eq!(histogram("f", "ok", "count"), Some(3.0));
    assert_eq!(histogram("f", "crash", "count"), Some(2.0));
    assert_eq!(histogram("slow", "hang", "count"), Some(1.0));
    let bucket = |le: &str| {
        value(
            &text,
            &format!(
                "toolboxd_call_duration_seconds_bucket{{toolbox=\"slow\",tool=\"hang\",le=\"{le}\"}}"
            ),
        )
    };
    // The timeout took its 1 s deadline: above the 0.5 s bucket, within 2.5 s.
    assert_eq!(
        (bucket("0.5"), bucket("2.5")),
        (Some(0.0), Some(1.0)),
        "{text}"
    );
    assert!(histogram("slow", "hang", "sum").unwrap() >= 1.0);
    assert_eq!(
        value(&text, "toolboxd_calls_in_flight{toolbox=\"slow\"}"),
        Some(0.0)
    );
    assert_eq!(
        value(
            &text,
            "toolboxd_restarts_total{toolbox=\"math\",reason=\"exited\"}"
        ),
        Some(0.0)
    );

    // An operator's restart is counted as such.
    assert_eq!(daemon.ctl(&["restart", "math"]).0, 0);
    let text = scrape(addr);
    assert_eq!(
        value(
            &text,
            "toolboxd_restarts_total{toolbox=\"math\",reason=\"operator\"}"
        ),
        Some(1.0)
    );
}

#[test]
fn the_endpoint_answers_only_get_metrics_and_bounds_its_connections() {
    let dir = TempDir::new("metrics-http");
    dir.write("math.toml", &math_manifest("math"));
    let (_daemon, addr) = start(&dir);
    let (status, _) = http(
        addr,
        "GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(status, "HTTP/1.1 404 Not Found");
    let (status, _) = http(
        addr,
        "POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(status, "HTTP/1.1 405 Method Not Allowed");
    let (status, _) = http(addr, "NOT HTTP AT ALL\r\n\r\n");
    assert!(
        status.is_empty() || status.starts_with("HTTP/1.1 400"),
        "{status}"
    );

    // Eight connections that each asked and were answered (keep-alive
    // scrapers) hold every slot: a ninth is closed unserved.
    let ask = |s: &mut TcpStream| {
        s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            .unwrap();
        s.set_read_timeout(Some(ANSWER_DEADLINE)).unwrap();
        let mut buf = [0u8; 64];
        let n = s.read(&mut buf).unwrap();
        assert!(buf[..n].starts_with(b"HTTP/1.1 200"), "{:?}", &buf[..n]);
    };
    let mut held: Vec<TcpStream> = (0..8)
        .map(|_| TcpStream::connect(addr).expect("connect"))
        .collect();
    for s in &mut held {
        ask(s);
    }
    let mut ninth = TcpStream::connect(addr).expect("connect");
    ninth.set_read_timeout(Some(ANSWER_DEADLINE)).unwrap();
    ninth
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        .ok();
    let mut rest = Vec::new();
    let read = ninth.read_to_end(&mut rest);
    assert!(
        read.is_err() || rest.is_empty(),
        "the ninth was served: {:?}",
        String::from_utf8_lossy(&rest)
    );
    drop(held);
    // Silent connections (slow clients) in every slot: a scraper still gets
    // one, taken from the oldest of them, which is closed.
    let mut slow: Vec<TcpStream> = Vec::new();
    wait_until("eight silent connections held", ANSWER_DEADLINE, || {
        slow.push(TcpStream::connect(addr).unwrap());
        slow.len() >= 8
    });
    // At once: well before their 5 s header deadline could free a slot.
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    let _ = s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    let mut answer = String::new();
    let _ = s.read_to_string(&mut answer);
    assert!(answer.starts_with("HTTP/1.1 200"), "not served: {answer:?}");
    let oldest = &mut slow[0];
    oldest.set_read_timeout(Some(ANSWER_DEADLINE)).unwrap();
    let mut buf = [0u8; 16];
    assert!(
        matches!(oldest.read(&mut buf), Ok(0) | Err(_)),
        "the oldest silent connection was not closed"
    );
}

#[tokio::test]
async fn relayed_progress_and_stop_cancelled_calls_are_counted() {
    let dir = TempDir::new("metrics-progress");
    dir.write(
        "flood.toml",
        &format!(
            "id = \"flood\"\ncommand = \"python3\"\nargs = [\"{}\"]\n",
            repo("tests/fixtures/task_toolbox.py")
        ),
    );
    // Drained for at most a second at the end: its call never ends.
    dir.write(
        "slow.toml",
        &faulty("slow", "[limits]\ndrain_timeout_s = 1"),
    );
    let (daemon, addr) = start(&dir);
    let mut bus = Bus::connect(&daemon.url).await;
    let m = common::mark();
    let r = bus
        .call_routed(&m, "flood", "flood", json!({"count": 50, "over_s": 0.6}))
        .await;
    assert_eq!(r["result"]["content"], "sent 50");
    let relayed = bus.progress_of(&m).len();
    assert!(relayed > 0);
    // A call cancelled by the global stop.
    let hung = common::mark();
    bus.send(
        "ovos.persona.tools.call",
        json!({"toolbox_id": "slow", "name": "hang", "kwargs": {}}),
        json!({"mark": hung, "session": {"session_id": "s-stop"}}),
    )
    .await;
    wait_until("the call is on the child", ANSWER_DEADLINE, || {
        daemon.status("slow")["in_flight"] == 1
    });
    bus.send(
        "mycroft.stop",
        json!({}),
        json!({"session": {"session_id": "s-stop"}}),
    )
    .await;
    let answers = bus
        .expect_answers("ovos.persona.tools.call.response", &hung, 1)
        .await;
    assert_eq!(
        answers[0]["data"]["error"],
        "CancelledError: call cancelled by stop"
    );

    let text = scrape(addr);
    let series = "toolboxd_progress_messages_total{toolbox=\"flood\",tool=\"flood\"}";
    assert_eq!(value(&text, series), Some(relayed as f64), "{text}");
    assert_eq!(calls(&text, "slow", "hang", "cancelled"), 1.0, "{text}");
}

#[tokio::test]
async fn calls_that_end_before_they_run_are_counted_and_audited_and_an_oversize_request_is_no_crash(
) {
    // Calls that ended before they reached a child (refused at the door, a
    // failed toolbox, an unknown tool) reached neither the metrics nor the
    // audit log, and a request over the child's max_message_bytes counted
    // as the toolbox's crash.
    let dir = TempDir::new("metrics-unrun");
    dir.write(
        "slow.toml",
        &common::fixture_manifest("slow", "[limits]\nmax_argument_bytes = 8388608"),
    );
    dir.write(
        "small.toml",
        &common::fixture_manifest("small", "[limits]\nmax_message_bytes = 16384"),
    );
    dir.write(
        "broken.toml",
        &faulty(
            "broken",
            "env = { FAULT = \"exit_at_start\" }\n\
             [restart]\nbackoff_initial_ms = 50\nbackoff_max_ms = 100\nmax_restarts = 1\n",
        ),
    );
    let audit = TempDir::writable("metrics-unrun-audit");
    let log = audit.path().join("audit.log");
    let (daemon, addr) = start_with(&dir, &["--audit-log", log.to_str().unwrap()]);
    daemon.wait_for_state("broken", "failed", Duration::from_secs(20));
    let mut bus = Bus::connect(&daemon.url).await;

    // An oversize request: the caller's error, the child never sent it.
    let answer = bus
        .call(
            "small",
            "slow_whoami",
            json!({"seconds": 0, "pad": "x".repeat(20_000)}),
        )
        .await;
    let error = answer["error"].as_str().unwrap_or_default();
    assert!(
        error.starts_with("ValueError: the call of 'slow_whoami' in toolbox 'small'")
            && error.contains("max_message_bytes = 16384"),
        "{answer}"
    );
    // A failed toolbox, an unknown tool, a made-up toolbox.
    let failed = bus.call("broken", "anything", json!({})).await;
    assert!(
        failed["error"].as_str().unwrap().contains("is failed"),
        "{failed}"
    );
    let unknown = bus.call("slow", "no_such_tool", json!({})).await;
    assert!(unknown["error"].as_str().is_some(), "{unknown}");
    // Refused at the door: one peer's calls with 1.5 MiB of arguments
    // (counted 16 times) pass its share of the room at the second.
    let big = "x".repeat(3 << 19);
    let mut marks = Vec::new();
    for _ in 0..2 {
        let m = common::mark();
        bus.send(
            "ovos.persona.tools.call",
            json!({"toolbox_id": "slow", "name": "slow_whoami", "kwargs": {"seconds": 2.0, "big": big}}),
            json!({"mark": m}),
        )
        .await;
        marks.push(m);
    }
    let refused = bus.persona_answer(&marks[1], Duration::from_secs(10)).await;
    assert!(
        refused["error"]
            .as_str()
            .unwrap()
            .contains("busy for this client"),
        "{refused}"
    );
    bus.persona_answer(&marks[0], Duration::from_secs(20)).await;

    let text = scrape(addr);
    assert_eq!(
        calls(&text, "small", "slow_whoami", "invalid"),
        1.0,
        "{text}"
    );
    assert_eq!(calls(&text, "small", "slow_whoami", "crash"), 0.0, "{text}");
    assert_eq!(calls(&text, "slow", "slow_whoami", "busy"), 1.0, "{text}");
    assert_eq!(calls(&text, "broken", "", "error"), 1.0, "{text}");
    assert_eq!(calls(&text, "slow", "", "error"), 1.0, "{text}");
    for made_up in ["no_such_tool", "anything"] {
        assert!(!text.contains(made_up), "{made_up} became a label: {text}");
    }
    // The audit log has each ending with its outcome.
    wait_until(
        "the audit lines are written",
        Duration::from_secs(10),
        || std::fs::read_to_string(&log).is_ok_and(|t| t.lines().count() >= 5),
    );
    let lines: Vec<Value> = std::fs::read_to_string(&log)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let outcomes: Vec<(String, String)> = lines
        .iter()
        .map(|l| {
            (
                l["toolbox"].as_str().unwrap_or_default().to_owned(),
                l["outcome"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect();
    for expected in [
        ("small", "invalid"),
        ("broken", "error"),
        ("slow", "busy"),
        ("slow", "ok"),
    ] {
        assert!(
            outcomes.contains(&(expected.0.to_owned(), expected.1.to_owned())),
            "{expected:?} not in {outcomes:?}"
        );
    }
}
