//! The bus topics of OVOS-TOOLS-1 (docs/protocol.md): persona topics, the flat tool
//! service topics and the predecessor per-toolbox topic.
//!
//! [`Service::dispatch`] runs on the bus read loop and never waits: it decodes a
//! frame's topic and spawns a task for each request it answers, so a slow tool
//! never delays a fast one.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Deserialize;
use serde_json::Value;
use tokio::sync::mpsc;

use crate::answers;
use crate::bus::envelope::{Message, Object, Unbuilt};
use crate::cancel::{CallsBySession, Cancel};
use crate::object;
use crate::observe::{Ending, Finished, Observer};
use crate::operator::{self, Operation, Operators};
use crate::peers::{Asker, Peers};
use crate::progress;
use crate::protocol::topics::{route, Topic, DISCOVER_RESPONSE, INVOKE, PERSONA_CALL};
use crate::registry::{Registry, Resolved};
use crate::tool::Tool;
use crate::toolbox::{State, ToolboxHandle};
use crate::util::throttle::LogBudget;

/// How long discovery waits for toolboxes to refresh before answering with the
/// last known lists.
const DISCOVER_REFRESH: Duration = Duration::from_secs(1);
/// Largest request context echoed in answers: a larger one would be copied
/// into every answer (one per toolbox, for discovery) and could push an
/// answer past the bus's message limit. Such a request is refused.
pub const MAX_CONTEXT_BYTES: usize = 64 * 1024;

mod arguments;
use arguments::check_arguments;
mod refusals;

/// Answers the topics, for the toolboxes in the registry.
pub struct Service {
    /// The catalog of hosted toolboxes.
    registry: Arc<Registry>,
    /// Encoded frames to send on the bus.
    out: mpsc::UnboundedSender<String>,
    /// The operator channel, for `ovos.tools.reload`.
    operators: Operators,
    /// `false` for a toolbox host only: the flat `ovos.tools.*` topics are
    /// left to another daemon on the bus.
    flat: bool,
    /// This daemon's check for other hosts: it hears the answers to its
    /// probe, and tells its probe from another daemon's.
    peers: Arc<Peers>,
    /// Malformed frames logged per second: any client can send thousands.
    malformed: std::sync::Mutex<LogBudget>,
    /// The calls in flight by session, for the global stop to cancel.
    in_flight: CallsBySession,
    /// Where finished calls are reported (metrics, audit log).
    observer: Observer,
    /// The room the requests of calls in progress share.
    held: refusals::Held,
}

/// Malformed bus frames logged per second; the rest are counted.
const MALFORMED_PER_SECOND: u32 = 10;

/// When and how a request arrived: a call's deadline counts from `at`, and
/// `frame_bytes` bounds its arguments' size without measuring them.
#[derive(Clone)]
struct Arrival {
    /// When the frame was read: a call's deadline counts from here.
    at: Instant,
    /// The frame's size, for the audit log and metrics.
    frame_bytes: usize,
    /// The catalog as it was when the frame was read: whether a call's
    /// toolbox is hosted is decided then, in the bus's order, so a call read
    /// before an operator's stop is answered (`stopped`), never silenced.
    catalog: Arc<crate::registry::Catalog>,
}

/// The one field read before deciding whether a frame is ours.
#[derive(Deserialize)]
struct Head<'a> {
    #[serde(rename = "type", borrow)]
    msg_type: Option<std::borrow::Cow<'a, str>>,
}

impl Service {
    /// A service answering for `registry`, sending on `out`; reloads go to
    /// `operators`.
    pub fn new(
        registry: Arc<Registry>,
        out: mpsc::UnboundedSender<String>,
        operators: Operators,
        peers: Arc<Peers>,
        flat: bool,
        observer: Observer,
    ) -> Arc<Service> {
        Arc::new(Service {
            registry,
            out,
            operators,
            flat,
            peers,
            malformed: std::sync::Mutex::new(LogBudget::new(MALFORMED_PER_SECOND)),
            in_flight: CallsBySession::default(),
            observer,
            held: refusals::Held::default(),
        })
    }

    /// Handles one incoming frame without waiting: malformed frames are logged
    /// and dropped; requests on our topics get a task each.
    pub fn dispatch(self: &Arc<Self>, frame: &str, from: Option<crate::bus::server::Peer>) {
        // Every OVOS client writes the topic first: read it there, so that the
        // many frames that are not for us (answers, ours echoed back included,
        // some large) are dropped without being parsed.
        let topic = match leading_topic(frame) {
            Some(topic) => std::borrow::Cow::Borrowed(topic),
            None => match serde_json::from_str::<Head>(frame) {
                Ok(Head {
                    msg_type: Some(topic),
                }) => topic,
                Ok(Head { msg_type: None }) | Err(_) => {
                    // Decode fully only to say exactly what is wrong.
                    if let Err(e) = Message::decode(frame) {
                        self.log_malformed(&e);
                    }
                    return;
                }
            },
        };
        if topic == DISCOVER_RESPONSE {
            self.peers.note(frame);
            return;
        }
        let name = topic;
        let Some(topic) = route(&name) else {
            return self.prewarm(&name);
        };
        if !self.flat
            && matches!(
                topic,
                Topic::List | Topic::Get | Topic::Invoke | Topic::Reload
            )
        {
            return;
        }
        let calls = topic.is_call();
        // Only a call carries data of any size (its arguments); decoding a
        // padded list or stop request would only cost the bus's thread.
        if !calls && frame.len() > refusals::MAX_REQUEST_BYTES {
            return self.log_malformed(&format_args!(
                "a {} request of {} bytes (only calls may pass {} bytes)",
                crate::util::throttle::cut(&name, 100),
                frame.len(),
                refusals::MAX_REQUEST_BYTES
            ));
        }
        // A call takes its room before it is decoded: without room, only
        // what addresses its refusal is read.
        let (held, decoded) = if calls {
            let unbuilt = Unbuilt::read(frame, &refusals::CALL_KEYS);
            match self.held.admit(unbuilt.text_bytes(), from) {
                Err(why) => return self.refuse_held(frame, why),
                Ok(room) => (Some(room), unbuilt.build()),
            }
        } else {
            (None, Message::decode(frame))
        };
        let request = match decoded {
            Ok(request) => request,
            Err(e) => {
                self.log_malformed(&e);
                return;
            }
        };
        if frame.len() > MAX_CONTEXT_BYTES {
            let context = serde_json::to_string(&request.context).map_or(0, |c| c.len());
            if context > MAX_CONTEXT_BYTES {
                return self.refuse_context(topic, request, context);
            }
        }
        // A call's deadline counts from here, whatever it waits for later.
        let arrived = Arrival {
            at: Instant::now(),
            frame_bytes: frame.len(),
            catalog: self.registry.snapshot(),
        };
        let service = self.clone();
        tokio::spawn(async move {
            service.handle(topic, request, arrived).await;
            drop(held);
        });
    }

    /// Starts the idle toolboxes that asked to be started by a message of
    /// `topic` (`[start] prewarm_on`), ahead of their first call. Answers
    /// (`*.response`) never prewarm, so the daemon's own traffic costs no
    /// catalog lookup.
    fn prewarm(&self, topic: &str) {
        if topic.ends_with(".response") {
            return;
        }
        for entry in self.registry.snapshot().prewarmed_by(topic) {
            if entry.state == State::Idle {
                tracing::debug!(toolbox = entry.handle.id(), topic, "prewarming");
                entry.handle.prewarm();
            }
        }
    }

    /// Logs a dropped frame, within [`MALFORMED_PER_SECOND`].
    fn log_malformed(&self, error: &dyn std::fmt::Display) {
        let mut budget = self.malformed.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(dropped) = budget.take() {
            if dropped > 0 {
                tracing::warn!(
                    dropped,
                    "malformed bus frames not logged (more than {MALFORMED_PER_SECOND} a second)"
                );
            }
            // What a client sent may be quoted in the error: escaped, so it
            // cannot forge a log line.
            let error = error.to_string();
            let error = crate::util::throttle::escape_controls(&error);
            tracing::warn!("dropped a malformed bus frame: {error}");
        }
    }

    fn respond(&self, request: &Message, data: Object) {
        self.send_answer(request, request.encode_response(&data));
    }

    /// Sends an answer to `request`; one that would not fit in a bus message
    /// is replaced by an error saying so.
    fn send_answer(&self, request: &Message, frame: String) {
        if frame.len() <= crate::bus::MAX_FRAME_BYTES {
            let _ = self.out.send(frame);
            return;
        }
        tracing::warn!(
            topic = %request.msg_type,
            bytes = frame.len(),
            "an answer larger than the bus's message limit was replaced by an error"
        );
        let error = answers::oversize_answer(frame.len());
        let data = Self::error_data(request, error);
        let _ = self.out.send(request.encode_response(&data));
    }

    async fn handle(&self, topic: Topic, request: Message, arrived: Arrival) {
        // A call is the global stop's to cancel from its arrival on: while
        // it waits for a first start, is validated, or runs.
        let (mut cancel, _in_flight) = if topic.is_call() {
            let (cancel, place) = self.in_flight.register(session_of(&request));
            (cancel, Some(place))
        } else {
            (Cancel::never(), None)
        };
        let cancel = &mut cancel;
        match topic {
            Topic::Discover => self.discover(&request).await,
            Topic::PersonaCall => {
                if let Some(id) = request.data.get("toolbox_id").and_then(Value::as_str) {
                    let id = id.to_owned();
                    self.persona_call(&request, &id, &arrived, cancel).await;
                }
            }
            Topic::Predecessor(id) => self.persona_call(&request, &id, &arrived, cancel).await,
            Topic::List => {
                self.respond_with_tools(&request, Object::new());
            }
            Topic::Get => self.get(&request),
            Topic::Invoke => self.invoke(&request, &arrived, cancel).await,
            Topic::Reload => self.reload(&request).await,
            Topic::Stop => self.stop(&request),
        }
    }

    /// The global stop: cancels the calls in flight of the stop's session,
    /// or of every session when it names none. Nothing is answered.
    fn stop(&self, request: &Message) {
        // A stop whose session cannot be read cancels nothing: only one that
        // names no session at all is for every session.
        if request.context.contains_key("session") && session_of(request).is_none() {
            return;
        }
        let session = session_of(request);
        let cancelled = self.in_flight.stop(session);
        if cancelled > 0 {
            tracing::info!(
                session = session.unwrap_or("(all)"),
                cancelled,
                "calls cancelled by stop"
            );
        }
    }

    /// One response per listed toolbox, each refreshed first (within a second).
    /// Another daemon's probe is answered at once, without refreshing; our own
    /// probe is not answered.
    async fn discover(&self, request: &Message) {
        match self.peers.asker(request) {
            Asker::Us => return,
            Asker::Peer => {
                self.peers.probed_by(request);
                return self.answer_discover(&self.peers.answering(request));
            }
            Asker::Client => {}
        }
        let before = self.registry.snapshot();
        let refreshes: Vec<_> = before
            .listed()
            .map(|(_, entry)| {
                let handle = entry.handle.clone();
                async move { handle.refresh(false).await }
            })
            .collect();
        let _ =
            tokio::time::timeout(DISCOVER_REFRESH, futures_util::future::join_all(refreshes)).await;
        self.answer_discover(request);
    }

    fn answer_discover(&self, request: &Message) {
        let catalog = self.registry.snapshot();
        for (id, entry) in catalog.listed() {
            let tools: Vec<Value> = entry.tools.iter().map(|t| t.definition()).collect();
            self.respond(
                request,
                object! {"toolbox_id" => id.as_str(), "tools" => tools},
            );
        }
    }

    /// `ovos.persona.tools.call` and its predecessor: silent unless we host `id`.
    async fn persona_call(
        &self,
        request: &Message,
        id: &str,
        arrived: &Arrival,
        cancel: &mut Cancel,
    ) {
        if !arrived.catalog.toolbox(id).is_some_and(|e| e.is_hosted()) {
            return;
        }
        let answer = match request.data.get("name").and_then(Value::as_str) {
            None | Some("") => {
                let answer = Err(answers::MISSING_NAME.to_owned());
                self.report_unrun(request, id, "", Ending::Invalid, arrived, &answer);
                answer
            }
            Some(name) => {
                let args = arguments(request, "kwargs");
                self.call_in(request, id, name, args, arrived, cancel).await
            }
        };
        self.respond(request, answer_data("toolbox_id", id, answer));
    }

    /// Resolves `name` in toolbox `id` and runs the call. A toolbox still
    /// starting for the first time has no tool list yet: wait for it, within
    /// the call's deadline. A call that ends before it runs (the toolbox
    /// stopped or failed, its start not over in time, a stop, an unknown
    /// tool) is reported here, the tool named only if the toolbox has it.
    async fn call_in(
        &self,
        request: &Message,
        id: &str,
        name: &str,
        args: Value,
        arrived: &Arrival,
        cancel: &mut Cancel,
    ) -> Result<Value, String> {
        let unrun = |tool: &str, outcome: Ending, answer: String| {
            let answer = Err(answer);
            self.report_unrun(request, id, tool, outcome, arrived, &answer);
            answer
        };
        let mut catalog = self.registry.snapshot();
        for attempt in 0..2 {
            let Some(entry) = catalog.toolbox(id) else {
                let stopped = &crate::toolbox::CallError::Stopped;
                return unrun("", Ending::Error, answers::call_error(stopped, name, id));
            };
            let known = entry.tools.get(name).map_or("", |tool| tool.name.as_str());
            if let State::Failed { reason } = &entry.state {
                return unrun(known, Ending::Error, answers::failed(id, reason));
            }
            match entry.tools.get(name) {
                Some(tool) => {
                    return self
                        .run(request, &entry.handle, tool, args, arrived, cancel)
                        .await
                }
                None if attempt == 0
                    && entry.state == State::Starting
                    && entry.tools.is_empty() =>
                {
                    let limit = entry.handle.deadline_of(name);
                    let started = tokio::select! {
                        started = entry.handle.wait_started(arrived.at + limit) => started,
                        () = cancel.fired() => {
                            let stopped = answers::CANCELLED_BY_STOP.to_owned();
                            return unrun("", Ending::Cancelled, stopped);
                        }
                    };
                    if !started {
                        let timeout = crate::toolbox::CallError::Timeout(limit);
                        let answer = answers::call_error(&timeout, name, id);
                        return unrun("", Ending::Timeout, answer);
                    }
                    catalog = self.registry.snapshot();
                }
                None => break,
            }
        }
        unrun("", Ending::Error, answers::unknown_tool_in(name, id))
    }

    /// Reports a call that ended before it was run: to the metrics and the
    /// audit log, not to the toolbox's counters (no child had it). `toolbox`
    /// and `tool` are labels: empty unless they name a hosted toolbox and
    /// one of its tools, so a caller's made-up name never becomes a series.
    fn report_unrun(
        &self,
        request: &Message,
        toolbox: &str,
        tool: &str,
        outcome: Ending,
        arrived: &Arrival,
        answer: &Result<Value, String>,
    ) {
        self.observer.call_finished(&Finished {
            toolbox,
            tool,
            outcome,
            took: arrived.at.elapsed(),
            request,
            answer,
            arguments: None,
        });
    }

    /// One call: run it ([`Service::attempt`]), then count it and report
    /// it (status counters, metrics, audit log).
    async fn run(
        &self,
        request: &Message,
        handle: &ToolboxHandle,
        tool: &Arc<Tool>,
        args: Value,
        arrived: &Arrival,
        cancel: &mut Cancel,
    ) -> Result<Value, String> {
        let audited = self.observer.wants_arguments(handle).then(|| args.clone());
        let (answer, outcome) = self
            .attempt(request, handle, tool, args, arrived, cancel)
            .await;
        let took = arrived.at.elapsed();
        if outcome != Ending::Invalid {
            handle.stats().record_call(answer.is_ok(), took);
        }
        self.observer.call_finished(&Finished {
            toolbox: handle.id(),
            tool: &tool.name,
            outcome,
            took,
            request,
            answer: &answer,
            arguments: audited.as_ref(),
        });
        answer
    }

    /// One call, top-down: validate the arguments (before the child sees
    /// anything), call the child (a stop for the request's session cancels
    /// it; its progress is relayed to the caller while it runs), map its
    /// result, validate the output. Returns the answer and how the call ended.
    async fn attempt(
        &self,
        request: &Message,
        handle: &ToolboxHandle,
        tool: &Arc<Tool>,
        args: Value,
        arrived: &Arrival,
        cancel: &mut Cancel,
    ) -> (Result<Value, String>, Ending) {
        let (name, id) = (tool.name.as_str(), handle.id());
        let args = match check_arguments(handle, tool, args, arrived).await {
            Ok(args) => args,
            Err(why) => {
                let error = answers::invalid_arguments(name, id, &why);
                return (Err(error), Ending::Invalid);
            }
        };
        // Progress reports on the call topic: the persona one for the
        // predecessor topic too.
        let topic = if request.msg_type == INVOKE {
            INVOKE
        } else {
            PERSONA_CALL
        };
        let about = progress::About {
            request,
            topic,
            toolbox: id,
            tool: name,
            observer: &self.observer,
        };
        let (progress, reports) = progress::channel();
        let call = handle.call_with_progress(name, args, arrived.at, cancel, Some(progress));
        match progress::relayed(&self.out, about, reports, call).await {
            Ok(raw) => {
                let answer =
                    answers::map_call_result(raw, tool.has_output_schema).and_then(|result| {
                        tool.check_output(&result)
                            .map_err(|why| answers::invalid_output(name, id, &why))?;
                        Ok(result)
                    });
                let outcome = if answer.is_ok() {
                    Ending::Ok
                } else {
                    Ending::Error
                };
                (answer, outcome)
            }
            Err(e) => (Err(answers::call_error(&e, name, id)), Ending::of(&e)),
        }
    }

    fn get(&self, request: &Message) {
        let data = match request.data.get("name").and_then(Value::as_str) {
            None | Some("") => object! {"error" => answers::MISSING_NAME},
            Some(name) => match self.registry.snapshot().resolve(name) {
                Resolved::One(_, tool) => match tool.definition() {
                    Value::Object(def) => def,
                    _ => Object::new(),
                },
                Resolved::Unknown => object! {"error" => answers::unknown_tool(name)},
                Resolved::Ambiguous(ids) => object! {"error" => answers::ambiguous(name, ids)},
            },
        };
        self.respond(request, data);
    }

    async fn invoke(&self, request: &Message, arrived: &Arrival, cancel: &mut Cancel) {
        let Some(name) = request
            .data
            .get("name")
            .and_then(Value::as_str)
            .filter(|n| !n.is_empty())
        else {
            let answer = Err(answers::MISSING_NAME.to_owned());
            self.report_unrun(request, "", "", Ending::Invalid, arrived, &answer);
            self.respond(
                request,
                object! {"name" => "", "error" => answers::MISSING_NAME},
            );
            return;
        };
        let catalog = self.registry.snapshot();
        let answer = match catalog.resolve(name) {
            Resolved::One(entry, tool) => {
                let args = arguments(request, "args");
                self.run(request, &entry.handle, tool, args, arrived, cancel)
                    .await
            }
            Resolved::Unknown => {
                let answer = Err(answers::unknown_tool(name));
                self.report_unrun(request, "", "", Ending::Error, arrived, &answer);
                answer
            }
            Resolved::Ambiguous(ids) => {
                let answer = Err(answers::ambiguous(name, ids));
                self.report_unrun(request, "", "", Ending::Error, arrived, &answer);
                answer
            }
        };
        self.respond(request, answer_data("name", name, answer));
    }

    async fn reload(&self, request: &Message) {
        let Ok(operator::Performed::Reloaded(report)) = self.operators.ask(Operation::Reload).await
        else {
            tracing::warn!("reload requested while shutting down; ignored");
            return;
        };
        let catalog = self.registry.snapshot();
        let mut rest = object! {
            "loaded" => report.loaded.clone(),
            "total_tools" => catalog.listed_tool_count(),
        };
        if !report.errors.is_empty() {
            rest.insert("errors".to_owned(), report.errors_json());
        }
        self.respond_with_tools(request, rest);
    }

    /// Answers with `tools` (every listed tool definition) plus `rest`. The
    /// catalog keeps the tools serialized, so a large list is spliced in, not
    /// rebuilt for every answer.
    fn respond_with_tools(&self, request: &Message, rest: Object) {
        let catalog = self.registry.snapshot();
        let mut data = format!("{{\"tools\":{}", catalog.definitions_json());
        let rest = Value::Object(rest).to_string();
        if rest.len() > 2 {
            data.push(',');
            data.push_str(&rest[1..]);
        } else {
            data.push('}');
        }
        let frame = request.response(Object::new()).encode_with_raw_data(&data);
        self.send_answer(request, frame);
    }
}

/// The topic of a frame that starts `{"type": "<topic>"` with no escapes in it,
/// as every OVOS client writes them; `None` means "parse to find out".
fn leading_topic(frame: &str) -> Option<&str> {
    let rest = frame.strip_prefix("{\"type\":")?;
    let rest = rest.strip_prefix(' ').unwrap_or(rest).strip_prefix('"')?;
    let end = rest.find(['"', '\\'])?;
    (rest.as_bytes()[end] == b'"').then(|| &rest[..end])
}

/// The session a request belongs to (`context.session.session_id`), if it
/// names one.
fn session_of(request: &Message) -> Option<&str> {
    request.context.get("session")?.get("session_id")?.as_str()
}

/// The call arguments under `key`; absent or null means `{}`.
fn arguments(request: &Message, key: &str) -> Value {
    match request.data.get(key) {
        None | Some(Value::Null) => Value::Object(Object::new()),
        Some(v) => v.clone(),
    }
}

/// `{key: value, result}` or `{key: value, error}`.
fn answer_data(key: &str, value: &str, answer: Result<Value, String>) -> Object {
    let mut data = Object::new();
    data.insert(key.to_owned(), Value::String(value.to_owned()));
    match answer {
        Ok(result) => data.insert("result".to_owned(), result),
        Err(error) => data.insert("error".to_owned(), Value::String(error)),
    };
    data
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leading_topic_reads_only_plain_prefixes() {
        assert_eq!(leading_topic(r#"{"type":"a.b","data":{}}"#), Some("a.b"));
        assert_eq!(leading_topic(r#"{"type": "a.b", "data": {}}"#), Some("a.b"));
        assert_eq!(leading_topic(r#"{"type":"a\"b"}"#), None);
        assert_eq!(leading_topic(r#"{"data":{},"type":"a"}"#), None);
    }
}
