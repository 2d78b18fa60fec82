//! `toolboxd run`: wires the bus, the supervisor and the service together and
//! handles signals.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::{mpsc, watch};

use crate::bus::{self, client, server};
use crate::control;
use crate::notify::Notifier;
use crate::registry::Registry;
use crate::service::Service;
use crate::shutdown::ShutdownTrigger;
use crate::supervisor::{ReloadReport, Supervisor};

/// Which bus the daemon uses.
#[derive(Debug, Clone)]
pub enum BusMode {
    /// Connect to the default address; serve an embedded bus there if nothing listens.
    Auto,
    /// Connect to this URL, retrying; never embed.
    Connect(String),
    /// Serve an embedded bus on this address and use it.
    Embedded(SocketAddr),
}

/// Options of `toolboxd run`.
#[derive(Debug, Clone)]
pub struct RunOptions {
    /// Directories of `*.toml` manifests.
    pub manifests: Vec<PathBuf>,
    /// The bus to use.
    pub bus: BusMode,
    /// Where the control socket is created.
    pub control: PathBuf,
    /// Answer only the persona topics, leaving `ovos.tools.*` to another daemon.
    pub host_only: bool,
    /// How long to listen for other hosts' toolbox ids at start and reload
    /// (zero: do not ask).
    pub peer_probe: std::time::Duration,
    /// Let web pages of any origin use the embedded bus (default: loopback
    /// origins only).
    pub bus_any_origin: bool,
}

/// Why the daemon could not run.
#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    #[error("cannot serve the embedded bus on {addr}: {source}; pick another address or stop what uses it")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error(transparent)]
    Bus(#[from] client::BusError),
    #[error(transparent)]
    Control(#[from] control::ControlError),
    #[error("cannot install signal handlers: {0}")]
    Signals(std::io::Error),
}

/// Starts an embedded bus on `addr`; returns its URL.
async fn embed(
    addr: SocketAddr,
    shutdown: crate::shutdown::Shutdown,
    any_origin: bool,
) -> Result<String, DaemonError> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|source| DaemonError::Bind { addr, source })?;
    let local = listener.local_addr().unwrap_or(addr);
    tokio::spawn(server::serve(listener, shutdown, any_origin));
    tracing::info!(addr = %local, "embedded bus listening");
    Ok(format!("ws://{local}{}", server::ROUTE))
}

/// Runs the daemon until SIGTERM or SIGINT.
pub async fn run(options: RunOptions) -> Result<(), DaemonError> {
    let (trigger, shutdown) = ShutdownTrigger::new();
    // First, so that a second daemon on the same socket refuses before it
    // starts anything.
    let control_listener = control::bind(&options.control).await?;
    let mut terminate = signal(SignalKind::terminate()).map_err(DaemonError::Signals)?;
    let mut interrupt = signal(SignalKind::interrupt()).map_err(DaemonError::Signals)?;
    let mut hangup = signal(SignalKind::hangup()).map_err(DaemonError::Signals)?;

    let (url, first) = match options.bus {
        BusMode::Embedded(addr) => (
            embed(addr, shutdown.clone(), options.bus_any_origin).await?,
            None,
        ),
        BusMode::Connect(url) => (url, None),
        BusMode::Auto => {
            let settings = bus::config::lookup();
            for warning in &settings.warnings {
                tracing::warn!("{warning}");
            }
            let url = settings.url;
            if !settings.sources.is_empty() {
                let files: Vec<String> = settings
                    .sources
                    .iter()
                    .map(|p| p.display().to_string())
                    .collect();
                tracing::info!(bus = %url, "bus address from {}", files.join(", "));
            }
            match client::connect(&url).await {
                Ok(ws) => (url, Some(ws)),
                Err(e) if e.is_refused() => {
                    tracing::info!(
                        "no messagebus at {url}; serving an embedded bus there (for a machine \
                         where toolboxd is the only bus user)"
                    );
                    let addr = client::socket_addr(&url).await?;
                    (
                        embed(addr, shutdown.clone(), options.bus_any_origin).await?,
                        None,
                    )
                }
                Err(e) => return Err(e.into()),
            }
        }
    };

    let registry = Arc::new(Registry::default());
    let (mut supervisor, errors) = Supervisor::start(options.manifests, registry.clone());
    for e in &errors {
        tracing::error!("{e}");
    }
    let (out_tx, out_rx) = mpsc::unbounded_channel();
    let (reload_tx, mut reload_rx) = mpsc::channel(8);
    let service = Service::new(registry.clone(), out_tx, reload_tx, !options.host_only);
    let peer_probe = options.peer_probe;
    let (connected_tx, mut connected) = watch::channel(false);
    let bus_task = tokio::spawn(client::run(
        url.clone(),
        first,
        out_rx,
        {
            let service = service.clone();
            move |frame| service.dispatch(frame)
        },
        connected_tx,
        shutdown.clone(),
    ));

    let (control_tx, mut control_rx) = mpsc::channel(8);
    tokio::spawn(control::serve(
        control_listener,
        options.control.clone(),
        control_tx,
        shutdown.clone(),
    ));
    tracing::info!(path = %options.control.display(), "control socket listening");

    // Start-up (the bus may be slow to come, with --bus) can be cut short by
    // the same signals as the running daemon.
    let started = tokio::select! {
        _ = async {
            let _ = connected.wait_for(|up| *up).await;
            let taken = peers(&service, peer_probe).await;
            supervisor.admit(&taken).await;
            tracing::info!("taking calls; waiting for the toolboxes to finish starting");
            supervisor.wait_started().await;
        } => true,
        _ = terminate.recv() => false,
        _ = interrupt.recv() => false,
    };
    if !started {
        tracing::info!("stopped before start-up finished");
        supervisor.shutdown().await;
        trigger.trigger();
        let _ = bus_task.await;
        return Ok(());
    }
    let catalog = registry.snapshot();
    tracing::info!(
        bus = %url,
        toolboxes = catalog.toolboxes().count(),
        tools = catalog.listed_tool_count(),
        "ready"
    );

    let notifier = Arc::new(Notifier::from_env());
    notifier.send(&format!(
        "READY=1\nSTATUS=serving {} toolboxes",
        catalog.toolboxes().count()
    ));
    // The supervisor gets a task of its own: this loop, which serves signals
    // and pings the watchdog, never waits on a toolbox or a reload.
    let (reloads, reload_requests) = mpsc::unbounded_channel();
    let supervising = tokio::spawn(supervise(
        supervisor,
        reload_requests,
        service.clone(),
        peer_probe,
        notifier.clone(),
    ));
    // The watchdog is pinged from this loop, so a stuck loop stops the pings.
    let mut watchdog = notifier.watchdog_interval().map(tokio::time::interval);
    loop {
        tokio::select! {
            _ = terminate.recv() => break,
            _ = interrupt.recv() => break,
            _ = hangup.recv() => {
                tracing::info!("SIGHUP: reloading manifests");
                let (reply, _) = tokio::sync::oneshot::channel();
                let _ = reloads.send(reply);
            }
            Some(reply) = reload_rx.recv() => {
                let _ = reloads.send(reply);
            }
            Some(request) = control_rx.recv() => {
                let reply = request.reply;
                let registry = registry.clone();
                // Only a reload task holds the reload queue, and only until it
                // has queued its request: shutdown waits for no other task.
                let reloads = matches!(request.method, control::Method::Reload)
                    .then(|| reloads.clone());
                // Each operator request runs as a task and answers when done.
                tokio::spawn(async move {
                    let answer = match request.method {
                        control::Method::Reload => {
                            let (tx, rx) = tokio::sync::oneshot::channel();
                            if let Some(reloads) = reloads {
                                let _ = reloads.send(tx);
                            }
                            rx.await
                                .map(|report| reload_json(&report))
                                .map_err(|_| "the daemon is shutting down".to_owned())
                        }
                        control::Method::Status => Ok(control::status(&registry.snapshot())),
                        control::Method::Restart(id) => operate(&registry, &id, Action::Restart).await,
                        control::Method::Stop(id) => operate(&registry, &id, Action::Stop).await,
                        control::Method::Start(id) => operate(&registry, &id, Action::Start).await,
                    };
                    let _ = reply.send(answer);
                });
            }
            _ = async { watchdog.as_mut()?.tick().await; Some(()) }, if watchdog.is_some() => {
                notifier.send("WATCHDOG=1");
            }
        }
    }
    notifier.send("STOPPING=1");
    tracing::info!("shutting down: draining calls and stopping toolboxes");
    drop(reloads);
    if let Ok(supervisor) = supervising.await {
        supervisor.shutdown().await;
    }
    trigger.trigger();
    let _ = bus_task.await;
    tracing::info!("stopped");
    Ok(())
}

/// Owns the supervisor while the daemon serves: runs reloads one at a time,
/// and answers every request that arrived during a reload with the next one
/// (so a burst of reloads costs one or two). Returns the supervisor when the
/// requests end (shutdown).
async fn supervise(
    mut supervisor: Supervisor,
    mut requests: mpsc::UnboundedReceiver<tokio::sync::oneshot::Sender<ReloadReport>>,
    service: Arc<Service>,
    peer_probe: std::time::Duration,
    notifier: Arc<Notifier>,
) -> Supervisor {
    while let Some(first) = requests.recv().await {
        let mut waiting = vec![first];
        while let Ok(more) = requests.try_recv() {
            waiting.push(more);
        }
        if waiting.len() > 1 {
            tracing::info!(
                requests = waiting.len(),
                "reload requests coalesced into one"
            );
        }
        let report = reload(&mut supervisor, &service, peer_probe, &notifier).await;
        for reply in waiting {
            let _ = reply.send(report.clone());
        }
    }
    supervisor
}

/// What an operator can do to one toolbox.
enum Action {
    Restart,
    Stop,
    Start,
}

/// Carries out an operator's action on toolbox `id`.
async fn operate(
    registry: &Registry,
    id: &str,
    action: Action,
) -> Result<serde_json::Value, String> {
    let handle = registry
        .snapshot()
        .toolbox(id)
        .map(|entry| entry.handle.clone())
        .ok_or_else(|| format!("no toolbox {id:?} is hosted here; see toolboxd ctl status"))?;
    let outcome = match action {
        Action::Restart => handle.restart().await,
        Action::Stop => handle.stop().await,
        Action::Start => handle.start().await,
    };
    outcome.map(serde_json::Value::String)
}

/// Toolbox ids other hosts on the bus answer for.
async fn peers(service: &Service, window: std::time::Duration) -> BTreeSet<String> {
    if window.is_zero() {
        return BTreeSet::new();
    }
    service.probe_peers(window).await
}

/// A reload, announced to systemd around it.
async fn reload(
    supervisor: &mut Supervisor,
    service: &Service,
    window: std::time::Duration,
    notifier: &Notifier,
) -> ReloadReport {
    notifier.send(&format!(
        "RELOADING=1\nMONOTONIC_USEC={}",
        crate::notify::monotonic_usec()
    ));
    let taken = peers(service, window).await;
    let report = supervisor.reload(&taken).await;
    notifier.send("READY=1");
    report
}

fn reload_json(report: &ReloadReport) -> serde_json::Value {
    serde_json::json!({"loaded": report.loaded, "errors": report.errors_json()})
}
