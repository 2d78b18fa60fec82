//! The toolbox actor: where a child is started, probed, restarted after a
//! crash (under [`super::restart`]), swapped in a rolling restart, and stopped.
//!
//! The actor is one loop: it waits for the next [`Event`] (a command, the
//! child's exit or news, a probe tick, a timer) and acts on it according to
//! its [`Mode`]. Its mailbox is read in every mode, so an operator's command
//! or a refresh never waits behind a backoff.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, oneshot, watch, Semaphore};

use super::replicas::Publisher;
use super::restart::{Budget, Decision};
use super::running::{drain_and_stop, Down, Running};
use super::{CallLimits, Command, CommandResult, RestartReason, Serving, Slot, Stats};
use crate::launch::{self, Launched};
use crate::manifest::Manifest;
use crate::mcp;
use crate::process::child::{ChildEvent, ExitInfo};
use crate::tool::ToolSet;
use crate::util::or_never::or_never;

mod liveness;
mod mode;
mod on_demand;
mod turns;

use mode::{Event, Mode, View};

/// How soon a child that could not be spawned for want of descriptors,
/// processes or memory is tried again.
const SHORTAGE_RETRY: Duration = Duration::from_secs(1);
/// Least time between two tool-list refreshes a child asks for: a child that
/// says `list_changed` without end (even while it is being listed) costs one
/// listing a second, not a core.
const REFRESH_GAP: Duration = Duration::from_secs(1);
/// Least time between two looks at whether a child is idle.
const IDLE_GRACE: Duration = Duration::from_millis(100);

type Reply = oneshot::Sender<CommandResult>;

/// What the actor publishes for the toolbox's handles.
pub(super) struct Outbox {
    /// Which child serves calls (set only by [`Actor::show`]).
    pub(super) slot: watch::Sender<Slot>,
    /// Call deadlines and bounds (one sender shared by the replicas).
    pub(super) limits: Arc<watch::Sender<Arc<CallLimits>>>,
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
    /// Rung by a caller (or a prewarm topic) that finds the toolbox idle.
    wake: Arc<tokio::sync::Notify>,
    /// Counters shared with handles.
    stats: Arc<Stats>,
    /// The protocol version to use without probing: the manifest's pin, or what
    /// the last probe found (the era of a server does not change across restarts).
    pin: Option<String>,
    /// The last tool list, serialized ([`mcp::tools_fingerprint`]), to skip
    /// rebuilding the catalog when nothing changed (as text: a tenth of the
    /// memory of the listing itself).
    last_specs: Option<String>,
    /// When the last refresh started, to answer queued refreshes at once.
    last_refresh: Option<Instant>,
    /// Restart history, for backoff and the restart budget.
    budget: Budget,
    /// A lazy toolbox with no cached catalog, waiting for its turn to start
    /// once and list its tools ([`on_demand`]); any start ends the wait.
    awaiting_listing: bool,
}

impl Actor {
    pub(super) fn new(
        manifest: Manifest,
        publisher: Arc<Publisher>,
        index: usize,
        out: Outbox,
        commands: mpsc::Receiver<Command>,
        wake: Arc<tokio::sync::Notify>,
        stats: Arc<Stats>,
    ) -> Actor {
        Actor {
            // The era found at an earlier start, kept on disk, when the
            // manifest pins none.
            pin: manifest
                .protocol
                .clone()
                .or_else(|| crate::catalog_cache::load_era(&manifest)),
            manifest,
            publisher,
            index,
            out,
            commands,
            wake,
            stats,
            last_specs: None,
            last_refresh: None,
            budget: Budget::default(),
            awaiting_listing: false,
        }
    }

    fn id(&self) -> &str {
        &self.manifest.id
    }

    /// Publishes `view` to status (the state, with `tools` when they changed)
    /// and to callers (the slot): the one place both are set.
    fn show(&self, view: View<'_>, tools: Option<Arc<ToolSet>>) {
        let (state, slot) = view.published();
        self.publisher.publish(self.index, state, tools);
        let _ = self.out.slot.send(slot);
    }

    /// Enters `Stopped`.
    fn stopped(&self) -> Mode {
        self.show(View::Stopped, None);
        Mode::Stopped
    }

    /// The actor's one loop: wait for the next event, act on it, repeat
    /// until every handle is gone.
    ///
    /// Each step is boxed while it runs, and a serving child's wait too
    /// ([`Self::next_event`]): between events, an actor (one per toolbox,
    /// most of them idle) holds only its state and a small wait, not room
    /// for the largest step it could take.
    pub(super) async fn run(mut self) {
        let mut mode = if self.manifest.enabled {
            Box::pin(self.begin(None)).await
        } else {
            self.stopped()
        };
        loop {
            let event = self.next_event(&mut mode).await;
            let Some(next) = Box::pin(self.on_event(mode, event)).await else {
                return;
            };
            mode = next;
        }
    }

    /// Acts on `event` in `mode`; the mode after it, or `None` once every
    /// handle is gone (the child then is stopped).
    async fn on_event(&mut self, mut mode: Mode, event: Event) -> Option<Mode> {
        Some(match event {
            Event::Command(Some(command)) => self.on_command(mode, command).await,
            Event::Command(None) => {
                if let Mode::Serving(running) = mode {
                    self.show(View::Stopped, None);
                    drain_and_stop(running, &self.manifest).await;
                }
                return None;
            }
            Event::Exited(exit) => match mode {
                Mode::Serving(running) => self.exited(running, exit),
                other => other,
            },
            Event::Wedged => {
                if let Mode::Serving(running) = &mut mode {
                    self.wedged(running);
                }
                mode
            }
            Event::Child(ChildEvent::ToolsChanged) => {
                if let Mode::Serving(running) = &mut mode {
                    self.tools_changed(running).await;
                }
                mode
            }
            Event::RefreshDue => {
                if let Mode::Serving(running) = &mut mode {
                    running.refresh_due = None;
                    self.refresh(running, None).await;
                }
                mode
            }
            Event::Probe => {
                if let Mode::Serving(running) = &mut mode {
                    self.probe(running).await;
                }
                mode
            }
            Event::Timer => match mode {
                Mode::Failed { .. } => {
                    tracing::info!(toolbox = self.id(), "failed cool-down over; starting again");
                    self.budget.reset();
                    self.show(View::Starting, None);
                    self.start_again().await
                }
                _ => self.start_again().await,
            },
            Event::Wake => match mode {
                Mode::Idle => {
                    tracing::info!(toolbox = self.id(), "starting a child for an idle toolbox");
                    self.show(View::Waking, None);
                    self.start(None).await
                }
                other => other,
            },
            Event::ListingTurn(turn) => self.list_once(None, turn.ok()).await,
            Event::IdleCheck => match mode {
                Mode::Serving(running) => self.idle_check(running).await,
                other => other,
            },
        })
    }

    /// Waits for what the actor must act on next in `mode`. A serving
    /// child's many sources wait in a box of their own: the rest of the
    /// time (most toolboxes idle, most of it) the wait is small.
    async fn next_event(&mut self, mode: &mut Mode) -> Event {
        let timer = match mode {
            Mode::Serving(running) => {
                return Box::pin(Self::next_serving_event(&mut self.commands, running)).await
            }
            Mode::Backoff { until, .. } => Some(*until),
            Mode::Failed { retry, .. } => *retry,
            Mode::Stopped | Mode::Idle => None,
        };
        let wake = matches!(mode, Mode::Idle).then(|| self.wake.notified());
        let turn = self.listing_turn(mode);
        tokio::select! {
            _ = or_never(timer.map(tokio::time::sleep_until)) => Event::Timer,
            _ = or_never(wake) => Event::Wake,
            turn = or_never(turn) => Event::ListingTurn(turn),
            command = self.commands.recv() => Event::Command(command),
        }
    }

    /// [`Self::next_event`] while a child serves.
    async fn next_serving_event(
        commands: &mut mpsc::Receiver<Command>,
        running: &mut Running,
    ) -> Event {
        let idle_check = match running.idle_stop {
            Some(limit) => {
                let serving = running.serving.clone();
                // Not sooner than IDLE_GRACE from when it is armed: a call on
                // its way to a slot keeps the child, and is looked at again
                // then, not in a loop.
                let due = *running.idle_due.get_or_insert_with(|| {
                    let due = (serving.last_active() + limit).max(Instant::now() + IDLE_GRACE);
                    tokio::time::Instant::from_std(due)
                });
                Some(async move {
                    // Registered before `busy` is read, so a slot given back
                    // in between still wakes it.
                    let settled = serving.settled.notified();
                    if serving.busy() {
                        settled.await;
                    } else {
                        tokio::time::sleep_until(due).await;
                    }
                })
            }
            None => None,
        };
        let refresh_due = running.refresh_due;
        tokio::select! {
            exit = running.child.exited() => Event::Exited(exit),
            _ = running.serving.wedged.notified() => Event::Wedged,
            Some(event) = running.events.recv() => Event::Child(event),
            _ = running.probe.tick() => Event::Probe,
            _ = or_never(refresh_due.map(tokio::time::sleep_until)) => Event::RefreshDue,
            _ = or_never(idle_check) => Event::IdleCheck,
            command = commands.recv() => Event::Command(command),
        }
    }

    /// Carries out an operator's (or the registry's) command in `mode`.
    async fn on_command(&mut self, mode: Mode, command: Command) -> Mode {
        match (command, mode) {
            (
                Command::Refresh {
                    requested,
                    at_reload,
                    done,
                },
                mode,
            ) => {
                match &mode {
                    Mode::Serving(running) => self.refresh(running, Some(requested)).await,
                    Mode::Idle if at_reload => self.recheck_cache(),
                    _ => {}
                }
                let _ = done.send(());
                mode
            }
            (Command::Stop { done }, mode) => {
                let text = match mode {
                    Mode::Serving(running) => {
                        let pid = running.child.pid();
                        self.show(View::Stopped, None);
                        let exit = drain_and_stop(running, &self.manifest).await;
                        format!("stopped pid {pid} ({exit})")
                    }
                    Mode::Backoff { .. } => {
                        self.show(View::Stopped, None);
                        "stopped (it was waiting to restart)".to_owned()
                    }
                    Mode::Failed { .. } | Mode::Stopped | Mode::Idle => {
                        self.show(View::Stopped, None);
                        "stopped".to_owned()
                    }
                };
                let _ = done.send(Ok(text));
                Mode::Stopped
            }
            (Command::Start { done }, Mode::Serving(running)) => {
                let _ = done.send(Ok(format!("already running, pid {}", running.child.pid())));
                Mode::Serving(running)
            }
            (Command::Restart { done }, Mode::Serving(mut running)) => {
                let outcome = self.roll(&mut running, None).await;
                let _ = done.send(outcome);
                Mode::Serving(running)
            }
            (Command::Start { done } | Command::Restart { done }, mode) => {
                self.start_now(mode, done).await
            }
            (Command::Reconfigure { manifest, done }, mode) if !manifest.enabled => {
                self.adopt(*manifest);
                let text = match mode {
                    Mode::Serving(running) => {
                        let pid = running.child.pid();
                        self.show(View::Stopped, None);
                        let exit = drain_and_stop(running, &self.manifest).await;
                        format!("disabled by its manifest: stopped pid {pid} ({exit})")
                    }
                    _ => {
                        self.show(View::Stopped, None);
                        "disabled by its manifest: stopped".to_owned()
                    }
                };
                let _ = done.send(Ok(text));
                Mode::Stopped
            }
            (Command::Reconfigure { manifest, done }, Mode::Serving(mut running)) => {
                let outcome = self.roll(&mut running, Some(*manifest)).await;
                let _ = done.send(outcome);
                Mode::Serving(running)
            }
            (Command::Reconfigure { manifest, done }, Mode::Idle) => {
                self.adopt(*manifest);
                self.begin(Some(done)).await
            }
            (Command::Reconfigure { manifest, done }, mode) => {
                self.adopt(*manifest);
                self.start_now(mode, done).await
            }
        }
    }

    /// Starts a child at an operator's request, skipping a backoff; from
    /// stopped or failed the restart budget starts afresh.
    async fn start_now(&mut self, mode: Mode, done: Reply) -> Mode {
        match mode {
            Mode::Backoff { .. } => {}
            Mode::Idle => self.show(View::Waking, None),
            _ => {
                self.budget.reset();
                self.show(View::Starting, None);
            }
        }
        self.start(Some(done)).await
    }

    /// Starts a child; answers the operator's command, if any, once it serves
    /// or failed.
    async fn start(&mut self, reply: Option<Reply>) -> Mode {
        self.awaiting_listing = false;
        let began = Instant::now();
        match self.launch().await {
            Ok(launched) => {
                self.stats.set_cold_start(began.elapsed());
                let running = self.promote(launched);
                if let Some(reply) = reply {
                    let _ = reply.send(Ok(format!("started, pid {}", running.child.pid())));
                }
                Mode::Serving(running)
            }
            Err(down) => {
                tracing::error!(toolbox = self.id(), "{}", down.text);
                if let Some(reply) = reply {
                    let _ = reply.send(Err(down.report()));
                }
                self.went_down(down)
            }
        }
    }

    /// Starts a child through the one launcher; remembers the era it speaks
    /// for the next start (or forgets a guess that failed).
    async fn launch(&mut self) -> Result<Launched, Down> {
        // Never Err: the semaphore is never closed.
        let _turn = turns::START_TURNS.acquire().await.ok();
        match launch::launch(&self.manifest, self.pin.as_deref(), &self.stats.stderr).await {
            Ok(launched) => {
                let version = launched.session.era().version().to_owned();
                if self.manifest.protocol.is_none() && self.pin.as_deref() != Some(&version) {
                    crate::catalog_cache::store_era(&self.manifest, &version);
                }
                self.pin = Some(version);
                for problem in &launched.left_out {
                    tracing::warn!(
                        toolbox = self.id(),
                        pid = launched.child.pid(),
                        "tool left out: {problem}"
                    );
                }
                self.last_specs = Some(mcp::tools_fingerprint(&launched.specs));
                if self.manifest.start.on_demand() {
                    let version = launched.session.era().version();
                    crate::catalog_cache::store(&self.manifest, version, &launched.specs);
                }
                Ok(launched)
            }
            Err(failed) => {
                if self.manifest.protocol.is_none() && self.pin.is_some() {
                    // The era guessed did not hold: the next start probes.
                    crate::catalog_cache::forget_era(&self.manifest);
                }
                self.pin = self.manifest.protocol.clone();
                Err(Down::of_failed_start(failed).await)
            }
        }
    }

    /// Makes a launched child the serving one: tools and slot are published
    /// together, so callers see the new catalog and the new child at once.
    fn promote(&mut self, launched: Launched) -> Running {
        let pid = launched.child.pid();
        let limits = &self.manifest.limits;
        let serving = Arc::new(Serving {
            session: launched.session,
            pid,
            permits: Semaphore::new(limits.max_concurrent_calls),
            max_calls: limits.max_concurrent_calls,
            settled: tokio::sync::Notify::new(),
            since: Instant::now(),
            timeouts_in_a_row: std::sync::atomic::AtomicU32::new(0),
            answers: std::sync::atomic::AtomicU64::new(0),
            max_timeouts_in_a_row: limits.max_timeouts_in_a_row,
            wedged: tokio::sync::Notify::new(),
            last_active: std::sync::atomic::AtomicU64::new(0),
        });
        let every = Duration::from_secs(limits.probe_interval_s);
        tracing::info!(
            toolbox = self.id(),
            pid,
            era = %serving.session.era(),
            tools = launched.tools.len(),
            sandbox = %launched.child.sandbox_summary(),
            "toolbox ready"
        );
        self.stats.set_serving(
            serving.session.era().to_string(),
            launched.child.sandbox_mechanisms(),
        );
        self.show(View::Serving(&serving), Some(Arc::new(launched.tools)));
        Running {
            child: launched.child,
            events: launched.events,
            serving,
            started: Instant::now(),
            probe: tokio::time::interval_at(tokio::time::Instant::now() + every, every),
            missed: 0,
            killed_for: None,
            refresh_due: None,
            idle_stop: (self.manifest.start.idle_stop_s > 0)
                .then(|| Duration::from_secs(self.manifest.start.idle_stop_s)),
            idle_due: None,
            listing_turn: None,
        }
    }

    /// Rolling restart, into `manifest` when given: launch a new child, make
    /// it the serving one, and let the old one drain in the background. On
    /// failure the old child (and configuration) keeps serving.
    async fn roll(&mut self, running: &mut Running, manifest: Option<Manifest>) -> CommandResult {
        let old_pid = running.child.pid();
        let reason = match manifest {
            Some(_) => RestartReason::Reload,
            None => RestartReason::Operator,
        };
        let previous = manifest.map(|m| {
            let pin = std::mem::replace(&mut self.pin, m.protocol.clone());
            (std::mem::replace(&mut self.manifest, m), pin)
        });
        match self.launch().await {
            Ok(launched) => {
                let old = std::mem::replace(running, self.promote(launched));
                let _ = self.out.limits.send(CallLimits::of(&self.manifest));
                self.stats.restarted(reason);
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
                    down.report()
                ))
            }
        }
    }

    /// Takes a changed manifest while no child runs under it.
    fn adopt(&mut self, manifest: Manifest) {
        self.pin = manifest.protocol.clone();
        let _ = self.out.limits.send(CallLimits::of(&manifest));
        self.manifest = manifest;
        self.budget.reset();
    }

    /// The child said its tools changed: list them now, or at most once a
    /// [`REFRESH_GAP`] (news queued meanwhile is one refresh).
    async fn tools_changed(&mut self, running: &mut Running) {
        while running.events.try_recv().is_ok() {}
        let now = Instant::now();
        match self.last_refresh {
            Some(last) if now < last + REFRESH_GAP => {
                let due = tokio::time::Instant::from_std(last + REFRESH_GAP);
                running.refresh_due.get_or_insert(due);
            }
            _ => self.refresh(running, None).await,
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
        let max_bytes = self.manifest.limits.max_message_bytes;
        match running.serving.session.list_tools(limit, max_bytes).await {
            Ok((mut specs, mut problems)) => {
                self.manifest.annotations.apply(&mut specs);
                let fingerprint = mcp::tools_fingerprint(&specs);
                if self.last_specs.as_ref() == Some(&fingerprint) {
                    return;
                }
                let (tools, rejected) = ToolSet::compile(&self.manifest.id, specs.clone());
                if let Err(why) = tools.fits_on_the_bus() {
                    tracing::error!(
                        toolbox = self.id(),
                        "tool list not taken, the last one stays: {why}"
                    );
                    return;
                }
                problems.extend(rejected);
                for problem in problems {
                    tracing::warn!(toolbox = self.id(), "tool left out: {problem}");
                }
                if self.manifest.start.on_demand() {
                    let version = running.serving.session.era().version();
                    crate::catalog_cache::store(&self.manifest, version, &specs);
                }
                self.last_specs = Some(fingerprint);
                let tools = Arc::new(tools);
                tracing::info!(
                    toolbox = self.id(),
                    tools = tools.len(),
                    "tool list changed"
                );
                self.show(View::Serving(&running.serving), Some(tools));
            }
            Err(e) => tracing::warn!(toolbox = self.id(), "tool refresh failed: {e}"),
        }
    }

    /// The serving child exited: say how, then apply the restart policy.
    fn exited(&mut self, running: Running, exit: ExitInfo) -> Mode {
        let pid = running.child.pid();
        tracing::warn!(toolbox = self.id(), pid, "child exited ({exit})");
        let broke = running.serving.session.broken_because();
        let (text, reason) = match running.killed_for.or(broke) {
            Some(why) => (
                format!("exited ({exit}): killed because {why}"),
                RestartReason::Killed,
            ),
            None => (format!("exited ({exit})"), RestartReason::Exited),
        };
        self.went_down(Down {
            exit,
            uptime: running.started.elapsed(),
            text,
            stderr: running.child.stderr_tail(),
            short_of_resources: false,
            reason,
        })
    }

    /// Applies the restart policy to a child that went down.
    fn went_down(&mut self, down: Down) -> Mode {
        self.stats.set_last_exit(down.text.clone());
        if down.short_of_resources {
            tracing::warn!(
                toolbox = self.id(),
                "the child {}; trying again in {} s without charging the restart budget",
                down.text,
                SHORTAGE_RETRY.as_secs()
            );
            let mode = Mode::Backoff {
                until: tokio::time::Instant::now() + SHORTAGE_RETRY,
                last_exit: down.text,
            };
            self.show(mode.view(), None);
            return mode;
        }
        let knobs = &self.manifest.restart;
        let (mode, stderr) = match self.budget.after_exit(knobs, down.exit, down.uptime) {
            Decision::RestartAfter(delay) => {
                tracing::info!(
                    toolbox = self.id(),
                    delay_ms = delay.as_millis() as u64,
                    "restarting after the child {}",
                    down.text
                );
                self.stats.restarted(down.reason);
                let mode = Mode::Backoff {
                    until: tokio::time::Instant::now() + delay,
                    last_exit: down.text,
                };
                self.show(mode.view(), None);
                return mode;
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
                let retry = Some(tokio::time::Instant::now() + retry);
                (Mode::Failed { reason, retry }, down.stderr)
            }
            Decision::StayDown => {
                let reason = format!(
                    "the child {}; restart policy {:?} does not restart it",
                    down.text, knobs.policy
                );
                (
                    Mode::Failed {
                        reason,
                        retry: None,
                    },
                    down.stderr,
                )
            }
        };
        if let Mode::Failed { reason, .. } = &mode {
            tracing::error!(
                toolbox = self.id(),
                stderr_tail = %stderr.join("\n"),
                "failed: {reason}"
            );
        }
        self.show(mode.view(), None);
        mode
    }
}
