//! Asking the person (DESIGN §5 "Asking the person", docs/protocol.md): a
//! call under `confirm` waits for a yes on `ovos.tools.ask`, and its child
//! never sees it without one. A stand-in asker on the real bus answers; the
//! child's own log (its state directory, read from outside) says what ran.

mod common;

use common::{mark, repo, Bus, Daemon, TempDir};
use serde_json::{json, Value};

/// The faulty fixture (its `record` tool appends to calls.log in its state
/// directory) as toolbox `id`, with `extra` TOML.
fn recorder(id: &str, extra: &str) -> String {
    format!(
        "id = \"{id}\"\ncommand = \"python3\"\nargs = [\"{}\"]\n{extra}\n",
        repo("tests/fixtures/faulty_toolbox.py")
    )
}

/// What toolbox `id`'s child recorded, from outside.
fn recorded(id: &str) -> String {
    let log = common::root().join(format!("target/test-state/{id}/state/calls.log"));
    std::fs::read_to_string(log).unwrap_or_default()
}

/// Sends a persona call of `record` with `text` to `toolbox`, in session
/// `session`, marked `m`.
async fn call(bus: &mut Bus, m: &str, toolbox: &str, text: &str, session: &str) {
    let context = json!({"mark": m, "source": "skill-x", "session": {"session_id": session}});
    let data = json!({"toolbox_id": toolbox, "name": "record", "kwargs": {"text": text}});
    bus.send("ovos.persona.tools.call", data, context).await;
}

/// The question on the bus for `toolbox` whose prompt mentions `text`.
async fn question(asker: &mut Bus, toolbox: &str, text: &str) -> Value {
    asker
        .wait_for(common::ANSWER_DEADLINE, |m| {
            m["type"] == "ovos.tools.ask"
                && m["data"]["toolbox_id"] == toolbox
                && m["data"]["prompt"]
                    .as_str()
                    .is_some_and(|p| p.contains(text))
        })
        .await
        .unwrap_or_else(|| panic!("no question for {toolbox} about {text}"))
}

/// The question on the bus for the person of `session`.
async fn question_in(asker: &mut Bus, session: &str) -> Value {
    asker
        .wait_for(common::ANSWER_DEADLINE, |m| {
            m["type"] == "ovos.tools.ask" && m["context"]["session"]["session_id"] == session
        })
        .await
        .unwrap_or_else(|| panic!("no question for {session}"))
}

/// Accepts question `ask_id` with `content`.
async fn accept(asker: &mut Bus, ask_id: &str, content: Value) {
    asker
        .send(
            "ovos.tools.ask.response",
            json!({"ask_id": ask_id, "action": "accept", "content": content}),
            json!({}),
        )
        .await;
}

async fn answer(asker: &mut Bus, ask_id: &str, action: &str) {
    asker
        .send(
            "ovos.tools.ask.response",
            json!({"ask_id": ask_id, "action": action}),
            json!({}),
        )
        .await;
}

/// An id no earlier run used (its state directory is kept).
fn unique(tag: &str) -> String {
    format!("{tag}-{}-{}", std::process::id(), mark())
}

#[tokio::test]
async fn a_call_under_confirm_runs_only_after_a_yes() {
    let id = unique("door");
    let dir = TempDir::new("asking");
    dir.write(
        "door.toml",
        &recorder(&id, "confirm = [\"rec*\"]\nask_timeout_s = 20\n"),
    );
    let short = unique("short");
    dir.write(
        "short.toml",
        &recorder(
            &short,
            "confirm = \"destructive\"\nask_timeout_s = 1\n\
             [annotations.record]\ndestructiveHint = true\n",
        ),
    );
    let daemon = Daemon::start(dir.path());
    let mut caller = Bus::connect(&daemon.url).await;
    let mut asker = Bus::connect(&daemon.url).await;
    let mut second_asker = Bus::connect(&daemon.url).await;

    // Held, then run after a yes.
    let m = mark();
    call(&mut caller, &m, &id, "approved", "s-door").await;
    let q = question(&mut asker, &id, "approved").await;
    assert_eq!(q["data"]["kind"], "confirm");
    assert_eq!(q["data"]["name"], "record");
    assert_eq!(q["context"]["session"]["session_id"], "s-door");
    let prompt = q["data"]["prompt"].as_str().unwrap();
    assert!(
        prompt.contains("record") && prompt.contains("approved"),
        "{prompt}"
    );
    let ask_id = q["data"]["ask_id"].as_str().unwrap().to_owned();
    assert_eq!(ask_id.len(), 32, "{ask_id}");
    assert_eq!(recorded(&id), "", "the child saw the call before the yes");
    answer(&mut asker, &ask_id, "accept").await;
    let r = caller.persona_answer(&m, common::ANSWER_DEADLINE).await;
    assert_eq!(r["result"], json!({"recorded": "approved"}), "{r}");
    assert_eq!(recorded(&id), "approved\n");

    // A no: a clear error, and the child never ran it. Two askers answer:
    // the first answer to arrive decides.
    let m = mark();
    call(&mut caller, &m, &id, "declined", "s-door").await;
    let q = question(&mut asker, &id, "declined").await;
    let next_id = q["data"]["ask_id"].as_str().unwrap().to_owned();
    assert_ne!(next_id, ask_id, "an id is used once");
    // A replayed yes (the last question's id) and a forged one change nothing.
    answer(&mut asker, &ask_id, "accept").await;
    answer(&mut asker, &"0".repeat(32), "accept").await;
    answer(&mut asker, &next_id, "decline").await;
    let r = caller.persona_answer(&m, common::ANSWER_DEADLINE).await;
    // The second asker's yes, after the no was taken, changes nothing.
    answer(&mut second_asker, &next_id, "accept").await;
    assert_eq!(
        r["error"],
        format!("PermissionError: the person declined the call of 'record' in toolbox '{id}'; it was not run"),
        "{r}"
    );

    // A stop of the caller's session while it waits.
    let m = mark();
    call(&mut caller, &m, &id, "stopped", "s-stop").await;
    question(&mut asker, &id, "stopped").await;
    caller
        .send(
            "mycroft.stop",
            json!({}),
            json!({"session": {"session_id": "s-stop"}}),
        )
        .await;
    let r = caller.persona_answer(&m, common::ANSWER_DEADLINE).await;
    let error = r["error"].as_str().unwrap_or_default();
    assert!(
        error.starts_with("CancelledError: call cancelled by stop before the person confirmed it"),
        "{r}"
    );

    // Nobody answers: a no, after ask_timeout_s.
    let m = mark();
    call(&mut caller, &m, &short, "unanswered", "s-short").await;
    let r = caller.persona_answer(&m, common::ANSWER_DEADLINE).await;
    let error = r["error"].as_str().unwrap_or_default();
    assert!(
        error.starts_with(&format!(
            "TimeoutError: nobody confirmed the call of 'record' in toolbox '{short}' within 1 s"
        )),
        "{r}"
    );

    // Only the approved call ever reached a child.
    assert_eq!(recorded(&id), "approved\n");
    assert_eq!(recorded(&short), "");
    // The toolboxes' other calls are served meanwhile, unasked: a tool
    // not named (or not annotated destructive) needs no yes.
    for toolbox in [&id, &short] {
        let r = caller.call(toolbox, "whoami", json!({})).await;
        assert!(r["error"].is_null(), "{r}");
    }
    let questions = asker
        .wait_for(std::time::Duration::ZERO, |m| {
            m["type"] == "ovos.tools.ask" && m["data"]["name"] == "whoami"
        })
        .await;
    assert_eq!(questions, None);
}

#[tokio::test]
async fn a_childs_question_reaches_the_person_and_their_answer_the_child() {
    // @modelcontextprotocol/server-everything asks for a form of fields
    // (elicitation/create) only of a client that declares elicitation: its
    // manifest allows it. The person's answer comes back in its result.
    let server = common::root().join("tests/node/node_modules/.bin/mcp-server-everything");
    let dir = TempDir::new("asking-elicit");
    dir.write(
        "everything.toml",
        &format!(
            "id = \"everything\"\ncommand = \"{}\"\nargs = [\"stdio\"]\nelicitation = true\n\
             ask_timeout_s = 20\n",
            server.display()
        ),
    );
    let daemon = Daemon::start(dir.path());
    let mut caller = Bus::connect(&daemon.url).await;
    let mut asker = Bus::connect(&daemon.url).await;

    let ask = |m: &str, session: &str| {
        let context = json!({"mark": m, "session": {"session_id": session}});
        let data = json!({"toolbox_id": "everything", "name": "trigger-elicitation-request",
                          "kwargs": {}});
        (data, context)
    };
    let m = mark();
    let (data, context) = ask(&m, "s-form");
    caller.send("ovos.persona.tools.call", data, context).await;
    let q = question_in(&mut asker, "s-form").await;
    assert_eq!(q["data"]["kind"], "elicit", "{q}");
    assert_eq!(q["data"]["toolbox_id"], "everything");
    assert_eq!(q["data"]["name"], "trigger-elicitation-request");
    assert_eq!(
        q["data"]["prompt"],
        "Please provide inputs for the following fields:"
    );
    assert_eq!(q["data"]["schema"]["required"], json!(["name"]), "{q}");
    let ask_id = q["data"]["ask_id"].as_str().unwrap().to_owned();
    // Content that fails the schema is no answer: the question waits on.
    for content in [json!({"name": 7}), json!({"integer": 5}), json!("Ada")] {
        accept(&mut asker, &ask_id, content).await;
    }
    let content = json!({"name": "Ada Lovelace", "integer": 7});
    accept(&mut asker, &ask_id, content).await;
    let r = caller.persona_answer(&m, common::ANSWER_DEADLINE).await;
    let text = r["result"]["content"].as_str().unwrap_or_default();
    assert!(text.contains("- Name: Ada Lovelace"), "{r}");
    assert!(text.contains("- Favorite Integer: 7"), "{r}");

    // A no reaches it as a decline.
    let m = mark();
    let (data, context) = ask(&m, "s-no");
    caller.send("ovos.persona.tools.call", data, context).await;
    let q = question_in(&mut asker, "s-no").await;
    answer(&mut asker, q["data"]["ask_id"].as_str().unwrap(), "decline").await;
    let r = caller.persona_answer(&m, common::ANSWER_DEADLINE).await;
    let text = r["result"]["content"].as_str().unwrap_or_default();
    assert!(text.contains("User declined"), "{r}");
}

/// The raw asking fixture (tests/fixtures/asking_toolbox.py, a legacy
/// server whose `ask_many` asks any number of questions) as toolbox `id`,
/// allowed to ask, with `extra` TOML; its daemon, a caller and an asker.
async fn asking_fixture(id: &str, extra: &str) -> (TempDir, Daemon, Bus, Bus) {
    let dir = TempDir::new(id);
    dir.write(
        "asking.toml",
        &format!(
            "id = \"{id}\"\ncommand = \"python3\"\nargs = [\"{}\"]\nelicitation = true\n\
             protocol = \"2025-06-18\"\n{extra}\n",
            repo("tests/fixtures/asking_toolbox.py")
        ),
    );
    let daemon = Daemon::start(dir.path());
    let caller = Bus::connect(&daemon.url).await;
    let asker = Bus::connect(&daemon.url).await;
    (dir, daemon, caller, asker)
}

/// The ids of the distinct questions `pred` accepts, up to `at_most`,
/// until none new comes within `quiet`.
async fn distinct_questions(
    asker: &mut Bus,
    pred: impl Fn(&Value) -> bool,
    at_most: usize,
    quiet: std::time::Duration,
) -> std::collections::HashSet<String> {
    let mut asked = std::collections::HashSet::new();
    while asked.len() < at_most {
        let id = |q: &Value| q["data"]["ask_id"].as_str().unwrap_or("").to_owned();
        let next = asker
            .wait_for(quiet, |q| {
                q["type"] == "ovos.tools.ask" && pred(q) && !asked.contains(&id(q))
            })
            .await;
        match next {
            Some(q) => asked.insert(id(&q)),
            None => break,
        };
    }
    asked
}

/// Calls `ask_many` of toolbox `flood` with `kwargs`; the call's mark.
async fn ask_many(caller: &mut Bus, kwargs: Value) -> String {
    let m = mark();
    let data = json!({"toolbox_id": "flood", "name": "ask_many", "kwargs": kwargs});
    caller
        .send("ovos.persona.tools.call", data, json!({"mark": m}))
        .await;
    m
}

#[tokio::test]
async fn a_flood_of_questions_is_bounded_and_the_toolbox_serves_on() {
    // A child asks twenty questions at once, then one with a 10,000-byte
    // message, then one with a 20 KiB schema: at most four reach the bus,
    // the rest are answered `cancel` at once, the long message is cut, the
    // huge schema declined unasked; its other calls are served meanwhile.
    let (_dir, _daemon, mut caller, mut asker) = asking_fixture("flood", "ask_timeout_s = 3").await;

    let m = ask_many(&mut caller, json!({"n": 20})).await;
    // The questions that got through, while the call waits on them: four.
    let flood = |q: &Value| q["data"]["toolbox_id"] == "flood";
    let asked = distinct_questions(&mut asker, flood, 20, std::time::Duration::from_secs(2)).await;
    assert_eq!(
        asked.len(),
        4,
        "only four of a toolbox's questions wait at once"
    );
    // Its other calls are served meanwhile.
    let r = caller
        .call("flood", "echo", json!({"text": "still here"}))
        .await;
    assert_eq!(r["result"], json!({"echo": "still here"}), "{r}");
    // Unanswered, the four end as `cancel` too, after ask_timeout_s.
    let r = caller.persona_answer(&m, common::ANSWER_DEADLINE).await;
    assert_eq!(r["result"], json!({"cancel": 20}), "{r}");

    // A long message is cut; a huge schema is declined without asking.
    let m = ask_many(&mut caller, json!({"n": 1, "message_bytes": 10000})).await;
    let q = asker
        .wait_for(common::ANSWER_DEADLINE, |q| {
            q["type"] == "ovos.tools.ask"
                && q["data"]["prompt"]
                    .as_str()
                    .is_some_and(|p| p.ends_with('…'))
        })
        .await
        .expect("the long question, cut");
    assert!(
        q["data"]["prompt"].as_str().unwrap().chars().count() <= 300,
        "{q}"
    );
    let r = caller.persona_answer(&m, common::ANSWER_DEADLINE).await;
    assert_eq!(r["result"], json!({"cancel": 1}), "{r}");
    let m = ask_many(&mut caller, json!({"n": 1, "schema_bytes": 20000})).await;
    let r = caller.persona_answer(&m, common::ANSWER_DEADLINE).await;
    assert_eq!(r["result"], json!({"decline": 1}), "{r}");
}

/// The reference skill (python/ovos-skill-toolboxd-ask) on the bus at
/// `url`, hearing `heard` in turn; returns once it listens.
fn skill_on_bus(url: &str, heard: &[&str], home: &std::path::Path) -> common::Reaped {
    let python = common::root().join(".venv-agents/bin/python");
    assert!(python.exists(), "{}: run scripts/test", python.display());
    let mut command = std::process::Command::new(python);
    common::ovos_home(&mut command, home)
        .arg(repo("tests/python/ask_skill_on_bus.py"))
        .arg(common::port_of(url).to_string())
        .args(heard)
        .stderr(std::process::Stdio::null());
    common::Reaped::spawn_until(&mut command, std::time::Duration::from_secs(60), |l| {
        l == "ready"
    })
    .0
}

#[tokio::test]
async fn the_reference_skill_asks_by_voice_on_the_real_bus() {
    // toolboxd asks, the skill speaks the prompt and hears "yes" (then
    // "no", then nothing): the first call runs, the second and third do
    // not, each with its reason.
    let id = unique("voice");
    let dir = TempDir::new("asking-voice");
    dir.write(
        "voice.toml",
        &recorder(&id, "confirm = [\"record\"]\nask_timeout_s = 20\n"),
    );
    let daemon = Daemon::start(dir.path());
    let home = TempDir::new("asking-voice-home");
    let _skill = skill_on_bus(&daemon.url, &["yes, go ahead", "no"], home.path());
    let mut caller = Bus::connect(&daemon.url).await;
    for (text, expected) in [
        ("first", None),
        ("second", Some("PermissionError: the person declined")),
        ("third", Some("PermissionError: the person cancelled")),
    ] {
        let m = mark();
        call(&mut caller, &m, &id, text, "s-voice").await;
        let r = caller.persona_answer(&m, common::ANSWER_DEADLINE).await;
        match expected {
            None => assert_eq!(r["result"], json!({"recorded": text}), "{r}"),
            Some(error) => {
                let said = r["error"].as_str().unwrap_or_default();
                assert!(said.starts_with(error), "{text}: {r}");
            }
        }
    }
    assert_eq!(recorded(&id), "first\n");
}

#[tokio::test]
async fn a_childs_question_is_asked_only_of_its_callers_person_and_ends_with_its_call() {
    let (_dir, _daemon, mut caller, mut asker) =
        asking_fixture("owner", "ask_timeout_s = 60\n[limits]\ncall_timeout_s = 2").await;
    let ask_many = |n: u64| json!({"toolbox_id": "owner", "name": "ask_many", "kwargs": {"n": n}});
    let questions_of = |session: &'static str| {
        move |q: &Value| {
            q["type"] == "ovos.tools.ask" && q["context"]["session"]["session_id"] == session
        }
    };

    // Alice's call asks: her question is on the bus. Bob's call, in flight
    // beside it, asks too: whose question that is cannot be told, so it
    // is put to nobody (cancel), and Alice's stays hers.
    let (alice, bob) = (mark(), mark());
    caller
        .send(
            "ovos.persona.tools.call",
            ask_many(1),
            json!({"mark": alice, "session": {"session_id": "alice"}}),
        )
        .await;
    let q = asker
        .wait_for(common::ANSWER_DEADLINE, questions_of("alice"))
        .await
        .expect("Alice's question");
    caller
        .send(
            "ovos.persona.tools.call",
            ask_many(1),
            json!({"mark": bob, "session": {"session_id": "bob"}}),
        )
        .await;
    let r = caller.persona_answer(&bob, common::ANSWER_DEADLINE).await;
    assert_eq!(r["result"], json!({"cancel": 1}), "{r}");
    assert!(
        asker
            .wait_for(std::time::Duration::ZERO, questions_of("bob"))
            .await
            .is_none(),
        "Bob was asked Alice's question"
    );

    // Alice's call ends (its 2 s deadline) before she answers: her
    // question ends with it, and a late yes finds nothing.
    let r = caller.persona_answer(&alice, common::ANSWER_DEADLINE).await;
    assert!(
        r["error"]
            .as_str()
            .unwrap_or_default()
            .starts_with("TimeoutError"),
        "{r}"
    );
    let ask_id = q["data"]["ask_id"].as_str().unwrap();
    accept(&mut asker, ask_id, json!({"answer": "late"})).await;
    // Its place is free again: four new questions of the toolbox reach the
    // bus (with the old one still held, only three would).
    let carol = mark();
    caller
        .send(
            "ovos.persona.tools.call",
            ask_many(4),
            json!({"mark": carol, "session": {"session_id": "carol"}}),
        )
        .await;
    let asked = distinct_questions(
        &mut asker,
        questions_of("carol"),
        4,
        common::ANSWER_DEADLINE,
    )
    .await;
    assert_eq!(
        asked.len(),
        4,
        "only {} of Carol's questions reached the bus",
        asked.len()
    );
    let r = caller.persona_answer(&carol, common::ANSWER_DEADLINE).await;
    assert!(
        r["error"]
            .as_str()
            .unwrap_or_default()
            .starts_with("TimeoutError"),
        "{r}"
    );
}

#[tokio::test]
async fn a_modern_servers_question_is_asked_and_the_call_made_again_with_the_answer() {
    // In the 2026-07-28 era a server asks by answering the call
    // input_required; toolboxd asks the person and calls again with the
    // answer. The same tool in the legacy era asks mid-call. Both on the
    // official Python SDK.
    let python = common::root().join(".venv/bin/python");
    let dir = TempDir::new("asking-mrtr");
    for (id, protocol) in [("modern", "auto"), ("legacy", "2025-11-25")] {
        dir.write(
            &format!("{id}.toml"),
            &format!(
                "id = \"{id}\"\ncommand = \"{}\"\nargs = [\"{}\"]\nprotocol = \"{protocol}\"\n\
                 elicitation = true\nask_timeout_s = 20\n",
                python.display(),
                repo("tests/fixtures/sdk_asking_toolbox.py")
            ),
        );
    }
    let daemon = Daemon::start(dir.path());
    assert_eq!(daemon.status("modern")["era"], "modern MCP 2026-07-28");
    assert_eq!(daemon.status("legacy")["era"], "legacy MCP 2025-11-25");
    let mut caller = Bus::connect(&daemon.url).await;
    let mut asker = Bus::connect(&daemon.url).await;
    for (id, pin) in [("modern", "1234"), ("legacy", "9876")] {
        let m = mark();
        let data = json!({"toolbox_id": id, "name": "unlock", "kwargs": {"door": "front"}});
        caller
            .send(
                "ovos.persona.tools.call",
                data,
                json!({"mark": m, "session": {"session_id": id}}),
            )
            .await;
        let q = question_in(&mut asker, id).await;
        assert_eq!(q["data"]["toolbox_id"], id);
        assert_eq!(q["data"]["kind"], "elicit", "{q}");
        assert_eq!(q["data"]["prompt"], "Which PIN opens the door?", "{q}");
        let ask_id = q["data"]["ask_id"].as_str().unwrap();
        accept(&mut asker, ask_id, json!({"pin": pin})).await;
        let r = caller.persona_answer(&m, common::ANSWER_DEADLINE).await;
        assert_eq!(
            r["result"]["result"],
            format!("front unlocked with {pin}"),
            "{id}: {r}"
        );
        // Its roots, asked the same way: where its sandbox lets it write.
        let r = caller.call(id, "where_may_i_write", json!({})).await;
        let state = format!("test-state/{id}/state");
        assert!(r["result"].to_string().contains(&state), "{id}: {r}");
    }
}
