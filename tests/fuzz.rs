//! Property tests of the decoders that read untrusted input: the bus envelope
//! (any bus client), the MCP line parser (any child), the manifest parser and
//! the control protocol. Each property runs on generated input (arbitrary
//! bytes, hostile JSON and TOML fragments, mutations of valid text) and
//! asserts more than "no panic": errors are typed and read as one line, and
//! what toolboxd writes reads back as it was. The known hostile inputs are
//! plain example tests at the end of each part.
//!
//! The case count is fixed (CASES) so that the whole file runs in seconds; a
//! failure prints its shrunk input, which becomes an example test here.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use proptest::prelude::*;
use proptest::sample::select;
use serde_json::{json, Map, Value};

use toolboxd::bus::envelope::{DecodeError, Message, Object};
use toolboxd::control::{decode_request, request_line};
use toolboxd::manifest::{
    knob_values, valid_id, Limits, Manifest, Restart, RestartPolicy, KNOB_RANGES,
};
use toolboxd::mcp::{
    notification_line, parse_line, parse_tools_page, request_line as mcp_request_line,
    response_line, FrameError, Incoming, RpcError,
};
use toolboxd::operator::{BadRequest, Operation};

/// Cases per property.
const CASES: u32 = 256;

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: CASES,
        // A failure becomes an example test in this file, not a file beside it.
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

/// An error text fit for one log line: no raw newline or other control
/// character (a hostile input must not forge a line).
fn assert_one_line(text: &str) {
    assert!(
        !text.chars().any(char::is_control),
        "raw control character in {text:?}"
    );
}

// ---------------------------------------------------------------------------
// Generators shared by every part.

/// Pieces of hostile JSON: structure, the keys the decoders look for, numbers
/// past every integer type, escapes of lone surrogates and NUL, a BOM, raw
/// control characters.
const JSON_PIECES: &[&str] = &[
    "{",
    "}",
    "[",
    "]",
    ":",
    ",",
    "\"",
    "\\",
    "\"type\"",
    "\"data\"",
    "\"context\"",
    "\"jsonrpc\"",
    "\"2.0\"",
    "\"id\"",
    "\"method\"",
    "\"params\"",
    "\"result\"",
    "\"error\"",
    "\"code\"",
    "\"message\"",
    "\"status\"",
    "\"restart\"",
    "\"tools\"",
    "\"name\"",
    "\"inputSchema\"",
    "\"nextCursor\"",
    "\"a\"",
    "\"\"",
    "\"\\ud800\"",
    "\"\\udc00\"",
    "\"\\u0000\"",
    "\"\\n\"",
    "null",
    "true",
    "1",
    "-0",
    "7",
    "\"7\"",
    "0.5",
    "1e999999",
    "-1e-999999",
    "18446744073709551616",
    "9223372036854775807",
    "-9223372036854775809",
    "\u{feff}",
    "\0",
    "\n",
    " ",
    "\t",
    "\u{7f}",
    "\u{85}",
    "\u{202e}",
    "é",
];

/// Any JSON value, a few levels deep. Floats are multiples of 1/8, which
/// every JSON reader reads back exactly.
fn arb_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<i32>().prop_map(|n| Value::from(f64::from(n) / 8.0)),
        arb_text().prop_map(Value::from),
    ];
    leaf.prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::btree_map(arb_key(), inner, 0..6)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// Any text, and text made of what hostile text is made of: blanks at the
/// ends, '.', ':', '/', NUL, newlines, DEL, C1 controls, bidi overrides.
fn arb_text() -> impl Strategy<Value = String> {
    prop_oneof![
        any::<String>(),
        "[ \t\n\r\0.:/a-zA-Z0-9_\u{7f}\u{85}\u{9b}\u{202e}\u{feff}-]{0,12}",
        prop::collection::vec(select(JSON_PIECES), 0..6).prop_map(|p| p.concat()),
    ]
}

/// Object keys: the ones the decoders look for, and any other.
fn arb_key() -> impl Strategy<Value = String> {
    prop_oneof![
        select(
            &[
                "type", "data", "context", "jsonrpc", "id", "method", "params", "result", "error",
                "code", "message", "tools", "name",
            ][..]
        )
        .prop_map(str::to_owned),
        arb_text(),
    ]
}

/// Any JSON object.
fn arb_object() -> impl Strategy<Value = Object> {
    prop::collection::btree_map(arb_key(), arb_json(), 0..6).prop_map(|m| m.into_iter().collect())
}

/// An edit of a text: delete some characters, or insert a hostile piece.
#[derive(Debug, Clone)]
enum Edit {
    Delete(usize),
    Insert(&'static str),
}

fn arb_edits(
    pieces: &'static [&'static str],
) -> impl Strategy<Value = Vec<(prop::sample::Index, Edit)>> {
    prop::collection::vec(
        (
            any::<prop::sample::Index>(),
            prop_oneof![
                (1usize..4).prop_map(Edit::Delete),
                select(pieces).prop_map(Edit::Insert),
            ],
        ),
        1..5,
    )
}

/// `text` with the edits applied (at character boundaries).
fn mutate(text: &str, edits: &[(prop::sample::Index, Edit)]) -> String {
    let mut chars: Vec<char> = text.chars().collect();
    for (at, edit) in edits {
        let at = at.index(chars.len() + 1);
        match edit {
            Edit::Delete(n) => {
                let end = (at + n).min(chars.len());
                chars.drain(at..end);
            }
            Edit::Insert(piece) => {
                chars.splice(at..at, piece.chars());
            }
        }
    }
    chars.into_iter().collect()
}

/// Hostile text built from `pieces`: any string, pieces strung together, a
/// valid `shape` as is, and a valid `shape` with a few edits.
fn hostile_text(
    pieces: &'static [&'static str],
    shape: BoxedStrategy<String>,
) -> BoxedStrategy<String> {
    prop_oneof![
        any::<String>(),
        prop::collection::vec(select(pieces), 0..48).prop_map(|p| p.concat()),
        shape.clone(),
        (shape, arb_edits(pieces)).prop_map(|(text, edits)| mutate(&text, &edits)),
    ]
    .boxed()
}

/// Hostile bytes: hostile text, any bytes, and text with bytes that are
/// never UTF-8 put in.
fn hostile_bytes(text: BoxedStrategy<String>) -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        text.clone().prop_map(String::into_bytes),
        prop::collection::vec(any::<u8>(), 0..256),
        (
            text,
            prop::collection::vec(
                (
                    any::<prop::sample::Index>(),
                    select(&[0xffu8, 0xfe, 0xc0, 0x80, 0xed][..])
                ),
                1..4
            )
        )
            .prop_map(|(text, bad)| {
                let mut bytes = text.into_bytes();
                for (at, byte) in bad {
                    let at = at.index(bytes.len() + 1);
                    bytes.insert(at, byte);
                }
                bytes
            }),
    ]
}

/// `[[[1]]]` (or `{"a":{"a":1}}`) `depth` levels deep, closed or not.
fn nested(depth: usize, object: bool, closed: bool) -> String {
    let (open, close) = if object { ("{\"a\":", "}") } else { ("[", "]") };
    let mut text = open.repeat(depth);
    text.push('1');
    if closed {
        text.push_str(&close.repeat(depth));
    }
    text
}

// ---------------------------------------------------------------------------
// 1. The bus envelope (Message::decode): what any bus client sends.

/// A message as toolboxd builds one: a non-empty topic, any data and context.
fn arb_message() -> impl Strategy<Value = Message> {
    (
        arb_text().prop_filter("a topic is never empty", |t| !t.is_empty()),
        arb_object(),
        arb_object(),
    )
        .prop_map(|(msg_type, data, context)| Message {
            msg_type,
            data,
            context,
        })
}

/// What serde_json refuses to hold in a value although JSON's grammar allows
/// it.
const UNHELD: [&str; 4] = [
    "number out of range",
    "lone leading surrogate in hex escape",
    "unexpected end of hex escape",
    "invalid unicode code point",
];

/// Frames close to envelopes: `type`, `data` and `context` each absent, of
/// the right kind or of any kind, among other keys.
fn arb_frame() -> impl Strategy<Value = String> {
    let member = |right: BoxedStrategy<Value>| {
        prop_oneof![
            Just(None::<Value>),
            right.prop_map(Some),
            arb_json().prop_map(Some),
        ]
    };
    (
        member(arb_text().prop_map(Value::from).boxed()),
        member(arb_object().prop_map(Value::Object).boxed()),
        member(arb_object().prop_map(Value::Object).boxed()),
        arb_object(),
    )
        .prop_map(|(msg_type, data, context, mut frame)| {
            for (key, value) in [("type", msg_type), ("data", data), ("context", context)] {
                match value {
                    Some(value) => frame.insert(key.to_owned(), value),
                    None => frame.remove(key),
                };
            }
            Value::Object(frame).to_string()
        })
}

fn hostile_frame() -> impl Strategy<Value = String> {
    hostile_text(JSON_PIECES, arb_frame().boxed())
}

proptest! {
    #![proptest_config(config())]

    /// Whatever a client sends is a message or a typed, one-line error, and
    /// decode agrees with reading the JSON and checking the envelope rules.
    #[test]
    fn envelope_decode_is_total_and_agrees_with_the_rules(text in hostile_frame()) {
        let decoded = Message::decode(&text);
        if let Err(e) = &decoded {
            assert_one_line(&e.to_string());
        }
        match serde_json::from_str::<Value>(&text) {
            // A member the envelope does not read is skipped, not parsed: a
            // number past f64 or a lone surrogate escape there (JSON's
            // grammar allows both; serde_json's values cannot hold them)
            // does not make the frame unreadable.
            Err(e) if UNHELD.iter().any(|what| e.to_string().starts_with(what)) => {}
            Err(_) => prop_assert!(matches!(decoded, Err(DecodeError::NotJson(_))), "{decoded:?}"),
            Ok(value) => match decoded {
                Err(DecodeError::NotJson(e)) => prop_assert!(false, "valid JSON refused: {e}"),
                Err(DecodeError::Duplicate(key)) => {
                    prop_assert!(value.get(key).is_some(), "{key} twice in {text:?}");
                }
                // Without a key given twice, decoding the text is checking
                // the parsed value.
                decoded => prop_assert_eq!(decoded, Message::from_value(value)),
            },
        }
    }

    /// Every message toolboxd encodes decodes back to itself, spliced or not.
    #[test]
    fn envelope_encode_round_trips(message in arb_message()) {
        prop_assert_eq!(Message::decode(&message.encode()), Ok(message.clone()));
        let data = serde_json::to_string(&message.data).unwrap();
        prop_assert_eq!(
            Message::decode(&message.encode_with_raw_data(&data)),
            Ok(message)
        );
    }

    /// `type`, `data` or `context` given twice is refused, whatever the
    /// values and whatever other keys stand between.
    #[test]
    fn envelope_member_given_twice_is_refused(
        key in select(&["type", "data", "context"][..]),
        first in arb_object(),
        second in arb_object(),
        between in arb_object(),
    ) {
        let value = |object: &Object| {
            if key == "type" { json!("t").to_string() } else { Value::Object(object.clone()).to_string() }
        };
        let mut members = vec![format!("\"type\":\"a\"")];
        if key == "type" {
            members.clear();
        }
        members.push(format!("{}:{}", json!(key), value(&first)));
        for (k, v) in &between {
            if !["type", "data", "context"].contains(&k.as_str()) {
                members.push(format!("{}:{}", json!(k), v));
            }
        }
        members.push(format!("{}:{}", json!(key), value(&second)));
        let text = format!("{{{}}}", members.join(","));
        prop_assert_eq!(Message::decode(&text), Err(DecodeError::Duplicate(key)));
    }

    /// A `data` or `context` that is neither an object nor null is refused by
    /// name; a `type` that is not a non-empty string is refused.
    #[test]
    fn envelope_members_of_the_wrong_kind_are_refused(
        wrong in arb_json().prop_filter("not an object or null", |v| !v.is_object() && !v.is_null()),
        key in select(&["data", "context"][..]),
    ) {
        let frame = json!({"type": "a", key: wrong.clone()}).to_string();
        prop_assert_eq!(Message::decode(&frame), Err(DecodeError::NotAnObject(key)));
        if wrong.as_str().is_none_or(str::is_empty) {
            let frame = json!({"type": wrong}).to_string();
            prop_assert_eq!(Message::decode(&frame), Err(DecodeError::BadType));
        }
    }
}

#[test]
fn envelope_hostile_corpus() {
    let decode = |text: &str| {
        let decoded = Message::decode(text);
        if let Err(e) = &decoded {
            assert_one_line(&e.to_string());
        }
        decoded
    };
    assert_eq!(
        decode(r#"{"type":"ovos.tools.list","data":{},"type":"ovos.tools.invoke"}"#),
        Err(DecodeError::Duplicate("type"))
    );
    // An escaped key is the same key.
    assert_eq!(
        decode(r#"{"type":"a","\u0074ype":"b"}"#),
        Err(DecodeError::Duplicate("type"))
    );
    assert_eq!(
        decode(r#"{"type":"a","data":[1]}"#),
        Err(DecodeError::NotAnObject("data"))
    );
    assert_eq!(
        decode(r#"["ovos.tools.list",{},{}]"#),
        Err(DecodeError::NotObject)
    );
    assert_eq!(decode("[1]"), Err(DecodeError::NotObject));
    // Found by the properties above: a null type read as absent on one path
    // and as a bad type on the other.
    assert_eq!(decode(r#"{"type":null}"#), Err(DecodeError::BadType));
    assert_eq!(
        decode(r#"{"type":null,"x":1,"x":2}"#),
        Err(DecodeError::BadType)
    );
    assert_eq!(decode(r#"{"data":{}}"#), Err(DecodeError::MissingType));
    for depth in [200, 10_000] {
        for object in [false, true] {
            let frame = format!(
                "{{\"type\":\"a\",\"data\":{{\"x\":{}}}}}",
                nested(depth, object, true)
            );
            assert!(
                matches!(decode(&frame), Err(DecodeError::NotJson(_))),
                "{depth}"
            );
            assert!(matches!(
                decode(&nested(depth, object, false)),
                Err(DecodeError::NotJson(_))
            ));
        }
    }
    // Within the depth JSON readers allow, a nested payload is kept.
    let frame = format!(
        "{{\"type\":\"a\",\"data\":{{\"x\":{}}}}}",
        nested(100, false, true)
    );
    assert!(decode(&frame).is_ok());
    // Numbers past every integer type are read as floats or refused, never a panic.
    let m = decode(r#"{"type":"a","data":{"n":18446744073709551616,"m":-9223372036854775809}}"#)
        .unwrap();
    assert!(m.data["n"].is_f64() && m.data["m"].is_f64());
    assert!(matches!(
        decode(r#"{"type":"a","data":{"n":1e999999}}"#),
        Err(DecodeError::NotJson(_))
    ));
    // In a member the envelope skips, it is not read at all.
    assert_eq!(
        decode(r#"{"type":"a","x":1e999999}"#).unwrap().msg_type,
        "a"
    );
    assert_eq!(
        decode(r#"{"type":"a","x":"\ud800"}"#).unwrap().msg_type,
        "a"
    );
    // A lone surrogate, a BOM, a NUL: not JSON.
    assert!(matches!(
        decode(r#"{"type":"\ud800"}"#),
        Err(DecodeError::NotJson(_))
    ));
    assert!(matches!(
        decode("\u{feff}{\"type\":\"a\"}"),
        Err(DecodeError::NotJson(_))
    ));
    assert!(matches!(
        decode("{\"type\":\"a\0\"}"),
        Err(DecodeError::NotJson(_))
    ));
    assert!(matches!(
        decode("{\"type\":\"a\"}\0"),
        Err(DecodeError::NotJson(_))
    ));
    // An escaped NUL or newline is text like any other.
    assert_eq!(decode(r#"{"type":"a\u0000\n"}"#).unwrap().msg_type, "a\0\n");
    assert!(matches!(decode(""), Err(DecodeError::NotJson(_))));
}

// ---------------------------------------------------------------------------
// 2. The MCP line parser (parse_line, parse_tools_page): what any child sends.

/// Lines close to JSON-RPC: requests, notifications, answers, batches, with
/// ids, methods, results and errors of every kind.
fn arb_rpc_line() -> impl Strategy<Value = String> {
    let id = prop_oneof![
        any::<u64>().prop_map(Value::from),
        any::<u64>().prop_map(|n| Value::from(n.to_string())),
        arb_json(),
    ];
    let member =
        |value: BoxedStrategy<Value>| prop_oneof![Just(None::<Value>), value.prop_map(Some)];
    let message = (
        member(id.boxed()),
        member(
            prop_oneof![
                select(
                    &[
                        "tools/call",
                        "roots/list",
                        "notifications/tools/list_changed"
                    ][..]
                )
                .prop_map(Value::from),
                arb_json()
            ]
            .boxed(),
        ),
        member(arb_json().boxed()),
        member(arb_json().boxed()),
        member(
            prop_oneof![
                (any::<i64>(), arb_text(), arb_json())
                    .prop_map(|(c, m, d)| json!({"code": c, "message": m, "data": d})),
                arb_json()
            ]
            .boxed(),
        ),
    )
        .prop_map(|(id, method, params, result, error)| {
            let mut line = Map::new();
            line.insert("jsonrpc".into(), "2.0".into());
            for (key, value) in [
                ("id", id),
                ("method", method),
                ("params", params),
                ("result", result),
                ("error", error),
            ] {
                if let Some(value) = value {
                    line.insert(key.into(), value);
                }
            }
            Value::Object(line)
        })
        .boxed();
    prop_oneof![
        4 => message.clone(),
        1 => prop::collection::vec(prop_oneof![message, arb_json()], 0..4).prop_map(Value::Array),
    ]
    .prop_map(|line| line.to_string())
}

fn hostile_line() -> impl Strategy<Value = Vec<u8>> {
    hostile_bytes(hostile_text(JSON_PIECES, arb_rpc_line().boxed()))
}

proptest! {
    #![proptest_config(config())]

    /// Every line is classified or refused with a typed one-line error, and
    /// the class is the one the line's JSON says: an unusable line (a batch,
    /// too deep) is never taken for junk, nor junk for an unusable line.
    #[test]
    fn mcp_parse_line_is_total_and_classifies_by_the_rules(line in hostile_line()) {
        let parsed = parse_line(&line);
        if let Err(e) = &parsed {
            assert_one_line(&e.to_string());
        }
        match serde_json::from_slice::<Value>(&line) {
            Err(e) if e.to_string().starts_with("recursion limit exceeded") => {
                prop_assert!(matches!(parsed, Err(FrameError::Unusable(_))), "{parsed:?}");
            }
            Err(_) => prop_assert!(matches!(parsed, Err(FrameError::NotJson(_))), "{parsed:?}"),
            Ok(Value::Array(items)) => {
                let batch = items.iter().any(|i| i.get("jsonrpc").is_some());
                if batch {
                    prop_assert!(matches!(parsed, Err(FrameError::Unusable(_))), "{parsed:?}");
                } else {
                    prop_assert_eq!(parsed, Err(FrameError::NotJsonRpc));
                }
            }
            Ok(Value::Object(obj)) => {
                let method = obj.get("method").and_then(Value::as_str);
                let id = obj.get("id").filter(|id| !id.is_null());
                let params = obj.get("params").cloned().unwrap_or(Value::Null);
                match parsed {
                    Ok(Incoming::Request { id: got, method: m, params: p }) => {
                        prop_assert_eq!(Some(m.as_str()), method);
                        prop_assert_eq!(Some(&got), id);
                        prop_assert_eq!(p, params);
                    }
                    Ok(Incoming::Notification { method: m, params: p }) => {
                        prop_assert_eq!(Some(m.as_str()), method);
                        prop_assert!(id.is_none());
                        prop_assert_eq!(p, params);
                    }
                    Ok(Incoming::Response { id: got, result }) => {
                        prop_assert!(!obj.contains_key("method"));
                        let id = &obj["id"];
                        let expected = id.as_u64().or_else(|| id.as_str()?.parse().ok());
                        prop_assert_eq!(got, expected);
                        match result {
                            Ok(result) => {
                                prop_assert!(!obj.contains_key("error"));
                                prop_assert_eq!(Some(&result), obj.get("result"));
                            }
                            Err(e) => {
                                let error = &obj["error"];
                                prop_assert_eq!(e.code, error.get("code").and_then(Value::as_i64).unwrap_or(0));
                                prop_assert_eq!(e.data.as_ref(), error.get("data"));
                            }
                        }
                    }
                    Err(e) => {
                        prop_assert_eq!(&e, &FrameError::NotJsonRpc);
                        // Neither a call to us nor an answer to one.
                        prop_assert!(method.is_none());
                        let answer = obj.contains_key("result") || obj.contains_key("error");
                        prop_assert!(!(obj.contains_key("id") && answer && !obj.contains_key("method")));
                    }
                }
            }
            Ok(_) => prop_assert_eq!(parsed, Err(FrameError::NotJsonRpc)),
        }
    }

    /// What toolboxd writes to a child, a child written the same way is read
    /// back from: requests, notifications and answers keep every field.
    #[test]
    fn mcp_lines_round_trip(id in any::<u64>(), method in arb_text(), params in arb_json(),
                            code in any::<i64>(), message in arb_text()) {
        prop_assert_eq!(
            parse_line(&mcp_request_line(id, &method, &params)),
            Ok(Incoming::Request { id: json!(id), method: method.clone(), params: params.clone() })
        );
        prop_assert_eq!(
            parse_line(&notification_line(&method, &params)),
            Ok(Incoming::Notification { method, params: params.clone() })
        );
        prop_assert_eq!(
            parse_line(&response_line(&json!(id), Ok(params.clone()))),
            Ok(Incoming::Response { id: Some(id), result: Ok(params.clone()) })
        );
        // Ids echoed as strings still name the call.
        prop_assert_eq!(
            parse_line(&response_line(&json!(id.to_string()), Ok(params.clone()))),
            Ok(Incoming::Response { id: Some(id), result: Ok(params) })
        );
        prop_assert_eq!(
            parse_line(&response_line(&json!(id), Err((code, &message)))),
            Ok(Incoming::Response {
                id: Some(id),
                result: Err(RpcError { code, message: message.clone(), data: None }),
            })
        );
    }

    /// An answer nested deeper than a reader may go is unusable (a call may
    /// wait for it), at any depth; within the limit it is read.
    #[test]
    fn mcp_nesting_past_the_limit_is_unusable(depth in 127usize..10_000, object: bool, closed: bool) {
        let line = format!("{{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{}}}", nested(depth, object, closed));
        prop_assert!(matches!(parse_line(line.as_bytes()), Err(FrameError::Unusable(_))));
    }

    #[test]
    fn mcp_nesting_within_the_limit_is_read(depth in 0usize..127, object: bool) {
        let inner = nested(depth, object, true);
        let line = format!("{{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{inner}}}");
        let result: Value = serde_json::from_str(&inner).unwrap();
        prop_assert_eq!(
            parse_line(line.as_bytes()),
            Ok(Incoming::Response { id: Some(1), result: Ok(result) })
        );
    }

    /// A tools/list page gives one entry per listed tool (or one error when
    /// there is no list), each a tool named as listed or a one-line reason.
    #[test]
    fn mcp_tools_page_is_total(page in prop_oneof![
        arb_json(),
        (prop::collection::vec(prop_oneof![
            (arb_text(), arb_json(), prop::option::of(arb_json()))
                .prop_map(|(name, schema, out)| json!({"name": name, "inputSchema": schema, "outputSchema": out})),
            arb_json(),
        ], 0..8), arb_json())
            .prop_map(|(tools, cursor)| json!({"tools": tools, "nextCursor": cursor})),
    ]) {
        let (specs, cursor) = parse_tools_page(&page);
        match page.get("tools").and_then(Value::as_array) {
            Some(tools) => {
                prop_assert_eq!(specs.len(), tools.len());
                for (spec, tool) in specs.iter().zip(tools) {
                    match spec {
                        Ok(spec) => {
                            prop_assert!(!spec.name.is_empty());
                            prop_assert_eq!(Some(spec.name.as_str()), tool["name"].as_str());
                            prop_assert!(spec.input_schema.is_object() || spec.input_schema.is_boolean());
                        }
                        Err(reason) => assert_one_line(reason),
                    }
                }
                let expected = page["nextCursor"].as_str().filter(|c| !c.is_empty());
                prop_assert_eq!(cursor.as_deref(), expected);
            }
            None => {
                prop_assert_eq!(specs.len(), 1);
                prop_assert!(specs[0].is_err());
                prop_assert_eq!(cursor, None);
            }
        }
    }
}

#[test]
fn mcp_hostile_corpus() {
    let parse = |line: &[u8]| {
        let parsed = parse_line(line);
        if let Err(e) = &parsed {
            assert_one_line(&e.to_string());
        }
        parsed
    };
    let unusable = |line: &[u8]| matches!(parse(line), Err(FrameError::Unusable(_)));
    let junk = |line: &[u8]| {
        matches!(
            parse(line),
            Err(FrameError::NotJson(_)) | Err(FrameError::NotJsonRpc)
        )
    };
    // A batch, even of one answer or mixed with junk.
    assert!(unusable(br#"[{"jsonrpc":"2.0","id":1,"result":{}}]"#));
    assert!(unusable(br#"[1,{"jsonrpc":"2.0","method":"x"}]"#));
    assert!(junk(b"[1,2,3]") && junk(b"[]") && junk(br#"[{"id":1,"result":{}}]"#));
    // 200 and 10,000 levels, closed or cut off.
    for depth in [200, 10_000] {
        for object in [false, true] {
            for closed in [false, true] {
                let line = format!(
                    "{{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{}}}",
                    nested(depth, object, closed)
                );
                assert!(unusable(line.as_bytes()), "{depth} {object} {closed}");
                assert!(unusable(nested(depth, object, closed).as_bytes()));
            }
        }
    }
    // A string id naming one of our ids; ids toolboxd never sends.
    let id = |line: &[u8]| match parse(line) {
        Ok(Incoming::Response { id, .. }) => id,
        other => panic!("{other:?}"),
    };
    assert_eq!(id(br#"{"jsonrpc":"2.0","id":"7","result":{}}"#), Some(7));
    assert_eq!(
        id(br#"{"jsonrpc":"2.0","id":18446744073709551615,"result":{}}"#),
        Some(u64::MAX)
    );
    assert_eq!(
        id(br#"{"jsonrpc":"2.0","id":18446744073709551616,"result":{}}"#),
        None
    );
    assert_eq!(
        id(br#"{"jsonrpc":"2.0","id":"18446744073709551616","result":{}}"#),
        None
    );
    assert_eq!(id(br#"{"jsonrpc":"2.0","id":-7,"result":{}}"#), None);
    assert_eq!(id(br#"{"jsonrpc":"2.0","id":7.5,"result":{}}"#), None);
    assert_eq!(id(br#"{"jsonrpc":"2.0","id":[7],"result":{}}"#), None);
    // An error code past i64 reads as 0, a message that is not a string as "".
    match parse(br#"{"jsonrpc":"2.0","id":1,"error":{"code":9223372036854775808,"message":[1]}}"#) {
        Ok(Incoming::Response { result: Err(e), .. }) => {
            assert_eq!((e.code, e.message), (0, String::new()))
        }
        other => panic!("{other:?}"),
    }
    // Not UTF-8, NUL, BOM, lone surrogates, numbers past f64: junk.
    for line in [
        &b"\xff\xfe{}"[..],
        b"{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":\"\xc0\x80\"}",
        b"{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":\"\xed\xa0\x80\"}",
        b"{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{}}\0",
        b"\xef\xbb\xbf{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{}}",
        br#"{"jsonrpc":"2.0","id":1,"result":"\ud800"}"#,
        br#"{"jsonrpc":"2.0","id":1,"result":1e999999}"#,
        b"",
        b"\n",
    ] {
        assert!(junk(line), "{:?}", String::from_utf8_lossy(line));
    }
    // A key given twice: the last one counts (a map), and the line is read.
    assert_eq!(
        id(br#"{"jsonrpc":"2.0","id":1,"id":2,"result":{}}"#),
        Some(2)
    );
    // Found by the properties above: DEL and C1 controls, which JSON leaves
    // as they are, are escaped in what a tools page reports.
    let (specs, _) = parse_tools_page(&json!({"tools": [{"x": "\u{7f}\u{85}\u{9b}"}]}));
    assert_eq!(
        specs,
        [Err(
            r#"a listed tool has no name: {"x":"\u007f\u0085\u009b"}"#.to_owned()
        )]
    );
    // A tools page with a hostile name reports it on one line.
    let (specs, _) = parse_tools_page(&json!({"tools": [{"name": "a\nb"}, {"x": "\u{0}\n"}]}));
    for spec in specs {
        assert_one_line(&spec.unwrap_err());
    }
}

// ---------------------------------------------------------------------------
// 3. The manifest parser (Manifest::parse).

/// Where the generated manifests say they were read from.
fn manifest_path() -> PathBuf {
    std::env::temp_dir().join("fuzz.toml")
}

/// A TOML basic string holding `s` exactly.
fn toml_string(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if c.is_control() => out.push_str(&format!("\\u{:04X}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

const TOML_PIECES: &[&str] = &[
    "id",
    "command",
    "args",
    "env",
    "cwd",
    "protocol",
    "instances",
    "enabled",
    "env_clear",
    "policy",
    "call_timeout_s",
    "tool_timeouts",
    "[limits]",
    "[restart]",
    "[limits.tool_timeouts]",
    "[[args]]",
    "[[limits]]",
    " = ",
    "=",
    "\"sh\"",
    "\"a.b\"",
    "\"a\\nb\"",
    "\"\\u0000\"",
    "'lit'",
    "'''",
    "\"\"\"",
    "[",
    "]",
    "{",
    "}",
    ",",
    ".",
    "9223372036854775807",
    "18446744073709551616",
    "-1",
    "0",
    "1e400",
    "inf",
    "nan",
    "true",
    "1979-05-27T07:32:00Z",
    "\n",
    "\r\n",
    "\r",
    "\0",
    "\u{feff}",
    "#",
    " ",
    "\t",
    "\u{7f}",
    "\u{202e}",
    "\"",
    "\\",
    "x",
];

/// What a generated valid manifest says.
#[derive(Debug, Clone)]
struct Spec {
    id: String,
    command: &'static str,
    args: Vec<String>,
    env: BTreeMap<String, String>,
    env_clear: bool,
    enabled: Option<bool>,
    instances: Option<usize>,
    protocol: Option<&'static str>,
    policy: Option<(&'static str, RestartPolicy)>,
    /// One value (or the default) per entry of KNOB_RANGES.
    knobs: Vec<Option<u64>>,
    tool_timeouts: BTreeMap<String, u64>,
    /// The order the top-level keys are written in.
    order: Vec<usize>,
}

const LIMIT_KNOBS: usize = 9;

fn arb_spec() -> impl Strategy<Value = Spec> {
    let knobs = KNOB_RANGES
        .iter()
        .map(|&(_, min, max)| prop::option::of(min..=max))
        .collect::<Vec<_>>();
    (
        "[A-Za-z0-9_-]{1,40}",
        select(&["sh", "/bin/sh", "cat"][..]),
        prop::collection::vec(arb_text(), 0..5),
        prop::collection::btree_map("[a-z][a-z0-9_]{0,7}", arb_text(), 0..4),
        any::<bool>(),
        prop::option::of(any::<bool>()),
        prop::option::of(1usize..=64),
        prop::option::of(select(
            &[
                "auto",
                "2026-07-28",
                "2025-11-25",
                "2025-06-18",
                "2025-03-26",
                "2024-11-05",
            ][..],
        )),
        prop::option::of(select(
            &[
                ("always", RestartPolicy::Always),
                ("on-failure", RestartPolicy::OnFailure),
                ("never", RestartPolicy::Never),
            ][..],
        )),
        knobs,
        prop::collection::btree_map(arb_text(), any::<u64>(), 0..4),
        Just((0..9).collect::<Vec<usize>>()).prop_shuffle(),
    )
        .prop_map(
            |(
                id,
                command,
                args,
                mut env,
                env_clear,
                enabled,
                instances,
                protocol,
                policy,
                mut knobs,
                timeouts,
                order,
            )| {
                if env_clear && !command.contains('/') {
                    env.insert("PATH".to_owned(), "/usr/bin:/bin".to_owned());
                }
                // backoff_max_ms may not be below backoff_initial_ms.
                let value = |knobs: &[Option<u64>], i: usize| knobs[i].unwrap_or(default_knob(i));
                let (initial, max) = (9, 10);
                if value(&knobs, max) < value(&knobs, initial) {
                    knobs[max] = Some(value(&knobs, initial));
                }
                let call_timeout = value(&knobs, 0);
                let tool_timeouts = timeouts
                    .into_iter()
                    .map(|(tool, secs)| (tool, 1 + secs % call_timeout))
                    .collect();
                Spec {
                    id,
                    command,
                    args,
                    env,
                    env_clear,
                    enabled,
                    instances,
                    protocol,
                    policy,
                    knobs,
                    tool_timeouts,
                    order,
                }
            },
        )
}

/// The default of knob `i` of KNOB_RANGES.
fn default_knob(i: usize) -> u64 {
    knob_values(&Restart::default(), &Limits::default())[i]
}

impl Spec {
    fn text(&self) -> String {
        let mut top: Vec<Option<String>> = vec![
            Some(format!("id = {}", toml_string(&self.id))),
            Some(format!("command = {}", toml_string(self.command))),
            (!self.args.is_empty()).then(|| {
                let args: Vec<String> = self.args.iter().map(|a| toml_string(a)).collect();
                format!("args = [{}]", args.join(", "))
            }),
            (!self.env.is_empty()).then(|| {
                let env: Vec<String> = self
                    .env
                    .iter()
                    .map(|(k, v)| format!("{k} = {}", toml_string(v)))
                    .collect();
                format!("env = {{ {} }}", env.join(", "))
            }),
            self.env_clear.then(|| "env_clear = true".to_owned()),
            self.enabled.map(|e| format!("enabled = {e}")),
            self.instances.map(|n| format!("instances = {n}")),
            self.protocol
                .map(|p| format!("protocol = {}", toml_string(p))),
            Some("# a comment".to_owned()),
        ];
        let mut text = String::new();
        for &i in &self.order {
            if let Some(line) = top[i].take() {
                text.push_str(&line);
                text.push('\n');
            }
        }
        text.push_str("\n[limits]\n");
        for (i, &(key, _, _)) in KNOB_RANGES.iter().enumerate() {
            if i == LIMIT_KNOBS {
                text.push_str("\n[restart]\n");
                if let Some((policy, _)) = self.policy {
                    text.push_str(&format!("policy = \"{policy}\"\n"));
                }
            }
            if let Some(value) = self.knobs[i] {
                text.push_str(&format!("{key} = {value}\n"));
            }
        }
        if !self.tool_timeouts.is_empty() {
            text.push_str("\n[limits.tool_timeouts]\n");
            for (tool, secs) in &self.tool_timeouts {
                text.push_str(&format!("{} = {secs}\n", toml_string(tool)));
            }
        }
        text
    }
}

fn hostile_toml() -> impl Strategy<Value = String> {
    hostile_text(TOML_PIECES, arb_spec().prop_map(|spec| spec.text()).boxed())
}

/// Parses `text` as a manifest, and checks the error's shape if it is one.
fn parse_manifest(text: &str) -> Result<Manifest, toolboxd::manifest::ManifestError> {
    let parsed = Manifest::parse(&manifest_path(), text);
    if let Err(e) = &parsed {
        assert_one_line(&e.to_string());
        assert_eq!(e.path, manifest_path());
        if let Some(line) = e.line {
            assert!(
                (1..=text.split('\n').count()).contains(&line),
                "line {line} of {text:?}"
            );
        }
    }
    parsed
}

proptest! {
    #![proptest_config(config())]

    /// Any text is a manifest or an error naming the file, a line of it (if
    /// any) and the fault, on one line.
    #[test]
    fn manifest_parse_is_total(text in hostile_toml()) {
        if let Ok(manifest) = parse_manifest(&text) {
            prop_assert!(valid_id(&manifest.id));
            prop_assert!((1..=64).contains(&manifest.instances));
        }
    }

    /// A valid manifest reads as what it says, every default filled in.
    #[test]
    fn manifest_valid_text_reads_as_written(spec in arb_spec()) {
        let text = spec.text();
        let manifest = parse_manifest(&text).map_err(|e| TestCaseError::fail(format!("{e}\n{text}")))?;
        prop_assert_eq!(&manifest.id, &spec.id);
        prop_assert!(manifest.program.ends_with(spec.command.trim_start_matches('/')));
        prop_assert_eq!(&manifest.args, &spec.args);
        prop_assert_eq!(&manifest.env, &spec.env);
        prop_assert_eq!(manifest.env_clear, spec.env_clear);
        prop_assert_eq!(manifest.enabled, spec.enabled.unwrap_or(true));
        prop_assert_eq!(manifest.instances, spec.instances.unwrap_or(1));
        prop_assert_eq!(manifest.protocol.as_deref(), spec.protocol.filter(|p| *p != "auto"));
        prop_assert_eq!(manifest.restart.policy, spec.policy.map_or(RestartPolicy::Always, |p| p.1));
        let expected: Vec<u64> = (0..KNOB_RANGES.len()).map(|i| spec.knobs[i].unwrap_or(default_knob(i))).collect();
        prop_assert_eq!(knob_values(&manifest.restart, &manifest.limits).to_vec(), expected);
        prop_assert_eq!(&manifest.limits.tool_timeouts, &spec.tool_timeouts);
        let path = manifest_path();
        prop_assert_eq!(manifest.cwd.as_path(), path.parent().unwrap());
    }

    /// An id outside `[A-Za-z0-9_-]+` is refused at its line with the rule.
    #[test]
    fn manifest_bad_ids_are_refused_at_their_line(
        spec in arb_spec(),
        id in arb_text().prop_filter("not a toolbox_id", |id| !valid_id(id)),
    ) {
        let mut spec = spec;
        spec.id = id;
        let text = spec.text();
        let e = parse_manifest(&text).expect_err("a bad id");
        let line = text.lines().position(|l| l.starts_with("id = ")).unwrap() + 1;
        prop_assert_eq!(e.line, Some(line));
        prop_assert!(e.message.contains("never ':' or '.'"), "{}", e);
    }

    /// A knob past its range, up to the largest TOML integer, is refused at
    /// its line; so is a tool deadline longer than the call's.
    #[test]
    fn manifest_knobs_out_of_range_are_refused_at_their_line(
        spec in arb_spec(),
        knob in 0..KNOB_RANGES.len(),
        above: bool,
        by in 1u64..=i64::MAX as u64,
        tool in arb_text(),
    ) {
        let (key, min, max) = KNOB_RANGES[knob];
        let value = if above { max.saturating_add(by).min(i64::MAX as u64) } else if min > 0 { min - 1 - (by - 1) % min } else { return Ok(()) };
        let mut spec = spec;
        let valid = spec.knobs[knob];
        spec.knobs[knob] = Some(value);
        let text = spec.text();
        let e = parse_manifest(&text).expect_err("a knob out of range");
        let line = text.lines().position(|l| l.starts_with(&format!("{key} = "))).unwrap() + 1;
        prop_assert_eq!(e.line, Some(line), "{}", e);
        // Past its type (a u32 knob), TOML's own words name the type.
        prop_assert!(e.message.contains(key) || e.message.contains("expected u32"), "{}", e);

        spec.knobs[knob] = valid;
        let call_timeout = spec.knobs[0].unwrap_or(default_knob(0));
        spec.tool_timeouts = BTreeMap::from([(tool, call_timeout + 1 + by % 1000)]);
        let e = parse_manifest(&spec.text()).expect_err("a tool deadline past the call's");
        prop_assert!(e.message.contains("not lengthen"), "{}", e);
    }
}

#[test]
fn manifest_hostile_corpus() {
    let head = "id = \"math\"\ncommand = \"sh\"\n";
    // The largest TOML integer in a knob: refused at its line.
    let e = parse_manifest(&format!(
        "{head}[limits]\nprobe_interval_s = 9223372036854775807\n"
    ))
    .unwrap_err();
    assert_eq!(e.line, Some(4));
    assert_eq!(
        e.message,
        "probe_interval_s = 9223372036854775807 must be between 1 and 3600"
    );
    // Past it, and below zero: refused by TOML or the knob's type.
    for value in [
        "9223372036854775808",
        "18446744073709551616",
        "-1",
        "1e400",
        "inf",
        "nan",
    ] {
        let e =
            parse_manifest(&format!("{head}[limits]\nprobe_interval_s = {value}\n")).unwrap_err();
        assert_eq!(e.line, Some(4), "{value}: {e}");
    }
    // A huge table array: refused, quickly.
    for key in ["args", "limits", "x"] {
        let text = format!("{head}{}", format!("[[{key}]]\na = 1\n").repeat(50_000));
        let started = std::time::Instant::now();
        parse_manifest(&text).unwrap_err();
        assert!(
            started.elapsed() < std::time::Duration::from_secs(10),
            "{key}"
        );
    }
    // TOML bombs: inline tables and arrays nested deep, in a file under the
    // size limit.
    for depth in [200, 10_000, 100_000] {
        for (open, close) in [("{a = ", "}"), ("[", "]")] {
            let bomb = format!("{}1{}", open.repeat(depth), close.repeat(depth));
            let e = parse_manifest(&format!("{head}x = {bomb}\n")).unwrap_err();
            assert_eq!(e.line, Some(3), "{depth} {open}: {e}");
            parse_manifest(&format!("{head}[limits.tool_timeouts]\nt = {bomb}\n")).unwrap_err();
            parse_manifest(&format!("{head}x = {}\n", open.repeat(depth))).unwrap_err();
        }
    }
    // Ids that would break a topic or a log line.
    for id in ["a.b", "a:b", "a\nb", "a\u{0}b", "a\u{202e}b", "", " a"] {
        let e =
            parse_manifest(&format!("command = \"sh\"\nid = {}\n", toml_string(id))).unwrap_err();
        assert_eq!(e.line, Some(2), "{id:?}");
        assert!(e.message.contains("never ':' or '.'"), "{e}");
    }
    // Found by the properties above: what an error quotes from the file (an
    // unknown key, a value, a path) is escaped, so the error stays one line.
    let e = parse_manifest(&format!("{head}\"a\\nb\" = 1\n")).unwrap_err();
    assert!(
        e.to_string().starts_with(&format!(
            "{}:3: unknown field `a\\nb`, expected one of",
            manifest_path().display()
        )),
        "{e}"
    );
    let e = parse_manifest(&format!(
        "{head}[limits.tool_timeouts]\n\"x\\u001b[2J\" = 0\n"
    ))
    .unwrap_err();
    assert!(
        e.to_string()
            .contains("tool_timeouts.x\\u{1b}[2J = 0 must be between 1"),
        "{e}"
    );
    let e = parse_manifest("id = \"a\"\ncommand = \"./a\\nb\"\n").unwrap_err();
    assert!(e.to_string().contains("/a\\nb does not exist"), "{e}");
    // A file name with a newline (load_dirs reads any *.toml) is escaped too.
    let e = toolboxd::manifest::ManifestError {
        path: PathBuf::from("dir/a\nb.toml"),
        line: Some(1),
        message: "x\u{1b}[2J".to_owned(),
    };
    assert_eq!(e.to_string(), "dir/a\\nb.toml:1: x\\u{1b}[2J");
    // Raw control characters in a key or a value, and a BOM.
    for text in [
        format!("{head}\"a\nb\" = 1\n"),
        format!("{head}\"a\\nb\" = 1\n"),
        format!("{head}[restart]\npolicy = \"a\\nb\"\n"),
        format!("{head}[limits.tool_timeouts]\n\"a\\nb\" = 0\n"),
        format!("{head}[limits.tool_timeouts]\n\"a\\u001b[2Jb\" = 99999999\n"),
        "id = \"a\"\ncommand = \"./a\\nb\"\n".to_owned(),
        "id = \"a\"\ncommand = \"a\\nb\"\n".to_owned(),
        "id = \"a\"\ncommand = \"sh\"\ncwd = \"a\\nb\"\n".to_owned(),
        format!("\u{feff}{head}"),
        format!("{head}\0"),
    ] {
        // parse_manifest checks that the error reads as one line.
        let _ = parse_manifest(&text);
    }
}

// ---------------------------------------------------------------------------
// 4. The control protocol (Operation::parse, control::decode_request).

fn arb_operation() -> impl Strategy<Value = Operation> {
    prop_oneof![
        Just(Operation::Status),
        Just(Operation::Reload),
        arb_text().prop_map(Operation::Restart),
        arb_text().prop_map(Operation::Stop),
        arb_text().prop_map(Operation::Start),
        (arb_text(), 1..=toolboxd::child::LOG_LINES)
            .prop_map(|(id, lines)| Operation::Logs { id, lines }),
    ]
}

fn arb_request_line() -> impl Strategy<Value = String> {
    (
        prop::option::of(arb_json()),
        prop::option::of(prop_oneof![
            select(&Operation::NAMES[..]).prop_map(Value::from),
            arb_json()
        ]),
        prop::option::of(prop_oneof![
            arb_text().prop_map(|id| json!({ "id": id })),
            arb_json()
        ]),
    )
        .prop_map(|(id, method, params)| {
            let mut request = Map::new();
            request.insert("jsonrpc".into(), "2.0".into());
            for (key, value) in [("id", id), ("method", method), ("params", params)] {
                if let Some(value) = value {
                    request.insert(key.into(), value);
                }
            }
            Value::Object(request).to_string()
        })
}

proptest! {
    #![proptest_config(config())]

    /// Every operation's wire name and params parse back to it, directly and
    /// through the line `toolboxd ctl` sends.
    #[test]
    fn control_operations_round_trip(operation in arb_operation()) {
        prop_assert_eq!(Operation::parse(operation.name(), &operation.params()), Ok(operation.clone()));
        prop_assert_eq!(
            decode_request(&request_line(&operation)),
            (json!(1), Ok(operation))
        );
    }

    /// A method that is not an operation is refused by name, on one line.
    #[test]
    fn control_unknown_methods_are_refused_by_name(
        method in arb_text().prop_filter("not an operation", |m| !Operation::NAMES.contains(&m.as_str())),
        params in arb_json(),
    ) {
        let e = Operation::parse(&method, &params).unwrap_err();
        prop_assert_eq!(&e, &BadRequest::Unknown(method.clone()));
        assert_one_line(&e.to_string());
        let quoted = format!("{method:?}");
        prop_assert!(e.to_string().contains(&quoted));
    }

    /// An operation on a toolbox needs a string params.id; without one it is
    /// refused, naming the operation.
    #[test]
    fn control_operations_on_a_toolbox_need_a_string_id(
        name in select(&["restart", "stop", "start", "logs"][..]),
        params in arb_json().prop_filter("no string id", |p| !p.get("id").is_some_and(Value::is_string)),
    ) {
        prop_assert_eq!(Operation::parse(name, &params), Err(BadRequest::NoId(name)));
    }

    /// Every request line is an operation or a JSON-RPC error with the
    /// request's id and a one-line message: -32700 exactly when the line is
    /// not JSON.
    #[test]
    fn control_decode_request_is_total(line in hostile_text(JSON_PIECES, arb_request_line().boxed())) {
        let (id, decoded) = decode_request(&line);
        match serde_json::from_str::<Value>(&line) {
            Err(_) => {
                prop_assert_eq!(&id, &Value::Null);
                let (code, message) = decoded.unwrap_err();
                prop_assert_eq!(code, -32700);
                prop_assert!(message.starts_with("not JSON: "));
                assert_one_line(&message);
            }
            Ok(request) => {
                prop_assert_eq!(&id, request.get("id").unwrap_or(&Value::Null));
                match decoded {
                    Ok(operation) => prop_assert_eq!(Ok(operation), Operation::from_request(&request)),
                    Err((code, message)) => {
                        prop_assert_eq!(code, -32602);
                        prop_assert_eq!(message, Operation::from_request(&request).unwrap_err().to_string());
                    }
                }
            }
        }
    }
}

#[test]
fn control_hostile_corpus() {
    let decode = |line: &str| {
        let (id, decoded) = decode_request(line);
        if let Err((_, message)) = &decoded {
            assert_one_line(message);
        }
        (id, decoded)
    };
    let error = |line: &str| decode(line).1.unwrap_err();
    assert_eq!(error("not json").0, -32700);
    assert_eq!(error("").0, -32700);
    assert_eq!(error("\u{feff}{\"method\":\"status\"}").0, -32700);
    assert_eq!(error(&nested(10_000, false, true)).0, -32700);
    // A batch is no request.
    assert_eq!(
        decode(r#"[{"jsonrpc":"2.0","id":1,"method":"status"}]"#),
        (Value::Null, Err((-32602, "no method".to_owned())))
    );
    // A method or an id with a newline or an escape sequence: escaped.
    let (_, decoded) = decode(r#"{"id":1,"method":"status\n\u001b[2J"}"#);
    assert_eq!(
        decoded,
        Err((
            -32602,
            "unknown method \"status\\n\\u{1b}[2J\"; use status, restart, stop, start, reload or logs"
                .to_owned()
        ))
    );
    assert_eq!(
        decode(r#"{"id":"7","method":"stop","params":{"id":"a\nb"}}"#),
        (json!("7"), Ok(Operation::Stop("a\nb".to_owned())))
    );
    // Ids of any kind are echoed; params of the wrong kind name the need.
    assert_eq!(
        decode(r#"{"id":{"x":[1]},"method":"restart","params":[{"id":"a"}]}"#),
        (
            json!({"x": [1]}),
            Err((-32602, "restart needs params.id (a toolbox id)".to_owned()))
        )
    );
    assert_eq!(
        decode(r#"{"id":9223372036854775807,"method":"status","params":"x"}"#),
        (json!(i64::MAX), Ok(Operation::Status))
    );
    // "method" twice: the last one counts, as in every JSON map.
    assert_eq!(
        decode(r#"{"method":"stop","method":"status"}"#).1,
        Ok(Operation::Status)
    );
}

/// The paths used above exist (the manifest's directory) so that a failure
/// is the decoder's, not the machine's.
#[test]
fn the_manifest_directory_exists() {
    assert!(Path::new(&manifest_path()).parent().unwrap().is_dir());
}
