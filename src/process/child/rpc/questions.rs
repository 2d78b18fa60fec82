//! A child's questions to the person (MCP `elicitation/create`, docs/protocol.md):
//! where each call in flight that may ask has them go while it runs
//! ([`Questioner`], registered by a [`QuestionWatch`]), and how one the child
//! sends is put to that call's person, or answered `cancel`.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use serde_json::Value;
use tokio::sync::watch;

use super::{Link, RpcHandle};
use crate::mcp;

/// The person's answer to one question of a child, to come: its MCP
/// `ElicitResult`.
pub type Answering = std::pin::Pin<Box<dyn std::future::Future<Output = Value> + Send>>;

/// Where a child's questions to the person (MCP `elicitation/create`) go
/// while a call that may ask is in flight.
#[derive(Clone)]
pub struct Questioner {
    /// The call's session: a question is put to the person only when every
    /// call in flight that may ask is of one session (stdio does not say
    /// which call asks).
    pub session: Option<String>,
    /// Given the request's `params`, the `ElicitResult` to answer with
    /// (`action`, and `content` on accept).
    pub ask: Arc<dyn Fn(Value) -> Answering + Send + Sync>,
}

impl std::fmt::Debug for Questioner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Questioner")
            .field("session", &self.session)
            .finish_non_exhaustive()
    }
}

/// A call's questioner as its child's link keeps it.
pub(super) struct Registered {
    /// Its place, for its removal.
    token: u64,
    /// Where the questions go.
    questioner: Questioner,
    /// Ends (its sender dropped) when the call is over: its questions
    /// still waiting are withdrawn then.
    over: watch::Receiver<()>,
}

/// A call's questioner, registered while it is in flight; dropped, its
/// questions still waiting are withdrawn (answered `cancel`).
pub struct QuestionWatch {
    /// Where it is registered.
    link: Arc<Link>,
    /// Its place there.
    token: u64,
    /// Dropped with the watch: tells its questions the call is over.
    _over: watch::Sender<()>,
}

impl Drop for QuestionWatch {
    fn drop(&mut self) {
        self.link
            .questioners
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|r| r.token != self.token);
    }
}

impl RpcHandle {
    /// Registers `questioner` for the child's questions while the returned
    /// watch lives (the call's time on the child).
    pub fn watch_questions(&self, questioner: Questioner) -> QuestionWatch {
        let token = self.link.next_id.fetch_add(1, Ordering::Relaxed);
        let (over_tx, over) = watch::channel(());
        self.link
            .questioners
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(Registered {
                token,
                questioner,
                over,
            });
        QuestionWatch {
            link: self.link.clone(),
            token,
            _over: over_tx,
        }
    }
}

/// A child's question (`elicitation/create`, request `id`): to the person
/// through the latest call in flight that may ask, answered when they have
/// answered (within the question's own deadline); with no such call, a
/// `cancel` at once. The read loop goes on meanwhile.
pub(super) fn ask_the_person(link: &Arc<Link>, id: Value, params: Value) {
    let cancel = || mcp::response_line(&id, Ok(serde_json::json!({"action": "cancel"})));
    let chosen = {
        let registered = link.questioners.lock().unwrap_or_else(|e| e.into_inner());
        let one_session = registered
            .windows(2)
            .all(|w| w[0].questioner.session == w[1].questioner.session);
        registered
            .last()
            .filter(|_| one_session)
            .map(|r| (r.questioner.clone(), r.over.clone()))
    };
    // No call to ask for, or calls of several people in flight: whose
    // question it is cannot be told, so nobody is asked.
    let Some((questioner, mut over)) = chosen else {
        tracing::debug!(toolbox = %link.toolbox, pid = link.pid, "a question with no one call to ask for: cancelled");
        link.send(cancel());
        return;
    };
    let link = link.clone();
    tokio::spawn(async move {
        let result = tokio::select! {
            result = (questioner.ask)(params) => result,
            // The call is over (answered, timed out, stopped): its
            // question is withdrawn from the bus with it.
            _ = over.changed() => serde_json::json!({"action": "cancel"}),
        };
        link.send(mcp::response_line(&id, Ok(result)));
    });
}
