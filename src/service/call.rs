//! Calls on the bus: `ovos.persona.tools.call` (and its predecessor, the
//! per-toolbox topic), `ovos.tools.invoke`, and the global stop
//! (`mycroft.stop`) that cancels them. A call is decoded into a
//! [`Request`], sent through the call pipeline with its progress relayed
//! to the caller, and its outcome rendered in OVOS-TOOLS-1 words.

use serde_json::{Map, Value};

use super::progress;
use super::replies::Replies;
use super::Arrival;
use crate::bus::envelope::{Message, Object};
use crate::call::Request;
use crate::cancel::CallsBySession;
use crate::mcp;
use crate::pipeline::{Answer, Pipeline};
use crate::protocol::topics::{INVOKE, PERSONA_CALL};

/// The bus face's calls: the pipeline they go through, where they are
/// answered, and the calls in flight a stop cancels.
pub(super) struct Calls {
    /// The call pipeline.
    pipeline: Pipeline,
    /// Where answers and progress go.
    replies: Replies,
    /// The calls in flight by session, for the global stop to cancel.
    in_flight: CallsBySession,
}

impl Calls {
    /// Calls through `pipeline`, answered on `replies`.
    pub(super) fn new(pipeline: Pipeline, replies: Replies) -> Calls {
        Calls {
            pipeline,
            replies,
            in_flight: CallsBySession::default(),
        }
    }

    /// `ovos.persona.tools.call` and its predecessor, for toolbox `id`:
    /// silent unless this daemon hosted `id` when the call was read.
    pub(super) async fn persona_call(&self, message: &Message, id: &str, arrival: &Arrival) {
        if !arrival.catalog.toolbox(id).is_some_and(|e| e.is_hosted()) {
            return;
        }
        let name = name_of(message);
        let arguments = arguments(message, "kwargs");
        let answer = self
            .call(message, Some(id.to_owned()), name, arguments, arrival)
            .await;
        self.replies
            .respond(message, answer_data("toolbox_id", id, answer));
    }

    /// `ovos.tools.invoke`: a tool by its name alone.
    pub(super) async fn invoke(&self, message: &Message, arrival: &Arrival) {
        let name = name_of(message);
        let arguments = arguments(message, "args");
        let answer = self.call(message, None, name, arguments, arrival).await;
        self.replies
            .respond(message, answer_data("name", name, answer));
    }

    /// One call through the pipeline: the global stop may cancel it from
    /// here on, and its progress goes to the caller while it runs.
    async fn call(
        &self,
        message: &Message,
        toolbox: Option<String>,
        name: &str,
        arguments: Value,
        arrival: &Arrival,
    ) -> Result<Value, String> {
        let session = session_of(message);
        let (cancel, _in_flight) = self.in_flight.register(session);
        let (progress, reports) = progress::channel();
        let request = Request {
            topic: message.msg_type.clone(),
            session: session.map(str::to_owned),
            source: source_of(message),
            toolbox,
            tool: name.to_owned(),
            arguments,
            bytes: arrival.frame_bytes,
            arrived: arrival.at,
            cancel,
            progress: Some(progress),
        };
        let call = self.pipeline.admit(request).map_err(|failed| failed.text)?;
        let (toolbox, tool) = (call.toolbox.clone(), call.tool().to_owned());
        let about = progress::About {
            request: message,
            // The persona topic for the predecessor topic too.
            topic: if message.msg_type == INVOKE {
                INVOKE
            } else {
                PERSONA_CALL
            },
            toolbox: &toolbox,
            tool: &tool,
            observer: self.pipeline.observer(),
        };
        let run = self.pipeline.run(call);
        let outcome = progress::relayed(&self.replies, about, reports, run).await;
        outcome.map(bus_result).map_err(|failed| failed.text)
    }

    /// The global stop: cancels the calls in flight of the stop's session,
    /// or of every session when it names none. Nothing is answered.
    pub(super) fn stop(&self, message: &Message) {
        // A stop whose session cannot be read cancels nothing: only one that
        // names no session at all is for every session.
        let session = session_of(message);
        if message.context.contains_key("session") && session.is_none() {
            return;
        }
        let cancelled = self.in_flight.stop(session);
        if cancelled > 0 {
            tracing::info!(
                session = session.unwrap_or("(all)"),
                cancelled,
                "calls cancelled by stop"
            );
        }
    }
}

/// The bus result of an answer (docs/protocol.md): the structured output
/// of a tool that declares an output schema, else `{content, is_error,
/// raw}`: the text blocks joined, and every block as the child sent it.
fn bus_result(answer: Answer) -> Value {
    if let Some(structured) = answer.structured {
        return structured;
    }
    let Value::Object(mut result) = answer.result else {
        return Value::Null;
    };
    let content = result.remove("content");
    let mut out = Map::new();
    out.insert(
        "content".to_owned(),
        Value::String(mcp::joined_text(content.as_ref())),
    );
    out.insert("is_error".to_owned(), Value::Bool(false));
    let raw = match content {
        Some(Value::Array(blocks)) => blocks,
        _ => Vec::new(),
    };
    out.insert("raw".to_owned(), Value::Array(raw));
    Value::Object(out)
}

/// The session a request belongs to (`context.session.session_id`), if it
/// names one.
pub(super) fn session_of(request: &Message) -> Option<&str> {
    request.context.get("session")?.get("session_id")?.as_str()
}

/// Who the request says sent it (`context.source`, when a string).
pub(super) fn source_of(request: &Message) -> Option<String> {
    request.context.get("source")?.as_str().map(str::to_owned)
}

/// The tool a call names (empty when it names none).
fn name_of(message: &Message) -> &str {
    message
        .data
        .get("name")
        .and_then(Value::as_str)
        .unwrap_or("")
}

/// The call arguments under `key`; absent or null means `{}`.
fn arguments(message: &Message, key: &str) -> Value {
    match message.data.get(key) {
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
    use serde_json::json;

    fn answer(result: Value) -> Answer {
        Answer {
            result,
            structured: None,
        }
    }

    #[test]
    fn results_keep_only_text_blocks_as_content_and_every_block_as_raw() {
        let image = json!({"type": "image", "data": "AA==", "mimeType": "image/png"});
        let r = json!({"content": [{"type": "text", "text": "a"}, image.clone(),
                                   {"type": "text", "text": "b"}],
                       "isError": false});
        assert_eq!(
            bus_result(answer(r)),
            json!({"content": "a\nb", "is_error": false,
                   "raw": [{"type": "text", "text": "a"}, image,
                           {"type": "text", "text": "b"}]})
        );
        assert_eq!(
            bus_result(answer(json!({}))),
            json!({"content": "", "is_error": false, "raw": []})
        );
        let structured = Answer {
            result: json!({"content": []}),
            structured: Some(json!({"sum": 5})),
        };
        assert_eq!(bus_result(structured), json!({"sum": 5}));
    }
}
