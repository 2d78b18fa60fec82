//! A stand-in child for the tests of what lies above a child (the toolbox,
//! the pipeline, the bus face): a task that speaks MCP over in-memory pipes
//! through the same JSON-RPC link a real child's stdio gets, answering
//! `tools/call` with a function of the test's. No process, no Python.

use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::sync::{mpsc, watch};

use super::rpc::{over_pipes, RpcHandle};
use super::{ChildEvent, ExitInfo};
use crate::mcp;

/// How a stand-in answers one `tools/call`: after a while, with a result
/// or a JSON-RPC error (code, message).
pub(crate) struct StandInReply {
    /// How long it takes.
    pub(crate) after: Duration,
    /// What it answers.
    pub(crate) with: Result<Value, (i64, String)>,
}

/// What a stand-in answers: the tool's name and arguments in, its reply out.
pub(crate) type AnswerFn = Arc<dyn Fn(&str, &Value) -> StandInReply + Send + Sync>;

/// A stand-in child, alive while this is kept.
pub(crate) struct StandIn {
    /// Every message it received (requests and notifications), in order.
    seen: watch::Receiver<Vec<Value>>,
    /// Kept so the link does not take the child as exited.
    _exit: watch::Sender<Option<ExitInfo>>,
    /// Kept so the link can tell its owner about the child.
    _events: mpsc::UnboundedReceiver<ChildEvent>,
}

impl StandIn {
    /// The `tools/call` requests it received: (tool, arguments).
    pub(crate) fn calls(&self) -> Vec<(String, Value)> {
        calls(&self.seen.borrow())
    }

    /// Waits (at most 10 s) until what it received passes `check`.
    pub(crate) async fn until(&self, what: &str, check: impl Fn(&[Value]) -> bool) {
        let mut seen = self.seen.clone();
        let reached = seen.wait_for(|seen| check(seen));
        if !matches!(
            tokio::time::timeout(Duration::from_secs(10), reached).await,
            Ok(Ok(_))
        ) {
            panic!("the stand-in child never {what}: {:?}", self.seen.borrow());
        }
    }
}

/// The `tools/call` requests among `seen`: (tool, arguments).
pub(crate) fn calls(seen: &[Value]) -> Vec<(String, Value)> {
    seen.iter()
        .filter(|m| m["method"] == "tools/call")
        .map(|m| {
            let name = m["params"]["name"].as_str().unwrap_or("").to_owned();
            (name, m["params"]["arguments"].clone())
        })
        .collect()
}

/// The methods of the notifications among `seen`.
pub(crate) fn notifications(seen: &[Value]) -> Vec<String> {
    seen.iter()
        .filter(|m| m.get("id").is_none())
        .filter_map(|m| m["method"].as_str().map(str::to_owned))
        .collect()
}

/// A stand-in child of `toolbox` that takes lines of at most
/// `max_message_bytes`, answering `tools/call` with `answer` (each on a
/// task of its own, so calls overlap) and `ping` with `{}`; the link to it.
pub(crate) fn stand_in(
    toolbox: &str,
    max_message_bytes: usize,
    answer: AnswerFn,
) -> (RpcHandle, StandIn) {
    let piped = over_pipes(toolbox, max_message_bytes, 64 * 1024, Box::new(|| {}));
    let (child_stdin, mut child_stdout) = (piped.child_stdin, piped.child_stdout);
    let (heard, seen) = watch::channel(Vec::new());
    let (out_tx, mut out_rx) = mpsc::unbounded_channel::<Vec<u8>>();
    tokio::spawn(async move {
        while let Some(line) = out_rx.recv().await {
            if child_stdout.write_all(&line).await.is_err() {
                return;
            }
        }
    });
    tokio::spawn(async move {
        let mut lines = BufReader::new(child_stdin).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            let Ok(message) = serde_json::from_str::<Value>(&line) else {
                continue;
            };
            heard.send_modify(|seen| seen.push(message.clone()));
            let Some(id) = message.get("id").cloned() else {
                continue;
            };
            let reply = match message["method"].as_str() {
                Some("tools/call") => {
                    let params = &message["params"];
                    answer(params["name"].as_str().unwrap_or(""), &params["arguments"])
                }
                Some("ping") => StandInReply {
                    after: Duration::ZERO,
                    with: Ok(Value::Object(Default::default())),
                },
                _ => StandInReply {
                    after: Duration::ZERO,
                    with: Err((mcp::METHOD_NOT_FOUND, "no such method".to_owned())),
                },
            };
            let out = out_tx.clone();
            tokio::spawn(async move {
                tokio::time::sleep(reply.after).await;
                let with = match &reply.with {
                    Ok(result) => Ok(result.clone()),
                    Err((code, message)) => Err((*code, message.as_str())),
                };
                let _ = out.send(mcp::response_line(&id, with));
            });
        }
    });
    let child = StandIn {
        seen,
        _exit: piped.exit,
        _events: piped.events,
    };
    (piped.rpc, child)
}
