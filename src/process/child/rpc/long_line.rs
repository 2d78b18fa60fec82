//! A child's long stdout lines, told apart without building their trees
//! (`rpc.rs` parses only those a call waits for).

use serde_json::Value;

/// The longest `notifications/message` line that is parsed and logged.
pub(super) const MAX_LOG_MESSAGE_BYTES: usize = 64 * 1024;

/// What a long line from a child is, read without building its tree.
#[derive(Debug, PartialEq)]
pub(super) enum LongLine {
    /// A notification (a method, no id).
    Notification(String),
    /// A request to toolboxd (a method and an id): refused unread.
    Request(Value),
    /// An answer (an id, no method): its id, if toolboxd could have sent it.
    Answer(Option<u64>),
    /// Not readable so: parsed as any line, for the error it has.
    Unreadable,
}

pub(super) fn peek_long(line: &[u8]) -> LongLine {
    #[derive(serde::Deserialize)]
    struct Peek<'a> {
        #[serde(borrow, default)]
        method: Option<std::borrow::Cow<'a, str>>,
        #[serde(default)]
        id: Option<Value>,
    }
    match serde_json::from_slice::<Peek>(line) {
        Ok(Peek {
            method: Some(method),
            id: None,
        }) => LongLine::Notification(method.into_owned()),
        Ok(Peek {
            method: Some(_),
            id: Some(id),
        }) => LongLine::Request(id),
        Ok(Peek {
            method: None,
            id: Some(id),
        }) => LongLine::Answer(id.as_u64()),
        _ => LongLine::Unreadable,
    }
}
