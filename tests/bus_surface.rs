//! Every OVOS-TOOLS-1 topic (docs/protocol.md), over a real websocket bus, against a
//! real daemon with real child processes.

mod common;

use std::time::{Duration, Instant};

use common::{
    fixture_manifest, math_manifest, text_manifest, Bus, Daemon, TempDir, ANSWER_DEADLINE,
    SILENCE_WINDOW,
};
use serde_json::{json, Value};

fn two_toolboxes() -> (TempDir, Daemon) {
    let dir = TempDir::new("surface");
    dir.write("math.toml", &math_manifest("math"));
    dir.write("text.toml", &text_manifest("text"));
    let daemon = Daemon::start(dir.path());
    (dir, daemon)
}

#[tokio::test]
async fn discover_answers_once_per_toolbox_with_tool_definitions() {
    let (_dir, daemon) = two_toolboxes();
    let mut bus = Bus::connect(&daemon.url).await;
    let answers = bus.discover(2).await;
    let ids: Vec<&str> = answers.iter().map(|(id, _)| id.as_str()).collect();
    assert_eq!(ids, ["math", "text"], "{answers:#?}");
    let tools = &answers[0].1;
    let names: Vec<&str> = tools.iter().map(|t| t["name"].as_str().unwrap()).collect();
    // math lists its tools two per page: all four prove nextCursor is followed.
    assert_eq!(names, ["add", "echo", "sqrt", "sleep"]);
    let add = &tools[0];
    for key in [
        "name",
        "description",
        "argument_schema",
        "output_schema",
        "toolbox_id",
    ] {
        assert!(add.get(key).is_some(), "tool definition lacks {key}: {add}");
    }
    assert_eq!(add["toolbox_id"], "math");
    assert_eq!(add["argument_schema"]["required"], json!(["a", "b"]));
    assert_eq!(
        add["output_schema"]["properties"]["result"]["type"],
        "integer"
    );
    // echo has no outputSchema: it gets the generic {content, is_error, raw}.
    assert_eq!(tools[1]["output_schema"]["title"], "AdapterToolOutput");
}

#[tokio::test]
async fn persona_call_answers_exactly_once() {
    let (_dir, daemon) = two_toolboxes();
    let mut bus = Bus::connect(&daemon.url).await;
    bus.send(
        "ovos.persona.tools.call",
        json!({"toolbox_id": "math", "name": "add", "kwargs": {"a": 2, "b": 3}}),
        json!({"mark": "c1"}),
    )
    .await;
    let answers = bus
        .expect_answers("ovos.persona.tools.call.response", "c1", 1)
        .await;
    assert_eq!(answers.len(), 1, "{answers:#?}");
    assert_eq!(
        answers[0]["data"],
        json!({"toolbox_id": "math", "result": {"result": 5}})
    );

    // The bash toolbox, legacy era, through the same topic.
    let r = bus
        .request(
            "ovos.persona.tools.call",
            json!({"toolbox_id": "text", "name": "shout", "kwargs": {"text": "hi"}}),
        )
        .await;
    assert_eq!(
        r["data"],
        json!({"toolbox_id": "text", "result": {"text": "HI"}})
    );
}

#[tokio::test]
async fn persona_call_for_a_toolbox_not_hosted_or_none_gets_no_answer() {
    let (_dir, daemon) = two_toolboxes();
    let mut bus = Bus::connect(&daemon.url).await;
    bus.send(
        "ovos.persona.tools.call",
        json!({"toolbox_id": "nobody", "name": "add", "kwargs": {}}),
        json!({"mark": "n1"}),
    )
    .await;
    bus.send(
        "ovos.persona.tools.call",
        json!({"name": "add", "kwargs": {"a": 1, "b": 1}}),
        json!({"mark": "n2"}),
    )
    .await;
    bus.send(
        "ovos.persona.tools.call",
        json!({"toolbox_id": "MATH", "name": "add"}),
        json!({"mark": "n3"}),
    )
    .await;
    bus.send(
        "ovos.persona.tools.nobody.call",
        json!({"name": "add"}),
        json!({"mark": "n4"}),
    )
    .await;
    // No answer on any topic, before or after a sentinel request is answered.
    bus.assert_silence(&["n1", "n2", "n3", "n4"]).await;
    // ...and the daemon is alive and answering.
    let r = bus
        .request(
            "ovos.persona.tools.call",
            json!({"toolbox_id": "math", "name": "add", "kwargs": {"a": 1, "b": 1}}),
        )
        .await;
    assert_eq!(r["data"]["result"]["result"], 2);
}

#[tokio::test]
async fn persona_call_errors_are_plain_words() {
    let (_dir, daemon) = two_toolboxes();
    let mut bus = Bus::connect(&daemon.url).await;
    let call =
        |name: Value, kwargs: Value| json!({"toolbox_id": "math", "name": name, "kwargs": kwargs});
    let r = bus
        .request("ovos.persona.tools.call", call(json!("nope"), json!({})))
        .await;
    assert_eq!(
        r["data"],
        json!({"toolbox_id": "math", "error": "ValueError: Unknown tool 'nope' for ToolBox 'math'."})
    );
    let r = bus
        .request("ovos.persona.tools.call", json!({"toolbox_id": "math"}))
        .await;
    assert_eq!(r["data"]["error"], "Missing required field: 'name'");
    let r = bus
        .request(
            "ovos.persona.tools.call",
            call(json!("add"), json!({"a": 1, "b": "x"})),
        )
        .await;
    assert_eq!(
        r["data"]["error"],
        "ValueError: Tool input validation failed for 'add' in ToolBox 'math': /b: \"x\" is not of type \"integer\""
    );
    assert!(r["data"].get("result").is_none());
    let r = bus
        .request(
            "ovos.persona.tools.call",
            call(json!("sqrt"), json!({"number": -4})),
        )
        .await;
    assert_eq!(
        r["data"]["error"],
        "ValueError: cannot take the square root of -4"
    );
    // kwargs absent means {}: the schema then names what is missing.
    let r = bus
        .request(
            "ovos.persona.tools.call",
            json!({"toolbox_id": "math", "name": "add"}),
        )
        .await;
    let e = r["data"]["error"].as_str().unwrap();
    assert!(
        e.starts_with("ValueError: Tool input validation failed for 'add' in ToolBox 'math': /: "),
        "{e}"
    );
    assert!(e.contains("\"a\" is a required property"), "{e}");
}

#[tokio::test]
async fn predecessor_topic_takes_the_toolbox_from_the_topic() {
    let (_dir, daemon) = two_toolboxes();
    let mut bus = Bus::connect(&daemon.url).await;
    bus.send(
        "ovos.persona.tools.math.call",
        json!({"name": "add", "kwargs": {"a": 20, "b": 22}, "toolbox_id": "text"}),
        json!({"mark": "p1"}),
    )
    .await;
    let answers = bus
        .expect_answers("ovos.persona.tools.math.call.response", "p1", 1)
        .await;
    assert_eq!(answers.len(), 1, "{answers:#?}");
    assert_eq!(
        answers[0]["data"],
        json!({"toolbox_id": "math", "result": {"result": 42}})
    );
}

#[tokio::test]
async fn tool_service_list_get_invoke_reload() {
    let (_dir, daemon) = two_toolboxes();
    let mut bus = Bus::connect(&daemon.url).await;

    let r = bus.request("ovos.tools.list", json!({})).await;
    let tools = r["data"]["tools"].as_array().unwrap();
    let mut names: Vec<&str> = tools.iter().map(|t| t["name"].as_str().unwrap()).collect();
    names.sort();
    assert_eq!(
        names,
        ["add", "echo", "shout", "sleep", "sqrt", "word_count"]
    );

    let r = bus
        .request("ovos.tools.get", json!({"name": "word_count"}))
        .await;
    assert_eq!(r["data"]["toolbox_id"], "text");
    assert_eq!(r["data"]["name"], "word_count");
    assert!(r["data"]["argument_schema"].is_object() && r["data"]["output_schema"].is_object());
    let r = bus
        .request("ovos.tools.get", json!({"name": "nonexistent"}))
        .await;
    assert_eq!(r["data"], json!({"error": "Unknown tool: 'nonexistent'"}));
    let r = bus.request("ovos.tools.get", json!({})).await;
    assert_eq!(
        r["data"],
        json!({"error": "Missing required field: 'name'"})
    );

    let r = bus
        .request(
            "ovos.tools.invoke",
            json!({"name": "add", "args": {"a": 3, "b": 4}}),
        )
        .await;
    assert_eq!(r["data"], json!({"name": "add", "result": {"result": 7}}));
    let r = bus
        .request(
            "ovos.tools.invoke",
            json!({"name": "echo", "args": {"text": "hello"}}),
        )
        .await;
    assert_eq!(r["data"]["result"]["content"], "hello");
    assert_eq!(r["data"]["result"]["is_error"], false);
    assert_eq!(
        r["data"]["result"]["raw"],
        json!([{"type": "text", "text": "hello"}])
    );
    let r = bus
        .request(
            "ovos.tools.invoke",
            json!({"name": "word_count", "args": {"text": "one two three"}}),
        )
        .await;
    assert_eq!(
        r["data"],
        json!({"name": "word_count", "result": {"words": 3}})
    );
    let r = bus
        .request("ovos.tools.invoke", json!({"name": "nope", "args": {}}))
        .await;
    assert_eq!(
        r["data"],
        json!({"name": "nope", "error": "Unknown tool: 'nope'"})
    );
    let r = bus.request("ovos.tools.invoke", json!({"args": {}})).await;
    assert_eq!(
        r["data"],
        json!({"name": "", "error": "Missing required field: 'name'"})
    );
    let r = bus
        .request(
            "ovos.tools.invoke",
            json!({"name": "sqrt", "args": {"number": -1}}),
        )
        .await;
    assert_eq!(
        r["data"],
        json!({"name": "sqrt", "error": "ValueError: cannot take the square root of -1"})
    );

    let r = bus.request("ovos.tools.reload", json!({})).await;
    let mut loaded: Vec<&str> = r["data"]["loaded"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    loaded.sort();
    assert_eq!(loaded, ["math", "text"]);
    assert_eq!(r["data"]["total_tools"], 6);
    assert_eq!(r["data"]["tools"].as_array().unwrap().len(), 6);
    assert!(r["data"].get("errors").is_none(), "{}", r["data"]);
}

#[tokio::test]
async fn a_name_two_toolboxes_own_is_an_error_on_the_flat_namespace() {
    let dir = TempDir::new("dup");
    dir.write("math.toml", &math_manifest("math"));
    dir.write("fixture.toml", &fixture_manifest("fixture", ""));
    let daemon = Daemon::start(dir.path());
    let mut bus = Bus::connect(&daemon.url).await;
    for (topic, data) in [
        (
            "ovos.tools.invoke",
            json!({"name": "add", "args": {"a": 1, "b": 2}}),
        ),
        ("ovos.tools.get", json!({"name": "add"})),
    ] {
        let r = bus.request(topic, data).await;
        let e = r["data"]["error"]
            .as_str()
            .unwrap_or_else(|| panic!("{topic}: {r}"));
        assert!(e.contains("'fixture'") && e.contains("'math'"), "{e}");
        assert!(e.contains("ovos.persona.tools.call"), "{e}");
    }
    // Each toolbox is still reachable by its id.
    for id in ["math", "fixture"] {
        let r = bus
            .request(
                "ovos.persona.tools.call",
                json!({"toolbox_id": id, "name": "add", "kwargs": {"a": 1, "b": 2}}),
            )
            .await;
        assert_eq!(
            r["data"],
            json!({"toolbox_id": id, "result": {"result": 3}})
        );
    }
}

#[tokio::test]
async fn invalid_arguments_never_reach_the_child() {
    let dir = TempDir::writable("record");
    let record = dir.path().join("received.jsonl");
    dir.write(
        "fixture.toml",
        &fixture_manifest(
            "fixture",
            &format!(
                "env = {{ MCP_TOOLBOX_RECORD = \"{}\" }}\n[sandbox]\nread_write = [\"{}\"]",
                record.display(),
                dir.path().display()
            ),
        ),
    );
    let daemon = Daemon::start(dir.path());
    let mut bus = Bus::connect(&daemon.url).await;
    for args in [
        json!({"a": 1, "b": "x"}),
        json!({"a": 1}),
        json!({"a": 1, "b": 2, "c": 3}),
        json!([1, 2]),
    ] {
        let r = bus
            .request(
                "ovos.persona.tools.call",
                json!({"toolbox_id": "fixture", "name": "add", "kwargs": args}),
            )
            .await;
        let e = r["data"]["error"].as_str().unwrap();
        assert!(
            e.starts_with(
                "ValueError: Tool input validation failed for 'add' in ToolBox 'fixture': "
            ),
            "{e}"
        );
    }
    // A valid call afterwards reaches it, so the record is live.
    let r = bus
        .request(
            "ovos.tools.invoke",
            json!({"name": "add", "args": {"a": 5, "b": 6}}),
        )
        .await;
    assert_eq!(r["data"]["result"]["result"], 11);
    let received = std::fs::read_to_string(&record).unwrap();
    let calls: Vec<Value> = received
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|m| m["method"] == "tools/call")
        .collect();
    assert_eq!(calls.len(), 1, "the child saw: {received}");
    assert_eq!(calls[0]["params"]["arguments"], json!({"a": 5, "b": 6}));
}

#[tokio::test]
async fn an_output_that_fails_its_schema_is_an_error() {
    let dir = TempDir::new("badout");
    dir.write("fixture.toml", &fixture_manifest("fixture", ""));
    let daemon = Daemon::start(dir.path());
    let mut bus = Bus::connect(&daemon.url).await;
    let r = bus
        .request("ovos.tools.invoke", json!({"name": "bad_output"}))
        .await;
    assert!(r["data"].get("result").is_none(), "{r}");
    let e = r["data"]["error"].as_str().unwrap();
    assert_eq!(
        e,
        "ValueError: Tool output validation failed for 'bad_output' in ToolBox 'fixture': /result: \"not a number\" is not of type \"integer\""
    );
}

#[tokio::test]
async fn responses_swap_routing_and_carry_session_and_foreign_keys() {
    let (_dir, daemon) = two_toolboxes();
    let mut bus = Bus::connect(&daemon.url).await;
    let context = json!({
        "mark": "ctx1", "source": "skill-x", "destination": ["toolboxd", "other"],
        "session": {"session_id": "abc", "lang": "pt-PT"}, "x-trace": {"span": [1, 2]}
    });
    bus.send(
        "ovos.tools.invoke",
        json!({"name": "add", "args": {"a": 1, "b": 1}}),
        context.clone(),
    )
    .await;
    let answers = bus
        .expect_answers("ovos.tools.invoke.response", "ctx1", 1)
        .await;
    assert_eq!(answers.len(), 1);
    let got = &answers[0]["context"];
    assert_eq!(got["source"], "toolboxd");
    assert_eq!(got["destination"], "skill-x");
    assert_eq!(got["session"], context["session"]);
    assert_eq!(got["x-trace"], context["x-trace"]);
    assert_eq!(
        got.as_object().unwrap().len(),
        context.as_object().unwrap().len(),
        "nothing added: {got}"
    );

    // Only a source: the answer goes back to it.
    bus.send(
        "ovos.tools.list",
        json!({}),
        json!({"mark": "ctx2", "source": "A"}),
    )
    .await;
    let answers = bus
        .expect_answers("ovos.tools.list.response", "ctx2", 1)
        .await;
    assert_eq!(
        answers[0]["context"],
        json!({"mark": "ctx2", "source": "A", "destination": "A"})
    );
    // No routing keys at all: none are invented, no session is injected.
    bus.send("ovos.tools.list", json!({}), json!({"mark": "ctx3"}))
        .await;
    let answers = bus
        .expect_answers("ovos.tools.list.response", "ctx3", 1)
        .await;
    assert_eq!(answers[0]["context"], json!({"mark": "ctx3"}));
}

#[tokio::test]
async fn malformed_frames_are_dropped_and_the_connection_stays_up() {
    let (_dir, daemon) = two_toolboxes();
    let mut bus = Bus::connect(&daemon.url).await;
    for frame in [
        "not json at all",
        "[1, 2, 3]",
        "\"a string\"",
        r#"{"data": {"name": "add"}}"#,
        r#"{"type": "", "data": {}}"#,
        r#"{"type": 7}"#,
        r#"{"type": "ovos.tools.list", "data": [1], "context": {"mark": "bad1"}}"#,
        r#"{"type": "ovos.tools.invoke", "data": "add", "context": {"mark": "bad2"}}"#,
        r#"{"type": "ovos.tools.list", "data": {}, "context": "nope"}"#,
        r#"{"type": "ovos.tools.list", "data": {}, "context": [{"mark": "bad3"}]}"#,
    ] {
        bus.send_raw(frame).await;
    }
    let r = bus
        .request(
            "ovos.tools.invoke",
            json!({"name": "add", "args": {"a": 40, "b": 2}}),
        )
        .await;
    assert_eq!(r["data"]["result"]["result"], 42);
    // The malformed requests were not answered, on any topic.
    bus.assert_silence(&["bad1", "bad2", "bad3"]).await;
    // A well-formed request with the same shape is answered (so silence above
    // is the frame's fault, not the topic's).
    bus.send("ovos.tools.list", json!({}), json!({"mark": "good"}))
        .await;
    assert_eq!(
        bus.expect_answers("ovos.tools.list.response", "good", 1)
            .await
            .len(),
        1
    );
    let dropped = daemon.log_lines_with("dropped a malformed bus frame");
    assert!(dropped.len() >= 8, "{} drops logged", dropped.len());
}

#[tokio::test]
async fn two_hundred_concurrent_invokes_over_several_connections_are_each_answered_once() {
    let (_dir, daemon) = two_toolboxes();
    let mut tasks = Vec::new();
    for conn in 0..4u64 {
        let url = daemon.url.clone();
        tasks.push(tokio::spawn(async move {
            let mut bus = Bus::connect(&url).await;
            for i in 0..50u64 {
                let data = json!({"name": "add", "args": {"a": conn * 1000 + i, "b": 1}});
                bus.send(
                    "ovos.tools.invoke",
                    data,
                    json!({"mark": format!("c{conn}-{i}")}),
                )
                .await;
            }
            // Wait (by matching, under one deadline) until every call has an
            // answer, then listen a while longer for duplicates.
            let prefix = format!("c{conn}-");
            let mut answered = std::collections::HashSet::new();
            while answered.len() < 50 {
                let m = bus.next(ANSWER_DEADLINE).await.unwrap_or_else(|| {
                    panic!("connection {conn}: {} of 50 answered", answered.len())
                });
                if m["type"] == "ovos.tools.invoke.response" {
                    if let Some(mark) = m["context"]["mark"].as_str() {
                        if mark.starts_with(&prefix) {
                            answered.insert(mark.to_owned());
                        }
                    }
                }
            }
            bus.listen(SILENCE_WINDOW).await;
            let seen: std::collections::HashMap<String, Vec<Value>> = (0..50)
                .map(|i| {
                    let mark = format!("{prefix}{i}");
                    let answers = bus.answers_marked(&mark);
                    (
                        mark,
                        answers.into_iter().map(|m| m["data"].clone()).collect(),
                    )
                })
                .collect();
            (conn, seen)
        }));
    }
    let mut total = 0;
    for task in tasks {
        let (conn, seen) = task.await.unwrap();
        assert_eq!(
            seen.len(),
            50,
            "connection {conn} got {} distinct answers",
            seen.len()
        );
        for (mark, answers) in seen {
            assert_eq!(answers.len(), 1, "{mark} answered {} times", answers.len());
            let i: u64 = mark.rsplit('-').next().unwrap().parse().unwrap();
            assert_eq!(
                answers[0]["result"]["result"],
                conn * 1000 + i + 1,
                "{mark}"
            );
            total += 1;
        }
    }
    assert_eq!(total, 200);
}

#[tokio::test]
async fn a_slow_call_does_not_delay_a_fast_one() {
    let (_dir, daemon) = two_toolboxes();
    let mut bus = Bus::connect(&daemon.url).await;
    let started = Instant::now();
    bus.send(
        "ovos.tools.invoke",
        json!({"name": "sleep", "args": {"seconds": 2}}),
        json!({"mark": "slow"}),
    )
    .await;
    bus.send(
        "ovos.tools.invoke",
        json!({"name": "add", "args": {"a": 1, "b": 2}}),
        json!({"mark": "fast"}),
    )
    .await;
    let mut fast_at = None;
    let mut slow_at = None;
    while slow_at.is_none() {
        let m = bus.next(ANSWER_DEADLINE).await.expect("answers");
        if m["type"] != "ovos.tools.invoke.response" {
            continue;
        }
        match m["context"]["mark"].as_str() {
            Some("fast") => {
                assert!(slow_at.is_none(), "fast answered after slow");
                assert_eq!(m["data"]["result"]["result"], 3);
                fast_at = Some(started.elapsed());
            }
            Some("slow") => slow_at = Some(started.elapsed()),
            _ => {}
        }
    }
    let fast_at = fast_at.expect("fast call answered");
    assert!(
        fast_at < Duration::from_secs(1),
        "fast call took {fast_at:?}"
    );
    assert!(slow_at.unwrap() >= Duration::from_secs(2));
}

#[tokio::test]
async fn a_call_to_a_toolbox_still_starting_is_answered_within_one_call_timeout() {
    // The toolbox takes 1.5 s to start, and its tool 1.5 s to answer: with
    // one deadline of 2 s from the call's arrival, start-up wait included,
    // the caller gets a TimeoutError after 2 s (not a result after 3 s).
    let (_bus, port) = common::start_bus(0);
    let url = format!("ws://127.0.0.1:{port}/core");
    let dir = TempDir::new("slow-start");
    dir.write(
        "slow.toml",
        &format!(
            "id = \"slow\"\ncommand = \"sh\"\nargs = [\"-c\", \"sleep 1.5; exec python3 {}\"]\n\
             [limits]\ncall_timeout_s = 2\n\
             [sandbox]\nprofile = \"off\"\n",
            // Off: the interpreter is found by the shell, out of the
            // sandbox's sight (this test is about deadlines).
            common::repo("tests/fixtures/fixture_toolbox.py")
        ),
    );
    let daemon = Daemon::start_until(
        &["--manifests", dir.path().to_str().unwrap(), "--bus", &url],
        &[],
        "taking calls",
    );
    let mut bus = Bus::connect(&url).await;
    let sent = Instant::now();
    let r = bus
        .call("slow", "slow_whoami", json!({"seconds": 1.5}))
        .await;
    let took = sent.elapsed();
    assert_eq!(
        r["error"], "TimeoutError: tool 'slow_whoami' in toolbox 'slow' did not answer within 2 s",
        "{r}"
    );
    assert!(
        took >= Duration::from_millis(1900) && took < Duration::from_millis(2800),
        "answered after {took:?}"
    );
    // Once started, the same call within its deadline gets its result.
    let r = bus
        .call("slow", "slow_whoami", json!({"seconds": 0.1}))
        .await;
    assert!(r["result"]["pid"].is_u64(), "{r}");
    drop(daemon);
}
