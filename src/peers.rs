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
//! single message may stop a toolbox), and only to a host that started
//! before this one: of two daemons set to yield, the later starter withdraws.
//!
//! A daemon's answers to another's probe name the answering daemon (its
//! instance: pid and start time). A probe from a daemon not heard of before
//! makes this daemon check again a moment later (at most every
//! [`RECHECK_GAP`]), so the earlier starter learns of the conflict too, and
//! reports it (if the newcomer still serves the id by then: a newcomer that
//! yielded leaves nothing to report).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;
use std::time::Duration;

use serde_json::Value;
use tokio::sync::mpsc;

use crate::bus::envelope::{Message, Object};
use crate::protocol::topics::DISCOVER;

/// The context key that marks a daemon's discovery of other hosts.
const PROBE_KEY: &str = "toolboxd_probe";
/// The context key naming the daemon that answers another's probe.
const HOST_KEY: &str = "toolboxd_host";
/// How long after a new daemon's probe this daemon checks again: time for
/// the newcomer's toolboxes to start.
pub const RECHECK_DELAY: Duration = Duration::from_secs(1);
/// Least time between two checks made because a new daemon probed.
pub const RECHECK_GAP: Duration = Duration::from_secs(5);
/// Most other daemons remembered (forgotten all at once past it).
const MAX_KNOWN_HOSTS: usize = 256;
/// Most toolbox ids one probe collects: whatever clients answer, a probe
/// holds a bounded map.
const MAX_CLAIMS: usize = 4096;
/// Longest daemon mark taken as one (`toolboxd-<pid>-<nanos>` is shorter).
const MAX_HOST_BYTES: usize = 64;
/// Longest toolbox id a claim may name.
const MAX_ID_BYTES: usize = 256;

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
    /// When this daemon started (nanoseconds since the epoch, as in
    /// `instance`): of two daemons, the later starter yields.
    started: u128,
    /// A running probe's claims so far (id → lists tools, by an older
    /// host); `None` between probes.
    collecting: Mutex<Option<BTreeMap<String, (bool, bool)>>>,
    /// Other daemons heard of (by their probes or their answers): a probe
    /// from one not among them asks for a check of our own.
    known: Mutex<BTreeSet<String>>,
    /// Rung when a daemon not heard of before probes: time to check again.
    newcomer: tokio::sync::Notify,
}

/// What a check found.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct PeerCheck {
    /// Every id another host claimed in either probe: reported.
    pub seen: BTreeSet<String>,
    /// The ids claimed in both probes with tools listed, by a host that
    /// started before us: the claims a toolbox with `on_conflict = "yield"`
    /// gives way to.
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
            started: nanos,
            collecting: Mutex::new(None),
            known: Mutex::new(BTreeSet::new()),
            newcomer: tokio::sync::Notify::new(),
        }
    }

    /// Two probes in a row (nothing at all when the window is zero).
    pub async fn check(&self) -> PeerCheck {
        if self.window.is_zero() {
            return PeerCheck::default();
        }
        let first = self.probe().await;
        let second = self.probe().await;
        let holds = |claims: &BTreeMap<String, (bool, bool)>, id: &str| {
            claims.get(id) == Some(&(true, true))
        };
        PeerCheck {
            held: first
                .keys()
                .filter(|id| holds(&first, id) && holds(&second, id))
                .cloned()
                .collect(),
            seen: first.into_keys().chain(second.into_keys()).collect(),
        }
    }

    /// Toolbox ids other hosts answer for, each with whether an answer
    /// listed tools and came from a host older than us: asks every host and
    /// collects the answers for the window.
    async fn probe(&self) -> BTreeMap<String, (bool, bool)> {
        *self.collecting.lock().unwrap_or_else(|e| e.into_inner()) = Some(BTreeMap::new());
        let mut probe = Message::new(DISCOVER, Object::new());
        probe
            .context
            .insert("source".to_owned(), Value::String("toolboxd".to_owned()));
        probe
            .context
            .insert(PROBE_KEY.to_owned(), Value::String(self.instance.clone()));
        let _ = self.out.send(probe.encode());
        tokio::time::sleep(self.window).await;
        self.collecting
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
            .unwrap_or_default()
    }

    /// A daemon's mark, if `mark` is one (`toolboxd-<pid>-<nanos>`): anything
    /// else a client sends is not taken as a daemon.
    fn host_mark(mark: Option<&Value>) -> Option<&str> {
        let mark = mark?.as_str()?;
        let mut parts = mark.strip_prefix("toolboxd-")?.split('-');
        let digits = |p: Option<&str>| {
            p.is_some_and(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
        };
        (mark.len() <= MAX_HOST_BYTES
            && digits(parts.next())
            && digits(parts.next())
            && parts.next().is_none())
        .then_some(mark)
    }

    /// Whether a daemon named `host` (an instance mark) started before us; a
    /// host that does not say is taken as older (a Python service, say).
    fn is_older(&self, host: Option<&str>) -> bool {
        let started = host
            .and_then(|h| h.rsplit('-').next())
            .and_then(|nanos| nanos.parse::<u128>().ok());
        match (started, host) {
            (Some(started), Some(host)) => (started, host) < (self.started, self.instance.as_str()),
            _ => true,
        }
    }

    /// Remembers another daemon; says whether it was new.
    fn meet(&self, host: &str) -> bool {
        let mut known = self.known.lock().unwrap_or_else(|e| e.into_inner());
        if known.contains(host) {
            return false;
        }
        if known.len() >= MAX_KNOWN_HOSTS {
            known.clear();
        }
        known.insert(host.to_owned());
        true
    }

    /// Another daemon's probe arrived: if it is one not heard of before,
    /// ask for a check of our own (see [`Peers::newcomer`]).
    pub fn probed_by(&self, request: &Message) {
        if let Some(host) = Self::host_mark(request.context.get(PROBE_KEY)) {
            if self.meet(host) {
                self.newcomer.notify_one();
            }
        }
    }

    /// Resolves when a daemon not heard of before has probed the bus.
    pub async fn newcomer(&self) {
        self.newcomer.notified().await
    }

    /// Our answer to another daemon's probe: named as ours.
    pub fn answering(&self, request: &Message) -> Message {
        let mut answering = request.clone();
        answering
            .context
            .insert(HOST_KEY.to_owned(), Value::String(self.instance.clone()));
        answering
    }

    /// A discover response seen on the bus: while a probe runs, note the id
    /// another host answers for, if the answer is to our probe.
    pub fn note(&self, frame: &str) {
        if self
            .collecting
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_none()
        {
            return;
        }
        let Ok(answer) = Message::decode(frame) else {
            return;
        };
        if self.asker(&answer) != Asker::Us {
            return;
        }
        let Some(id) = answer.data.get("toolbox_id").and_then(Value::as_str) else {
            return;
        };
        if !crate::manifest::valid_id(id) || id.len() > MAX_ID_BYTES {
            return;
        }
        let lists_tools = answer
            .data
            .get("tools")
            .and_then(Value::as_array)
            .is_some_and(|tools| !tools.is_empty());
        // An older host's claim: one that started before us, or one that
        // does not say (a Python service).
        let older = self.is_older(Self::host_mark(answer.context.get(HOST_KEY)));
        let mut collecting = self.collecting.lock().unwrap_or_else(|e| e.into_inner());
        let Some(claims) = collecting.as_mut() else {
            return;
        };
        if claims.len() >= MAX_CLAIMS && !claims.contains_key(id) {
            return;
        }
        let (lists, by_older) = claims.entry(id.to_owned()).or_insert((false, false));
        // One host that both serves the id and is older is enough.
        if lists_tools && older {
            (*lists, *by_older) = (true, true);
        } else if !(*lists && *by_older) {
            *lists |= lists_tools;
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

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// Answers every probe `peers` sends with a claim of `id` by `host`
    /// (`None`: a host that does not say who it is), until the check ends.
    async fn check_with_claimant(host: Option<String>) -> PeerCheck {
        let (out, mut sent) = mpsc::unbounded_channel();
        let peers = std::sync::Arc::new(Peers::new(out, Duration::from_millis(50)));
        let checking = tokio::spawn({
            let peers = peers.clone();
            async move { peers.check().await }
        });
        for _ in 0..2 {
            let probe = Message::decode(&sent.recv().await.expect("a probe")).unwrap();
            let mut answer = probe.response(
                json!({"toolbox_id": "math", "tools": [{"name": "add"}]})
                    .as_object()
                    .unwrap()
                    .clone(),
            );
            if let Some(host) = &host {
                answer
                    .context
                    .insert(HOST_KEY.to_owned(), Value::String(host.clone()));
            }
            peers.note(&answer.encode());
        }
        checking.await.unwrap()
    }

    #[tokio::test]
    async fn only_an_older_host_holds_a_claim() {
        let older = Some("toolboxd-1-1".to_owned());
        let younger = Some(format!("toolboxd-1-{}", u128::MAX));
        let math = BTreeSet::from(["math".to_owned()]);
        let check = check_with_claimant(older).await;
        assert_eq!((&check.seen, &check.held), (&math, &math));
        let check = check_with_claimant(younger).await;
        assert_eq!((&check.seen, &check.held), (&math, &BTreeSet::new()));
        // A host that does not say when it started is taken as older.
        let check = check_with_claimant(None).await;
        assert_eq!(check.held, math);
    }

    #[test]
    fn a_probe_from_a_new_daemon_asks_for_one_check() {
        let (out, _sent) = mpsc::unbounded_channel();
        let peers = Peers::new(out, Duration::from_millis(50));
        let mut probe = Message::new(DISCOVER, Object::new());
        probe.context.insert(
            PROBE_KEY.to_owned(),
            Value::String("toolboxd-2-5".to_owned()),
        );
        peers.probed_by(&probe);
        let asked = futures_util::FutureExt::now_or_never(peers.newcomer());
        assert!(asked.is_some(), "a newcomer asks for a check");
        peers.probed_by(&probe);
        let asked = futures_util::FutureExt::now_or_never(peers.newcomer());
        assert!(asked.is_none(), "a daemon heard of before does not");
    }
}

#[cfg(test)]
mod marks {
    use super::*;

    #[test]
    fn only_a_daemons_mark_is_taken_as_one() {
        let mark =
            |s: &str| Peers::host_mark(Some(&Value::String(s.to_owned()))).map(str::to_owned);
        assert_eq!(mark("toolboxd-12-345").as_deref(), Some("toolboxd-12-345"));
        for bad in [
            "toolboxd-12",
            "toolboxd-12-34-5",
            "toolboxd--5",
            "toolboxd-1a-5",
            "python-1-2",
            &format!("toolboxd-1-{}", "9".repeat(80)),
        ] {
            assert_eq!(mark(bad), None, "{bad}");
        }
        assert_eq!(Peers::host_mark(Some(&Value::from(7))), None);
        assert_eq!(Peers::host_mark(None), None);
    }
}
