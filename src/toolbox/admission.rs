//! A call as its toolbox takes it: admitted (or refused: busy, arguments
//! too large), then run on a serving child within its one deadline, and
//! counted when it is over.

use std::time::Duration;

use serde_json::Value;
use tokio::sync::watch;

use super::serving::Slot;
use super::{CallError, InFlightCount, ToolboxHandle};
use crate::call::Call;
use crate::process::child::{Kept, RpcFailure};

/// A call its toolbox admitted: counted in flight until dropped.
pub struct Admission<'a> {
    /// The toolbox that admitted it.
    pub(super) handle: &'a ToolboxHandle,
    /// Its manifest's limits as they were when it was admitted:
    /// `audit_arguments`, `confirm`, `ask_timeout_s`, `elicitation`.
    pub(super) limits: std::sync::Arc<super::CallLimits>,
    /// Keeps the call in the toolbox's `in_flight` (its admission counts it).
    pub(super) _count: InFlightCount<'a>,
}

impl Admission<'_> {
    /// Whether the audit log records this call's arguments and result (its
    /// manifest says `audit_arguments = true`).
    pub fn audits_arguments(&self) -> bool {
        self.limits.audit_arguments
    }

    /// How long a call of `tool` waits for a person's yes, if its manifest
    /// says it must (`confirm`; `destructive` reads the tool's annotations,
    /// the manifest's over the child's).
    pub fn confirmation(&self, tool: &crate::tool::Tool) -> Option<Duration> {
        let asking = &self.limits.asking;
        let destructive = || tool.annotation("destructiveHint") == Some(Value::Bool(true));
        asking
            .confirm
            .needs(&tool.name, destructive)
            .then(|| Duration::from_secs(asking.ask_timeout_s))
    }

    /// How long a question of its child waits for the person, if its
    /// manifest lets it ask (`elicitation`).
    pub fn questions_wait(&self) -> Option<Duration> {
        let asking = &self.limits.asking;
        asking
            .elicitation
            .then(|| Duration::from_secs(asking.ask_timeout_s))
    }

    /// Runs `call` (its arguments already checked): waits for a serving
    /// child and a free slot on it, and returns the child's raw MCP
    /// result. Everything, the wait included, ends at the call's deadline,
    /// or early when its cancel token fires. The arguments are taken out
    /// of the call and sent.
    pub async fn call(&self, call: &mut Call) -> Result<Value, CallError> {
        let handle = self.handle;
        let deadline = call.deadline;
        let limit = deadline.limit();
        loop {
            // Watch the slots from before we pick a child, so that a child
            // found dead below is followed by the next one published.
            let mut changes: Vec<watch::Receiver<Slot>> =
                handle.replicas.iter().map(|r| r.slot.clone()).collect();
            let taken = tokio::select! {
                taken = handle.take_slot(deadline.at()) => taken,
                () = call.request.cancel.fired() => return Err(CallError::Cancelled),
            };
            let slot = match taken {
                Ok(slot) => slot,
                Err(None) => return Err(CallError::Timeout(limit)),
                Err(Some(e)) => return Err(e),
            };
            if slot.0.session.is_gone() {
                // The child died before the call reached it and its actor has
                // not said so yet: the call waits for the next child, like
                // any call during a restart.
                drop(slot);
                let next = changes.iter_mut().map(|s| Box::pin(s.changed()));
                let next =
                    tokio::time::timeout_at(deadline.at(), futures_util::future::select_all(next));
                match tokio::select! {
                    next = next => next,
                    () = call.request.cancel.fired() => return Err(CallError::Cancelled),
                } {
                    Err(_) => return Err(CallError::Timeout(limit)),
                    Ok((Err(_), ..)) => return Err(CallError::Stopped),
                    Ok(_) => continue,
                }
            }
            let serving = slot.0.clone();
            // How long the child has for the call: a call that waited for a
            // slot most of its time and then runs past its deadline says
            // nothing about the child.
            let on_child = deadline.left();
            let arguments = std::mem::take(&mut call.request.arguments);
            // The slot goes with the request: past the deadline it stays
            // taken until the child answers anyway, or is gone.
            let outcome = serving
                .session
                .call_tool(
                    &call.request.tool,
                    arguments,
                    deadline.at(),
                    &mut call.request.cancel,
                    Kept::new(slot),
                    crate::session::Heard {
                        progress: call.request.progress.take(),
                        questions: call.questions.take(),
                    },
                )
                .await;
            return match outcome {
                Ok(result) => {
                    serving.answered();
                    Ok(result)
                }
                Err(RpcFailure::TimedOut) => {
                    // Against the child only if it had at least half the
                    // call's time: a burst of slow calls queued behind
                    // each other reaches it with seconds left, and it is
                    // busy, not wedged.
                    if on_child >= limit / 2 {
                        serving.timed_out();
                    }
                    Err(CallError::Timeout(limit))
                }
                Err(RpcFailure::Rpc(e)) => {
                    serving.answered();
                    Err(CallError::Rpc(e))
                }
                Err(RpcFailure::Cancelled) => Err(CallError::Cancelled),
                Err(RpcFailure::Exited(exit)) => Err(CallError::Exited(exit)),
                Err(RpcFailure::Broken(why)) => Err(CallError::Broken(why)),
                Err(RpcFailure::TooLarge { bytes, limit }) => {
                    Err(CallError::TooLarge { bytes, limit })
                }
            };
        }
    }

    /// The call is over: the toolbox's counters take it (`ok`: answered
    /// with a result; `took`: from its arrival). A call refused before its
    /// child had it is not counted: drop the admission instead.
    pub fn finished(self, ok: bool, took: Duration) {
        self.handle.stats.record_call(ok, took);
    }
}

/// The length of `value` as compact JSON, without building the text.
pub(super) fn json_bytes(value: &Value) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += buf.len();
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut count = Count(0);
    let _ = serde_json::to_writer(&mut count, value);
    count.0
}
