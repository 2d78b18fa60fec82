//! The call pipeline every face sends its calls through: a [`Request`] is
//! admitted as a [`Call`] ([`Pipeline::admit`]: its toolbox found, its one
//! deadline set), then run ([`Pipeline::run`]): its tool found (waiting for
//! a first start), admitted by its toolbox (busy, argument bytes), its
//! arguments checked against the tool's schema, the child called, its
//! output checked. It ends in one typed [`Outcome`], and every ending, the
//! refusals before the child included, is reported here, once, to the
//! metrics and the audit log. Faces decode requests and render outcomes in
//! their own protocol's words; nothing here knows which face asked.
//!
//! - [`outcome`]: the [`Answer`] or the [`Failed`] call a face renders.
//! - [`output`]: a child's result made an answer, its output checked.
//! - [`texts`]: every text a caller reads, and the one classification of a
//!   failure for the texts, the metrics and the audit log.
//! - `arguments.rs`: arguments checked without stalling the daemon.

mod arguments;
pub mod outcome;
pub mod output;
pub mod texts;

use std::sync::{Arc, Mutex};

use serde_json::Value;

use crate::ask::{self, Asker, Question};
use crate::call::{Call, Request};
use crate::observe::{Ending, Finished, Observer};
use crate::process::child::{Answering, Questioner};
use crate::registry::{Catalog, Registry, Resolved};
use crate::tool::Tool;
use crate::toolbox::{CallError, State, ToolboxHandle};
use crate::util::throttle::LogBudget;
use arguments::check_arguments;
pub use outcome::{Answer, Failed, Failure, Outcome};

/// The call pipeline: the catalog it resolves calls in, and where it
/// reports how each ended. Cheap to clone.
#[derive(Clone)]
pub struct Pipeline {
    /// The catalog of hosted toolboxes.
    registry: Arc<Registry>,
    /// Where every ending is reported (metrics, audit log).
    observer: Observer,
    /// Busy refusals and timeouts logged per second (at INFO: an operator
    /// sees a toolbox that cannot keep up); any caller can cause thousands.
    noted: Arc<Mutex<LogBudget>>,
    /// Asks the person when a call needs their yes.
    asker: Arc<Asker>,
}

/// Busy refusals and timeouts logged per second; the rest are counted.
const NOTED_PER_SECOND: u32 = 5;

/// What a run learnt that its report needs, however far it got.
#[derive(Default)]
struct Trace {
    /// The tool, once the toolbox was found to have it: its name is the
    /// `tool` label (a name the toolbox does not have never is).
    tool: Option<Arc<Tool>>,
    /// The arguments, when the audit log records them for this toolbox.
    arguments: Option<Value>,
}

impl Pipeline {
    /// A pipeline over `registry`, reporting to `observer`, asking the
    /// person through `asker`.
    pub fn new(registry: Arc<Registry>, observer: Observer, asker: Arc<Asker>) -> Pipeline {
        Pipeline {
            registry,
            observer,
            noted: Arc::new(Mutex::new(LogBudget::new(NOTED_PER_SECOND))),
            asker,
        }
    }

    /// Where endings are reported: a face reports what it relays there too
    /// (progress).
    pub fn observer(&self) -> &Observer {
        &self.observer
    }

    /// Admits `request`: finds the toolbox that has it (the one it names,
    /// or the one owner of its tool name) and sets its one deadline. A
    /// request that ends here (no name, an unknown or ambiguous name, a
    /// toolbox failed or gone) is reported and its failure returned.
    pub fn admit(&self, request: Request) -> Result<Call, Failed> {
        let catalog = self.registry.snapshot();
        let found = if request.tool.is_empty() {
            Err(Failure::MissingName)
        } else {
            find_toolbox(&catalog, &request)
        };
        match found {
            Ok(handle) => Ok(Call {
                deadline: handle.deadline(&request.tool, request.arrived),
                toolbox: handle.id().to_owned(),
                request,
                questions: None,
            }),
            Err(failure) => {
                let failed = Failed::from(failure);
                let (toolbox, tool) = labels(&catalog, &request);
                self.report(&request, &toolbox, &tool, Err(&failed), None);
                Err(failed)
            }
        }
    }

    /// Reports a request a face refused before it could be admitted (at
    /// its door: no room, a context too large) and returns its failure;
    /// `None` for a request naming a toolbox not hosted here: it was never
    /// ours, to report or to answer.
    pub fn refused(&self, request: &Request, failure: Failure) -> Option<Failed> {
        let catalog = self.registry.snapshot();
        if let Some(id) = &request.toolbox {
            if !catalog.toolbox(id).is_some_and(|e| e.is_hosted()) {
                return None;
            }
        }
        let failed = Failed::from(failure);
        let (toolbox, tool) = labels(&catalog, request);
        self.report(request, &toolbox, &tool, Err(&failed), None);
        Some(failed)
    }

    /// Runs an admitted call to its outcome, and reports it.
    pub async fn run(&self, mut call: Call) -> Outcome {
        let mut trace = Trace::default();
        let outcome = self.attempt(&mut call, &mut trace).await;
        let outcome = outcome.map_err(Failed::from);
        let tool = trace.tool.as_ref().map_or("", |t| t.name.as_str());
        self.report(
            &call.request,
            &call.toolbox,
            tool,
            outcome.as_ref(),
            trace.arguments.as_ref(),
        );
        outcome
    }

    /// The call, top-down: its tool, the toolbox's admission, the
    /// arguments' check (before the child sees anything), the child's
    /// answer, the output's check.
    async fn attempt(&self, call: &mut Call, trace: &mut Trace) -> Result<Answer, Failure> {
        let (handle, tool) = self.find_tool(call, trace).await?;
        let failure = |call: &Call, error| Failure::Call {
            name: tool.name.clone(),
            toolbox: call.toolbox.clone(),
            error,
        };
        let admission = handle.admit(call).map_err(|e| failure(call, e))?;
        if admission.audits_arguments() && self.observer.audits() {
            trace.arguments = Some(call.request.arguments.clone());
        }
        if let Err(why) = check_arguments(&tool, call).await {
            // Not the toolbox's to count: its child never saw the call.
            return Err(Failure::InvalidArguments {
                name: tool.name.clone(),
                toolbox: call.toolbox.clone(),
                why,
            });
        }
        if let Some(wait) = admission.confirmation(&tool) {
            self.confirm(call, &tool, wait).await?;
            // A person took their time: the call's own deadline starts now.
            call.deadline = handle.deadline(call.tool(), tokio::time::Instant::now());
        }
        if let Some(wait) = admission.questions_wait() {
            call.questions = Some(self.questioner(call, &tool, wait));
        }
        let answer = match admission.call(call).await {
            Ok(result) => output::answer_of(result, &tool, &call.toolbox),
            Err(error) => Err(failure(call, error)),
        };
        // A request too large for the child is the caller's error, not the
        // toolbox's.
        let callers = matches!(
            answer,
            Err(Failure::Call {
                error: CallError::TooLarge { .. },
                ..
            })
        );
        if !callers {
            admission.finished(answer.is_ok(), call.request.arrived.elapsed());
        }
        if let Err(Failure::Tool { text }) = &answer {
            let pid = handle.pids().first().copied().unwrap_or(0);
            handle
                .stats()
                .stderr
                .read_tool_error(&call.toolbox, pid, text);
        }
        answer
    }

    /// Asks the person behind `call` whether it may run (within `wait`, or
    /// until a stop of its session): anything but a yes fails it, and its
    /// child never sees it.
    async fn confirm(
        &self,
        call: &mut Call,
        tool: &Tool,
        wait: std::time::Duration,
    ) -> Result<(), Failure> {
        let question = Question {
            kind: ask::Kind::Confirm,
            toolbox: call.toolbox.clone(),
            tool: tool.name.clone(),
            prompt: ask::confirm_prompt(&tool.title(), &call.toolbox, &call.request.arguments),
            session: call.request.session.clone(),
        };
        match self
            .asker
            .ask(question, wait, &mut call.request.cancel)
            .await
        {
            Ok(_) => Ok(()),
            Err(why) => Err(Failure::Unconfirmed {
                name: tool.name.clone(),
                toolbox: call.toolbox.clone(),
                why,
            }),
        }
    }

    /// Where the child's questions during `call` go: to the person behind
    /// it, each within `wait`; the answer as MCP's `ElicitResult`.
    fn questioner(&self, call: &Call, tool: &Tool, wait: std::time::Duration) -> Questioner {
        let asker = self.asker.clone();
        let (toolbox, name) = (call.toolbox.clone(), tool.name.clone());
        let session = call.request.session.clone();
        let for_session = session.clone();
        let ask = Arc::new(move |params: Value| {
            let question = ask::elicitation(&params, &toolbox, &name, session.clone());
            let asker = asker.clone();
            let asked: Answering = Box::pin(async move {
                let question = match question {
                    Ok(question) => question,
                    Err(why) => return ask::elicit_result(Err(why)),
                };
                // The call's end (its stop included) withdraws it: the
                // child's link drops this wait then.
                let answer = asker
                    .ask(question, wait, &mut crate::cancel::Cancel::never())
                    .await;
                ask::elicit_result(answer)
            });
            asked
        });
        Questioner {
            session: for_session,
            ask,
        }
    }

    /// The toolbox and the tool of `call`. A toolbox still starting for the
    /// first time has no tool list yet: wait for it, within the call's
    /// deadline (a stop ends the wait).
    async fn find_tool(
        &self,
        call: &mut Call,
        trace: &mut Trace,
    ) -> Result<(ToolboxHandle, Arc<Tool>), Failure> {
        let mut waited = false;
        loop {
            let catalog = self.registry.snapshot();
            let failure = |error| Failure::Call {
                name: call.request.tool.clone(),
                toolbox: call.toolbox.clone(),
                error,
            };
            let Some(entry) = catalog.toolbox(&call.toolbox) else {
                return Err(failure(CallError::Stopped));
            };
            trace.tool = entry.tools.get(call.tool()).cloned();
            if let State::Failed { reason } = &entry.state {
                return Err(failure(CallError::Failed(reason.clone())));
            }
            if let Some(tool) = &trace.tool {
                return Ok((entry.handle.clone(), tool.clone()));
            }
            if waited || entry.state != State::Starting || !entry.tools.is_empty() {
                return Err(Failure::UnknownToolIn {
                    name: call.request.tool.clone(),
                    toolbox: call.toolbox.clone(),
                });
            }
            waited = true;
            let handle = entry.handle.clone();
            let started = tokio::select! {
                started = handle.wait_started(call.deadline.at()) => started,
                () = call.request.cancel.fired() => return Err(failure(CallError::Cancelled)),
            };
            if !started {
                return Err(failure(CallError::Timeout(call.deadline.limit())));
            }
        }
    }

    /// Logs a busy refusal or a timeout at INFO, within
    /// [`NOTED_PER_SECOND`] (a line counts the ones left out).
    fn note(&self, toolbox: &str, tool: &str, ending: Ending, text: &str) {
        let mut budget = self.noted.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(dropped) = budget.take() {
            if dropped > 0 {
                tracing::info!(
                    dropped,
                    "busy refusals and timeouts not logged (more than {NOTED_PER_SECOND} a second; \
                     the metrics count them all)"
                );
            }
            let text = crate::util::throttle::escape_controls(text);
            tracing::info!(
                toolbox,
                tool,
                outcome = ending.name(),
                "call {}: {text}",
                ending.name()
            );
        }
    }

    /// Reports how a call ended: once, whatever ended it.
    fn report(
        &self,
        request: &Request,
        toolbox: &str,
        tool: &str,
        outcome: Result<&Answer, &Failed>,
        arguments: Option<&Value>,
    ) {
        let (ending, error, result) = match outcome {
            Ok(answer) => (
                Ending::Ok,
                None,
                Some(answer.structured.as_ref().unwrap_or(&answer.result)),
            ),
            Err(failed) => (failed.ending, Some(failed.text.as_str()), None),
        };
        if let (Ending::Busy | Ending::Timeout, Some(text)) = (ending, error) {
            self.note(toolbox, tool, ending, text);
        }
        self.observer.call_finished(&Finished {
            toolbox,
            tool,
            outcome: ending,
            took: request.arrived.elapsed(),
            topic: &request.topic,
            session: request.session.as_deref(),
            source: request.source.as_deref(),
            error,
            arguments,
            result: arguments.and(result),
        });
    }
}

/// The toolbox that has `request`: the one it names, else the one listed
/// toolbox that owns its tool's name.
fn find_toolbox(catalog: &Catalog, request: &Request) -> Result<ToolboxHandle, Failure> {
    let entry = match &request.toolbox {
        Some(id) => catalog.toolbox(id).ok_or_else(|| Failure::Call {
            name: request.tool.clone(),
            toolbox: id.clone(),
            error: CallError::Stopped,
        })?,
        None => match catalog.resolve(&request.tool) {
            Resolved::One(entry, _) => entry,
            // A failed toolbox is not listed, but a caller of one of its
            // tools is owed the reason (below), not "unknown".
            Resolved::Unknown => catalog
                .toolboxes()
                .map(|(_, entry)| entry)
                .find(|entry| {
                    entry.is_hosted()
                        && matches!(entry.state, State::Failed { .. })
                        && entry.tools.get(&request.tool).is_some()
                })
                .ok_or_else(|| Failure::UnknownTool {
                    name: request.tool.clone(),
                })?,
            Resolved::Ambiguous(owners) => {
                return Err(Failure::Ambiguous {
                    name: request.tool.clone(),
                    owners: owners.to_vec(),
                })
            }
        },
    };
    if let State::Failed { reason } = &entry.state {
        return Err(Failure::Call {
            name: request.tool.clone(),
            toolbox: entry.handle.id().to_owned(),
            error: CallError::Failed(reason.clone()),
        });
    }
    Ok(entry.handle.clone())
}

/// The (toolbox, tool) labels a request is reported under before it was
/// admitted: each empty unless it names a toolbox of the catalog and one
/// of its tools, so that a caller's made-up name never becomes a series.
fn labels(catalog: &Catalog, request: &Request) -> (String, String) {
    let name = request.tool.as_str();
    match &request.toolbox {
        None => match catalog.resolve(name) {
            Resolved::One(entry, tool) => (entry.handle.id().to_owned(), tool.name.clone()),
            _ => (String::new(), String::new()),
        },
        Some(id) => match catalog.toolbox(id) {
            Some(entry) => (
                id.clone(),
                entry.tools.get(name).map_or("", |t| &t.name).to_owned(),
            ),
            None => (String::new(), String::new()),
        },
    }
}

#[cfg(test)]
mod tests;
