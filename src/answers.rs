//! How a call's outcome reads on the bus: the one place where an MCP result
//! becomes an OVOS-TOOLS-1 `result`, and where every error text a caller can
//! see (`ValueError: ...`, `RuntimeError: ...`, `TimeoutError: ...`) is worded.
//! The toolbox and the child report typed outcomes; the service answers with
//! what this module makes of them.

use serde_json::{Map, Value};

use crate::mcp::RpcError;
use crate::toolbox::CallError;

/// A call cancelled by the global stop (DESIGN §6), word for word.
pub const CANCELLED_BY_STOP: &str = "CancelledError: call cancelled by stop";

/// The error for a call that produced no result, naming the tool and toolbox.
pub fn call_error(error: &CallError, tool: &str, toolbox: &str) -> String {
    match error {
        CallError::Timeout(limit) => format!(
            "TimeoutError: tool '{tool}' in toolbox '{toolbox}' did not answer within {} s",
            limit.as_secs()
        ),
        CallError::Exited(exit) => {
            format!("RuntimeError: toolbox '{toolbox}' exited ({exit}) while running '{tool}'")
        }
        CallError::Broken(why) => {
            format!("RuntimeError: toolbox '{toolbox}' failed while running '{tool}': {why}")
        }
        CallError::Rpc(e) => rpc_error_text(e),
        CallError::Failed(reason) => failed(toolbox, reason),
        CallError::Stopped => format!("RuntimeError: toolbox '{toolbox}' is stopped"),
        CallError::Busy { waiting } => format!(
            "RuntimeError: toolbox '{toolbox}' is busy: {waiting} calls are running or waiting \
             for it already (max_queued_calls); try again later"
        ),
        CallError::Cancelled => CANCELLED_BY_STOP.to_owned(),
        CallError::TooLarge { bytes, limit } => format!(
            "ValueError: the call of '{tool}' in toolbox '{toolbox}' would be a {bytes}-byte \
             request, more than the toolbox takes (max_message_bytes = {limit}); send smaller \
             arguments, or raise max_message_bytes in its manifest"
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

/// A request whose context is too large to echo in its answer.
pub fn oversize_context(bytes: usize, max: usize) -> String {
    format!(
        "ValueError: the request's context is {bytes} bytes, more than the {max} bytes an \
         answer may echo; send a smaller context"
    )
}

/// A call refused because the calls in progress hold all the daemon allows
/// them (`service/refusals.rs`).
pub fn overloaded(frame_bytes: usize, room: usize) -> String {
    format!(
        "RuntimeError: toolboxd is busy: the calls in progress hold all the room they share \
         (this call's message is {frame_bytes} bytes; all together may hold about {} MiB of \
         messages); try again later, or send a smaller message",
        room / (1024 * 1024)
    )
}

/// A call refused because its sender's calls in progress hold the share one
/// peer (`peer`: a user, or an address) may hold of the room.
pub fn overloaded_peer(frame_bytes: usize, peer: &str, share: usize) -> String {
    format!(
        "RuntimeError: toolboxd is busy for this client: the calls in progress from {peer} hold \
         the share of the room one client may hold (this call's message is {frame_bytes} bytes; \
         one client's calls may hold about {} MiB of messages); wait for its calls to be \
         answered, or send smaller messages",
        share / (1024 * 1024)
    )
}

/// A call to a `failed` toolbox.
pub fn failed(toolbox: &str, reason: &str) -> String {
    format!("RuntimeError: toolbox '{toolbox}' is failed: {reason}")
}

/// Arguments that fail the tool's argument schema (`why`: pointers and reasons).
pub fn invalid_arguments(tool: &str, toolbox: &str, why: &str) -> String {
    format!("ValueError: Tool input validation failed for '{tool}' in ToolBox '{toolbox}': {why}")
}

/// A result that fails the tool's output schema.
pub fn invalid_output(tool: &str, toolbox: &str, why: &str) -> String {
    format!("ValueError: Tool output validation failed for '{tool}' in ToolBox '{toolbox}': {why}")
}

/// A persona call naming a tool the toolbox does not list.
pub fn unknown_tool_in(tool: &str, toolbox: &str) -> String {
    format!("ValueError: Unknown tool '{tool}' for ToolBox '{toolbox}'.")
}

/// A tool-service request naming a tool no listed toolbox owns.
pub fn unknown_tool(tool: &str) -> String {
    format!("Unknown tool: '{tool}'")
}

/// A request without the `name` it needs.
pub const MISSING_NAME: &str = "Missing required field: 'name'";

/// A name several toolboxes own, on the flat namespace.
pub fn ambiguous(name: &str, ids: &[String]) -> String {
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

/// Maps a `tools/call` result to the bus result (docs/protocol.md), or to the
/// `Class: message` error text.
pub fn map_call_result(result: Value, has_output_schema: bool) -> Result<Value, String> {
    let Value::Object(mut result) = result else {
        return Err("ToolError: tools/call result is not an object".to_owned());
    };
    if result.get("resultType").and_then(Value::as_str) == Some("input_required") {
        return Err(
            "ToolError: the tool asked for more input (input_required), which a bus call cannot \
             provide"
                .to_owned(),
        );
    }
    let content = match result.remove("content") {
        Some(Value::Array(blocks)) => blocks,
        _ => Vec::new(),
    };
    let text = joined_text(&content);
    if result.get("isError").and_then(Value::as_bool) == Some(true) {
        return Err(error_text(if text.is_empty() {
            "the tool reported an error without a message"
        } else {
            &text
        }));
    }
    if has_output_schema {
        return match result.remove("structuredContent") {
            Some(structured) => Ok(structured),
            // Servers SHOULD also serialize structured output as text.
            None => serde_json::from_str(&text).map_err(|_| {
                "ToolError: the tool declares an outputSchema but returned no structuredContent"
                    .to_owned()
            }),
        };
    }
    let mut out = Map::new();
    out.insert("content".to_owned(), Value::String(text));
    out.insert("is_error".to_owned(), Value::Bool(false));
    out.insert("raw".to_owned(), Value::Array(content));
    Ok(Value::Object(out))
}

fn joined_text(blocks: &[Value]) -> String {
    blocks
        .iter()
        .filter(|b| b.get("type").and_then(Value::as_str) == Some("text"))
        .filter_map(|b| b.get("text").and_then(Value::as_str))
        .collect::<Vec<_>>()
        .join("\n")
}

/// An error message in OVOS-TOOLS-1 form: the class the child reported, if its
/// text starts with one (`ValueError: ...`), else `ToolError: ...`.
pub fn error_text(message: &str) -> String {
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

/// The error text for a JSON-RPC error answering `tools/call`.
pub fn rpc_error_text(error: &RpcError) -> String {
    error_text(&error.message)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn error_class_is_kept_or_defaulted() {
        assert_eq!(error_text("ValueError: bad"), "ValueError: bad");
        assert_eq!(error_text("mod.sub.KeyError: k"), "mod.sub.KeyError: k");
        assert_eq!(
            error_text("Error executing tool add: boom"),
            "ToolError: Error executing tool add: boom"
        );
        assert_eq!(error_text("boom"), "ToolError: boom");
        assert_eq!(error_text("lower: x"), "ToolError: lower: x");
    }

    #[test]
    fn maps_structured_generic_and_error_results() {
        let r = json!({"content": [{"type": "text", "text": "{\"sum\": 5}"}],
                       "structuredContent": {"sum": 5}});
        assert_eq!(map_call_result(r, true), Ok(json!({"sum": 5})));
        let r = json!({"content": [{"type": "text", "text": "{\"sum\": 5}"}]});
        assert_eq!(map_call_result(r, true), Ok(json!({"sum": 5})));
        let r = json!({"content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]});
        let out = map_call_result(r, false).unwrap();
        assert_eq!(out["content"], "a\nb");
        assert_eq!(out["is_error"], false);
        assert_eq!(out["raw"].as_array().unwrap().len(), 2);
        let r = json!({"content": [{"type": "text", "text": "ValueError: no"}], "isError": true});
        assert_eq!(map_call_result(r, true), Err("ValueError: no".to_owned()));
        let r = json!({"resultType": "input_required", "inputRequests": {}});
        assert!(map_call_result(r, false)
            .unwrap_err()
            .starts_with("ToolError:"));
    }

    #[test]
    fn ambiguity_names_every_owner_and_the_way_out() {
        let e = ambiguous("echo", &["math".into(), "shell".into()]);
        assert!(e.contains("'math' and 'shell'") && e.contains("ovos.persona.tools.call"));
    }

    #[test]
    fn call_errors_name_tool_toolbox_and_cause() {
        use crate::process::child::ExitInfo;
        use std::time::Duration;
        let text = |e: CallError| call_error(&e, "add", "math");
        assert_eq!(
            text(CallError::Timeout(Duration::from_secs(30))),
            "TimeoutError: tool 'add' in toolbox 'math' did not answer within 30 s"
        );
        assert_eq!(
            text(CallError::Exited(ExitInfo::Code(3))),
            "RuntimeError: toolbox 'math' exited (code 3) while running 'add'"
        );
        assert_eq!(
            text(CallError::Broken("bad line".into())),
            "RuntimeError: toolbox 'math' failed while running 'add': bad line"
        );
        assert_eq!(
            text(CallError::Failed("why".into())),
            "RuntimeError: toolbox 'math' is failed: why"
        );
        assert_eq!(
            text(CallError::Stopped),
            "RuntimeError: toolbox 'math' is stopped"
        );
        let rpc = RpcError {
            code: -32000,
            message: "KeyError: k".into(),
            data: None,
        };
        assert_eq!(text(CallError::Rpc(rpc)), "KeyError: k");
    }

    #[test]
    fn request_errors_read_as_the_reference_words_them() {
        assert_eq!(
            invalid_arguments("add", "math", "/a: bad"),
            "ValueError: Tool input validation failed for 'add' in ToolBox 'math': /a: bad"
        );
        assert_eq!(
            invalid_output("add", "math", "/sum: bad"),
            "ValueError: Tool output validation failed for 'add' in ToolBox 'math': /sum: bad"
        );
        assert_eq!(
            unknown_tool_in("mul", "math"),
            "ValueError: Unknown tool 'mul' for ToolBox 'math'."
        );
        assert_eq!(unknown_tool("mul"), "Unknown tool: 'mul'");
        assert_eq!(
            failed("math", "spent"),
            "RuntimeError: toolbox 'math' is failed: spent"
        );
        assert_eq!(
            ambiguous("echo", &["a".into(), "b".into(), "c".into()]),
            "Ambiguous tool: 'echo' is owned by toolboxes 'a' and 'b' and 'c'; call it with \
             ovos.persona.tools.call and data.toolbox_id to choose one"
        );
    }

    #[test]
    fn results_keep_only_text_blocks_as_content_and_every_block_as_raw() {
        let image = json!({"type": "image", "data": "AA==", "mimeType": "image/png"});
        let r = json!({"content": [{"type": "text", "text": "a"}, image.clone(),
                                   {"type": "text", "text": "b"}],
                       "isError": false});
        assert_eq!(
            map_call_result(r, false),
            Ok(json!({"content": "a\nb", "is_error": false,
                      "raw": [{"type": "text", "text": "a"}, image,
                              {"type": "text", "text": "b"}]}))
        );
        assert_eq!(
            map_call_result(json!({}), false),
            Ok(json!({"content": "", "is_error": false, "raw": []}))
        );
        assert_eq!(
            map_call_result(json!({"content": [], "isError": true}), false),
            Err("ToolError: the tool reported an error without a message".to_owned())
        );
        assert_eq!(
            map_call_result(json!([]), false),
            Err("ToolError: tools/call result is not an object".to_owned())
        );
        assert_eq!(
            map_call_result(
                json!({"content": [{"type": "text", "text": "5 apples"}]}),
                true
            ),
            Err(
                "ToolError: the tool declares an outputSchema but returned no structuredContent"
                    .to_owned()
            )
        );
    }

    #[test]
    fn class_prefixes_are_identifiers() {
        assert_eq!(error_text("My_Error: x"), "My_Error: x");
        assert_eq!(error_text(": x"), "ToolError: : x");
        assert_eq!(error_text("pkg.lower: x"), "ToolError: pkg.lower: x");
        assert_eq!(error_text("Bad-Error: x"), "ToolError: Bad-Error: x");
        assert_eq!(error_text("ValueError:x"), "ToolError: ValueError:x");
    }
}
