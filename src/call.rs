//! One call, as every layer reads it: what a face was asked ([`Request`]),
//! and the [`Call`] the pipeline admits it as (its toolbox found, its one
//! deadline set). Plain data: made once, passed down by reference, never
//! rebuilt; what the child is sent is taken out of it.

use serde_json::Value;
use tokio::time::Instant;

use crate::cancel::Cancel;
use crate::process::child::{ProgressSender, Questioner};
use crate::util::deadline::Deadline;

/// What a face was asked: a tool, by name (and toolbox, when named), with
/// its arguments, on behalf of a caller.
pub struct Request {
    /// The face and topic it came by (`ovos.tools.invoke`,
    /// `ovos.persona.tools.call`, ...): the audit log's `topic`.
    pub topic: String,
    /// The caller's session (OVOS `context.session.session_id`), when it
    /// names one: the audit log's `session`.
    pub session: Option<String>,
    /// Who says it sent the request (OVOS `context.source`: the MCP face
    /// and the ToolBox plugin name themselves there): the audit log's
    /// `source`. Any bus client may write anything there.
    pub source: Option<String>,
    /// The toolbox the caller named, or `None` when the tool's name alone
    /// picks it (`ovos.tools.invoke`).
    pub toolbox: Option<String>,
    /// The tool's name, as asked (empty when the request named none).
    pub tool: String,
    /// The arguments, not yet checked; taken out when the child is sent
    /// the call.
    pub arguments: Value,
    /// The size of the message that carried the request: arguments from a
    /// small one are checked at once, without measuring them.
    pub bytes: usize,
    /// When it arrived: its deadline counts from here, whatever it waits for.
    pub arrived: Instant,
    /// Fires when a stop cancels the call (the face's stop: `mycroft.stop`
    /// on the bus).
    pub cancel: Cancel,
    /// Where the child's progress for the call goes, when the face relays
    /// progress.
    pub progress: Option<ProgressSender>,
}

/// A request admitted: its toolbox found and its deadline set. Every layer
/// below the pipeline reads the call from here.
pub struct Call {
    /// What was asked.
    pub request: Request,
    /// The toolbox that has the call (hosted here).
    pub toolbox: String,
    /// The one deadline, computed when it was admitted from the toolbox's
    /// `call_timeout_s` (or the tool's own): every wait ends there.
    pub deadline: Deadline,
    /// Where its child's questions to the person go while it runs, when
    /// the toolbox's manifest lets it ask (`elicitation`).
    pub questions: Option<Questioner>,
}

impl Call {
    /// The tool's name, as asked.
    pub fn tool(&self) -> &str {
        &self.request.tool
    }
}
