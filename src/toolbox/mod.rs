//! One toolbox: its lifecycle state, its counters, and the handle through
//! which calls and operator commands reach it.
//!
//! Each toolbox is an actor ([`actor`]) that owns its child processes. Calls do
//! not pass through the actor: it publishes the serving child on a `watch`
//! channel and each caller sends its request straight to that child. While no
//! child serves (starting, restarting) a caller waits on the channel, up to
//! its own deadline; a `failed` toolbox answers at once.

mod actor;
pub mod restart;

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;
use tokio::sync::{mpsc, oneshot, watch, Semaphore};

use crate::child::RpcFailure;
use crate::manifest::Manifest;
use crate::mcp;
use crate::registry::{Registry, Tool};
use crate::session::Session;

/// A toolbox's lifecycle state (DESIGN §3).
#[derive(Debug, Clone, PartialEq)]
pub enum State {
    /// Spawned; handshake and tool list under way.
    Starting,
    /// Serving calls.
    Ready,
    /// The child exited; waiting out the backoff. Calls wait.
    Restarting { last_exit: String },
    /// The restart budget is spent (or the policy forbids a restart); calls
    /// fail at once with this reason.
    Failed { reason: String },
    /// Stopped by an operator or `enabled = false`: not hosted.
    Stopped,
    /// Not hosted because another host on the bus answers for this id.
    Conflict { reason: String },
}

impl State {
    /// The state's name as status and logs show it.
    pub fn name(&self) -> &'static str {
        match self {
            State::Starting => "starting",
            State::Ready => "ready",
            State::Restarting { .. } => "restarting",
            State::Failed { .. } => "failed",
            State::Stopped => "stopped",
            State::Conflict { .. } => "conflict",
        }
    }
}

/// The child currently serving calls, as callers see it.
struct Serving {
    /// Its MCP session.
    session: Session,
    /// Its pid, for status.
    pid: u32,
    /// `max_concurrent_calls` permits; tokio's semaphore is fair, so waiting
    /// calls are served in arrival order.
    permits: Semaphore,
}

/// What a caller finds when it looks for a child.
#[derive(Clone)]
enum Slot {
    /// No child yet (starting or restarting): wait.
    Waiting,
    /// This child serves.
    Serving(Arc<Serving>),
    /// Failed: answer at once with this reason.
    Failed(String),
    /// Stopped: not hosted.
    Stopped,
}

/// Calls whose latency is kept for the percentiles in status.
const LATENCY_SAMPLES: usize = 1024;

/// Counters and recent history, for status.
#[derive(Debug, Default)]
pub struct Stats {
    /// Calls answered with a result.
    pub calls_ok: AtomicU64,
    /// Calls answered with an error by the child, a deadline or a crash.
    pub calls_err: AtomicU64,
    /// Calls waiting for or running on a child right now.
    pub in_flight: AtomicU64,
    /// Restarts since the daemon started (crashes and operator restarts).
    pub restarts: AtomicU64,
    /// What status shows beyond the counters.
    detail: Mutex<Detail>,
}

#[derive(Debug, Default)]
struct Detail {
    /// When the serving child became ready.
    ready_since: Option<Instant>,
    /// How the last child ended, in words.
    last_exit: Option<String>,
    /// The MCP era and version the serving child speaks.
    era: Option<String>,
    /// Durations of the latest calls, in microseconds.
    latencies: VecDeque<u32>,
}

/// A point-in-time view of a toolbox's counters.
#[derive(Debug, Clone, PartialEq)]
pub struct StatsSnapshot {
    pub calls_ok: u64,
    pub calls_err: u64,
    pub in_flight: u64,
    pub restarts: u64,
    pub uptime: Option<Duration>,
    pub last_exit: Option<String>,
    pub era: Option<String>,
    /// Median and 99th percentile of recent call latencies.
    pub p50: Option<Duration>,
    pub p99: Option<Duration>,
}

impl Stats {
    fn detail(&self) -> std::sync::MutexGuard<'_, Detail> {
        self.detail.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn record_latency(&self, took: Duration) {
        let mut d = self.detail();
        if d.latencies.len() == LATENCY_SAMPLES {
            d.latencies.pop_front();
        }
        d.latencies
            .push_back(took.as_micros().min(u32::MAX as u128) as u32);
    }

    fn set_ready(&self, since: Option<Instant>, era: Option<String>) {
        let mut d = self.detail();
        d.ready_since = since;
        if era.is_some() {
            d.era = era;
        }
    }

    fn set_last_exit(&self, text: String) {
        self.detail().last_exit = Some(text);
    }

    /// The counters now.
    pub fn snapshot(&self) -> StatsSnapshot {
        let d = self.detail();
        let mut sorted: Vec<u32> = d.latencies.iter().copied().collect();
        sorted.sort_unstable();
        let pick = |q: f64| {
            (!sorted.is_empty()).then(|| {
                let i = ((sorted.len() as f64 - 1.0) * q).round() as usize;
                Duration::from_micros(sorted[i] as u64)
            })
        };
        StatsSnapshot {
            calls_ok: self.calls_ok.load(Ordering::Relaxed),
            calls_err: self.calls_err.load(Ordering::Relaxed),
            in_flight: self.in_flight.load(Ordering::Relaxed),
            restarts: self.restarts.load(Ordering::Relaxed),
            uptime: d.ready_since.map(|t| t.elapsed()),
            last_exit: d.last_exit.clone(),
            era: d.era.clone(),
            p50: pick(0.5),
            p99: pick(0.99),
        }
    }
}

/// The answer to an operator command: what happened, or why it could not.
pub type Outcome = Result<String, String>;

/// Requests to the actor.
enum Command {
    /// List the tools again; answered when the registry has the result.
    Refresh {
        requested: Instant,
        done: oneshot::Sender<()>,
    },
    /// Drain and stop the child.
    Stop { done: oneshot::Sender<Outcome> },
    /// Start a stopped or failed toolbox.
    Start { done: oneshot::Sender<Outcome> },
    /// Rolling restart: start a new child, switch calls to it, drain the old.
    Restart { done: oneshot::Sender<Outcome> },
    /// Rolling restart into a changed manifest (same id); on failure the old
    /// configuration keeps running.
    Reconfigure {
        manifest: Box<Manifest>,
        done: oneshot::Sender<Outcome>,
    },
}

/// A cheap, clonable handle to one toolbox actor.
#[derive(Clone)]
pub struct ToolboxHandle {
    /// The toolbox_id.
    id: Arc<str>,
    /// The actor's mailbox.
    commands: mpsc::Sender<Command>,
    /// Which child serves calls, published by the actor.
    slot: watch::Receiver<Slot>,
    /// Call deadlines, published by the actor (a reload may change them).
    deadlines: watch::Receiver<Arc<Deadlines>>,
    /// Shared counters.
    stats: Arc<Stats>,
}

/// Gives a call's permit back however the call ends.
struct PermitGuard<'a>(&'a Semaphore);

impl Drop for PermitGuard<'_> {
    fn drop(&mut self) {
        self.0.add_permits(1);
    }
}

/// How long calls may take, from the manifest's `[limits]`.
#[derive(Debug)]
struct Deadlines {
    /// Deadline of one call.
    call: Duration,
    /// Shorter deadlines of particular tools.
    tools: BTreeMap<String, u64>,
}

impl Deadlines {
    fn of(manifest: &Manifest) -> Arc<Deadlines> {
        Arc::new(Deadlines {
            call: Duration::from_secs(manifest.limits.call_timeout_s),
            tools: manifest.limits.tool_timeouts.clone(),
        })
    }

    fn for_tool(&self, name: &str) -> Duration {
        self.tools
            .get(name)
            .map_or(self.call, |&secs| Duration::from_secs(secs))
    }
}

/// Keeps `in_flight` right however a call ends.
struct InFlightCount<'a>(&'a Stats);

impl Drop for InFlightCount<'_> {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

impl ToolboxHandle {
    /// The toolbox_id.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Counters for status.
    pub fn stats(&self) -> &Stats {
        &self.stats
    }

    /// The pid of the serving child, if any.
    pub fn pid(&self) -> Option<u32> {
        match &*self.slot.borrow() {
            Slot::Serving(s) => Some(s.pid),
            _ => None,
        }
    }

    /// Runs one call (arguments already validated) and returns the bus
    /// `result`, or the bus `error` text.
    pub async fn call(&self, tool: &Tool, args: Value) -> Result<Value, String> {
        let started = Instant::now();
        self.stats.in_flight.fetch_add(1, Ordering::Relaxed);
        let _count = InFlightCount(&self.stats);
        let deadline = self.deadlines.borrow().for_tool(&tool.name);
        let outcome = match tokio::time::timeout(deadline, self.call_inner(tool, args)).await {
            Ok(outcome) => outcome,
            Err(_) => Err(format!(
                "TimeoutError: tool '{}' in toolbox '{}' did not answer within {} s",
                tool.name,
                self.id,
                deadline.as_secs()
            )),
        };
        let counter = if outcome.is_ok() {
            &self.stats.calls_ok
        } else {
            &self.stats.calls_err
        };
        counter.fetch_add(1, Ordering::Relaxed);
        self.stats.record_latency(started.elapsed());
        outcome
    }

    async fn call_inner(&self, tool: &Tool, args: Value) -> Result<Value, String> {
        let serving = loop {
            let serving = self.serving().await?;
            // A closed semaphore means this child was swapped out or stopped
            // while we queued: look for the serving child again.
            // The permit is given back when the call ends (PermitGuard).
            let acquired = serving.permits.acquire().await.map(|p| p.forget());
            if acquired.is_ok() {
                break serving;
            }
        };
        let _permit = PermitGuard(&serving.permits);
        let raw =
            serving
                .session
                .call_tool(&tool.name, args)
                .await
                .map_err(|failure| match failure {
                    RpcFailure::Rpc(e) => mcp::rpc_error_text(&e),
                    RpcFailure::Exited(exit) => format!(
                        "RuntimeError: toolbox '{}' exited ({exit}) while running '{}'",
                        self.id, tool.name
                    ),
                    RpcFailure::Broken(why) => format!(
                        "RuntimeError: toolbox '{}' failed while running '{}': {why}",
                        self.id, tool.name
                    ),
                })?;
        let result = mcp::map_call_result(raw, tool.has_output_schema)?;
        tool.check_output(&result).map_err(|why| {
            format!(
                "ValueError: Tool output validation failed for '{}' in ToolBox '{}': {why}",
                tool.name, self.id
            )
        })?;
        Ok(result)
    }

    /// Waits for a serving child, or the reason there will be none.
    async fn serving(&self) -> Result<Arc<Serving>, String> {
        let mut slot = self.slot.clone();
        loop {
            match &*slot.borrow_and_update() {
                Slot::Serving(s) => return Ok(s.clone()),
                Slot::Failed(reason) => {
                    return Err(format!(
                        "RuntimeError: toolbox '{}' is failed: {reason}",
                        self.id
                    ))
                }
                Slot::Stopped => {
                    return Err(format!("RuntimeError: toolbox '{}' is stopped", self.id))
                }
                Slot::Waiting => {}
            }
            if slot.changed().await.is_err() {
                return Err(format!("RuntimeError: toolbox '{}' is stopped", self.id));
            }
        }
    }

    /// Waits (up to the call timeout) until the toolbox has left `starting` or
    /// `restarting`; `true` if it did.
    pub async fn wait_started(&self) -> bool {
        let mut slot = self.slot.clone();
        let started = async move { slot.wait_for(|s| !matches!(s, Slot::Waiting)).await.is_ok() };
        let limit = self.deadlines.borrow().call;
        tokio::time::timeout(limit, started).await == Ok(true)
    }

    /// Asks the actor to list the tools again and waits until it has (or the
    /// toolbox cannot: then it returns at once).
    pub async fn refresh(&self) {
        let (done, wait) = oneshot::channel();
        let cmd = Command::Refresh {
            requested: Instant::now(),
            done,
        };
        if self.commands.send(cmd).await.is_ok() {
            let _ = wait.await;
        }
    }

    async fn command(&self, make: impl FnOnce(oneshot::Sender<Outcome>) -> Command) -> Outcome {
        let (done, wait) = oneshot::channel();
        if self.commands.send(make(done)).await.is_err() {
            return Err(format!("toolbox '{}' is shutting down", self.id));
        }
        wait.await
            .unwrap_or_else(|_| Err(format!("toolbox '{}' is shutting down", self.id)))
    }

    /// Drains and stops the toolbox; returns when its child is gone.
    pub async fn stop(&self) -> Outcome {
        self.command(|done| Command::Stop { done }).await
    }

    /// Starts a stopped or failed toolbox; returns when it is ready or failed.
    pub async fn start(&self) -> Outcome {
        self.command(|done| Command::Start { done }).await
    }

    /// Rolling restart; returns when the new child serves, or why it could not
    /// (the old child then keeps serving).
    pub async fn restart(&self) -> Outcome {
        self.command(|done| Command::Restart { done }).await
    }

    /// Applies a changed manifest with a rolling restart; on failure the old
    /// configuration keeps serving.
    pub async fn reconfigure(&self, manifest: Manifest) -> Outcome {
        self.command(|done| Command::Reconfigure {
            manifest: Box::new(manifest),
            done,
        })
        .await
    }
}

/// Starts the actor for `manifest` and registers it as hosted.
pub fn spawn(manifest: Manifest, registry: Arc<Registry>) -> ToolboxHandle {
    let (commands_tx, commands) = mpsc::channel(64);
    let (slot_tx, slot_rx) = watch::channel(Slot::Waiting);
    let (deadlines_tx, deadlines_rx) = watch::channel(Deadlines::of(&manifest));
    let handle = ToolboxHandle {
        id: manifest.id.as_str().into(),
        commands: commands_tx,
        slot: slot_rx,
        deadlines: deadlines_rx,
        stats: Arc::default(),
    };
    registry.insert(&manifest.id, handle.clone(), State::Starting);
    let actor = actor::Actor::new(
        manifest,
        registry,
        actor::Outbox {
            slot: slot_tx,
            deadlines: deadlines_tx,
        },
        commands,
        handle.stats.clone(),
    );
    tokio::spawn(actor.run());
    handle
}
