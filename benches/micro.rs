//! Microbenchmarks of the hot pieces of a call: envelope decode/encode and the
//! response derivation, argument validation, registry lookup, and the child's
//! JSON-RPC line parsing. `cargo bench --bench micro`.

use std::hint::black_box;
use std::sync::Arc;

use criterion::{criterion_group, criterion_main, Criterion};
use serde_json::json;
use toolboxd::bus::envelope::Message;
use toolboxd::mcp::{self, ToolSpec};
use toolboxd::registry::{Registry, Resolved};
use toolboxd::tool::Tool;

const INVOKE: &str = r#"{"type": "ovos.tools.invoke", "data": {"name": "add", "args": {"a": 2, "b": 3}}, "context": {"source": "skill-x", "destination": ["toolboxd"], "session": {"session_id": "default", "lang": "en-US"}}}"#;

fn add_tool() -> Tool {
    Tool::compile(
        "math",
        ToolSpec {
            name: "add".into(),
            description: "Add two integers.".into(),
            input_schema: json!({"type": "object",
                "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                "required": ["a", "b"], "additionalProperties": false}),
            output_schema: Some(json!({"type": "object",
                "properties": {"result": {"type": "integer"}}, "required": ["result"]})),
            annotations: None,
        },
    )
    .unwrap()
}

fn envelope(c: &mut Criterion) {
    c.bench_function("envelope decode", |b| {
        b.iter(|| Message::decode(black_box(INVOKE)).unwrap())
    });
    let request = Message::decode(INVOKE).unwrap();
    c.bench_function("envelope response + encode", |b| {
        b.iter(|| {
            let mut data = serde_json::Map::new();
            data.insert("name".into(), json!("add"));
            data.insert("result".into(), json!({"result": 5}));
            black_box(&request).response(data).encode()
        })
    });
}

fn validation(c: &mut Criterion) {
    let tool = add_tool();
    let good = json!({"a": 2, "b": 3});
    let bad = json!({"a": 2, "b": "x"});
    c.bench_function("arguments valid", |b| {
        b.iter(|| tool.check_arguments(black_box(&good)).unwrap())
    });
    c.bench_function("arguments invalid (error text)", |b| {
        b.iter(|| tool.check_arguments(black_box(&bad)).unwrap_err())
    });
    c.bench_function("schema compile (add)", |b| b.iter(add_tool));
}

fn registry(c: &mut Criterion) {
    // The flat namespace of a realistic catalog: 200 toolboxes x 10 tools is
    // built through the public API below only for toolboxes with handles, so
    // measure the lookup on the snapshot type directly.
    let registry = Arc::new(Registry::default());
    let catalog = registry.snapshot();
    c.bench_function("registry snapshot", |b| {
        b.iter(|| black_box(registry.snapshot()))
    });
    c.bench_function("flat resolve (miss)", |b| {
        b.iter(|| matches!(catalog.resolve(black_box("add")), Resolved::Unknown))
    });
}

fn child_lines(c: &mut Criterion) {
    let line = br#"{"jsonrpc":"2.0","id":42,"result":{"content":[{"type":"text","text":"{\"result\":5}"}],"structuredContent":{"result":5}}}"#;
    c.bench_function("child response parse", |b| {
        b.iter(|| mcp::parse_line(black_box(line)).unwrap())
    });
    c.bench_function("child request line", |b| {
        b.iter(|| {
            mcp::request_line(
                black_box(42),
                "tools/call",
                &json!({"name": "add", "arguments": {"a": 2, "b": 3}}),
            )
        })
    });
    let result = json!({"content": [{"type": "text", "text": "{\"result\":5}"}], "structuredContent": {"result": 5}});
    let tool = add_tool();
    c.bench_function("result mapping (output checked)", |b| {
        b.iter(|| {
            toolboxd::pipeline::output::answer_of(black_box(result.clone()), &tool, "math").unwrap()
        })
    });
}

criterion_group!(benches, envelope, validation, registry, child_lines);
criterion_main!(benches);
