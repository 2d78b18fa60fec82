//! The MCP client conversation with one child: era selection, tool listing,
//! tool calls and liveness probes (docs/protocol.md). Every MCP method name toolboxd
//! sends is written here.

mod input;
mod tasks;

use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use serde::ser::SerializeMap;
use serde_json::value::RawValue;

use serde_json::{json, Map, Value};

use crate::cancel::Cancel;
use crate::manifest::{LEGACY_VERSIONS, MODERN_VERSIONS};
use crate::mcp::{self, Era, LegacyTasks, TaskSupport, ToolSpec};
use crate::process::child::{Kept, ProgressSender, Questioner, RpcFailure, RpcHandle};

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
    /// The entries of the modern era's `tools/call` `_meta`, each value
    /// serialized once: every call carries them.
    meta: Arc<[(String, Box<RawValue>)]>,
    /// What a legacy child offers for task-augmented `tools/call` (its
    /// `initialize` capabilities, in a version that has tasks); `None` for
    /// no tasks. A modern server decides per call, so this is `None` there.
    tasks: Option<LegacyTasks>,
    /// The tools the child allows or requires to run as tasks, by name, as
    /// its latest listing said (shared by the session's clones).
    task_tools: Arc<RwLock<HashMap<String, TaskSupport>>>,
}

/// `tools/call` params, serialized straight from the call's parts.
#[derive(serde::Serialize)]
struct CallParams<'a> {
    name: &'a str,
    arguments: &'a Value,
    #[serde(rename = "_meta", skip_serializing_if = "CallMeta::is_empty")]
    meta: CallMeta<'a>,
    /// `{ttl}`: the call is made as a legacy task.
    #[serde(skip_serializing_if = "Option::is_none")]
    task: Option<Value>,
}

/// A `tools/call`'s `_meta`: its progress token, then the session's
/// pre-serialized entries (the modern era's).
struct CallMeta<'a> {
    /// The call's `progressToken`, when it asks for progress.
    progress_token: Option<u64>,
    /// The session's entries.
    entries: &'a [(String, Box<RawValue>)],
}

impl CallMeta<'_> {
    fn is_empty(&self) -> bool {
        self.progress_token.is_none() && self.entries.is_empty()
    }
}

impl serde::Serialize for CallMeta<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(None)?;
        if let Some(token) = self.progress_token {
            map.serialize_entry("progressToken", &token)?;
        }
        for (key, value) in self.entries {
            map.serialize_entry(key, value)?;
        }
        map.end()
    }
}

/// Where what a child says about a call beside its answer goes.
#[derive(Default)]
pub struct Heard {
    /// Its progress notifications, when the caller asked for progress.
    pub progress: Option<ProgressSender>,
    /// Its questions to the person, when its manifest lets it ask.
    pub questions: Option<Questioner>,
}

/// A modern call's `_meta` with what toolboxd offers `rpc`'s child added to
/// its client capabilities.
fn with_capabilities(mut meta: Value, rpc: &RpcHandle) -> Value {
    let key = "io.modelcontextprotocol/clientCapabilities";
    if let (Some(Value::Object(declared)), Value::Object(offered)) =
        (meta.get_mut(key), client_capabilities(rpc))
    {
        declared.extend(offered);
    }
    meta
}

/// What toolboxd offers a child (declared in the legacy `initialize`, and
/// in each modern call's `_meta`): roots where it has them (its sandbox's
/// directories), elicitation where its manifest allows it to ask.
fn client_capabilities(rpc: &RpcHandle) -> Value {
    let mut capabilities = serde_json::Map::new();
    if rpc.roots().is_some() {
        capabilities.insert("roots".into(), json!({}));
    }
    if rpc.offers_elicitation() {
        capabilities.insert("elicitation".into(), json!({}));
    }
    Value::Object(capabilities)
}

impl Session {
    /// A session in `era` over `rpc`, offering `tasks` (legacy).
    fn new(rpc: RpcHandle, era: Era, tasks: Option<LegacyTasks>) -> Session {
        let meta = match &era {
            // A modern call declares the tasks extension: toolboxd follows a
            // task the server answers with.
            Era::Modern(version) => match with_capabilities(mcp::modern_call_meta(version), &rpc) {
                Value::Object(entries) => entries
                    .into_iter()
                    .filter_map(|(k, v)| Some((k, serde_json::value::to_raw_value(&v).ok()?)))
                    .collect(),
                _ => Arc::from([]),
            },
            Era::Legacy(_) => Arc::from([]),
        };
        Session {
            rpc,
            era,
            meta,
            tasks,
            task_tools: Arc::default(),
        }
    }
}

#[cfg(test)]
impl Session {
    /// A session over `rpc` in the legacy era, with no handshake: for a
    /// stand-in child (`process/child/stand_in.rs`).
    pub(crate) fn standing_in(rpc: RpcHandle) -> Session {
        Session::new(rpc, Era::Legacy("2025-06-18".to_owned()), None)
    }
}

/// What an answer to the era probe says.
enum Probe {
    /// A legacy server: any JSON-RPC error but "unsupported version".
    Legacy,
    /// A modern server, or a failure of the child: decided by the answer.
    Decided(Result<Value, RpcFailure>),
}

impl Probe {
    fn of(answered: Result<Value, RpcFailure>) -> Probe {
        match Probe::of_ref(&answered) {
            Probe::Legacy => Probe::Legacy,
            Probe::Decided(_) => Probe::Decided(answered),
        }
    }

    /// Whether `answered` says legacy (the answer itself not kept).
    fn of_ref(answered: &Result<Value, RpcFailure>) -> Probe {
        match answered {
            Err(RpcFailure::Rpc(e)) if !mcp::is_unsupported_version(e.code) => Probe::Legacy,
            _ => Probe::Decided(Ok(Value::Null)),
        }
    }

    /// The decisive answer.
    fn answered(self) -> Result<Value, RpcFailure> {
        match self {
            Probe::Decided(answered) => answered,
            Probe::Legacy => Err(RpcFailure::Rpc(mcp::RpcError {
                code: mcp::METHOD_NOT_FOUND,
                message: "server/discover".to_owned(),
                data: None,
            })),
        }
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
    /// otherwise `server/discover` is tried first. Its answer decides
    /// whenever it comes: a modern server that answers after
    /// `probe_timeout` (a busy machine starting many children) is still
    /// modern. Only after that much silence is `initialize` sent as well,
    /// on the same process, for a legacy server that never answers an
    /// unknown method; the first decisive answer of the two wins (a late
    /// DiscoverResult over an `initialize` refused by a server already in
    /// the new era).
    pub async fn open(
        rpc: RpcHandle,
        pin: Option<&str>,
        probe_timeout: Duration,
        request_timeout: Duration,
    ) -> Result<Session, HandshakeError> {
        if let Some(version) = pin {
            if MODERN_VERSIONS.contains(&version) {
                return Ok(Session::new(rpc, Era::Modern(version.to_owned()), None));
            }
            return Session::initialize(rpc, version, request_timeout).await;
        }
        let preferred = MODERN_VERSIONS[0];
        // The probe's own handle: it may be waited for past the handshake.
        let prober = rpc.clone();
        let probe = prober.request(
            "server/discover",
            json!({"_meta": mcp::modern_meta(preferred)}),
        );
        tokio::pin!(probe);
        let answered = tokio::select! {
            answered = &mut probe => answered,
            () = tokio::time::sleep(probe_timeout) => {
                let initialize = Session::initialize(rpc.clone(), LEGACY_VERSIONS[0], request_timeout);
                tokio::pin!(initialize);
                tokio::select! {
                    answered = &mut probe => match Probe::of(answered) {
                        // The late probe says legacy: the handshake under way decides.
                        Probe::Legacy => return initialize.await,
                        decided => decided.answered(),
                    },
                    initialized = &mut initialize => match initialized {
                        Ok(session) => return Ok(session),
                        // Refused: a server that is modern after all answers the
                        // probe still in flight.
                        Err(refused) => match tokio::time::timeout(request_timeout, probe).await {
                            Ok(answered) if !matches!(Probe::of_ref(&answered), Probe::Legacy) => answered,
                            _ => return Err(refused),
                        },
                    },
                }
            }
        };
        match answered {
            Ok(result) => {
                let supported = string_list(result.get("supportedVersions"));
                match choose(&supported) {
                    Some(Era::Modern(v)) => Ok(Session::new(rpc, Era::Modern(v), None)),
                    Some(Era::Legacy(v)) => Session::initialize(rpc, &v, request_timeout).await,
                    None if supported.is_empty() => {
                        Ok(Session::new(rpc, Era::Modern(preferred.to_owned()), None))
                    }
                    None => Err(HandshakeError::NoCommonVersion(supported.join(", "))),
                }
            }
            Err(RpcFailure::Rpc(e)) if mcp::is_unsupported_version(e.code) => {
                let data = e.data.unwrap_or(Value::Null);
                let supported = string_list(
                    data.get("supported")
                        .or_else(|| data.get("supportedVersions")),
                );
                match choose(&supported) {
                    Some(Era::Modern(v)) => Ok(Session::new(rpc, Era::Modern(v), None)),
                    _ => Err(HandshakeError::NoCommonVersion(supported.join(", "))),
                }
            }
            Err(RpcFailure::Rpc(_)) => {
                Session::initialize(rpc, LEGACY_VERSIONS[0], request_timeout).await
            }
            Err(failure) => Err(HandshakeError::Rpc {
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
        let capabilities = client_capabilities(&rpc);
        let params = json!({
            "protocolVersion": version,
            "capabilities": capabilities,
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
        let capabilities = result.get("capabilities").unwrap_or(&Value::Null);
        let tasks = mcp::legacy_tasks(agreed, capabilities);
        rpc.notify("notifications/initialized", Value::Null);
        Ok(Session::new(rpc, Era::Legacy(agreed.to_owned()), tasks))
    }

    /// The era and version in force.
    pub fn era(&self) -> &Era {
        &self.era
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
        let mut task_tools = HashMap::new();
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
            for tool in page
                .get("tools")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                let support = mcp::task_support(tool);
                if let (TaskSupport::Optional | TaskSupport::Required, Some(name)) =
                    (support, tool.get("name").and_then(Value::as_str))
                {
                    task_tools.entry(name.to_owned()).or_insert(support);
                }
            }
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
                None => {
                    self.set_task_tools(task_tools);
                    return Ok((tools, problems));
                }
            }
        }
        Err(HandshakeError::Bad(format!(
            "tools/list returned more than {MAX_PAGES} pages"
        )))
    }

    /// Keeps what the latest listing says of tasks; says once which tools
    /// require tasks the session cannot give them (their calls will fail).
    fn set_task_tools(&self, listed: HashMap<String, TaskSupport>) {
        let mut known = self.task_tools.write().unwrap_or_else(|e| e.into_inner());
        if *known == listed {
            return;
        }
        if matches!(self.era, Era::Legacy(_)) && self.tasks.is_none() {
            let mut stranded: Vec<&str> = listed
                .iter()
                .filter(|(_, s)| **s == TaskSupport::Required)
                .map(|(name, _)| name.as_str())
                .collect();
            if !stranded.is_empty() {
                stranded.sort_unstable();
                let (toolbox, pid) = self.rpc.owner();
                tracing::warn!(
                    toolbox,
                    pid,
                    "tools {stranded:?} require MCP tasks, but the child's session ({}) offers \
                     none for tools/call (tasks need MCP 2025-11-25 and the server's \
                     tasks.requests.tools.call capability): their calls will fail",
                    self.era
                );
            }
        }
        *known = listed;
    }

    /// Whether a legacy call of `tool` is made as a task: the server offers
    /// tasks and the tool allows or requires them.
    fn as_legacy_task(&self, tool: &str) -> Option<LegacyTasks> {
        let tasks = self.tasks?;
        let known = self.task_tools.read().unwrap_or_else(|e| e.into_inner());
        known.contains_key(tool).then_some(tasks)
    }

    /// Why the child was cut off for breaking the protocol, if it was.
    pub fn broken_because(&self) -> Option<String> {
        self.rpc.broken_because()
    }

    /// Whether the child is gone: a call now would not reach it.
    pub fn is_gone(&self) -> bool {
        self.rpc.is_closed()
    }

    /// One `tools/call` until `deadline` (or a stop: `cancel`); the raw MCP
    /// result. `hold` (the call's slot) stays held until the child is done
    /// with the call, even past the deadline. With `heard.progress`, the
    /// call carries a `progressToken` and the child's progress
    /// notifications for it go there; with `heard.questions`, its questions
    /// to the person (elicitation) go there while it runs. A tool the child runs as a task is followed to its
    /// result (`tasks`).
    pub async fn call_tool(
        &self,
        name: &str,
        arguments: Value,
        deadline: tokio::time::Instant,
        cancel: &mut Cancel,
        hold: Kept,
        heard: Heard,
    ) -> Result<Value, RpcFailure> {
        // Registered for the whole call, a task's included.
        let watch = heard.progress.map(|sender| self.rpc.watch_progress(sender));
        let questioner = heard.questions.filter(|_| self.rpc.offers_elicitation());
        // Legacy: the child asks with requests of its own, while the call runs.
        let _questions = questioner.clone().map(|q| self.rpc.watch_questions(q));
        let mut params = CallParams {
            name,
            arguments: &arguments,
            meta: CallMeta {
                progress_token: watch.as_ref().map(|w| w.token()),
                entries: &self.meta,
            },
            task: None,
        };
        let flavour = match &self.era {
            Era::Modern(version) => tasks::Flavour::Modern {
                version,
                questions: questioner.as_ref(),
            },
            Era::Legacy(_) => match self.as_legacy_task(name) {
                Some(offer) => {
                    // Kept a while past the deadline, so a result that is
                    // ready just then can still be fetched.
                    let ttl = deadline.saturating_duration_since(tokio::time::Instant::now())
                        + Duration::from_secs(30);
                    let ttl = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX);
                    params.task = Some(json!({"ttl": ttl}));
                    tasks::Flavour::Legacy {
                        cancel: offer.cancel,
                    }
                }
                None => {
                    return self
                        .rpc
                        .request_until("tools/call", &params, deadline, cancel, hold)
                        .await
                }
            },
        };
        tasks::call(&self.rpc, name, &params, deadline, cancel, hold, flavour).await
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
