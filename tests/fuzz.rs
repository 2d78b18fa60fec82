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

#[path = "fuzz/control.rs"]
mod control;
#[path = "fuzz/envelope.rs"]
mod envelope;
#[path = "fuzz/manifest.rs"]
mod manifest;
#[path = "fuzz/mcp.rs"]
mod mcp;

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
