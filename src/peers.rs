//! The multi-host check: which toolbox ids other hosts on the bus also
//! answer for (OVOS-TOOLS-1 §3 wants ids unique on a bus).
//!
//! The daemon asks with an `ovos.persona.tools.discover` of its own, marked
//! with its instance in the context, and collects the `toolbox_id` of every
//! discover response carrying that mark for a window. Its own service does not
//! answer its own probe, and answers another daemon's probe at once (see
//! [`crate::service`]). A check is two probes in a row: a claim seen in one
//! is reported; only a claim that holds in both, by a host that lists tools
//! for the id, can make a toolbox yield (the bus has no authentication: no
//! single message may stop a toolbox).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;
use std::time::Duration;

use serde_json::Value;
use tokio::sync::mpsc;

use crate::bus::envelope::{Message, Object};
use crate::service::DISCOVER;

/// The context key that marks a daemon's discovery of other hosts.
const PROBE_KEY: &str = "toolboxd_probe";

/// Whose discovery a `ovos.persona.tools.discover` request is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Asker {
    /// A persona's (or any client's): answer it in full.
    Client,
    /// This daemon's own probe: not answered.
    Us,
    /// Another daemon's probe: answered at once, without refreshing.
    Peer,
}

/// This daemon's probe of other hosts.
pub struct Peers {
    /// This daemon's mark on its probes, unique per process and start.
    instance: String,
    /// Encoded frames to send on the bus (the probe goes out here).
    out: mpsc::UnboundedSender<String>,
    /// How long a probe listens for answers; zero means never ask.
    window: Duration,
    /// Where a running probe's answers go (the id, and whether the answer
    /// lists tools); `None` between probes.
    collecting: Mutex<Option<mpsc::UnboundedSender<(String, bool)>>>,
}

/// What a check found.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct PeerCheck {
    /// Every id another host claimed in either probe: reported.
    pub seen: BTreeSet<String>,
    /// The ids claimed in both probes with tools listed: the claims a toolbox
    /// with `on_conflict = "yield"` gives way to.
    pub held: BTreeSet<String>,
}

impl Peers {
    /// A prober sending on `out` and listening `window` long per probe.
    pub fn new(out: mpsc::UnboundedSender<String>, window: Duration) -> Peers {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        Peers {
            instance: format!("toolboxd-{}-{nanos}", std::process::id()),
            out,
            window,
            collecting: Mutex::new(None),
        }
    }

    /// Two probes in a row (nothing at all when the window is zero).
    pub async fn check(&self) -> PeerCheck {
        if self.window.is_zero() {
            return PeerCheck::default();
        }
        let first = self.probe().await;
        let second = self.probe().await;
        let lists = |claims: &BTreeMap<String, bool>, id: &str| claims.get(id) == Some(&true);
        PeerCheck {
            held: first
                .keys()
                .filter(|id| lists(&first, id) && lists(&second, id))
                .cloned()
                .collect(),
            seen: first.into_keys().chain(second.into_keys()).collect(),
        }
    }

    /// Toolbox ids other hosts answer for, and whether each answer listed
    /// tools: asks every host and collects the answers for the window.
    async fn probe(&self) -> BTreeMap<String, bool> {
        let (tx, mut rx) = mpsc::unbounded_channel();
        *self.collecting.lock().unwrap_or_else(|e| e.into_inner()) = Some(tx);
        let mut probe = Message::new(DISCOVER, Object::new());
        probe
            .context
            .insert("source".to_owned(), Value::String("toolboxd".to_owned()));
        probe
            .context
            .insert(PROBE_KEY.to_owned(), Value::String(self.instance.clone()));
        let _ = self.out.send(probe.encode());
        tokio::time::sleep(self.window).await;
        *self.collecting.lock().unwrap_or_else(|e| e.into_inner()) = None;
        let mut claims = BTreeMap::new();
        while let Ok((id, lists_tools)) = rx.try_recv() {
            *claims.entry(id).or_insert(false) |= lists_tools;
        }
        claims
    }

    /// A discover response seen on the bus: while a probe runs, note the id
    /// another host answers for, if the answer is to our probe.
    pub fn note(&self, frame: &str) {
        let collecting = self.collecting.lock().unwrap_or_else(|e| e.into_inner());
        let Some(tx) = collecting.as_ref() else {
            return;
        };
        let Ok(answer) = Message::decode(frame) else {
            return;
        };
        if self.asker(&answer) != Asker::Us {
            return;
        }
        if let Some(id) = answer.data.get("toolbox_id").and_then(Value::as_str) {
            let lists_tools = answer
                .data
                .get("tools")
                .and_then(Value::as_array)
                .is_some_and(|tools| !tools.is_empty());
            let _ = tx.send((id.to_owned(), lists_tools));
        }
    }

    /// Whose discovery `request` (or the request an answer derives from) is.
    pub fn asker(&self, request: &Message) -> Asker {
        match request.context.get(PROBE_KEY).and_then(Value::as_str) {
            None => Asker::Client,
            Some(mark) if mark == self.instance => Asker::Us,
            Some(_) => Asker::Peer,
        }
    }
}
