//! A child's `tools/call` result made an [`Answer`]: an error the tool
//! reported is a failure, and a tool that declares an output schema must
//! give a structured output that passes it (docs/protocol.md).

use serde_json::Value;

use super::outcome::{Answer, Failure};
use super::texts;
use crate::mcp;
use crate::tool::Tool;

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
