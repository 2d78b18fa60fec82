//! Requests refused at the door, before any task is spawned for them: a
//! context too large to echo, and a call when the calls in progress already
//! hold what the daemon allows them.
//!
//! A call holds its request (decoded) until it is answered: up to
//! `call_timeout_s`, and `max_queued_calls` of them per toolbox may wait.
//! Its arguments are bounded (`max_argument_bytes`), but a client may pad
//! the rest of the message up to the bus's 10 MiB, and a decoded JSON tree
//! takes up to 16 times its text (`[0,0,...]`: 32 bytes a value for 2 bytes
//! of text). Counted by what they hold times that (their context and the
//! members of `data` a call uses; the rest of the frame is never decoded),
//! the requests of all calls in progress share [`HELD_BYTES`]; a call past
//! it is answered busy at once. The room is taken before the call is
//! decoded: a call refused is read only as far as its answer's address.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::Arc;

use serde_json::value::RawValue;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::{answers, Message, Object, Service, Topic, Value, MAX_CONTEXT_BYTES};
use crate::bus::server::Peer;
use crate::observe::{Ending, Finished};
use crate::protocol::topics::route;
use crate::registry::Resolved;

/// What the requests of all calls in progress may hold, counted as their
/// frame's size times [`TREE_FACTOR`]: 8,000 calls of 1 KiB, eight with
/// 1 MiB of arguments.
pub(super) const HELD_BYTES: usize = 128 * 1024 * 1024;

/// The largest request but a call: twice the largest context an answer
/// echoes. Larger ones are dropped without being decoded.
pub(super) const MAX_REQUEST_BYTES: usize = 2 * MAX_CONTEXT_BYTES;

/// A decoded JSON tree's size at most, per byte of its text.
const TREE_FACTOR: usize = 16;

/// What the calls of one peer of the embedded bus may hold of
/// [`HELD_BYTES`] (a peer is a user on loopback: see
/// [`crate::bus::server::Peer`]): a peer padding its calls is refused
/// before the others are, who always find three quarters of the room. On
/// an external bus the sender of a frame is not known, and all calls share
/// the whole room.
pub(super) const PEER_HELD_BYTES: usize = HELD_BYTES / 4;

/// Bytes held by each peer's calls in progress.
type ByPeer = Arc<std::sync::Mutex<HashMap<Peer, usize>>>;

/// The room the calls in progress share, and what each peer holds of it.
pub(super) struct Held {
    /// Room left, in bytes.
    room: Arc<Semaphore>,
    /// What each peer's calls hold, for [`PEER_HELD_BYTES`].
    by_peer: ByPeer,
}

impl Default for Held {
    fn default() -> Self {
        Held {
            room: Arc::new(Semaphore::new(HELD_BYTES)),
            by_peer: ByPeer::default(),
        }
    }
}

/// A call's room, given back when it is answered (dropped).
pub(super) struct Room {
    /// Its bytes of the shared room.
    _permit: OwnedSemaphorePermit,
    /// Its bytes of its peer's share, when the peer is known.
    _share: Option<Share>,
}

/// Bytes counted against one peer's share until dropped.
struct Share {
    peer: Peer,
    bytes: usize,
    by_peer: ByPeer,
}

impl Drop for Share {
    fn drop(&mut self) {
        let mut by_peer = self.by_peer.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(held) = by_peer.get_mut(&self.peer) {
            *held -= self.bytes;
            if *held == 0 {
                by_peer.remove(&self.peer);
            }
        }
    }
}

/// Why a call found no room.
pub(super) enum NoRoom {
    /// All calls in progress hold all they may.
    Full,
    /// The calls in progress of its peer hold that peer's share.
    PeerShare(Peer),
}

impl Held {
    /// Room for a call whose request will hold `text_bytes` of text once
    /// built ([`crate::bus::envelope::Unbuilt::text_bytes`]: its context and
    /// the `data` members of [`CALL_KEYS`], not the padding beside them),
    /// sent by `from` (when the bus says), kept until the room is dropped.
    pub(super) fn admit(&self, text_bytes: usize, from: Option<Peer>) -> Result<Room, NoRoom> {
        // The envelope's own few hundred bytes.
        let bytes = (512 + text_bytes)
            .saturating_mul(TREE_FACTOR)
            .min(PEER_HELD_BYTES);
        let share = match from {
            Some(peer) => {
                let mut by_peer = self.by_peer.lock().unwrap_or_else(|e| e.into_inner());
                let held = by_peer.entry(peer).or_default();
                if *held + bytes > PEER_HELD_BYTES {
                    return Err(NoRoom::PeerShare(peer));
                }
                *held += bytes;
                Some(Share {
                    peer,
                    bytes,
                    by_peer: self.by_peer.clone(),
                })
            }
            None => None,
        };
        // PEER_HELD_BYTES is far below u32::MAX; a refusal drops the share.
        let bytes = u32::try_from(bytes).unwrap_or(u32::MAX);
        match self.room.clone().try_acquire_many_owned(bytes) {
            Ok(permit) => Ok(Room {
                _permit: permit,
                _share: share,
            }),
            Err(_) => Err(NoRoom::Full),
        }
    }
}

/// The `data` members a call uses: all of a call's request that is decoded
/// and held (with its context).
pub(super) const CALL_KEYS: [&str; 4] = ["name", "toolbox_id", "kwargs", "args"];

impl Service {
    /// Answers a request whose context is too large to echo (its session
    /// kept, if small, so that the caller can tell what it answers).
    pub(super) fn refuse_context(&self, topic: Topic, mut request: Message, bytes: usize) {
        tracing::debug!(topic = %request.msg_type, bytes, "refused a request with an oversize context");
        if matches!(topic, Topic::Discover) {
            return;
        }
        let session = request.context.remove("session");
        request.context.clear();
        if let Some(session) = session.filter(|s| s.to_string().len() <= MAX_CONTEXT_BYTES) {
            request.context.insert("session".to_owned(), session);
        }
        let error = answers::oversize_context(bytes, MAX_CONTEXT_BYTES);
        self.respond(&request, Self::error_data(&request, error));
    }

    /// Answers a call that finds no room among the calls in progress. Only
    /// what addresses the answer is decoded (the topic, the context, the
    /// call's name and toolbox): the rest of the message, however large, is
    /// skipped, not built into a tree.
    pub(super) fn refuse_held(&self, frame: &str, why: NoRoom) {
        #[derive(serde::Deserialize)]
        struct Addressed<'a> {
            #[serde(rename = "type", borrow)]
            msg_type: Cow<'a, str>,
            #[serde(default, borrow)]
            data: Names<'a>,
            #[serde(default, borrow)]
            context: Option<&'a RawValue>,
        }
        #[derive(serde::Deserialize, Default)]
        struct Names<'a> {
            #[serde(borrow)]
            name: Option<Cow<'a, str>>,
            #[serde(borrow)]
            toolbox_id: Option<Cow<'a, str>>,
        }
        let addressed = match serde_json::from_str::<Addressed>(frame) {
            Ok(addressed) => addressed,
            Err(e) => return self.log_malformed(&e),
        };
        let mut data = Object::new();
        for (key, value) in [
            ("name", addressed.data.name),
            ("toolbox_id", addressed.data.toolbox_id),
        ] {
            if let Some(value) = value {
                data.insert(key.to_owned(), Value::String(value.into_owned()));
            }
        }
        // A context too large to echo is left out, as a whole.
        let context = addressed
            .context
            .filter(|raw| raw.get().len() <= MAX_CONTEXT_BYTES)
            .and_then(|raw| serde_json::from_str::<Object>(raw.get()).ok())
            .unwrap_or_default();
        let request = Message {
            msg_type: addressed.msg_type.into_owned(),
            data,
            context,
        };
        let labels = self.door_labels(&request);
        let error = match why {
            NoRoom::Full => {
                tracing::debug!(topic = %request.msg_type, bytes = frame.len(), "refused a call: the calls in progress hold all they may");
                answers::overloaded(frame.len(), HELD_BYTES / TREE_FACTOR)
            }
            NoRoom::PeerShare(peer) => {
                tracing::debug!(topic = %request.msg_type, bytes = frame.len(), %peer, "refused a call: the calls in progress of its peer hold that peer's share");
                answers::overloaded_peer(
                    frame.len(),
                    &peer.to_string(),
                    PEER_HELD_BYTES / TREE_FACTOR,
                )
            }
        };
        let answer = Err(error);
        if let Some((toolbox, tool)) = labels {
            self.observer.call_finished(&Finished {
                toolbox: &toolbox,
                tool: &tool,
                outcome: Ending::Busy,
                took: std::time::Duration::ZERO,
                request: &request,
                answer: &answer,
                arguments: None,
            });
        }
        let Err(error) = answer else { return };
        self.respond(&request, Self::error_data(&request, error));
    }

    /// The (toolbox, tool) labels a call refused at the door is reported
    /// under: `None` when no toolbox hosted here would have had it (another
    /// host's, or a name nobody serves); the tool empty unless it is one of
    /// the toolbox's.
    fn door_labels(&self, request: &Message) -> Option<(String, String)> {
        let catalog = self.registry.snapshot();
        let name = request
            .data
            .get("name")
            .and_then(Value::as_str)
            .unwrap_or("");
        let id = match route(&request.msg_type)? {
            Topic::Invoke => {
                return match catalog.resolve(name) {
                    Resolved::One(entry, tool) => {
                        Some((entry.handle.id().to_owned(), tool.name.clone()))
                    }
                    _ => None,
                }
            }
            Topic::Predecessor(id) => id,
            _ => request.data.get("toolbox_id")?.as_str()?.to_owned(),
        };
        let entry = catalog.toolbox(&id).filter(|e| e.is_hosted())?;
        let tool = entry
            .tools
            .get(name)
            .map_or("", |t| t.name.as_str())
            .to_owned();
        Some((id, tool))
    }

    /// An error answer's data: the error, with the request's `name` and
    /// `toolbox_id` (when short) so the caller can tell what it answers.
    pub(super) fn error_data(request: &Message, error: String) -> Object {
        let mut data = Object::new();
        for key in ["name", "toolbox_id"] {
            if let Some(Value::String(v)) = request.data.get(key) {
                if v.len() <= 256 {
                    data.insert(key.to_owned(), Value::String(v.clone()));
                }
            }
        }
        data.insert("error".to_owned(), Value::String(error));
        data
    }
}
