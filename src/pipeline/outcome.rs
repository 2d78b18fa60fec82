//! How a call ends, as one typed value every face renders: an [`Answer`]
//! (the child's result, its output checked), or a [`Failed`] call (why, as
//! a [`Failure`], with its ending and its text, classified once in
//! `texts.rs`). Plain data.

use serde_json::Value;

use crate::observe::Ending;
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
    /// It needed a person's yes and did not get it (`why`); the child
    /// never saw it.
    Unconfirmed {
        name: String,
        toolbox: String,
        why: crate::ask::AskError,
    },
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
