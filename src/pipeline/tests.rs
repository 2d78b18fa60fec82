//! The pipeline's own pieces: a child's result made an answer.

use serde_json::json;

use super::output::answer_of;
use super::*;
use crate::mcp::ToolSpec;

fn tool(output_schema: Option<serde_json::Value>) -> Tool {
    let spec = ToolSpec {
        name: "add".into(),
        description: "adds".into(),
        input_schema: json!({"type": "object"}),
        output_schema,
        annotations: None,
    };
    Tool::compile("math", spec).expect("a tool")
}

fn text(failure: Failure) -> String {
    Failed::from(failure).text
}

#[test]
fn structured_output_is_checked_and_errors_keep_their_class() {
    let structured = tool(Some(json!({"type": "object", "properties":
        {"sum": {"type": "integer"}}, "required": ["sum"]})));
    let r = json!({"content": [{"type": "text", "text": "{\"sum\": 5}"}],
                   "structuredContent": {"sum": 5}});
    assert_eq!(
        answer_of(r, &structured, "math").unwrap().structured,
        Some(json!({"sum": 5}))
    );
    // Servers SHOULD also serialize it as text: read back from there.
    let r = json!({"content": [{"type": "text", "text": "{\"sum\": 5}"}]});
    assert_eq!(
        answer_of(r, &structured, "math").unwrap().structured,
        Some(json!({"sum": 5}))
    );
    let r = json!({"structuredContent": {"sum": "five"}});
    let failure = answer_of(r, &structured, "math").unwrap_err();
    assert!(text(failure).starts_with(
        "ValueError: Tool output validation failed for 'add' in ToolBox 'math': /sum"
    ),);
    let r = json!({"content": [{"type": "text", "text": "5 apples"}]});
    assert_eq!(
        text(answer_of(r, &structured, "math").unwrap_err()),
        "ToolError: the tool declares an outputSchema but returned no structuredContent"
    );
    let r = json!({"content": [{"type": "text", "text": "ValueError: no"}], "isError": true});
    assert_eq!(
        text(answer_of(r, &structured, "math").unwrap_err()),
        "ValueError: no"
    );
}

#[test]
fn results_that_no_face_can_read_are_tool_errors() {
    let plain = tool(None);
    assert_eq!(
        text(answer_of(json!({"content": [], "isError": true}), &plain, "math").unwrap_err()),
        "ToolError: the tool reported an error without a message"
    );
    assert_eq!(
        text(answer_of(json!([]), &plain, "math").unwrap_err()),
        "ToolError: tools/call result is not an object"
    );
    let r = json!({"resultType": "input_required", "inputRequests": {}});
    assert!(text(answer_of(r, &plain, "math").unwrap_err()).starts_with("ToolError:"));
    let answer = answer_of(json!({"content": []}), &plain, "math").unwrap();
    assert_eq!(answer.structured, None);
    assert_eq!(answer.result, json!({"content": []}));
}
