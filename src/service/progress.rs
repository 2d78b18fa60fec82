//! A call's progress on the bus (docs/protocol.md, "Progress"): what a
//! child reports with `notifications/progress` for a call goes to the
//! caller as `<call topic>.progress`, routed like the call's answer. At
//! most one message per [`INTERVAL`] per call; a child that reports faster
//! has its reports coalesced (the latest wins), so it cannot flood the bus.
//! Nothing is sent once the call is answered.

use std::convert::Infallible;
use std::future::Future;
use std::time::Duration;

use serde_json::Value;
use tokio::sync::watch;

use super::replies::Replies;
use crate::bus::envelope::{Message, Object};
use crate::mcp::Progress;
use crate::observe::Observer;
use crate::process::child::ProgressSender;

/// The shortest time between two progress messages of one call.
pub const INTERVAL: Duration = Duration::from_millis(250);

/// The topic suffix of progress messages.
pub const SUFFIX: &str = ".progress";

/// What a call's progress messages say besides the progress.
pub(super) struct About<'a> {
    /// The call's request: the messages are its replies.
    pub request: &'a Message,
    /// The call's topic, which the messages' topic extends with [`SUFFIX`].
    pub topic: &'a str,
    /// The toolbox running the call.
    pub toolbox: &'a str,
    /// The tool called.
    pub tool: &'a str,
    /// Where each message sent is counted (metrics).
    pub observer: &'a Observer,
}

/// Where a call's progress goes (to give the call), and where
/// [`relayed`] reads it.
pub(super) fn channel() -> (ProgressSender, watch::Receiver<Option<Progress>>) {
    watch::channel(None)
}

/// Runs `call`, relaying onto `out` the progress it reports to the sender
/// that goes with `reports`, and returns its output. Nothing is relayed
/// once `call` has finished: its answer comes after its progress.
pub(super) async fn relayed<F: Future>(
    out: &Replies,
    about: About<'_>,
    mut reports: watch::Receiver<Option<Progress>>,
    call: F,
) -> F::Output {
    let relay = async {
        // Ends when the call drops its sender; then only the call is waited for.
        while reports.changed().await.is_ok() {
            let Some(progress) = reports.borrow_and_update().clone() else {
                continue;
            };
            emit(out, &about, progress);
            tokio::time::sleep(INTERVAL).await;
        }
        std::future::pending::<Infallible>().await
    };
    tokio::select! {
        biased;
        output = call => output,
        never = relay => match never {},
    }
}

/// Sends one progress message: every progress message toolboxd sends on
/// the bus passes here.
fn emit(out: &Replies, about: &About<'_>, progress: Progress) {
    let mut data = Object::new();
    data.insert("toolbox_id".to_owned(), Value::from(about.toolbox));
    data.insert("name".to_owned(), Value::from(about.tool));
    data.insert("progress".to_owned(), Value::Number(progress.progress));
    if let Some(total) = progress.total {
        data.insert("total".to_owned(), Value::Number(total));
    }
    if let Some(message) = progress.message {
        data.insert("message".to_owned(), Value::String(message));
    }
    let reply = about
        .request
        .reply(format!("{}{SUFFIX}", about.topic), data);
    out.send(reply.encode());
    about.observer.progress_relayed(about.toolbox, about.tool);
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use tokio::sync::mpsc;

    fn report(n: u64) -> Option<Progress> {
        Some(Progress {
            progress: n.into(),
            total: Some(10.into()),
            message: None,
        })
    }

    #[tokio::test]
    async fn coalesces_to_one_message_per_interval_and_stops_with_the_call() {
        let (out, mut frames) = mpsc::unbounded_channel::<String>();
        let out = Replies::new(out);
        let context = json!({"source": "skill", "destination": "toolboxd",
                             "session": {"session_id": "s1"}});
        let request = Message {
            msg_type: "ovos.tools.invoke".into(),
            data: Object::new(),
            context: context.as_object().unwrap().clone(),
        };
        let about = About {
            request: &request,
            topic: "ovos.tools.invoke",
            toolbox: "math",
            tool: "add",
            observer: &Observer::default(),
        };
        let (sender, reports) = channel();
        let (seen_tx, mut seen) = mpsc::unbounded_channel::<Value>();
        // The call: reports, waits until the first message went out, floods,
        // waits for the coalesced one, reports once more and ends at once.
        let call = async move {
            sender.send_replace(report(1));
            let first = seen.recv().await.unwrap();
            let first_at = tokio::time::Instant::now();
            for n in 2..=100 {
                sender.send_replace(report(n));
            }
            let second = seen.recv().await.unwrap();
            let waited = first_at.elapsed();
            sender.send_replace(report(101));
            (first, second, waited)
        };
        let watcher = tokio::spawn(async move {
            let mut sent = 0;
            while let Some(frame) = frames.recv().await {
                sent += 1;
                let _ = seen_tx.send(serde_json::from_str::<Value>(&frame).unwrap());
            }
            sent
        });
        let (first, second, waited) =
            tokio::time::timeout(Duration::from_secs(5), relayed(&out, about, reports, call))
                .await
                .expect("the call ends");
        assert_eq!(
            first,
            json!({"type": "ovos.tools.invoke.progress",
                   "data": {"toolbox_id": "math", "name": "add", "progress": 1, "total": 10},
                   "context": {"source": "toolboxd", "destination": "skill",
                               "session": {"session_id": "s1"}}})
        );
        // The flood: only the latest went out, an interval after the first.
        assert_eq!(second["data"]["progress"], 100);
        assert!(waited >= INTERVAL - Duration::from_millis(5), "{waited:?}");
        // The report made as the call ended was never sent.
        drop(out);
        assert_eq!(watcher.await.unwrap(), 2);
    }
}
