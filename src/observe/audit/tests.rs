use super::*;
use crate::bus::envelope::Message as BusMessage;
use crate::observe::ending::Ending;
use serde_json::json;

#[test]
fn a_link_at_the_path_is_never_followed() {
    let dir = std::env::temp_dir().join(format!("toolboxd-audit-link-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let target = dir.join("root-owned");
    std::fs::write(&target, "keep").unwrap();
    let link = dir.join("audit.log");
    std::os::unix::fs::symlink(&target, &link).unwrap();
    let err = Audit::open(&link)
        .err()
        .expect("a link is refused")
        .to_string();
    assert!(err.contains("symbolic link"), "{err}");
    assert_eq!(std::fs::read_to_string(&target).unwrap(), "keep");
    std::fs::remove_dir_all(&dir).unwrap();
}

fn request() -> BusMessage {
    BusMessage::decode(
        r#"{"type":"ovos.tools.invoke","data":{},"context":{"session":{"session_id":"s1"}}}"#,
    )
    .expect("a message")
}

fn finished<'a>(
    request: &'a BusMessage,
    answer: &'a Result<Value, String>,
    arguments: Option<&'a Value>,
) -> Finished<'a> {
    Finished {
        toolbox: "math",
        tool: "add",
        outcome: if answer.is_ok() {
            Ending::Ok
        } else {
            Ending::Error
        },
        took: Duration::from_micros(1500),
        topic: &request.msg_type,
        session: request
            .context
            .get("session")
            .and_then(|s| s.get("session_id"))
            .and_then(Value::as_str),
        source: None,
        error: answer.as_ref().err().map(String::as_str),
        arguments,
        result: answer.as_ref().ok(),
    }
}

#[test]
fn a_line_has_every_field_and_arguments_only_when_given() {
    let request = request();
    let ok = Ok(json!({"result": 5}));
    let line: Value = serde_json::from_str(&encode(&finished(&request, &ok, None))).unwrap();
    assert_eq!(line["toolbox"], "math");
    assert_eq!(line["tool"], "add");
    assert_eq!(line["session"], "s1");
    assert_eq!(line["topic"], "ovos.tools.invoke");
    assert_eq!(line["duration_ms"], 1.5);
    assert_eq!(line["outcome"], "ok");
    assert!(line["time"].as_str().unwrap().ends_with('Z'));
    for absent in ["error", "arguments", "result", "truncated"] {
        assert!(line.get(absent).is_none(), "{absent}: {line}");
    }
    let args = json!({"a": 2, "b": 3});
    let line: Value = serde_json::from_str(&encode(&finished(&request, &ok, Some(&args)))).unwrap();
    assert_eq!(
        (&line["arguments"], &line["result"]),
        (&args, &json!({"result": 5}))
    );
    let failed = Err("ValueError: no".to_owned());
    let line: Value =
        serde_json::from_str(&encode(&finished(&request, &failed, Some(&args)))).unwrap();
    assert_eq!(line["error"], "ValueError: no");
    assert!(line.get("result").is_none());
    // Too large: written without arguments and result, and said so.
    let big = json!({"text": "x".repeat(MAX_LINE_BYTES)});
    let line = encode(&finished(&request, &ok, Some(&big)));
    assert!(line.len() < 1024, "{line}");
    let line: Value = serde_json::from_str(&line).unwrap();
    assert_eq!(line["truncated"], true);
    assert!(line.get("arguments").is_none());
}

#[test]
fn refusals_are_written_once_a_second_and_counted_and_the_file_rotates() {
    let dir = std::env::temp_dir().join(format!("toolboxd-audit-bound-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("audit.log");
    // Already just under its bound: the next lines rotate it.
    std::fs::write(&path, "x".repeat(MAX_FILE_BYTES as usize - 10)).unwrap();
    let audit = Audit::open(&path).unwrap();
    let request = request();
    let refused = Err("ValueError: Tool input validation failed".to_owned());
    let mut call = finished(&request, &refused, None);
    call.outcome = Ending::Invalid;
    for _ in 0..1000 {
        assert!(audit.record(&call));
    }
    std::thread::sleep(REFUSAL_EVERY);
    assert!(audit.record(&call));
    let ok = Ok(json!({}));
    assert!(audit.record(&finished(&request, &ok, None)));
    let audit = Arc::new(audit);
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(audit.close());
    let full = std::fs::metadata(rotated(&path)).unwrap().len();
    assert!(full > MAX_FILE_BYTES, "the full file was moved to .1");
    let text = std::fs::read_to_string(&path).unwrap();
    let lines: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    // The second refusal's second: the count of the 999 not written,
    // that refusal, and the call that succeeded.
    assert_eq!(lines.len(), 3, "{text}");
    assert_eq!(lines[0]["repeated"], 999);
    assert_eq!(lines[0]["outcome"], "invalid");
    assert_eq!(lines[1]["outcome"], "invalid");
    assert_eq!(lines[2]["outcome"], "ok");
    // A burst that no later refusal follows: its count at close.
    let audit = Audit::open(&path).unwrap();
    let mut busy = finished(&request, &refused, None);
    busy.outcome = Ending::Busy;
    for _ in 0..5 {
        assert!(audit.record(&busy));
    }
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(Arc::new(audit).close());
    let text = std::fs::read_to_string(&path).unwrap();
    let last: Value = serde_json::from_str(text.lines().last().unwrap()).unwrap();
    assert_eq!(
        (&last["outcome"], &last["repeated"]),
        (&json!("busy"), &json!(4)),
        "{text}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A sink that blocks every write until `gate` is opened, and keeps
/// what it was given.
struct Gated {
    gate: Arc<(Mutex<bool>, std::sync::Condvar)>,
    entered: Arc<AtomicBool>,
    written: Arc<Mutex<Vec<u8>>>,
}

impl Write for Gated {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.entered.store(true, Ordering::SeqCst);
        let (open, changed) = &*self.gate;
        let mut open = open.lock().unwrap();
        while !*open {
            open = changed.wait(open).unwrap();
        }
        self.written.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test]
async fn a_stuck_writer_never_blocks_a_call_it_drops_and_counts_lines() {
    let gate = Arc::new((Mutex::new(false), std::sync::Condvar::new()));
    let written = Arc::new(Mutex::new(Vec::new()));
    let entered = Arc::new(AtomicBool::new(false));
    let sink = Gated {
        gate: gate.clone(),
        entered: entered.clone(),
        written: written.clone(),
    };
    let mut sink = Some(sink);
    let opener: Opener = Box::new(move || {
        sink.take()
            .map(|s| (Box::new(s) as Box<dyn Write + Send>, 0))
            .ok_or_else(|| "opened once only".to_owned())
    });
    let audit = Arc::new(Audit::start(opener, None, 4));
    let request = request();
    let ok = Ok(json!({}));
    // The first line: the writer takes it and gets stuck writing it out.
    assert!(audit.record(&finished(&request, &ok, None)));
    while !entered.load(Ordering::SeqCst) {
        std::thread::sleep(Duration::from_millis(1));
    }
    let started = std::time::Instant::now();
    let accepted = (0..49)
        .filter(|_| audit.record(&finished(&request, &ok, None)))
        .count();
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "recording never waits"
    );
    // The queue holds four; the rest are dropped and counted.
    assert_eq!(accepted, 4);
    assert_eq!(audit.dropped_lines(), 45);
    {
        let (open, changed) = &*gate;
        *open.lock().unwrap() = true;
        changed.notify_all();
    }
    audit.clone().close().await;
    let text = String::from_utf8(written.lock().unwrap().clone()).unwrap();
    assert_eq!(text.lines().count(), 5, "{text}");
}
