//! Confinement (docs/security.md): a toolbox attacks what the standard
//! profile keeps from it, on real children. Each test names the guarantee.

mod common;

use std::collections::BTreeSet;
use std::process::Command;
use std::time::Duration;

use common::{math_manifest, repo, Bus, Daemon, TempDir, BIN};
use serde_json::{json, Value};

/// The faulty fixture (its `inspect` tool reports the child's view) as
/// toolbox `id`, with `extra` TOML appended.
fn inspector(id: &str, extra: &str) -> String {
    format!(
        "id = \"{id}\"\ncommand = \"python3\"\nargs = [\"{}\"]\n{extra}\n",
        repo("tests/fixtures/faulty_toolbox.py")
    )
}

async fn inspect(bus: &mut Bus, id: &str, args: Value) -> Value {
    let answer = bus.call(id, "inspect", args).await;
    answer["result"].clone()
}

/// A line of `/proc/<pid>/status`, e.g. "NoNewPrivs".
fn status_field(pid: u64, field: &str) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap()
        .lines()
        .find_map(|l| {
            l.strip_prefix(&format!("{field}:"))
                .map(|v| v.trim().to_owned())
        })
        .unwrap_or_else(|| panic!("no {field} in /proc/{pid}/status"))
}

#[tokio::test]
async fn a_child_sees_only_its_allow_list_env_and_secrets() {
    // A toolbox walked the daemon's whole environment (a secret token
    // included); now it sees env_pass + env + secrets, never the daemon's
    // service-manager variables.
    let dir = TempDir::new("sandbox-env");
    let secret_file = dir.write("key.txt", "s3cret\n");
    let credentials = TempDir::new("credentials");
    credentials.write("api_token", "from-credentials");
    dir.write(
        "box.toml",
        &inspector(
            "box",
            &format!(
                "env = {{ MINE = \"1\" }}\n[sandbox]\nenv_pass = [\"PATH\", \"LANG\", \"PASSED\"]\n\
                 secrets = {{ API_KEY = \"{}\", TOKEN = \"api_token\" }}\n",
                secret_file.display()
            ),
        ),
    );
    let daemon = Daemon::start_env(
        &[
            "--manifests",
            dir.path().to_str().unwrap(),
            "--embedded-bus",
            "127.0.0.1:0",
        ],
        &[
            ("DAEMON_SECRET", "do-not-leak"),
            ("PASSED", "yes"),
            ("NOTIFY_SOCKET", "/nonexistent/notify"),
            (
                "CREDENTIALS_DIRECTORY",
                credentials.path().to_str().unwrap(),
            ),
        ],
    );
    let mut bus = Bus::connect(&daemon.url).await;
    let seen = inspect(&mut bus, "box", json!({})).await;
    assert_eq!(seen["pdeathsig"], libc::SIGKILL, "dies with the daemon");
    let env = seen["env"].as_object().unwrap();
    let names: BTreeSet<&str> = env.keys().map(String::as_str).collect();
    assert!(!names.contains("DAEMON_SECRET"), "{names:?}");
    assert!(!names.contains("NOTIFY_SOCKET"), "{names:?}");
    assert!(!names.contains("CREDENTIALS_DIRECTORY"), "{names:?}");
    assert!(!names.contains("RUST_LOG"), "{names:?}");
    assert_eq!(env["PASSED"], "yes");
    assert_eq!(env["MINE"], "1");
    assert_eq!(env["API_KEY"], "s3cret");
    assert_eq!(env["TOKEN"], "from-credentials");
    // Its own state directory and private tmp, writable, both 0700.
    let state = env["TOOLBOXD_STATE_DIR"].as_str().unwrap();
    assert_eq!(env["HOME"], state);
    let tmp = env["TMPDIR"].as_str().unwrap();
    let probe = format!("probe-{}", std::process::id());
    for path in [state, tmp] {
        let wrote = inspect(&mut bus, "box", json!({"write": format!("{path}/{probe}")})).await;
        assert_eq!(wrote["write"], "ok", "{path}: {wrote}");
    }
    use std::os::unix::fs::PermissionsExt;
    let mode = |path: &str| std::fs::metadata(path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(state), 0o700, "{state}");
    if nix::unistd::geteuid().is_root() {
        // Its /tmp is its own (a mount namespace): not the machine's.
        assert_eq!(tmp, "/tmp");
        assert!(!std::path::Path::new(tmp).join(&probe).exists());
    } else {
        assert_eq!(mode(tmp), 0o700, "{tmp}");
    }
}

#[tokio::test]
async fn a_child_has_no_new_privileges_only_fds_0_to_2_no_core_and_umask_077() {
    let dir = TempDir::new("sandbox-proc");
    dir.write("box.toml", &inspector("box", ""));
    let daemon = Daemon::start(dir.path());
    let mut bus = Bus::connect(&daemon.url).await;
    let seen = inspect(&mut bus, "box", json!({})).await;
    let pid = seen["pid"].as_u64().unwrap();
    assert_eq!(status_field(pid, "NoNewPrivs"), "1");
    assert_eq!(seen["umask"], 0o077);
    // Status says what confines the child, mechanism by mechanism.
    let sandbox = daemon.status("box")["sandbox"].clone();
    let mechanisms: Vec<&str> = sandbox
        .as_array()
        .expect("a list")
        .iter()
        .map(|m| m.as_str().expect("words"))
        .collect();
    assert_eq!(mechanisms[0], "standard", "{sandbox}");
    assert!(
        mechanisms.iter().any(|m| m.starts_with("Landlock ABI")),
        "{sandbox}"
    );
    assert!(
        mechanisms.iter().any(|m| m.starts_with("seccomp")),
        "{sandbox}"
    );
    let fds: BTreeSet<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(
        fds,
        ["0", "1", "2"].map(String::from).into(),
        "its descriptors"
    );
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
    let core = limits
        .lines()
        .find(|l| l.starts_with("Max core file size"))
        .unwrap();
    assert_eq!(core.split_whitespace().nth(4), Some("0"), "{core}");
    let nofile = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .unwrap();
    let soft: u64 = nofile.split_whitespace().nth(3).unwrap().parse().unwrap();
    assert!(soft <= 1024, "{nofile}");
    // The daemon is not dumpable: its /proc entries are not for its children.
    assert_eq!(status_field(daemon.pid() as u64, "NoNewPrivs"), "0");
    let dumpable = std::fs::metadata(format!("/proc/{}/environ", daemon.pid())).unwrap();
    use std::os::unix::fs::MetadataExt;
    assert_eq!(
        dumpable.uid(),
        0,
        "a non-dumpable process's /proc files belong to root"
    );
}

#[tokio::test]
async fn profile_off_restores_the_old_behaviour_with_a_warning() {
    let dir = TempDir::new("sandbox-off");
    dir.write(
        "box.toml",
        &inspector("box", "[sandbox]\nprofile = \"off\"\n"),
    );
    let daemon = Daemon::start_env(
        &[
            "--manifests",
            dir.path().to_str().unwrap(),
            "--embedded-bus",
            "127.0.0.1:0",
        ],
        &[("DAEMON_SECRET", "visible-when-off")],
    );
    let mut bus = Bus::connect(&daemon.url).await;
    let seen = inspect(&mut bus, "box", json!({})).await;
    assert_eq!(seen["env"]["DAEMON_SECRET"], "visible-when-off");
    let pid = seen["pid"].as_u64().unwrap();
    assert_eq!(status_field(pid, "NoNewPrivs"), "0");
    assert_eq!(daemon.status("box")["sandbox"], json!(["off"]));
    assert!(!daemon.log_lines_with("sandbox profile \"off\"").is_empty());
}

#[test]
fn a_bad_user_or_sandbox_knob_fails_check_naming_the_key() {
    let dir = TempDir::new("sandbox-check");
    dir.write("math.toml", &math_manifest("math"));
    dir.write(
        "ghost.toml",
        &format!(
            "{}[sandbox]\nuser = \"no-such-user-here\"\n",
            math_manifest("ghost")
        ),
    );
    dir.write(
        "leaky.toml",
        &format!(
            "{}[sandbox]\nenv_pass = [\"NOTIFY_SOCKET\"]\n",
            math_manifest("leaky")
        ),
    );
    dir.write(
        "huge.toml",
        &format!("{}[sandbox]\ntasks_max = 1000000\n", math_manifest("huge")),
    );
    let out = common::output_within(
        Command::new(BIN).args(["check", "--manifests", dir.path().to_str().unwrap()]),
        common::ANSWER_DEADLINE,
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(
        text.contains("ghost.toml:5: [sandbox] user \"no-such-user-here\" does not exist"),
        "{text}"
    );
    assert!(
        text.contains("leaky.toml:5: [sandbox] NOTIFY_SOCKET is never passed to a toolbox"),
        "{text}"
    );
    assert!(
        text.contains("huge.toml:5: [sandbox] tasks_max = 1000000 must be between 0 and 100000"),
        "{text}"
    );
    assert!(text.contains("ok    math"), "{text}");
}

#[tokio::test]
async fn a_secret_that_cannot_be_read_fails_the_start_with_the_reason() {
    // Fail closed: never a child without what it was promised.
    let dir = TempDir::new("sandbox-secret");
    dir.write("math.toml", &math_manifest("math"));
    dir.write(
        "box.toml",
        &inspector(
            "box",
            "[restart]\npolicy = \"never\"\n[sandbox]\nsecrets = { KEY = \"/nonexistent/key\" }\n",
        ),
    );
    let daemon = Daemon::start(dir.path());
    let row = daemon.wait_for_state("box", "failed", Duration::from_secs(10));
    let reason = row["reason"].as_str().unwrap();
    assert!(
        reason
            .contains("failed to start: [sandbox] secrets: cannot read KEY from /nonexistent/key"),
        "{row}"
    );
    let mut bus = Bus::connect(&daemon.url).await;
    bus.assert_math_answers().await;
}

#[tokio::test]
async fn tasks_max_caps_a_fork_storm_and_the_daemon_keeps_serving() {
    let dir = TempDir::new("sandbox-fork");
    dir.write("math.toml", &math_manifest("math"));
    dir.write("box.toml", &inspector("box", "[sandbox]\ntasks_max = 16\n"));
    let daemon = Daemon::start(dir.path());
    let mut bus = Bus::connect(&daemon.url).await;
    let storm = bus.call("box", "fork_storm", json!({"count": 100})).await;
    let forked = storm["result"]["forked"].as_u64().unwrap_or(u64::MAX);
    assert!(forked < 16, "{storm}");
    assert!(storm["result"]["refused"].as_u64().unwrap() > 84, "{storm}");
    bus.assert_math_answers().await;
    // The toolbox itself lives on and says how its limit holds.
    assert_eq!(bus.call("box", "ok", json!({})).await["result"]["ok"], true);
    let ready = daemon.log_lines_with("toolbox ready");
    assert!(
        ready.iter().any(|l| l["sandbox"]
            .as_str()
            .unwrap_or("")
            .contains("tasks_max = 16: cgroup")),
        "{ready:?}"
    );
}

#[tokio::test]
async fn landlock_and_seccomp_hold_writes_proc_and_the_network() {
    // The attack: walk to the daemon's /proc entry, write where it should
    // not, reach the bus. Each step now fails; the neighbour stays ready.
    let dir = TempDir::new("sandbox-attack");
    dir.write("open.toml", &inspector("open", ""));
    dir.write(
        "closed.toml",
        &inspector("closed", "[sandbox]\nnetwork = \"none\"\n"),
    );
    dir.write(
        "full.toml",
        &inspector("full", "[sandbox]\nnetwork = \"full\"\n"),
    );
    let daemon = Daemon::start_env(
        &[
            "--manifests",
            dir.path().to_str().unwrap(),
            "--embedded-bus",
            "127.0.0.1:0",
        ],
        &[("DAEMON_SECRET", "do-not-leak")],
    );
    let port: u16 = daemon
        .url
        .trim_start_matches("ws://127.0.0.1:")
        .trim_end_matches("/core")
        .parse()
        .unwrap();
    let mut bus = Bus::connect(&daemon.url).await;
    let outside = dir.path().join("planted");
    let seen = inspect(
        &mut bus,
        "open",
        json!({
            "write": outside.to_str().unwrap(),
            "read": format!("/proc/{}/environ", daemon.pid()),
            "connect": port,
        }),
    )
    .await;
    assert_ne!(seen["write"], "ok", "{seen}");
    assert!(!outside.exists());
    assert_ne!(seen["read"], "ok", "read the daemon's environment: {seen}");
    assert_ne!(
        seen["connect"], "ok",
        "the default network (internet: ports 80 and 443) reached the bus: {seen}"
    );
    let pid = seen["pid"].as_u64().unwrap();
    assert_eq!(status_field(pid, "Seccomp"), "2");
    assert_eq!(status_field(pid, "NoNewPrivs"), "1");

    let seen = inspect(&mut bus, "full", json!({"connect": port})).await;
    assert_eq!(
        seen["connect"], "ok",
        "network = full reaches the bus: {seen}"
    );
    let seen = inspect(&mut bus, "closed", json!({"connect": port})).await;
    assert_ne!(
        seen["connect"], "ok",
        "network = none reached the bus: {seen}"
    );
    assert_eq!(daemon.status("open")["state"], "ready");
    let ready = daemon.log_lines_with("toolbox ready");
    assert!(
        ready.iter().all(|l| {
            let s = l["sandbox"].as_str().unwrap_or("");
            s.contains("Landlock ABI") && s.contains("seccomp")
        }),
        "{ready:?}"
    );
}

#[test]
fn check_sandbox_says_what_holds_here_and_fails_on_what_cannot() {
    let dir = TempDir::new("sandbox-report");
    dir.write("math.toml", &math_manifest("math"));
    dir.write(
        "closed.toml",
        &format!("{}[sandbox]\nnetwork = \"none\"\n", math_manifest("closed")),
    );
    let run = |dir: &std::path::Path| {
        let out = common::output_within(
            Command::new(BIN).args(["check", "--sandbox", "--manifests", dir.to_str().unwrap()]),
            common::ANSWER_DEADLINE,
        );
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )
    };
    let (code, text) = run(dir.path());
    assert_eq!(code, Some(0), "{text}");
    for line in [
        "sandbox math  ok    Landlock: Landlock ABI",
        "sandbox math  ok    seccomp: filter for",
        "sandbox math  ok    tasks_max = 80: cgroup",
        "sandbox closed  ok    network = none: no IP socket (seccomp), no TCP (Landlock)",
    ] {
        assert!(text.contains(line), "{line}: {text}");
    }
    // A secret that cannot be read would fail the start: check says so.
    dir.write(
        "secret.toml",
        &format!(
            "{}[sandbox]\nsecrets = {{ KEY = \"/nonexistent/key\" }}\n",
            math_manifest("secret")
        ),
    );
    let (code, text) = run(dir.path());
    assert_eq!(code, Some(1), "{text}");
    assert!(
        text.contains(
            "sandbox secret  FAIL  [sandbox] secrets: cannot read KEY from /nonexistent/key"
        ),
        "{text}"
    );
}

#[tokio::test]
async fn a_toolbox_runs_as_its_own_user_when_the_daemon_is_root() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipped: per-toolbox users need a daemon running as root");
        return;
    }
    // The system's interpreter: another user may not enter root's home,
    // where a per-user Python may live.
    let python = ["/usr/bin/python3", "/usr/local/bin/python3"]
        .into_iter()
        .find(|p| std::path::Path::new(p).exists())
        .expect("a system python3");
    let dir = TempDir::new("sandbox-user");
    let manifest = inspector("box", "[sandbox]\nuser = \"nobody\"\ngroup = \"nogroup\"\n")
        .replace("command = \"python3\"", &format!("command = {python:?}"));
    dir.write("box.toml", &manifest);
    let daemon = Daemon::start(dir.path());
    let mut bus = Bus::connect(&daemon.url).await;
    let seen = inspect(&mut bus, "box", json!({})).await;
    let pid = seen["pid"].as_u64().expect("the child answers");
    // A change of user clears the parent-death signal: it is set again after.
    assert_eq!(seen["pdeathsig"], libc::SIGKILL, "{seen}");
    let ids = |field: &str| -> Vec<String> {
        status_field(pid, field)
            .split_whitespace()
            .map(str::to_owned)
            .collect()
    };
    assert_eq!(ids("Uid"), ["65534"; 4], "real, effective, saved, fs uid");
    assert_eq!(ids("Gid"), ["65534"; 4]);
    assert_eq!(
        ids("Groups"),
        Vec::<String>::new(),
        "supplementary groups dropped"
    );
    assert_eq!(daemon.status("box")["state"], "ready");
}

#[tokio::test]
async fn a_refused_path_is_named_with_the_key_that_would_allow_it() {
    // A toolbox reads a file outside its sandbox: the operator sees the
    // path and the manifest line that would allow it, in status, in
    // `ctl logs`, and in a failed start's report.
    let data = TempDir::outside("refused");
    let file = data.write("notes.txt", "private");
    let dir = TempDir::new("sandbox-refused");
    let manifest = dir.write("box.toml", &inspector("box", ""));
    let daemon = Daemon::start(dir.path());
    let mut bus = Bus::connect(&daemon.url).await;
    let answer = bus
        .call("box", "read_file", json!({"path": file.to_str().unwrap()}))
        .await;
    let error = answer["error"].as_str().unwrap_or_default();
    assert!(error.contains("Permission denied"), "{answer}");
    let allow = format!(
        "read_only = [\"{}\"] under [sandbox] in {}",
        data.path().display(),
        manifest.display()
    );
    let status = daemon.status("box");
    let refused = status["sandbox_refused"].to_string();
    assert!(refused.contains(file.to_str().unwrap()), "{status}");
    assert!(refused.contains(&allow.replace('"', "\\\"")), "{status}");
    let (code, table, _) = daemon.ctl(&["status"]);
    assert_eq!(code, 0);
    assert!(table.contains(&allow), "{table}");
    let (code, logs, _) = daemon.ctl(&["logs", "box"]);
    assert_eq!(code, 0);
    assert!(logs.contains(&allow), "{logs}");
    // Its own files, the system and its state stay quiet: only what the
    // sandbox refused is explained.
    let seen = inspect(&mut bus, "box", json!({"read": "/etc/hostname"})).await;
    assert_eq!(seen["read"], "ok");
    assert_eq!(
        daemon.status("box")["sandbox_refused"]
            .as_array()
            .unwrap()
            .len(),
        1
    );

    // A child that fails its start for want of a path: the failure says why.
    let failing = TempDir::new("sandbox-refused-start");
    let manifest = failing.write(
        "reader.toml",
        &format!(
            "id = \"reader\"\ncommand = \"/bin/sh\"\nargs = [\"-c\", \"cat {} >&2; exit 3\"]\n",
            file.display()
        ),
    );
    let out = common::output_within(
        Command::new(BIN).args([
            "check",
            "--probe",
            "--manifests",
            failing.path().to_str().unwrap(),
        ]),
        common::ANSWER_DEADLINE * 2,
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(
        text.contains(&format!(
            "read_only = [\"{}\"] under [sandbox] in {}",
            data.path().display(),
            manifest.display()
        )),
        "{text}"
    );
}

#[tokio::test]
async fn a_directory_argument_is_read_only_and_opens_nothing_beside_it() {
    // `--repository DIR`: the toolbox may read DIR (a git server needs
    // to), never write it, and nothing next to it; its env may name its
    // state directory.
    let data = TempDir::outside("dir-arg");
    let inside = data.write("inside.txt", "mine");
    let beside = TempDir::outside("dir-arg-beside");
    let other = beside.write("other.txt", "not mine");
    let dir = TempDir::new("sandbox-dir-arg");
    dir.write(
        "box.toml",
        &format!(
            "id = \"box\"\ncommand = \"python3\"\nargs = [\"{}\", \"--repository\", \"{}\"]\n\
             env = {{ MEMORY_FILE_PATH = \"$TOOLBOXD_STATE_DIR/memory.json\", \
             KEPT = \"${{NOT_OURS}}/x\" }}\n",
            repo("tests/fixtures/faulty_toolbox.py"),
            data.path().display()
        ),
    );
    let daemon = Daemon::start(dir.path());
    let mut bus = Bus::connect(&daemon.url).await;
    let seen = inspect(
        &mut bus,
        "box",
        json!({"read": inside.to_str().unwrap(), "write": data.path().join("new.txt").to_str().unwrap()}),
    )
    .await;
    assert_eq!(seen["read"], "ok", "{seen}");
    assert_eq!(seen["write"], "Permission denied", "{seen}");
    assert!(!data.path().join("new.txt").exists());
    let seen = inspect(&mut bus, "box", json!({"read": other.to_str().unwrap()})).await;
    assert_eq!(seen["read"], "Permission denied", "{seen}");
    let env = &seen["env"];
    assert_eq!(
        env["MEMORY_FILE_PATH"].as_str().unwrap(),
        format!(
            "{}/memory.json",
            env["TOOLBOXD_STATE_DIR"].as_str().unwrap()
        )
    );
    assert_eq!(env["KEPT"], "${NOT_OURS}/x");
    // check --sandbox lists it, and why.
    let out = common::output_within(
        Command::new(BIN).args([
            "check",
            "--sandbox",
            "--manifests",
            dir.path().to_str().unwrap(),
        ]),
        common::ANSWER_DEADLINE,
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains(&format!(
            "reads  {}  (a directory its arguments name (read only))",
            data.path().display()
        )),
        "{text}"
    );
    assert!(!text.contains(beside.path().to_str().unwrap()), "{text}");
}
