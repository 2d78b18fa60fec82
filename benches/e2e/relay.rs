//! The floor for a service that runs its tools in a child: a bare relay, a
//! bus client that forwards each `ovos.tools.invoke` to one child over stdio
//! (a JSON-RPC `tools/call`, many in flight) and answers with the child's
//! structured result. No validation, no sandbox, no supervision: what any
//! such service must at least do. toolboxd's invoke rows are judged against
//! it (docs/performance.md).

use std::collections::HashMap;

use tokio::io::{AsyncBufReadExt, AsyncWriteExt};

use super::*;

/// This benchmark binary, as a bare relay on `url` to a child running
/// `command`.
pub(crate) fn bare_relay(url: &str, command: &Path) -> Proc {
    let mut child = Command::new(std::env::current_exe().expect("the benchmark's own path"))
        .arg("--bare-relay")
        .arg(url)
        .arg(command)
        .stdout(Stdio::piped())
        .spawn()
        .expect("starting the bare relay");
    let stdout = child.stdout.take().expect("piped stdout");
    let proc = Proc(child);
    wait_line(stdout, "ready", "the bare relay");
    proc
}

/// One JSON-RPC line for the child.
fn line(value: Value) -> Vec<u8> {
    let mut line = serde_json::to_vec(&value).expect("JSON encodes");
    line.push(b'\n');
    line
}

/// The relay itself: starts the child, shakes hands with it, then relays
/// until the bus or the child goes away.
pub(crate) async fn run_bare_relay(url: &str, command: &str) {
    let mut child = tokio::process::Command::new(command)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("the bare relay cannot start its child");
    let mut stdin = child.stdin.take().expect("piped stdin");
    let mut lines = tokio::io::BufReader::new(child.stdout.take().expect("piped stdout")).lines();
    let hello = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {},
        "clientInfo": {"name": "bare-relay", "version": "0"}}});
    stdin
        .write_all(&line(hello))
        .await
        .expect("writing to the child");
    lines
        .next_line()
        .await
        .expect("the child's handshake")
        .expect("an answer");
    let initialized = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
    stdin
        .write_all(&line(initialized))
        .await
        .expect("writing to the child");
    let (mut sink, mut stream) = client::connect(url)
        .await
        .expect("the bare relay cannot connect")
        .ws
        .split();
    println!("ready");
    let mut pending: HashMap<u64, Message> = HashMap::new();
    let mut next = 1u64;
    loop {
        tokio::select! {
            frame = stream.next() => {
                let Some(Ok(WsMessage::Text(text))) = frame else { return };
                let Ok(m) = Message::decode(text.as_str()) else { continue };
                if m.msg_type != "ovos.tools.invoke" {
                    continue;
                }
                let call = json!({"jsonrpc": "2.0", "id": next, "method": "tools/call",
                    "params": {"name": m.data.get("name"), "arguments": m.data.get("args")}});
                if stdin.write_all(&line(call)).await.is_err() {
                    return;
                }
                pending.insert(next, m);
                next += 1;
            }
            answer = lines.next_line() => {
                let Ok(Some(answer)) = answer else { return };
                let Ok(answer) = serde_json::from_str::<Value>(&answer) else { continue };
                let Some(m) = answer["id"].as_u64().and_then(|id| pending.remove(&id)) else {
                    continue;
                };
                let data = json!({"name": m.data.get("name"),
                                  "result": answer["result"]["structuredContent"]});
                let Value::Object(data) = data else { continue };
                if sink.send(WsMessage::text(m.response(data).encode())).await.is_err() {
                    return;
                }
            }
        }
    }
}
