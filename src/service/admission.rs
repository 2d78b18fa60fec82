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
use serde_json::Value;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::replies::{error_data, Replies};
use super::MAX_CONTEXT_BYTES;
use crate::bus::envelope::{Message, Object};
use crate::bus::server::Peer;
use crate::call::Request;
use crate::cancel::Cancel;
use crate::pipeline::{Failed, Failure, Pipeline};
use crate::protocol::topics::Topic;

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

/// The door calls come in by: the room the calls in progress share and
/// what each peer holds of it, and the answers of the requests refused
/// there.
pub(super) struct Door {
    /// Room left, in bytes.
    room: Arc<Semaphore>,
    /// What each peer's calls hold, for [`PEER_HELD_BYTES`].
    by_peer: ByPeer,
    /// Where refusals are reported, as every ending of a call.
    pipeline: Pipeline,
    /// Where refusals are answered.
    replies: Replies,
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

impl Door {
    /// The door of a bus face whose calls go through `pipeline`.
    pub(super) fn new(pipeline: Pipeline, replies: Replies) -> Door {
        Door {
            room: Arc::new(Semaphore::new(HELD_BYTES)),
            by_peer: ByPeer::default(),
            pipeline,
            replies,
        }
    }

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

    /// Answers a request whose context is too large to echo (its session
    /// kept, if small, so that the caller can tell what it answers); a
    /// call's refusal is reported.
    pub(super) fn refuse_context(&self, topic: Topic, mut message: Message, bytes: usize) {
        tracing::debug!(topic = %message.msg_type, bytes, "refused a request with an oversize context");
        if matches!(topic, Topic::Discover) {
            return;
        }
        let session = message.context.remove("session");
        message.context.clear();
        if let Some(session) = session.filter(|s| s.to_string().len() <= MAX_CONTEXT_BYTES) {
            message.context.insert("session".to_owned(), session);
        }
        let failure = Failure::OversizeContext {
            bytes,
            max: MAX_CONTEXT_BYTES,
        };
        let call = topic.is_call();
        let failed = match refused_call(&message, topic, bytes) {
            Some(request) => match self.pipeline.refused(&request, failure) {
                Some(failed) => failed,
                None => return,
            },
            None if call => return,
            None => Failed::from(failure),
        };
        self.replies
            .respond(&message, error_data(&message, failed.text));
    }

    /// Answers a call that finds no room among the calls in progress, and
    /// reports it. Only what addresses the answer is decoded (the topic,
    /// the context, the call's name and toolbox): the rest of the message,
    /// however large, is skipped, not built into a tree. `Err`: the frame
    /// is malformed, and not answered.
    pub(super) fn refuse_call(
        &self,
        frame: &str,
        topic: Topic,
        why: NoRoom,
    ) -> Result<(), serde_json::Error> {
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
        let addressed = serde_json::from_str::<Addressed>(frame)?;
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
        let message = Message {
            msg_type: addressed.msg_type.into_owned(),
            data,
            context,
        };
        let failure = match why {
            NoRoom::Full => {
                tracing::debug!(topic = %message.msg_type, bytes = frame.len(), "refused a call: the calls in progress hold all they may");
                Failure::Overloaded {
                    bytes: frame.len(),
                    room: HELD_BYTES / TREE_FACTOR,
                    peer: None,
                }
            }
            NoRoom::PeerShare(peer) => {
                tracing::debug!(topic = %message.msg_type, bytes = frame.len(), %peer, "refused a call: the calls in progress of its peer hold that peer's share");
                Failure::Overloaded {
                    bytes: frame.len(),
                    room: PEER_HELD_BYTES / TREE_FACTOR,
                    peer: Some(peer.to_string()),
                }
            }
        };
        let Some(request) = refused_call(&message, topic, frame.len()) else {
            return Ok(());
        };
        if let Some(failed) = self.pipeline.refused(&request, failure) {
            self.replies
                .respond(&message, error_data(&message, failed.text));
        }
        Ok(())
    }
}

/// A call refused at the door, as the pipeline reports it; `None` for a
/// request that is no call, or a persona call naming no toolbox (which
/// is never answered).
fn refused_call(message: &Message, topic: Topic, bytes: usize) -> Option<Request> {
    let named = || {
        message
            .data
            .get("toolbox_id")
            .and_then(Value::as_str)
            .map(str::to_owned)
    };
    let toolbox = match topic {
        Topic::Invoke => None,
        Topic::Predecessor(id) => Some(id),
        Topic::PersonaCall => Some(named()?),
        _ => return None,
    };
    Some(Request {
        topic: message.msg_type.clone(),
        session: super::call::session_of(message).map(str::to_owned),
        source: super::call::source_of(message),
        toolbox,
        tool: message
            .data
            .get("name")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_owned(),
        arguments: Value::Null,
        bytes,
        arrived: tokio::time::Instant::now(),
        cancel: Cancel::never(),
        progress: None,
    })
}

/// The `data` members a call uses: all of a call's request that is decoded
/// and held (with its context).
pub(super) const CALL_KEYS: [&str; 4] = ["name", "toolbox_id", "kwargs", "args"];
