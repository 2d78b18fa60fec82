//! Soak: thousands of calls over several connections while the toolbox's
//! child is SIGKILLed at random. Every call is answered exactly once (a result
//! or an error, none lost or doubled), and the daemon's memory at the end stays
//! within a small margin of its memory after warm-up. Bounded: well under two
//! minutes.

mod common;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use common::{repo, Bus, Daemon, TempDir};
use serde_json::{json, Value};

const CONNECTIONS: u64 = 4;
const CALLS_PER_CONNECTION: u64 = 3000;
/// Requests each connection keeps in flight.
const WINDOW: u64 = 16;

fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

/// Sends `count` calls with at most WINDOW in flight; returns every answer per mark.
async fn load(url: String, conn: u64, first: u64, count: u64) -> HashMap<u64, Vec<Value>> {
    let mut bus = Bus::connect(&url).await;
    let mut answers: HashMap<u64, Vec<Value>> = HashMap::new();
    let mut next = first;
    let end = first + count;
    let deadline = Instant::now() + Duration::from_secs(90);
    let mut answered = 0;
    while answered < count {
        while next < end && next - first - answered < WINDOW {
            let data = json!({"name": "add", "args": {"a": next, "b": conn}});
            bus.send(
                "ovos.tools.invoke",
                data,
                json!({"mark": format!("s{conn}-{next}")}),
            )
            .await;
            next += 1;
        }
        let left = deadline
            .checked_duration_since(Instant::now())
            .expect("soak took too long");
        let Some(m) = bus.next(left).await else { break };
        if m["type"] != "ovos.tools.invoke.response" {
            continue;
        }
        let Some(i) = m["context"]["mark"]
            .as_str()
            .and_then(|k| k.strip_prefix(&format!("s{conn}-")))
            .and_then(|i| i.parse::<u64>().ok())
        else {
            continue;
        };
        let entry = answers.entry(i).or_default();
        if entry.is_empty() {
            answered += 1;
        }
        entry.push(m["data"].clone());
    }
    // Listen a little longer for duplicates.
    while let Some(m) = bus.next(common::SILENCE_WINDOW).await {
        if let Some(i) = m["context"]["mark"]
            .as_str()
            .and_then(|k| k.strip_prefix(&format!("s{conn}-")))
            .and_then(|i| i.parse::<u64>().ok())
        {
            if m["type"] == "ovos.tools.invoke.response" {
                answers.entry(i).or_default().push(m["data"].clone());
            }
        }
    }
    answers
}

fn check(conn: u64, answers: &HashMap<u64, Vec<Value>>, first: u64, count: u64) -> (u64, u64) {
    let (mut ok, mut err) = (0, 0);
    for i in first..first + count {
        let got = answers
            .get(&i)
            .unwrap_or_else(|| panic!("call s{conn}-{i} was never answered"));
        assert_eq!(
            got.len(),
            1,
            "call s{conn}-{i} answered {} times: {got:?}",
            got.len()
        );
        let data = &got[0];
        assert_eq!(data["name"], "add");
        if let Some(e) = data["error"].as_str() {
            assert!(
                e == "RuntimeError: toolbox 'math' exited (signal 9) while running 'add'",
                "unexpected error for s{conn}-{i}: {e}"
            );
            err += 1;
        } else {
            assert_eq!(data["result"]["result"], i + conn, "s{conn}-{i}");
            ok += 1;
        }
    }
    (ok, err)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thousands_of_calls_through_random_sigkills_are_each_answered_once() {
    let dir = TempDir::new("soak");
    dir.write(
        "math.toml",
        &format!(
            "id = \"math\"\ncommand = \"python3\"\nargs = [\"{}\"]\n\
             [restart]\nbackoff_initial_ms = 10\nbackoff_max_ms = 50\nmax_restarts = 1000\n\
             [limits]\nmax_concurrent_calls = 16\n",
            repo("examples/python/math_toolbox.py")
        ),
    );
    let daemon = Daemon::start(dir.path());

    // Warm-up: one round of load without faults.
    let warm: Vec<_> = (0..CONNECTIONS)
        .map(|c| tokio::spawn(load(daemon.url.clone(), c, 0, 200)))
        .collect();
    for (c, task) in warm.into_iter().enumerate() {
        check(c as u64, &task.await.unwrap(), 0, 200);
    }
    let rss_warm = rss_kib(daemon.pid());

    // The killer: SIGKILL the toolbox's process group every 50–250 ms.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let killer = {
        let stop = stop.clone();
        let control = daemon.control.clone();
        std::thread::spawn(move || {
            // Distinct children a SIGKILL reached (killpg succeeded).
            let mut killed = std::collections::HashSet::new();
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(50 + rand::random_range(0..200)));
                let out = common::output_within(
                    std::process::Command::new(common::BIN).args([
                        "ctl",
                        "--control",
                        control.to_str().unwrap(),
                        "status",
                        "--json",
                    ]),
                    common::ANSWER_DEADLINE,
                );
                let rows: Value = serde_json::from_slice(&out.stdout).unwrap();
                if let Some(pid) = rows[0]["pids"][0].as_i64() {
                    let landed = nix::sys::signal::killpg(
                        nix::unistd::Pid::from_raw(pid as i32),
                        nix::sys::signal::Signal::SIGKILL,
                    )
                    .is_ok();
                    if landed {
                        killed.insert(pid);
                    }
                }
            }
            killed.len() as u64
        })
    };
    let started = Instant::now();
    let tasks: Vec<_> = (0..CONNECTIONS)
        .map(|c| tokio::spawn(load(daemon.url.clone(), c, 1000, CALLS_PER_CONNECTION)))
        .collect();
    let mut results = Vec::new();
    for task in tasks {
        results.push(task.await.unwrap());
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let kills = killer.join().unwrap();
    let took = started.elapsed();
    let (mut ok, mut err) = (0, 0);
    for (c, answers) in results.iter().enumerate() {
        let (o, e) = check(c as u64, answers, 1000, CALLS_PER_CONNECTION);
        ok += o;
        err += e;
    }
    let rss_end = rss_kib(daemon.pid());
    let row = daemon.status("math");
    println!(
        "soak: {} calls in {took:.1?} ({ok} results, {err} errors from {kills} SIGKILLs, {} restarts); \
         daemon RSS after warm-up {rss_warm} KiB, at the end {rss_end} KiB",
        ok + err,
        row["restarts"]
    );
    assert_eq!(ok + err, CONNECTIONS * CALLS_PER_CONNECTION);
    // Kills really landed, and each one was noticed and restarted.
    assert!(kills >= 3, "only {kills} SIGKILLs reached a child");
    let restarts = row["restarts"].as_u64().unwrap();
    assert!(
        restarts >= kills,
        "{kills} children killed but only {restarts} restarts"
    );
    assert!(err >= 1, "no call was in flight at any of {kills} kills");
    assert!(ok > err, "most calls succeed between kills");
    assert!(
        rss_end <= rss_warm + 8 * 1024,
        "RSS grew from {rss_warm} KiB to {rss_end} KiB"
    );
}
