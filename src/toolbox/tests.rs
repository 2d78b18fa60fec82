//! The toolbox actor, driven through its handle with a stand-in child (the
//! Python fixture toolbox from `tests/fixtures`, stdlib only) and a stand-in
//! registry that records what the actor publishes. No bus, no daemon.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::json;
use tokio::sync::watch;

use super::{spawn, CallError, Publish, State, ToolboxHandle};
use crate::cancel::Cancel;
use crate::manifest::Manifest;
use crate::tool::ToolSet;

/// Records every state the actor publishes, and lets a test wait for one.
struct Recorder {
    /// Every state published, in order, by name.
    states: Mutex<Vec<String>>,
    /// The latest state, for waiting.
    latest: watch::Sender<State>,
    /// The latest tool list published.
    tools: Mutex<Option<Arc<ToolSet>>>,
}

impl Recorder {
    fn new() -> Arc<Recorder> {
        Arc::new(Recorder {
            states: Mutex::default(),
            latest: watch::channel(State::Starting).0,
            tools: Mutex::default(),
        })
    }

    /// Waits (at most 20 s) until the toolbox is in a state named `name`.
    async fn reach(&self, name: &str) -> State {
        let mut latest = self.latest.subscribe();
        let reached = latest.wait_for(|s| s.name() == name);
        let state = match tokio::time::timeout(Duration::from_secs(20), reached).await {
            Ok(Ok(state)) => state.clone(),
            _ => panic!(
                "never reached {name}; published: {:?}",
                self.states.lock().unwrap()
            ),
        };
        state
    }

    fn history(&self) -> Vec<String> {
        self.states.lock().unwrap().clone()
    }
}

impl Publish for Recorder {
    fn add(&self, _handle: ToolboxHandle) {}

    fn set(&self, _id: &str, state: State, tools: Option<Arc<ToolSet>>) {
        self.states.lock().unwrap().push(state.name().to_owned());
        if tools.is_some() {
            *self.tools.lock().unwrap() = tools;
        }
        self.latest.send_replace(state);
    }
}

/// A manifest running `fixture` (a script in tests/fixtures) with python3,
/// plus `extra` TOML.
fn manifest(fixture: &str, extra: &str) -> Manifest {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    let text =
        format!("id = \"standin\"\ncommand = \"python3\"\nargs = [\"{fixture}\"]\n{extra}\n");
    Manifest::parse(&dir.join("standin.toml"), &text).expect("valid test manifest")
}

/// Whether process `pid` exists (a reaped child does not).
fn alive(pid: u32) -> bool {
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), None).is_ok()
}

fn ok_call(result: &serde_json::Value) -> u64 {
    result["structuredContent"]["pid"]
        .as_u64()
        .unwrap_or_else(|| panic!("no pid in {result}"))
}

#[tokio::test]
async fn a_call_to_a_starting_toolbox_waits_for_the_child_within_its_deadline() {
    let sink = Recorder::new();
    let handle = spawn(
        manifest("fixture_toolbox.py", "env = { START_DELAY_S = \"0.5\" }"),
        sink.clone(),
    );
    let arrived = Instant::now();
    let result = handle
        .call("whoami", json!({}), arrived, &mut Cancel::never())
        .await
        .unwrap();
    assert!(arrived.elapsed() >= Duration::from_millis(500));
    assert_eq!(
        Some(ok_call(&result) as u32),
        handle.pids().first().copied()
    );
    assert_eq!(sink.history().first().map(String::as_str), Some("ready"));
    assert!(sink.tools.lock().unwrap().as_ref().unwrap().len() >= 3);
}

#[tokio::test]
async fn the_wait_for_a_start_counts_against_the_call_deadline() {
    let sink = Recorder::new();
    let handle = spawn(
        manifest(
            "fixture_toolbox.py",
            "env = { START_DELAY_S = \"30\" }\n[limits.tool_timeouts]\nwhoami = 1",
        ),
        sink.clone(),
    );
    let arrived = Instant::now();
    let answer = handle
        .call("whoami", json!({}), arrived, &mut Cancel::never())
        .await;
    assert_eq!(answer, Err(CallError::Timeout(Duration::from_secs(1))));
    let took = arrived.elapsed();
    assert!(
        took >= Duration::from_secs(1) && took < Duration::from_secs(3),
        "{took:?}"
    );
}

#[tokio::test]
async fn a_crash_loop_restarts_then_fails_and_calls_fail_at_once() {
    let sink = Recorder::new();
    let handle = spawn(
        manifest(
            "faulty_toolbox.py",
            "env = { FAULT = \"exit_at_start\" }\n\
             [restart]\nbackoff_initial_ms = 10\nbackoff_max_ms = 10\nmax_restarts = 2\n",
        ),
        sink.clone(),
    );
    let State::Failed { reason } = sink.reach("failed").await else {
        unreachable!()
    };
    assert!(reason.contains("exited (code 3)"), "{reason}");
    assert!(reason.contains("more than 2 restarts"), "{reason}");
    let history = sink.history();
    assert_eq!(
        history.iter().filter(|s| *s == "restarting").count(),
        2,
        "{history:?}"
    );
    let started = Instant::now();
    let answer = handle
        .call("ok", json!({}), Instant::now(), &mut Cancel::never())
        .await;
    assert!(matches!(answer, Err(CallError::Failed(r)) if r == reason));
    assert!(started.elapsed() < Duration::from_secs(1));
}

#[tokio::test]
async fn stop_drains_the_call_in_flight_then_start_brings_a_new_child() {
    let sink = Recorder::new();
    let handle = spawn(manifest("fixture_toolbox.py", ""), sink.clone());
    sink.reach("ready").await;
    let first = handle.pids()[0];
    let slow = {
        let handle = handle.clone();
        tokio::spawn(async move {
            handle
                .call(
                    "slow_whoami",
                    json!({"seconds": 0.5}),
                    Instant::now(),
                    &mut Cancel::never(),
                )
                .await
        })
    };
    // On this one-thread runtime the call task runs, once it is counted,
    // until it waits for the child's answer: it holds a slot before the stop.
    while handle
        .stats()
        .in_flight
        .load(std::sync::atomic::Ordering::Relaxed)
        == 0
    {
        tokio::task::yield_now().await;
    }
    let stopped = handle.stop().await.unwrap();
    assert!(
        stopped.starts_with(&format!("stopped pid {first}")),
        "{stopped}"
    );
    // Drained: the slow call was answered by the child being stopped.
    assert_eq!(ok_call(&slow.await.unwrap().unwrap()) as u32, first);
    assert_eq!(sink.history().last().map(String::as_str), Some("stopped"));
    assert_eq!(
        handle
            .call("whoami", json!({}), Instant::now(), &mut Cancel::never())
            .await,
        Err(CallError::Stopped)
    );
    assert!(!alive(first));

    let started = handle.start().await.unwrap();
    let second = handle.pids()[0];
    assert_eq!(started, format!("started, pid {second}"));
    assert_ne!(first, second);
    let result = handle
        .call("whoami", json!({}), Instant::now(), &mut Cancel::never())
        .await;
    assert_eq!(ok_call(&result.unwrap()) as u32, second);
}

#[tokio::test]
async fn restart_swaps_children_without_a_failed_call() {
    let sink = Recorder::new();
    let handle = spawn(manifest("fixture_toolbox.py", ""), sink.clone());
    sink.reach("ready").await;
    let first = handle.pids()[0];
    let outcome = handle.restart().await.unwrap();
    let second = handle.pids()[0];
    assert_eq!(
        outcome,
        format!("restarted: pid {first} -> {second}; pid {first} drains its calls")
    );
    let result = handle
        .call("whoami", json!({}), Instant::now(), &mut Cancel::never())
        .await;
    assert_eq!(ok_call(&result.unwrap()) as u32, second);
    assert_eq!(handle.stats().snapshot().restarts, 1);
    // Never anything but ready, so callers never waited.
    assert!(
        sink.history().iter().all(|s| s == "ready"),
        "{:?}",
        sink.history()
    );
}

#[tokio::test]
async fn a_wedged_child_is_killed_and_replaced() {
    let sink = Recorder::new();
    let handle = spawn(
        manifest(
            "faulty_toolbox.py",
            "[restart]\nbackoff_initial_ms = 10\n[limits]\nmax_timeouts_in_a_row = 1\n\
             [limits.tool_timeouts]\nhang = 1",
        ),
        sink.clone(),
    );
    sink.reach("ready").await;
    let first = handle.pids()[0];
    let answer = handle
        .call("hang", json!({}), Instant::now(), &mut Cancel::never())
        .await;
    assert_eq!(answer, Err(CallError::Timeout(Duration::from_secs(1))));
    let State::Restarting { last_exit } = sink.reach("restarting").await else {
        unreachable!()
    };
    assert!(
        last_exit.contains("killed because 1 calls in a row ran past their deadline"),
        "{last_exit}"
    );
    sink.reach("ready").await;
    assert_ne!(handle.pids(), vec![first]);
    assert!(!alive(first));
}

#[tokio::test]
async fn a_call_that_reaches_a_busy_child_late_and_times_out_does_not_wedge_it() {
    let sink = Recorder::new();
    let handle = spawn(
        manifest(
            "fixture_toolbox.py",
            "[limits]\nmax_concurrent_calls = 1\ncall_timeout_s = 2\nmax_timeouts_in_a_row = 1",
        ),
        sink.clone(),
    );
    sink.reach("ready").await;
    let first = handle.pids()[0];
    let call = |seconds: f64| {
        let handle = handle.clone();
        async move {
            handle
                .call(
                    "slow_whoami",
                    json!({"seconds": seconds}),
                    Instant::now(),
                    &mut Cancel::never(),
                )
                .await
        }
    };
    // The second call waits 1.7 s for the slot and reaches the child with
    // 0.3 s of its 2 s left: it times out there, but the child had no
    // fair chance to answer it.
    let (early, late) = tokio::join!(call(1.7), async {
        tokio::time::sleep(Duration::from_millis(50)).await;
        call(1.0).await
    });
    assert_eq!(ok_call(&early.unwrap()) as u32, first);
    assert_eq!(late, Err(CallError::Timeout(Duration::from_secs(2))));
    // The same child answers the next call: it was not killed as wedged.
    let next = call(0.0).await;
    assert_eq!(ok_call(&next.unwrap()) as u32, first);
    assert!(
        sink.history().iter().all(|s| s == "ready"),
        "{:?}",
        sink.history()
    );
}

#[test]
fn every_state_name_is_listed_for_the_metrics() {
    let text = String::new;
    for state in [
        State::Starting,
        State::Ready,
        State::Idle,
        State::Restarting { last_exit: text() },
        State::Failed { reason: text() },
        State::Stopped,
        State::Conflict { reason: text() },
    ] {
        assert!(State::NAMES.contains(&state.name()), "{}", state.name());
    }
    assert_eq!(State::NAMES.len(), 7);
}
