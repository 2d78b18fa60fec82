//! Hostile toolboxes (docs/failure-modes.md, "Bounds"): a child that floods,
//! wedges, answers garbage, lists without end or runs the daemon short of
//! descriptors. Each test names the abuse it replays and asserts the bound:
//! the toolbox is cut off or refused with a reason, and the others are served.

mod common;

use std::process::Command;
use std::time::Duration;

use common::{assert_rss_grew_less, math_manifest, repo, rss_kib, Bus, Daemon, TempDir, BIN};
use serde_json::json;

#[tokio::test]
async fn a_toolbox_cannot_operate_the_daemon_through_its_control_socket() {
    // The pivot: a toolbox finds the control socket and stops its neighbour.
    // A default toolbox of a root daemon (a user of its own) cannot even
    // reach the socket's 0700 directory; one that runs as root (`user =
    // "root"`, or a daemon that is not root) reaches it and is refused by
    // the peer check, from inside its cgroup.
    let dir = TempDir::new("pivot");
    dir.write("math.toml", &math_manifest("math"));
    // Named, so that its view of the filesystem keeps the socket visible.
    let control_dir = TempDir::new("pivot-ctl");
    let control = control_dir.path().join("ctl.sock");
    let root = nix::unistd::geteuid().is_root();
    let mut evil = vec!["evil"];
    for id in ["evil", "evil_root"] {
        let extra = if id == "evil_root" && root {
            format!(
                "[sandbox]\nuser = \"root\"\nread_only = [\"{}\"]\n",
                control_dir.path().display()
            )
        } else {
            String::new()
        };
        dir.write(
            &format!("{id}.toml"),
            &format!(
                "id = \"{id}\"\ncommand = \"python3\"\nargs = [\"{}\"]\n{extra}",
                repo("tests/fixtures/faulty_toolbox.py")
            ),
        );
    }
    evil.push("evil_root");
    let daemon = Daemon::start_with(&[
        "--manifests",
        dir.path().to_str().unwrap(),
        "--embedded-bus",
        "127.0.0.1:0",
        "--control",
        control.to_str().unwrap(),
    ]);
    let mut bus = Bus::connect(&daemon.url).await;
    let line = json!({"jsonrpc": "2.0", "id": 1, "method": "stop", "params": {"id": "math"}});
    for id in evil {
        let r = bus
            .call(
                id,
                "control",
                json!({"path": daemon.control.to_str().unwrap(), "line": line.to_string()}),
            )
            .await;
        let answer = r["result"]["answer"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        assert!(
            !answer.contains("\"result\""),
            "{id} operated the daemon: {answer}"
        );
        assert_eq!(daemon.status("math")["state"], "ready");
        bus.assert_math_answers().await;
    }
    daemon.wait_for_log(
        "control socket: refused a connection",
        1,
        Duration::from_secs(5),
    );
}

#[tokio::test]
async fn a_timed_out_call_keeps_its_slot_and_a_wedged_child_is_restarted() {
    // 300 calls of a 20 s tool with 8 slots once all reached the child: a
    // timed-out call freed its slot while the child still ran it, and the
    // toolbox stayed wedged. Here: 10 calls that never end, 2 slots.
    let dir = TempDir::writable("wedge");
    let record = dir.path().join("received.jsonl");
    dir.write("math.toml", &math_manifest("math"));
    dir.write(
        "faulty.toml",
        &format!(
            "id = \"faulty\"\ncommand = \"python3\"\nargs = [\"{}\"]\nenv = {{ MCP_TOOLBOX_RECORD = \"{}\" }}\n\
             [restart]\nbackoff_initial_ms = 50\n\
             [limits]\ncall_timeout_s = 1\nmax_concurrent_calls = 2\nmax_timeouts_in_a_row = 3\n\
             [sandbox]\nread_write = [\"{}\"]\n",
            repo("tests/fixtures/faulty_toolbox.py"),
            record.display(),
            dir.path().display()
        ),
    );
    let daemon = Daemon::start(dir.path());
    let mut bus = Bus::connect(&daemon.url).await;
    for i in 0..10 {
        bus.send(
            "ovos.persona.tools.call",
            json!({"toolbox_id": "faulty", "name": "hang", "kwargs": {}}),
            json!({"mark": format!("h{i}")}),
        )
        .await;
    }
    // Every caller gets its TimeoutError, once, after about its deadline.
    for i in 0..10 {
        let answers = bus
            .expect_answers("ovos.persona.tools.call.response", &format!("h{i}"), 1)
            .await;
        assert_eq!(answers.len(), 1);
        assert_eq!(
            answers[0]["data"]["error"],
            "TimeoutError: tool 'hang' in toolbox 'faulty' did not answer within 1 s"
        );
    }
    // Only as many calls as slots reached the child: the others waited for
    // a slot the timed-out calls still held.
    let received = std::fs::read_to_string(&record).unwrap_or_default();
    let hangs = received.lines().filter(|l| l.contains("\"hang\"")).count();
    assert_eq!(hangs, 2, "{received}");
    // The child answered nothing while calls kept timing out: it was killed
    // and restarted, and status says why.
    common::wait_until(
        "the wedged child is restarted",
        Duration::from_secs(10),
        || daemon.status("faulty")["restarts"] == 1 && daemon.status("faulty")["state"] == "ready",
    );
    let row = daemon.status("faulty");
    assert!(
        row["last_exit"]
            .as_str()
            .unwrap()
            .contains("killed because 3 calls in a row ran past their deadline"),
        "{row}"
    );
    assert_eq!(
        bus.call("faulty", "ok", json!({})).await["result"],
        json!({"ok": true})
    );
    bus.assert_math_answers().await;
}

#[tokio::test]
async fn a_child_that_floods_requests_and_never_reads_is_cut_off() {
    // Every answer to its requests was queued for its stdin without limit:
    // 11 MB -> 1.95 GB in 17 s. Now the queue holds max_message_bytes at most.
    let dir = TempDir::new("flood-unread");
    dir.write("math.toml", &math_manifest("math"));
    dir.write(
        "faulty.toml",
        &format!(
            "id = \"faulty\"\ncommand = \"python3\"\nargs = [\"{}\"]\nenv = {{ FAULT = \"flood_unread\" }}\n\
             [restart]\nbackoff_initial_ms = 5000\n[limits]\nmax_message_bytes = 1048576\nprobe_interval_s = 1\n",
            repo("tests/fixtures/faulty_toolbox.py")
        ),
    );
    let daemon = Daemon::start(dir.path());
    let before = rss_kib(daemon.pid());
    // The first probe makes the child stop reading and start flooding.
    common::wait_until(
        "the flooding child is cut off",
        Duration::from_secs(20),
        || daemon.status("faulty")["restarts"] == 1,
    );
    let row = daemon.status("faulty");
    assert!(
        row["reason"]
            .as_str()
            .unwrap_or_default()
            .contains("the child does not read its stdin"),
        "{row}"
    );
    assert_rss_grew_less(daemon.pid(), before, 64 * 1024);
    let mut bus = Bus::connect(&daemon.url).await;
    bus.assert_math_answers().await;
}

#[tokio::test]
async fn child_answers_that_cannot_be_used_fail_the_call_at_once() {
    // A batch or an answer nested 126+ deep used to be ignored: the call
    // hung until its deadline. A string id ("7" for 7) is accepted.
    let dir = TempDir::new("bad-answers");
    dir.write(
        "faulty.toml",
        &format!(
            "id = \"faulty\"\ncommand = \"python3\"\nargs = [\"{}\"]\n[restart]\nbackoff_initial_ms = 50\n",
            repo("tests/fixtures/faulty_toolbox.py")
        ),
    );
    let daemon = Daemon::start(dir.path());
    let mut bus = Bus::connect(&daemon.url).await;
    let r = bus
        .call("faulty", "bad_answer", json!({"kind": "string_id"}))
        .await;
    assert_eq!(r["result"], json!({"ok": true}), "{r}");
    for (kind, why) in [
        ("deep", "the child sent a message nested too deep to read"),
        ("batch", "the child sent a JSON-RPC batch"),
    ] {
        let started = std::time::Instant::now();
        let r = bus
            .call("faulty", "bad_answer", json!({"kind": kind}))
            .await;
        let e = r["error"].as_str().unwrap_or_default();
        assert!(
            e.starts_with("RuntimeError: toolbox 'faulty' failed while running 'bad_answer': ")
                && e.contains(why),
            "{kind}: {r}"
        );
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{kind}: {:?}",
            started.elapsed()
        );
    }
    assert_eq!(
        bus.call("faulty", "ok", json!({})).await["result"],
        json!({"ok": true})
    );
}

#[test]
fn the_daemons_loop_never_waits_on_a_toolbox() {
    // `ctl stop` of a slow-to-stop toolbox (or a reload) ran inline in the
    // loop that serves signals and pings the watchdog: a 35 s watchdog gap.
    let dir = TempDir::new("loop");
    dir.write("math.toml", &math_manifest("math"));
    dir.write(
        "faulty.toml",
        &format!(
            "id = \"faulty\"\ncommand = \"python3\"\nargs = [\"{}\"]\nenv = {{ FAULT = \"stubborn\" }}\n",
            repo("tests/fixtures/faulty_toolbox.py")
        ),
    );
    let sock_dir = TempDir::new("loop-notify");
    let path = sock_dir.path().join("notify.sock");
    let systemd = std::os::unix::net::UnixDatagram::bind(&path).unwrap();
    systemd
        .set_read_timeout(Some(Duration::from_millis(100)))
        .unwrap();
    let daemon = Daemon::start_notifying(dir.path(), &path);
    // The stubborn child takes about 6 s to stop (stdin, 3 s, SIGTERM, 3 s).
    let stopping = std::thread::spawn({
        let control = daemon.control.clone();
        move || {
            let started = std::time::Instant::now();
            let out = common::output_within(
                Command::new(BIN).args([
                    "ctl",
                    "--control",
                    control.to_str().unwrap(),
                    "stop",
                    "faulty",
                ]),
                common::ANSWER_DEADLINE,
            );
            (out.status.code(), started.elapsed())
        }
    });
    // Meanwhile: status answers at once, and the watchdog is pinged on time.
    let mut pings = Vec::new();
    let mut buf = [0u8; 256];
    let watch_until = std::time::Instant::now() + Duration::from_secs(4);
    let mut statuses = 0;
    while std::time::Instant::now() < watch_until {
        if let Ok(n) = systemd.recv(&mut buf) {
            if &buf[..n] == b"WATCHDOG=1" {
                pings.push(std::time::Instant::now());
            }
        }
        if pings.len() % 10 == 5 {
            let asked = std::time::Instant::now();
            let (code, _, err) = daemon.ctl(&["status", "--json"]);
            assert_eq!(code, 0, "{err}");
            assert!(
                asked.elapsed() < Duration::from_secs(1),
                "status took {:?} during a stop",
                asked.elapsed()
            );
            statuses += 1;
        }
    }
    assert!(statuses > 0);
    let gaps: Vec<Duration> = pings.windows(2).map(|w| w[1] - w[0]).collect();
    let worst = gaps.iter().max().copied().unwrap_or_default();
    assert!(pings.len() >= 10, "{} watchdog pings in 4 s", pings.len());
    assert!(
        worst < Duration::from_secs(1),
        "a watchdog gap of {worst:?}"
    );
    let (code, took) = stopping.join().unwrap();
    assert_eq!(code, Some(0));
    assert!(
        took >= Duration::from_secs(5),
        "the stop itself took {took:?}"
    );
    assert_eq!(daemon.status("faulty")["state"], "stopped");
}

#[tokio::test]
async fn a_childs_log_messages_are_rate_limited_and_cannot_forge_lines() {
    // 200k notifications/message were all logged, and a newline in one
    // forged a log line of its own.
    let dir = TempDir::new("log-spam");
    dir.write(
        "faulty.toml",
        &format!(
            "id = \"faulty\"\ncommand = \"python3\"\nargs = [\"{}\"]\n",
            repo("tests/fixtures/faulty_toolbox.py")
        ),
    );
    let daemon = Daemon::start(dir.path());
    let mut bus = Bus::connect(&daemon.url).await;
    let started = std::time::Instant::now();
    let r = bus.call("faulty", "spam_log", json!({"count": 5000})).await;
    assert_eq!(r["result"], json!({"ok": true}), "{r}");
    // The messages reach the daemon before the answer (one stdout, in order).
    let logged = daemon.log_lines_with("spam ");
    let seconds = started.elapsed().as_secs() + 2;
    assert!(
        !logged.is_empty() && logged.len() as u64 <= 100 * seconds,
        "{} of 5000 logged in under {seconds} s",
        logged.len()
    );
    for line in &logged {
        let message = line["message"].as_str().unwrap();
        assert!(!message.contains('\n'), "{message:?}");
        assert!(message.contains("\\nFORGED"), "{message:?}");
    }
    // What was dropped is counted with the next message the budget allows
    // (in a later second).
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while daemon
        .log_lines_with("child log messages not logged")
        .is_empty()
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the drops were never counted"
        );
        let r = bus.call("faulty", "spam_log", json!({"count": 1})).await;
        assert_eq!(r["result"], json!({"ok": true}));
    }
    let report = &daemon.log_lines_with("child log messages not logged")[0];
    assert!(report["dropped"].as_u64().unwrap() >= 4000, "{report}");
}

/// A manifest for the faulty fixture with `fault`, failing for good on its
/// first failed start, with `extra` TOML top-level keys.
fn faulty_manifest(id: &str, fault: &str, extra: &str) -> String {
    format!(
        "id = \"{id}\"\ncommand = \"python3\"\nargs = [\"{}\"]\n\
         env = {{ FAULT = \"{fault}\" {extra} }}\n[restart]\npolicy = \"never\"\n",
        repo("tests/fixtures/faulty_toolbox.py")
    )
}

#[tokio::test]
async fn a_runaway_tool_listing_is_refused_with_a_reason() {
    // 100,000 tiny tools took 1.5 GB and froze the daemon 3.7 s; a cursor
    // that never ended held 1.7 GB, again at every restart. A listing is now
    // bounded in pages, tools and bytes, and refused past a bound.
    let dir = TempDir::new("runaway-list");
    dir.write("math.toml", &math_manifest("math"));
    dir.write("many.toml", &faulty_manifest("many", "many_tools", ""));
    dir.write(
        "endless.toml",
        &faulty_manifest("endless", "endless_cursor", ""),
    );
    let daemon = Daemon::start(dir.path());
    for (id, why) in [
        ("many", "tools/list lists more than 1024 tools"),
        ("endless", "tools/list returned more than 100 pages"),
    ] {
        let row = daemon.status(id);
        assert_eq!(row["state"], "failed", "{row}");
        assert!(row["reason"].as_str().unwrap().contains(why), "{row}");
    }
    assert!(
        rss_kib(daemon.pid()) < 64 * 1024,
        "daemon RSS {} KiB",
        rss_kib(daemon.pid())
    );
    let mut bus = Bus::connect(&daemon.url).await;
    bus.assert_math_answers().await;
}

#[tokio::test]
async fn a_child_that_always_says_its_tools_changed_is_listed_once_a_second() {
    // A child that sent list_changed while answering tools/list was listed
    // again for ever (40 % of a core).
    let dir = TempDir::writable("changes-while-listed");
    let events = dir.path().join("events");
    dir.write(
        "noisy.toml",
        &format!(
            "{}[sandbox]\nread_write = [\"{}\"]\n",
            faulty_manifest(
                "noisy",
                "changes_while_listed",
                &format!(", FIXTURE_EVENTS = \"{}\"", events.display()),
            ),
            dir.path().display()
        ),
    );
    let daemon = Daemon::start(dir.path());
    let listings = || {
        std::fs::read_to_string(&events)
            .unwrap_or_default()
            .lines()
            .filter(|l| l.starts_with("listed"))
            .count()
    };
    // The endless refreshes start 0.2 s after the first listing.
    common::wait_until("a refresh", Duration::from_secs(10), || listings() >= 2);
    let start = listings();
    let window = Duration::from_secs(3);
    std::thread::sleep(window); // a measurement window, not a wait for an event
    let during = listings() - start;
    assert!(
        (1..=4).contains(&during),
        "{during} listings in {window:?} (at most one a second)"
    );
    assert_eq!(daemon.status("noisy")["state"], "ready");
}

#[tokio::test]
async fn a_spawn_that_fails_for_want_of_descriptors_is_retried_not_failed() {
    // 1,010 idle connections at the descriptor limit: a crashed toolbox could
    // not be respawned (EMFILE) and went `failed` for 300 s. A spawn that
    // fails for want of descriptors is now retried without charging the
    // restart budget.
    let dir = TempDir::new("emfile");
    dir.write(
        "faulty.toml",
        &format!(
            "{}[restart]\nmax_restarts = 1\nbackoff_initial_ms = 10\n",
            faulty_manifest("faulty", "", "").replace("[restart]\npolicy = \"never\"\n", "")
        ),
    );
    let daemon = Daemon::start(dir.path());
    let mut bus = Bus::connect(&daemon.url).await;
    // Leave the daemon a few descriptors only.
    let open = std::fs::read_dir(format!("/proc/{}/fd", daemon.pid()))
        .unwrap()
        .count() as u64;
    // Room for one spawn (its pipes and sandbox take some 30), not more.
    let limit = libc::rlimit {
        rlim_cur: open + 40,
        rlim_max: open + 40,
    };
    // SAFETY: prlimit on a child process of ours with a valid struct.
    let set = unsafe {
        libc::prlimit(
            daemon.pid() as i32,
            libc::RLIMIT_NOFILE,
            &limit,
            std::ptr::null_mut(),
        )
    };
    assert_eq!(set, 0, "prlimit: {}", std::io::Error::last_os_error());
    let addr = daemon
        .url
        .trim_start_matches("ws://")
        .trim_end_matches("/core")
        .to_owned();
    // More connections than descriptors left: the rest wait in the backlog.
    let mut idle = Vec::new();
    for _ in 0..64 {
        idle.push(tokio::net::TcpStream::connect(&addr).await.unwrap());
    }
    daemon.wait_for_log("bus accept failed", 1, Duration::from_secs(10));
    let crashed = bus.call("faulty", "crash", json!({})).await;
    assert!(crashed["error"]
        .as_str()
        .unwrap()
        .contains("exited (code 3)"));
    daemon.wait_for_log(
        "without charging the restart budget",
        1,
        Duration::from_secs(10),
    );
    drop(idle);
    let row = daemon.wait_for_state("faulty", "ready", Duration::from_secs(20));
    assert_eq!(row["restarts"], 1, "{row}");
    assert_eq!(
        bus.call("faulty", "ok", json!({})).await["result"]["ok"],
        true
    );
}
