//! The MCP face's side of the bus: one connection (reconnecting with
//! backoff), the catalog kept from `ovos.tools.list`, and each call relayed
//! as an `ovos.persona.tools.call` naming its toolbox, under a session of
//! its own: its answer and its progress are told apart by that session,
//! and its cancellation is a `mycroft.stop` for it. The daemon's bus face
//! runs the call through its pipeline as any bus call, with this face as
//! its `source`.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;
use tokio::sync::{mpsc, oneshot, watch};

use super::catalog::Catalog;
use crate::bus::envelope::{leading_type, Message, Object};
use crate::protocol::topics::{LIST, PERSONA_CALL, STOP};
use crate::shutdown::Shutdown;

/// The `source` of every message this face sends: the audit log's `source`.
pub const SOURCE: &str = "toolboxd-mcp";

/// How often the catalog is asked for, to tell when it changed.
const POLL: Duration = Duration::from_secs(2);

/// How long a listing may take before the last known catalog is used.
const LIST_WAIT: Duration = Duration::from_secs(2);

/// Why a call has no answer from the bus.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum RelayError {
    #[error(
        "toolboxd mcp is not connected to the bus at {url} (it retries); is the messagebus \
         running? The call was not sent"
    )]
    NotConnected { url: String },
    #[error(
        "no answer from the bus within {secs} s (toolboxd mcp --call-timeout); is toolboxd \
         running on the bus?"
    )]
    NoAnswer { secs: u64 },
    #[error("the connection to the bus was lost while the call ran; it may or may not have run")]
    Lost,
    #[error("the call was cancelled")]
    Cancelled,
}

/// What waits for an answer from the bus, by the session or mark it sent.
#[derive(Default)]
struct Waiting {
    /// Calls in flight: their answer, and where their progress goes.
    calls: HashMap<String, CallWaiter>,
    /// Listings in flight: their `tools`.
    lists: HashMap<String, oneshot::Sender<Vec<Value>>>,
}

/// One call in flight.
struct CallWaiter {
    /// Its answer's data.
    answer: oneshot::Sender<Object>,
    /// Its progress messages' data, the latest only (a bus client may send
    /// any number, forged ones too).
    progress: Option<watch::Sender<Option<Object>>>,
}

/// The bus as the MCP face uses it. Shared by every MCP conversation.
pub struct Relay {
    /// The bus's address, for errors.
    url: String,
    /// Frames to send.
    out: mpsc::UnboundedSender<String>,
    /// Whether the connection is up.
    connected: watch::Receiver<bool>,
    /// The catalog as last read, published to the conversations that tell
    /// their client when it changed.
    catalog: watch::Sender<Arc<Catalog>>,
    /// Calls and listings waiting for their answer.
    waiting: Mutex<Waiting>,
    /// This process's part of every session and mark it sends.
    prefix: String,
    /// Numbers sessions and marks.
    next: AtomicU64,
    /// The longest a call waits for its answer.
    call_wait: Duration,
}

impl Relay {
    /// Connects to the bus at `url` (retrying in the background until
    /// `shutdown`) and keeps the catalog; calls wait at most `call_wait`.
    pub fn start(url: String, call_wait: Duration, shutdown: Shutdown) -> Arc<Relay> {
        let (out, outgoing) = mpsc::unbounded_channel();
        let (connected_tx, connected) = watch::channel(false);
        let relay = Arc::new(Relay {
            url: url.clone(),
            out,
            connected,
            catalog: watch::channel(Arc::new(Catalog::default())).0,
            waiting: Mutex::default(),
            prefix: format!("{SOURCE}-{}", std::process::id()),
            next: AtomicU64::new(0),
            call_wait,
        });
        let reader = relay.clone();
        tokio::spawn(crate::bus::client::run(
            url,
            None,
            outgoing,
            move |frame, _| reader.on_frame(frame),
            connected_tx,
            shutdown.clone(),
        ));
        tokio::spawn(relay.clone().keep_catalog(shutdown));
        relay
    }

    fn waiting(&self) -> std::sync::MutexGuard<'_, Waiting> {
        // Map code only under this lock: a panic cannot leave it half done.
        self.waiting.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A session or mark no other message of this process carries.
    fn fresh(&self) -> String {
        format!(
            "{}-{}",
            self.prefix,
            self.next.fetch_add(1, Ordering::Relaxed)
        )
    }

    /// A frame from the bus: an answer or progress for a call of ours, or
    /// a listing of ours; everything else is not read past its type.
    fn on_frame(&self, frame: &str) {
        let ours = |topic: &str| [CALL_ANSWER, CALL_PROGRESS, LIST_ANSWER].contains(&topic);
        if leading_type(frame).is_some_and(|topic| !ours(topic)) {
            return;
        }
        let Ok(message) = Message::decode(frame) else {
            return;
        };
        match message.msg_type.as_str() {
            LIST_ANSWER => self.on_listing(message),
            CALL_ANSWER | CALL_PROGRESS => self.on_call_news(message),
            _ => {}
        }
    }

    /// An answer to a listing: to the listing that sent its mark.
    fn on_listing(&self, message: Message) {
        let Some(mark) = message.context.get(MARK).and_then(Value::as_str) else {
            return;
        };
        if let Some(waiter) = self.waiting().lists.remove(mark) {
            let tools = match message.data.get("tools") {
                Some(Value::Array(tools)) => tools.clone(),
                _ => Vec::new(),
            };
            let _ = waiter.send(tools);
        }
    }

    /// An answer to a call, or its progress: to the call of its session.
    fn on_call_news(&self, message: Message) {
        let Some(session) = message
            .context
            .get("session")
            .and_then(|s| s.get("session_id"))
            .and_then(Value::as_str)
        else {
            return;
        };
        let mut waiting = self.waiting();
        if message.msg_type == CALL_ANSWER {
            if let Some(waiter) = waiting.calls.remove(session) {
                let _ = waiter.answer.send(message.data);
            }
        } else if let Some(progress) = waiting.calls.get(session).and_then(|w| w.progress.as_ref())
        {
            progress.send_replace(Some(message.data));
        }
    }

    /// Sends `message` from this face.
    fn send(&self, mut message: Message) {
        message.context.insert("source".into(), SOURCE.into());
        message
            .context
            .insert("destination".into(), "toolboxd".into());
        let _ = self.out.send(message.encode());
    }

    /// The catalog as last read.
    pub fn catalog(&self) -> Arc<Catalog> {
        self.catalog.borrow().clone()
    }

    /// Changes of the catalog, as they are found.
    pub fn changes(&self) -> watch::Receiver<Arc<Catalog>> {
        self.catalog.subscribe()
    }

    /// Reads the catalog again (within [`LIST_WAIT`]; the last one known
    /// when the bus does not answer in time) and publishes it if it changed.
    pub async fn refresh(&self) -> Arc<Catalog> {
        // Just started, or reconnecting: the connection may be a moment away.
        let mut connected = self.connected.clone();
        let up = tokio::time::timeout(LIST_WAIT, connected.wait_for(|up| *up))
            .await
            .is_ok_and(|up| up.is_ok());
        if !up {
            return self.catalog();
        }
        let mark = self.fresh();
        let (tx, rx) = oneshot::channel();
        self.waiting().lists.insert(mark.clone(), tx);
        let mut message = Message::new(LIST, Object::new());
        message
            .context
            .insert(MARK.into(), Value::String(mark.clone()));
        self.send(message);
        let tools = tokio::time::timeout(LIST_WAIT, rx).await;
        self.waiting().lists.remove(&mark);
        if let Ok(Ok(tools)) = tools {
            let catalog = Catalog::from_bus(&tools);
            self.catalog.send_if_modified(|current| {
                let changed = **current != catalog;
                if changed {
                    *current = Arc::new(catalog);
                }
                changed
            });
        }
        self.catalog()
    }

    /// Reads the catalog every [`POLL`], and at once whenever the
    /// connection comes back, until `shutdown`.
    async fn keep_catalog(self: Arc<Self>, mut shutdown: Shutdown) {
        let mut connected = self.connected.clone();
        loop {
            self.refresh().await;
            tokio::select! {
                () = tokio::time::sleep(POLL) => {}
                changed = connected.changed() => {
                    if changed.is_err() {
                        return;
                    }
                    if !*connected.borrow_and_update() {
                        // Calls in flight have lost their answer.
                        self.waiting().calls.clear();
                    }
                }
                _ = shutdown.recv() => return,
            }
        }
    }

    /// Calls `name` of `toolbox` with `arguments` on the bus and returns
    /// the answer's data (`result` or `error`); its progress goes to
    /// `progress`. When `cancelled` completes first, the daemon is told to
    /// stop the call and [`RelayError::Cancelled`] returned.
    pub async fn call(
        &self,
        toolbox: &str,
        name: &str,
        arguments: Value,
        progress: Option<watch::Sender<Option<Object>>>,
        cancelled: impl Future<Output = ()>,
    ) -> Result<Object, RelayError> {
        if !*self.connected.borrow() {
            return Err(RelayError::NotConnected {
                url: self.url.clone(),
            });
        }
        let session = self.fresh();
        let (answer, answered) = oneshot::channel();
        self.waiting()
            .calls
            .insert(session.clone(), CallWaiter { answer, progress });
        let mut data = Object::new();
        data.insert("toolbox_id".into(), Value::from(toolbox));
        data.insert("name".into(), Value::from(name));
        data.insert("kwargs".into(), arguments);
        let mut message = Message::new(PERSONA_CALL, data);
        message
            .context
            .insert("session".into(), serde_json::json!({"session_id": session}));
        self.send(message);
        let stop = || {
            let mut stop = Message::new(STOP, Object::new());
            stop.context
                .insert("session".into(), serde_json::json!({"session_id": session}));
            self.send(stop);
        };
        let outcome = tokio::select! {
            answer = tokio::time::timeout(self.call_wait, answered) => match answer {
                Ok(Ok(data)) => Ok(data),
                Ok(Err(_)) => Err(RelayError::Lost),
                Err(_) => {
                    // The client is told there is no answer: the call must
                    // not run after all (a person's late yes included).
                    stop();
                    Err(RelayError::NoAnswer { secs: self.call_wait.as_secs() })
                }
            },
            () = cancelled => {
                stop();
                Err(RelayError::Cancelled)
            }
        };
        self.waiting().calls.remove(&session);
        outcome
    }
}

/// The context key that marks a listing of ours, to pick its answer out of
/// everything the bus broadcasts.
const MARK: &str = "toolboxd_request";

/// The answer to a persona call (`PERSONA_CALL` + `.response`).
const CALL_ANSWER: &str = "ovos.persona.tools.call.response";
/// A persona call's progress (`PERSONA_CALL` + `.progress`).
const CALL_PROGRESS: &str = "ovos.persona.tools.call.progress";
/// The answer to a listing (`LIST` + `.response`).
const LIST_ANSWER: &str = "ovos.tools.list.response";
