//! One toolbox: its lifecycle state, its counters, and the handle through
//! which calls and operator commands reach it.
//!
//! Each toolbox is an actor (`actor`) that owns its child processes. Calls do
//! not pass through the actor: it publishes the serving child on a `watch`
//! channel and each caller sends its request straight to that child. While no
//! child serves (starting, restarting) a caller waits on the channel, under
//! its one deadline; a `failed` toolbox answers at once.
//!
//! A call returns the child's raw MCP result or a [`CallError`]; how either
//! reads on the bus is the service's business, not the toolbox's.

mod actor;
mod admission;
mod replicas;
pub mod restart;
mod running;
mod serving;
#[cfg(test)]
pub(crate) mod stand_in;
mod stats;
#[cfg(test)]
mod tests;

use admission::json_bytes;
pub use admission::Admission;
use serving::{Serving, Slot, SlotHold};
pub use stats::{RestartReason, Stats};

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, oneshot, watch};

use crate::call::Call;
use crate::manifest::Manifest;
use crate::mcp::RpcError;
use crate::process::child::ExitInfo;
use crate::tool::ToolSet;
use crate::util::deadline::Deadline;

/// Where a toolbox publishes itself, its state and its tools: the registry, in
/// the daemon. A trait, so that the toolbox does not depend on the registry.
pub trait Publish: Send + Sync + 'static {
    /// A new toolbox, before its actors start (so nothing they publish is lost).
    fn add(&self, handle: ToolboxHandle);
    /// Toolbox `id` is now in `state`, with these tools when given.
    fn set(&self, id: &str, state: State, tools: Option<Arc<ToolSet>>);
}

/// Why a call has no result.
#[derive(Debug, Clone, PartialEq)]
pub enum CallError {
    /// The call's deadline (this long after it arrived) passed, start-up wait
    /// included; the child, if it had the call, was told to cancel it.
    Timeout(Duration),
    /// The child exited while it had the call.
    Exited(ExitInfo),
    /// The child broke the protocol while it had the call (and is restarted).
    Broken(String),
    /// The child answered with a JSON-RPC error.
    Rpc(RpcError),
    /// The toolbox is `failed`, for this reason.
    Failed(String),
    /// The toolbox is stopped: no child will take the call.
    Stopped,
    /// So many calls wait for the toolbox already (`max_queued_calls` more
    /// than its slots) that this one was refused at once.
    Busy { waiting: usize },
    /// A stop (`mycroft.stop`) for the caller's session cancelled it; the
    /// child, if it had the call, was told to cancel it.
    Cancelled,
    /// The request would be larger than the child may be sent
    /// (`max_message_bytes`): the caller's error; the child never saw it.
    TooLarge { bytes: usize, limit: usize },
    /// The arguments are larger than the toolbox takes
    /// (`max_argument_bytes`): refused unread.
    ArgumentsTooLarge { bytes: usize, limit: usize },
}
/// A toolbox's lifecycle state (docs/operations.md, "What to do in each state").
#[derive(Debug, Clone, PartialEq)]
pub enum State {
    /// Spawned; handshake and tool list under way.
    Starting,
    /// Serving calls.
    Ready,
    /// No child (lazy before its first call, or stopped after `idle_stop_s`
    /// without a call): listed from its last known tools; the next call
    /// starts a child and waits for it.
    Idle,
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
    /// Every state's [`State::name`], in the order metrics list them.
    pub const NAMES: [&'static str; 7] = [
        "starting",
        "ready",
        "idle",
        "restarting",
        "failed",
        "stopped",
        "conflict",
    ];

    /// The state's name as status and logs show it.
    pub fn name(&self) -> &'static str {
        match self {
            State::Starting => "starting",
            State::Ready => "ready",
            State::Idle => "idle",
            State::Restarting { .. } => "restarting",
            State::Failed { .. } => "failed",
            State::Stopped => "stopped",
            State::Conflict { .. } => "conflict",
        }
    }
}

/// The answer to an operator command: what happened, or why it could not.
pub type CommandResult = Result<String, String>;

/// Requests to the actor.
enum Command {
    /// List the tools again; answered when the registry has the result.
    Refresh {
        requested: Instant,
        /// Asked by a reload: an idle toolbox also checks its cached catalog
        /// still holds (not at every discovery: that reads a file).
        at_reload: bool,
        done: oneshot::Sender<()>,
    },
    /// Drain and stop the child.
    Stop {
        done: oneshot::Sender<CommandResult>,
    },
    /// Start a stopped or failed toolbox.
    Start {
        done: oneshot::Sender<CommandResult>,
    },
    /// Rolling restart: start a new child, switch calls to it, drain the old.
    Restart {
        done: oneshot::Sender<CommandResult>,
    },
    /// Rolling restart into a changed manifest (same id); on failure the old
    /// configuration keeps running.
    Reconfigure {
        manifest: Box<Manifest>,
        done: oneshot::Sender<CommandResult>,
    },
}

/// The shortest time between two prewarm starts of one toolbox.
pub const PREWARM_INTERVAL: std::time::Duration = std::time::Duration::from_secs(10);

/// A cheap, clonable handle to one toolbox actor.
#[derive(Clone)]
pub struct ToolboxHandle {
    /// The toolbox_id.
    id: Arc<str>,
    /// One actor per instance (`instances` in the manifest).
    replicas: Arc<[Replica]>,
    /// Call deadlines and bounds, published by the actor (a reload may
    /// change them).
    limits: watch::Receiver<Arc<CallLimits>>,
    /// Shared counters.
    stats: Arc<Stats>,
}

/// The caller's view of one replica's actor.
struct Replica {
    /// The actor's mailbox.
    commands: mpsc::Sender<Command>,
    /// Which child serves its calls, published by the actor.
    slot: watch::Receiver<Slot>,
    /// Rung when a caller (or a prewarm topic) finds the replica idle: the
    /// actor starts a child.
    wake: Arc<tokio::sync::Notify>,
}

/// What callers are held to, from the manifest's `[limits]` (a reload may
/// change them, so the actor publishes them).
#[derive(Debug)]
struct CallLimits {
    /// Deadline of one call.
    call: Duration,
    /// Shorter deadlines of particular tools.
    tools: BTreeMap<String, u64>,
    /// Calls that may wait or run at once: the slots of every instance plus
    /// `max_queued_calls`; one more is refused as busy.
    admitted: usize,
    /// `max_argument_bytes`: larger arguments are refused unread.
    max_argument_bytes: usize,
    /// `[start] prewarm_on`: bus topics that wake an idle toolbox.
    prewarm_on: Vec<String>,
    /// `audit_arguments`: the audit log records arguments and results.
    audit_arguments: bool,
    /// `confirm`, `ask_timeout_s`, `elicitation`: which calls wait for a
    /// person's yes, and whether the child may ask the person.
    asking: crate::manifest::Asking,
}

impl CallLimits {
    fn of(manifest: &Manifest) -> Arc<CallLimits> {
        let limits = &manifest.limits;
        Arc::new(CallLimits {
            call: Duration::from_secs(limits.call_timeout_s),
            tools: limits.tool_timeouts.clone(),
            admitted: limits.max_concurrent_calls * manifest.instances.max(1)
                + limits.max_queued_calls,
            max_argument_bytes: limits.max_argument_bytes,
            prewarm_on: manifest.start.prewarm_on.clone(),
            audit_arguments: manifest.audit_arguments,
            asking: manifest.asking.clone(),
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

    /// The pids of the serving children (one per ready instance).
    pub fn pids(&self) -> Vec<u32> {
        self.replicas
            .iter()
            .filter_map(|r| match &*r.slot.borrow() {
                Slot::Serving(s) => Some(s.pid),
                _ => None,
            })
            .collect()
    }

    /// The manifest's `call_timeout_s`.
    pub fn call_timeout(&self) -> Duration {
        self.limits.borrow().call
    }

    /// The one deadline of a call of `tool` that arrived at `arrived`: its
    /// `tool_timeouts` entry, else `call_timeout_s`.
    pub fn deadline(&self, tool: &str, arrived: tokio::time::Instant) -> Deadline {
        Deadline::after(arrived, self.limits.borrow().for_tool(tool))
    }

    /// Admits `call`, or says why not: past every slot and
    /// `max_queued_calls` waiting it is refused as busy, at once, rather
    /// than queued without end; arguments past `max_argument_bytes` are
    /// refused unread. The call counts as in flight until the admission is
    /// dropped.
    pub fn admit(&self, call: &Call) -> Result<Admission<'_>, CallError> {
        let waiting = self.stats.in_flight.fetch_add(1, Ordering::Relaxed) as usize;
        let count = InFlightCount(&self.stats);
        let limits = self.limits.borrow();
        if waiting >= limits.admitted {
            // Counted as an error in status, as every call it refuses.
            self.stats
                .record_call(false, call.request.arrived.elapsed());
            return Err(CallError::Busy { waiting });
        }
        // The message carrying the arguments bounds them: only one that may
        // be larger than the limit is measured.
        let limit = limits.max_argument_bytes;
        if call.request.bytes > limit {
            let bytes = json_bytes(&call.request.arguments);
            if bytes > limit {
                return Err(CallError::ArgumentsTooLarge { bytes, limit });
            }
        }
        Ok(Admission {
            handle: self,
            limits: Arc::clone(&limits),
            _count: count,
        })
    }

    /// Waits, until `deadline`, for a serving child and one of its call
    /// slots; `Err(None)` when the deadline passed.
    async fn take_slot(
        &self,
        deadline: tokio::time::Instant,
    ) -> Result<SlotHold, Option<CallError>> {
        loop {
            let serving = match tokio::time::timeout_at(deadline, self.serving()).await {
                Ok(found) => found.map_err(Some)?,
                Err(_) => return Err(None),
            };
            // A closed semaphore means this child was swapped out or stopped
            // while we queued: look for the serving child again.
            let answers_before = serving.answers.load(Ordering::Relaxed);
            let acquired = tokio::time::timeout_at(deadline, serving.permits.acquire())
                .await
                .map(|permit| permit.map(|p| p.forget()));
            match acquired {
                // Given back by SlotHold's drop.
                Ok(Ok(())) => {
                    serving.touch();
                    return Ok(SlotHold(serving));
                }
                Ok(Err(_closed)) => continue,
                // Every slot stayed taken for the whole wait. Only if the
                // child answered nothing in that time does it count against
                // it: a busy child that answers is not wedged.
                Err(_) => {
                    if serving.answers.load(Ordering::Relaxed) == answers_before {
                        serving.timed_out();
                    }
                    return Err(None);
                }
            }
        }
    }

    /// Waits for a serving child — the least busy one when several serve —
    /// or the reason there will be none. With every replica idle, the first
    /// is woken.
    async fn serving(&self) -> Result<Arc<Serving>, CallError> {
        let mut slots: Vec<watch::Receiver<Slot>> =
            self.replicas.iter().map(|r| r.slot.clone()).collect();
        loop {
            let mut best: Option<Arc<Serving>> = None;
            let mut failed = None;
            let mut waiting = false;
            let mut idle = None;
            for (i, slot) in slots.iter_mut().enumerate() {
                match &*slot.borrow_and_update() {
                    Slot::Serving(s) => {
                        if best.as_ref().is_none_or(|b| {
                            s.permits.available_permits() > b.permits.available_permits()
                        }) {
                            best = Some(s.clone());
                        }
                    }
                    Slot::Failed(reason) => failed = failed.or(Some(reason.clone())),
                    Slot::Waiting => waiting = true,
                    Slot::Idle => idle = idle.or(Some(i)),
                    Slot::Stopped => {}
                }
            }
            if let Some(serving) = best {
                // Every slot of the best child taken: another instance that
                // went idle is started too, for the calls that follow.
                if let (Some(i), 0) = (idle, serving.permits.available_permits()) {
                    self.replicas[i].wake.notify_one();
                }
                return Ok(serving);
            }
            if let (Some(i), false) = (idle, waiting) {
                self.replicas[i].wake.notify_one();
                waiting = true;
            }
            if !waiting {
                return Err(failed.map_or(CallError::Stopped, CallError::Failed));
            }
            let changes = slots.iter_mut().map(|s| Box::pin(s.changed()));
            if futures_util::future::select_all(changes).await.0.is_err() {
                return Err(CallError::Stopped);
            }
        }
    }

    /// Waits until every instance has left `starting` or `restarting`, or
    /// `deadline` passes; `true` if they did.
    pub async fn wait_started(&self, deadline: tokio::time::Instant) -> bool {
        let all = futures_util::future::join_all(self.replicas.iter().map(|r| {
            let mut slot = r.slot.clone();
            async move { slot.wait_for(|s| !matches!(s, Slot::Waiting)).await.is_ok() }
        }));
        matches!(tokio::time::timeout_at(deadline, all).await, Ok(v) if v.iter().all(|ok| *ok))
    }

    /// Asks an actor (a serving instance's, if any) to list the tools again
    /// and waits until it has (or the toolbox cannot: then it returns at
    /// once). `at_reload`: an idle toolbox also checks its cached catalog.
    pub async fn refresh(&self, at_reload: bool) {
        let replica = self
            .replicas
            .iter()
            .find(|r| matches!(&*r.slot.borrow(), Slot::Serving(_)))
            .unwrap_or(&self.replicas[0]);
        let (done, wait) = oneshot::channel();
        let cmd = Command::Refresh {
            requested: Instant::now(),
            at_reload,
            done,
        };
        if replica.commands.send(cmd).await.is_ok() {
            let _ = wait.await;
        }
    }

    /// Sends a command to every instance in turn (so a restart rolls one
    /// instance at a time) and combines their answers.
    async fn command(
        &self,
        make: impl Fn(oneshot::Sender<CommandResult>) -> Command,
    ) -> CommandResult {
        let gone = || format!("toolbox '{}' is shutting down", self.id);
        let mut done = Vec::new();
        let mut failed = Vec::new();
        for (i, replica) in self.replicas.iter().enumerate() {
            let (tx, rx) = oneshot::channel();
            let outcome = match replica.commands.send(make(tx)).await {
                Ok(()) => rx.await.unwrap_or_else(|_| Err(gone())),
                Err(_) => Err(gone()),
            };
            let label = |text: String| {
                if self.replicas.len() > 1 {
                    format!("instance {i}: {text}")
                } else {
                    text
                }
            };
            match outcome {
                Ok(text) => done.push(label(text)),
                Err(text) => failed.push(label(text)),
            }
        }
        if failed.is_empty() {
            Ok(done.join("; "))
        } else {
            Err(failed.join("; "))
        }
    }

    /// Drains and stops the toolbox; returns when its child is gone.
    pub async fn stop(&self) -> CommandResult {
        self.command(|done| Command::Stop { done }).await
    }

    /// Starts a stopped or failed toolbox; returns when it is ready or failed.
    pub async fn start(&self) -> CommandResult {
        self.command(|done| Command::Start { done }).await
    }

    /// Rolling restart; returns when the new child serves, or why it could not
    /// (the old child then keeps serving).
    pub async fn restart(&self) -> CommandResult {
        self.command(|done| Command::Restart { done }).await
    }

    /// Applies a changed manifest with a rolling restart; on failure the old
    /// configuration keeps serving.
    pub async fn reconfigure(&self, manifest: Manifest) -> CommandResult {
        self.command(|done| Command::Reconfigure {
            manifest: Box::new(manifest.clone()),
            done,
        })
        .await
    }

    /// How long the longest-serving child has been ready.
    pub fn uptime(&self) -> Option<Duration> {
        self.replicas
            .iter()
            .filter_map(|r| match &*r.slot.borrow() {
                Slot::Serving(s) => Some(s.since.elapsed()),
                _ => None,
            })
            .max()
    }

    /// How many instances this toolbox runs.
    pub fn instances(&self) -> usize {
        self.replicas.len()
    }

    /// Its `[start] prewarm_on` topics.
    pub fn prewarm_topics(&self) -> Vec<String> {
        self.limits.borrow().prewarm_on.clone()
    }

    /// Starts a child ahead of the first call if every replica is idle (a
    /// `prewarm_on` topic was heard), at most once per
    /// [`PREWARM_INTERVAL`]: any bus client can send the topic, and a
    /// prewarm after each idle stop was a start loop (332 child starts in
    /// 20 s for a topic sent five times a second).
    pub fn prewarm(&self) {
        let idle = |r: &Replica| matches!(&*r.slot.borrow(), Slot::Idle);
        if self.replicas.iter().all(idle) && self.stats.prewarm_due(PREWARM_INTERVAL) {
            if let Some(first) = self.replicas.first() {
                first.wake.notify_one();
            }
        }
    }
}

#[cfg(test)]
impl ToolboxHandle {
    /// One call of `tool` through admission, as the pipeline makes it
    /// (arguments unchecked), for the tests of the toolbox alone.
    pub(crate) async fn call(
        &self,
        tool: &str,
        arguments: serde_json::Value,
        arrived: Instant,
        cancel: &mut crate::cancel::Cancel,
    ) -> Result<serde_json::Value, CallError> {
        use crate::cancel::Cancel;
        let arrived = tokio::time::Instant::from_std(arrived);
        let mut call = Call {
            request: crate::call::Request {
                topic: "test".to_owned(),
                session: None,
                source: None,
                toolbox: Some(self.id().to_owned()),
                tool: tool.to_owned(),
                arguments,
                bytes: 0,
                arrived,
                cancel: std::mem::replace(cancel, Cancel::never()),
                progress: None,
            },
            toolbox: self.id().to_owned(),
            deadline: self.deadline(tool, arrived),
            questions: None,
        };
        let admission = self.admit(&call)?;
        let answer = admission.call(&mut call).await;
        *cancel = call.request.cancel;
        answer
    }
}

#[cfg(test)]
impl ToolboxHandle {
    /// A handle with no actor behind it, for tests of what stores handles
    /// (a call through it finds no child and answers `Stopped`).
    pub(crate) fn detached(id: &str) -> ToolboxHandle {
        let (_, limits) = watch::channel(Arc::new(CallLimits {
            call: Duration::from_secs(30),
            tools: BTreeMap::new(),
            admitted: 8,
            max_argument_bytes: 1 << 20,
            prewarm_on: Vec::new(),
            audit_arguments: false,
            asking: crate::manifest::Asking::default(),
        }));
        ToolboxHandle {
            id: id.into(),
            replicas: Arc::new([]),
            limits,
            stats: Arc::default(),
        }
    }
}

/// Starts the actors for `manifest` (one per instance), publishing into `sink`.
pub fn spawn(manifest: Manifest, sink: Arc<dyn Publish>) -> ToolboxHandle {
    let instances = manifest.instances.max(1);
    let (limits_tx, limits_rx) = watch::channel(CallLimits::of(&manifest));
    let limits_tx = Arc::new(limits_tx);
    let publisher = replicas::Publisher::new(&manifest.id, sink.clone(), instances);
    let stats = Arc::new(Stats::default());
    let mut replicas = Vec::with_capacity(instances);
    let mut actors = Vec::with_capacity(instances);
    for index in 0..instances {
        let (commands_tx, commands) = mpsc::channel(64);
        let (slot_tx, slot_rx) = watch::channel(Slot::Waiting);
        let wake = Arc::new(tokio::sync::Notify::new());
        replicas.push(Replica {
            commands: commands_tx,
            slot: slot_rx,
            wake: wake.clone(),
        });
        actors.push(actor::Actor::new(
            manifest.clone(),
            publisher.clone(),
            index,
            actor::Outbox {
                slot: slot_tx,
                limits: limits_tx.clone(),
            },
            commands,
            wake,
            stats.clone(),
        ));
    }
    let handle = ToolboxHandle {
        id: manifest.id.as_str().into(),
        replicas: replicas.into(),
        limits: limits_rx,
        stats,
    };
    sink.add(handle.clone());
    for actor in actors {
        tokio::spawn(actor.run());
    }
    handle
}
