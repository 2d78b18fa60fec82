//! How a call ended, as every sink of [`super`] reads it: its
//! [`Ending`] and the [`Finished`] record.

use std::time::Duration;

use serde_json::Value;

/// How a call ended: the `outcome` label of the calls metric and the audit
/// log's `outcome` field.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Ending {
    /// Answered with a result.
    Ok,
    /// Answered with an error: the tool's own, a JSON-RPC error, an output
    /// that fails its schema, a toolbox that is failed or stopped.
    Error,
    /// The arguments failed the tool's schema: the child never saw the call.
    Invalid,
    /// The deadline passed (waiting for a child included).
    Timeout,
    /// The child exited, or broke the protocol, while it had the call.
    Crash,
    /// Cancelled before it was answered.
    Cancelled,
    /// Refused at once: too many calls wait for the toolbox already.
    Busy,
    /// It waited for a person's yes and did not get it (declined,
    /// cancelled, unanswered): the child never saw it.
    Unconfirmed,
}

impl Ending {
    /// Every outcome, in the order metrics list them.
    pub const ALL: [Ending; 8] = [
        Ending::Ok,
        Ending::Error,
        Ending::Invalid,
        Ending::Timeout,
        Ending::Crash,
        Ending::Cancelled,
        Ending::Busy,
        Ending::Unconfirmed,
    ];

    /// The outcome's name, as metrics and the audit log write it.
    pub fn name(self) -> &'static str {
        match self {
            Ending::Ok => "ok",
            Ending::Error => "error",
            Ending::Invalid => "invalid",
            Ending::Timeout => "timeout",
            Ending::Crash => "crash",
            Ending::Cancelled => "cancelled",
            Ending::Busy => "busy",
            Ending::Unconfirmed => "unconfirmed",
        }
    }
}

/// One call, as it finished.
pub struct Finished<'a> {
    /// The toolbox that had it (empty when the request named none that
    /// this daemon has).
    pub toolbox: &'a str,
    /// The tool, as the catalog knows it (never an unknown name).
    pub tool: &'a str,
    /// How it ended.
    pub outcome: Ending,
    /// From its arrival to its answer.
    pub took: Duration,
    /// The topic (or face and method) it came by, for the audit log.
    pub topic: &'a str,
    /// The caller's session, for the audit log.
    pub session: Option<&'a str>,
    /// Who the request says sent it (the face, for toolboxd's own), for
    /// the audit log.
    pub source: Option<&'a str>,
    /// The error text the caller read.
    pub error: Option<&'a str>,
    /// The arguments, when the audit log records them for this toolbox.
    pub arguments: Option<&'a Value>,
    /// The result (structured output, else the MCP result), when the audit
    /// log records arguments for this toolbox.
    pub result: Option<&'a Value>,
}
