//! Asking the person behind a call (DESIGN §5 "Asking the person";
//! docs/protocol.md): one bus request, `ovos.tools.ask`, both to confirm a
//! call before its child sees it and to relay a child's own question (MCP
//! elicitation), answered on `ovos.tools.ask.response`.
//!
//! A question waits for the first valid answer to its id (unguessable, used
//! once), within its own deadline, and ends early on a stop of its caller's
//! session. Nothing is ever approved by default: no answer is a no. The bus
//! has no authentication, so any local client may answer (docs/security.md).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Map, Value};
use tokio::sync::{mpsc, oneshot};

use crate::bus::envelope::Message;
use crate::cancel::Cancel;
use crate::protocol::topics::ASK;
use crate::util::throttle::{cut, LogBudget};

/// Longest prompt sent, in characters: a sentence to speak, not a page.
pub const MAX_PROMPT_CHARS: usize = 300;
/// Largest schema a child may ask against, serialized.
pub const MAX_SCHEMA_BYTES: usize = 16 * 1024;
/// Questions one toolbox may have waiting for the person at once.
pub const MAX_PENDING_PER_TOOLBOX: usize = 4;
/// Questions waiting at once, every toolbox's together.
const MAX_PENDING: usize = 64;
/// Largest answer frame read.
pub const MAX_ANSWER_BYTES: usize = 64 * 1024;
/// Answers ignored (no such question, malformed) logged per second.
const IGNORED_PER_SECOND: u32 = 5;

/// What is asked.
#[derive(Debug, Clone)]
pub enum Kind {
    /// May the call run?
    Confirm,
    /// A child's question: the answer's `content` must pass `schema`.
    Elicit { schema: Value },
}

/// One question, for the person behind one call.
#[derive(Debug, Clone)]
pub struct Question {
    /// A confirmation or a child's question.
    pub kind: Kind,
    /// The toolbox the call is for.
    pub toolbox: String,
    /// The tool.
    pub tool: String,
    /// What to say (cut to [`MAX_PROMPT_CHARS`]).
    pub prompt: String,
    /// The caller's session id, so OVOS asks the person who spoke.
    pub session: Option<String>,
}

/// Why a question has no yes.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum AskError {
    #[error("the person declined")]
    Declined,
    #[error("the person cancelled")]
    Cancelled,
    #[error("nobody answered within {secs} s")]
    Unanswered { secs: u64 },
    #[error("a stop cancelled it")]
    Stopped,
    #[error("{max} questions of this toolbox wait for the person already")]
    TooMany { max: usize },
    #[error("the question cannot be asked: {0}")]
    Unaskable(String),
}

/// The person's answer to a question, as toolboxd takes it.
#[derive(Debug, Clone, PartialEq)]
enum Reply {
    /// Yes (with the content asked for, for a child's question).
    Accept(Option<Value>),
    Decline,
    Cancel,
}

/// A question waiting for its answer.
struct Pending {
    /// Its toolbox, for the bound on each toolbox's questions.
    toolbox: String,
    /// For a child's question: what its answer's content must pass.
    schema: Option<Arc<jsonschema::Validator>>,
    /// Where the first valid answer goes.
    reply: oneshot::Sender<Reply>,
}

/// Asks the person on the bus, and takes their answers. One per daemon.
pub struct Asker {
    /// Frames for the bus.
    out: mpsc::UnboundedSender<String>,
    /// The questions waiting, by their id.
    pending: Mutex<HashMap<String, Pending>>,
    /// Answers ignored, logged within a rate: any client can send many.
    ignored: Mutex<LogBudget>,
}

impl Asker {
    /// An asker sending its questions on `out`.
    pub fn new(out: mpsc::UnboundedSender<String>) -> Arc<Asker> {
        Arc::new(Asker {
            out,
            pending: Mutex::new(HashMap::new()),
            ignored: Mutex::new(LogBudget::new(IGNORED_PER_SECOND)),
        })
    }

    fn pending(&self) -> std::sync::MutexGuard<'_, HashMap<String, Pending>> {
        // Map changes only under this lock: a panic cannot leave it half done.
        self.pending.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Asks `question` and waits for its answer, at most `wait`, or until
    /// `stop` fires. `Ok` is a yes: for a child's question, with its
    /// content (checked against the schema).
    pub async fn ask(
        &self,
        question: Question,
        wait: Duration,
        stop: &mut Cancel,
    ) -> Result<Option<Value>, AskError> {
        // Room first: a child past its share costs no schema compilation.
        room_for(&self.pending(), &question.toolbox)?;
        let schema = match &question.kind {
            Kind::Confirm => None,
            Kind::Elicit { schema } => Some(Arc::new(askable(schema)?)),
        };
        let id = fresh_id();
        let (reply, answer) = oneshot::channel();
        {
            let mut pending = self.pending();
            room_for(&pending, &question.toolbox)?;
            pending.insert(
                id.clone(),
                Pending {
                    toolbox: question.toolbox.clone(),
                    schema,
                    reply,
                },
            );
        }
        // Whatever ends the wait, the question goes: an answer after it
        // finds nothing to answer.
        let _withdrawn = Withdraw {
            asker: self,
            id: &id,
        };
        let _ = self.out.send(request(&id, &question, wait).encode());
        // The prompt quotes a caller's arguments or a child's words:
        // escaped, so it cannot forge a log line.
        tracing::info!(
            toolbox = %question.toolbox,
            tool = %question.tool,
            kind = kind_name(&question.kind),
            "asking the person: {}",
            crate::util::throttle::escape_controls(&question.prompt)
        );
        let reply = tokio::select! {
            reply = answer => reply.map_err(|_| AskError::Stopped)?,
            () = tokio::time::sleep(wait) => {
                return Err(AskError::Unanswered { secs: wait.as_secs() })
            }
            () = stop.fired() => return Err(AskError::Stopped),
        };
        match reply {
            Reply::Accept(content) => Ok(content),
            Reply::Decline => Err(AskError::Declined),
            Reply::Cancel => Err(AskError::Cancelled),
        }
    }

    /// An `ovos.tools.ask.response` frame: the answer to the question it
    /// names, if that question waits and the answer is valid (else ignored,
    /// and the question waits on).
    pub fn answer(&self, frame: &str) {
        if let Err(why) = self.take_answer(frame) {
            let mut budget = self.ignored.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(dropped) = budget.take() {
                let why = crate::util::throttle::escape_controls(&why).into_owned();
                tracing::info!(
                    dropped,
                    "an answer on ovos.tools.ask.response ignored: {why}"
                );
            }
        }
    }

    fn take_answer(&self, frame: &str) -> Result<(), String> {
        if frame.len() > MAX_ANSWER_BYTES {
            return Err(format!(
                "{} bytes, more than {MAX_ANSWER_BYTES}",
                frame.len()
            ));
        }
        let message = Message::decode(frame).map_err(|e| e.to_string())?;
        let data = &message.data;
        let id = data
            .get("ask_id")
            .and_then(Value::as_str)
            .ok_or("no ask_id")?;
        let reply = match data.get("action").and_then(Value::as_str) {
            Some("accept") => Reply::Accept(data.get("content").cloned()),
            Some("decline") => Reply::Decline,
            Some("cancel") => Reply::Cancel,
            _ => return Err("action is not accept, decline or cancel".into()),
        };
        let mut pending = self.pending();
        let question = pending
            .get(id)
            .ok_or_else(|| format!("no question {:?} waits", cut(id, 80)))?;
        // A child's question: the content must pass its schema, or the
        // answer is not valid and the question waits on.
        if let (Reply::Accept(content), Some(schema)) = (&reply, &question.schema) {
            let content = content.as_ref().filter(|c| c.is_object()).ok_or(
                "an accepted answer to a child's question must carry its content, an object",
            )?;
            if let Some(error) = schema.iter_errors(content).next() {
                return Err(format!("its content fails the schema: {error}"));
            }
        }
        let reply = match (reply, &question.schema) {
            // A confirmation's yes carries nothing on.
            (Reply::Accept(_), None) => Reply::Accept(None),
            (reply, _) => reply,
        };
        if let Some(question) = pending.remove(id) {
            let _ = question.reply.send(reply);
        }
        Ok(())
    }
}

/// Whether one more question of `toolbox` may wait.
fn room_for(pending: &HashMap<String, Pending>, toolbox: &str) -> Result<(), AskError> {
    let mine = pending.values().filter(|p| p.toolbox == toolbox).count();
    if mine >= MAX_PENDING_PER_TOOLBOX {
        return Err(AskError::TooMany {
            max: MAX_PENDING_PER_TOOLBOX,
        });
    }
    if pending.len() >= MAX_PENDING {
        return Err(AskError::TooMany { max: MAX_PENDING });
    }
    Ok(())
}

/// Removes a question when its wait ends, however it ends.
struct Withdraw<'a> {
    asker: &'a Asker,
    id: &'a str,
}

impl Drop for Withdraw<'_> {
    fn drop(&mut self) {
        self.asker.pending().remove(self.id);
    }
}

/// The `ovos.tools.ask` request for `question`, numbered `id`.
fn request(id: &str, question: &Question, wait: Duration) -> Message {
    let mut data = Map::new();
    data.insert("ask_id".into(), id.into());
    data.insert("kind".into(), kind_name(&question.kind).into());
    data.insert("toolbox_id".into(), question.toolbox.as_str().into());
    data.insert("name".into(), question.tool.as_str().into());
    data.insert("prompt".into(), short(&question.prompt).into());
    data.insert("timeout_s".into(), wait.as_secs().into());
    if let Kind::Elicit { schema } = &question.kind {
        data.insert("schema".into(), schema.clone());
    }
    let mut message = Message::new(ASK, data);
    message.context.insert("source".into(), "toolboxd".into());
    if let Some(session) = &question.session {
        message
            .context
            .insert("session".into(), json!({ "session_id": session }));
    }
    message
}

fn kind_name(kind: &Kind) -> &'static str {
    match kind {
        Kind::Confirm => "confirm",
        Kind::Elicit { .. } => "elicit",
    }
}

/// `prompt` cut to [`MAX_PROMPT_CHARS`] characters (an ellipsis says so).
pub fn short(prompt: &str) -> String {
    match prompt.char_indices().nth(MAX_PROMPT_CHARS - 1) {
        Some((end, _)) => format!("{}…", &prompt[..end]),
        None => prompt.to_owned(),
    }
}

/// The schema of a child's question, compiled, if it can be asked: an
/// object schema of at most [`MAX_SCHEMA_BYTES`].
fn askable(schema: &Value) -> Result<jsonschema::Validator, AskError> {
    let bytes = serde_json::to_string(schema).map_or(usize::MAX, |s| s.len());
    if bytes > MAX_SCHEMA_BYTES {
        return Err(AskError::Unaskable(format!(
            "its schema is {bytes} bytes, more than {MAX_SCHEMA_BYTES}"
        )));
    }
    if schema.get("type").and_then(Value::as_str) != Some("object") {
        return Err(AskError::Unaskable(
            "its schema is not an object schema".into(),
        ));
    }
    crate::tool::validator(schema).map_err(|e| AskError::Unaskable(format!("its schema {e}")))
}

/// The prompt of a confirmation: the tool (its title, when it has one),
/// its toolbox, and the arguments it would run with, speakable.
pub fn confirm_prompt(title: &str, toolbox: &str, arguments: &Value) -> String {
    let (title, toolbox) = (speakable(title), speakable(toolbox));
    let said: Vec<String> = match arguments.as_object() {
        Some(arguments) => arguments
            .iter()
            .map(|(key, value)| {
                let value = match value {
                    Value::String(s) => speakable(s),
                    other => speakable(&other.to_string()),
                };
                format!("{} {value}", speakable(key))
            })
            .collect(),
        None => Vec::new(),
    };
    let with = if said.is_empty() {
        String::new()
    } else {
        format!(" with {}", said.join(", "))
    };
    let prompt = format!("May I run {title} from {toolbox}{with}?");
    if prompt.chars().count() <= MAX_PROMPT_CHARS {
        return prompt;
    }
    // Every argument is said, whole, or the person is told they are not:
    // a yes to half a call is no yes (a value padded past what is read, a
    // decoy argument first).
    let count = match said.len() {
        1 => "an argument".to_owned(),
        n => format!("{n} arguments"),
    };
    short(&format!(
        "May I run {title} from {toolbox} with {count} too long to read out? Say no unless \
         you expected this."
    ))
}

/// `text` as it is said: runs of white space (padding that would hide
/// what follows) made one space, control characters dropped.
fn speakable(text: &str) -> String {
    text.split_whitespace()
        .map(|word| word.chars().filter(|c| !c.is_control()).collect::<String>())
        .collect::<Vec<_>>()
        .join(" ")
}

/// The question a child's `elicitation/create` `params` ask, during a call
/// of `tool` in `toolbox` by `session`: its `message` is the prompt, its
/// `requestedSchema` the schema (form mode; a URL it would open is no
/// question for a voice).
pub fn elicitation(
    params: &Value,
    toolbox: &str,
    tool: &str,
    session: Option<String>,
) -> Result<Question, AskError> {
    if params
        .get("mode")
        .and_then(Value::as_str)
        .is_some_and(|m| m != "form")
    {
        return Err(AskError::Unaskable(
            "only form questions can be asked (not a URL to open)".into(),
        ));
    }
    let prompt = params
        .get("message")
        .and_then(Value::as_str)
        .filter(|m| !m.trim().is_empty())
        .ok_or_else(|| AskError::Unaskable("it has no message to say".into()))?;
    let schema = params
        .get("requestedSchema")
        .cloned()
        .ok_or_else(|| AskError::Unaskable("it has no requestedSchema".into()))?;
    Ok(Question {
        kind: Kind::Elicit { schema },
        toolbox: toolbox.to_owned(),
        tool: tool.to_owned(),
        prompt: short(prompt),
        session,
    })
}

/// The MCP `ElicitResult` a child is answered with: `accept` with the
/// person's content, `decline` for their no (and for a question that
/// cannot be asked), `cancel` for anything else (silence, a stop, too
/// many questions).
pub fn elicit_result(answer: Result<Option<Value>, AskError>) -> Value {
    match answer {
        Ok(content) => json!({"action": "accept", "content": content.unwrap_or_else(|| json!({}))}),
        Err(AskError::Declined) => json!({"action": "decline"}),
        Err(AskError::Unaskable(why)) => {
            // Within a rate, escaped: a child may ask any number.
            static BUDGET: Mutex<Option<LogBudget>> = Mutex::new(None);
            let mut budget = BUDGET.lock().unwrap_or_else(|e| e.into_inner());
            let budget = budget.get_or_insert_with(|| LogBudget::new(IGNORED_PER_SECOND));
            if budget.take().is_some() {
                let why = crate::util::throttle::escape_controls(&why).into_owned();
                tracing::info!("a child's question declined: {why}");
            }
            json!({"action": "decline"})
        }
        Err(_) => json!({"action": "cancel"}),
    }
}

/// 128 random bits, as hex: an id nobody can guess.
fn fresh_id() -> String {
    let mut bytes = [0u8; 16];
    let mut filled = 0;
    while filled < bytes.len() {
        // SAFETY: writes at most the rest of `bytes`, which is ours.
        let n = unsafe {
            libc::getrandom(bytes[filled..].as_mut_ptr().cast(), bytes.len() - filled, 0)
        };
        if n > 0 {
            filled += n as usize;
        } else if std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted {
            // No kernel randomness (a kernel before 3.17): the clock and a
            // counter, mixed, still unique; such kernels have no Landlock
            // either and are warned about.
            static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos());
            let n = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            return format!("{now:x}{n:x}{:x}", std::process::id());
        }
    }
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn question(kind: Kind, toolbox: &str) -> Question {
        Question {
            kind,
            toolbox: toolbox.into(),
            tool: "unlock".into(),
            prompt: "May I?".into(),
            session: Some("s1".into()),
        }
    }

    /// The id of the next question the asker sends.
    async fn sent(rx: &mut mpsc::UnboundedReceiver<String>) -> (String, Value) {
        let frame = rx.recv().await.unwrap();
        let message: Value = serde_json::from_str(&frame).unwrap();
        (
            message["data"]["ask_id"].as_str().unwrap().to_owned(),
            message,
        )
    }

    fn answer(id: &str, action: &str, content: Option<Value>) -> String {
        let mut data = json!({"ask_id": id, "action": action});
        if let Some(content) = content {
            data["content"] = content;
        }
        json!({"type": "ovos.tools.ask.response", "data": data, "context": {}}).to_string()
    }

    #[tokio::test]
    async fn the_first_valid_answer_decides_and_cannot_be_replayed() {
        let (tx, mut rx) = mpsc::unbounded_channel();
        let asker = Asker::new(tx);
        let waiting = {
            let asker = asker.clone();
            tokio::spawn(async move {
                let q = question(Kind::Confirm, "home");
                asker
                    .ask(q, Duration::from_secs(10), &mut Cancel::never())
                    .await
            })
        };
        let (id, message) = sent(&mut rx).await;
        assert_eq!(id.len(), 32, "128 bits");
        assert_eq!(message["type"], "ovos.tools.ask");
        assert_eq!(message["context"]["session"]["session_id"], "s1");
        assert_eq!(message["data"]["kind"], "confirm");
        // Another id, a malformed action: nothing.
        asker.answer(&answer("0123", "accept", None));
        asker.answer(&answer(&id, "maybe", None));
        asker.answer(&answer(&id, "decline", None));
        asker.answer(&answer(&id, "accept", None));
        assert_eq!(waiting.await.unwrap(), Err(AskError::Declined));
        assert!(asker.pending().is_empty());
    }

    #[tokio::test]
    async fn silence_is_a_no_and_a_stop_ends_the_wait() {
        let (tx, _rx) = mpsc::unbounded_channel();
        let asker = Asker::new(tx);
        let q = question(Kind::Confirm, "home");
        let r = asker
            .ask(q, Duration::from_millis(50), &mut Cancel::never())
            .await;
        assert_eq!(r, Err(AskError::Unanswered { secs: 0 }));
        assert!(asker.pending().is_empty());
    }

    #[tokio::test]
    async fn a_childs_question_takes_only_content_that_passes_its_schema() {
        let (tx, mut rx) = mpsc::unbounded_channel();
        let asker = Asker::new(tx);
        let schema = json!({"type": "object", "properties": {"n": {"type": "integer"}},
                            "required": ["n"]});
        let waiting = {
            let asker = asker.clone();
            tokio::spawn(async move {
                let q = question(Kind::Elicit { schema }, "calc");
                asker
                    .ask(q, Duration::from_secs(10), &mut Cancel::never())
                    .await
            })
        };
        let (id, message) = sent(&mut rx).await;
        assert_eq!(message["data"]["schema"]["required"], json!(["n"]));
        asker.answer(&answer(&id, "accept", Some(json!({"n": "three"}))));
        asker.answer(&answer(&id, "accept", None));
        asker.answer(&answer(&id, "accept", Some(json!({"n": 3}))));
        assert_eq!(waiting.await.unwrap(), Ok(Some(json!({"n": 3}))));
        // Unaskable schemas are refused before anything is sent.
        let q = question(
            Kind::Elicit {
                schema: json!({"type": "string"}),
            },
            "calc",
        );
        let r = asker
            .ask(q, Duration::from_secs(1), &mut Cancel::never())
            .await;
        assert!(matches!(r, Err(AskError::Unaskable(_))), "{r:?}");
    }

    #[tokio::test]
    async fn one_toolbox_may_have_only_a_few_questions_waiting() {
        let (tx, _rx) = mpsc::unbounded_channel();
        let asker = Asker::new(tx);
        let mut waiting = Vec::new();
        for _ in 0..MAX_PENDING_PER_TOOLBOX {
            let asker = asker.clone();
            waiting.push(tokio::spawn(async move {
                let q = question(Kind::Confirm, "flood");
                asker
                    .ask(q, Duration::from_secs(5), &mut Cancel::never())
                    .await
            }));
        }
        while asker.pending().len() < MAX_PENDING_PER_TOOLBOX {
            tokio::task::yield_now().await;
        }
        let q = question(Kind::Confirm, "flood");
        let r = asker
            .ask(q, Duration::from_secs(5), &mut Cancel::never())
            .await;
        assert_eq!(
            r,
            Err(AskError::TooMany {
                max: MAX_PENDING_PER_TOOLBOX
            })
        );
        // Another toolbox still may.
        let q = question(Kind::Confirm, "other");
        let r = asker
            .ask(q, Duration::from_millis(10), &mut Cancel::never())
            .await;
        assert_eq!(r, Err(AskError::Unanswered { secs: 0 }));
        for w in waiting {
            w.abort();
        }
    }

    #[test]
    fn a_prompt_says_every_argument_whole_or_says_it_cannot() {
        let p = confirm_prompt("Unlock the door", "home", &json!({"door": "front"}));
        assert_eq!(p, "May I run Unlock the door from home with door front?");
        // Padding cannot push the rest out of what is said.
        let padded = format!("ls{}; rm -rf ~", " ".repeat(58));
        let p = confirm_prompt("Shell", "sh", &json!({"command": padded}));
        assert_eq!(p, "May I run Shell from sh with command ls ; rm -rf ~?");
        // Decoys first: every argument is said, or none is and the person
        // is told why.
        let p = confirm_prompt(
            "Shell",
            "sh",
            &json!({"a": 1, "b": 2, "c": 3, "d": 4, "z": "rm"}),
        );
        assert!(p.ends_with("with a 1, b 2, c 3, d 4, z rm?"), "{p}");
        let long = confirm_prompt("x", "home", &json!({"text": "y".repeat(5000)}));
        assert!(long.chars().count() <= MAX_PROMPT_CHARS, "{long}");
        assert!(
            long.contains("with an argument too long to read out"),
            "{long}"
        );
        assert_eq!(short(&"z".repeat(1000)).chars().count(), MAX_PROMPT_CHARS);
    }
}
