//! A tool call the child runs as an MCP task (docs/protocol.md, "Tasks"):
//! the `tools/call` creates the task; the legacy era then waits on
//! `tasks/result`, the modern era polls `tasks/get`; all within the call's
//! one deadline. A task the call gives up on (its deadline passed, a stop
//! cancelled the call, or its caller went away) is cancelled with
//! `tasks/cancel`, and the call's slot stays taken until the child has
//! answered every request of the call.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Value};
use tokio::time::Instant;

use crate::cancel::Cancel;
use crate::mcp::{self, TaskStatus};
use crate::process::child::{Kept, PastDeadline, Questioner, RpcFailure, RpcHandle};

/// Poll interval when a modern task suggests none.
const DEFAULT_POLL: Duration = Duration::from_millis(250);
/// Shortest poll interval followed: a server asking for less gets this.
const MIN_POLL: Duration = Duration::from_millis(50);
/// Longest poll interval followed, so that a finished task is seen soon.
const MAX_POLL: Duration = Duration::from_secs(5);

/// How the session's era makes task requests.
#[derive(Debug, Clone, Copy)]
pub(super) enum Flavour<'a> {
    /// `tasks/result` waits for the result; `tasks/cancel` only if the
    /// server declared `tasks.cancel`.
    Legacy { cancel: bool },
    /// `tasks/get` polls, each request carrying this version's `_meta`;
    /// the call's input rounds go to `questions` (`input.rs`), when the
    /// call may ask the person.
    Modern {
        version: &'a str,
        questions: Option<&'a Questioner>,
    },
}

impl Flavour<'_> {
    /// Params of a task request: the task id, and the modern `_meta`.
    fn params(&self, task_id: &str) -> Value {
        match self {
            Flavour::Legacy { .. } => json!({"taskId": task_id}),
            Flavour::Modern { version, .. } => {
                json!({"taskId": task_id, "_meta": mcp::modern_call_meta(version)})
            }
        }
    }
}

/// The call's slot, shared by every request of the call: it is free when
/// the last of them is answered (or the child is gone). (The mutex only
/// makes the slot shareable.)
#[derive(Clone)]
struct SharedHold {
    /// The call's slot.
    _slot: Arc<Mutex<Kept>>,
}

impl SharedHold {
    /// A share for one more request.
    fn share(&self) -> Kept {
        Kept::new(self.clone())
    }
}

/// Sends `params` (a `tools/call` the server may answer with a task) and
/// follows the task it creates to its result, or returns the plain result
/// the server gave instead.
pub(super) async fn call<P: serde::Serialize + ?Sized>(
    rpc: &RpcHandle,
    tool: &str,
    params: &P,
    deadline: Instant,
    cancel: &mut Cancel,
    hold: Kept,
    flavour: Flavour<'_>,
) -> Result<Value, RpcFailure> {
    let hold = SharedHold {
        _slot: Arc::new(Mutex::new(hold)),
    };
    let mut created = rpc
        .request_until("tools/call", params, deadline, cancel, hold.share())
        .await?;
    if let Flavour::Modern { questions, .. } = flavour {
        let share = || hold.share();
        created =
            super::input::rounds(rpc, params, created, questions, deadline, cancel, share).await?;
    }
    let modern = matches!(flavour, Flavour::Modern { .. });
    let task = match mcp::created_task(&created, modern) {
        None => return Ok(created),
        Some(Err(why)) => return Ok(tool_error(format!("ToolError: tool '{tool}': {why}"))),
        Some(Ok(task)) => task,
    };
    let mut running = TaskInFlight {
        rpc,
        tool,
        id: task.id,
        flavour,
        hold,
        over: false,
    };
    match running.flavour {
        Flavour::Legacy { .. } => running.wait_result(deadline, cancel).await,
        Flavour::Modern { .. } => running.poll(created, deadline, cancel).await,
    }
}

/// Whether an outcome leaves the task running: the call gave up on it.
fn given_up<T>(outcome: &Result<T, RpcFailure>) -> bool {
    matches!(outcome, Err(RpcFailure::TimedOut | RpcFailure::Cancelled))
}

/// A task this call created. Dropped before the task is over (the deadline
/// passed, a stop, or the caller went away), it cancels the task.
struct TaskInFlight<'a> {
    /// The child running the task.
    rpc: &'a RpcHandle,
    /// The tool, for error texts and log lines.
    tool: &'a str,
    /// The server's task id.
    id: String,
    /// How to talk about the task in this era.
    flavour: Flavour<'a>,
    /// The call's slot.
    hold: SharedHold,
    /// Whether the task ended (or the child is gone): nothing to cancel.
    over: bool,
}

impl TaskInFlight<'_> {
    /// One request about the task (`tasks/result`, `tasks/get`), left to
    /// finish past the deadline or a stop: the slot stays held until it has.
    async fn ask(
        &self,
        method: &str,
        deadline: Instant,
        cancel: &mut Cancel,
    ) -> Result<Value, RpcFailure> {
        self.rpc
            .request_until_then(
                method,
                &self.flavour.params(&self.id),
                deadline,
                cancel,
                self.hold.share(),
                PastDeadline::LetFinish,
            )
            .await
    }

    /// Legacy: `tasks/result` answers when the task has ended. Past the
    /// deadline (or on a stop) the request is left to finish, so the slot is
    /// free only when the task has ended (cancelled, by `Drop`).
    async fn wait_result(
        &mut self,
        deadline: Instant,
        cancel: &mut Cancel,
    ) -> Result<Value, RpcFailure> {
        let answer = self.ask("tasks/result", deadline, cancel).await;
        self.over = !given_up(&answer);
        answer
    }

    /// Modern: `tasks/get` every poll interval until the task ends; the
    /// result (or error) comes with the final status.
    async fn poll(
        &mut self,
        created: Value,
        deadline: Instant,
        cancel: &mut Cancel,
    ) -> Result<Value, RpcFailure> {
        let tool = self.tool;
        let mut last = created;
        let mut seed = true;
        loop {
            let Some(state) = mcp::task_state(&last) else {
                self.over = true;
                return Ok(tool_error(format!(
                    "ToolError: tool '{tool}' answered tasks/get with no task; the toolbox does \
                     not follow the MCP tasks extension"
                )));
            };
            // The task a `tools/call` creates carries no result: a seed that
            // has ended already is looked at with `tasks/get` at once.
            let ended_seed = seed && state.status.is_terminal();
            if !ended_seed {
                if let Some(outcome) = self.ended(&state, &last) {
                    return outcome;
                }
                let pause = state
                    .poll_interval
                    .unwrap_or(DEFAULT_POLL)
                    .clamp(MIN_POLL, MAX_POLL);
                tokio::select! {
                    () = tokio::time::sleep_until((Instant::now() + pause).min(deadline)) => {}
                    () = cancel.fired() => return Err(RpcFailure::Cancelled),
                }
                if Instant::now() >= deadline {
                    return Err(RpcFailure::TimedOut);
                }
            }
            seed = false;
            let answer = self.ask("tasks/get", deadline, cancel).await;
            // An error: the task is gone (unknown, expired) or so is the child.
            self.over = answer.is_err() && !given_up(&answer);
            last = answer?;
        }
    }

    /// What the call answers if the modern task in `state` (from `last`)
    /// has ended or cannot go on without input; `None` while it works.
    fn ended(&mut self, state: &mcp::TaskState, last: &Value) -> Option<Result<Value, RpcFailure>> {
        let tool = self.tool;
        let words = state
            .message
            .as_deref()
            .map_or(String::new(), |m| format!(": {m}"));
        let outcome = match state.status {
            TaskStatus::Working => return None,
            // The task waits for input nobody on the bus can give: it is
            // cancelled (by `Drop`, `over` staying false).
            TaskStatus::InputRequired => {
                return Some(Ok(tool_error(format!(
                    "ToolError: tool '{tool}' asked for more input (task status input_required), \
                     which a bus call cannot provide; the task was cancelled"
                ))))
            }
            TaskStatus::Completed => match last.get("result") {
                Some(result) if result.is_object() => Ok(result.clone()),
                _ => Ok(tool_error(format!(
                    "ToolError: tool '{tool}' completed its task without a result{words}"
                ))),
            },
            TaskStatus::Failed => match last.get("error") {
                Some(error) if error.is_object() => {
                    Err(RpcFailure::Rpc(mcp::rpc_error_from(error.clone())))
                }
                _ => Ok(tool_error(format!(
                    "ToolError: the task of tool '{tool}' failed{words}"
                ))),
            },
            TaskStatus::Cancelled => Ok(tool_error(format!(
                "CancelledError: the toolbox cancelled the task of tool '{tool}'{words}"
            ))),
        };
        self.over = true;
        Some(outcome)
    }
}

impl Drop for TaskInFlight<'_> {
    fn drop(&mut self) {
        if self.over {
            return;
        }
        let (toolbox, pid) = self.rpc.owner();
        if let Flavour::Legacy { cancel: false } = self.flavour {
            tracing::info!(
                toolbox,
                pid,
                tool = self.tool,
                task = %self.id,
                "left a task running: the child offers no tasks/cancel; its call slot stays taken \
                 until the task ends"
            );
            return;
        }
        tracing::info!(
            toolbox,
            pid,
            tool = self.tool,
            task = %self.id,
            "cancelling the task of a call that is over (deadline, stop, or its caller went away)"
        );
        self.rpc.request_detached(
            "tasks/cancel",
            &self.flavour.params(&self.id),
            self.hold.share(),
        );
    }
}

/// A `CallToolResult` that reports `text` as the tool's error.
fn tool_error(text: String) -> Value {
    json!({"content": [{"type": "text", "text": text}], "isError": true})
}
