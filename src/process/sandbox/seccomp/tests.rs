//! Real processes under the filter: what is refused fails with the errno the
//! module promises, what a tool needs still works.

use std::collections::HashMap;
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};

use super::*;

/// Runs `program args` with stdin from /dev/null, under `filter` if given;
/// returns its stdout, failing the test if it did not exit 0.
fn run(filter: Option<&Prepared>, program: &str, args: &[&str]) -> String {
    let mut cmd = Command::new(program);
    cmd.args(args).stdin(Stdio::null()).stderr(Stdio::piped());
    if let Some(filter) = filter.cloned() {
        // SAFETY: the closure runs between fork and exec and only calls
        // apply_in_child, which makes prctl and seccomp syscalls and does
        // not allocate.
        unsafe {
            cmd.pre_exec(move || filter.apply_in_child());
        }
    }
    let out = cmd.output().expect("spawn");
    assert!(
        out.status.success(),
        "{program} {args:?}: {:?}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8 stdout")
}

/// A Python script running the named checks (argv after the first two,
/// which are SYS_clone and SYS_clone3) and printing `name=ok` or
/// `name=ERRNO` for each.
const PROBE: &str = r#"
import ctypes, errno, os, socket, subprocess, sys, threading
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
L = ctypes.c_long
SYS_CLONE, SYS_CLONE3 = int(sys.argv[1]), int(sys.argv[2])

def c(r):
    return "ok" if r != -1 else errno.errorcode[ctypes.get_errno()]

def py(f):
    try:
        f()
        return "ok"
    except OSError as e:
        return errno.errorcode.get(e.errno, str(e.errno))

def unshare_user():
    if hasattr(os, "unshare"):
        return py(lambda: os.unshare(os.CLONE_NEWUSER))
    return c(libc.unshare(0x10000000))

def clone_user():
    r = libc.syscall(L(SYS_CLONE), L(0x10000000 | 17), L(0), L(0), L(0), L(0))
    if r == 0:
        os._exit(0)
    if r > 0:
        os.waitpid(r, 0)
        return "ok"
    return c(r)

def traceme():
    # In a child of its own: a traced process stops at its next signal.
    pid = os.fork()
    if pid == 0:
        r = libc.ptrace(0, 0, None, None)
        os._exit(0 if r == 0 else ctypes.get_errno())
    code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    return "ok" if code == 0 else errno.errorcode.get(code, str(code))

def tiocsti():
    import fcntl, termios
    fcntl.ioctl(0, termios.TIOCSTI, b"x")

def unix_pair():
    a, b = socket.socketpair(socket.AF_UNIX)
    a.sendall(b"x")
    assert b.recv(1) == b"x"

def thread():
    ran = []
    t = threading.Thread(target=lambda: ran.append(1))
    t.start()
    t.join()
    assert ran == [1]

def on_other(f):
    # `f(pid)` on another process of the same user: a sleeping child.
    child = subprocess.Popen(["sleep", "30"])
    try:
        return f(child.pid)
    finally:
        child.kill()
        child.wait()

def prlimit(pid):
    old = (ctypes.c_ulonglong * 2)()
    return c(libc.prlimit(pid, 7, None, old))  # RLIMIT_NOFILE, read only

def shm():
    r = libc.shmget(0, 4096, 0o1600)  # IPC_PRIVATE, IPC_CREAT | 0600
    if r >= 0:
        libc.shmctl(r, 0, None)  # IPC_RMID
    return c(r)

def same_hostname():
    name = socket.gethostname().encode()
    return c(libc.sethostname(name, len(name)))

def adjtimex():
    timex = (ctypes.c_char * 256)()  # modes 0: read only
    return c(libc.adjtimex(timex))

checks = {
    "prlimit_other": lambda: on_other(prlimit),
    "prlimit_self": lambda: prlimit(0),
    "setpriority_other": lambda: on_other(lambda pid: c(libc.setpriority(0, pid, 5))),
    "setpriority_user": lambda: c(libc.setpriority(2, 0, 0)),
    "setpriority_self": lambda: c(libc.setpriority(0, 0, 1)),
    "setpriority_group": lambda: c(libc.setpriority(1, 0, 1)),
    "affinity_other": lambda: on_other(lambda pid: py(lambda: os.sched_setaffinity(pid, os.sched_getaffinity(0)))),
    "mptcp": lambda: py(lambda: socket.socket(socket.AF_INET, socket.SOCK_STREAM, 262).close()),
    "fastopen": lambda: py(lambda: socket.socket(socket.AF_INET, socket.SOCK_STREAM).sendto(
        b"x", 0x20000000, ("127.0.0.1", 9))),
    "sched_other": lambda: on_other(
        lambda pid: py(lambda: os.sched_setscheduler(pid, os.SCHED_OTHER, os.sched_param(0)))),
    "sched_self": lambda: py(lambda: os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))),
    "fanotify": lambda: c(libc.fanotify_init(0, 0)),
    "shmget": shm,
    "sethostname": same_hostname,
    "syslog": lambda: c(libc.klogctl(10, None, 0)),  # SYSLOG_ACTION_SIZE_BUFFER
    "adjtimex": adjtimex,
    "packet": lambda: py(lambda: socket.socket(17, socket.SOCK_RAW, 0).close()),
    "raw": lambda: py(lambda: socket.socket(socket.AF_INET, socket.SOCK_RAW, 1).close()),
    "raw_cloexec": lambda: py(lambda: socket.socket(
        socket.AF_INET6, socket.SOCK_RAW | socket.SOCK_CLOEXEC, 58).close()),
    "ptrace": traceme,
    "unshare": unshare_user,
    "mount": lambda: c(libc.mount(b"none", b"/nonexistent-toolboxd-test", b"tmpfs", 0, None)),
    "clone_user": clone_user,
    "clone3": lambda: c(libc.syscall(L(SYS_CLONE3), None, L(0))),
    "personality": lambda: c(libc.personality(0x0040000)),
    "personality_query": lambda: c(libc.personality(0xffffffff)),
    "tiocsti": lambda: py(tiocsti),
    "x32_getpid": lambda: c(libc.syscall(L(0x40000000 | 39))),
    "inet": lambda: py(lambda: socket.socket(socket.AF_INET, socket.SOCK_STREAM).close()),
    "inet6": lambda: py(lambda: socket.socket(socket.AF_INET6, socket.SOCK_STREAM).close()),
    "netlink": lambda: py(lambda: socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0).close()),
    "unix_pair": lambda: py(unix_pair),
    "subprocess": lambda: py(lambda: subprocess.run(["true"], check=True)),
    "thread": lambda: py(thread),
}
for name in sys.argv[3:]:
    print(f"{name}={checks[name]()}", flush=True)
"#;

/// Runs the PROBE checks, under `filter` if given: check name to result.
fn run_checks(filter: Option<&Prepared>, checks: &[&str]) -> HashMap<String, String> {
    let clone = libc::SYS_clone.to_string();
    let clone3 = libc::SYS_clone3.to_string();
    let mut args = vec!["-c", PROBE, &clone, &clone3];
    args.extend_from_slice(checks);
    run(filter, "python3", &args)
        .lines()
        .filter_map(|line| line.split_once('='))
        .map(|(name, result)| (name.to_string(), result.to_string()))
        .collect()
}

/// Asserts each named check gave `expected`.
fn expect(results: &HashMap<String, String>, checks: &[&str], expected: &str) {
    for check in checks {
        assert_eq!(
            results.get(*check).map(String::as_str),
            Some(expected),
            "{check} in {results:?}"
        );
    }
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

#[test]
fn this_machine_has_filters() {
    assert_eq!(
        support(),
        Support::Available {
            arch: std::env::consts::ARCH
        }
    );
    assert_eq!(support(), probe(), "the cached answer is the probe's");
}

#[test]
fn the_child_runs_in_filter_mode_without_new_privileges() {
    let filter = prepare(Sockets::IP).expect("prepare");
    let status = run(Some(&filter), "/bin/sh", &["-c", "cat /proc/self/status"]);
    assert!(status.contains("Seccomp:\t2\n"), "{status}");
    // One filter more than this process has (the kernel counts them since
    // Linux 5.9; a test run may be filtered itself): the programs are
    // chained, and the kernel prepares and runs one.
    let filters = |status: &str| {
        status
            .lines()
            .find_map(|line| line.strip_prefix("Seccomp_filters:"))
            .map(|n| n.trim().parse::<u32>().expect("a count"))
    };
    let own = std::fs::read_to_string("/proc/self/status").expect("own status");
    if let (Some(own), Some(child)) = (filters(&own), filters(&status)) {
        assert_eq!(child, own + 1, "{status}");
    }
    assert!(status.contains("NoNewPrivs:\t1\n"), "{status}");
    assert_eq!(run(Some(&filter), "/bin/sh", &["-c", "echo ok"]), "ok\n");
}

#[test]
fn refused_calls_fail_with_eperm_and_clone3_with_enosys() {
    let filter = prepare(Sockets::IP).expect("prepare");
    // unshare last: in the control run below it succeeds, and in a new
    // user namespace without mappings the calls after it would fail anyway.
    let mut refused = vec!["ptrace", "mount", "clone_user", "personality", "tiocsti"];
    if cfg!(target_arch = "x86_64") {
        refused.push("x32_getpid");
    }
    refused.push("unshare");
    let mut checks = vec!["clone3", "personality_query"];
    checks.extend(&refused);
    let results = run_checks(Some(&filter), &checks);
    expect(&results, &refused, "EPERM");
    expect(&results, &["clone3"], "ENOSYS");
    expect(&results, &["personality_query"], "ok");

    // Unconfined, the same calls do something else: the errors above are
    // the filter's.
    let control = run_checks(None, &checks);
    expect(&control, &["tiocsti"], "ENOTTY");
    expect(&control, &["clone3"], "EINVAL");
    expect(
        &control,
        &["personality", "personality_query", "ptrace"],
        "ok",
    );
    if is_root() {
        expect(&control, &["unshare", "clone_user"], "ok");
        expect(&control, &["mount"], "ENOENT");
    }
}

#[test]
fn network_none_leaves_only_unix_sockets() {
    let filter = prepare(Sockets::UnixOnly).expect("prepare");
    let results = run_checks(
        Some(&filter),
        &["inet", "inet6", "netlink", "unix_pair", "subprocess"],
    );
    expect(&results, &["inet", "inet6", "netlink"], "EPERM");
    expect(&results, &["unix_pair", "subprocess"], "ok");
}

#[test]
fn with_the_network_ip_sockets_are_allowed_but_not_packet_raw_or_netlink() {
    let filter = prepare(Sockets::IP).expect("prepare");
    let kernel = ["netlink", "packet", "raw", "raw_cloexec"];
    let mut checks = vec!["inet", "inet6", "unix_pair"];
    checks.extend(kernel);
    let results = run_checks(Some(&filter), &checks);
    expect(&results, &["inet", "unix_pair"], "ok");
    expect(&results, &kernel, "EPERM");
    // IPv6 may be disabled on the machine, but not by the filter.
    assert_ne!(results.get("inet6").map(String::as_str), Some("EPERM"));
    // What the manifest names (`sockets`) is allowed again.
    let asked = Sockets::Ip {
        netlink: true,
        packet: false,
        raw: true,
        tcp_restricted: false,
    };
    let results = run_checks(Some(&prepare(asked).expect("prepare")), &kernel);
    expect(&results, &["netlink"], "ok");
    expect(&results, &["packet"], "EPERM");
    if is_root() {
        expect(&results, &["raw", "raw_cloexec"], "ok");
    }
}

#[test]
fn with_tcp_restricted_mptcp_and_fast_open_are_refused() {
    let internet = Sockets::Ip {
        netlink: false,
        packet: false,
        raw: false,
        tcp_restricted: true,
    };
    let results = run_checks(
        Some(&prepare(internet).expect("prepare")),
        &["mptcp", "fastopen", "inet"],
    );
    expect(&results, &["mptcp", "fastopen"], "EPERM");
    expect(&results, &["inet"], "ok");
    // Without the restriction, neither is the filter's refusal.
    let open = run_checks(
        Some(&prepare(Sockets::IP).expect("prepare")),
        &["mptcp", "fastopen"],
    );
    for check in ["mptcp", "fastopen"] {
        assert_ne!(
            open.get(check).map(String::as_str),
            Some("EPERM"),
            "{open:?}"
        );
    }
}

#[test]
fn other_processes_limits_priorities_and_the_hosts_knobs_are_refused() {
    let filter = prepare(Sockets::IP).expect("prepare");
    let refused = [
        "prlimit_other",
        "setpriority_other",
        "setpriority_user",
        "setpriority_group",
        "affinity_other",
        "sched_other",
        "fanotify",
        "shmget",
        "sethostname",
        "syslog",
        "adjtimex",
    ];
    let own = ["prlimit_self", "setpriority_self", "sched_self"];
    let mut checks = refused.to_vec();
    checks.extend(own);
    let results = run_checks(Some(&filter), &checks);
    expect(&results, &refused, "EPERM");
    expect(&results, &own, "ok");
    // Unconfined, the same calls work (as root): the refusals are the
    // filter's. sethostname is not tried unconfined.
    let control = [
        "prlimit_other",
        "setpriority_other",
        "sched_other",
        "shmget",
        "adjtimex",
    ];
    expect(&run_checks(None, &control), &control, "ok");
    if is_root() {
        let as_root = ["fanotify", "syslog", "packet", "raw"];
        expect(&run_checks(None, &as_root), &as_root, "ok");
    }
}

#[test]
fn processes_and_threads_still_start() {
    for sockets in [Sockets::IP, Sockets::UnixOnly] {
        let filter = prepare(sockets).expect("prepare");
        let results = run_checks(Some(&filter), &["subprocess", "thread"]);
        expect(&results, &["subprocess", "thread"], "ok");
        let shell = run(
            Some(&filter),
            "/bin/sh",
            &["-c", "(echo one); echo $(echo two) & wait"],
        );
        assert_eq!(shell, "one\ntwo\n");
    }
}

#[test]
fn the_report_lists_what_is_refused() {
    let open = prepare(Sockets::IP).expect("prepare");
    let closed = prepare(Sockets::UnixOnly).expect("prepare");
    for name in [
        "ptrace",
        "unshare",
        "clone(CLONE_NEW*)",
        "ioctl(TIOCSTI, TIOCLINUX)",
    ] {
        assert!(open.refused().contains(&name), "{name}");
    }
    assert!(open.refused().iter().any(|name| name.starts_with("clone3")));
    assert!(open
        .refused()
        .contains(&"socket(AF_NETLINK, AF_PACKET, SOCK_RAW)"));
    assert!(closed.refused().contains(&"socket(but AF_UNIX)"));
    assert_eq!(closed.refused().len(), open.refused().len());
    let mut names = closed.refused().to_vec();
    names.sort_unstable();
    names.dedup();
    assert_eq!(names.len(), closed.refused().len(), "each listed once");
}

#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
#[test]
fn chained_programs_go_on_where_one_would_allow() {
    use seccompiler::sock_filter;
    let op = |code, k| sock_filter {
        code,
        jt: 0,
        jf: 0,
        k,
    };
    let allow = || op(0x06, libc::SECCOMP_RET_ALLOW);
    let refuse = || op(0x06, libc::SECCOMP_RET_ERRNO | libc::EPERM as u32);
    let load = || op(0x20, 0);
    let jump = |k| op(0x05, k);
    let chained = super::build::chain(vec![
        vec![load(), allow(), refuse(), allow()],
        vec![load(), refuse(), allow()],
    ]);
    // Each "allow" of the first program jumps to the second's start; the
    // second, last, keeps its own.
    let expected = vec![
        load(),
        jump(2),
        refuse(),
        jump(0),
        load(),
        refuse(),
        allow(),
    ];
    assert_eq!(chained, expected);
}

/// A classic BPF interpreter for seccomp programs (the instructions
/// seccompiler and the x32 guard use), to compare decisions.
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
fn run_bpf(program: &[seccompiler::sock_filter], data: &[u32; 16]) -> u32 {
    let mut acc: u32 = 0;
    let mut pc = 0;
    loop {
        let op = &program[pc];
        pc += 1;
        match op.code {
            // BPF_LD | BPF_W | BPF_ABS: a word of `struct seccomp_data`.
            0x20 => acc = data[op.k as usize / 4],
            // BPF_ALU | BPF_AND | BPF_K
            0x54 => acc &= op.k,
            // BPF_JMP | BPF_JA
            0x05 => pc += op.k as usize,
            // BPF_JMP | BPF_JEQ, BPF_JGT, BPF_JGE, BPF_JSET (| BPF_K)
            0x15 | 0x25 | 0x35 | 0x45 => {
                let taken = match op.code {
                    0x15 => acc == op.k,
                    0x25 => acc > op.k,
                    0x35 => acc >= op.k,
                    _ => acc & op.k != 0,
                };
                pc += usize::from(if taken { op.jt } else { op.jf });
            }
            // BPF_RET | BPF_K
            0x06 => return op.k,
            code => panic!("instruction {code:#x} not interpreted"),
        }
    }
}

/// What the kernel answers with `programs` installed in order: each runs,
/// the most severe action wins, and of equals the newest (kernel/seccomp.c,
/// `seccomp_run_filters`).
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
fn run_installed(programs: &[seccompiler::BpfProgram], data: &[u32; 16]) -> u32 {
    let action = |ret: u32| (ret & 0xffff_0000) as i32;
    let mut answer = libc::SECCOMP_RET_ALLOW;
    for program in programs.iter().rev() {
        let ret = run_bpf(program, data);
        if action(ret) < action(answer) {
            answer = ret;
        }
    }
    answer
}

#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
#[test]
fn the_chained_program_decides_as_its_programs_installed_one_by_one() {
    // AUDIT_ARCH_X86_64 and AUDIT_ARCH_AARCH64 (linux/audit.h).
    let (x86_64, aarch64) = (0xc000_003e_u32, 0xc000_00b7_u32);
    let (native, foreign) = if cfg!(target_arch = "x86_64") {
        (x86_64, aarch64)
    } else {
        (aarch64, x86_64)
    };
    // Argument values the rules look at, and neighbours.
    let mut values: Vec<u32> = vec![
        0,
        1,
        0xffff_ffff,
        libc::AF_UNIX as u32,
        libc::AF_INET as u32,
    ];
    values.extend([libc::TIOCSTI, libc::TIOCLINUX].map(|r| r as u32));
    values.extend(
        [
            libc::CLONE_NEWNS,
            libc::CLONE_NEWUSER,
            libc::CLONE_NEWNET,
            libc::CLONE_VM | libc::CLONE_NEWPID,
            libc::CLONE_VM | libc::CLONE_THREAD,
        ]
        .map(|f| f as u32),
    );
    let open = Sockets::Ip {
        netlink: true,
        packet: true,
        raw: true,
        tcp_restricted: false,
    };
    let internet = Sockets::Ip {
        netlink: false,
        packet: false,
        raw: false,
        tcp_restricted: true,
    };
    for sockets in [Sockets::IP, Sockets::UnixOnly, open, internet] {
        let (programs, _) = super::build::programs(sockets).expect("programs");
        let chained = super::build::chain(programs.clone());
        let mut checked = 0;
        for arch in [native, foreign] {
            let numbers = (0..1024).chain((0..600).map(|n| 0x4000_0000 + n));
            for nr in numbers {
                for &low in &values {
                    for high in [0, 1] {
                        let mut data = [0u32; 16];
                        data[0] = nr;
                        data[1] = arch;
                        // Every argument: low word `low`, high word `high`.
                        for arg in 0..6 {
                            data[4 + 2 * arg] = low;
                            data[5 + 2 * arg] = high;
                        }
                        assert_eq!(
                            run_bpf(&chained, &data),
                            run_installed(&programs, &data),
                            "nr {nr:#x}, arch {arch:#x}, arguments {low:#x} (high {high})"
                        );
                        checked += 1;
                    }
                }
            }
        }
        assert!(checked > 50_000);
    }
}
