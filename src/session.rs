//! The MCP client conversation with one child: era selection, tool listing,
//! tool calls and liveness probes (docs/protocol.md). Every MCP method name toolboxd
//! sends is written here.

use std::sync::Arc;
use std::time::Duration;

use serde_json::value::RawValue;

use serde_json::{json, Map, Value};

use crate::cancel::Cancel;
use crate::child::{RpcFailure, RpcHandle};
use crate::manifest::{LEGACY_VERSIONS, MODERN_VERSIONS};
use crate::mcp::{self, Era, ToolSpec};

/// Most `tools/list` pages followed before giving up on a looping cursor.
pub const MAX_PAGES: usize = 100;
/// Most tools one toolbox may list: more is a runaway listing, not a toolbox.
pub const MAX_TOOLS: usize = 1024;

/// Why a child could not be brought to the point of listing its tools.
#[derive(Debug, thiserror::Error)]
pub enum HandshakeError {
    #[error("{step} failed: {failure}")]
    Rpc {
        step: &'static str,
        failure: RpcFailure,
    },
    #[error("{step} got no answer within {secs} s")]
    Timeout { step: &'static str, secs: u64 },
    #[error("no common MCP version: the child supports {0}")]
    NoCommonVersion(String),
    #[error("{0}")]
    Bad(String),
}

impl HandshakeError {
    /// Whether the child died while being probed, so a retry should skip the probe.
    pub fn child_died(&self) -> bool {
        matches!(
            self,
            HandshakeError::Rpc {
                failure: RpcFailure::Exited(_) | RpcFailure::Broken(_),
                ..
            }
        )
    }
}

/// An established MCP session with one child.
#[derive(Clone)]
pub struct Session {
    /// The child's request channel.
    rpc: RpcHandle,
    /// The era and version in force, which decides the shape of every request.
    era: Era,
    /// The modern era's `_meta`, serialized once: every `tools/call` carries it.
    meta: Option<Arc<RawValue>>,
}

/// `tools/call` params, serialized straight from the call's parts.
#[derive(serde::Serialize)]
struct CallParams<'a> {
    name: &'a str,
    arguments: &'a Value,
    #[serde(rename = "_meta", skip_serializing_if = "Option::is_none")]
    meta: Option<&'a RawValue>,
}

impl Session {
    /// A session in `era` over `rpc`.
    fn new(rpc: RpcHandle, era: Era) -> Session {
        let meta = match &era {
            Era::Modern(version) => serde_json::value::to_raw_value(&mcp::modern_meta(version))
                .ok()
                .map(Arc::from),
            Era::Legacy(_) => None,
        };
        Session { rpc, era, meta }
    }
}

async fn timed<T>(
    step: &'static str,
    limit: Duration,
    fut: impl std::future::Future<Output = Result<T, RpcFailure>>,
) -> Result<T, HandshakeError> {
    match tokio::time::timeout(limit, fut).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(failure)) => Err(HandshakeError::Rpc { step, failure }),
        Err(_) => Err(HandshakeError::Timeout {
            step,
            secs: limit.as_secs(),
        }),
    }
}

impl Session {
    /// Selects the era and completes the handshake: `pin` skips the probe;
    /// otherwise `server/discover` is tried first and `initialize` is the
    /// fallback for any error other than a recognised modern one, or silence.
    pub async fn open(
        rpc: RpcHandle,
        pin: Option<&str>,
        probe_timeout: Duration,
        request_timeout: Duration,
    ) -> Result<Session, HandshakeError> {
        if let Some(version) = pin {
            if MODERN_VERSIONS.contains(&version) {
                return Ok(Session::new(rpc, Era::Modern(version.to_owned())));
            }
            return Session::initialize(rpc, version, request_timeout).await;
        }
        let preferred = MODERN_VERSIONS[0];
        let probe = rpc.request(
            "server/discover",
            json!({"_meta": mcp::modern_meta(preferred)}),
        );
        match tokio::time::timeout(probe_timeout, probe).await {
            Ok(Ok(result)) => {
                let supported = string_list(result.get("supportedVersions"));
                match choose(&supported) {
                    Some(Era::Modern(v)) => Ok(Session::new(rpc, Era::Modern(v))),
                    Some(Era::Legacy(v)) => Session::initialize(rpc, &v, request_timeout).await,
                    None if supported.is_empty() => {
                        Ok(Session::new(rpc, Era::Modern(preferred.to_owned())))
                    }
                    None => Err(HandshakeError::NoCommonVersion(supported.join(", "))),
                }
            }
            Ok(Err(RpcFailure::Rpc(e))) if e.code == mcp::UNSUPPORTED_PROTOCOL_VERSION => {
                let data = e.data.unwrap_or(Value::Null);
                let supported = string_list(
                    data.get("supported")
                        .or_else(|| data.get("supportedVersions")),
                );
                match choose(&supported) {
                    Some(Era::Modern(v)) => Ok(Session::new(rpc, Era::Modern(v))),
                    _ => Err(HandshakeError::NoCommonVersion(supported.join(", "))),
                }
            }
            Ok(Err(RpcFailure::Rpc(_))) | Err(_) => {
                Session::initialize(rpc, LEGACY_VERSIONS[0], request_timeout).await
            }
            Ok(Err(failure)) => Err(HandshakeError::Rpc {
                step: "server/discover",
                failure,
            }),
        }
    }

    /// The legacy handshake: `initialize`, then `notifications/initialized`.
    async fn initialize(
        rpc: RpcHandle,
        version: &str,
        limit: Duration,
    ) -> Result<Session, HandshakeError> {
        let params = json!({
            "protocolVersion": version,
            "capabilities": {},
            "clientInfo": mcp::client_info(),
        });
        let result = timed("initialize", limit, rpc.request("initialize", params)).await?;
        let agreed = result
            .get("protocolVersion")
            .and_then(Value::as_str)
            .ok_or_else(|| {
                HandshakeError::Bad("initialize result has no protocolVersion".to_owned())
            })?;
        if !LEGACY_VERSIONS.contains(&agreed) {
            // The tool methods are the same in every legacy version; carry on.
            let (toolbox, pid) = rpc.owner();
            tracing::warn!(
                toolbox,
                pid,
                "child chose MCP version {agreed:?}, unknown to toolboxd; carrying on"
            );
        }
        rpc.notify("notifications/initialized", Value::Null);
        Ok(Session::new(rpc, Era::Legacy(agreed.to_owned())))
    }

    /// The era and version in force.
    pub fn era(&self) -> &Era {
        &self.era
    }

    /// The request channel to the child.
    pub fn rpc(&self) -> &RpcHandle {
        &self.rpc
    }

    /// Params with the modern era's `_meta` added where it applies.
    fn params(&self, mut params: Map<String, Value>) -> Value {
        if let Era::Modern(version) = &self.era {
            params.insert("_meta".to_owned(), mcp::modern_meta(version));
        }
        Value::Object(params)
    }

    /// Every tool, following `nextCursor`. Entries that are not tools are
    /// returned separately so the caller can log them. The listing is bounded:
    /// at most [`MAX_PAGES`] pages, [`MAX_TOOLS`] tools and `max_bytes` bytes
    /// of pages in all; past a bound it fails, holding nothing.
    pub async fn list_tools(
        &self,
        limit: Duration,
        max_bytes: usize,
    ) -> Result<(Vec<ToolSpec>, Vec<String>), HandshakeError> {
        let mut tools = Vec::new();
        let mut problems = Vec::new();
        let mut cursor: Option<String> = None;
        let mut bytes = 0;
        for _ in 0..MAX_PAGES {
            let mut params = Map::new();
            if let Some(c) = cursor.take() {
                params.insert("cursor".to_owned(), Value::String(c));
            }
            let page = timed(
                "tools/list",
                limit,
                self.rpc.request("tools/list", self.params(params)),
            )
            .await?;
            bytes += serde_json::to_vec(&page).map_or(0, |v| v.len());
            if bytes > max_bytes {
                return Err(HandshakeError::Bad(format!(
                    "tools/list pages add up to more than max_message_bytes ({max_bytes} bytes)"
                )));
            }
            let (entries, next) = mcp::parse_tools_page(&page);
            if tools.len() + entries.len() > MAX_TOOLS {
                return Err(HandshakeError::Bad(format!(
                    "tools/list lists more than {MAX_TOOLS} tools"
                )));
            }
            for entry in entries {
                match entry {
                    Ok(tool) => tools.push(tool),
                    Err(problem) => problems.push(problem),
                }
            }
            match next {
                Some(c) => cursor = Some(c),
                None => return Ok((tools, problems)),
            }
        }
        Err(HandshakeError::Bad(format!(
            "tools/list returned more than {MAX_PAGES} pages"
        )))
    }

    /// Why the child was cut off for breaking the protocol, if it was.
    pub fn broken_because(&self) -> Option<String> {
        self.rpc.broken_because()
    }

    /// Whether the child is gone: a call now would not reach it.
    pub fn is_gone(&self) -> bool {
        self.rpc.is_closed()
    }

    /// One `tools/call` until `deadline`; the raw MCP result. `hold` (the
    /// call's slot) stays held until the child is done with the call, even
    /// past the deadline.
    pub async fn call_tool(
        &self,
        name: &str,
        arguments: Value,
        deadline: tokio::time::Instant,
        cancel: &mut Cancel,
        hold: Box<dyn Send>,
    ) -> Result<Value, RpcFailure> {
        let params = CallParams {
            name,
            arguments: &arguments,
            meta: self.meta.as_deref(),
        };
        self.rpc
            .request_until("tools/call", &params, deadline, cancel, hold)
            .await
    }

    /// The liveness probe: `ping` (legacy) or `server/discover` (modern).
    pub async fn probe(&self) -> Result<(), RpcFailure> {
        let method = match self.era {
            Era::Legacy(_) => "ping",
            Era::Modern(_) => "server/discover",
        };
        self.rpc
            .request(method, self.params(Map::new()))
            .await
            .map(|_| ())
    }
}

fn string_list(value: Option<&Value>) -> Vec<String> {
    value
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|v| v.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

/// The newest version both sides speak, modern preferred.
fn choose(supported: &[String]) -> Option<Era> {
    let has = |v: &&&str| supported.iter().any(|s| s == **v);
    MODERN_VERSIONS
        .iter()
        .find(has)
        .map(|v| Era::Modern((*v).to_owned()))
        .or_else(|| {
            LEGACY_VERSIONS
                .iter()
                .find(has)
                .map(|v| Era::Legacy((*v).to_owned()))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn choose_prefers_modern_then_newest_legacy() {
        let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        assert_eq!(
            choose(&s(&["2025-06-18", "2026-07-28"])),
            Some(Era::Modern("2026-07-28".into()))
        );
        assert_eq!(
            choose(&s(&["2024-11-05", "2025-06-18"])),
            Some(Era::Legacy("2025-06-18".into()))
        );
        assert_eq!(choose(&s(&["1999-01-01"])), None);
    }
}
