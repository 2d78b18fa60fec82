//! The MCP face over stdio: one JSON-RPC message per line in, one per line
//! out (the MCP stdio transport). Lines are bounded; a line that is not
//! JSON, or too long, is answered with a JSON-RPC error and the face reads
//! on. Ends when stdin does.

use std::sync::Arc;

use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::sync::mpsc;

use super::conversation::{send_error, Conversation, INVALID_REQUEST, PARSE_ERROR};

/// The longest line read: a tool call's arguments fit many times over.
pub const MAX_LINE_BYTES: usize = 4 * 1024 * 1024;

/// Serves `conversation` on `input` and `output` until `input` ends.
pub async fn serve<R, W>(conversation: Arc<Conversation>, input: R, output: W)
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let (out, mut outgoing) = mpsc::unbounded_channel::<Value>();
    let writer = tokio::spawn(async move {
        let mut output = output;
        while let Some(message) = outgoing.recv().await {
            let mut line = message.to_string();
            line.push('\n');
            if output.write_all(line.as_bytes()).await.is_err() {
                return;
            }
            if outgoing.is_empty() && output.flush().await.is_err() {
                return;
            }
        }
    });
    // A client of the legacy era hears of catalog changes as they happen.
    let told = out.clone();
    let watcher_conversation = conversation.clone();
    let watcher = tokio::spawn(async move {
        let mut changes = watcher_conversation.relay().changes();
        changes.mark_unchanged();
        while changes.changed().await.is_ok() {
            if watcher_conversation.is_legacy() {
                let note = serde_json::json!({"jsonrpc": "2.0",
                                              "method": "notifications/tools/list_changed"});
                if told.send(note).is_err() {
                    return;
                }
            }
        }
    });
    let mut input = BufReader::new(input);
    let mut line = Vec::new();
    loop {
        line.clear();
        match read_bounded_line(&mut input, &mut line).await {
            Ok(Line::End) => break,
            Ok(Line::TooLong) => send_error(
                &out,
                Value::Null,
                INVALID_REQUEST,
                &format!("a message longer than {MAX_LINE_BYTES} bytes was skipped"),
                None,
            ),
            Ok(Line::Read) => {
                if line.iter().all(u8::is_ascii_whitespace) {
                    continue;
                }
                match serde_json::from_slice::<Value>(&line) {
                    Ok(message) => conversation.handle(message, &out),
                    Err(e) => send_error(
                        &out,
                        Value::Null,
                        PARSE_ERROR,
                        &format!("a line that is not JSON: {e}"),
                        None,
                    ),
                }
            }
            Err(e) => {
                tracing::warn!("reading stdin failed: {e}");
                break;
            }
        }
    }
    watcher.abort();
    // The client is gone: what it asked for is cancelled (its calls told to
    // stop on the bus, its listen streams ended), so the face can exit.
    conversation.cancel_all();
    drop(out);
    // What is still being answered goes out first (calls in flight hold a
    // sender each; they end within their wait).
    let _ = writer.await;
}

/// What one read of a line gave.
enum Line {
    /// A whole line (without its newline).
    Read,
    /// A line longer than [`MAX_LINE_BYTES`], skipped to its end.
    TooLong,
    /// The end of the input.
    End,
}

/// Reads one line into `line`, or skips it when it is too long.
async fn read_bounded_line<R: AsyncRead + Unpin>(
    input: &mut BufReader<R>,
    line: &mut Vec<u8>,
) -> std::io::Result<Line> {
    let mut too_long = false;
    loop {
        let available = input.fill_buf().await?;
        if available.is_empty() {
            return Ok(if too_long || !line.is_empty() {
                if too_long {
                    Line::TooLong
                } else {
                    Line::Read
                }
            } else {
                Line::End
            });
        }
        let (chunk, used, ended) = match available.iter().position(|&b| b == b'\n') {
            Some(i) => (&available[..i], i + 1, true),
            None => (available, available.len(), false),
        };
        if !too_long {
            if line.len() + chunk.len() > MAX_LINE_BYTES {
                too_long = true;
                line.clear();
            } else {
                line.extend_from_slice(chunk);
            }
        }
        input.consume(used);
        if ended {
            return Ok(if too_long { Line::TooLong } else { Line::Read });
        }
    }
}
