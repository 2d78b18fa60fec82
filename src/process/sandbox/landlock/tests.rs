//! Real children under real rulesets: each test spawns a process confined
//! by [`Prepared::apply_in_child`] and checks what it could and could not do.

use super::*;
use std::net::TcpListener;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// Set to run the suite on a kernel without (some of) Landlock: the tests
/// that need it then pass after saying so on stderr. Unset, they fail.
const ALLOW_MISSING: &str = "TOOLBOXD_TEST_ALLOW_NO_LANDLOCK";

/// Whether the kernel has `feature`; fails the test when it has not, unless
/// [`ALLOW_MISSING`] is set.
fn require(available: bool, feature: &str) -> bool {
    if available {
        return true;
    }
    let message = format!(
        "LANDLOCK TEST NOT RUN: this kernel lacks {feature} ({}); set {ALLOW_MISSING}=1 to accept that",
        support()
    );
    assert!(std::env::var_os(ALLOW_MISSING).is_some(), "{message}");
    eprintln!("{message}");
    false
}

/// Whether the kernel has Landlock at all.
fn landlock() -> bool {
    require(support().abi().is_some(), "Landlock")
}

/// A directory removed with its contents when dropped.
struct TempDir(PathBuf);

impl TempDir {
    fn new(label: &str) -> TempDir {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let path = PathBuf::from("/tmp").join(format!(
            "toolboxd-landlock-{}-{label}-{n}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).unwrap();
        TempDir(path)
    }

    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// `cmd` confined by `prepared`, run to its end with no stdin.
fn run_confined(mut cmd: Command, prepared: Arc<Prepared>) -> io::Result<Output> {
    // SAFETY: apply_in_child makes only async-signal-safe system calls.
    unsafe {
        cmd.pre_exec(move || prepared.apply_in_child());
    }
    cmd.stdin(Stdio::null()).output()
}

/// `/bin/sh -c script sh args...`, confined by `policy`.
fn sh(policy: &FsPolicy, script: &str, args: &[&str]) -> Output {
    let prepared = Arc::new(prepare(policy).unwrap());
    let mut cmd = Command::new("/bin/sh");
    cmd.arg("-c").arg(script).arg("sh").args(args);
    run_confined(cmd, prepared).unwrap()
}

/// `/bin/sh -c script sh args...`, not confined: the control that shows a
/// denial comes from the sandbox.
fn sh_unconfined(script: &str, args: &[&str]) -> Output {
    Command::new("/bin/sh")
        .arg("-c")
        .arg(script)
        .arg("sh")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn assert_ok(output: &Output) {
    assert!(
        output.status.success(),
        "expected success, got {:?}\nstdout: {}\nstderr: {}",
        output.status,
        text(&output.stdout),
        text(&output.stderr)
    );
}

/// Failed with EACCES ("Permission denied"), as Landlock denies.
fn assert_denied(output: &Output) {
    assert!(
        !output.status.success() && text(&output.stderr).contains("Permission denied"),
        "expected a denial (EACCES), got {:?}\nstdout: {}\nstderr: {}",
        output.status,
        text(&output.stdout),
        text(&output.stderr)
    );
}

fn standard() -> FsPolicy {
    FsPolicy::standard(Vec::new(), Vec::new(), Tcp::Open)
}

fn path_str(path: &Path) -> &str {
    path.to_str().unwrap()
}

#[test]
fn support_is_reported() {
    let support = support();
    eprintln!("landlock support: {support}");
    if !landlock() {
        return;
    }
    let abi = support.abi().unwrap();
    assert!(support
        .to_string()
        .starts_with(&format!("Landlock ABI {abi}: filesystem")));
}

#[test]
fn a_read_path_can_be_read_not_written() {
    if !landlock() {
        return;
    }
    let ro = TempDir::new("ro");
    std::fs::write(ro.path().join("data"), "hello\n").unwrap();
    let mut policy = standard();
    policy.read.push(ro.path().to_path_buf());
    let dir = path_str(ro.path());

    assert_eq!(
        text(&sh(&policy, r#"cat "$1/data""#, &[dir]).stdout),
        "hello\n"
    );
    assert_denied(&sh(&policy, r#"echo changed > "$1/data""#, &[dir]));
    assert_denied(&sh(&policy, r#"echo new > "$1/new""#, &[dir]));
    assert_denied(&sh(&policy, r#"rm "$1/data""#, &[dir]));
    assert_eq!(
        std::fs::read_to_string(ro.path().join("data")).unwrap(),
        "hello\n"
    );
    assert!(!ro.path().join("new").exists());
}

#[test]
fn a_read_write_dir_can_be_written() {
    if !landlock() {
        return;
    }
    let rw = TempDir::new("rw");
    let mut policy = standard();
    policy.read_write.push(rw.path().to_path_buf());
    // Create, make a directory, move between directories (the refer
    // right), truncate, read, remove.
    let output = sh(
        &policy,
        r#"echo hi > "$1/f" && mkdir "$1/d" && mv "$1/f" "$1/d/g" && echo again > "$1/d/g" && cat "$1/d/g" && rm -r "$1/d" && echo > /dev/null"#,
        &[path_str(rw.path())],
    );
    assert_ok(&output);
    assert_eq!(text(&output.stdout), "again\n");
    assert!(!rw.path().join("d").exists());
}

#[test]
fn tmp_is_not_writable_unless_granted() {
    if !landlock() {
        return;
    }
    let rw = TempDir::new("private-tmp");
    let mut policy = standard();
    policy.read_write.push(rw.path().to_path_buf());
    let outside =
        PathBuf::from("/tmp").join(format!("toolboxd-landlock-{}-outside", std::process::id()));
    let _ = std::fs::remove_file(&outside);
    assert_denied(&sh(&policy, r#"echo x > "$1""#, &[path_str(&outside)]));
    assert!(!outside.exists(), "the child wrote {}", outside.display());
    assert_denied(&sh(&policy, r#"mkdir "$1""#, &[path_str(&outside)]));
    assert!(!outside.exists());
}

#[test]
fn no_device_nodes_in_a_read_write_dir() {
    if !landlock() {
        return;
    }
    let rw = TempDir::new("mknod");
    let mut policy = standard();
    policy.read_write.push(rw.path().to_path_buf());
    let dir = path_str(rw.path());
    let node = r#"mknod "$1/null" c 1 3"#;
    assert_denied(&sh(&policy, node, &[dir]));
    assert!(!rw.path().join("null").exists());
    // As root the same command works unconfined: the denial is the sandbox's.
    if nix::unistd::geteuid().is_root() {
        assert_ok(&sh_unconfined(node, &[dir]));
    }
}

#[test]
fn other_processes_proc_is_closed_own_proc_is_open() {
    if !landlock() {
        return;
    }
    let me = std::process::id().to_string();
    let environ = r#"cat "/proc/$1/environ" > /dev/null"#;
    // Unconfined the child may read its parent's environment (same user).
    assert_ok(&sh_unconfined(environ, &[&me]));
    assert_denied(&sh(&standard(), environ, &[&me]));
    assert_denied(&sh(
        &standard(),
        r#"cat "/proc/$1/maps" > /dev/null"#,
        &[&me],
    ));

    // Nor another confined child's (another toolbox's secrets).
    let prepared = Arc::new(prepare(&standard()).unwrap());
    let mut sibling = Command::new("/bin/sleep");
    sibling.arg("30").stdin(Stdio::null());
    let shared = prepared.clone();
    // SAFETY: apply_in_child makes only async-signal-safe system calls.
    unsafe {
        sibling.pre_exec(move || shared.apply_in_child());
    }
    let mut sibling = sibling.spawn().unwrap();
    let sibling_pid = sibling.id().to_string();
    let mut reader = Command::new("/bin/sh");
    reader.arg("-c").arg(environ).arg("sh").arg(&sibling_pid);
    let output = run_confined(reader, prepared);
    let _ = sibling.kill();
    let _ = sibling.wait();
    assert_denied(&output.unwrap());

    // Its own, read by the shell itself (the child the ruleset was made
    // for): `read` is a builtin.
    let own = sh(
        &standard(),
        r#"read -r first < /proc/self/status && echo "$first" && : < /proc/self/environ && echo ok"#,
        &[],
    );
    assert_ok(&own);
    assert_eq!(text(&own.stdout), "Name:\tsh\nok\n");
}

/// A Python program connecting to `port` on 127.0.0.1, then binding a port.
const CONNECT: &str = r#"
import socket, sys
c = socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=10)
print("connected")
b = socket.socket()
b.bind(("127.0.0.1", 0))
print("bound")
"#;

fn python_connect(policy: &FsPolicy, port: u16) -> Output {
    let prepared = Arc::new(prepare(policy).unwrap());
    let mut cmd = Command::new("python3");
    cmd.arg("-c").arg(CONNECT).arg(port.to_string());
    run_confined(cmd, prepared).unwrap()
}

#[test]
fn network_none_denies_tcp() {
    if !require(support().network(), "network rules (ABI 4)") {
        return;
    }
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();

    let open = python_connect(&standard(), port);
    assert_ok(&open);
    assert_eq!(text(&open.stdout), "connected\nbound\n");

    let closed = python_connect(
        &FsPolicy::standard(Vec::new(), Vec::new(), Tcp::Closed),
        port,
    );
    assert!(!closed.status.success());
    assert!(
        text(&closed.stderr).contains("PermissionError"),
        "stderr: {}",
        text(&closed.stderr)
    );
    assert_eq!(text(&closed.stdout), "");
}

#[test]
fn internet_connects_only_to_the_named_ports_and_never_binds() {
    if !require(support().network(), "network rules (ABI 4)") {
        return;
    }
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let policy = |ports| FsPolicy::standard(Vec::new(), Vec::new(), Tcp::ConnectTo(ports));

    let named = python_connect(&policy(vec![443, port]), port);
    assert!(!named.status.success(), "the bind is refused");
    assert_eq!(text(&named.stdout), "connected\n");
    assert!(text(&named.stderr).contains("PermissionError"));

    // The bus's port is not among the web's.
    let other = python_connect(&policy(vec![80, 443]), port);
    assert!(!other.status.success());
    assert_eq!(text(&other.stdout), "");
    assert!(
        text(&other.stderr).contains("PermissionError"),
        "{}",
        text(&other.stderr)
    );
}

#[test]
fn python_and_sh_run_on_the_system_set_alone() {
    if !landlock() {
        return;
    }
    let policy = standard();
    let prepared = Arc::new(prepare(&policy).unwrap());
    let mut python = Command::new("python3");
    python
        .arg("-c")
        .arg("import json, os, ssl, subprocess; print(1)");
    let output = run_confined(python, prepared.clone()).unwrap();
    assert_ok(&output);
    assert_eq!(text(&output.stdout), "1\n");

    // The same ruleset confines any number of children.
    let mut shell = Command::new("/bin/sh");
    shell
        .arg("-c")
        .arg("echo hi > /dev/null && head -c 4 /dev/urandom | od > /dev/null && echo ok");
    let output = run_confined(shell, prepared).unwrap();
    assert_ok(&output);
    assert_eq!(text(&output.stdout), "ok\n");
}

#[test]
fn the_program_runs_from_a_read_path_only() {
    if !landlock() {
        return;
    }
    let own = TempDir::new("toolbox");
    let program = own.path().join("serve");
    std::fs::write(&program, "#!/bin/sh\necho serving\n").unwrap();
    std::fs::set_permissions(&program, std::fs::Permissions::from_mode(0o755)).unwrap();

    let mut policy = standard();
    policy.read.push(own.path().to_path_buf());
    let output = run_confined(Command::new(&program), Arc::new(prepare(&policy).unwrap())).unwrap();
    assert_ok(&output);
    assert_eq!(text(&output.stdout), "serving\n");

    // Not granted: the exec itself is refused.
    let refused = run_confined(
        Command::new(&program),
        Arc::new(prepare(&standard()).unwrap()),
    );
    assert_eq!(
        refused.map(|_| ()).unwrap_err().kind(),
        io::ErrorKind::PermissionDenied
    );
}

#[test]
fn signals_stay_inside_the_domain() {
    if !require(support().scoping(), "scoping (ABI 6)") {
        return;
    }
    let me = std::process::id().to_string();
    let probe = r#"kill -0 "$1""#;
    assert_ok(&sh_unconfined(probe, &[&me]));
    let output = sh(&standard(), probe, &[&me]);
    assert!(
        !output.status.success() && text(&output.stderr).contains("not permitted"),
        "stderr: {}",
        text(&output.stderr)
    );
    // Its own children are in its domain.
    assert_ok(&sh(&standard(), r#"sleep 5 & kill "$!""#, &[]));
}

#[test]
fn a_missing_path_fails_the_prepare() {
    if !landlock() {
        return;
    }
    let mut policy = standard();
    policy.read.push(PathBuf::from("/nonexistent/toolbox/dir"));
    let err = prepare(&policy).unwrap_err();
    assert!(
        matches!(&err, LandlockError::Path { path, .. } if path == Path::new("/nonexistent/toolbox/dir"))
    );
    assert!(!err.is_unsupported());
    assert!(
        err.to_string().contains("/nonexistent/toolbox/dir"),
        "{err}"
    );
}

#[test]
fn what_the_kernel_lacks_fails_closed() {
    let none = FsPolicy::default();
    let offline = FsPolicy {
        tcp: Tcp::Closed,
        ..FsPolicy::default()
    };
    let absent = Support::Unavailable(Unavailable::NotInKernel);
    let err = check_support(absent, &none).unwrap_err();
    assert!(err.is_unsupported());
    assert!(err.to_string().contains("kernel without Landlock"), "{err}");

    let abi3 = Support::Available { abi: 3 };
    assert_eq!(check_support(abi3, &none).unwrap(), 3);
    let err = check_support(abi3, &offline).unwrap_err();
    assert!(matches!(err, LandlockError::NetworkUnsupported { abi: 3 }));
    assert!(err.is_unsupported());
    assert_eq!(
        check_support(Support::Available { abi: 4 }, &offline).unwrap(),
        4
    );
}

#[test]
fn handled_rights_follow_the_abi() {
    let open = FsPolicy::default();
    let offline = FsPolicy {
        tcp: Tcp::Closed,
        ..FsPolicy::default()
    };
    let v1 = ruleset_attr(1, &open);
    assert_eq!(v1.handled_access_fs, (1 << 13) - 1);
    assert_eq!((v1.handled_access_net, v1.scoped), (0, 0));
    assert_eq!(ruleset_attr(2, &open).handled_access_fs, (1 << 14) - 1);
    assert_eq!(ruleset_attr(4, &open).handled_access_fs, (1 << 15) - 1);
    assert_eq!(ruleset_attr(4, &open).handled_access_net, 0);
    assert_eq!(ruleset_attr(4, &offline).handled_access_net, 0b11);
    assert_eq!(ruleset_attr(5, &open).scoped, 0);
    let v7 = ruleset_attr(7, &offline);
    assert_eq!(v7.handled_access_fs, (1 << 16) - 1);
    assert_eq!(v7.scoped, 0b11);
    // Kernels newer than what these rules know get the rules they know.
    assert_eq!(ruleset_attr(9, &offline), v7);
    // No device nodes where a child may write.
    assert_eq!(READ_WRITE & uapi::FS_MAKE_BLOCK, 0);
    assert_eq!(READ_WRITE & uapi::FS_MAKE_CHAR, 0);
}

#[test]
fn support_reads_for_reports() {
    assert_eq!(
        Support::Available { abi: 7 }.to_string(),
        "Landlock ABI 7: filesystem, network, scoping"
    );
    assert_eq!(
        Support::Available { abi: 9 }.to_string(),
        "Landlock ABI 9 (rules of ABI 7 used): filesystem, network, scoping"
    );
    assert_eq!(
        Support::Available { abi: 5 }.to_string(),
        "Landlock ABI 5: filesystem, network (no scoping: ABI < 6, Linux 6.12)"
    );
    assert_eq!(
        Support::Available { abi: 3 }.to_string(),
        "Landlock ABI 3: filesystem (no network rules: ABI < 4, Linux 6.7)"
    );
    assert_eq!(
        Support::Unavailable(Unavailable::NotInKernel).to_string(),
        "unsupported: kernel without Landlock"
    );
}

#[test]
fn resolv_conf_outside_the_read_set_adds_its_directory() {
    let dir = TempDir::new("resolv");
    let run = dir.path().join("run/resolve");
    std::fs::create_dir_all(&run).unwrap();
    std::fs::write(run.join("stub-resolv.conf"), "nameserver 127.0.0.53\n").unwrap();
    let link = dir.path().join("resolv.conf");
    std::os::unix::fs::symlink(run.join("stub-resolv.conf"), &link).unwrap();

    let covered = vec![PathBuf::from("/usr")];
    assert_eq!(resolver_dir(&link, &covered), Some(run.clone()));
    let covered = vec![dir.path().to_path_buf()];
    assert_eq!(resolver_dir(&link, &covered), None);
    assert_eq!(resolver_dir(&dir.path().join("absent"), &[]), None);
}

#[test]
fn system_sets_hold_what_exists() {
    let read = system_read_paths();
    assert!(read.iter().all(|path| path.exists()));
    assert!(read.contains(&PathBuf::from("/usr")));
    assert!(read.contains(&PathBuf::from("/etc")));
    assert!(!read.iter().any(|path| path == Path::new("/tmp")));
    // Not /proc whole: other processes' environ would be readable.
    assert!(!read.iter().any(|path| path == Path::new("/proc")));
    assert!(system_read_write_paths().contains(&PathBuf::from("/dev/null")));
}
