//! `toolboxd mcp`: the MCP server face (docs/agents.md). It serves the
//! tool catalog of the bus (whichever tool service answers there:
//! toolboxd's, or the Python one) to any MCP client, over stdio or
//! streamable HTTP, and relays each call to the bus as a persona call, so
//! that the daemon runs it through the same pipeline as every bus call:
//! validation, admission, the one deadline, metrics, the audit log (with
//! this face as the call's `source`).
//!
//! - `catalog.rs`: the bus's tool definitions as MCP tools, names made
//!   unique.
//! - `relay.rs`: the bus side: the connection, the catalog kept, a call's
//!   answer, progress and cancellation.
//! - `conversation.rs`: what an MCP message is answered with (both eras).
//! - `stdio.rs`, `http.rs`: the two transports.

mod catalog;
mod conversation;
mod http;
mod relay;
mod stdio;

use std::net::SocketAddr;
use std::time::Duration;

pub use http::HttpError;

use crate::shutdown::Shutdown;

/// How `toolboxd mcp` serves.
pub struct McpOptions {
    /// The bus.
    pub bus: String,
    /// Serve streamable HTTP on this address instead of stdio.
    pub http: Option<SocketAddr>,
    /// The bearer token HTTP requests must carry (required off loopback).
    pub token: Option<String>,
    /// The longest a call waits for its answer from the bus.
    pub call_wait: Duration,
}

/// Serves the MCP face until stdin ends (stdio) or `shutdown` (HTTP).
pub async fn serve(mut options: McpOptions, shutdown: Shutdown) -> Result<(), HttpError> {
    // An empty token is no token.
    options.token = options.token.filter(|t| !t.trim().is_empty());
    let listener = match options.http {
        Some(addr) => Some(http::bind(addr, options.token.as_deref()).await?),
        None => None,
    };
    let relay = relay::Relay::start(options.bus, options.call_wait, shutdown.clone());
    // Over stdio one client: a cancellation names its request by id.
    let conversation = conversation::Conversation::new(relay, listener.is_none());
    match listener {
        Some(listener) => {
            if let Ok(addr) = listener.local_addr() {
                tracing::info!(%addr, "serving MCP over streamable HTTP at http://{addr}{}", http::PATH);
            }
            http::serve(listener, conversation, options.token, shutdown).await;
        }
        None => stdio::serve(conversation, tokio::io::stdin(), tokio::io::stdout()).await,
    }
    Ok(())
}
