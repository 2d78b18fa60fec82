//! The bus face, driven in process: frames handed to
//! [`Service::dispatch`] as the bus client would, answers read from its
//! outgoing frame channel, calls served by stand-in toolboxes (a Rust task
//! speaking MCP over in-memory pipes; no Python, no daemon). Endings are
//! read from the metrics the face reports to.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};
use tokio::sync::{mpsc, watch};

use super::*;
use crate::bus::server::Peer;
use crate::manifest::Manifest;
use crate::mcp::ToolSpec;
use crate::observe::metrics::Metrics;
use crate::process::child::stand_in::{self, stand_in, StandIn, StandInReply};
use crate::session::Session;
use crate::tool::ToolSet;
use crate::toolbox::stand_in::StandInToolbox;

/// How long an answer may take to come out.
const SOON: Duration = Duration::from_secs(10);

/// The bus face over stand-in toolboxes.
struct Face {
    /// The face under test.
    service: Arc<Service>,
    /// What it sends on the bus.
    frames: mpsc::UnboundedReceiver<String>,
    /// Its catalog.
    registry: Arc<Registry>,
    /// Where its endings are counted.
    metrics: Arc<Metrics>,
    /// The toolboxes it hosts and their children, kept alive.
    hosted: Vec<(StandInToolbox, StandIn)>,
    /// The operator channel's far end, kept open.
    _operators: crate::operator::Requests,
}

/// A tool of a stand-in toolbox: name, argument schema, output schema.
type ToolOf<'a> = (&'a str, Value, Option<Value>);

impl Face {
    fn new() -> Face {
        let registry = Arc::new(Registry::default());
        let (out, frames) = mpsc::unbounded_channel();
        let (operators, requests) = crate::operator::channel();
        let peers = Arc::new(Peers::new(out.clone(), Duration::from_millis(100)));
        let metrics = Arc::new(Metrics::new(registry.clone(), watch::channel(true).1));
        let observer = Observer::new(Some(metrics.clone()), None);
        let service = Service::new(registry.clone(), out, operators, peers, true, observer);
        Face {
            service,
            frames,
            registry,
            metrics,
            hosted: Vec::new(),
            _operators: requests,
        }
    }

    /// Hosts a ready toolbox: `manifest` (TOML: its `id`, its `[limits]`),
    /// `tools`, its child answering with `answer`. Returns its child.
    fn host(
        &mut self,
        manifest: &str,
        tools: &[ToolOf<'_>],
        answer: impl Fn(&str, &Value) -> StandInReply + Send + Sync + 'static,
    ) -> &StandIn {
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
        let text = format!("command = \"python3\"\n{manifest}\n");
        let manifest = Manifest::parse(&dir.join("standin.toml"), &text).expect("a manifest");
        let max = manifest.limits.max_message_bytes;
        let (rpc, child) = stand_in(&manifest.id, max, Arc::new(answer));
        let toolbox = StandInToolbox::new(&manifest, Session::standing_in(rpc));
        let specs = tools
            .iter()
            .map(|(name, input, output)| ToolSpec {
                name: (*name).to_owned(),
                description: String::new(),
                input_schema: input.clone(),
                output_schema: output.clone(),
                annotations: None,
            })
            .collect();
        let (tools, errors) = ToolSet::compile(&manifest.id, specs);
        assert!(errors.is_empty(), "{errors:?}");
        let id = manifest.id.as_str();
        self.registry
            .insert(id, toolbox.handle.clone(), State::Ready);
        self.registry.set(id, State::Ready, Some(Arc::new(tools)));
        self.registry.admit(id);
        self.hosted.push((toolbox, child));
        &self.hosted[self.hosted.len() - 1].1
    }

    /// A request on `topic` with `data`, in session `s1`, from `from`.
    fn send_from(&self, topic: &str, data: Value, from: Option<Peer>) {
        let frame = json!({"type": topic, "data": data,
                           "context": {"source": "test", "session": {"session_id": "s1"}}});
        self.service.dispatch(&frame.to_string(), from);
    }

    fn send(&self, topic: &str, data: Value) {
        self.send_from(topic, data, None);
    }

    /// The data of the next answer to a request on `topic`.
    async fn answer(&mut self, topic: &str) -> Value {
        let wanted = format!("{topic}.response");
        let next = async {
            loop {
                let frame = self.frames.recv().await.expect("the face is open");
                let frame: Value = serde_json::from_str(&frame).expect("a JSON frame");
                if frame["type"] == wanted.as_str() {
                    return frame["data"].clone();
                }
            }
        };
        tokio::time::timeout(SOON, next)
            .await
            .unwrap_or_else(|_| panic!("no answer on {wanted}"))
    }

    /// `invoke` of `name` with `args`, and its answer.
    async fn invoke(&mut self, name: &str, args: Value) -> Value {
        self.send("ovos.tools.invoke", json!({"name": name, "args": args}));
        self.answer("ovos.tools.invoke").await
    }

    /// A persona call of `name` in `toolbox`, and its answer.
    async fn persona(&mut self, toolbox: &str, name: &str, kwargs: Value) -> Value {
        self.send(
            "ovos.persona.tools.call",
            json!({"toolbox_id": toolbox, "name": name, "kwargs": kwargs}),
        );
        self.answer("ovos.persona.tools.call").await
    }

    /// How many calls ended as `outcome` under these labels.
    fn ended(&self, toolbox: &str, tool: &str, outcome: &str) -> u64 {
        let labels = [
            format!("toolbox=\"{toolbox}\""),
            format!("tool=\"{tool}\""),
            format!("outcome=\"{outcome}\""),
        ];
        self.metrics
            .encode()
            .lines()
            .filter(|l| l.starts_with("toolboxd_calls_total{"))
            .filter(|l| labels.iter().all(|label| l.contains(label.as_str())))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
            .sum()
    }
}

/// `add`: two integers in, their sum out as structured output.
fn add() -> ToolOf<'static> {
    (
        "add",
        json!({"type": "object", "properties": {"a": {"type": "integer"},
               "b": {"type": "integer"}}, "required": ["a", "b"]}),
        Some(
            json!({"type": "object", "properties": {"sum": {"type": "integer"}},
                    "required": ["sum"]}),
        ),
    )
}

/// A tool that takes anything and has no output schema.
fn any(name: &str) -> ToolOf<'_> {
    (name, json!({"type": "object"}), None)
}

/// A result with `structured` as its structured output.
fn structured(structured: Value) -> StandInReply {
    StandInReply {
        after: Duration::ZERO,
        with: Ok(
            json!({"content": [{"type": "text", "text": structured.to_string()}],
                        "structuredContent": structured}),
        ),
    }
}

/// A result with `text`, after `after`.
fn text_after(text: &str, after: Duration) -> StandInReply {
    StandInReply {
        after,
        with: Ok(json!({"content": [{"type": "text", "text": text}]})),
    }
}

/// The sum of `a` and `b`, as `add` answers.
fn sum(_: &str, args: &Value) -> StandInReply {
    let a = args["a"].as_i64().unwrap_or(0);
    let b = args["b"].as_i64().unwrap_or(0);
    structured(json!({"sum": a + b}))
}

#[tokio::test]
async fn a_call_reaches_its_child_and_is_answered_with_its_checked_output() {
    let mut face = Face::new();
    face.host("id = \"math\"", &[add()], sum);
    let answer = face.invoke("add", json!({"a": 2, "b": 3})).await;
    assert_eq!(answer, json!({"name": "add", "result": {"sum": 5}}));
    let answer = face.persona("math", "add", json!({"a": 1, "b": 1})).await;
    assert_eq!(answer, json!({"toolbox_id": "math", "result": {"sum": 2}}));
    assert_eq!(face.ended("math", "add", "ok"), 2);
    assert_eq!(face.hosted[0].1.calls().len(), 2);
}

#[tokio::test]
async fn a_tool_without_output_schema_answers_its_text_and_blocks() {
    let mut face = Face::new();
    face.host("id = \"text\"", &[any("say")], |_, _| {
        text_after("hello", Duration::ZERO)
    });
    let answer = face.invoke("say", json!({})).await;
    assert_eq!(
        answer["result"],
        json!({"content": "hello", "is_error": false,
               "raw": [{"type": "text", "text": "hello"}]})
    );
}

#[tokio::test]
async fn arguments_that_fail_the_schema_never_reach_the_child() {
    let mut face = Face::new();
    face.host("id = \"math\"", &[add()], sum);
    let answer = face.invoke("add", json!({"a": "two", "b": 3})).await;
    let error = answer["error"].as_str().expect("an error");
    assert!(
        error.starts_with(
            "ValueError: Tool input validation failed for 'add' in ToolBox 'math': /a"
        ),
        "{error}"
    );
    assert!(face.hosted[0].1.calls().is_empty());
    assert_eq!(face.ended("math", "add", "invalid"), 1);
    // The toolbox's counters are the child's: it never had the call.
    let stats = face.hosted[0].0.handle.stats();
    assert_eq!(
        stats.calls_err.load(std::sync::atomic::Ordering::Relaxed),
        0
    );
}

#[tokio::test]
async fn arguments_past_max_argument_bytes_are_refused_unread() {
    let mut face = Face::new();
    face.host(
        "id = \"math\"\n[limits]\nmax_argument_bytes = 1024",
        &[any("echo")],
        |_, _| text_after("", Duration::ZERO),
    );
    let answer = face.invoke("echo", json!({"text": "x".repeat(5000)})).await;
    let error = answer["error"].as_str().expect("an error");
    assert!(
        error.contains("more than max_argument_bytes (1024)"),
        "{error}"
    );
    assert!(face.hosted[0].1.calls().is_empty());
    assert_eq!(face.ended("math", "echo", "invalid"), 1);
}

#[tokio::test]
async fn an_output_that_fails_its_schema_is_an_error_never_passed_on() {
    let mut face = Face::new();
    face.host("id = \"math\"", &[add()], |_, _| {
        structured(json!({"sum": "five"}))
    });
    let answer = face.invoke("add", json!({"a": 2, "b": 3})).await;
    let error = answer["error"].as_str().expect("an error");
    assert!(
        error.starts_with(
            "ValueError: Tool output validation failed for 'add' in ToolBox 'math': /sum"
        ),
        "{error}"
    );
    assert!(answer.get("result").is_none());
    assert_eq!(face.ended("math", "add", "error"), 1);
}

#[tokio::test]
async fn an_answer_too_large_for_the_bus_is_replaced_by_an_error_saying_so() {
    let mut face = Face::new();
    let big = "x".repeat(crate::bus::MAX_FRAME_BYTES);
    face.host("id = \"big\"", &[any("big")], move |_, _| {
        text_after(&big, Duration::ZERO)
    });
    let answer = face.invoke("big", json!({})).await;
    let error = answer["error"].as_str().expect("an error");
    assert!(
        error.starts_with("RuntimeError: the answer would be")
            && error.contains("more than the bus's message limit"),
        "{error}"
    );
    assert_eq!(answer["name"], "big");
}

#[tokio::test]
async fn a_toolbox_admits_its_slots_and_queue_and_answers_the_next_call_busy() {
    let mut face = Face::new();
    face.host(
        "id = \"slow\"\n[limits]\nmax_concurrent_calls = 1\nmax_queued_calls = 0",
        &[any("wait")],
        |_, _| text_after("done", Duration::from_millis(300)),
    );
    face.send("ovos.tools.invoke", json!({"name": "wait"}));
    face.send("ovos.tools.invoke", json!({"name": "wait"}));
    let first = face.answer("ovos.tools.invoke").await;
    let error = first["error"]
        .as_str()
        .expect("the second is refused first");
    assert!(
        error.starts_with("RuntimeError: toolbox 'slow' is busy"),
        "{error}"
    );
    let second = face.answer("ovos.tools.invoke").await;
    assert_eq!(second["result"]["content"], "done");
    assert_eq!(face.ended("slow", "wait", "busy"), 1);
    assert_eq!(face.ended("slow", "wait", "ok"), 1);
    assert_eq!(face.hosted[0].1.calls().len(), 1);
}

#[tokio::test]
async fn a_call_past_its_peers_share_of_the_room_is_refused_at_the_door_and_reported() {
    let mut face = Face::new();
    face.host(
        "id = \"box\"\n[limits]\nmax_argument_bytes = 8388608",
        &[any("take")],
        |_, _| text_after("taken", Duration::from_millis(200)),
    );
    let peer = Some(Peer::Uid(4242));
    let large = json!({"name": "take", "args": {"pad": "x".repeat(3 << 20)}});
    face.send_from("ovos.tools.invoke", large, peer);
    // The first holds all its peer may: the next, however small, waits
    // for nothing and is answered busy.
    face.send_from("ovos.tools.invoke", json!({"name": "take"}), peer);
    let refused = face.answer("ovos.tools.invoke").await;
    let error = refused["error"].as_str().expect("refused");
    assert!(
        error.starts_with("RuntimeError: toolboxd is busy for this client")
            && error.contains("uid 4242"),
        "{error}"
    );
    assert_eq!(refused["name"], "take");
    let served = face.answer("ovos.tools.invoke").await;
    assert_eq!(served["result"]["content"], "taken");
    assert_eq!(face.ended("box", "take", "busy"), 1);
    // Another peer is not held back by it.
    face.send_from(
        "ovos.tools.invoke",
        json!({"name": "take"}),
        Some(Peer::Uid(7)),
    );
    assert_eq!(
        face.answer("ovos.tools.invoke").await["result"]["content"],
        "taken"
    );
}

#[tokio::test]
async fn every_ending_before_the_child_is_reported_under_known_names_only() {
    let mut face = Face::new();
    face.host("id = \"math\"", &[add()], sum);
    let unknown = face.invoke("no_such_tool", json!({})).await;
    assert_eq!(unknown["error"], "Unknown tool: 'no_such_tool'");
    assert_eq!(face.ended("", "", "error"), 1);
    let unknown = face.persona("math", "mul", json!({})).await;
    assert_eq!(
        unknown["error"],
        "ValueError: Unknown tool 'mul' for ToolBox 'math'."
    );
    assert_eq!(face.ended("math", "", "error"), 1);
    face.send("ovos.tools.invoke", json!({}));
    let missing = face.answer("ovos.tools.invoke").await;
    assert_eq!(
        missing,
        json!({"name": "", "error": "Missing required field: 'name'"})
    );
    assert_eq!(face.ended("", "", "invalid"), 1);
    assert!(!face.metrics.encode().contains("no_such_tool"));
    assert!(!face.metrics.encode().contains("mul"));

    // A failed toolbox answers at once, with its reason; its tool is named.
    face.registry.set(
        "math",
        State::Failed {
            reason: "spent".into(),
        },
        None,
    );
    let failed = face.persona("math", "add", json!({"a": 1, "b": 2})).await;
    assert_eq!(
        failed["error"],
        "RuntimeError: toolbox 'math' is failed: spent"
    );
    assert_eq!(face.ended("math", "add", "error"), 1);
    assert!(face.hosted[0].1.calls().is_empty());

    // A persona call for a toolbox this daemon does not host: no answer,
    // and nothing reported.
    face.send(
        "ovos.persona.tools.call",
        json!({"toolbox_id": "elsewhere", "name": "add"}),
    );
    face.send("ovos.tools.list", json!({}));
    assert!(face.answer("ovos.tools.list").await["tools"].is_array());
    assert!(face.frames.try_recv().is_err());
    assert!(!face.metrics.encode().contains("elsewhere"));
}

#[tokio::test]
async fn a_request_too_large_for_the_child_is_the_callers_error_not_a_crash() {
    let mut face = Face::new();
    face.host(
        "id = \"small\"\n[limits]\nmax_message_bytes = 1024\nmax_argument_bytes = 1024",
        &[any("echo")],
        |_, _| text_after("", Duration::ZERO),
    );
    let answer = face.invoke("echo", json!({"text": "x".repeat(1000)})).await;
    let error = answer["error"].as_str().expect("an error");
    assert!(
        error.starts_with("ValueError: the call of 'echo' in toolbox 'small' would be a"),
        "{error}"
    );
    assert_eq!(face.ended("small", "echo", "invalid"), 1);
    assert_eq!(face.ended("small", "echo", "crash"), 0);
    assert!(face.hosted[0].1.calls().is_empty());
    // The child serves on.
    let answer = face.invoke("echo", json!({})).await;
    assert_eq!(answer["result"]["content"], "");
}

#[tokio::test]
async fn a_stop_cancels_the_calls_of_its_session_on_the_child() {
    let mut face = Face::new();
    face.host("id = \"slow\"", &[any("wait")], |_, _| {
        text_after("late", Duration::from_secs(30))
    });
    face.send("ovos.tools.invoke", json!({"name": "wait"}));
    let child = &face.hosted[0].1;
    child
        .until("had the call", |seen| !stand_in::calls(seen).is_empty())
        .await;
    face.send("mycroft.stop", json!({}));
    let answer = face.answer("ovos.tools.invoke").await;
    assert_eq!(answer["error"], "CancelledError: call cancelled by stop");
    assert_eq!(face.ended("slow", "wait", "cancelled"), 1);
    let child = &face.hosted[0].1;
    child
        .until("was told to cancel", |seen| {
            stand_in::notifications(seen).contains(&"notifications/cancelled".to_owned())
        })
        .await;
}
