//! The bus face: the topics of OVOS-TOOLS-1 (docs/protocol.md), where each
//! bus request is answered. Calls go through the call pipeline
//! (`pipeline/`); this face decodes them and renders their outcomes in
//! OVOS words.
//!
//! [`Service::dispatch`] runs on the bus read loop and never waits: it reads
//! a frame's topic, lets a call in at the door (`admission.rs`) or refuses
//! it there, and spawns a task for each request it answers, so a slow tool
//! never delays a fast one. Each topic's answer is in the file of its
//! concept: `call.rs` (the calls and the global stop), `discover.rs`,
//! `listing.rs` (list, get, reload); `replies.rs` sends them,
//! `progress.rs` relays a call's progress.

use std::sync::Arc;

use serde::Deserialize;
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::ask::Asker;
use crate::bus::envelope::{leading_type, Message, Unbuilt};
use crate::observe::Observer;
use crate::operator::Operators;
use crate::peers::Peers;
use crate::pipeline::Pipeline;
use crate::protocol::topics::{route, Topic, ASK_RESPONSE, DISCOVER_RESPONSE};
use crate::registry::{Catalog, Registry};
use crate::toolbox::State;
use crate::util::throttle::LogBudget;

mod admission;
mod call;
mod discover;
mod listing;
mod progress;
mod replies;
#[cfg(test)]
mod tests;

use admission::{Door, CALL_KEYS, MAX_REQUEST_BYTES};
use call::Calls;
use discover::Discovery;
use listing::Listing;
use replies::Replies;

/// Largest request context echoed in answers: a larger one would be copied
/// into every answer (one per toolbox, for discovery) and could push an
/// answer past the bus's message limit. Such a request is refused.
pub const MAX_CONTEXT_BYTES: usize = 64 * 1024;

/// Malformed bus frames logged per second; the rest are counted.
const MALFORMED_PER_SECOND: u32 = 10;

/// Answers the topics, for the toolboxes in the registry.
pub struct Service {
    /// The catalog of hosted toolboxes: whether a call's toolbox is hosted
    /// is read from it as the frame is read; prewarm topics.
    registry: Arc<Registry>,
    /// `false` for a toolbox host only: the flat `ovos.tools.*` topics are
    /// left to another daemon on the bus.
    flat: bool,
    /// Malformed frames logged per second: any client can send thousands.
    malformed: std::sync::Mutex<LogBudget>,
    /// Where calls come in, or are refused.
    door: Door,
    /// The calls, and the global stop.
    calls: Calls,
    /// `ovos.persona.tools.discover`.
    discovery: Discovery,
    /// The flat catalog topics.
    listing: Listing,
    /// The questions toolboxd asks the person: answers go to it.
    asker: Arc<Asker>,
}

/// When and how a request arrived: a call's deadline counts from `at`, and
/// `frame_bytes` bounds its arguments' size without measuring them.
struct Arrival {
    /// When the frame was read: a call's deadline counts from here.
    at: Instant,
    /// The frame's size.
    frame_bytes: usize,
    /// The catalog as it was when the frame was read: whether a call's
    /// toolbox is hosted is decided then, in the bus's order, so a call read
    /// before an operator's stop is answered (`stopped`), never silenced.
    catalog: Arc<Catalog>,
}

/// The one field read before deciding whether a frame is ours.
#[derive(Deserialize)]
struct Head<'a> {
    #[serde(rename = "type", borrow)]
    msg_type: Option<std::borrow::Cow<'a, str>>,
}

impl Service {
    /// A service answering for `registry`, sending on `out`; reloads go to
    /// `operators`, endings to `observer`.
    pub fn new(
        registry: Arc<Registry>,
        out: mpsc::UnboundedSender<String>,
        operators: Operators,
        peers: Arc<Peers>,
        flat: bool,
        observer: Observer,
    ) -> Arc<Service> {
        let asker = Asker::new(out.clone());
        let replies = Replies::new(out);
        let pipeline = Pipeline::new(registry.clone(), observer, asker.clone());
        Arc::new(Service {
            registry: registry.clone(),
            flat,
            malformed: std::sync::Mutex::new(LogBudget::new(MALFORMED_PER_SECOND)),
            door: Door::new(pipeline.clone(), replies.clone()),
            calls: Calls::new(pipeline, replies.clone()),
            discovery: Discovery::new(registry.clone(), peers, replies.clone()),
            listing: Listing::new(registry, operators, replies),
            asker,
        })
    }

    /// Handles one incoming frame without waiting: malformed frames are logged
    /// and dropped; requests on our topics get a task each.
    pub fn dispatch(self: &Arc<Self>, frame: &str, from: Option<crate::bus::server::Peer>) {
        // Every OVOS client writes the topic first: read it there, so that the
        // many frames that are not for us (answers, ours echoed back included,
        // some large) are dropped without being parsed.
        let topic = match leading_type(frame) {
            Some(topic) => std::borrow::Cow::Borrowed(topic),
            None => match serde_json::from_str::<Head>(frame) {
                Ok(Head {
                    msg_type: Some(topic),
                }) => topic,
                Ok(Head { msg_type: None }) | Err(_) => {
                    // Decode fully only to say exactly what is wrong.
                    if let Err(e) = Message::decode(frame) {
                        self.log_malformed(&e);
                    }
                    return;
                }
            },
        };
        if topic == DISCOVER_RESPONSE {
            return self.discovery.note_answer(frame);
        }
        if topic == ASK_RESPONSE {
            return self.asker.answer(frame);
        }
        let name = topic;
        let Some(topic) = route(&name) else {
            return self.prewarm(&name);
        };
        if !self.flat
            && matches!(
                topic,
                Topic::List | Topic::Get | Topic::Invoke | Topic::Reload
            )
        {
            return;
        }
        let calls = topic.is_call();
        // Only a call carries data of any size (its arguments); decoding a
        // padded list or stop request would only cost the bus's thread.
        if !calls && frame.len() > MAX_REQUEST_BYTES {
            return self.log_malformed(&format_args!(
                "a {} request of {} bytes (only calls may pass {} bytes)",
                crate::util::throttle::cut(&name, 100),
                frame.len(),
                MAX_REQUEST_BYTES
            ));
        }
        // A call takes its room before it is decoded: without room, only
        // what addresses its refusal is read.
        let (room, decoded) = if calls {
            let unbuilt = Unbuilt::read(frame, &CALL_KEYS);
            match self.door.admit(unbuilt.text_bytes(), from) {
                Err(why) => {
                    if let Err(e) = self.door.refuse_call(frame, topic, why) {
                        self.log_malformed(&e);
                    }
                    return;
                }
                Ok(room) => (Some(room), unbuilt.build()),
            }
        } else {
            (None, Message::decode(frame))
        };
        let request = match decoded {
            Ok(request) => request,
            Err(e) => {
                self.log_malformed(&e);
                return;
            }
        };
        if frame.len() > MAX_CONTEXT_BYTES {
            let context = serde_json::to_string(&request.context).map_or(0, |c| c.len());
            if context > MAX_CONTEXT_BYTES {
                return self.door.refuse_context(topic, request, context);
            }
        }
        // A call's deadline counts from here, whatever it waits for later.
        let arrival = Arrival {
            at: Instant::now(),
            frame_bytes: frame.len(),
            catalog: self.registry.snapshot(),
        };
        let service = self.clone();
        tokio::spawn(async move {
            service.handle(topic, request, arrival).await;
            drop(room);
        });
    }

    /// Starts the idle toolboxes that asked to be started by a message of
    /// `topic` (`[start] prewarm_on`), ahead of their first call. Answers
    /// (`*.response`) never prewarm, so the daemon's own traffic costs no
    /// catalog lookup.
    fn prewarm(&self, topic: &str) {
        if topic.ends_with(".response") {
            return;
        }
        for entry in self.registry.snapshot().prewarmed_by(topic) {
            if entry.state == State::Idle {
                tracing::debug!(toolbox = entry.handle.id(), topic, "prewarming");
                entry.handle.prewarm();
            }
        }
    }

    /// Logs a dropped frame, within [`MALFORMED_PER_SECOND`].
    fn log_malformed(&self, error: &dyn std::fmt::Display) {
        let mut budget = self.malformed.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(dropped) = budget.take() {
            if dropped > 0 {
                tracing::warn!(
                    dropped,
                    "malformed bus frames not logged (more than {MALFORMED_PER_SECOND} a second)"
                );
            }
            // What a client sent may be quoted in the error: escaped, so it
            // cannot forge a log line.
            let error = error.to_string();
            let error = crate::util::throttle::escape_controls(&error);
            tracing::warn!("dropped a malformed bus frame: {error}");
        }
    }

    /// Answers one request, by its topic.
    async fn handle(&self, topic: Topic, request: Message, arrival: Arrival) {
        match topic {
            Topic::Discover => self.discovery.discover(&request).await,
            Topic::PersonaCall => {
                // A persona call naming no toolbox is nobody's: no answer.
                if let Some(id) = request.data.get("toolbox_id").and_then(|v| v.as_str()) {
                    let id = id.to_owned();
                    self.calls.persona_call(&request, &id, &arrival).await;
                }
            }
            Topic::Predecessor(id) => self.calls.persona_call(&request, &id, &arrival).await,
            Topic::Invoke => self.calls.invoke(&request, &arrival).await,
            Topic::Stop => self.calls.stop(&request),
            Topic::List => self.listing.list(&request),
            Topic::Get => self.listing.get(&request),
            Topic::Reload => self.listing.reload(&request).await,
        }
    }
}
