//! How a call ends, as one typed value every face renders: an [`Answer`]
//! (the child's result, its output checked), or a [`Failed`] call (why, as
//! a [`Failure`], with its ending and its text, classified once in
//! `texts.rs`).

use serde_json::Value;

use super::texts;
use crate::mcp;
use crate::observe::Ending;
use crate::tool::Tool;
use crate::toolbox::CallError;

/// How a call ended.
pub type Outcome = Result<Answer, Failed>;

/// A call answered with a result.
#[derive(Debug)]
pub struct Answer {
    /// The child's `tools/call` result (MCP, an object), as it sent it:
    /// `content`, and `structuredContent` when it gave one.
    pub result: Value,
    /// The tool's structured output, checked against its `outputSchema`:
    /// present exactly when the tool declares one.
    pub structured: Option<Value>,
}

/// Why a call has no result.
#[derive(Debug)]
pub enum Failure {
    /// The request named no tool.
    MissingName,
    /// No listed toolbox owns a tool of this name (the flat namespace).
    UnknownTool { name: String },
    /// Several listed toolboxes own a tool of this name (the flat namespace).
    Ambiguous { name: String, owners: Vec<String> },
    /// The toolbox the caller named lists no tool of this name.
    UnknownToolIn { name: String, toolbox: String },
    /// The arguments fail the tool's argument schema (`why`: JSON Pointers
    /// and reasons); the child never saw the call.
    InvalidArguments {
        name: String,
        toolbox: String,
        why: String,
    },
    /// The toolbox had no result for the call: it refused it (busy,
    /// stopped, failed, too large) or its child did not answer it.
    Call {
        name: String,
        toolbox: String,
        error: CallError,
    },
    /// The child answered with an error of the tool's, or with a result no
    /// face can read (`text`: already `Class: message`).
    Tool { text: String },
    /// The tool's output fails its output schema: never passed on.
    InvalidOutput {
        name: String,
        toolbox: String,
        why: String,
    },
    /// Refused at the door: the calls in progress hold all the room their
    /// requests may share (`peer`: the share of this sender's, when that is
    /// what is full).
    Overloaded {
        bytes: usize,
        room: usize,
        peer: Option<String>,
    },
    /// Refused at the door: its context is too large to echo in an answer.
    OversizeContext { bytes: usize, max: usize },
}

/// A failure, classified: how it ended and what the caller reads.
#[derive(Debug)]
pub struct Failed {
    /// Why (boxed: a failure is the rare, large case of an outcome).
    pub failure: Box<Failure>,
    /// How it ended, for the metrics and the audit log.
    pub ending: Ending,
    /// The error text (OVOS-TOOLS-1 words: `Class: message`).
    pub text: String,
}

impl From<Failure> for Failed {
    fn from(failure: Failure) -> Failed {
        let (ending, text) = texts::classify(&failure);
        Failed {
            failure: Box::new(failure),
            ending,
            text,
        }
    }
}

/// The answer a child's `tools/call` result makes for `tool`: an error the
/// tool reported is a failure; a tool that declares an output schema must
/// give a structured output that passes it.
pub fn answer_of(result: Value, tool: &Tool, toolbox: &str) -> Result<Answer, Failure> {
    let tool_error = |text: &str| Failure::Tool {
        text: texts::tool_error(text),
    };
    let Value::Object(result) = result else {
        return Err(tool_error(texts::RESULT_NOT_AN_OBJECT));
    };
    if result.get("resultType").and_then(Value::as_str) == Some("input_required") {
        return Err(tool_error(texts::INPUT_REQUIRED));
    }
    let text = || mcp::joined_text(result.get("content"));
    if result.get("isError").and_then(Value::as_bool) == Some(true) {
        let text = text();
        let text = if text.is_empty() {
            texts::ERROR_WITHOUT_MESSAGE
        } else {
            &text
        };
        return Err(tool_error(text));
    }
    if !tool.has_output_schema {
        return Ok(Answer {
            result: Value::Object(result),
            structured: None,
        });
    }
    // Servers SHOULD also serialize structured output as text.
    let structured = match result.get("structuredContent") {
        Some(structured) => structured.clone(),
        None => {
            serde_json::from_str(&text()).map_err(|_| tool_error(texts::NO_STRUCTURED_CONTENT))?
        }
    };
    tool.check_output(&structured)
        .map_err(|why| Failure::InvalidOutput {
            name: tool.name.clone(),
            toolbox: toolbox.to_owned(),
            why,
        })?;
    Ok(Answer {
        result: Value::Object(result),
        structured: Some(structured),
    })
}
