//! A modern call's input rounds (MCP 2026-07-28, multi round-trip
//! requests): a `tools/call` answered `resultType: "input_required"` asks
//! the client questions (`inputRequests`) instead of sending them as
//! requests of its own. Those that are questions to the person
//! (`elicitation/create`) go to the person as a child's question does
//! (`ask.rs`, through the call's questioner), a `roots/list` is answered
//! with the child's roots, and the call is made again
//! with their answers (`inputResponses`) and the server's `requestState`,
//! at most [`MAX_ROUNDS`] times, all within the call's one deadline.

use serde_json::{Map, Value};
use tokio::time::Instant;

use crate::cancel::Cancel;
use crate::process::child::{Kept, Questioner, RpcFailure, RpcHandle};

/// Rounds of questions one call may ask; past them its last answer stands
/// (and reads as a call that wanted more input).
pub const MAX_ROUNDS: usize = 4;
/// Questions one round may ask.
const MAX_PER_ROUND: usize = 4;

/// Whether `result` asks for input.
fn asks(result: &Value) -> bool {
    result.get("resultType").and_then(Value::as_str) == Some("input_required")
}

/// Follows `result`, the answer to the `tools/call` `params`, through its
/// input rounds: each question asked of the person through `questioner`
/// (when the call may ask), each `roots/list` answered with the roots,
/// the call made again with the answers, until it answers otherwise (or a
/// question it asks is none a person can answer: then that answer stands).
pub(super) async fn rounds<P: serde::Serialize + ?Sized>(
    rpc: &RpcHandle,
    params: &P,
    mut result: Value,
    questioner: Option<&Questioner>,
    deadline: Instant,
    cancel: &mut Cancel,
    hold: impl Fn() -> Kept,
) -> Result<Value, RpcFailure> {
    for _ in 0..MAX_ROUNDS {
        if !asks(&result) {
            break;
        }
        let Some(answers) = answer(rpc, &result, questioner, deadline, cancel).await? else {
            break;
        };
        // (The call's own params: an object, as it was sent.)
        let Ok(Value::Object(mut retry)) = serde_json::to_value(params) else {
            break;
        };
        retry.insert("inputResponses".into(), Value::Object(answers));
        if let Some(state) = result.get("requestState").filter(|s| s.is_string()) {
            retry.insert("requestState".into(), state.clone());
        }
        result = rpc
            .request_until("tools/call", &retry, deadline, cancel, hold())
            .await?;
    }
    Ok(result)
}

/// The answers to the input requests of `result`, by their keys: the
/// person's to a question, the child's roots to `roots/list`; `None` when
/// one is neither (sampling, say), or there are too many.
async fn answer(
    rpc: &RpcHandle,
    result: &Value,
    questioner: Option<&Questioner>,
    deadline: Instant,
    cancel: &mut Cancel,
) -> Result<Option<Map<String, Value>>, RpcFailure> {
    let Some(requests) = result.get("inputRequests").and_then(Value::as_object) else {
        // Only state to echo: the call is made again with it.
        return Ok(Some(Map::new()));
    };
    if requests.len() > MAX_PER_ROUND {
        return Ok(None);
    }
    let mut answers = Map::new();
    for (key, request) in requests {
        match request.get("method").and_then(Value::as_str) {
            // Only a call whose toolbox may ask asks the person.
            Some("elicitation/create") if questioner.is_some() => {}
            Some("roots/list") => match rpc.roots() {
                Some(roots) => {
                    answers.insert(key.clone(), roots.clone());
                    continue;
                }
                None => return Ok(None),
            },
            _ => return Ok(None),
        }
        let Some(questioner) = questioner else {
            return Ok(None);
        };
        let params = request.get("params").cloned().unwrap_or(Value::Null);
        let answered = tokio::select! {
            answered = (questioner.ask)(params) => answered,
            () = tokio::time::sleep_until(deadline) => return Err(RpcFailure::TimedOut),
            () = cancel.fired() => return Err(RpcFailure::Cancelled),
        };
        answers.insert(key.clone(), answered);
    }
    Ok(Some(answers))
}
