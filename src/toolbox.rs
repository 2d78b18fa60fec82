//! The per-toolbox actor: it owns the toolbox's child, starts it, restarts it
//! under the manifest's policy, probes it, refreshes its tools into the
//! registry, and publishes which child serves calls.
//!
//! Calls do not pass through the actor: the actor publishes the serving child on
//! a `watch` channel and each caller sends its request straight to that child.
//! While no child serves (starting, restarting) a caller waits on the channel,
//! up to its own deadline; a `failed` toolbox answers at once.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::Value;
use tokio::sync::{mpsc, oneshot, watch, Semaphore};

use crate::child::{Child, ChildEvent, ExitInfo, RpcFailure};
use crate::manifest::{Manifest, RestartPolicy};
use crate::mcp::{self, ToolSpec};
use crate::registry::{Registry, Tool, ToolSet};
use crate::session::Session;

/// How long a child gets to exit after its stdin closes, and again after SIGTERM.
const STOP_GRACE: Duration = Duration::from_secs(3);
/// Liveness probes missed in a row before the child is killed.
const MAX_MISSED_PROBES: u32 = 3;

/// A toolbox's lifecycle state (DESIGN §3).
#[derive(Debug, Clone, PartialEq)]
pub enum State {
    /// Spawned; handshake and tool list under way.
    Starting,
    /// Serving calls.
    Ready,
    /// The child exited; waiting out the backoff. Calls wait.
    Restarting { last_exit: String },
    /// The restart budget is spent; calls fail at once with this reason.
    Failed { reason: String },
    /// Stopped by an operator or `enabled = false`: not hosted.
    Stopped,
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

/// Counters for status.
#[derive(Debug, Default)]
pub struct Stats {
    /// Calls answered with a result.
    pub calls_ok: AtomicU64,
    /// Calls answered with an error by the child, a deadline or a crash.
    pub calls_err: AtomicU64,
    /// Calls waiting for or running on a child right now.
    pub in_flight: AtomicU64,
    /// Restarts since the daemon started.
    pub restarts: AtomicU64,
}

/// Requests to the actor.
enum Command {
    /// List the tools again; answered when the registry has the result.
    Refresh {
        requested: Instant,
        done: oneshot::Sender<()>,
    },
    /// Drain and stop the child; answered when it is gone.
    Stop { done: oneshot::Sender<()> },
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
    /// Deadline of one call.
    call_timeout: Duration,
    /// Shorter deadlines of particular tools.
    tool_timeouts: Arc<std::collections::BTreeMap<String, u64>>,
    /// Shared counters.
    stats: Arc<Stats>,
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
        self.stats.in_flight.fetch_add(1, Ordering::Relaxed);
        let _count = InFlightCount(&self.stats);
        let deadline = self
            .tool_timeouts
            .get(&tool.name)
            .map_or(self.call_timeout, |&secs| Duration::from_secs(secs));
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
        outcome
    }

    async fn call_inner(&self, tool: &Tool, args: Value) -> Result<Value, String> {
        let serving = self.serving().await?;
        let _permit = serving
            .permits
            .acquire()
            .await
            .map_err(|_| format!("RuntimeError: toolbox '{}' is shutting down", self.id))?;
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
        tokio::time::timeout(self.call_timeout, started).await == Ok(true)
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

    /// Drains and stops the toolbox; returns when its child is gone.
    pub async fn stop(&self) {
        let (done, wait) = oneshot::channel();
        if self.commands.send(Command::Stop { done }).await.is_ok() {
            let _ = wait.await;
        }
    }
}

/// Starts the actor for `manifest` and registers it as hosted.
pub fn spawn(manifest: Manifest, registry: Arc<Registry>) -> ToolboxHandle {
    let (commands_tx, commands) = mpsc::channel(64);
    let (slot_tx, slot_rx) = watch::channel(Slot::Waiting);
    let handle = ToolboxHandle {
        id: manifest.id.as_str().into(),
        commands: commands_tx,
        slot: slot_rx,
        call_timeout: Duration::from_secs(manifest.limits.call_timeout_s),
        tool_timeouts: Arc::new(manifest.limits.tool_timeouts.clone()),
        stats: Arc::default(),
    };
    registry.insert(&manifest.id, handle.clone(), State::Starting);
    let actor = Actor {
        pin: manifest.protocol.clone(),
        manifest,
        registry,
        slot: slot_tx,
        commands,
        stats: handle.stats.clone(),
        last_specs: None,
        last_refresh: None,
        restarts: VecDeque::new(),
        backoff_step: 0,
    };
    tokio::spawn(actor.run());
    handle
}

/// A child that finished its handshake and listed its tools.
struct Running {
    child: Child,
    events: mpsc::UnboundedReceiver<ChildEvent>,
    serving: Arc<Serving>,
    started: Instant,
}

/// How a running phase ended.
enum Ended {
    /// The child exited (or was killed for missing probes).
    Exited(Down),
    /// An operator stopped the toolbox, or the daemon is shutting down.
    Stopped,
}

/// A child that went down, as the restart policy and the failure report need it.
struct Down {
    /// How it ended (`Code(-1)` when it never started).
    exit: ExitInfo,
    /// How long it had served; a long run resets the backoff.
    uptime: Duration,
    /// What happened, in words, for status and errors.
    text: String,
    /// Its last stderr lines.
    stderr: Vec<String>,
}

impl Down {
    /// A child that could not finish its start: kill it and say why.
    async fn of_failed_start(child: &Child, why: String) -> Down {
        let exit = match tokio::time::timeout(Duration::from_millis(200), child.exited()).await {
            Ok(exit) => exit,
            Err(_) => {
                child.signal_group(nix::sys::signal::Signal::SIGKILL);
                child.exited().await
            }
        };
        Down {
            exit,
            uptime: Duration::ZERO,
            text: format!("failed to start ({why}; child {exit})"),
            stderr: child.stderr_tail(),
        }
    }
}

struct Actor {
    /// The configuration this actor runs.
    manifest: Manifest,
    /// Where tools and state are published.
    registry: Arc<Registry>,
    /// Where the serving child is published for callers.
    slot: watch::Sender<Slot>,
    /// The mailbox.
    commands: mpsc::Receiver<Command>,
    /// Counters shared with handles.
    stats: Arc<Stats>,
    /// The protocol version to use without probing: the manifest's pin, or what
    /// the last probe found (the era of a server does not change across restarts).
    pin: Option<String>,
    /// The last tool list, to skip rebuilding the catalog when nothing changed.
    last_specs: Option<Vec<ToolSpec>>,
    /// When the last refresh started, to answer queued refreshes at once.
    last_refresh: Option<Instant>,
    /// Start times of recent restarts, for the `max_restarts` in `window_s` budget.
    restarts: VecDeque<Instant>,
    /// Exponent of the current backoff delay.
    backoff_step: u32,
}

impl Actor {
    fn id(&self) -> &str {
        &self.manifest.id
    }

    fn publish(&self, state: State, tools: Option<Arc<ToolSet>>) {
        self.registry.set(&self.manifest.id, state, tools);
    }

    async fn run(mut self) {
        if !self.manifest.enabled {
            self.publish(State::Stopped, None);
            let _ = self.slot.send(Slot::Stopped);
            self.idle_until_stopped().await;
            return;
        }
        loop {
            let down = match self.start().await {
                Ok(running) => match self.serve(running).await {
                    Ended::Stopped => return,
                    Ended::Exited(down) => down,
                },
                Err(down) => {
                    tracing::error!(toolbox = self.id(), "{}", down.text);
                    down
                }
            };
            if !self.restart_after(down).await {
                return;
            }
        }
    }

    /// Spawns a child, selects its era and lists its tools.
    async fn start(&mut self) -> Result<Running, Down> {
        let limits = &self.manifest.limits;
        let probe_timeout = Duration::from_secs(limits.probe_timeout_s);
        let request_timeout = Duration::from_secs(limits.call_timeout_s);
        let mut attempt = 0;
        let (child, events, session) = loop {
            attempt += 1;
            let (child, events) = Child::spawn(&self.manifest).map_err(|e| Down {
                exit: ExitInfo::Code(-1),
                uptime: Duration::ZERO,
                text: format!("failed to start: {e}"),
                stderr: Vec::new(),
            })?;
            tracing::info!(toolbox = self.id(), pid = child.pid(), "child spawned");
            let opened = Session::open(
                child.rpc().clone(),
                self.pin.as_deref(),
                probe_timeout,
                request_timeout,
            )
            .await;
            match opened {
                Ok(session) => break (child, events, session),
                // A legacy child may die of the unknown `server/discover` probe:
                // start it again and go straight to `initialize`.
                Err(e) if e.child_died() && self.pin.is_none() && attempt == 1 => {
                    tracing::info!(
                        toolbox = self.id(),
                        pid = child.pid(),
                        "child ended during the era probe ({e}); retrying as legacy MCP"
                    );
                    self.pin = Some(crate::manifest::LEGACY_VERSIONS[0].to_owned());
                }
                Err(e) => {
                    // Probe again next time: the guess above may have been wrong.
                    self.pin = self.manifest.protocol.clone();
                    return Err(Down::of_failed_start(&child, format!("handshake: {e}")).await);
                }
            }
        };
        let pid = child.pid();
        self.pin = Some(session.era().version().to_owned());
        let (specs, problems) = match session.list_tools(request_timeout).await {
            Ok(listed) => listed,
            Err(e) => {
                return Err(Down::of_failed_start(&child, format!("listing tools: {e}")).await)
            }
        };
        for problem in problems {
            tracing::warn!(toolbox = self.id(), pid, "tool left out: {problem}");
        }
        let tools = self.compile(specs);
        let serving = Arc::new(Serving {
            session,
            pid,
            permits: Semaphore::new(self.manifest.limits.max_concurrent_calls),
        });
        tracing::info!(
            toolbox = self.id(),
            pid,
            era = %serving.session.era(),
            tools = tools.len(),
            "toolbox ready"
        );
        self.publish(State::Ready, Some(tools));
        let _ = self.slot.send(Slot::Serving(serving.clone()));
        Ok(Running {
            child,
            events,
            serving,
            started: Instant::now(),
        })
    }

    /// Compiles listed tools, logging each one left out.
    fn compile(&mut self, specs: Vec<ToolSpec>) -> Arc<ToolSet> {
        self.last_specs = Some(specs.clone());
        let tools = specs
            .into_iter()
            .filter_map(|spec| {
                let name = spec.name.clone();
                Tool::compile(&self.manifest.id, spec)
                    .map_err(|why| {
                        tracing::warn!(toolbox = self.id(), tool = %name, "tool left out: {why}")
                    })
                    .ok()
            })
            .collect();
        let (set, dropped) = ToolSet::new(tools);
        for name in dropped {
            tracing::warn!(toolbox = self.id(), tool = %name, "tool left out: its name is listed twice");
        }
        Arc::new(set)
    }

    /// Serves until the child exits or the toolbox is stopped.
    async fn serve(&mut self, mut running: Running) -> Ended {
        let limits = &self.manifest.limits;
        let probe_every = Duration::from_secs(limits.probe_interval_s);
        let probe_timeout = Duration::from_secs(limits.probe_timeout_s);
        let mut probe =
            tokio::time::interval_at(tokio::time::Instant::now() + probe_every, probe_every);
        let mut missed = 0;
        let pid = running.child.pid();
        loop {
            tokio::select! {
                exit = running.child.exited() => {
                    tracing::warn!(toolbox = self.id(), pid, "child exited ({exit})");
                    return Ended::Exited(Down {
                        exit,
                        uptime: running.started.elapsed(),
                        text: format!("exited ({exit})"),
                        stderr: running.child.stderr_tail(),
                    });
                }
                Some(event) = running.events.recv() => match event {
                    ChildEvent::ToolsChanged => self.refresh(&running, None).await,
                },
                command = self.commands.recv() => match command {
                    Some(Command::Refresh { requested, done }) => {
                        self.refresh(&running, Some(requested)).await;
                        let _ = done.send(());
                    }
                    Some(Command::Stop { done }) => {
                        self.stop_child(running).await;
                        let _ = done.send(());
                        self.idle_until_stopped().await;
                        return Ended::Stopped;
                    }
                    None => {
                        self.stop_child(running).await;
                        return Ended::Stopped;
                    }
                },
                _ = probe.tick() => {
                    match tokio::time::timeout(probe_timeout, running.serving.session.probe()).await {
                        Ok(Ok(())) => missed = 0,
                        Ok(Err(RpcFailure::Rpc(_))) => missed = 0, // it answered
                        _ => {
                            missed += 1;
                            tracing::warn!(toolbox = self.id(), pid, missed, "liveness probe missed");
                            if missed >= MAX_MISSED_PROBES {
                                tracing::error!(toolbox = self.id(), pid, "child stopped answering its liveness probe; killing it");
                                running.child.signal_group(nix::sys::signal::Signal::SIGKILL);
                            }
                        }
                    }
                }
            }
        }
    }

    /// Lists the tools again and publishes them if they changed. A refresh
    /// requested before the last one started is already answered by it.
    async fn refresh(&mut self, running: &Running, requested: Option<Instant>) {
        if let (Some(requested), Some(last)) = (requested, self.last_refresh) {
            if last >= requested {
                return;
            }
        }
        self.last_refresh = Some(Instant::now());
        let limit = Duration::from_secs(self.manifest.limits.call_timeout_s);
        match running.serving.session.list_tools(limit).await {
            Ok((specs, _)) if self.last_specs.as_ref() == Some(&specs) => {}
            Ok((specs, problems)) => {
                for problem in problems {
                    tracing::warn!(toolbox = self.id(), "tool left out: {problem}");
                }
                let tools = self.compile(specs);
                tracing::info!(
                    toolbox = self.id(),
                    tools = tools.len(),
                    "tool list changed"
                );
                self.publish(State::Ready, Some(tools));
            }
            Err(e) => tracing::warn!(toolbox = self.id(), "tool refresh failed: {e}"),
        }
    }

    /// Stops serving: new calls see `stopped`, running ones may finish within
    /// `drain_timeout_s`, then the child is stopped.
    async fn stop_child(&mut self, running: Running) {
        self.publish(State::Stopped, None);
        let _ = self.slot.send(Slot::Stopped);
        let drain = Duration::from_secs(self.manifest.limits.drain_timeout_s);
        let deadline = Instant::now() + drain;
        while running.serving.session.rpc().in_flight() > 0 && Instant::now() < deadline {
            tokio::select! {
                _ = running.child.exited() => break,
                _ = tokio::time::sleep(Duration::from_millis(10)) => {}
            }
        }
        running.serving.permits.close();
        let exit = running.child.stop(STOP_GRACE).await;
        tracing::info!(
            toolbox = self.id(),
            pid = running.child.pid(),
            "child stopped ({exit})"
        );
    }

    /// After a stop: answer commands until every handle is gone.
    async fn idle_until_stopped(&mut self) {
        while let Some(command) = self.commands.recv().await {
            match command {
                Command::Refresh { done, .. } => {
                    let _ = done.send(());
                }
                Command::Stop { done } => {
                    let _ = done.send(());
                }
            }
        }
    }

    /// Applies the restart policy after an exit; `false` when the toolbox stays down.
    async fn restart_after(&mut self, down: Down) -> bool {
        let Down {
            exit,
            uptime,
            text: exit_text,
            stderr,
        } = down;
        let restart = self.manifest.restart.clone();
        let wanted = match restart.policy {
            RestartPolicy::Always => true,
            RestartPolicy::OnFailure => exit.is_failure(),
            RestartPolicy::Never => false,
        };
        if !wanted {
            let reason = format!("{exit_text}; restart policy is {:?}", restart.policy);
            tracing::warn!(
                toolbox = self.id(),
                stderr_tail = %stderr.join("\n"),
                "not restarting: {reason}"
            );
            self.publish(
                State::Failed {
                    reason: reason.clone(),
                },
                None,
            );
            let _ = self.slot.send(Slot::Failed(reason));
            self.idle_until_stopped().await;
            return false;
        }
        if uptime >= Duration::from_secs(restart.stable_after_s) {
            self.backoff_step = 0;
        }
        let now = Instant::now();
        let window = Duration::from_secs(restart.window_s);
        while self
            .restarts
            .front()
            .is_some_and(|t| now.duration_since(*t) > window)
        {
            self.restarts.pop_front();
        }
        if self.restarts.len() >= restart.max_restarts as usize {
            let reason = format!(
                "{exit_text}; more than {} restarts within {} s; next try in {} s",
                restart.max_restarts, restart.window_s, restart.failed_retry_s
            );
            tracing::error!(
                toolbox = self.id(),
                stderr_tail = %stderr.join("\n"),
                "failed: {reason}"
            );
            self.publish(
                State::Failed {
                    reason: reason.clone(),
                },
                None,
            );
            let _ = self.slot.send(Slot::Failed(reason));
            if !self.wait(Duration::from_secs(restart.failed_retry_s)).await {
                return false;
            }
            self.restarts.clear();
            self.backoff_step = 0;
        } else {
            let delay = backoff(
                restart.backoff_initial_ms,
                restart.backoff_max_ms,
                self.backoff_step,
            );
            self.backoff_step = self.backoff_step.saturating_add(1);
            tracing::info!(
                toolbox = self.id(),
                delay_ms = delay.as_millis() as u64,
                "restarting after {exit_text}"
            );
            self.publish(
                State::Restarting {
                    last_exit: exit_text,
                },
                None,
            );
            let _ = self.slot.send(Slot::Waiting);
            if !self.wait(delay).await {
                return false;
            }
        }
        self.restarts.push_back(Instant::now());
        self.stats.restarts.fetch_add(1, Ordering::Relaxed);
        self.publish(State::Starting, None);
        let _ = self.slot.send(Slot::Waiting);
        true
    }

    /// Sleeps `delay` while answering commands; `false` if stopped meanwhile.
    async fn wait(&mut self, delay: Duration) -> bool {
        let sleep = tokio::time::sleep(delay);
        tokio::pin!(sleep);
        loop {
            tokio::select! {
                _ = &mut sleep => return true,
                command = self.commands.recv() => match command {
                    Some(Command::Refresh { done, .. }) => { let _ = done.send(()); }
                    Some(Command::Stop { done }) => {
                        self.publish(State::Stopped, None);
                        let _ = self.slot.send(Slot::Stopped);
                        let _ = done.send(());
                        self.idle_until_stopped().await;
                        return false;
                    }
                    None => return false,
                },
            }
        }
    }
}

/// The delay before restart number `step` (0-based): doubling from `initial_ms`
/// up to `max_ms`, with ±20% jitter so that toolboxes that died together do not
/// restart in lockstep.
pub fn backoff(initial_ms: u64, max_ms: u64, step: u32) -> Duration {
    let base = initial_ms
        .saturating_mul(1u64.checked_shl(step.min(63)).unwrap_or(u64::MAX))
        .min(max_ms);
    let jitter = rand::random_range(0.8..=1.2);
    Duration::from_millis(((base as f64) * jitter).min(max_ms as f64) as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_within_jitter_and_caps() {
        for step in 0..5 {
            let d = backoff(100, 30_000, step).as_millis() as u64;
            let base = 100 << step;
            assert!(d >= base * 8 / 10 && d <= base * 12 / 10, "{step}: {d}");
        }
        assert!(backoff(100, 30_000, 40).as_millis() <= 30_000);
        assert!(backoff(100, 30_000, u32::MAX).as_millis() <= 30_000);
    }
}
