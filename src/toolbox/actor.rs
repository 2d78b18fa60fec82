//! The toolbox actor: where a child is started, probed, restarted after a
//! crash (under [`super::restart`]), swapped in a rolling restart, and stopped.
//!
//! The actor runs a small state machine of [`Phase`]s; in every phase it keeps
//! answering its mailbox, so an operator's command or a refresh never waits
//! behind a backoff.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, oneshot, watch, Semaphore};

use super::replicas::Publisher;
use super::restart::{Budget, Decision};
use super::{Command, Deadlines, Outcome, Serving, Slot, State, Stats};
use crate::child::{Child, ChildEvent, ExitInfo, RpcFailure};
use crate::launch::{self, LaunchError, Launched};
use crate::manifest::Manifest;
use crate::mcp::ToolSpec;
use crate::tool::ToolSet;

/// How long a child gets to exit after its stdin closes, and again after SIGTERM.
const STOP_GRACE: Duration = Duration::from_secs(3);
/// Liveness probes missed in a row before the child is killed.
const MAX_MISSED_PROBES: u32 = 3;

type Reply = oneshot::Sender<Outcome>;

/// What the actor publishes for the toolbox's handles.
pub(super) struct Outbox {
    /// Which child serves calls.
    pub(super) slot: watch::Sender<Slot>,
    /// How long calls may take (one sender shared by the replicas).
    pub(super) deadlines: Arc<watch::Sender<Arc<Deadlines>>>,
}

/// What the actor is doing.
enum Phase {
    /// Start a child; answer the operator's command, if any, once it serves or failed.
    Start(Option<Reply>),
    /// Wait out a backoff delay, then start.
    Backoff(Duration),
    /// Stopped or failed: wait for an operator, or until the failed cool-down ends.
    Idle(Option<Duration>),
    /// Every handle is gone.
    Exit,
}

/// The child serving calls.
struct Running {
    child: Child,
    events: mpsc::UnboundedReceiver<ChildEvent>,
    serving: Arc<Serving>,
    started: Instant,
}

/// A child that went down, as the restart policy and the failure report need it.
struct Down {
    /// How it ended (`Code(-1)` when it never ran).
    exit: ExitInfo,
    /// How long it had served; a long run resets the backoff.
    uptime: Duration,
    /// What happened, in words, for status and errors.
    text: String,
    /// Its last stderr lines.
    stderr: Vec<String>,
}

impl Down {
    /// A child that could not finish its start: make sure it is gone, say why.
    async fn of_failed_start(failed: LaunchError) -> Down {
        let (exit, stderr) = failed.reap().await;
        let text = match failed.child {
            Some(_) => format!("failed to start ({}; child {exit})", failed.why),
            None => format!("failed to start: {}", failed.why),
        };
        Down {
            exit,
            uptime: Duration::ZERO,
            text,
            stderr,
        }
    }
}

pub(super) struct Actor {
    /// The configuration this actor runs.
    manifest: Manifest,
    /// Where tools and state are published (shared by the toolbox's replicas).
    publisher: Arc<Publisher>,
    /// This replica's index among the toolbox's `instances`.
    index: usize,
    /// Where callers learn which child serves and how long calls may take.
    out: Outbox,
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
    /// Restart history, for backoff and the restart budget.
    budget: Budget,
}

impl Actor {
    pub(super) fn new(
        manifest: Manifest,
        publisher: Arc<Publisher>,
        index: usize,
        out: Outbox,
        commands: mpsc::Receiver<Command>,
        stats: Arc<Stats>,
    ) -> Actor {
        Actor {
            pin: manifest.protocol.clone(),
            manifest,
            publisher,
            index,
            out,
            commands,
            stats,
            last_specs: None,
            last_refresh: None,
            budget: Budget::default(),
        }
    }

    fn id(&self) -> &str {
        &self.manifest.id
    }

    fn publish(&self, state: State, tools: Option<Arc<ToolSet>>) {
        self.publisher.publish(self.index, state, tools);
    }

    fn set_stopped(&self) {
        self.publish(State::Stopped, None);
        let _ = self.out.slot.send(Slot::Stopped);
    }

    pub(super) async fn run(mut self) {
        let mut phase = if self.manifest.enabled {
            Phase::Start(None)
        } else {
            self.set_stopped();
            Phase::Idle(None)
        };
        loop {
            phase = match phase {
                Phase::Start(reply) => self.start(reply).await,
                Phase::Backoff(delay) => self.backoff(delay).await,
                Phase::Idle(retry) => self.idle(retry).await,
                Phase::Exit => return,
            };
        }
    }

    async fn start(&mut self, reply: Option<Reply>) -> Phase {
        match self.launch().await {
            Ok(launched) => {
                let running = self.promote(launched);
                if let Some(reply) = reply {
                    let _ = reply.send(Ok(format!("started, pid {}", running.child.pid())));
                }
                self.serve(running).await
            }
            Err(down) => {
                tracing::error!(toolbox = self.id(), "{}", down.text);
                if let Some(reply) = reply {
                    let _ = reply.send(Err(down.text.clone()));
                }
                self.went_down(down)
            }
        }
    }

    /// Starts a child through the one launcher; remembers the era it speaks
    /// for the next start (or forgets a guess that failed).
    async fn launch(&mut self) -> Result<Launched, Down> {
        match launch::launch(&self.manifest, self.pin.as_deref()).await {
            Ok(launched) => {
                self.pin = Some(launched.session.era().version().to_owned());
                for problem in &launched.left_out {
                    tracing::warn!(
                        toolbox = self.id(),
                        pid = launched.child.pid(),
                        "tool left out: {problem}"
                    );
                }
                self.last_specs = Some(launched.specs.clone());
                Ok(launched)
            }
            Err(failed) => {
                self.pin = self.manifest.protocol.clone();
                Err(Down::of_failed_start(failed).await)
            }
        }
    }

    /// Makes a launched child the serving one: tools and slot are published
    /// together, so callers see the new catalog and the new child at once.
    fn promote(&mut self, launched: Launched) -> Running {
        let pid = launched.child.pid();
        let serving = Arc::new(Serving {
            session: launched.session,
            pid,
            permits: Semaphore::new(self.manifest.limits.max_concurrent_calls),
            since: Instant::now(),
            timeouts_in_a_row: std::sync::atomic::AtomicU32::new(0),
            answers: std::sync::atomic::AtomicU64::new(0),
            max_timeouts_in_a_row: self.manifest.limits.max_timeouts_in_a_row,
            wedged: tokio::sync::Notify::new(),
        });
        tracing::info!(
            toolbox = self.id(),
            pid,
            era = %serving.session.era(),
            tools = launched.tools.len(),
            "toolbox ready"
        );
        self.publish(State::Ready, Some(Arc::new(launched.tools)));
        let _ = self.out.slot.send(Slot::Serving(serving.clone()));
        self.stats.set_era(serving.session.era().to_string());
        Running {
            child: launched.child,
            events: launched.events,
            serving,
            started: Instant::now(),
        }
    }

    /// Serves until the child exits, the toolbox is stopped, or every handle is gone.
    async fn serve(&mut self, mut running: Running) -> Phase {
        let probe_every = Duration::from_secs(self.manifest.limits.probe_interval_s);
        let mut probe =
            tokio::time::interval_at(tokio::time::Instant::now() + probe_every, probe_every);
        let mut missed = 0;
        // Why we killed the child, when we did: said with its exit.
        let mut killed_for: Option<String> = None;
        loop {
            let pid = running.child.pid();
            tokio::select! {
                exit = running.child.exited() => {
                    tracing::warn!(toolbox = self.id(), pid, "child exited ({exit})");
                    let broke = running.serving.session.broken_because();
                    let text = match killed_for.take().or(broke) {
                        Some(why) => format!("exited ({exit}): killed because {why}"),
                        None => format!("exited ({exit})"),
                    };
                    return self.went_down(Down {
                        exit,
                        uptime: running.started.elapsed(),
                        text,
                        stderr: running.child.stderr_tail(),
                    });
                }
                _ = running.serving.wedged.notified() => {
                    let why = format!(
                        "{} calls in a row ran past their deadline",
                        self.manifest.limits.max_timeouts_in_a_row
                    );
                    tracing::error!(toolbox = self.id(), pid, "{why}; killing the child");
                    killed_for = Some(why);
                    running.child.signal_group(nix::sys::signal::Signal::SIGKILL);
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
                        self.set_stopped();
                        let exit = drain_and_stop(running, &self.manifest).await;
                        let _ = done.send(Ok(format!("stopped pid {pid} ({exit})")));
                        return Phase::Idle(None);
                    }
                    Some(Command::Start { done }) => {
                        let _ = done.send(Ok(format!("already running, pid {pid}")));
                    }
                    Some(Command::Restart { done }) => {
                        let outcome = self.roll(&mut running, None).await;
                        missed = 0;
                        let _ = done.send(outcome);
                    }
                    Some(Command::Reconfigure { manifest, done }) if !manifest.enabled => {
                        self.adopt(*manifest);
                        self.set_stopped();
                        let exit = drain_and_stop(running, &self.manifest).await;
                        let _ = done.send(Ok(format!("disabled by its manifest: stopped pid {pid} ({exit})")));
                        return Phase::Idle(None);
                    }
                    Some(Command::Reconfigure { manifest, done }) => {
                        let outcome = self.roll(&mut running, Some(*manifest)).await;
                        missed = 0;
                        let every = Duration::from_secs(self.manifest.limits.probe_interval_s);
                        probe = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
                        let _ = done.send(outcome);
                    }
                    None => {
                        self.set_stopped();
                        drain_and_stop(running, &self.manifest).await;
                        return Phase::Exit;
                    }
                },
                _ = probe.tick() => {
                    let probe_timeout = Duration::from_secs(self.manifest.limits.probe_timeout_s);
                    match tokio::time::timeout(probe_timeout, running.serving.session.probe()).await {
                        // An error answer is still an answer: the child is alive.
                        Ok(Ok(())) | Ok(Err(RpcFailure::Rpc(_))) => missed = 0,
                        _ => {
                            missed += 1;
                            tracing::warn!(toolbox = self.id(), pid, missed, "liveness probe missed");
                            if missed >= MAX_MISSED_PROBES {
                                tracing::error!(toolbox = self.id(), pid, "child stopped answering its liveness probe; killing it");
                                killed_for = Some(format!("it missed {MAX_MISSED_PROBES} liveness probes in a row"));
                                running.child.signal_group(nix::sys::signal::Signal::SIGKILL);
                            }
                        }
                    }
                }
            }
        }
    }

    /// Rolling restart, into `manifest` when given: launch a new child, make
    /// it the serving one, and let the old one drain in the background. On
    /// failure the old child (and configuration) keeps serving.
    async fn roll(&mut self, running: &mut Running, manifest: Option<Manifest>) -> Outcome {
        let old_pid = running.child.pid();
        let previous = manifest.map(|m| {
            let pin = std::mem::replace(&mut self.pin, m.protocol.clone());
            (std::mem::replace(&mut self.manifest, m), pin)
        });
        match self.launch().await {
            Ok(launched) => {
                let old = std::mem::replace(running, self.promote(launched));
                let _ = self.out.deadlines.send(Deadlines::of(&self.manifest));
                self.stats.restarts.fetch_add(1, Ordering::Relaxed);
                let new_pid = running.child.pid();
                // The old child drains under the configuration it ran with.
                let old_manifest = previous
                    .map(|(m, _)| m)
                    .unwrap_or_else(|| self.manifest.clone());
                tokio::spawn(async move { drain_and_stop(old, &old_manifest).await });
                Ok(format!(
                    "restarted: pid {old_pid} -> {new_pid}; pid {old_pid} drains its calls"
                ))
            }
            Err(down) => {
                if let Some((manifest, pin)) = previous {
                    self.manifest = manifest;
                    self.pin = pin;
                }
                tracing::warn!(
                    toolbox = self.id(),
                    pid = old_pid,
                    "rolling restart failed; the old child keeps serving: {}",
                    down.text
                );
                Err(format!(
                    "restart failed, pid {old_pid} keeps serving: {}",
                    down.text
                ))
            }
        }
    }

    /// Takes a changed manifest while no child runs under it.
    fn adopt(&mut self, manifest: Manifest) {
        self.pin = manifest.protocol.clone();
        let _ = self.out.deadlines.send(Deadlines::of(&manifest));
        self.manifest = manifest;
        self.budget.reset();
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
            Ok((specs, mut problems)) => {
                let (tools, rejected) = ToolSet::compile(&self.manifest.id, specs.clone());
                problems.extend(rejected);
                for problem in problems {
                    tracing::warn!(toolbox = self.id(), "tool left out: {problem}");
                }
                self.last_specs = Some(specs);
                let tools = Arc::new(tools);
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

    /// Applies the restart policy to a child that went down.
    fn went_down(&mut self, down: Down) -> Phase {
        self.stats.set_last_exit(down.text.clone());
        let knobs = &self.manifest.restart;
        match self.budget.after_exit(knobs, down.exit, down.uptime) {
            Decision::RestartAfter(delay) => {
                tracing::info!(
                    toolbox = self.id(),
                    delay_ms = delay.as_millis() as u64,
                    "restarting after the child {}",
                    down.text
                );
                self.stats.restarts.fetch_add(1, Ordering::Relaxed);
                self.publish(
                    State::Restarting {
                        last_exit: down.text,
                    },
                    None,
                );
                let _ = self.out.slot.send(Slot::Waiting);
                Phase::Backoff(delay)
            }
            Decision::Failed => {
                let reason = format!(
                    "the child {}; more than {} restarts within {} s; next try in {} s \
                     (or toolboxd ctl start {})",
                    down.text,
                    knobs.max_restarts,
                    knobs.window_s,
                    knobs.failed_retry_s,
                    self.id()
                );
                let retry = Duration::from_secs(knobs.failed_retry_s);
                self.fail(reason, &down.stderr);
                Phase::Idle(Some(retry))
            }
            Decision::StayDown => {
                let reason = format!(
                    "the child {}; restart policy {:?} does not restart it",
                    down.text, knobs.policy
                );
                self.fail(reason, &down.stderr);
                Phase::Idle(None)
            }
        }
    }

    fn fail(&self, reason: String, stderr: &[String]) {
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
        let _ = self.out.slot.send(Slot::Failed(reason));
    }

    /// Waits out a restart delay; an operator's start or restart skips it.
    async fn backoff(&mut self, delay: Duration) -> Phase {
        let sleep = tokio::time::sleep(delay);
        tokio::pin!(sleep);
        loop {
            tokio::select! {
                _ = &mut sleep => return Phase::Start(None),
                command = self.commands.recv() => match command {
                    Some(Command::Refresh { done, .. }) => { let _ = done.send(()); }
                    Some(Command::Stop { done }) => {
                        self.set_stopped();
                        let _ = done.send(Ok("stopped (it was waiting to restart)".to_owned()));
                        return Phase::Idle(None);
                    }
                    Some(Command::Start { done }) | Some(Command::Restart { done }) => {
                        return Phase::Start(Some(done));
                    }
                    Some(Command::Reconfigure { manifest, done }) => {
                        self.adopt(*manifest);
                        if !self.manifest.enabled {
                            self.set_stopped();
                            let _ = done.send(Ok("disabled by its manifest: stopped".to_owned()));
                            return Phase::Idle(None);
                        }
                        return Phase::Start(Some(done));
                    }
                    None => return Phase::Exit,
                },
            }
        }
    }

    /// Stopped or failed: waits for an operator's start, or for `retry` to pass.
    async fn idle(&mut self, retry: Option<Duration>) -> Phase {
        let far = Duration::from_secs(60 * 60 * 24 * 365);
        let sleep = tokio::time::sleep(retry.unwrap_or(far));
        tokio::pin!(sleep);
        let mut retrying = retry.is_some();
        loop {
            tokio::select! {
                _ = &mut sleep, if retrying => {
                    tracing::info!(toolbox = self.id(), "failed cool-down over; starting again");
                    self.budget.reset();
                    return Phase::Start(None);
                }
                command = self.commands.recv() => match command {
                    Some(Command::Refresh { done, .. }) => { let _ = done.send(()); }
                    Some(Command::Stop { done }) => {
                        self.set_stopped();
                        retrying = false;
                        let _ = done.send(Ok("stopped".to_owned()));
                    }
                    Some(Command::Start { done }) | Some(Command::Restart { done }) => {
                        self.budget.reset();
                        self.publish(State::Starting, None);
                        let _ = self.out.slot.send(Slot::Waiting);
                        return Phase::Start(Some(done));
                    }
                    Some(Command::Reconfigure { manifest, done }) => {
                        self.adopt(*manifest);
                        if !self.manifest.enabled {
                            self.set_stopped();
                            retrying = false;
                            let _ = done.send(Ok("disabled by its manifest: stopped".to_owned()));
                            continue;
                        }
                        self.publish(State::Starting, None);
                        let _ = self.out.slot.send(Slot::Waiting);
                        return Phase::Start(Some(done));
                    }
                    None => return Phase::Exit,
                },
            }
        }
    }
}

/// Lets a child that no longer receives new calls finish the ones it has
/// (within `drain_timeout_s`), then stops it. Returns how it exited.
async fn drain_and_stop(running: Running, manifest: &Manifest) -> ExitInfo {
    // Callers still queued for a permit look for the serving child again.
    running.serving.permits.close();
    let deadline = Instant::now() + Duration::from_secs(manifest.limits.drain_timeout_s);
    let rpc = running.serving.session.rpc();
    while rpc.in_flight() > 0 && Instant::now() < deadline {
        tokio::select! {
            _ = running.child.exited() => break,
            _ = tokio::time::sleep(Duration::from_millis(5)) => {}
        }
    }
    let exit = running.child.stop(STOP_GRACE).await;
    tracing::info!(
        toolbox = %manifest.id,
        pid = running.child.pid(),
        "child stopped ({exit})"
    );
    exit
}
