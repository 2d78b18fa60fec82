//! The fault fixture set up beside a neighbour toolbox, and the helpers the
//! fault tests share (`faults.rs`, `teardown.rs`).
#![allow(dead_code)] // each test crate uses a part

use std::time::{Duration, Instant};

use crate::common::{math_manifest, repo, Bus, TempDir, ANSWER_DEADLINE};
use serde_json::{json, Value};

/// A manifests directory with the fault fixture (`faulty`) and a neighbour (`math`).
pub struct Setup {
    pub dir: TempDir,
    pub mark: String,
}

impl Setup {
    pub fn new(tag: &str, fault: &str, extra: &str) -> Setup {
        let dir = TempDir::writable(tag);
        let mark = format!("toolboxd-fixture-{tag}-{}", std::process::id());
        let record = dir.path().join("received.jsonl");
        dir.write("math.toml", &math_manifest("math"));
        dir.write(
            "faulty.toml",
            &format!(
                "id = \"faulty\"\ncommand = \"python3\"\nargs = [\"{}\", \"{mark}\"]\n\
                 env = {{ FAULT = \"{fault}\", FIXTURE_MARK = \"{mark}\", MCP_TOOLBOX_RECORD = \"{}\", \
                 GRANDCHILD_PIDS = \"{}\", FIXTURE_EVENTS = \"{}\" }}\n{extra}\n\
                 [sandbox]\nread_write = [\"{}\"]\n",
                repo("tests/fixtures/faulty_toolbox.py"),
                record.display(),
                dir.path().join("grandchildren").display(),
                dir.path().join("events").display(),
                // The fixture writes what it saw there, for the tests to read.
                dir.path().display(),
            ),
        );
        Setup { dir, mark }
    }

    /// Pids the fixture's grandchildren wrote, in order.
    pub fn grandchildren(&self) -> Vec<i32> {
        std::fs::read_to_string(self.dir.path().join("grandchildren"))
            .unwrap_or_default()
            .lines()
            .map(|l| l.parse().unwrap())
            .collect()
    }

    /// Events the fixture noted (FIXTURE_EVENTS): (event, monotonic seconds).
    pub fn events(&self) -> Vec<(String, f64)> {
        std::fs::read_to_string(self.dir.path().join("events"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| {
                let (event, at) = l.split_once(' ')?;
                Some((event.to_owned(), at.parse().ok()?))
            })
            .collect()
    }

    /// Waits until the child has recorded a `tools/call` of `name` (so the
    /// call is in flight on it).
    pub async fn wait_received_call(&self, name: &str, count: usize) {
        let deadline = Instant::now() + ANSWER_DEADLINE;
        while self
            .received()
            .iter()
            .filter(|m| m["params"]["name"] == name)
            .count()
            < count
        {
            assert!(
                Instant::now() < deadline,
                "{count} call(s) of {name} never reached the child"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    pub fn received(&self) -> Vec<Value> {
        std::fs::read_to_string(self.dir.path().join("received.jsonl"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }
}

pub const FAST_RESTART: &str = "[restart]\nbackoff_initial_ms = 50\nbackoff_max_ms = 200\n";

/// A persona call and how long its answer took.
pub async fn call(bus: &mut Bus, toolbox: &str, name: &str, kwargs: Value) -> (Value, Duration) {
    let started = Instant::now();
    let data = bus.call(toolbox, name, kwargs).await;
    (data, started.elapsed())
}

pub async fn neighbour_answers(bus: &mut Bus) {
    let (data, took) = call(bus, "math", "add", json!({"a": 20, "b": 22})).await;
    assert_eq!(data["result"]["result"], 42, "neighbour: {data}");
    assert!(took < Duration::from_secs(2), "neighbour took {took:?}");
}

/// Pids of processes whose command line contains `mark`.
pub fn processes_with(mark: &str) -> Vec<u32> {
    let me = std::process::id();
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| pid != me)
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .map(|c| String::from_utf8_lossy(&c).contains(mark))
                .unwrap_or(false)
        })
        .filter(|pid| {
            // A zombie is gone for our purposes only once reaped; count it.
            std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok()
        })
        .collect()
}

pub fn wait_until_gone(mark: &str, within: Duration) {
    let deadline = Instant::now() + within;
    loop {
        let left = processes_with(mark);
        if left.is_empty() {
            return;
        }
        let described: Vec<String> = left
            .iter()
            .map(|pid| {
                let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
                let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
                format!(
                    "{pid}: {} [{}]",
                    String::from_utf8_lossy(&cmd).replace('\0', " "),
                    stat.trim()
                )
            })
            .collect();
        assert!(
            Instant::now() < deadline,
            "processes left behind: {described:#?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A backoff long enough that a test can act while the toolbox is `restarting`.
pub const SLOW_RESTART: &str = "[restart]\nbackoff_initial_ms = 1500\nbackoff_max_ms = 1500\n";
