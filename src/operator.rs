//! The operator channel: what an operator can ask of a running daemon, and
//! the one place it is carried out.
//!
//! Three doors lead here: the control socket (`toolboxd ctl`, see
//! [`crate::control`]), SIGHUP, and the bus topic `ovos.tools.reload` (see
//! [`crate::service`]). Each sends an [`Operation`] through an [`Operators`]
//! handle; the [`Operator`] owns the supervisor and carries every operation
//! out. Reloads run one at a time, and every reload asked for while one runs
//! is answered by the next one, so a burst of reloads costs one or two. The
//! other operations never wait for a reload: each runs as a task of its own.
//!
//! The wire names of the operations (the control socket's JSON-RPC methods)
//! are defined here once, for the daemon that parses them and for `toolboxd
//! ctl` that sends them.

use std::sync::Arc;

use serde_json::{json, Value};
use tokio::sync::{mpsc, oneshot};

use crate::notify::Notifier;
use crate::peers::{PeerCheck, Peers};
use crate::registry::{Catalog, Registry};
use crate::shutdown::Shutdown;
use crate::supervisor::{ReloadReport, Supervisor};
use crate::toolbox::{State, ToolboxHandle};
use crate::util::or_never::or_never;

const STATUS: &str = "status";
const RESTART: &str = "restart";
const STOP: &str = "stop";
const START: &str = "start";
const RELOAD: &str = "reload";
const LOGS: &str = "logs";

/// Stderr lines `ctl logs` prints unless told otherwise.
pub const DEFAULT_LOG_LINES: usize = 100;

/// What status (and `check --probe`) says of a toolbox that serves no tools.
pub const NO_TOOLS: &str = "serves no tools: does it need a configuration (an OVOS plugin: \
    the second argument of opm_host.py, docs/authoring.md)? `toolboxd ctl logs` shows what it said";

/// An operator request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Operation {
    /// One row per hosted toolbox.
    Status,
    /// A rolling restart of toolbox `id`.
    Restart(String),
    /// Drain and stop toolbox `id`.
    Stop(String),
    /// Start toolbox `id` (stopped or failed).
    Start(String),
    /// Re-read the manifests and apply the difference.
    Reload,
    /// The last `lines` stderr lines of toolbox `id`'s children.
    Logs { id: String, lines: usize },
}

/// Why a request names no operation; the text is the control socket's error
/// message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BadRequest {
    #[error("no method")]
    NoMethod,
    #[error("{0} needs params.id (a toolbox id)")]
    NoId(&'static str),
    #[error("logs params.lines must be a whole number from 1 to {max}", max = crate::process::child::LOG_LINES)]
    Lines,
    #[error("unknown method {0:?}; use {known}", known = Operation::known())]
    Unknown(String),
}

impl Operation {
    /// Every wire name, in the order the help lists them.
    pub const NAMES: [&'static str; 6] = [STATUS, RESTART, STOP, START, RELOAD, LOGS];

    /// The wire name (the control socket's JSON-RPC method).
    pub fn name(&self) -> &'static str {
        match self {
            Operation::Status => STATUS,
            Operation::Restart(_) => RESTART,
            Operation::Stop(_) => STOP,
            Operation::Start(_) => START,
            Operation::Reload => RELOAD,
            Operation::Logs { .. } => LOGS,
        }
    }

    /// The JSON-RPC params: `{"id": ID}` for an operation on one toolbox
    /// (with `"lines"` for logs), else null.
    pub fn params(&self) -> Value {
        match self {
            Operation::Status | Operation::Reload => Value::Null,
            Operation::Restart(id) | Operation::Stop(id) | Operation::Start(id) => {
                json!({ "id": id })
            }
            Operation::Logs { id, lines } => json!({ "id": id, "lines": lines }),
        }
    }

    /// The operation a wire name and its params (null when absent) ask for.
    pub fn parse(method: &str, params: &Value) -> Result<Operation, BadRequest> {
        let id = |name: &'static str| {
            params
                .get("id")
                .and_then(Value::as_str)
                .map(str::to_owned)
                .ok_or(BadRequest::NoId(name))
        };
        Ok(match method {
            STATUS => Operation::Status,
            RELOAD => Operation::Reload,
            RESTART => Operation::Restart(id(RESTART)?),
            STOP => Operation::Stop(id(STOP)?),
            START => Operation::Start(id(START)?),
            LOGS => Operation::Logs {
                id: id(LOGS)?,
                lines: match params.get("lines") {
                    None | Some(Value::Null) => DEFAULT_LOG_LINES,
                    Some(n) => n
                        .as_u64()
                        .and_then(|n| usize::try_from(n).ok())
                        .filter(|n| (1..=crate::process::child::LOG_LINES).contains(n))
                        .ok_or(BadRequest::Lines)?,
                },
            },
            other => return Err(BadRequest::Unknown(other.to_owned())),
        })
    }

    /// The operation a JSON-RPC request object asks for.
    pub fn from_request(request: &Value) -> Result<Operation, BadRequest> {
        let method = request
            .get("method")
            .and_then(Value::as_str)
            .ok_or(BadRequest::NoMethod)?;
        Operation::parse(method, request.get("params").unwrap_or(&Value::Null))
    }

    /// "status, restart, stop, start, reload or logs".
    fn known() -> String {
        let (last, rest) = Operation::NAMES
            .split_last()
            .map_or(("", &[][..]), |(last, rest)| (*last, rest));
        format!("{} or {last}", rest.join(", "))
    }
}

/// What an operation did.
#[derive(Debug, Clone)]
pub enum Performed {
    /// The status rows (see [`status`]).
    Status(Value),
    /// What a reload did.
    Reloaded(ReloadReport),
    /// What a restart, stop or start did, in words.
    Done(String),
    /// Stderr lines, oldest first: `{time, pid, text}` each.
    Logs(Value),
}

impl Performed {
    /// The outcome as the control socket answers it.
    pub fn into_json(self) -> Value {
        match self {
            Performed::Status(rows) => rows,
            Performed::Reloaded(report) => {
                json!({"loaded": report.loaded, "errors": report.errors_json()})
            }
            Performed::Done(text) => Value::String(text),
            Performed::Logs(lines) => lines,
        }
    }
}

/// Why an operation was not carried out; the text is the operator's answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    #[error("no toolbox {0:?} is hosted here; see toolboxd ctl status")]
    NotHosted(String),
    /// The toolbox's own account of why it could not.
    #[error("{0}")]
    Failed(String),
    #[error("the daemon is shutting down")]
    ShuttingDown,
}

/// Where an operation's answer goes, if anyone waits for it.
pub struct Reply(Option<oneshot::Sender<Result<Performed, Refused>>>);

impl Reply {
    fn answer(self, answer: Result<Performed, Refused>) {
        if let Some(tx) = self.0 {
            let _ = tx.send(answer);
        }
    }
}

/// An operation on its way to the [`Operator`].
pub struct OperatorRequest {
    /// What to do.
    operation: Operation,
    /// Who waits for the answer.
    reply: Reply,
}

impl OperatorRequest {
    /// What is asked.
    pub fn operation(&self) -> &Operation {
        &self.operation
    }

    /// Answers the request (for a stand-in that carries operations out
    /// itself, as a test's).
    pub fn answer(self, answer: Result<Performed, Refused>) {
        self.reply.answer(answer);
    }
}

/// The sending side of the operator channel; clone one per door.
#[derive(Clone)]
pub struct Operators {
    /// The queue to the operator. Unbounded so that a signal handler never
    /// waits; the operator keeps taking requests even while it reloads, so
    /// the queue stays short.
    tx: mpsc::UnboundedSender<OperatorRequest>,
}

/// The receiving side of the operator channel.
pub struct Requests {
    /// The queue from every [`Operators`] handle.
    rx: mpsc::UnboundedReceiver<OperatorRequest>,
}

/// A new operator channel.
pub fn channel() -> (Operators, Requests) {
    let (tx, rx) = mpsc::unbounded_channel();
    (Operators { tx }, Requests { rx })
}

impl Operators {
    /// Asks for `operation` and waits for its outcome.
    pub async fn ask(&self, operation: Operation) -> Result<Performed, Refused> {
        let (tx, rx) = oneshot::channel();
        let request = OperatorRequest {
            operation,
            reply: Reply(Some(tx)),
        };
        self.tx.send(request).map_err(|_| Refused::ShuttingDown)?;
        rx.await.unwrap_or(Err(Refused::ShuttingDown))
    }

    /// Asks for `operation` without waiting for it (SIGHUP).
    pub fn tell(&self, operation: Operation) {
        let _ = self.tx.send(OperatorRequest {
            operation,
            reply: Reply(None),
        });
    }
}

impl Requests {
    /// The next request; `None` once every [`Operators`] handle is gone.
    pub async fn recv(&mut self) -> Option<OperatorRequest> {
        self.rx.recv().await
    }
}

/// The one place operations are carried out: owns the supervisor while the
/// daemon serves.
pub struct Operator {
    /// The set of toolboxes, for reloads.
    supervisor: Supervisor,
    /// The catalog, for status and for the toolbox an operation names.
    registry: Arc<Registry>,
    /// The check for other hosts' ids: run when the operator starts and after
    /// every reload, beside the serving (nothing waits for it).
    peers: Arc<Peers>,
    /// systemd hears RELOADING=1 and READY=1 around a reload.
    notifier: Arc<Notifier>,
}

impl Operator {
    /// An operator for `supervisor`'s toolboxes.
    pub fn new(
        supervisor: Supervisor,
        registry: Arc<Registry>,
        peers: Arc<Peers>,
        notifier: Arc<Notifier>,
    ) -> Operator {
        Operator {
            supervisor,
            registry,
            peers,
            notifier,
        }
    }

    /// Carries out requests from `inbox` until `stop` (or until every sender
    /// is gone); returns the supervisor, for shutdown. A reload under way when
    /// `stop` comes is finished first; requests still queued then are
    /// answered "the daemon is shutting down".
    pub async fn run(self, mut inbox: Requests, mut stop: Shutdown) -> Supervisor {
        let Operator {
            mut supervisor,
            registry,
            peers,
            notifier,
        } = self;
        // Replies waiting for the next reload.
        let mut waiting: Vec<Reply> = Vec::new();
        // The peer check under way, if any: the first starts now.
        let mut check = Some(peer_check(&peers));
        // When the last check asked for by a newcomer began.
        let mut last_recheck: Option<tokio::time::Instant> = None;
        loop {
            if waiting.is_empty() {
                let request = tokio::select! {
                    biased;
                    _ = stop.recv() => None,
                    found = or_never(check.as_mut()) => {
                        check = None;
                        tracing::info!(
                            claimed = found.seen.len(),
                            held = found.held.len(),
                            "peer check done: ids other hosts also answer for"
                        );
                        supervisor.settle(&found).await;
                        continue;
                    }
                    // A daemon new on the bus: check again, so that this
                    // one learns of a conflict too (not more often than
                    // RECHECK_GAP, whatever a client sends).
                    () = peers.newcomer(), if check.is_none() => {
                        let mut due = tokio::time::Instant::now() + crate::peers::RECHECK_DELAY;
                        if let Some(last) = last_recheck {
                            due = due.max(last + crate::peers::RECHECK_GAP);
                        }
                        last_recheck = Some(due);
                        check = Some(peer_check_after(due, &peers));
                        continue;
                    }
                    request = inbox.rx.recv() => request,
                };
                let Some(request) = request else { break };
                take(&registry, request, &mut waiting);
            }
            // A burst queued together is one reload.
            while let Ok(more) = inbox.rx.try_recv() {
                take(&registry, more, &mut waiting);
            }
            if waiting.is_empty() {
                continue;
            }
            let batch = std::mem::take(&mut waiting);
            if batch.len() > 1 {
                tracing::info!(requests = batch.len(), "reload requests coalesced into one");
            }
            let reload = reload(&mut supervisor, &notifier);
            tokio::pin!(reload);
            // Meanwhile other operations are carried out, and reloads wait
            // for the next one.
            let report = loop {
                tokio::select! {
                    report = &mut reload => break report,
                    Some(request) = inbox.rx.recv() => take(&registry, request, &mut waiting),
                }
            };
            for reply in batch {
                reply.answer(Ok(Performed::Reloaded(report.clone())));
            }
            // New toolboxes are checked against the other hosts afresh.
            check = Some(peer_check(&peers));
            if stop.is_down() {
                break;
            }
        }
        supervisor
    }
}

/// A peer check, as a future the operator's loop can wait on beside requests.
fn peer_check(
    peers: &Arc<Peers>,
) -> std::pin::Pin<Box<dyn std::future::Future<Output = PeerCheck> + Send>> {
    peer_check_after(tokio::time::Instant::now(), peers)
}

/// A peer check that begins at `due`.
fn peer_check_after(
    due: tokio::time::Instant,
    peers: &Arc<Peers>,
) -> std::pin::Pin<Box<dyn std::future::Future<Output = PeerCheck> + Send>> {
    let peers = peers.clone();
    Box::pin(async move {
        tokio::time::sleep_until(due).await;
        peers.check().await
    })
}

/// Takes one request: a reload waits in `reloads` for the next reload; status
/// is answered at once; an operation on one toolbox runs as a task of its own.
fn take(registry: &Registry, request: OperatorRequest, reloads: &mut Vec<Reply>) {
    let OperatorRequest { operation, reply } = request;
    match operation {
        Operation::Reload => reloads.push(reply),
        Operation::Status => {
            let rows = status(&registry.snapshot());
            // Reading /proc takes a while for many processes: not on the
            // runtime's thread.
            tokio::spawn(async move {
                let measured = tokio::task::spawn_blocking(move || with_usage(rows)).await;
                reply.answer(
                    measured
                        .map(Performed::Status)
                        .map_err(|_| Refused::ShuttingDown),
                );
            });
        }
        Operation::Restart(id) => {
            on_toolbox(registry, &id, reply, |h| async move { h.restart().await })
        }
        Operation::Stop(id) => on_toolbox(registry, &id, reply, |h| async move { h.stop().await }),
        Operation::Start(id) => {
            on_toolbox(registry, &id, reply, |h| async move { h.start().await })
        }
        Operation::Logs { id, lines } => reply.answer(logs(registry, &id, lines)),
    }
}

/// The last `lines` stderr lines of toolbox `id`.
fn logs(registry: &Registry, id: &str, lines: usize) -> Result<Performed, Refused> {
    let catalog = registry.snapshot();
    let entry = catalog
        .toolbox(id)
        .ok_or_else(|| Refused::NotHosted(id.to_owned()))?;
    let lines = entry.handle.stats().stderr.recent(lines);
    let rows = lines
        .into_iter()
        .map(|line| {
            json!({
                "time": crate::util::clock::rfc3339(line.at),
                "pid": line.pid,
                "text": line.text,
            })
        })
        .collect();
    Ok(Performed::Logs(Value::Array(rows)))
}

/// Runs `act` on toolbox `id` as a task of its own, and answers with what it
/// did.
fn on_toolbox<F, Fut>(registry: &Registry, id: &str, reply: Reply, act: F)
where
    F: FnOnce(ToolboxHandle) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = crate::toolbox::CommandResult> + Send,
{
    let Some(handle) = registry
        .snapshot()
        .toolbox(id)
        .map(|entry| entry.handle.clone())
    else {
        return reply.answer(Err(Refused::NotHosted(id.to_owned())));
    };
    tokio::spawn(async move {
        let outcome = act(handle).await;
        reply.answer(outcome.map(Performed::Done).map_err(Refused::Failed));
    });
}

/// A reload, announced to systemd around it.
async fn reload(supervisor: &mut Supervisor, notifier: &Notifier) -> ReloadReport {
    notifier.send(&format!(
        "RELOADING=1\nMONOTONIC_USEC={}",
        crate::notify::monotonic_usec()
    ));
    let report = supervisor.reload().await;
    notifier.send("READY=1");
    report
}

/// One object per hosted toolbox, as `ctl status --json` prints it.
pub fn status(catalog: &Catalog) -> Value {
    let rows: Vec<Value> = catalog
        .toolboxes()
        .map(|(id, entry)| {
            let s = entry.handle.stats().snapshot();
            let reason = match &entry.state {
                State::Failed { reason } | State::Conflict { reason } => Some(reason.clone()),
                State::Restarting { last_exit } => Some(last_exit.clone()),
                _ => None,
            };
            let ms = |d: Option<std::time::Duration>| d.map(|d| d.as_secs_f64() * 1000.0);
            let conflict = entry.conflict.clone();
            // Serving, and nothing to serve: most often a plugin that needs
            // its configuration.
            let serving = matches!(entry.state, State::Ready | State::Idle);
            let note = (serving && entry.tools.is_empty()).then_some(NO_TOOLS);
            json!({
                "id": id,
                "state": entry.state.name(),
                "reason": reason,
                "note": note,
                "pids": entry.handle.pids(),
                "instances": entry.handle.instances(),
                "tools": entry.tools.len(),
                "restarts": s.restarts,
                "last_exit": s.last_exit,
                "era": s.era,
                "sandbox": s.sandbox,
                "sandbox_refused": entry.handle.stats().stderr.refusals.recent(),
                "cold_start_ms": ms(s.cold_start),
                "uptime_s": entry.handle.uptime().map(|u| u.as_secs()),
                "calls_ok": s.calls_ok,
                "calls_err": s.calls_err,
                "in_flight": s.in_flight,
                "p50_ms": ms(s.p50),
                "p99_ms": ms(s.p99),
                "conflict": conflict,
            })
        })
        .collect();
    Value::Array(rows)
}

/// Status rows with what each toolbox's process trees use: `processes`,
/// `memory_bytes` (PSS, else RSS) and `cpu_s` (user + system), null when it
/// runs no child.
pub fn with_usage(mut rows: Value) -> Value {
    for row in rows.as_array_mut().into_iter().flatten() {
        let pids: Vec<u32> = row["pids"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|p| u32::try_from(p.as_u64()?).ok())
            .collect();
        let usage = crate::process::proctree::usage(&pids);
        if let Value::Object(row) = row {
            row.insert("processes".to_owned(), json!(usage.map(|u| u.processes)));
            row.insert(
                "memory_bytes".to_owned(),
                json!(usage.map(|u| u.memory_bytes)),
            );
            row.insert(
                "cpu_s".to_owned(),
                json!(usage.map(|u| u.cpu.as_secs_f64())),
            );
        }
    }
    rows
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(method: &str, params: Value) -> Value {
        json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params})
    }

    #[test]
    fn every_wire_name_parses_back_to_its_operation() {
        let all = [
            Operation::Status,
            Operation::Restart("math".to_owned()),
            Operation::Stop("math".to_owned()),
            Operation::Start("math".to_owned()),
            Operation::Reload,
            Operation::Logs {
                id: "math".to_owned(),
                lines: 7,
            },
        ];
        let names: Vec<&str> = all.iter().map(Operation::name).collect();
        assert_eq!(names, Operation::NAMES);
        for operation in all {
            let parsed = Operation::from_request(&request(operation.name(), operation.params()));
            assert_eq!(parsed, Ok(operation));
        }
    }

    #[test]
    fn wire_names_and_params_are_the_documented_ones() {
        assert_eq!(
            Operation::NAMES,
            ["status", "restart", "stop", "start", "reload", "logs"]
        );
        assert_eq!(
            Operation::from_request(&json!({"method": "logs", "params": {"id": "m"}})),
            Ok(Operation::Logs {
                id: "m".to_owned(),
                lines: DEFAULT_LOG_LINES
            })
        );
        assert_eq!(Operation::Status.params(), Value::Null);
        assert_eq!(Operation::Reload.params(), Value::Null);
        assert_eq!(
            Operation::Stop("text".to_owned()).params(),
            json!({"id": "text"})
        );
        // Params are optional where no id is needed.
        assert_eq!(
            Operation::from_request(&json!({"method": "status"})),
            Ok(Operation::Status)
        );
    }

    #[test]
    fn bad_requests_say_exactly_what_is_wrong() {
        let error = |request: Value| {
            Operation::from_request(&request)
                .expect_err("a bad request")
                .to_string()
        };
        assert_eq!(error(json!({"id": 1})), "no method");
        assert_eq!(error(json!({"method": 7})), "no method");
        assert_eq!(
            error(request("frobnicate", Value::Null)),
            "unknown method \"frobnicate\"; use status, restart, stop, start, reload or logs"
        );
        for lines in [json!(0), json!(501), json!(-1), json!(1.5), json!("9")] {
            assert_eq!(
                error(request("logs", json!({"id": "m", "lines": lines}))),
                "logs params.lines must be a whole number from 1 to 500"
            );
        }
        for name in ["restart", "stop", "start", "logs"] {
            let expected = format!("{name} needs params.id (a toolbox id)");
            assert_eq!(error(request(name, Value::Null)), expected);
            assert_eq!(error(request(name, json!({}))), expected);
            assert_eq!(error(request(name, json!({"id": 3}))), expected);
        }
    }

    #[test]
    fn refusals_read_as_before() {
        assert_eq!(
            Refused::NotHosted("nope".to_owned()).to_string(),
            "no toolbox \"nope\" is hosted here; see toolboxd ctl status"
        );
        assert_eq!(
            Refused::ShuttingDown.to_string(),
            "the daemon is shutting down"
        );
    }

    #[test]
    fn a_reload_outcome_reads_loaded_and_errors() {
        let report = ReloadReport {
            loaded: vec!["math".to_owned()],
            errors: vec![("m.toml".to_owned(), "bad".to_owned())],
        };
        assert_eq!(
            Performed::Reloaded(report).into_json(),
            json!({"loaded": ["math"], "errors": [{"manifest": "m.toml", "error": "bad"}]})
        );
    }

    #[tokio::test]
    async fn a_request_without_an_operator_is_refused_as_shutting_down() {
        let (operators, inbox) = channel();
        drop(inbox);
        assert_eq!(
            operators.ask(Operation::Status).await.map(|_| ()),
            Err(Refused::ShuttingDown)
        );
        let (operators, mut inbox) = channel();
        let asking = tokio::spawn(async move { operators.ask(Operation::Reload).await });
        // A request dropped unanswered also reads as shutting down.
        drop(inbox.recv().await);
        assert_eq!(
            asking.await.expect("the task").map(|_| ()),
            Err(Refused::ShuttingDown)
        );
    }
}
