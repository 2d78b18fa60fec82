//! How a call's outcome reads on the bus: the one place where an MCP result
//! becomes an OVOS-TOOLS-1 `result`, and where every error text a caller can
//! see (`ValueError: ...`, `RuntimeError: ...`, `TimeoutError: ...`) is worded.
//! The toolbox and the child report typed outcomes; the service answers with
//! what this module makes of them.

//! Every text a caller reads: the one place where a [`Failure`] is
//! classified, for the caller's error text, the metrics and the audit log
//! alike ([`classify`]), and where every error a caller can see is worded
//! (`ValueError: ...`, `RuntimeError: ...`, `TimeoutError: ...`, as
//! OVOS-TOOLS-1 and the service it replaces word them; docs/protocol.md).
//! The toolbox and the child report typed outcomes; faces answer with what
//! this file makes of them.

use super::outcome::{Failed, Failure};
use crate::ask::AskError;
use crate::observe::Ending;
use crate::toolbox::CallError;

/// A call cancelled by the global stop (docs/protocol.md), word for word.
pub const CANCELLED_BY_STOP: &str = "CancelledError: call cancelled by stop";

/// A request without the `name` it needs.
pub const MISSING_NAME: &str = "Missing required field: 'name'";

/// A `tools/call` result that is not a JSON object.
pub const RESULT_NOT_AN_OBJECT: &str = "tools/call result is not an object";

/// A tool that asked for more input (MCP `input_required`).
pub const INPUT_REQUIRED: &str =
    "the tool asked for more input (input_required), which a bus call cannot provide";

/// A tool error result with no text in it.
pub const ERROR_WITHOUT_MESSAGE: &str = "the tool reported an error without a message";

/// A tool that declares an output schema and gave no structured output.
pub const NO_STRUCTURED_CONTENT: &str =
    "the tool declares an outputSchema but returned no structuredContent";

/// Large arguments whose check could not run (the runtime is shutting down).
pub const VALIDATION_NOT_RUN: &str = "the validation could not run; try again";

/// Large arguments whose check took longer than its `budget`.
pub fn validation_too_slow(budget: std::time::Duration) -> String {
    format!(
        "validating the arguments took longer than {} s; send smaller arguments",
        budget.as_secs()
    )
}

impl From<Failure> for Failed {
    fn from(failure: Failure) -> Failed {
        let (ending, text) = classify(&failure);
        Failed {
            failure: Box::new(failure),
            ending,
            text,
        }
    }
}

/// How `failure` ended and what the caller reads: the one classification
/// of a failed call, for the text, the metrics and the audit log alike.
pub fn classify(failure: &Failure) -> (Ending, String) {
    match failure {
        Failure::MissingName => (Ending::Invalid, MISSING_NAME.to_owned()),
        Failure::UnknownTool { name } => (Ending::Error, format!("Unknown tool: '{name}'")),
        Failure::Ambiguous { name, owners } => (Ending::Error, ambiguous(name, owners)),
        Failure::UnknownToolIn { name, toolbox } => (
            Ending::Error,
            format!("ValueError: Unknown tool '{name}' for ToolBox '{toolbox}'."),
        ),
        Failure::InvalidArguments { name, toolbox, why } => (
            Ending::Invalid,
            format!(
                "ValueError: Tool input validation failed for '{name}' in ToolBox '{toolbox}': \
                 {why}"
            ),
        ),
        Failure::Call {
            name,
            toolbox,
            error,
        } => call_error(error, name, toolbox),
        Failure::Tool { text } => (Ending::Error, text.clone()),
        Failure::InvalidOutput { name, toolbox, why } => (
            Ending::Error,
            format!(
                "ValueError: Tool output validation failed for '{name}' in ToolBox '{toolbox}': \
                 {why}"
            ),
        ),
        Failure::Overloaded {
            bytes,
            room,
            peer: None,
        } => (Ending::Busy, overloaded(*bytes, *room)),
        Failure::Overloaded {
            bytes,
            room,
            peer: Some(peer),
        } => (Ending::Busy, overloaded_peer(*bytes, peer, *room)),
        Failure::Unconfirmed { name, toolbox, why } => unconfirmed(why, name, toolbox),
        Failure::OversizeContext { bytes, max } => (
            Ending::Invalid,
            format!(
                "ValueError: the request's context is {bytes} bytes, more than the {max} bytes \
                 an answer may echo; send a smaller context"
            ),
        ),
    }
}

/// How a call that needed a person's yes ended without it, and its text:
/// why, and that it was not run.
fn unconfirmed(why: &AskError, tool: &str, toolbox: &str) -> (Ending, String) {
    match why {
        AskError::Declined => (
            Ending::Unconfirmed,
            format!(
                "PermissionError: the person declined the call of '{tool}' in toolbox \
                 '{toolbox}'; it was not run"
            ),
        ),
        AskError::Cancelled => (
            Ending::Unconfirmed,
            format!(
                "PermissionError: the person cancelled the call of '{tool}' in toolbox \
                 '{toolbox}'; it was not run"
            ),
        ),
        AskError::Unanswered { secs } => (
            Ending::Unconfirmed,
            format!(
                "TimeoutError: nobody confirmed the call of '{tool}' in toolbox '{toolbox}' \
                 within {secs} s (ask_timeout_s); it was not run. Something on the bus must \
                 answer ovos.tools.ask (the ovos-skill-toolboxd-ask skill asks by voice)"
            ),
        ),
        AskError::Stopped => (
            Ending::Cancelled,
            format!("{CANCELLED_BY_STOP} before the person confirmed it; it was not run"),
        ),
        AskError::TooMany { max } => (
            Ending::Busy,
            format!(
                "RuntimeError: toolbox '{toolbox}' has {max} questions waiting for the person \
                 already; the call of '{tool}' was not run, try again later"
            ),
        ),
        AskError::Unaskable(why) => (
            Ending::Error,
            format!("RuntimeError: the call of '{tool}' in toolbox '{toolbox}' could not be confirmed: {why}"),
        ),
    }
}

/// How a call the toolbox had no result for ended, and its text, naming
/// the tool and toolbox.
fn call_error(error: &CallError, tool: &str, toolbox: &str) -> (Ending, String) {
    match error {
        CallError::Timeout(limit) => (
            Ending::Timeout,
            format!(
                "TimeoutError: tool '{tool}' in toolbox '{toolbox}' did not answer within {} s",
                limit.as_secs()
            ),
        ),
        CallError::Exited(exit) => (
            Ending::Crash,
            format!("RuntimeError: toolbox '{toolbox}' exited ({exit}) while running '{tool}'"),
        ),
        CallError::Broken(why) => (
            Ending::Crash,
            format!("RuntimeError: toolbox '{toolbox}' failed while running '{tool}': {why}"),
        ),
        CallError::Rpc(e) => (Ending::Error, tool_error(&e.message)),
        CallError::Failed(reason) => (
            Ending::Error,
            format!("RuntimeError: toolbox '{toolbox}' is failed: {reason}"),
        ),
        CallError::Stopped => (
            Ending::Error,
            format!("RuntimeError: toolbox '{toolbox}' is stopped"),
        ),
        CallError::Busy { waiting } => (
            Ending::Busy,
            format!(
                "RuntimeError: toolbox '{toolbox}' is busy: {waiting} calls are running or \
                 waiting for it already (max_queued_calls); try again later"
            ),
        ),
        CallError::Cancelled => (Ending::Cancelled, CANCELLED_BY_STOP.to_owned()),
        CallError::TooLarge { bytes, limit } => (
            Ending::Invalid,
            format!(
                "ValueError: the call of '{tool}' in toolbox '{toolbox}' would be a {bytes}-byte \
                 request, more than the toolbox takes (max_message_bytes = {limit}); send \
                 smaller arguments, or raise max_message_bytes in its manifest"
            ),
        ),
        CallError::ArgumentsTooLarge { bytes, limit } => (
            Ending::Invalid,
            format!(
                "ValueError: Tool input validation failed for '{tool}' in ToolBox '{toolbox}': \
                 the arguments are {bytes} bytes, more than max_argument_bytes ({limit})"
            ),
        ),
    }
}

/// An answer that would not fit in one bus message, replaced by this.
pub fn oversize_answer(bytes: usize) -> String {
    format!(
        "RuntimeError: the answer would be {bytes} bytes, more than the bus's message limit \
         ({} bytes); ask for less",
        crate::bus::MAX_FRAME_BYTES
    )
}

/// A call refused because the calls in progress hold all the daemon allows
/// them (`service/admission.rs`).
fn overloaded(frame_bytes: usize, room: usize) -> String {
    format!(
        "RuntimeError: toolboxd is busy: the calls in progress hold all the room they share \
         (this call's message is {frame_bytes} bytes; all together may hold about {} MiB of \
         messages); try again later, or send a smaller message",
        room / (1024 * 1024)
    )
}

/// A call refused because its sender's calls in progress hold the share one
/// peer (`peer`: a user, or an address) may hold of the room.
fn overloaded_peer(frame_bytes: usize, peer: &str, share: usize) -> String {
    format!(
        "RuntimeError: toolboxd is busy for this client: the calls in progress from {peer} hold \
         the share of the room one client may hold (this call's message is {frame_bytes} bytes; \
         one client's calls may hold about {} MiB of messages); wait for its calls to be \
         answered, or send smaller messages",
        share / (1024 * 1024)
    )
}

/// A name several toolboxes own, on the flat namespace.
fn ambiguous(name: &str, ids: &[String]) -> String {
    let owners = ids
        .iter()
        .map(|id| format!("'{id}'"))
        .collect::<Vec<_>>()
        .join(" and ");
    format!(
        "Ambiguous tool: '{name}' is owned by toolboxes {owners}; call it with \
         ovos.persona.tools.call and data.toolbox_id to choose one"
    )
}

/// An error message in OVOS-TOOLS-1 form: the class the child reported, if its
/// text starts with one (`ValueError: ...`), else `ToolError: ...`.
pub fn tool_error(message: &str) -> String {
    if has_class_prefix(message) {
        message.to_owned()
    } else {
        format!("ToolError: {message}")
    }
}

/// Whether `text` starts with `Identifier: ` where the identifier looks like an
/// exception class (dotted path allowed, last part capitalised).
fn has_class_prefix(text: &str) -> bool {
    let Some((class, _)) = text.split_once(": ") else {
        return false;
    };
    let last = class.rsplit('.').next().unwrap_or(class);
    !class.is_empty()
        && last.starts_with(|c: char| c.is_ascii_uppercase())
        && class
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.')
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mcp::RpcError;
    use crate::process::child::ExitInfo;
    use std::time::Duration;

    fn text(failure: Failure) -> String {
        classify(&failure).1
    }

    fn of_add(error: CallError) -> (Ending, String) {
        classify(&Failure::Call {
            name: "add".into(),
            toolbox: "math".into(),
            error,
        })
    }

    #[test]
    fn error_class_is_kept_or_defaulted() {
        assert_eq!(tool_error("ValueError: bad"), "ValueError: bad");
        assert_eq!(tool_error("mod.sub.KeyError: k"), "mod.sub.KeyError: k");
        assert_eq!(
            tool_error("Error executing tool add: boom"),
            "ToolError: Error executing tool add: boom"
        );
        assert_eq!(tool_error("boom"), "ToolError: boom");
        assert_eq!(tool_error("lower: x"), "ToolError: lower: x");
        assert_eq!(tool_error("My_Error: x"), "My_Error: x");
        assert_eq!(tool_error(": x"), "ToolError: : x");
        assert_eq!(tool_error("pkg.lower: x"), "ToolError: pkg.lower: x");
        assert_eq!(tool_error("Bad-Error: x"), "ToolError: Bad-Error: x");
        assert_eq!(tool_error("ValueError:x"), "ToolError: ValueError:x");
    }

    #[test]
    fn call_errors_name_tool_toolbox_and_cause_and_end_as_they_should() {
        assert_eq!(
            of_add(CallError::Timeout(Duration::from_secs(30))),
            (
                Ending::Timeout,
                "TimeoutError: tool 'add' in toolbox 'math' did not answer within 30 s".into()
            )
        );
        assert_eq!(
            of_add(CallError::Exited(ExitInfo::Code(3))),
            (
                Ending::Crash,
                "RuntimeError: toolbox 'math' exited (code 3) while running 'add'".into()
            )
        );
        assert_eq!(
            of_add(CallError::Broken("bad line".into())),
            (
                Ending::Crash,
                "RuntimeError: toolbox 'math' failed while running 'add': bad line".into()
            )
        );
        assert_eq!(
            of_add(CallError::Failed("why".into())),
            (
                Ending::Error,
                "RuntimeError: toolbox 'math' is failed: why".into()
            )
        );
        assert_eq!(
            of_add(CallError::Stopped),
            (
                Ending::Error,
                "RuntimeError: toolbox 'math' is stopped".into()
            )
        );
        let rpc = RpcError {
            code: -32000,
            message: "KeyError: k".into(),
            data: None,
        };
        assert_eq!(
            of_add(CallError::Rpc(rpc)),
            (Ending::Error, "KeyError: k".into())
        );
        assert_eq!(
            of_add(CallError::Cancelled),
            (Ending::Cancelled, CANCELLED_BY_STOP.into())
        );
        assert_eq!(of_add(CallError::Busy { waiting: 3 }).0, Ending::Busy);
        // A request too large for the child is the caller's error.
        let (ending, text) = of_add(CallError::TooLarge {
            bytes: 10,
            limit: 5,
        });
        assert_eq!(ending, Ending::Invalid);
        assert!(text.starts_with("ValueError:") && text.contains("max_message_bytes = 5"));
        let (ending, text) = of_add(CallError::ArgumentsTooLarge {
            bytes: 10,
            limit: 5,
        });
        assert_eq!(ending, Ending::Invalid);
        assert!(text.contains("more than max_argument_bytes (5)"), "{text}");
    }

    #[test]
    fn request_errors_read_as_the_reference_words_them() {
        assert_eq!(
            text(Failure::InvalidArguments {
                name: "add".into(),
                toolbox: "math".into(),
                why: "/a: bad".into()
            }),
            "ValueError: Tool input validation failed for 'add' in ToolBox 'math': /a: bad"
        );
        assert_eq!(
            text(Failure::InvalidOutput {
                name: "add".into(),
                toolbox: "math".into(),
                why: "/sum: bad".into()
            }),
            "ValueError: Tool output validation failed for 'add' in ToolBox 'math': /sum: bad"
        );
        assert_eq!(
            text(Failure::UnknownToolIn {
                name: "mul".into(),
                toolbox: "math".into()
            }),
            "ValueError: Unknown tool 'mul' for ToolBox 'math'."
        );
        assert_eq!(
            text(Failure::UnknownTool { name: "mul".into() }),
            "Unknown tool: 'mul'"
        );
        assert_eq!(text(Failure::MissingName), MISSING_NAME);
        assert_eq!(
            text(Failure::Ambiguous {
                name: "echo".into(),
                owners: vec!["a".into(), "b".into(), "c".into()]
            }),
            "Ambiguous tool: 'echo' is owned by toolboxes 'a' and 'b' and 'c'; call it with \
             ovos.persona.tools.call and data.toolbox_id to choose one"
        );
    }

    #[test]
    fn refusals_at_the_door_are_busy_or_invalid() {
        let (ending, text) = classify(&Failure::Overloaded {
            bytes: 100,
            room: 8 << 20,
            peer: Some("uid 1000".into()),
        });
        assert_eq!(ending, Ending::Busy);
        assert!(
            text.contains("from uid 1000") && text.contains("about 8 MiB"),
            "{text}"
        );
        let (ending, text) = classify(&Failure::OversizeContext { bytes: 9, max: 8 });
        assert_eq!(ending, Ending::Invalid);
        assert!(text.starts_with("ValueError: the request's context is 9 bytes"));
    }
}
