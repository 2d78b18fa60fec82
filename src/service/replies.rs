//! Where the bus face's answers go out: every answer is the response
//! derivation of its request (docs/protocol.md), kept within one bus
//! message.

use serde_json::Value;
use tokio::sync::mpsc;

use crate::bus::envelope::{Message, Object};
use crate::pipeline::texts;

/// The frames the bus face sends. Cheap to clone.
#[derive(Clone)]
pub(crate) struct Replies {
    /// Encoded frames to send on the bus.
    out: mpsc::UnboundedSender<String>,
}

impl Replies {
    /// Replies sent on `out`.
    pub(crate) fn new(out: mpsc::UnboundedSender<String>) -> Replies {
        Replies { out }
    }

    /// Sends a frame as it is (progress messages).
    pub(crate) fn send(&self, frame: String) {
        let _ = self.out.send(frame);
    }

    /// Answers `request` with `data`.
    pub(crate) fn respond(&self, request: &Message, data: Object) {
        self.send_answer(request, request.encode_response(&data));
    }

    /// Sends an answer to `request`; one that would not fit in a bus message
    /// is replaced by an error saying so.
    pub(crate) fn send_answer(&self, request: &Message, frame: String) {
        if frame.len() <= crate::bus::MAX_FRAME_BYTES {
            return self.send(frame);
        }
        tracing::warn!(
            topic = %request.msg_type,
            bytes = frame.len(),
            "an answer larger than the bus's message limit was replaced by an error"
        );
        let error = texts::oversize_answer(frame.len());
        self.respond(request, error_data(request, error));
    }
}

/// An error answer's data: the error, with the request's `name` and
/// `toolbox_id` (when short) so the caller can tell what it answers.
pub(crate) fn error_data(request: &Message, error: String) -> Object {
    let mut data = Object::new();
    for key in ["name", "toolbox_id"] {
        if let Some(Value::String(v)) = request.data.get(key) {
            if v.len() <= 256 {
                data.insert(key.to_owned(), Value::String(v.clone()));
            }
        }
    }
    data.insert("error".to_owned(), Value::String(error));
    data
}
