//! Attacks run from inside a default toolbox (a manifest with no `user`),
//! each judged from outside: the file's mode and owner, the daemon's limits
//! and priority, the socket's accept queue. docs/security.md, "Users".

mod common;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::time::Duration;

use common::*;
use serde_json::{json, Value};

fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// A manifest for the fixture toolbox (its `attack` tool) under `id`.
fn attacker(id: &str, extra: &str) -> String {
    format!(
        "id = \"{id}\"\ncommand = \"python3\"\nargs = [\"{}\"]\n{extra}\n",
        repo("tests/fixtures/faulty_toolbox.py")
    )
}

/// Runs `attacks` ([kind, target] pairs) in toolbox `id`: what it saw.
async fn attack(bus: &mut Bus, id: &str, attacks: &[(&str, String)]) -> Value {
    let attacks: Vec<Value> = attacks.iter().map(|(k, t)| json!([k, t])).collect();
    let answer = bus.call(id, "attack", json!({ "attacks": attacks })).await;
    answer["result"].clone()
}

/// A line of `/proc/<pid>/limits`, e.g. "Max cpu time".
fn limit(pid: u32, name: &str) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/limits"))
        .unwrap()
        .lines()
        .find(|l| l.starts_with(name))
        .unwrap_or_else(|| panic!("no {name} limit"))
        .split_whitespace()
        .skip(name.split_whitespace().count())
        .take(2)
        .collect::<Vec<_>>()
        .join(" ")
}

/// Field `n` (1-based, as proc(5) counts) of `/proc/<pid>/stat`.
fn stat_field(pid: u32, n: usize) -> String {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // After the command's closing parenthesis: field 3 on.
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    rest.split_whitespace().nth(n - 3).unwrap().to_owned()
}

/// The daemon `pid`'s keeper: its child running `toolboxd __keeper`.
fn keeper_of(pid: u32) -> u32 {
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .find(|&p| {
            let parent = std::fs::read_to_string(format!("/proc/{p}/stat"))
                .ok()
                .and_then(|s| {
                    s.rsplit_once(')')
                        .and_then(|(_, rest)| rest.split_whitespace().nth(1)?.parse::<u32>().ok())
                });
            let cmdline = std::fs::read(format!("/proc/{p}/cmdline")).unwrap_or_default();
            parent == Some(pid) && String::from_utf8_lossy(&cmdline).contains("__keeper")
        })
        .expect("the daemon has a keeper")
}

/// Whether `path` has the extended attribute `name`.
fn has_xattr(path: &std::path::Path, name: &str) -> bool {
    let path = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
    let name = std::ffi::CString::new(name).unwrap();
    // SAFETY: a size query (no buffer) on NUL-terminated strings.
    unsafe { libc::getxattr(path.as_ptr(), name.as_ptr(), std::ptr::null_mut(), 0) >= 0 }
}

#[tokio::test]
async fn a_default_toolbox_of_a_root_daemon_is_no_root_and_cannot_touch_roots_files_or_the_daemon()
{
    if !is_root() {
        eprintln!("skipped: the attacks are those of a root daemon's toolbox");
        return;
    }
    let dir = TempDir::new("confinement-root");
    dir.write("box.toml", &attacker("box", ""));
    // Outside the sandbox: a root-owned 0600 file and a root-only socket.
    let outside = TempDir::new("confinement-outside");
    let victim = outside.write("victim", "root's");
    std::fs::set_permissions(&victim, std::fs::Permissions::from_mode(0o600)).unwrap();
    let mtime = std::fs::metadata(&victim).unwrap().mtime();
    let socket_path = outside.path().join("root-only.sock");
    let listener = std::os::unix::net::UnixListener::bind(&socket_path).unwrap();
    std::fs::set_permissions(&socket_path, std::fs::Permissions::from_mode(0o600)).unwrap();
    listener.set_nonblocking(true).unwrap();
    // In its own read set (the manifest's directory): another toolbox's
    // secret, root's and 0600, as docs/security.md says to keep one.
    let secret = dir.write("wifi.secret", "psk=hunter2");
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();

    let daemon = Daemon::start(dir.path());
    let mut bus = Bus::connect(&daemon.url).await;
    let pid = daemon.pid();
    let (cpu, nofile) = (limit(pid, "Max cpu time"), limit(pid, "Max open files"));
    let v = |p: &std::path::Path| p.display().to_string();
    let attacks = [
        ("chmod", v(&victim)),
        ("chown", v(&victim)),
        ("utime", v(&victim)),
        ("setxattr", v(&victim)),
        ("read", "/etc/shadow".to_owned()),
        ("read", v(&secret)),
        ("unix_connect", v(&socket_path)),
        ("prlimit_cpu", pid.to_string()),
        ("prlimit_nofile", pid.to_string()),
        ("setpriority", pid.to_string()),
        ("sched_idle", pid.to_string()),
        ("kill", pid.to_string()),
        ("fanotify", String::new()),
        ("shmget", String::new()),
        ("sethostname", String::new()),
        ("syslog", String::new()),
        ("packet", String::new()),
        ("raw", String::new()),
        // Every toolbox's pids are listed there.
        ("list", "/sys/fs/cgroup".to_owned()),
    ];
    let seen = attack(&mut bus, "box", &attacks).await;
    for (kind, target) in &attacks {
        assert_ne!(
            seen[format!("{kind} {target}")],
            "ok",
            "{kind} {target}: {seen}"
        );
    }

    // Judged from outside.
    let child = seen["pid"].as_u64().expect("the child answers") as u32;
    let status = std::fs::read_to_string(format!("/proc/{child}/status")).unwrap();
    let uid = seen["uid"].as_u64().unwrap();
    assert!(
        (2_130_706_432..2_130_706_432 + 65_536).contains(&uid),
        "{seen}"
    );
    assert!(
        status.contains(&format!("Uid:\t{uid}\t{uid}\t{uid}\t{uid}\n")),
        "{status}"
    );
    let groups = status.lines().find(|l| l.starts_with("Groups:")).unwrap();
    assert_eq!(groups.trim_start_matches("Groups:").trim(), "", "{status}");
    for set in ["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"] {
        assert!(
            status.contains(&format!("{set}:\t0000000000000000\n")),
            "{set}: {status}"
        );
    }
    let meta = std::fs::metadata(&victim).unwrap();
    assert_eq!(meta.mode() & 0o7777, 0o600, "the victim's mode");
    assert_eq!((meta.uid(), meta.gid()), (0, 0), "the victim's owner");
    assert_eq!(meta.mtime(), mtime, "the victim's time");
    assert!(!has_xattr(&victim, "security.capability"));
    assert!(
        matches!(listener.accept(), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock),
        "the root-only socket accepted a toolbox"
    );
    assert_eq!(limit(pid, "Max cpu time"), cpu, "the daemon's RLIMIT_CPU");
    assert_eq!(
        limit(pid, "Max open files"),
        nofile,
        "the daemon's RLIMIT_NOFILE"
    );
    assert_eq!(stat_field(pid, 19), "0", "the daemon's nice value");
    assert_eq!(stat_field(pid, 41), "0", "the daemon's scheduling policy");

    // Its state directory is its own; status says who it is.
    let row = daemon.status("box");
    let sandbox = row["sandbox"].to_string();
    assert!(sandbox.contains(&format!("uid {uid}")), "{row}");
    assert!(sandbox.contains("capabilities: none"), "{row}");
    assert!(sandbox.contains("network = internet"), "{row}");
    if let Some(root) = std::env::var_os("STATE_DIRECTORY") {
        let state = std::path::Path::new(&root).join("box/state");
        let meta = std::fs::metadata(&state).unwrap();
        assert_eq!(
            u64::from(meta.uid()),
            uid,
            "{} is the toolbox's",
            state.display()
        );
        assert_eq!(meta.mode() & 0o777, 0o700);
    }
    assert_eq!(row["state"], "ready");
    // The daemon lives on, with every limit it had (SIGXCPU would have
    // ended it by now had RLIMIT_CPU been set to 1 s).
    assert_eq!(attack(&mut bus, "box", &[]).await["pid"], child);
}

#[tokio::test]
async fn user_root_is_an_opt_in_that_status_and_the_log_say_out_loud() {
    if !is_root() {
        eprintln!("skipped: needs a root daemon");
        return;
    }
    let dir = TempDir::new("confinement-optin");
    dir.write(
        "root.toml",
        &attacker("root", "[sandbox]\nuser = \"root\"\n")
            .replace("command = \"python3\"", "command = \"/usr/bin/python3\""),
    );
    let daemon = Daemon::start(dir.path());
    let row = daemon.status("root");
    assert!(
        row["sandbox"]
            .to_string()
            .contains("uid 0 (user = \\\"root\\\")"),
        "{row}"
    );
    assert!(
        daemon
            .log_lines_with("user = \"root\"")
            .iter()
            .any(|l| l["level"] == "WARN"),
        "no warning about a root toolbox"
    );
}

#[tokio::test]
async fn a_toolbox_of_a_daemon_that_is_not_root_cannot_set_the_daemons_limits_or_priority() {
    if !is_root() {
        eprintln!("skipped: the test makes a daemon run as nobody");
        return;
    }
    let nobody = nix::unistd::User::from_name("nobody").unwrap().unwrap();
    let ids = (nobody.uid.as_raw(), nobody.gid.as_raw());
    // The control socket's directory is named, so that the toolbox's own
    // view keeps it visible and the peer check is what refuses it.
    let control_dir = TempDir::new("confinement-user-ctl");
    std::os::unix::fs::chown(control_dir.path(), Some(ids.0), Some(ids.1)).unwrap();
    let control = control_dir.path().join("ctl.sock");
    let dir = TempDir::new("confinement-user");
    dir.write(
        "box.toml",
        &attacker(
            "box",
            &format!("[sandbox]\nread_only = [{:?}]\n", control_dir.path()),
        )
        .replace("command = \"python3\"", "command = \"/usr/bin/python3\""),
    );
    let state = TempDir::new("confinement-user-state");
    std::os::unix::fs::chown(state.path(), Some(ids.0), Some(ids.1)).unwrap();
    let daemon = Daemon::start_as(
        Some(ids),
        &[
            "--manifests",
            dir.path().to_str().unwrap(),
            "--embedded-bus",
            "127.0.0.1:0",
            "--control",
            control.to_str().unwrap(),
        ],
        &[("STATE_DIRECTORY", state.path().to_str().unwrap())],
        "ready",
    );
    let mut bus = Bus::connect(&daemon.url).await;
    let pid = daemon.pid();
    let cpu = limit(pid, "Max cpu time");
    // The keeper, which kills what a toolbox left when the daemon dies:
    // disarming its limits let a grandchild outlive the daemon.
    let keeper = keeper_of(pid);
    let keeper_cpu = limit(keeper, "Max cpu time");
    let attacks = [
        ("prlimit_cpu", pid.to_string()),
        ("prlimit_nofile", pid.to_string()),
        ("setpriority", pid.to_string()),
        ("sched_idle", pid.to_string()),
        ("kill", pid.to_string()),
        ("shmget", String::new()),
        ("prlimit_cpu", keeper.to_string()),
        ("prlimit_nofile", keeper.to_string()),
        ("kill", keeper.to_string()),
    ];
    let seen = attack(&mut bus, "box", &attacks).await;
    // The same user as the daemon: the kernel would allow each of these;
    // the seccomp filter (and Landlock's signal scope) refuse them.
    assert_eq!(seen["uid"], ids.0, "{seen}");
    for (kind, target) in &attacks {
        assert_ne!(
            seen[format!("{kind} {target}")],
            "ok",
            "{kind} {target}: {seen}"
        );
    }
    assert_eq!(limit(pid, "Max cpu time"), cpu);
    assert_eq!(
        limit(keeper, "Max cpu time"),
        keeper_cpu,
        "the keeper's RLIMIT_CPU"
    );
    assert_eq!(stat_field(pid, 19), "0", "the daemon's nice value");
    assert_eq!(stat_field(pid, 41), "0", "the daemon's scheduling policy");
    let row = daemon.status("box");
    assert!(
        row["sandbox"]
            .to_string()
            .contains("shared with every toolbox"),
        "{row}"
    );
    // Its own view of the filesystem, in a user namespace of the daemon's
    // user that it left with no capability.
    assert!(
        row["sandbox"].to_string().contains("in a user namespace"),
        "{row}"
    );
    let child = seen["pid"].as_u64().unwrap();
    let status = std::fs::read_to_string(format!("/proc/{child}/status")).unwrap();
    for set in ["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"] {
        assert!(
            status.contains(&format!("{set}:\t0000000000000000\n")),
            "{set}: {status}"
        );
    }
    // Its grandchild leaves the tree (setsid, its parent gone) and, the
    // same user as the daemon, reaches the control socket: refused.
    let line = json!({"jsonrpc": "2.0", "id": 1, "method": "logs", "params": {"id": "box"}});
    let r = bus
        .call(
            "box",
            "control_orphan",
            json!({"path": daemon.control.to_str().unwrap(), "line": line.to_string()}),
        )
        .await;
    assert_ne!(r["result"]["ppid"], daemon.pid(), "re-parented away: {r}");
    let answer = r["result"]["answer"].as_str().unwrap_or_default();
    assert!(
        !answer.contains("\"result\""),
        "an orphan read the logs: {answer}"
    );
    daemon.wait_for_log(
        "control socket: refused a connection",
        1,
        Duration::from_secs(5),
    );
}

#[tokio::test]
async fn a_default_toolbox_of_a_root_daemon_has_its_own_tmp_and_shm_and_sees_no_sockets_under_run()
{
    if !is_root() {
        eprintln!("skipped: only a root daemon makes a private view");
        return;
    }
    // World-connectable sockets where services keep theirs: one the
    // manifest names (bound back into its view), one it does not.
    let tag = format!("toolboxd-test-{}", std::process::id());
    let run = std::path::PathBuf::from(format!("/run/{tag}"));
    std::fs::create_dir_all(&run).unwrap();
    let socket = |name: &str| {
        let path = run.join(name);
        let _ = std::fs::remove_file(&path);
        let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666)).unwrap();
        listener.set_nonblocking(true).unwrap();
        (path, listener)
    };
    let (hidden, hidden_listener) = socket("service.sock");
    let (named, named_listener) = socket("named.sock");
    let dir = TempDir::new("confinement-view");
    dir.write(
        "box.toml",
        &attacker(
            "box",
            &format!(
                "[sandbox]\nmemory_max_mib = 64\nread_write = [\"{}\"]\n",
                named.display()
            ),
        ),
    );
    let daemon = Daemon::start(dir.path());
    let mut bus = Bus::connect(&daemon.url).await;
    let shm = format!("/dev/shm/{tag}");
    let tmp = format!("/tmp/{tag}");
    // Its own directory is under /tmp: bound back into its view, read-only.
    let own = dir.path().join("planted").display().to_string();
    let attacks = [
        ("shm_fill", shm.clone()),
        ("shm_fill", tmp.clone()),
        ("shm_fill", own.clone()),
        ("unix_connect", hidden.display().to_string()),
        ("unix_connect", named.display().to_string()),
        ("list", "/run".to_owned()),
    ];
    let seen = attack(&mut bus, "box", &attacks).await;
    assert_eq!(seen[format!("shm_fill {shm}")], "ok", "{seen}");
    assert_eq!(seen[format!("shm_fill {tmp}")], "ok", "{seen}");
    assert_ne!(seen[format!("shm_fill {own}")], "ok", "{seen}");
    assert!(!std::path::Path::new(&own).exists());
    assert_ne!(
        seen[format!("unix_connect {}", hidden.display())],
        "ok",
        "{seen}"
    );
    assert_eq!(
        seen[format!("unix_connect {}", named.display())],
        "ok",
        "{seen}"
    );
    // Judged from outside: nothing it wrote is in the machine's /dev/shm
    // or /tmp, the hidden socket accepted nothing, the named one one.
    assert!(!std::path::Path::new(&shm).exists());
    assert!(!std::path::Path::new(&tmp).exists());
    assert!(
        matches!(hidden_listener.accept(), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock)
    );
    assert!(
        named_listener.accept().is_ok(),
        "the named socket was not reached"
    );
    let row = daemon.status("box");
    assert!(
        row["sandbox"]
            .to_string()
            .contains("private /tmp and /dev/shm"),
        "{row}"
    );
    // Bounded: a write past the tmpfs's size (its memory limit) fails.
    let big: Vec<(&str, String)> = (0..10)
        .map(|i| ("shm_fill", format!("/dev/shm/{tag}-{i}")))
        .collect();
    let seen = attack(&mut bus, "box", &big).await;
    assert!(
        big.iter().any(|(k, t)| seen[format!("{k} {t}")] != "ok"),
        "80 MiB fit in a 64 MiB /dev/shm: {seen}"
    );
    drop(daemon);
    std::fs::remove_dir_all(&run).unwrap();
}

#[tokio::test]
async fn a_path_with_dot_dots_under_a_hidden_directory_changes_nothing_outside_the_view() {
    if !is_root() {
        eprintln!("skipped: only a root daemon makes a private view");
        return;
    }
    // The script's own `#!` line names its interpreter through /tmp and
    // /root: the view's steps, run as root, must not follow it out.
    let before = std::fs::metadata("/root").map(|m| m.mode() & 0o7777).ok();
    let dir = TempDir::new("confinement-dotdot");
    let script = dir.write(
        "box.py",
        &format!(
            "#!/tmp/../root/../usr/bin/python3\nimport runpy, sys\nsys.argv[1:] = []\n\
             runpy.run_path({:?}, run_name=\"__main__\")\n",
            repo("tests/fixtures/faulty_toolbox.py")
        ),
    );
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    dir.write(
        "box.toml",
        &format!(
            "id = \"box\"\ncommand = \"{}\"\n[sandbox]\nread_only = [{:?}]\n",
            script.display(),
            repo("tests")
        ),
    );
    let daemon = Daemon::start(dir.path());
    let after = std::fs::metadata("/root").map(|m| m.mode() & 0o7777).ok();
    if after != before {
        if let Some(mode) = before {
            std::fs::set_permissions("/root", std::fs::Permissions::from_mode(mode)).unwrap();
        }
        panic!("/root went from {before:?} to {after:?}");
    }
    let root_mode = std::fs::metadata("/").unwrap().mode() & 0o7777;
    assert_eq!(root_mode, 0o755);
    drop(daemon);
}

#[tokio::test]
async fn a_state_directory_past_its_bound_stops_the_child_and_its_next_start_says_why() {
    // 2 GiB written to a state directory in 1.1 s were kept, with no bound.
    let dir = TempDir::new("confinement-state");
    let state = TempDir::new("confinement-state-root");
    dir.write(
        "box.toml",
        &attacker(
            "box",
            "[limits]\nprobe_interval_s = 1\n[restart]\nmax_restarts = 1\n[sandbox]\nstate_max_mib = 4\n",
        ),
    );
    let daemon = Daemon::start_env(
        &[
            "--manifests",
            dir.path().to_str().unwrap(),
            "--embedded-bus",
            "127.0.0.1:0",
        ],
        &[("STATE_DIRECTORY", state.path().to_str().unwrap())],
    );
    let mut bus = Bus::connect(&daemon.url).await;
    let own = state.path().join("box/state");
    let attacks: Vec<(&str, String)> = (0..2)
        .map(|i| ("shm_fill", own.join(format!("f{i}")).display().to_string()))
        .collect();
    let seen = attack(&mut bus, "box", &attacks).await;
    assert!(
        attacks
            .iter()
            .all(|(k, t)| seen[format!("{k} {t}")] == "ok"),
        "{seen}"
    );
    // Killed at a liveness probe; its restarts are refused, saying why.
    let row = daemon.wait_for_state("box", "failed", Duration::from_secs(20));
    assert!(
        row.to_string()
            .contains("holds more than state_max_mib = 4 MiB"),
        "{row}"
    );
}
