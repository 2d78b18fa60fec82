//! `ovos.persona.tools.discover`: one answer per listed toolbox, each
//! refreshed first (within a second). The same topic is the check for
//! other hosts (`peers.rs`): another daemon's probe is answered at once,
//! ours is not answered.

use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;

use super::replies::Replies;
use crate::bus::envelope::Message;
use crate::object;
use crate::peers::{Asker, Peers};
use crate::registry::Registry;

/// How long discovery waits for toolboxes to refresh before answering with the
/// last known lists.
const DISCOVER_REFRESH: Duration = Duration::from_secs(1);

/// Discovery: the catalog, and this daemon's check for other hosts.
pub(super) struct Discovery {
    /// The catalog of hosted toolboxes.
    registry: Arc<Registry>,
    /// This daemon's check for other hosts: it hears the answers to its
    /// probe, and tells its probe from another daemon's.
    peers: Arc<Peers>,
    /// Where answers go.
    replies: Replies,
}

impl Discovery {
    /// Discovery of `registry`, telling probes apart with `peers`.
    pub(super) fn new(registry: Arc<Registry>, peers: Arc<Peers>, replies: Replies) -> Discovery {
        Discovery {
            registry,
            peers,
            replies,
        }
    }

    /// Notes another host's answer to a discovery (the check for other
    /// hosts listens for them).
    pub(super) fn note_answer(&self, frame: &str) {
        self.peers.note(frame);
    }

    /// One response per listed toolbox, each refreshed first (within a
    /// second). Another daemon's probe is answered at once, without
    /// refreshing; our own probe is not answered.
    pub(super) async fn discover(&self, request: &Message) {
        match self.peers.asker(request) {
            Asker::Us => return,
            Asker::Peer => {
                self.peers.probed_by(request);
                return self.answer(&self.peers.answering(request));
            }
            Asker::Client => {}
        }
        let before = self.registry.snapshot();
        let refreshes: Vec<_> = before
            .listed()
            .map(|(_, entry)| {
                let handle = entry.handle.clone();
                async move { handle.refresh(false).await }
            })
            .collect();
        let _ =
            tokio::time::timeout(DISCOVER_REFRESH, futures_util::future::join_all(refreshes)).await;
        self.answer(request);
    }

    fn answer(&self, request: &Message) {
        let catalog = self.registry.snapshot();
        for (id, entry) in catalog.listed() {
            let tools: Vec<Value> = entry.tools.iter().map(|t| t.definition()).collect();
            self.replies.respond(
                request,
                object! {"toolbox_id" => id.as_str(), "tools" => tools},
            );
        }
    }
}
