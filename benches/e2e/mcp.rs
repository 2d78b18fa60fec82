//! The load through the MCP face: `conns` `toolboxd mcp` processes over
//! stdio, each with one checked `tools/call` of `add` in flight, for RUN
//! after WARMUP; the same closed loop as `load.rs`, the MCP face (and the
//! bus hop it adds) in the path.

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

use super::*;

/// One MCP client of the closed loop, over its own `toolboxd mcp`.
async fn mcp_connection(bus_url: String, conn: u64, start: Instant, end: Instant) -> Connection {
    let mut out = Connection::default();
    let mut face = match tokio::process::Command::new(TOOLBOXD)
        .args(["mcp", "--bus", &bus_url])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
    {
        Ok(face) => face,
        Err(e) => {
            out.faults.error(format!("starting toolboxd mcp: {e}"));
            return out;
        }
    };
    let (Some(mut stdin), Some(stdout)) = (face.stdin.take(), face.stdout.take()) else {
        out.faults.error("toolboxd mcp has no stdio".into());
        return out;
    };
    let mut lines = BufReader::new(stdout).lines();
    // The face lists the catalog before its first call is answered; the
    // handshake and that listing are before the window.
    let hello = [
        json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {},
            "clientInfo": {"name": "bench", "version": "1"}}}),
        json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
        json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}),
    ];
    for message in hello {
        let line = format!("{message}\n");
        if stdin.write_all(line.as_bytes()).await.is_err() {
            out.faults.error("toolboxd mcp closed its stdin".into());
            return out;
        }
    }
    let mut n = 1u64;
    let mut waited = 0;
    // Both answers of the handshake.
    while waited < 2 {
        match tokio::time::timeout(DEADLINE, lines.next_line()).await {
            Ok(Ok(Some(line))) if line.contains("\"id\"") => waited += 1,
            Ok(Ok(Some(_))) => {}
            _ => {
                out.faults.error("toolboxd mcp: no handshake".into());
                return out;
            }
        }
    }
    while Instant::now() < end {
        n += 1;
        let (a, b) = (n, conn);
        let call = json!({"jsonrpc": "2.0", "id": n, "method": "tools/call",
                          "params": {"name": "add", "arguments": {"a": a, "b": b}}});
        let sent = Instant::now();
        if stdin
            .write_all(format!("{call}\n").as_bytes())
            .await
            .is_err()
        {
            out.faults.error(format!("mcp-{conn}-{n}: send"));
            break;
        }
        let answer = loop {
            match tokio::time::timeout(DEADLINE, lines.next_line()).await {
                Err(_) => {
                    out.faults
                        .timeout(format!("mcp-{conn}-{n}: no answer within {DEADLINE:?}"));
                    break None;
                }
                Ok(Ok(Some(line))) => {
                    let Ok(v) = serde_json::from_str::<Value>(&line) else {
                        continue;
                    };
                    if v["id"] == json!(n) {
                        break Some(v);
                    }
                }
                Ok(_) => {
                    out.faults.error(format!("mcp-{conn}-{n}: the face closed"));
                    break None;
                }
            }
        };
        let Some(answer) = answer else { break };
        let at = Instant::now();
        if answer["result"]["structuredContent"] == json!({"result": a + b}) {
            if sent >= start && sent < end {
                out.latencies.push(at - sent);
            }
            if at >= start && at < end {
                out.answered += 1;
            }
        } else {
            out.faults.error(format!(
                "mcp-{conn}-{n}: answer {answer}, expected result {}",
                a + b
            ));
        }
    }
    drop(stdin);
    let _ = tokio::time::timeout(Duration::from_secs(2), face.wait()).await;
    out
}

/// `conns` MCP clients, each over its own `toolboxd mcp` on `bus_url`, with
/// one call in flight, for RUN after WARMUP; the CPU of `service` (the
/// daemon) and of `bus` sampled at the window's ends (the faces' own CPU is
/// not in it).
pub(crate) async fn mcp_load(
    bus_url: &str,
    conns: usize,
    service: u32,
    bus: Option<u32>,
) -> LoadResult {
    // The faces start, connect and list before the window opens.
    let start = Instant::now() + WARMUP + Duration::from_millis(700);
    let end = start + RUN;
    let sampler = cpu_in_window(start, end, service, bus);
    let tasks: Vec<_> = (0..conns as u64)
        .map(|c| tokio::spawn(mcp_connection(bus_url.to_owned(), c, start, end)))
        .collect();
    gather(tasks, sampler).await
}
