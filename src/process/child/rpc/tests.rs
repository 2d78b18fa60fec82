//! The JSON-RPC link over in-memory pipes: a test plays the child.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, DuplexStream, Lines};
use tokio::sync::{mpsc, watch};

use super::{Kept, RpcFailure, RpcHandle};
use crate::cancel::Cancel;
use crate::process::child::{ChildEvent, ExitInfo};

/// How long a test waits for something that should happen at once.
const SOON: Duration = Duration::from_secs(5);

/// The far end of a link: what a child would see and do.
struct FakeChild {
    /// Requests to the child, as the child would send them.
    rpc: RpcHandle,
    /// The child's stdin, line by line.
    stdin: Lines<BufReader<DuplexStream>>,
    /// The child's stdout.
    stdout: DuplexStream,
    /// What the link reported to the child's owner.
    events: mpsc::UnboundedReceiver<ChildEvent>,
    /// Kept so the reader does not take the exit as "never".
    _exit: watch::Sender<Option<ExitInfo>>,
    /// How many times the link called its kill hook.
    kills: Arc<AtomicUsize>,
}

/// A link whose stdin budget and stdout line limit are both `max` bytes, and
/// whose child's stdin pipe holds `pipe` bytes.
fn start(max: usize, pipe: usize) -> FakeChild {
    let kills = Arc::new(AtomicUsize::new(0));
    let counted = kills.clone();
    let kill = Box::new(move || {
        counted.fetch_add(1, Ordering::SeqCst);
    });
    let piped = super::over_pipes("test", max, pipe, kill);
    FakeChild {
        rpc: piped.rpc,
        stdin: BufReader::new(piped.child_stdin).lines(),
        stdout: piped.child_stdout,
        events: piped.events,
        _exit: piped.exit,
        kills,
    }
}

impl FakeChild {
    /// The next message the child receives.
    async fn receive(&mut self) -> Value {
        let line = tokio::time::timeout(SOON, self.stdin.next_line())
            .await
            .expect("the child got no line in time")
            .expect("reading the child's stdin")
            .expect("the child's stdin closed");
        serde_json::from_str(&line).expect("a JSON line")
    }

    /// Writes `line` (and a newline) to the child's stdout.
    async fn say(&mut self, line: &str) {
        self.stdout.write_all(line.as_bytes()).await.unwrap();
        self.stdout.write_all(b"\n").await.unwrap();
    }

    /// Answers request `id` with `result`.
    async fn answer(&mut self, id: &Value, result: Value) {
        let line = json!({"jsonrpc": "2.0", "id": id, "result": result}).to_string();
        self.say(&line).await;
    }

    fn kills(&self) -> usize {
        self.kills.load(Ordering::SeqCst)
    }

    /// A request in the background.
    fn call(&self, method: &str) -> tokio::task::JoinHandle<Result<Value, RpcFailure>> {
        let rpc = self.rpc.clone();
        let method = method.to_owned();
        tokio::spawn(async move { rpc.request(&method, json!({})).await })
    }
}

/// Waits (a while at most) until `done` holds.
async fn until(what: &str, done: impl Fn() -> bool) {
    let deadline = tokio::time::Instant::now() + SOON;
    while !done() {
        assert!(tokio::time::Instant::now() < deadline, "never: {what}");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// A waiting call's result, in time.
async fn result(
    call: tokio::task::JoinHandle<Result<Value, RpcFailure>>,
) -> Result<Value, RpcFailure> {
    tokio::time::timeout(SOON, call)
        .await
        .expect("the call did not end in time")
        .expect("the call's task panicked")
}

/// `future`'s output, in time: a broken feature fails a test, never hangs it.
async fn soon<F: std::future::Future>(future: F) -> F::Output {
    tokio::time::timeout(SOON, future)
        .await
        .expect("did not happen in time")
}

/// Sets its flag when dropped: shows when a held box is released.
struct DropFlag(Arc<AtomicBool>);

impl Drop for DropFlag {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

#[tokio::test]
async fn answers_reach_their_callers_when_the_child_answers_out_of_order() {
    let mut child = start(64 * 1024, 64 * 1024);
    let first = child.call("first");
    let one = child.receive().await;
    let second = child.call("second");
    let two = child.receive().await;
    assert_eq!(
        (one["method"].as_str(), two["method"].as_str()),
        (Some("first"), Some("second"))
    );
    assert_ne!(one["id"], two["id"]);
    child.answer(&two["id"], json!("for second")).await;
    child.answer(&one["id"], json!("for first")).await;
    assert_eq!(result(first).await, Ok(json!("for first")));
    assert_eq!(result(second).await, Ok(json!("for second")));
    assert_eq!(child.rpc.in_flight(), 0);
}

#[tokio::test]
async fn a_call_past_its_deadline_is_cancelled_and_holds_its_slot_until_the_late_answer() {
    let mut child = start(64 * 1024, 64 * 1024);
    let released = Arc::new(AtomicBool::new(false));
    let rpc = child.rpc.clone();
    let hold = Kept::new(DropFlag(released.clone()));
    let call = tokio::spawn(async move {
        let deadline = tokio::time::Instant::now() + Duration::from_millis(50);
        let mut never = crate::cancel::Cancel::never();
        rpc.request_until("slow", &json!({}), deadline, &mut never, hold)
            .await
    });
    let request = child.receive().await;
    assert_eq!(result(call).await, Err(RpcFailure::TimedOut));
    let cancelled = child.receive().await;
    assert_eq!(cancelled["method"], "notifications/cancelled");
    assert_eq!(cancelled["params"]["requestId"], request["id"]);
    // The child is still working on it: the slot stays held.
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert!(
        !released.load(Ordering::SeqCst),
        "released before the child answered"
    );
    assert_eq!(child.rpc.in_flight(), 1);
    child.answer(&request["id"], json!("late")).await;
    until("the late answer releases the slot", || {
        released.load(Ordering::SeqCst)
    })
    .await;
    assert_eq!(child.rpc.in_flight(), 0);
    assert_eq!(child.kills(), 0);
}

#[tokio::test]
async fn a_stop_cancels_the_call_on_the_child_and_holds_its_slot_until_it_answers() {
    let mut child = start(64 * 1024, 64 * 1024);
    let released = Arc::new(AtomicBool::new(false));
    let rpc = child.rpc.clone();
    let hold = Kept::new(DropFlag(released.clone()));
    let in_flight = Arc::new(crate::cancel::CallsBySession::default());
    let calls = in_flight.clone();
    let call = tokio::spawn(async move {
        let (mut cancel, _place) = calls.register(Some("kitchen"));
        let deadline = tokio::time::Instant::now() + SOON;
        rpc.request_until("slow", &json!({}), deadline, &mut cancel, hold)
            .await
    });
    let request = child.receive().await;
    assert_eq!(in_flight.stop(Some("bedroom")), 0, "another session's stop");
    assert_eq!(in_flight.stop(Some("kitchen")), 1);
    assert_eq!(result(call).await, Err(RpcFailure::Cancelled));
    let cancelled = child.receive().await;
    assert_eq!(cancelled["method"], "notifications/cancelled");
    assert_eq!(cancelled["params"]["requestId"], request["id"]);
    assert_eq!(cancelled["params"]["reason"], "cancelled by stop");
    assert!(
        !released.load(Ordering::SeqCst),
        "released before the child answered"
    );
    child.answer(&request["id"], json!("late")).await;
    until("the late answer releases the slot", || {
        released.load(Ordering::SeqCst)
    })
    .await;
    assert_eq!(child.rpc.in_flight(), 0);
}

#[tokio::test]
async fn dropping_a_request_withdraws_it_and_sends_cancelled() {
    let mut child = start(64 * 1024, 64 * 1024);
    let rpc = child.rpc.clone();
    let call = tokio::spawn(async move {
        let _ =
            tokio::time::timeout(Duration::from_millis(50), rpc.request("slow", json!({}))).await;
    });
    let request = child.receive().await;
    tokio::time::timeout(SOON, call).await.unwrap().unwrap();
    let cancelled = child.receive().await;
    assert_eq!(cancelled["method"], "notifications/cancelled");
    assert_eq!(cancelled["params"]["requestId"], request["id"]);
    assert_eq!(child.rpc.in_flight(), 0);
}

#[tokio::test]
async fn a_stdout_line_longer_than_the_max_cuts_the_child_off() {
    let mut child = start(1000, 64 * 1024);
    let call = child.call("waits");
    child.receive().await;
    child.say(&"x".repeat(1001)).await;
    match result(call).await {
        Err(RpcFailure::Broken(why)) => {
            assert!(why.contains("longer than max_message_bytes"), "{why}")
        }
        other => panic!("expected Broken, got {other:?}"),
    }
    assert_eq!(child.kills(), 1);
    assert!(child.rpc.broken_because().is_some());
    // Later calls fail at once, and nothing is killed twice.
    assert!(matches!(
        soon(child.rpc.request("later", json!({}))).await,
        Err(RpcFailure::Broken(_))
    ));
    assert_eq!(child.kills(), 1);
}

#[tokio::test]
async fn a_json_rpc_batch_cuts_the_child_off() {
    let mut child = start(64 * 1024, 64 * 1024);
    let call = child.call("waits");
    let request = child.receive().await;
    let batch = json!([{"jsonrpc": "2.0", "id": request["id"], "result": 1}]).to_string();
    child.say(&batch).await;
    assert!(matches!(result(call).await, Err(RpcFailure::Broken(_))));
    assert_eq!(child.kills(), 1);
}

#[tokio::test]
async fn a_child_that_stops_reading_stdin_is_cut_off() {
    // A 64-byte pipe the child never reads: the writer soon blocks, and
    // what waits for stdin grows past the 1000-byte budget.
    let child = start(1000, 64);
    let calls: Vec<_> = (0..40).map(|_| child.call("unread")).collect();
    until("the link is cut off", || child.kills() > 0).await;
    for call in calls {
        match result(call).await {
            Err(RpcFailure::Broken(why)) => {
                assert!(why.contains("does not read its stdin"), "{why}")
            }
            other => panic!("expected Broken, got {other:?}"),
        }
    }
    assert_eq!(child.kills(), 1);
    assert!(child.rpc.is_closed());
}

#[tokio::test]
async fn a_request_larger_than_the_budget_is_refused_unsent() {
    let mut child = start(1000, 64 * 1024);
    let big = json!({"text": "y".repeat(2000)});
    match soon(child.rpc.request("big", big)).await {
        Err(RpcFailure::TooLarge { bytes, limit }) => {
            assert!(bytes > 2000 && limit == 1000, "{bytes} {limit}")
        }
        other => panic!("expected TooLarge, got {other:?}"),
    }
    // Not the child's fault: it stays usable, and what it gets next is the
    // next request, not the big one.
    let call = child.call("small");
    let request = child.receive().await;
    assert_eq!(request["method"], "small");
    child.answer(&request["id"], json!(1)).await;
    assert_eq!(result(call).await, Ok(json!(1)));
    assert_eq!(child.kills(), 0);
}

#[tokio::test]
async fn the_childs_ping_is_answered_and_other_requests_are_refused() {
    let mut child = start(64 * 1024, 64 * 1024);
    child
        .say(r#"{"jsonrpc":"2.0","id":"p1","method":"ping"}"#)
        .await;
    let pong = child.receive().await;
    assert_eq!(pong["id"], "p1");
    assert_eq!(pong["result"], json!({}));
    child
        .say(r#"{"jsonrpc":"2.0","id":7,"method":"sampling/createMessage","params":{}}"#)
        .await;
    let refused = child.receive().await;
    assert_eq!(refused["id"], 7);
    assert_eq!(refused["error"]["code"], crate::mcp::METHOD_NOT_FOUND);
    assert!(refused.get("result").is_none());
}

#[tokio::test]
async fn tools_list_changed_becomes_an_event() {
    let mut child = start(64 * 1024, 64 * 1024);
    child
        .say(r#"{"jsonrpc":"2.0","method":"notifications/message","params":{"level":"info","data":"hi"}}"#)
        .await;
    child
        .say(r#"{"jsonrpc":"2.0","method":"notifications/tools/list_changed"}"#)
        .await;
    let event = tokio::time::timeout(SOON, child.events.recv())
        .await
        .unwrap();
    assert!(matches!(event, Some(ChildEvent::ToolsChanged)));
    assert!(child.events.try_recv().is_err(), "one event only");
}

#[test]
fn long_lines_are_told_apart_without_parsing_them() {
    use super::long_line::{peek_long, LongLine};
    let message = r#"{"jsonrpc":"2.0","method":"notifications/message","params":{"data":"x"}}"#;
    assert_eq!(
        peek_long(message.as_bytes()),
        LongLine::Notification("notifications/message".into())
    );
    assert_eq!(
        peek_long(br#"{"jsonrpc":"2.0","id":"a","method":"sampling/createMessage"}"#),
        LongLine::Request(json!("a"))
    );
    assert_eq!(
        peek_long(br#"{"jsonrpc":"2.0","id":7,"result":{}}"#),
        LongLine::Answer(Some(7))
    );
    assert_eq!(
        peek_long(br#"{"jsonrpc":"2.0","id":"x","result":{}}"#),
        LongLine::Answer(None)
    );
    assert_eq!(peek_long(b"not json"), LongLine::Unreadable);
}

#[tokio::test]
async fn a_long_request_from_the_child_is_refused_unread_and_a_long_answer_still_lands() {
    let mut child = start(4 * 1024 * 1024, 64 * 1024);
    let pad = "z".repeat(200 * 1024);
    child
        .say(&format!(
            r#"{{"jsonrpc":"2.0","id":"q","method":"sampling/createMessage","params":{{"pad":"{pad}"}}}}"#
        ))
        .await;
    let refused = child.receive().await;
    assert_eq!(refused["id"], "q");
    assert_eq!(refused["error"]["code"], crate::mcp::METHOD_NOT_FOUND);
    // A long answer to a call that waits for it is parsed and delivered.
    let call = child.call("long answer");
    let request = child.receive().await;
    child.answer(&request["id"], json!({"text": pad})).await;
    assert_eq!(result(call).await, Ok(json!({"text": pad})));
}

#[tokio::test]
async fn a_huge_log_message_is_skipped_and_the_child_served_on() {
    let mut child = start(4 * 1024 * 1024, 64 * 1024);
    let huge = format!(
        r#"{{"jsonrpc":"2.0","method":"notifications/message","params":{{"level":"info","data":"{}"}}}}"#,
        "y".repeat(1024 * 1024)
    );
    child.say(&huge).await;
    let call = child.call("after a huge message");
    let request = child.receive().await;
    child.answer(&request["id"], json!({"ok": true})).await;
    assert_eq!(result(call).await, Ok(json!({"ok": true})));
}

#[tokio::test]
async fn junk_lines_are_ignored() {
    let mut child = start(64 * 1024, 64 * 1024);
    let call = child.call("after junk");
    let request = child.receive().await;
    for junk in [
        "not json at all",
        "[1, 2]",
        "{}",
        "42",
        "   ",
        r#"{"id": 1}"#,
    ] {
        child.say(junk).await;
    }
    child.answer(&request["id"], json!("fine")).await;
    assert_eq!(result(call).await, Ok(json!("fine")));
    assert_eq!(child.kills(), 0);
    assert!(!child.rpc.is_closed());
}

#[tokio::test]
async fn close_with_the_exit_fails_every_call_with_it() {
    let mut child = start(1000, 64 * 1024);
    let calls = [child.call("one"), child.call("two")];
    child.receive().await;
    child.receive().await;
    child.rpc.link.close(RpcFailure::Exited(ExitInfo::Code(3)));
    for call in calls {
        assert_eq!(
            result(call).await,
            Err(RpcFailure::Exited(ExitInfo::Code(3)))
        );
    }
    assert_eq!(
        soon(child.rpc.request("later", json!({}))).await,
        Err(RpcFailure::Exited(ExitInfo::Code(3)))
    );
    // A child that exited is not cut off (nor killed) for what it left behind.
    child.say(&"x".repeat(1001)).await;
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert_eq!(child.kills(), 0);
    assert_eq!(child.rpc.broken_because(), None);
}

#[tokio::test]
async fn progress_goes_to_the_call_that_sent_its_token_until_the_watch_is_dropped() {
    let mut child = start(64 * 1024, 64 * 1024);
    let (sender, mut reports) = watch::channel(None);
    let watch = child.rpc.watch_progress(sender);
    let token = watch.token();
    let note = |token: Value, n: u64| {
        json!({"jsonrpc": "2.0", "method": "notifications/progress",
               "params": {"progressToken": token, "progress": n, "message": "m"}})
        .to_string()
    };
    child.say(&note(json!(token), 1)).await;
    soon(reports.changed()).await.unwrap();
    let got = reports.borrow_and_update().clone().unwrap();
    assert_eq!(
        (got.progress.as_u64(), got.message.as_deref()),
        (Some(1), Some("m"))
    );
    // Another token, a malformed one: nothing reaches this call. A flood:
    // only the latest is kept.
    child.say(&note(json!(token + 1000), 7)).await;
    child
        .say(r#"{"jsonrpc":"2.0","method":"notifications/progress","params":{}}"#)
        .await;
    for n in 2..=50 {
        child.say(&note(json!(token.to_string()), n)).await;
    }
    until("the flood's last report", || {
        reports
            .borrow()
            .as_ref()
            .is_some_and(|p| p.progress.as_u64() == Some(50))
    })
    .await;
    // Once the call is over its token means nothing.
    drop(watch);
    reports.borrow_and_update();
    child.say(&note(json!(token), 51)).await;
    // A ping after it is answered only once the reader has passed the note.
    let ping = child.call("ping");
    let request = child.receive().await;
    child.answer(&request["id"], json!({})).await;
    result(ping).await.unwrap();
    assert!(!reports.has_changed().unwrap_or(false));
    assert_eq!(child.kills(), 0);
}

#[tokio::test]
async fn a_request_left_to_finish_sends_no_cancel_and_holds_until_answered() {
    let mut child = start(64 * 1024, 64 * 1024);
    let released = Arc::new(AtomicBool::new(false));
    let rpc = child.rpc.clone();
    let hold = Kept::new(DropFlag(released.clone()));
    let call = tokio::spawn(async move {
        let deadline = tokio::time::Instant::now() + Duration::from_millis(50);
        rpc.request_until_then(
            "tasks/result",
            &json!({}),
            deadline,
            &mut Cancel::never(),
            hold,
            super::PastDeadline::LetFinish,
        )
        .await
    });
    let request = child.receive().await;
    assert_eq!(result(call).await, Err(RpcFailure::TimedOut));
    // A detached request follows it; no notifications/cancelled between.
    let released_too = Arc::new(AtomicBool::new(false));
    child.rpc.request_detached(
        "tasks/cancel",
        &json!({"taskId": "t"}),
        Kept::new(DropFlag(released_too.clone())),
    );
    let cancel = child.receive().await;
    assert_eq!(cancel["method"], "tasks/cancel");
    assert_eq!(child.rpc.in_flight(), 2);
    child.answer(&cancel["id"], json!({})).await;
    until("the cancel's answer releases its hold", || {
        released_too.load(Ordering::SeqCst)
    })
    .await;
    assert!(!released.load(Ordering::SeqCst));
    child.answer(&request["id"], json!({"content": []})).await;
    until("the late result releases the slot", || {
        released.load(Ordering::SeqCst)
    })
    .await;
    assert_eq!(child.rpc.in_flight(), 0);
}
