//! A test's own websocket connection to the bus, keeping every frame it
//! receives.

use super::*;

type Ws = WebSocketStream<MaybeTlsStream<TcpStream>>;

/// How long any single expected answer may take before a test fails. Generous,
/// because a loaded 2-core machine can be slow; a test never waits this long
/// when things work, since answers are awaited by matching, not by windows.
pub const ANSWER_DEADLINE: Duration = Duration::from_secs(20);

/// How long a test listens for an answer that must *not* come. Silence can
/// only be shown over a window; every silence check first sends a request that
/// is answered (a sentinel) and checks the whole record, so a late or early
/// wrong answer is seen wherever it arrived.
pub const SILENCE_WINDOW: Duration = Duration::from_millis(700);

/// A test's own connection to the bus. Every frame it receives is kept in
/// `inbox`, so no check can miss an answer because another wait consumed it.
pub struct Bus {
    ws: Ws,
    /// Every decoded message received so far, in arrival order.
    inbox: Vec<Value>,
    /// Messages already handed out by `next`: the index into `inbox`.
    cursor: usize,
}

static MARKS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

/// A fresh unique mark for a request's context.
pub fn mark() -> String {
    format!(
        "m{}",
        MARKS.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    )
}

impl Bus {
    pub async fn connect(url: &str) -> Bus {
        let (ws, _) = tokio::time::timeout(ANSWER_DEADLINE, tokio_tungstenite::connect_async(url))
            .await
            .unwrap_or_else(|_| panic!("connecting to {url} took over {ANSWER_DEADLINE:?}"))
            .expect("connect to bus");
        Bus {
            ws,
            inbox: Vec::new(),
            cursor: 0,
        }
    }

    pub async fn send_raw(&mut self, text: &str) {
        self.ws
            .send(WsMessage::text(text.to_owned()))
            .await
            .unwrap();
    }

    /// Sends {type, data, context}.
    pub async fn send(&mut self, topic: &str, data: Value, context: Value) {
        let frame = json!({"type": topic, "data": data, "context": context});
        self.send_raw(&frame.to_string()).await;
    }

    /// Reads one more message into the inbox; false after `timeout` or when
    /// the connection ended.
    async fn pump(&mut self, timeout: Duration) -> bool {
        let Ok(Some(Ok(frame))) = tokio::time::timeout(timeout, self.ws.next()).await else {
            return false;
        };
        if let WsMessage::Text(text) = frame {
            if let Ok(v) = serde_json::from_str::<Value>(text.as_str()) {
                self.inbox.push(v);
            }
        }
        true
    }

    /// The next message not handed out before, or None after `timeout`.
    /// (It stays in the inbox for later checks.)
    pub async fn next(&mut self, timeout: Duration) -> Option<Value> {
        let end = Instant::now() + timeout;
        while self.cursor >= self.inbox.len() {
            let left = end.checked_duration_since(Instant::now())?;
            if !self.pump(left).await {
                return None;
            }
        }
        self.cursor += 1;
        Some(self.inbox[self.cursor - 1].clone())
    }

    /// The first message (received before or within `timeout`) that `pred`
    /// accepts.
    pub async fn wait_for(
        &mut self,
        timeout: Duration,
        pred: impl Fn(&Value) -> bool,
    ) -> Option<Value> {
        let end = Instant::now() + timeout;
        let mut seen = 0;
        loop {
            if let Some(m) = self.inbox[seen..].iter().find(|m| pred(m)) {
                return Some(m.clone());
            }
            seen = self.inbox.len();
            let left = end.checked_duration_since(Instant::now())?;
            if !self.pump(left).await {
                return None;
            }
        }
    }

    /// Every message received so far (any topic) whose context carries `mark`
    /// and which is an answer (its topic ends in `.response`).
    pub fn answers_marked(&self, mark: &str) -> Vec<Value> {
        self.inbox
            .iter()
            .filter(|m| {
                m["context"]["mark"] == mark
                    && m["type"].as_str().is_some_and(|t| t.ends_with(".response"))
            })
            .cloned()
            .collect()
    }

    /// Every message received so far whose context carries `mark`, any
    /// topic, in arrival order.
    /// The data of the answer to the persona call marked `m`.
    pub async fn persona_answer(&mut self, m: &str, within: Duration) -> Value {
        self.wait_for(within, |msg| {
            msg["type"] == "ovos.persona.tools.call.response" && msg["context"]["mark"] == m
        })
        .await
        .unwrap_or_else(|| panic!("no answer to {m} within {within:?}"))["data"]
            .clone()
    }

    /// Fails the test unless the math example answers `add` (a neighbour
    /// of whatever a test abuses is still served).
    pub async fn assert_math_answers(&mut self) {
        let answer = self.call("math", "add", json!({"a": 1, "b": 1})).await;
        assert_eq!(answer["result"]["result"], 2, "{answer}");
    }

    pub fn marked(&self, mark: &str) -> Vec<Value> {
        self.inbox
            .iter()
            .filter(|m| m["context"]["mark"] == mark)
            .cloned()
            .collect()
    }

    /// Keeps reading for `window`, then returns every message of `topic`
    /// carrying `mark` received since the connection opened.
    pub async fn collect(&mut self, topic: &str, mark: &str, window: Duration) -> Vec<Value> {
        self.listen(window).await;
        self.inbox
            .iter()
            .filter(|m| m["type"] == topic && m["context"]["mark"] == mark)
            .cloned()
            .collect()
    }

    /// Reads everything that arrives for `window` into the inbox.
    pub async fn listen(&mut self, window: Duration) {
        let end = Instant::now() + window;
        while let Some(left) = end.checked_duration_since(Instant::now()) {
            if !self.pump(left).await {
                break;
            }
        }
    }

    /// Waits until `count` messages of `topic` carrying `mark` have arrived
    /// (failing after `ANSWER_DEADLINE`), listens `SILENCE_WINDOW` more for
    /// extra ones, and returns them all: the way to count answers exactly.
    pub async fn expect_answers(&mut self, topic: &str, mark: &str, count: usize) -> Vec<Value> {
        let end = Instant::now() + ANSWER_DEADLINE;
        let matching = |inbox: &[Value]| {
            inbox
                .iter()
                .filter(|m| m["type"] == topic && m["context"]["mark"] == mark)
                .count()
        };
        while matching(&self.inbox) < count {
            let left = end
                .checked_duration_since(Instant::now())
                .unwrap_or_else(|| {
                    panic!(
                        "{} of {count} {topic} answers marked {mark} within {ANSWER_DEADLINE:?}",
                        matching(&self.inbox)
                    )
                });
            assert!(self.pump(left).await, "the bus connection ended");
        }
        self.collect(topic, mark, SILENCE_WINDOW).await
    }

    /// Asserts that no answer carrying any of `marks` arrives: sends a
    /// sentinel request that must be answered (so every frame sent before it
    /// has been read by the daemon), listens `SILENCE_WINDOW` more, then
    /// checks every message received since the connection opened.
    pub async fn assert_silence(&mut self, marks: &[&str]) {
        let r = self.request("ovos.tools.list", json!({})).await;
        assert!(r["data"]["tools"].is_array(), "sentinel: {r}");
        self.listen(SILENCE_WINDOW).await;
        for m in marks {
            let heard = self.answers_marked(m);
            assert!(heard.is_empty(), "expected silence for {m}, got {heard:#?}");
        }
    }

    /// Sends a persona call marked `m`, as a skill in session `s-7` would
    /// (`source`, `destination`, `session` in its context); returns the data
    /// of its one answer, failing the test unless exactly one comes.
    pub async fn call_routed(
        &mut self,
        m: &str,
        toolbox: &str,
        name: &str,
        kwargs: Value,
    ) -> Value {
        let context = json!({"mark": m, "source": "skill-x", "destination": "toolboxd",
                             "session": {"session_id": "s-7"}});
        let data = json!({"toolbox_id": toolbox, "name": name, "kwargs": kwargs});
        self.send("ovos.persona.tools.call", data, context).await;
        let answers = self
            .expect_answers("ovos.persona.tools.call.response", m, 1)
            .await;
        assert_eq!(answers.len(), 1, "one answer: {answers:#?}");
        answers[0]["data"].clone()
    }

    /// The data of the progress messages of a [`Bus::call_routed`] call
    /// marked `m`, failing the test if one came after the answer or is not
    /// routed like it.
    pub fn progress_of(&self, m: &str) -> Vec<Value> {
        let marked = self.marked(m);
        let answer_at = marked
            .iter()
            .position(|msg| msg["type"] == "ovos.persona.tools.call.response")
            .expect("the answer");
        marked
            .iter()
            .enumerate()
            .filter(|(_, msg)| msg["type"] == "ovos.persona.tools.call.progress")
            .map(|(i, msg)| {
                assert!(i < answer_at, "progress after the answer: {marked:#?}");
                assert_eq!(
                    msg["context"],
                    json!({"mark": m, "source": "toolboxd", "destination": "skill-x",
                           "session": {"session_id": "s-7"}}),
                    "routed like the answer"
                );
                msg["data"].clone()
            })
            .collect()
    }

    /// Sends `ovos.persona.tools.discover`, waits for `expected` answers and
    /// a silence window for extra ones: (toolbox_id, tools) of every answer,
    /// sorted by id, duplicates kept.
    pub async fn discover(&mut self, expected: usize) -> Vec<(String, Vec<Value>)> {
        let m = mark();
        self.send("ovos.persona.tools.discover", json!({}), json!({"mark": m}))
            .await;
        let mut answers: Vec<(String, Vec<Value>)> = self
            .expect_answers("ovos.persona.tools.discover.response", &m, expected)
            .await
            .into_iter()
            .map(|a| {
                let id = a["data"]["toolbox_id"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned();
                (
                    id,
                    a["data"]["tools"].as_array().cloned().unwrap_or_default(),
                )
            })
            .collect();
        answers.sort_by(|a, b| a.0.cmp(&b.0));
        answers
    }

    /// `ovos.persona.tools.call` of `name` in `toolbox`: the answer's data.
    pub async fn call(&mut self, toolbox: &str, name: &str, kwargs: Value) -> Value {
        let data = json!({"toolbox_id": toolbox, "name": name, "kwargs": kwargs});
        self.request("ovos.persona.tools.call", data).await["data"].clone()
    }

    /// The toolbox of every tool `ovos.tools.list` lists, in its order.
    pub async fn listed_owners(&mut self) -> Vec<String> {
        let r = self.request("ovos.tools.list", json!({})).await;
        r["data"]["tools"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["toolbox_id"].as_str().unwrap().to_owned())
            .collect()
    }

    /// Sends a request marked uniquely and returns the first matching
    /// response; fails the test after `ANSWER_DEADLINE`.
    pub async fn request(&mut self, topic: &str, data: Value) -> Value {
        self.request_within(topic, data, ANSWER_DEADLINE)
            .await
            .unwrap_or_else(|| panic!("no answer to {topic} within {ANSWER_DEADLINE:?}"))
    }

    /// Sends a request marked uniquely; its response, or None after `wait`.
    pub async fn request_within(
        &mut self,
        topic: &str,
        data: Value,
        wait: Duration,
    ) -> Option<Value> {
        let m = mark();
        self.send(topic, data, json!({"mark": m})).await;
        let response = format!("{topic}.response");
        self.wait_for(wait, |msg| {
            msg["type"] == response.as_str() && msg["context"]["mark"] == m.as_str()
        })
        .await
    }
}
