//! What the MCP face answers, whatever carries it (stdio, streamable
//! HTTP): one JSON-RPC message in, its response and notifications out.
//!
//! Both eras of MCP are served (docs/agents.md): the current revision
//! (`2026-07-28`: no handshake, `server/discover`, every request naming its
//! version in `_meta`, change notifications on a `subscriptions/listen`
//! stream) and the previous ones (`initialize`, then requests; change
//! notifications sent as they happen). Tools are the bus's
//! (`catalog.rs`); a call is relayed to the bus (`relay.rs`), its
//! progress and its cancellation with it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use serde_json::{json, Map, Value};
use tokio::sync::{mpsc, oneshot, watch, OwnedSemaphorePermit, Semaphore};

use super::relay::{Relay, RelayError};
use crate::bus::envelope::Object;
use crate::manifest::{LEGACY_VERSIONS, MODERN_VERSIONS};
use crate::mcp::UNSUPPORTED_PROTOCOL_VERSION;

/// Where a conversation's outgoing messages go.
pub type Out = mpsc::UnboundedSender<Value>;

/// JSON-RPC: not JSON.
pub const PARSE_ERROR: i64 = -32700;
/// JSON-RPC: not a request.
pub const INVALID_REQUEST: i64 = -32600;
/// JSON-RPC: no such method.
const METHOD_NOT_FOUND: i64 = -32601;
/// JSON-RPC: wrong parameters (an unknown tool, for MCP).
const INVALID_PARAMS: i64 = -32602;

/// `_meta` key of a modern request's protocol version.
const VERSION_KEY: &str = "io.modelcontextprotocol/protocolVersion";
/// `_meta` key on every frame of a `subscriptions/listen` stream.
const SUBSCRIPTION_KEY: &str = "io.modelcontextprotocol/subscriptionId";

/// The MCP conversations of one transport: the calls and listen streams
/// in flight, bounded, and (over stdio) by JSON-RPC id, so that a
/// `notifications/cancelled` finds them.
pub struct Conversation {
    /// The bus.
    relay: Arc<Relay>,
    /// What a cancellation ends, by the request's id (as JSON text); `None`
    /// over HTTP, where the ids of different clients may be the same and a
    /// client cancels by closing its response stream.
    in_flight: Option<Mutex<HashMap<String, oneshot::Sender<()>>>>,
    /// Calls in flight at once ([`MAX_CALLS`]).
    calls: Arc<Semaphore>,
    /// Listen streams open at once ([`MAX_LISTENS`]).
    listens: Arc<Semaphore>,
    /// A client did the legacy handshake: catalog changes are told to it as
    /// they happen (a modern client asks with `subscriptions/listen`).
    legacy: AtomicBool,
}

/// Calls a conversation has in flight at once; one more is refused.
const MAX_CALLS: usize = 256;
/// Listen streams a conversation keeps open at once; one more is refused.
const MAX_LISTENS: usize = 16;
/// The shortest time between two progress notifications of one call: a
/// flood of reports (a bus client may forge them) is coalesced, the latest
/// wins.
const PROGRESS_INTERVAL: std::time::Duration = std::time::Duration::from_millis(100);

/// A request's place among those in flight: its slot, and the cancellation
/// it listens for; given back when dropped.
struct InFlight {
    /// Fires when a `notifications/cancelled` names the request.
    cancelled: Option<oneshot::Receiver<()>>,
    /// Its key in the table, removed when it ends.
    key: Option<String>,
    /// The conversation, to remove it from.
    conversation: Arc<Conversation>,
    /// Its slot among [`MAX_CALLS`] or [`MAX_LISTENS`].
    _slot: OwnedSemaphorePermit,
}

impl InFlight {
    /// Resolves when a `notifications/cancelled` names the request (never
    /// over HTTP, nor once its table entry was replaced).
    async fn cancelled(&mut self) {
        if let Some(cancelled) = &mut self.cancelled {
            if cancelled.await.is_ok() {
                return;
            }
            self.cancelled = None;
        }
        std::future::pending().await
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        if let (Some(key), Some(table)) = (&self.key, &self.conversation.in_flight) {
            table.lock().unwrap_or_else(|e| e.into_inner()).remove(key);
        }
    }
}

/// One request, as the conversation reads it.
struct Asked {
    /// Its JSON-RPC id.
    id: Value,
    /// Its parameters (`{}` when it has none).
    params: Map<String, Value>,
    /// It names the modern protocol version in `_meta`: its result says
    /// `resultType`.
    modern: bool,
}

impl Conversation {
    /// Conversations relayed to the bus through `relay`; `by_id`: a
    /// `notifications/cancelled` ends the request it names (one client:
    /// stdio).
    pub fn new(relay: Arc<Relay>, by_id: bool) -> Arc<Conversation> {
        Arc::new(Conversation {
            relay,
            in_flight: by_id.then(Mutex::default),
            calls: Arc::new(Semaphore::new(MAX_CALLS)),
            listens: Arc::new(Semaphore::new(MAX_LISTENS)),
            legacy: AtomicBool::new(false),
        })
    }

    /// Takes a place for request `id` among those of `slots`, or says why
    /// not (all taken; an id already in flight).
    fn enter(
        self: &Arc<Self>,
        id: &Value,
        slots: &Arc<Semaphore>,
        most: usize,
    ) -> Result<InFlight, String> {
        let slot = slots.clone().try_acquire_owned().map_err(|_| {
            format!("too many requests of this kind in flight ({most} at most); wait for answers")
        })?;
        let (key, cancelled) = match &self.in_flight {
            None => (None, None),
            Some(table) => {
                let key = id.to_string();
                let mut table = table.lock().unwrap_or_else(|e| e.into_inner());
                if table.contains_key(&key) {
                    return Err(format!("a request with id {key} is in flight already"));
                }
                let (cancel, cancelled) = oneshot::channel();
                table.insert(key.clone(), cancel);
                (Some(key), Some(cancelled))
            }
        };
        Ok(InFlight {
            cancelled,
            key,
            conversation: self.clone(),
            _slot: slot,
        })
    }

    /// Cancels every request in flight (the client went away).
    pub fn cancel_all(&self) {
        if let Some(table) = &self.in_flight {
            let mut table = table.lock().unwrap_or_else(|e| e.into_inner());
            for (_, cancel) in table.drain() {
                let _ = cancel.send(());
            }
        }
    }

    /// The bus this conversation relays to.
    pub fn relay(&self) -> &Arc<Relay> {
        &self.relay
    }

    /// Whether a client did the legacy handshake (catalog changes are then
    /// told to it as they happen, on a transport that can).
    pub fn is_legacy(&self) -> bool {
        self.legacy.load(Ordering::Relaxed)
    }

    /// Answers one incoming message on `out`: a request gets exactly one
    /// response (a cancelled call none, as MCP says), a notification none.
    /// A call and a listen stream run on a task of their own.
    pub fn handle(self: &Arc<Self>, message: Value, out: &Out) {
        let Value::Object(mut message) = message else {
            return send_error(
                out,
                Value::Null,
                INVALID_REQUEST,
                "a JSON-RPC message is an object (batches are not taken)",
                None,
            );
        };
        let id = message.remove("id");
        let method = match message.get("method").and_then(Value::as_str) {
            Some(method) => method.to_owned(),
            // A response from the client: nothing was asked of it.
            None if message.contains_key("result") || message.contains_key("error") => return,
            None => {
                return send_error(
                    out,
                    id.unwrap_or(Value::Null),
                    INVALID_REQUEST,
                    "the message has no method",
                    None,
                )
            }
        };
        let params = match message.remove("params") {
            None | Some(Value::Null) => Map::new(),
            Some(Value::Object(params)) => params,
            Some(_) => {
                if let Some(id) = id {
                    send_error(out, id, INVALID_PARAMS, "params must be an object", None);
                }
                return;
            }
        };
        let Some(id) = id else {
            return self.notified(&method, &params);
        };
        let version = params
            .get("_meta")
            .and_then(|m| m.get(VERSION_KEY))
            .and_then(Value::as_str)
            .map(str::to_owned);
        if let Some(version) = version.as_deref() {
            if !MODERN_VERSIONS.contains(&version) && !LEGACY_VERSIONS.contains(&version) {
                let data = json!({"supported": supported_versions(), "requested": version});
                let text = format!("protocol version {version:?} is not one toolboxd speaks");
                return send_error(out, id, UNSUPPORTED_PROTOCOL_VERSION, &text, Some(data));
            }
        }
        let asked = Asked {
            id,
            params,
            modern: version.is_some_and(|v| MODERN_VERSIONS.contains(&v.as_str())),
        };
        match method.as_str() {
            "initialize" => self.initialize(asked, out),
            "server/discover" => send_result(out, &asked, cacheable(discovered(), 60_000)),
            "ping" => send_result(out, &asked, json!({})),
            "tools/list" => self.list(asked, out),
            "tools/call" => self.call(asked, out),
            "subscriptions/listen" => self.listen(asked, out),
            _ => send_error(
                out,
                asked.id,
                METHOD_NOT_FOUND,
                &format!("toolboxd mcp does not serve {method:?} (it serves tools)"),
                None,
            ),
        }
    }

    /// A notification: a cancellation ends its request; the rest need
    /// nothing.
    fn notified(&self, method: &str, params: &Map<String, Value>) {
        if method == "notifications/cancelled" {
            if let (Some(id), Some(table)) = (params.get("requestId"), &self.in_flight) {
                let cancel = table
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .remove(&id.to_string());
                if let Some(cancel) = cancel {
                    let _ = cancel.send(());
                }
            }
        }
    }

    /// `initialize` (the legacy handshake): the client's version if we
    /// speak it, else our newest legacy one.
    fn initialize(&self, asked: Asked, out: &Out) {
        let asked_for = asked.params.get("protocolVersion").and_then(Value::as_str);
        let version = asked_for
            .filter(|v| LEGACY_VERSIONS.contains(v))
            .unwrap_or(LEGACY_VERSIONS[0]);
        self.legacy.store(true, Ordering::Relaxed);
        let result = json!({
            "protocolVersion": version,
            "capabilities": {"tools": {"listChanged": true}},
            "serverInfo": server_info(),
            "instructions": INSTRUCTIONS,
        });
        send_result(out, &asked, result);
    }

    /// `tools/list`: the catalog, read again first (within two seconds).
    fn list(self: &Arc<Self>, asked: Asked, out: &Out) {
        let (this, out) = (self.clone(), out.clone());
        tokio::spawn(async move {
            let catalog = this.relay.refresh().await;
            // Stale at once: the catalog changes as toolboxes come and go.
            let listed = cacheable(json!({"tools": catalog.definitions()}), 0);
            send_result(&out, &asked, listed);
        });
    }

    /// `tools/call`: relayed to the bus, its progress told to the client
    /// when it asked for it (`_meta.progressToken`), cancelled by a
    /// `notifications/cancelled` for its id.
    fn call(self: &Arc<Self>, asked: Asked, out: &Out) {
        let Some(name) = asked.params.get("name").and_then(Value::as_str) else {
            return send_error(
                out,
                asked.id,
                INVALID_PARAMS,
                "tools/call needs the tool's name",
                None,
            );
        };
        let arguments = match asked.params.get("arguments") {
            None | Some(Value::Null) => Value::Object(Map::new()),
            Some(Value::Object(arguments)) => Value::Object(arguments.clone()),
            Some(_) => {
                return send_error(
                    out,
                    asked.id,
                    INVALID_PARAMS,
                    "arguments must be an object",
                    None,
                )
            }
        };
        let name = name.to_owned();
        let token = asked
            .params
            .get("_meta")
            .and_then(|m| m.get("progressToken"))
            .cloned();
        let mut flight = match self.enter(&asked.id, &self.calls, MAX_CALLS) {
            Ok(flight) => flight,
            Err(why) => return send_error(out, asked.id, INVALID_REQUEST, &why, None),
        };
        let (this, out) = (self.clone(), out.clone());
        tokio::spawn(async move {
            let mut entry = this.relay.catalog().get(&name).cloned();
            if entry.is_none() {
                entry = this.relay.refresh().await.get(&name).cloned();
            }
            let Some(entry) = entry else {
                let text = format!("Unknown tool: '{name}' (tools/list names the tools there are)");
                return send_error(&out, asked.id, INVALID_PARAMS, &text, None);
            };
            let (progress_tx, mut progress_rx) = watch::channel::<Option<Object>>(None);
            let progress = token.is_some().then_some(progress_tx);
            // A cancellation, or the client gone: over streamable HTTP in the
            // current revision, closing the response stream is how a client
            // cancels.
            let gone = out.clone();
            let cancelled = async move {
                tokio::select! {
                    () = flight.cancelled() => {}
                    () = gone.closed() => {}
                }
            };
            let relayed =
                this.relay
                    .call(&entry.toolbox, &entry.name, arguments, progress, cancelled);
            tokio::pin!(relayed);
            let mut reporting = token.is_some();
            let answer = loop {
                tokio::select! {
                    answer = &mut relayed => break answer,
                    changed = progress_rx.changed(), if reporting => {
                        let report = progress_rx.borrow_and_update().clone();
                        match (changed, report, &token) {
                            (Err(_), ..) => reporting = false,
                            (Ok(()), Some(report), Some(token)) => {
                                let _ = out.send(progress_notification(token, &report));
                                tokio::time::sleep(PROGRESS_INTERVAL).await;
                            }
                            _ => {}
                        }
                    }
                }
            };
            match answer {
                Err(RelayError::Cancelled) => {}
                Ok(data) => send_result(&out, &asked, call_result(data)),
                Err(e) => send_result(&out, &asked, tool_error(&e.to_string())),
            }
        });
    }

    /// `subscriptions/listen` (modern): acknowledged with what is honored
    /// (the tool list's changes), then a `notifications/tools/list_changed`
    /// at each change, until the client cancels it or goes away.
    fn listen(self: &Arc<Self>, asked: Asked, out: &Out) {
        let wanted = asked
            .params
            .get("notifications")
            .and_then(|n| n.get("toolsListChanged"))
            .and_then(Value::as_bool)
            .unwrap_or(false);
        let meta = json!({SUBSCRIPTION_KEY: asked.id.clone()});
        let honored = if wanted {
            json!({"toolsListChanged": true})
        } else {
            json!({})
        };
        let mut flight = match self.enter(&asked.id, &self.listens, MAX_LISTENS) {
            Ok(flight) => flight,
            Err(why) => return send_error(out, asked.id, INVALID_REQUEST, &why, None),
        };
        let _ = out.send(
            json!({"jsonrpc": "2.0", "method": "notifications/subscriptions/acknowledged",
                                "params": {"notifications": honored, "_meta": meta}}),
        );
        let (this, out) = (self.clone(), out.clone());
        tokio::spawn(async move {
            let mut changes = this.relay.changes();
            changes.mark_unchanged();
            loop {
                tokio::select! {
                    changed = changes.changed(), if wanted => {
                        if changed.is_err() {
                            break;
                        }
                        let told = out.send(json!({"jsonrpc": "2.0",
                            "method": "notifications/tools/list_changed",
                            "params": {"_meta": meta}}));
                        if told.is_err() {
                            break;
                        }
                    }
                    () = flight.cancelled() => break,
                    () = out.closed() => break,
                }
            }
            drop(flight);
            let mut result = json!({"_meta": meta});
            result["resultType"] = json!("complete");
            let _ = out.send(json!({"jsonrpc": "2.0", "id": asked.id, "result": result}));
        });
    }
}

/// What toolboxd tells a model about its tools.
const INSTRUCTIONS: &str = "The tools of the toolboxes toolboxd supervises on the OVOS \
    messagebus: each runs confined, in a process of its own. A name given to tools of two \
    toolboxes is called <toolbox>__<name>.";

/// The versions this face speaks, newest first.
fn supported_versions() -> Vec<&'static str> {
    MODERN_VERSIONS
        .iter()
        .chain(LEGACY_VERSIONS)
        .copied()
        .collect()
}

fn server_info() -> Value {
    json!({"name": "toolboxd", "version": env!("CARGO_PKG_VERSION")})
}

/// The `server/discover` result (the server's identity in `_meta`, as the
/// current revision has it, and as `serverInfo` for the drafts before).
fn discovered() -> Value {
    json!({
        "supportedVersions": supported_versions(),
        "capabilities": {"tools": {"listChanged": true}},
        "serverInfo": server_info(),
        "instructions": INSTRUCTIONS,
        "_meta": {"io.modelcontextprotocol/serverInfo": server_info()},
    })
}

/// `result` with the caching hints of the current revision (how long it
/// may be kept, and only for this client: what one client may call, another
/// may not); a client of an earlier one ignores them.
fn cacheable(mut result: Value, ttl_ms: u64) -> Value {
    result["ttlMs"] = json!(ttl_ms);
    result["cacheScope"] = json!("private");
    result
}

/// The MCP result of a bus call's answer data: a `result` is the
/// structured output (and its text blocks: the tool's own, or the JSON of
/// the result); an `error` is a tool error with its text.
pub fn call_result(data: Object) -> Value {
    if let Some(error) = data.get("error") {
        let text = error
            .as_str()
            .map_or_else(|| error.to_string(), str::to_owned);
        return tool_error(&text);
    }
    let result = data.get("result").cloned().unwrap_or(Value::Null);
    // A tool without an output schema answers {content, is_error, raw}: its
    // blocks are the child's own.
    let blocks = result
        .get("raw")
        .filter(|_| result.get("is_error") == Some(&Value::Bool(false)))
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_else(|| vec![json!({"type": "text", "text": result.to_string()})]);
    let mut answer = json!({"content": blocks, "isError": false});
    if result.is_object() {
        answer["structuredContent"] = result;
    }
    answer
}

/// A tool error: the call was made (or could not be), and failed.
fn tool_error(text: &str) -> Value {
    json!({"content": [{"type": "text", "text": text}], "isError": true})
}

/// `notifications/progress` for `token`, from a bus progress message's data.
fn progress_notification(token: &Value, report: &Object) -> Value {
    let mut params = Map::new();
    params.insert("progressToken".into(), token.clone());
    for key in ["progress", "total", "message"] {
        if let Some(value) = report.get(key) {
            params.insert(key.into(), value.clone());
        }
    }
    json!({"jsonrpc": "2.0", "method": "notifications/progress", "params": params})
}

/// Sends `result` for `asked` (with `resultType`, for a modern request).
fn send_result(out: &Out, asked: &Asked, mut result: Value) {
    if asked.modern {
        if let Value::Object(result) = &mut result {
            result.insert("resultType".into(), json!("complete"));
        }
    }
    let _ = out.send(json!({"jsonrpc": "2.0", "id": asked.id, "result": result}));
}

/// Sends a JSON-RPC error for request `id`.
pub fn send_error(out: &Out, id: Value, code: i64, message: &str, data: Option<Value>) {
    let mut error = json!({"code": code, "message": message});
    if let Some(data) = data {
        error["data"] = data;
    }
    let _ = out.send(json!({"jsonrpc": "2.0", "id": id, "error": error}));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bus_answer_reads_as_an_mcp_result() {
        let data = |v: Value| v.as_object().unwrap().clone();
        assert_eq!(
            call_result(data(json!({"toolbox_id": "math", "result": {"sum": 5}}))),
            json!({"content": [{"type": "text", "text": "{\"sum\":5}"}],
                   "structuredContent": {"sum": 5}, "isError": false})
        );
        let generic = json!({"content": "hi", "is_error": false,
                             "raw": [{"type": "text", "text": "hi"}]});
        assert_eq!(
            call_result(data(json!({"result": generic.clone()}))),
            json!({"content": [{"type": "text", "text": "hi"}],
                   "structuredContent": generic, "isError": false})
        );
        assert_eq!(
            call_result(data(json!({"error": "ValueError: no"}))),
            json!({"content": [{"type": "text", "text": "ValueError: no"}], "isError": true})
        );
    }
}
