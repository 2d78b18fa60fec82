//! The refusals of the module doc as seccomp rules, compiled and chained
//! into one program (see `seccomp.rs`).

use std::collections::BTreeMap;

use seccompiler::{
    SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter, SeccompRule,
};

use super::{target_arch, Prepared, SeccompError, Sockets, Unsupported};

/// Compiles [`refusals`] into one program (see [`chain`]).
pub(super) fn prepared(sockets: Sockets) -> Result<Prepared, SeccompError> {
    let (programs, refused) = programs(sockets)?;
    Ok(Prepared {
        program: chain(programs),
        refused,
    })
}

/// Compiles [`refusals`] into one program per errno, then the x32 guard
/// on x86_64, last; returns them with the names of what is refused.
pub(super) fn programs(
    sockets: Sockets,
) -> Result<(Vec<seccompiler::BpfProgram>, Vec<&'static str>), SeccompError> {
    let arch = target_arch().ok_or(Unsupported::Arch(std::env::consts::ARCH))?;
    let mut refused = Vec::new();
    let mut by_errno: BTreeMap<i32, BTreeMap<i64, Vec<SeccompRule>>> = BTreeMap::new();
    let mut numbers = std::collections::BTreeSet::new();
    for refusal in refusals(sockets)? {
        refused.push(refusal.shown);
        // One refusal per syscall, whatever its errno: `chain` needs no
        // call refused by two programs.
        let first = numbers.insert(refusal.nr);
        debug_assert!(first, "one refusal per syscall");
        by_errno
            .entry(refusal.errno)
            .or_default()
            .insert(refusal.nr, refusal.rules);
    }
    let mut programs = Vec::new();
    for (errno, rules) in by_errno {
        let filter = SeccompFilter::new(
            rules,
            SeccompAction::Allow,
            SeccompAction::Errno(errno as u32),
            arch,
        )?;
        programs.push(filter.try_into()?);
    }
    // Last: it has no architecture check of its own (see `chain`).
    #[cfg(target_arch = "x86_64")]
    {
        refused.push("x32 ABI calls");
        programs.push(x32_guard());
    }
    Ok((programs, refused))
}

/// `BPF_RET | BPF_K` (linux/bpf_common.h): returns `k`.
const RETURN: u16 = 0x06;

/// `BPF_JMP | BPF_JA`: jumps `k` instructions forward.
const JUMP: u16 = 0x05;

/// One program that answers as `programs` installed one after the other
/// do: every "allow" but the last program's becomes a jump to the start
/// of the next program, so a call goes on to the next test where it
/// would have been allowed (seccompiler writes "allow" only as a
/// `BPF_RET | BPF_K`; a jump that landed on it lands on the new jump).
/// The answers are the same because no call is refused by two programs
/// ([`programs`] checks), and because the first program kills a call of
/// a foreign architecture before any refusal, as the kernel's strictest-
/// answer rule would: the x32 guard, which has no architecture check,
/// comes last. The kernel takes forward jumps that land inside the
/// program (`BPF_JA` is among the instructions seccomp accepts), and its
/// precomputation of the calls a filter always allows follows them.
pub(super) fn chain(programs: Vec<seccompiler::BpfProgram>) -> seccompiler::BpfProgram {
    let count = programs.len();
    let mut chained = Vec::with_capacity(programs.iter().map(Vec::len).sum());
    for (n, mut program) in programs.into_iter().enumerate() {
        if n + 1 < count {
            let len = program.len();
            for (i, op) in program.iter_mut().enumerate() {
                if op.code == RETURN && op.k == libc::SECCOMP_RET_ALLOW {
                    // Lands just past this program's last instruction.
                    *op = seccompiler::sock_filter {
                        code: JUMP,
                        jt: 0,
                        jf: 0,
                        k: (len - i - 1) as u32,
                    };
                }
            }
        }
        chained.extend(program);
    }
    // BPF_MAXINSNS: the kernel refuses a longer program (the child's
    // start then fails, unconfined never).
    debug_assert!(chained.len() <= 4096, "{} instructions", chained.len());
    chained
}

/// One refused syscall.
pub(super) struct Refusal {
    /// The name reports show, with the arguments refused where not all are.
    pub(super) shown: &'static str,
    /// The syscall's number on this architecture.
    pub(super) nr: i64,
    /// The calls refused: any rule matching (a rule matches when all its
    /// conditions hold); every call if empty.
    pub(super) rules: Vec<SeccompRule>,
    /// The error the call fails with.
    pub(super) errno: i32,
}

/// The namespace flags of `clone` (`CLONE_NEWTIME` is not among them:
/// its bit is part of `clone`'s exit signal).
const CLONE_NAMESPACES: [libc::c_int; 7] = [
    libc::CLONE_NEWNS,
    libc::CLONE_NEWCGROUP,
    libc::CLONE_NEWUTS,
    libc::CLONE_NEWIPC,
    libc::CLONE_NEWUSER,
    libc::CLONE_NEWPID,
    libc::CLONE_NEWNET,
];

/// `IOPRIO_WHO_PROCESS` (linux/ioprio.h): one process.
const IOPRIO_WHO_PROCESS: u64 = 1;

/// `SOCK_PACKET`: the old way to a packet socket, through `AF_INET`.
const SOCK_PACKET: u64 = 10;

/// `IPPROTO_MPTCP` and `IPPROTO_SCTP`: stream protocols Landlock's TCP
/// rules do not cover.
const UNSEEN_PROTOCOLS: [u64; 2] = [262, 132];

/// `MSG_FASTOPEN`: a `sendto` or `sendmsg` that connects.
const MSG_FASTOPEN: u64 = 0x2000_0000;

/// `personality(PER_LINUX)`: the plain Linux personality.
const PER_LINUX: u64 = 0;

/// `personality`'s query: the argument that changes nothing.
const PERSONALITY_QUERY: u64 = 0xffff_ffff;

/// A condition on the low 32 bits of argument `index` (every argument
/// filtered here is a C `int` or `unsigned int` to the kernel, which
/// ignores the high bits).
fn arg(index: u8, op: SeccompCmpOp, value: u64) -> Result<SeccompCondition, SeccompError> {
    Ok(SeccompCondition::new(
        index,
        SeccompCmpArgLen::Dword,
        op,
        value,
    )?)
}

/// The table of the module doc, for this architecture.
pub(super) fn refusals(sockets: Sockets) -> Result<Vec<Refusal>, SeccompError> {
    let all = |shown: &'static str, nr: libc::c_long| Refusal {
        shown,
        nr,
        rules: Vec::new(),
        errno: libc::EPERM,
    };
    let mut table = vec![
        all("ptrace", libc::SYS_ptrace),
        all("process_vm_readv", libc::SYS_process_vm_readv),
        all("process_vm_writev", libc::SYS_process_vm_writev),
        all("pidfd_getfd", libc::SYS_pidfd_getfd),
        all("mount", libc::SYS_mount),
        all("umount2", libc::SYS_umount2),
        all("pivot_root", libc::SYS_pivot_root),
        all("chroot", libc::SYS_chroot),
        all("fsopen", libc::SYS_fsopen),
        all("fsconfig", libc::SYS_fsconfig),
        all("fsmount", libc::SYS_fsmount),
        all("fspick", libc::SYS_fspick),
        all("move_mount", libc::SYS_move_mount),
        all("open_tree", libc::SYS_open_tree),
        all("mount_setattr", libc::SYS_mount_setattr),
        all("open_by_handle_at", libc::SYS_open_by_handle_at),
        all("swapon", libc::SYS_swapon),
        all("swapoff", libc::SYS_swapoff),
        all("reboot", libc::SYS_reboot),
        all("kexec_load", libc::SYS_kexec_load),
        all("kexec_file_load", libc::SYS_kexec_file_load),
        all("init_module", libc::SYS_init_module),
        all("finit_module", libc::SYS_finit_module),
        all("delete_module", libc::SYS_delete_module),
        all("bpf", libc::SYS_bpf),
        all("perf_event_open", libc::SYS_perf_event_open),
        all("userfaultfd", libc::SYS_userfaultfd),
        all("io_uring_setup", libc::SYS_io_uring_setup),
        all("io_uring_enter", libc::SYS_io_uring_enter),
        all("io_uring_register", libc::SYS_io_uring_register),
        all("keyctl", libc::SYS_keyctl),
        all("add_key", libc::SYS_add_key),
        all("request_key", libc::SYS_request_key),
        all("acct", libc::SYS_acct),
        all("settimeofday", libc::SYS_settimeofday),
        all("clock_settime", libc::SYS_clock_settime),
        all("setns", libc::SYS_setns),
        all("unshare", libc::SYS_unshare),
        all("fanotify_init", libc::SYS_fanotify_init),
        all("shmget", libc::SYS_shmget),
        all("shmat", libc::SYS_shmat),
        all("shmdt", libc::SYS_shmdt),
        all("shmctl", libc::SYS_shmctl),
        all("semget", libc::SYS_semget),
        all("semop", libc::SYS_semop),
        all("semtimedop", libc::SYS_semtimedop),
        all("semctl", libc::SYS_semctl),
        all("msgget", libc::SYS_msgget),
        all("msgsnd", libc::SYS_msgsnd),
        all("msgrcv", libc::SYS_msgrcv),
        all("msgctl", libc::SYS_msgctl),
        all("sethostname", libc::SYS_sethostname),
        all("setdomainname", libc::SYS_setdomainname),
        all("syslog", libc::SYS_syslog),
        all("adjtimex", libc::SYS_adjtimex),
        all("clock_adjtime", libc::SYS_clock_adjtime),
    ];
    // On another process: any pid but 0 (the caller).
    let not_self = |index| -> Result<Vec<SeccompRule>, SeccompError> {
        Ok(vec![SeccompRule::new(vec![arg(
            index,
            SeccompCmpOp::Ne,
            0,
        )?])?])
    };
    table.push(Refusal {
        rules: not_self(0)?,
        ..all("prlimit64(pid but 0)", libc::SYS_prlimit64)
    });
    for (shown, nr) in [
        (
            "sched_setscheduler(pid but 0)",
            libc::SYS_sched_setscheduler,
        ),
        ("sched_setparam(pid but 0)", libc::SYS_sched_setparam),
        ("sched_setattr(pid but 0)", libc::SYS_sched_setattr),
        ("sched_setaffinity(pid but 0)", libc::SYS_sched_setaffinity),
    ] {
        table.push(Refusal {
            rules: not_self(0)?,
            ..all(shown, nr)
        });
    }
    // `which, who`: allowed for the calling process only (`which` a
    // process, `who` 0): a group may be the daemon's (a child may join
    // any group of its session) and a user every process of the
    // daemon's user.
    for (shown, nr, process) in [
        (
            "setpriority(but PRIO_PROCESS 0)",
            libc::SYS_setpriority,
            libc::PRIO_PROCESS as u64,
        ),
        (
            "ioprio_set(but IOPRIO_WHO_PROCESS 0)",
            libc::SYS_ioprio_set,
            IOPRIO_WHO_PROCESS,
        ),
    ] {
        let mut rules = not_self(1)?;
        rules.push(SeccompRule::new(vec![arg(0, SeccompCmpOp::Ne, process)?])?);
        table.push(Refusal {
            rules,
            ..all(shown, nr)
        });
    }
    #[cfg(target_arch = "x86_64")]
    table.extend([all("iopl", libc::SYS_iopl), all("ioperm", libc::SYS_ioperm)]);

    let mut clone_namespaces = Vec::new();
    for flag in CLONE_NAMESPACES {
        let flag = u64::from(flag as u32);
        clone_namespaces.push(SeccompRule::new(vec![arg(
            0,
            SeccompCmpOp::MaskedEq(flag),
            flag,
        )?])?);
    }
    table.push(Refusal {
        rules: clone_namespaces,
        ..all("clone(CLONE_NEW*)", libc::SYS_clone)
    });
    table.push(Refusal {
        errno: libc::ENOSYS,
        ..all(
            "clone3 (ENOSYS: libc falls back to clone)",
            libc::SYS_clone3,
        )
    });
    table.push(Refusal {
        rules: vec![SeccompRule::new(vec![
            arg(0, SeccompCmpOp::Ne, PER_LINUX)?,
            arg(0, SeccompCmpOp::Ne, PERSONALITY_QUERY)?,
        ])?],
        ..all(
            "personality(but PER_LINUX or a query)",
            libc::SYS_personality,
        )
    });
    let mut ioctls = Vec::new();
    for request in [libc::TIOCSTI, libc::TIOCLINUX] {
        ioctls.push(SeccompRule::new(vec![arg(
            1,
            SeccompCmpOp::Eq,
            u64::from(request as u32),
        )?])?);
    }
    table.push(Refusal {
        rules: ioctls,
        ..all("ioctl(TIOCSTI, TIOCLINUX)", libc::SYS_ioctl)
    });
    match sockets {
        Sockets::UnixOnly => table.push(Refusal {
            rules: vec![SeccompRule::new(vec![arg(
                0,
                SeccompCmpOp::Ne,
                libc::AF_UNIX as u64,
            )?])?],
            ..all("socket(but AF_UNIX)", libc::SYS_socket)
        }),
        Sockets::Ip {
            netlink,
            packet,
            raw,
            tcp_restricted,
        } => {
            let family = |f: libc::c_int| arg(0, SeccompCmpOp::Eq, f as u64);
            // The type's low bits; SOCK_CLOEXEC and SOCK_NONBLOCK ride
            // above them.
            let of_type = |t: u64| arg(1, SeccompCmpOp::MaskedEq(0xf), t);
            let mut rules = Vec::new();
            if !netlink {
                rules.push(SeccompRule::new(vec![family(libc::AF_NETLINK)?])?);
            }
            if !packet {
                rules.push(SeccompRule::new(vec![family(libc::AF_PACKET)?])?);
                rules.push(SeccompRule::new(vec![
                    family(libc::AF_INET)?,
                    of_type(SOCK_PACKET)?,
                ])?);
            }
            if !raw {
                for f in [libc::AF_INET, libc::AF_INET6] {
                    rules.push(SeccompRule::new(vec![
                        family(f)?,
                        of_type(libc::SOCK_RAW as u64)?,
                    ])?);
                }
            }
            if tcp_restricted {
                for f in [libc::AF_INET, libc::AF_INET6] {
                    for protocol in UNSEEN_PROTOCOLS {
                        rules.push(SeccompRule::new(vec![
                            family(f)?,
                            arg(2, SeccompCmpOp::Eq, protocol)?,
                        ])?);
                    }
                }
                for (shown, nr, flags) in [
                    ("sendto(MSG_FASTOPEN)", libc::SYS_sendto, 3),
                    ("sendmsg(MSG_FASTOPEN)", libc::SYS_sendmsg, 2),
                    ("sendmmsg(MSG_FASTOPEN)", libc::SYS_sendmmsg, 3),
                ] {
                    table.push(Refusal {
                        rules: vec![SeccompRule::new(vec![arg(
                            flags,
                            SeccompCmpOp::MaskedEq(MSG_FASTOPEN),
                            MSG_FASTOPEN,
                        )?])?],
                        ..all(shown, nr)
                    });
                }
            }
            let shown = match (netlink, packet, raw, tcp_restricted) {
                (false, false, false, false) => "socket(AF_NETLINK, AF_PACKET, SOCK_RAW)",
                (false, false, false, true) => {
                    "socket(AF_NETLINK, AF_PACKET, SOCK_RAW, IPPROTO_MPTCP, IPPROTO_SCTP)"
                }
                _ => "socket(the kinds the manifest's `sockets` does not name)",
            };
            if !rules.is_empty() {
                table.push(Refusal {
                    rules,
                    ..all(shown, libc::SYS_socket)
                });
            }
        }
    }
    Ok(table)
}

/// x86_64's x32 ABI numbers its calls with bit 30 set, under the same
/// architecture as x86_64: the rules above, matching exact numbers,
/// would not see them. This program refuses every call numbered that
/// high (on a kernel without x32 they fail with `ENOSYS` anyway).
#[cfg(target_arch = "x86_64")]
fn x32_guard() -> seccompiler::BpfProgram {
    use seccompiler::sock_filter;
    /// `BPF_LD | BPF_W | BPF_ABS` (linux/bpf_common.h).
    const LOAD_WORD: u16 = 0x20;
    /// `BPF_JMP | BPF_JGE | BPF_K`.
    const JUMP_IF_AT_LEAST: u16 = 0x35;
    /// `offsetof(struct seccomp_data, nr)`.
    const NR: u32 = 0;
    /// `__X32_SYSCALL_BIT`.
    const X32: u32 = 0x4000_0000;
    let op = |code, jt, jf, k| sock_filter { code, jt, jf, k };
    vec![
        op(LOAD_WORD, 0, 0, NR),
        op(JUMP_IF_AT_LEAST, 0, 1, X32),
        op(RETURN, 0, 0, libc::SECCOMP_RET_ERRNO | libc::EPERM as u32),
        op(RETURN, 0, 0, libc::SECCOMP_RET_ALLOW),
    ]
}
