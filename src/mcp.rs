//! The protocol model: JSON-RPC 2.0 framing and the MCP types toolboxd uses.
//!
//! Pure data and pure functions: nothing here touches a process or a socket.
//! The transport is [`crate::process::child`]; the conversation is [`crate::session`].

use serde::Serialize;
use serde_json::{json, Value};

mod progress;
mod task;

pub use progress::{parse_progress, Progress};
pub use task::{
    created_task, legacy_tasks, task_state, task_support, LegacyTasks, TaskState, TaskStatus,
    TaskSupport, TASKS_EXTENSION,
};

/// JSON-RPC "method not found".
pub const METHOD_NOT_FOUND: i64 = -32601;
/// MCP (modern era) "unsupported protocol version".
pub const UNSUPPORTED_PROTOCOL_VERSION: i64 = -32022;

/// The code of "unsupported protocol version" in the drafts before the
/// `2026-07-28` revision settled on [`UNSUPPORTED_PROTOCOL_VERSION`].
pub const UNSUPPORTED_PROTOCOL_VERSION_DRAFT: i64 = -32004;

/// Whether a JSON-RPC error code says "unsupported protocol version" (the
/// final code, or the drafts').
pub fn is_unsupported_version(code: i64) -> bool {
    code == UNSUPPORTED_PROTOCOL_VERSION || code == UNSUPPORTED_PROTOCOL_VERSION_DRAFT
}

/// What toolboxd tells a server about itself.
pub const CLIENT_NAME: &str = "toolboxd";

/// A JSON-RPC error object.
#[derive(Debug, Clone, PartialEq)]
pub struct RpcError {
    /// The JSON-RPC error code.
    pub code: i64,
    /// The human-readable message.
    pub message: String,
    /// Extra detail the server attached, if any.
    pub data: Option<Value>,
}

/// One line received from a child, classified.
#[derive(Debug, PartialEq)]
pub enum Incoming {
    /// An answer to one of our requests. `id` is `None` when the id is not one
    /// toolboxd could have sent (not an unsigned integer).
    Response {
        id: Option<u64>,
        result: Result<Value, RpcError>,
    },
    /// A request from the child to us.
    Request {
        id: Value,
        method: String,
        params: Value,
    },
    /// A notification from the child.
    Notification { method: String, params: Value },
}

/// Why a line from a child is not JSON-RPC.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum FrameError {
    #[error("not JSON: {0}")]
    NotJson(String),
    #[error("not a JSON-RPC message (an object with a method, or an id with a result or error)")]
    NotJsonRpc,
    /// JSON-RPC that toolboxd cannot use and must not ignore, since a call
    /// may be waiting for it: a batch, or a message nested too deep to read.
    #[error("{0}")]
    Unusable(&'static str),
}

/// Parses one line of a child's stdout.
pub fn parse_line(line: &[u8]) -> Result<Incoming, FrameError> {
    let value: Value = serde_json::from_slice(line).map_err(|e| {
        if e.to_string().starts_with("recursion limit exceeded") {
            FrameError::Unusable("a message nested too deep to read (over 128 levels)")
        } else {
            FrameError::NotJson(e.to_string())
        }
    })?;
    let mut obj = match value {
        Value::Object(obj) => obj,
        Value::Array(items) if items.iter().any(|i| i.get("jsonrpc").is_some()) => {
            return Err(FrameError::Unusable(
                "a JSON-RPC batch, which the MCP stdio transport does not use",
            ))
        }
        _ => return Err(FrameError::NotJsonRpc),
    };
    let params = obj.remove("params").unwrap_or(Value::Null);
    match (obj.remove("method"), obj.remove("id")) {
        (Some(Value::String(method)), Some(id)) if !id.is_null() => {
            Ok(Incoming::Request { id, method, params })
        }
        (Some(Value::String(method)), _) => Ok(Incoming::Notification { method, params }),
        (None, Some(id)) => {
            let result = if let Some(error) = obj.remove("error") {
                Err(rpc_error_from(error))
            } else if let Some(result) = obj.remove("result") {
                Ok(result)
            } else {
                return Err(FrameError::NotJsonRpc);
            };
            Ok(Incoming::Response {
                // Some servers echo ids as strings: "7" answers request 7.
                id: id.as_u64().or_else(|| id.as_str()?.parse().ok()),
                result,
            })
        }
        _ => Err(FrameError::NotJsonRpc),
    }
}

/// Reads a JSON-RPC error object (missing fields read as 0 and "").
pub fn rpc_error_from(error: Value) -> RpcError {
    RpcError {
        code: error.get("code").and_then(Value::as_i64).unwrap_or(0),
        message: error
            .get("message")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_owned(),
        data: error.get("data").cloned(),
    }
}

fn line(value: &impl Serialize) -> Vec<u8> {
    // invariant: JSON values and plain structs of them always serialize.
    let mut out = serde_json::to_vec(value).unwrap_or_default();
    out.push(b'\n');
    out
}

/// One request line, newline-terminated; `params` are serialized in place,
/// never copied into a JSON tree first.
pub fn request_line<P: Serialize + ?Sized>(id: u64, method: &str, params: &P) -> Vec<u8> {
    #[derive(Serialize)]
    struct Request<'a, P: ?Sized> {
        jsonrpc: &'static str,
        id: u64,
        method: &'a str,
        params: &'a P,
    }
    line(&Request {
        jsonrpc: "2.0",
        id,
        method,
        params,
    })
}

/// One notification line, newline-terminated.
pub fn notification_line(method: &str, params: &Value) -> Vec<u8> {
    if params.is_null() {
        line(&json!({"jsonrpc": "2.0", "method": method}))
    } else {
        line(&json!({"jsonrpc": "2.0", "method": method, "params": params}))
    }
}

/// One response line answering a request from the child.
pub fn response_line(id: &Value, result: Result<Value, (i64, &str)>) -> Vec<u8> {
    match result {
        Ok(result) => line(&json!({"jsonrpc": "2.0", "id": id, "result": result})),
        Err((code, message)) => line(&json!({"jsonrpc": "2.0", "id": id,
                                            "error": {"code": code, "message": message}})),
    }
}

/// The MCP era a child speaks (docs/protocol.md).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Era {
    /// Stateless: every request carries `_meta` with this protocol version.
    Modern(String),
    /// Session after `initialize` negotiated this protocol version.
    Legacy(String),
}

impl std::fmt::Display for Era {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Era::Modern(v) => write!(f, "modern MCP {v}"),
            Era::Legacy(v) => write!(f, "legacy MCP {v}"),
        }
    }
}

impl Era {
    /// The negotiated protocol version.
    pub fn version(&self) -> &str {
        match self {
            Era::Modern(v) | Era::Legacy(v) => v,
        }
    }
}

/// The `_meta` a modern request carries.
pub fn modern_meta(version: &str) -> Value {
    json!({
        "io.modelcontextprotocol/protocolVersion": version,
        "io.modelcontextprotocol/clientCapabilities": {},
        "io.modelcontextprotocol/clientInfo": client_info(),
    })
}

/// The `_meta` of a modern `tools/call` and of the task requests that
/// follow it: [`modern_meta`], with the tasks extension declared, since
/// toolboxd follows a task the server answers with (docs/protocol.md).
pub fn modern_call_meta(version: &str) -> Value {
    let mut meta = modern_meta(version);
    meta["io.modelcontextprotocol/clientCapabilities"] =
        json!({"extensions": {TASKS_EXTENSION: {}}});
    meta
}

/// Who toolboxd is, as MCP `Implementation`.
pub fn client_info() -> Value {
    json!({"name": CLIENT_NAME, "version": env!("CARGO_PKG_VERSION")})
}

/// A tool as a child lists it (MCP `Tool`), before its schemas are compiled.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolSpec {
    /// Unique within the toolbox.
    pub name: String,
    /// For the model; empty when the child gave none.
    pub description: String,
    /// JSON Schema of the arguments.
    pub input_schema: Value,
    /// JSON Schema of `structuredContent`, when the tool declares one.
    pub output_schema: Option<Value>,
    /// Its annotations (`title` and the four hints), when it has any: only
    /// those keys, of their types, the title bounded ([`annotations_of`]).
    pub annotations: Option<Value>,
}

/// The longest annotation title kept, in bytes.
pub const MAX_TITLE_BYTES: usize = 256;

/// The annotations of listed tool `tool`: its `annotations` object's
/// `title` (a string of at most [`MAX_TITLE_BYTES`]; the tool's own
/// `title` when the object has none) and its boolean hints. Anything else a
/// child puts there is left out, so no child bloats every listing with it.
pub fn annotations_of(tool: &Value) -> Option<Value> {
    let given = tool.get("annotations").and_then(Value::as_object);
    let mut annotations = serde_json::Map::new();
    let title = given
        .and_then(|a| a.get("title"))
        .or_else(|| tool.get("title"))
        .and_then(Value::as_str)
        .filter(|t| t.len() <= MAX_TITLE_BYTES);
    if let Some(title) = title {
        annotations.insert("title".to_owned(), Value::from(title));
    }
    for hint in [
        "readOnlyHint",
        "destructiveHint",
        "idempotentHint",
        "openWorldHint",
    ] {
        if let Some(value) = given.and_then(|a| a.get(hint)).filter(|v| v.is_boolean()) {
            annotations.insert(hint.to_owned(), value.clone());
        }
    }
    (!annotations.is_empty()).then_some(Value::Object(annotations))
}

/// Reads the `tools` array of a `tools/list` result and its `nextCursor`.
/// Entries that are not tools are returned as errors so they can be logged.
pub fn parse_tools_page(result: &Value) -> (Vec<Result<ToolSpec, String>>, Option<String>) {
    let cursor = result
        .get("nextCursor")
        .and_then(Value::as_str)
        .filter(|c| !c.is_empty())
        .map(str::to_owned);
    let Some(tools) = result.get("tools").and_then(Value::as_array) else {
        return (
            vec![Err("tools/list result has no \"tools\" array".to_owned())],
            None,
        );
    };
    let specs = tools
        .iter()
        .map(|t| {
            let name = t
                .get("name")
                .and_then(Value::as_str)
                .filter(|n| !n.is_empty())
                .ok_or_else(|| format!("a listed tool has no name: {}", json_one_line(t)))?;
            let input_schema = t
                .get("inputSchema")
                .filter(|s| s.is_object() || s.is_boolean())
                .cloned()
                .ok_or_else(|| format!("tool {name:?} has no inputSchema object"))?;
            Ok(ToolSpec {
                name: name.to_owned(),
                description: t
                    .get("description")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_owned(),
                input_schema,
                output_schema: t
                    .get("outputSchema")
                    .filter(|s| s.is_object() || s.is_boolean())
                    .cloned(),
                annotations: annotations_of(t),
            })
        })
        .collect();
    (specs, cursor)
}

/// A tool list as one text: equal for equal lists (to tell whether a
/// listing changed without keeping the listing).
pub fn tools_fingerprint(specs: &[ToolSpec]) -> String {
    Value::Array(specs.iter().map(tool_definition).collect()).to_string()
}

/// `spec` as an MCP `Tool` object: what [`parse_tools_page`] reads back.
pub fn tool_definition(spec: &ToolSpec) -> Value {
    let mut tool = serde_json::Map::new();
    tool.insert("name".to_owned(), Value::String(spec.name.clone()));
    tool.insert(
        "description".to_owned(),
        Value::String(spec.description.clone()),
    );
    tool.insert("inputSchema".to_owned(), spec.input_schema.clone());
    if let Some(output) = &spec.output_schema {
        tool.insert("outputSchema".to_owned(), output.clone());
    }
    if let Some(annotations) = &spec.annotations {
        tool.insert("annotations".to_owned(), annotations.clone());
    }
    Value::Object(tool)
}

/// `value` as JSON text fit for one log line: JSON escapes the C0 controls
/// in strings; DEL and the C1 controls (a terminal may take U+009B for an
/// escape) are escaped here too, as `\u00XX`, so the text stays JSON.
fn json_one_line(value: &Value) -> String {
    let text = value.to_string();
    if !text.chars().any(char::is_control) {
        return text;
    }
    let mut out = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        if c.is_control() {
            out.push_str(&format!("\\u{:04x}", u32::from(c)));
        } else {
            out.push(c);
        }
    }
    out
}

/// The output schema of a tool that declares none: the shape of the OVOS MCP
/// adapter's `AdapterToolOutput` (ovos-tool-adapters).
pub fn generic_output_schema() -> Value {
    json!({
        "title": "AdapterToolOutput",
        "type": "object",
        "properties": {
            "content": {"type": "string", "default": "", "title": "Content",
                        "description": "Concatenated text content from the server response."},
            "is_error": {"type": "boolean", "default": false, "title": "Is Error",
                         "description": "True if the server reported an error."},
            "raw": {"type": "array", "title": "Raw",
                    "items": {"type": "object", "additionalProperties": true},
                    "description": "Original content blocks from the server response."}
        }
    })
}

/// The text blocks of a `tools/call` result's `content`, joined by
/// newlines (other blocks, and a `content` that is not an array, give none).
pub fn joined_text(content: Option<&Value>) -> String {
    let Some(Value::Array(blocks)) = content else {
        return String::new();
    };
    blocks
        .iter()
        .filter(|b| b.get("type").and_then(Value::as_str) == Some("text"))
        .filter_map(|b| b.get("text").and_then(Value::as_str))
        .collect::<Vec<_>>()
        .join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn annotations_keep_the_title_and_the_boolean_hints_only() {
        let tool = json!({"name": "t", "title": "Top title",
                          "annotations": {"readOnlyHint": true, "destructiveHint": "yes",
                                          "openWorldHint": false, "bloat": "x".repeat(100)}});
        assert_eq!(
            annotations_of(&tool),
            Some(json!({"title": "Top title", "readOnlyHint": true, "openWorldHint": false}))
        );
        let own = json!({"title": "Top", "annotations": {"title": "Own"}});
        assert_eq!(annotations_of(&own), Some(json!({"title": "Own"})));
        let long = json!({"annotations": {"title": "t".repeat(MAX_TITLE_BYTES + 1)}});
        assert_eq!(annotations_of(&long), None);
        assert_eq!(annotations_of(&json!({"name": "bare"})), None);
    }

    #[test]
    fn unusable_answers_are_told_from_junk() {
        let deep = format!(
            "{{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{}}}",
            "[".repeat(200) + &"]".repeat(200)
        );
        assert!(matches!(
            parse_line(deep.as_bytes()),
            Err(FrameError::Unusable(_))
        ));
        let batch = br#"[{"jsonrpc":"2.0","id":1,"result":{}}]"#;
        assert!(matches!(parse_line(batch), Err(FrameError::Unusable(_))));
        // A plain array is junk, ignored like any non-JSON-RPC line.
        assert_eq!(parse_line(b"[1, 2, 3]"), Err(FrameError::NotJsonRpc));
        // A string id naming one of our numeric ids is matched.
        assert!(matches!(
            parse_line(br#"{"jsonrpc":"2.0","id":"7","result":{}}"#),
            Ok(Incoming::Response { id: Some(7), .. })
        ));
        assert!(matches!(
            parse_line(br#"{"jsonrpc":"2.0","id":"x","result":{}}"#),
            Ok(Incoming::Response { id: None, .. })
        ));
    }

    #[test]
    fn classifies_lines() {
        assert_eq!(
            parse_line(br#"{"jsonrpc":"2.0","id":7,"result":{"x":1}}"#),
            Ok(Incoming::Response {
                id: Some(7),
                result: Ok(json!({"x": 1}))
            })
        );
        let Ok(Incoming::Response {
            id: Some(2),
            result: Err(e),
        }) = parse_line(br#"{"jsonrpc":"2.0","id":2,"error":{"code":-32601,"message":"nope"}}"#)
        else {
            panic!()
        };
        assert_eq!(e.code, METHOD_NOT_FOUND);
        assert!(matches!(
            parse_line(br#"{"jsonrpc":"2.0","id":"a","method":"roots/list"}"#),
            Ok(Incoming::Request { .. })
        ));
        assert!(matches!(
            parse_line(br#"{"jsonrpc":"2.0","method":"notifications/tools/list_changed"}"#),
            Ok(Incoming::Notification { .. })
        ));
        assert!(matches!(parse_line(b"hello"), Err(FrameError::NotJson(_))));
        assert_eq!(parse_line(b"[1]"), Err(FrameError::NotJsonRpc));
        assert_eq!(parse_line(br#"{"id":1}"#), Err(FrameError::NotJsonRpc));
    }

    #[test]
    fn tools_page_reads_cursor_and_reports_bad_entries() {
        let page = json!({"tools": [
            {"name": "a", "inputSchema": {"type": "object"}, "outputSchema": {"type": "object"}},
            {"description": "nameless", "inputSchema": {}},
        ], "nextCursor": "c2"});
        let (tools, cursor) = parse_tools_page(&page);
        assert_eq!(cursor.as_deref(), Some("c2"));
        assert_eq!(tools[0].as_ref().unwrap().name, "a");
        assert!(tools[1].is_err());
    }

    fn json_line(bytes: &[u8]) -> Value {
        let (last, body) = bytes.split_last().expect("a line");
        assert_eq!(*last, b'\n', "newline-terminated");
        assert!(!body.contains(&b'\n'), "one line");
        serde_json::from_slice(body).expect("JSON")
    }

    #[test]
    fn error_codes_are_the_specified_ones() {
        let code = |line: &[u8]| match parse_line(line) {
            Ok(Incoming::Response { result: Err(e), .. }) => e.code,
            other => panic!("{other:?}"),
        };
        assert_eq!(
            code(br#"{"jsonrpc":"2.0","id":1,"error":{"code":-32601,"message":"m"}}"#),
            METHOD_NOT_FOUND
        );
        assert_eq!(
            code(br#"{"jsonrpc":"2.0","id":1,"error":{"code":-32022,"message":"v"}}"#),
            UNSUPPORTED_PROTOCOL_VERSION
        );
        assert!(is_unsupported_version(-32022) && is_unsupported_version(-32004));
        assert!(!is_unsupported_version(METHOD_NOT_FOUND));
    }

    #[test]
    fn parses_every_field_of_a_line() {
        assert_eq!(
            parse_line(br#"{"jsonrpc":"2.0","id":3,"error":{"code":-32000,"message":"KeyError: k","data":[1]}}"#),
            Ok(Incoming::Response {
                id: Some(3),
                result: Err(RpcError {
                    code: -32000,
                    message: "KeyError: k".into(),
                    data: Some(json!([1])),
                }),
            })
        );
        // An error object missing its fields still reads as an error.
        assert_eq!(
            parse_line(br#"{"id":4,"error":{}}"#),
            Ok(Incoming::Response {
                id: Some(4),
                result: Err(RpcError {
                    code: 0,
                    message: String::new(),
                    data: None,
                }),
            })
        );
        // An id toolboxd cannot have sent.
        assert_eq!(
            parse_line(br#"{"id":"x","result":null}"#),
            Ok(Incoming::Response {
                id: None,
                result: Ok(Value::Null),
            })
        );
        assert_eq!(
            parse_line(br#"{"jsonrpc":"2.0","id":"a","method":"roots/list","params":{"p":1}}"#),
            Ok(Incoming::Request {
                id: json!("a"),
                method: "roots/list".into(),
                params: json!({"p": 1}),
            })
        );
        // A null id makes a notification, not a request.
        assert_eq!(
            parse_line(br#"{"jsonrpc":"2.0","id":null,"method":"notifications/x"}"#),
            Ok(Incoming::Notification {
                method: "notifications/x".into(),
                params: Value::Null,
            })
        );
        assert_eq!(
            parse_line(br#"{"method":7,"id":1}"#),
            Err(FrameError::NotJsonRpc)
        );
    }

    #[test]
    fn encodes_one_json_rpc_message_per_line() {
        let params = json!({"name": "add", "arguments": {"a": 1}});
        assert_eq!(
            json_line(&request_line(9, "tools/call", &params)),
            json!({"jsonrpc": "2.0", "id": 9, "method": "tools/call", "params": params})
        );
        assert_eq!(
            json_line(&notification_line(
                "notifications/initialized",
                &Value::Null
            )),
            json!({"jsonrpc": "2.0", "method": "notifications/initialized"})
        );
        assert_eq!(
            json_line(&notification_line(
                "notifications/cancelled",
                &json!({"requestId": 9})
            )),
            json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
                   "params": {"requestId": 9}})
        );
        assert_eq!(
            json_line(&response_line(&json!("a"), Ok(json!({"roots": []})))),
            json!({"jsonrpc": "2.0", "id": "a", "result": {"roots": []}})
        );
        assert_eq!(
            json_line(&response_line(&json!(5), Err((METHOD_NOT_FOUND, "no")))),
            json!({"jsonrpc": "2.0", "id": 5,
                   "error": {"code": -32601, "message": "no"}})
        );
        // What toolboxd writes, it reads back.
        assert_eq!(
            parse_line(&request_line(1, "ping", &json!({}))),
            Ok(Incoming::Request {
                id: json!(1),
                method: "ping".into(),
                params: json!({}),
            })
        );
    }

    #[test]
    fn eras_name_themselves_and_their_version() {
        let modern = Era::Modern("2026-01-01".into());
        let legacy = Era::Legacy("2025-06-18".into());
        assert_eq!(modern.to_string(), "modern MCP 2026-01-01");
        assert_eq!(legacy.to_string(), "legacy MCP 2025-06-18");
        assert_eq!(modern.version(), "2026-01-01");
        assert_eq!(legacy.version(), "2025-06-18");
    }

    #[test]
    fn modern_meta_carries_version_capabilities_and_client_info() {
        let info = json!({"name": "toolboxd", "version": env!("CARGO_PKG_VERSION")});
        assert_eq!(client_info(), info);
        assert_eq!(
            modern_meta("2026-01-01"),
            json!({
                "io.modelcontextprotocol/protocolVersion": "2026-01-01",
                "io.modelcontextprotocol/clientCapabilities": {},
                "io.modelcontextprotocol/clientInfo": info,
            })
        );
        assert_eq!(
            modern_call_meta("2026-01-01")["io.modelcontextprotocol/clientCapabilities"],
            json!({"extensions": {"io.modelcontextprotocol/tasks": {}}})
        );
        assert_eq!(
            modern_call_meta("2026-01-01")["io.modelcontextprotocol/protocolVersion"],
            "2026-01-01"
        );
    }

    #[test]
    fn tools_page_reads_each_field_and_accepts_boolean_schemas() {
        let page = json!({"tools": [
            {"name": "a", "description": "A.", "inputSchema": {"type": "object"},
             "outputSchema": {"type": "object"}},
            {"name": "b", "inputSchema": true, "outputSchema": false},
            {"name": "c", "inputSchema": {}, "outputSchema": "no"},
            {"name": "", "inputSchema": {}},
            {"name": "d", "inputSchema": "no"},
            {"name": "e"},
        ], "nextCursor": ""});
        let (tools, cursor) = parse_tools_page(&page);
        assert_eq!(cursor, None, "an empty cursor ends the listing");
        assert_eq!(
            tools[0],
            Ok(ToolSpec {
                name: "a".into(),
                description: "A.".into(),
                input_schema: json!({"type": "object"}),
                output_schema: Some(json!({"type": "object"})),
                annotations: None,
            })
        );
        assert_eq!(
            tools[1],
            Ok(ToolSpec {
                name: "b".into(),
                description: String::new(),
                input_schema: json!(true),
                output_schema: Some(json!(false)),
                annotations: None,
            })
        );
        assert_eq!(tools[2].as_ref().unwrap().output_schema, None);
        assert!(tools[3].as_ref().unwrap_err().contains("has no name"));
        assert_eq!(
            tools[4],
            Err("tool \"d\" has no inputSchema object".to_owned())
        );
        assert!(tools[5].is_err());
        assert_eq!(tools.len(), 6);

        let (tools, cursor) = parse_tools_page(&json!({"tools": []}));
        assert!(tools.is_empty() && cursor.is_none());
        let (tools, cursor) = parse_tools_page(&json!({"nextCursor": "c"}));
        assert_eq!(
            tools,
            [Err("tools/list result has no \"tools\" array".to_owned())]
        );
        assert_eq!(cursor, None);
    }

    #[test]
    fn generic_output_schema_is_the_adapter_output() {
        let schema = generic_output_schema();
        assert_eq!(schema["title"], "AdapterToolOutput");
        assert_eq!(schema["type"], "object");
        let properties = schema["properties"].as_object().unwrap();
        let types: Vec<(&str, &str)> = properties
            .iter()
            .map(|(k, v)| (k.as_str(), v["type"].as_str().unwrap()))
            .collect();
        assert_eq!(
            types,
            [
                ("content", "string"),
                ("is_error", "boolean"),
                ("raw", "array")
            ]
        );
    }
}
