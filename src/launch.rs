//! One launcher: spawn a toolbox's child, select its MCP era (falling back to
//! legacy when the child dies of the era probe), list its tools and compile
//! them. The toolbox actor (`run`) and `check --probe` both start children
//! through [`launch`], so they can never disagree about a toolbox.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;

use crate::manifest::{Manifest, LEGACY_VERSIONS};
use crate::mcp::ToolSpec;
use crate::process::child::{Child, ChildEvent, ExitInfo, StderrLog};
use crate::session::Session;
use crate::tool::ToolSet;

/// A child that has listed its tools: ready to serve.
pub struct Launched {
    /// The process.
    pub child: Child,
    /// What the child tells its owner (list changes, log messages, breaks).
    pub events: mpsc::UnboundedReceiver<ChildEvent>,
    /// The MCP session, in the era the child speaks.
    pub session: Session,
    /// The tools as listed, to tell a later listing that changed nothing.
    pub specs: Vec<ToolSpec>,
    /// The tools that compiled.
    pub tools: ToolSet,
    /// Why some listed tools were left out (bad entries, schemas that do not
    /// compile, duplicate names).
    pub left_out: Vec<String>,
}

/// A start that did not get as far as a tool list.
pub struct LaunchError {
    /// The child, if one was spawned (for its exit status and stderr).
    pub child: Option<Child>,
    /// What failed, in words: "handshake: ...", "listing tools: ...".
    pub why: String,
    /// The child could not be spawned for want of descriptors, processes or
    /// memory: a passing shortage, not the toolbox's fault.
    pub short_of_resources: bool,
}

impl LaunchError {
    /// Makes sure the child is gone; returns how it ended and its last stderr
    /// lines (`Code(-1)` and none when it never ran).
    pub async fn reap(&self) -> (ExitInfo, Vec<String>) {
        let Some(child) = &self.child else {
            return (ExitInfo::Code(-1), Vec::new());
        };
        let exit = match tokio::time::timeout(Duration::from_millis(200), child.exited()).await {
            Ok(exit) => exit,
            Err(_) => {
                child.signal_group(nix::sys::signal::Signal::SIGKILL);
                child.exited().await
            }
        };
        // Its last words may still be in the pipe when it is reaped.
        let tail = child.final_stderr_tail(Duration::from_millis(200)).await;
        (exit, tail)
    }
}

/// Starts `manifest`'s child speaking `pin` (an MCP version; `None` probes the
/// era), and lists and compiles its tools; its stderr goes to `stderr`.
pub async fn launch(
    manifest: &Manifest,
    pin: Option<&str>,
    stderr: &Arc<StderrLog>,
) -> Result<Launched, LaunchError> {
    let limits = &manifest.limits;
    let probe_timeout = Duration::from_secs(limits.probe_timeout_s);
    let request_timeout = Duration::from_secs(limits.call_timeout_s);
    let mut pin = pin.map(str::to_owned);
    let (child, events, session) = loop {
        let spawned = Child::spawn(manifest, stderr.clone()).await;
        let (child, events) = spawned.map_err(|e| LaunchError {
            child: None,
            short_of_resources: e.is_resource_shortage(),
            why: e.to_string(),
        })?;
        tracing::info!(toolbox = %manifest.id, pid = child.pid(), "child spawned");
        let opened = Session::open(
            child.rpc().clone(),
            pin.as_deref(),
            probe_timeout,
            request_timeout,
        )
        .await;
        match opened {
            Ok(session) => break (child, events, session),
            // A legacy child may die of the unknown `server/discover` probe:
            // start it again and go straight to `initialize`.
            Err(e) if e.child_died() && pin.is_none() => {
                tracing::info!(
                    toolbox = %manifest.id,
                    pid = child.pid(),
                    "child ended during the era probe ({e}); retrying as legacy MCP"
                );
                pin = Some(LEGACY_VERSIONS[0].to_owned());
            }
            Err(e) => {
                return Err(LaunchError {
                    child: Some(child),
                    why: format!("handshake: {e}"),
                    short_of_resources: false,
                })
            }
        }
    };
    let listed = session.list_tools(request_timeout, limits.max_message_bytes);
    let (mut specs, mut left_out) = match listed.await {
        Ok(listed) => listed,
        Err(e) => {
            return Err(LaunchError {
                child: Some(child),
                why: format!("listing tools: {e}"),
                short_of_resources: false,
            })
        }
    };
    manifest.annotations.apply(&mut specs);
    let (tools, rejected) = ToolSet::compile(&manifest.id, specs.clone());
    left_out.extend(rejected);
    if let Err(why) = tools.fits_on_the_bus() {
        return Err(LaunchError {
            child: Some(child),
            why: format!("listing tools: {why}"),
            short_of_resources: false,
        });
    }
    Ok(Launched {
        child,
        events,
        session,
        specs,
        tools,
        left_out,
    })
}
