//! `toolboxd list` and `toolboxd call`: one request on the bus, one answer.

use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use serde_json::Value;
use tokio_tungstenite::tungstenite::Message as WsMessage;

use crate::bus::client::{self, BusError};
use crate::bus::envelope::{Message, Object};
use crate::bus::tcp;

/// The context key that marks our request, so we pick our own answer out of
/// everything the bus broadcasts.
const MARK: &str = "toolboxd_request";

/// Why a bus request got no answer.
#[derive(Debug, thiserror::Error)]
pub enum RequestError {
    #[error(transparent)]
    Bus(#[from] BusError),
    #[error("bus connection failed: {0}")]
    Io(String),
    #[error("no answer to {topic} within {secs} s; is toolboxd running on this bus{hint}?")]
    NoAnswer {
        topic: String,
        secs: u64,
        hint: String,
    },
}

/// Sends `topic` with `data` on the bus at `url` and returns the data of the
/// first `.response` that carries our mark; each `.progress` message for it
/// meanwhile goes to `on_progress`.
pub async fn request(
    url: &str,
    topic: &str,
    data: Object,
    wait: Duration,
    mut on_progress: impl FnMut(&Object),
) -> Result<Object, RequestError> {
    let mut ws = client::connect(url).await?.ws;
    let mark = format!(
        "{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0)
    );
    let mut message = Message::new(topic, data);
    message
        .context
        .insert("source".into(), "toolboxd-cli".into());
    message
        .context
        .insert("destination".into(), "toolboxd".into());
    message
        .context
        .insert(MARK.into(), Value::String(mark.clone()));
    ws.send(WsMessage::text(message.encode()))
        .await
        .map_err(|e| RequestError::Io(e.to_string()))?;
    let expected = format!("{topic}.response");
    let progress = format!("{topic}.progress");
    let answer = async {
        while let Some(frame) = ws.next().await {
            tcp::quickack(ws.get_ref());
            let frame = frame.map_err(|e| RequestError::Io(e.to_string()))?;
            let WsMessage::Text(text) = frame else {
                continue;
            };
            let Ok(reply) = Message::decode(text.as_str()) else {
                continue;
            };
            if reply.context.get(MARK).and_then(Value::as_str) != Some(&mark) {
                continue;
            }
            if reply.msg_type == expected {
                return Ok(reply.data);
            }
            if reply.msg_type == progress {
                on_progress(&reply.data);
            }
        }
        Err(RequestError::Io("the bus closed the connection".to_owned()))
    };
    let result = tokio::time::timeout(wait, answer).await;
    let _ = ws.close(None).await;
    result.unwrap_or_else(|_| {
        Err(RequestError::NoAnswer {
            topic: topic.to_owned(),
            secs: wait.as_secs(),
            hint: match message.data.get("toolbox_id") {
                Some(Value::String(id)) => format!(" and hosting toolbox '{id}'"),
                _ => String::new(),
            },
        })
    })
}
