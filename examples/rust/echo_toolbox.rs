//! A compiled MCP stdio toolbox: the smallest fast child, for benchmarks and
//! as a model for toolboxes in Rust. Speaks both MCP eras; serde_json only.
//!
//! Tools: `add` {a, b} -> {result}; `echo` {text} -> {text}; `sleep` {ms} ->
//! {slept_ms} (on its own thread, so sleeps overlap); `spin` {ms} -> {spun_ms}
//! (burns CPU). `EXTRA_TOOLS=N` lists N more echo tools.
//!
//! Build: `cargo build --release --example echo_toolbox`.

use std::io::{BufRead, Write};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

const MODERN: &str = "2026-07-28";
const LEGACY: [&str; 4] = ["2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05"];

fn tools() -> Value {
    let mut list = core_tools();
    // EXTRA_TOOLS=N adds N more (echo-like) tools, for catalog-size benchmarks.
    let extra: usize = std::env::var("EXTRA_TOOLS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    if let Value::Array(items) = &mut list {
        for i in 0..extra {
            let mut tool = items[1].clone();
            tool["name"] = json!(format!("echo{i}"));
            items.push(tool);
        }
    }
    list
}

fn core_tools() -> Value {
    let int = json!({"type": "integer"});
    let obj = |props: Value, required: Value| json!({"type": "object", "properties": props, "required": required});
    json!([
        {"name": "add", "description": "Add two integers.",
         "inputSchema": obj(json!({"a": int, "b": int}), json!(["a", "b"])),
         "outputSchema": obj(json!({"result": int}), json!(["result"]))},
        {"name": "echo", "description": "Return the text unchanged.",
         "inputSchema": obj(json!({"text": {"type": "string"}}), json!(["text"])),
         "outputSchema": obj(json!({"text": {"type": "string"}}), json!(["text"]))},
        {"name": "sleep", "description": "Wait, then answer.",
         "inputSchema": obj(json!({"ms": int}), json!(["ms"])),
         "outputSchema": obj(json!({"slept_ms": int}), json!(["slept_ms"]))},
        {"name": "spin", "description": "Burn CPU, then answer.",
         "inputSchema": obj(json!({"ms": int}), json!(["ms"])),
         "outputSchema": obj(json!({"spun_ms": int}), json!(["spun_ms"]))},
    ])
}

/// A tools/call result with structured output.
fn structured(out: Value) -> Value {
    json!({"content": [{"type": "text", "text": out.to_string()}], "structuredContent": out})
}

fn call(name: &str, args: &Value) -> Value {
    let int = |k: &str| args.get(k).and_then(Value::as_i64).unwrap_or(0);
    match name {
        "add" => structured(json!({"result": int("a") + int("b")})),
        n if n.starts_with("echo") => {
            structured(json!({"text": args.get("text").cloned().unwrap_or(Value::Null)}))
        }
        "spin" => {
            let until = Instant::now() + Duration::from_millis(int("ms").max(0) as u64);
            let mut x = 0u64;
            while Instant::now() < until {
                x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
            }
            std::hint::black_box(x);
            structured(json!({"spun_ms": int("ms")}))
        }
        other => {
            json!({"content": [{"type": "text", "text": format!("ValueError: unknown tool {other}")}],
                        "isError": true})
        }
    }
}

fn main() {
    let out = Arc::new(Mutex::new(std::io::stdout()));
    let send = |out: &Mutex<std::io::Stdout>, msg: Value| {
        let mut line = msg.to_string();
        line.push('\n');
        let mut out = out.lock().unwrap_or_else(|e| e.into_inner());
        let _ = out.write_all(line.as_bytes());
        let _ = out.flush();
    };
    // Answers to the lines already read are written together, once no more
    // input is waiting: one write (one wake-up of the reader) per burst.
    // (Its own buffer, larger than stdin's, so reads bypass that one.)
    let mut input = std::io::BufReader::with_capacity(1 << 16, std::io::stdin().lock());
    let mut answers: Vec<u8> = Vec::new();
    let mut line = String::new();
    loop {
        if input.buffer().is_empty() && !answers.is_empty() {
            let mut out = out.lock().unwrap_or_else(|e| e.into_inner());
            let _ = out.write_all(&answers);
            let _ = out.flush();
            answers.clear();
        }
        line.clear();
        match input.read_line(&mut line) {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
        let Ok(msg) = serde_json::from_str::<Value>(&line) else {
            continue;
        };
        let Some(id) = msg.get("id").cloned() else {
            continue;
        };
        let params = msg.get("params").cloned().unwrap_or(Value::Null);
        let modern = params
            .pointer("/_meta/io.modelcontextprotocol~1protocolVersion")
            .is_some();
        let reply = |result: Value| {
            let mut result = result;
            if modern {
                result["resultType"] = json!("complete");
            }
            json!({"jsonrpc": "2.0", "id": id, "result": result})
        };
        let method = msg.get("method").and_then(Value::as_str).unwrap_or("");
        let answer = match method {
            "server/discover" => reply(json!({
                "supportedVersions": [MODERN, LEGACY[0], LEGACY[1], LEGACY[2], LEGACY[3]],
                "capabilities": {"tools": {}},
                "serverInfo": {"name": "echo_toolbox", "version": "0.1.0"}})),
            "initialize" => {
                let asked = params
                    .get("protocolVersion")
                    .and_then(Value::as_str)
                    .unwrap_or("");
                let version = if LEGACY.contains(&asked) {
                    asked
                } else {
                    LEGACY[0]
                };
                reply(
                    json!({"protocolVersion": version, "capabilities": {"tools": {}},
                             "serverInfo": {"name": "echo_toolbox", "version": "0.1.0"}}),
                )
            }
            "ping" => reply(json!({})),
            "tools/list" => reply(json!({"tools": tools()})),
            "tools/call" => {
                let name = params
                    .get("name")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_owned();
                let args = params.get("arguments").cloned().unwrap_or(json!({}));
                if name == "sleep" {
                    let out = out.clone();
                    let ms = args.get("ms").and_then(Value::as_u64).unwrap_or(0);
                    let answer = reply(structured(json!({"slept_ms": ms})));
                    std::thread::spawn(move || {
                        std::thread::sleep(Duration::from_millis(ms));
                        send(&out, answer);
                    });
                    continue;
                }
                reply(call(&name, &args))
            }
            _ => json!({"jsonrpc": "2.0", "id": id,
                        "error": {"code": -32601, "message": format!("method not found: {method}")}}),
        };
        answers.extend_from_slice(answer.to_string().as_bytes());
        answers.push(b'\n');
    }
}
