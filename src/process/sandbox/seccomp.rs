//! The seccomp filter of the "standard" sandbox profile: calls a toolbox has
//! no business making are refused with an error, everything else is allowed.
//!
//! The filter is compiled in the daemon ([`prepare`], which allocates) and
//! installed in the child before its exec ([`Prepared::apply_in_child`],
//! which does not). It is inherited by everything the child starts and cannot
//! be removed. A refused call fails with `EPERM` (never a kill), so a tool
//! sees an ordinary error it can report. `PR_SET_NO_NEW_PRIVS` comes with it:
//! set-user-id programs (`sudo`, `su`, `ping` on some systems) do not gain
//! privileges in a sandboxed toolbox.
//!
//! | refused | why |
//! | --- | --- |
//! | `ptrace` | reads and writes other processes' memory and registers |
//! | `process_vm_readv`, `process_vm_writev` | the same without attaching |
//! | `pidfd_getfd` | takes a copy of another process's file descriptor |
//! | `mount`, `umount2`, `pivot_root`, `chroot` | change the filesystem view the sandbox relies on |
//! | `fsopen`, `fsconfig`, `fsmount`, `fspick`, `move_mount`, `open_tree`, `mount_setattr` | the same, through the new mount API |
//! | `open_by_handle_at` | opens a file by handle, past the path's permissions (a known container escape) |
//! | `swapon`, `swapoff` | the host's swap |
//! | `reboot` | the host's power |
//! | `kexec_load`, `kexec_file_load` | replaces the running kernel |
//! | `init_module`, `finit_module`, `delete_module` | loads or unloads kernel code |
//! | `bpf` | loads programs into the kernel |
//! | `perf_event_open` | kernel attack surface and a side channel on other processes |
//! | `userfaultfd` | the usual tool for winning kernel races in exploits |
//! | `io_uring_setup`, `io_uring_enter`, `io_uring_register` | runs operations (`socket` among them) this filter never sees; kernel attack surface |
//! | `keyctl`, `add_key`, `request_key` | the kernel keyrings, shared beyond the toolbox |
//! | `acct` | the host's process accounting |
//! | `settimeofday`, `clock_settime` | the host's clock |
//! | `iopl`, `ioperm` (x86_64) | raw hardware I/O ports |
//! | `setns`, `unshare` | enter or make namespaces (a user namespace gives every capability in it) |
//! | `clone` with a `CLONE_NEW*` flag | makes namespaces, like `unshare` |
//! | `clone3` (`ENOSYS`) | its flags are in memory a filter cannot read; `ENOSYS` makes libc fall back to `clone` |
//! | `personality` other than `PER_LINUX` or a query | `ADDR_NO_RANDOMIZE` turns address randomization off for what it runs |
//! | `ioctl` `TIOCSTI`, `TIOCLINUX` | type into, or paste on, a terminal the toolbox shares |
//! | x32 ABI calls (x86_64, `EPERM`) | the same calls under other numbers, past every rule above |
//! | `prlimit64` on any pid but 0 (the caller) | sets or reads another process's limits: a `RLIMIT_CPU` of one second kills the daemon by `SIGXCPU` when they share a user |
//! | `setpriority`, `ioprio_set` on anything but the caller (`who` 0 of a process, not a group or a user) | another process's (the daemon's) CPU and I/O priority |
//! | `sched_setscheduler`, `sched_setparam`, `sched_setattr`, `sched_setaffinity` on any pid but 0 | another process's scheduling class and CPUs |
//! | `fanotify_init` | permission events hang every `open()` of the watched files, the daemon's included |
//! | SysV IPC (`shmget`, `shmat`, `shmdt`, `shmctl`, `semget`, `semop`, `semtimedop`, `semctl`, `msgget`, `msgsnd`, `msgrcv`, `msgctl`) | the machine's shared IPC namespace: other users' segments and queues |
//! | `sethostname`, `setdomainname` | the host's names |
//! | `syslog` | the kernel's log (addresses, other services' messages) |
//! | `adjtimex`, `clock_adjtime` | the host's clock discipline |
//! | `socket` with `AF_PACKET`, `AF_NETLINK`, or `SOCK_RAW` (or the old `SOCK_PACKET`) of `AF_INET`/`AF_INET6`, unless the manifest's `sockets` names it | every frame on the wire, forged packets, the kernel's routing and address tables |
//! | with `network = "internet"`: `socket` of `IPPROTO_MPTCP` or `IPPROTO_SCTP`, `sendto`/`sendmsg`/`sendmmsg` with `MSG_FASTOPEN` | connections Landlock's TCP port rules do not see |
//! | `socket` but `AF_UNIX`, with `network = "none"` | no network: `AF_INET`, `AF_INET6`, `AF_PACKET`, `AF_NETLINK` and the rest |
//!
//! Decisions:
//!
//! - `unshare` is refused whatever its flags: its harmless uses (`CLONE_FS`,
//!   `CLONE_FILES`) are rare in tools, and one rule is easier to trust.
//! - `clone3` answers `ENOSYS`, as on a kernel without it: glibc (2.34 and
//!   later) then uses `clone` for threads and `posix_spawn`, Rust's std falls
//!   back to `fork`, Go and musl use `clone` already. `clone` itself is
//!   allowed unless its flags (the low 32 bits of its first argument, all
//!   the kernel reads) ask for a namespace; `CLONE_NEWTIME` cannot be asked
//!   through `clone`.
//! - `AF_NETLINK` is refused unless the manifest asks for it (`sockets =
//!   ["netlink"]`): it is no network traffic, but it is a wide kernel
//!   interface and what reads addresses and routes. glibc's `getaddrinfo`
//!   copes (without netlink it assumes IPv4 and IPv6 are both configured);
//!   `getifaddrs`, `if_nameindex`, Python's `socket.if_nameindex()` and
//!   Node's `os.networkInterfaces()` fail with `EPERM`. `socketpair` is
//!   left alone: the kernel makes pairs of `AF_UNIX` sockets only. Ping
//!   sockets (`SOCK_DGRAM` with `IPPROTO_ICMP`, as `ping` uses without
//!   privileges) are not raw and stay allowed.
//! - Time: setting the clock (`settimeofday`, `clock_settime`) is refused,
//!   and so are `adjtimex` and `clock_adjtime`, whose read-only form
//!   (glibc's `ntp_gettime`) a filter cannot tell from the setting one (the
//!   mode is in memory): a tool that only reads the time never needs them.
//! - Other processes: `prlimit64`, `sched_set*` and `setpriority` /
//!   `ioprio_set` are allowed on the caller only (pid or `who` 0, which is
//!   what libc's `setrlimit`, `getrlimit`, `nice` and `sched_setscheduler(0,
//!   ...)` pass). A toolbox that names its own pid, or a thread's tid, gets
//!   `EPERM` as well; a filter cannot know the pids of a toolbox's tree.
//!   Where the daemon runs as root every toolbox has a user of its own and
//!   the kernel refuses these calls on others anyway; where it does not,
//!   the toolboxes share the daemon's user and this filter is what stops
//!   them.
//! - `personality` is allowed for `PER_LINUX` (0) and the query
//!   (`0xffffffff`) only.
//! - `socketcall` (one entry point for all socket calls) does not exist on
//!   x86_64 or aarch64; the 32-bit ABIs that have it are not allowed at all
//!   (below).
//!
//! The filter first checks the architecture the call was made for and kills
//! the process when it is not the daemon's own (seccompiler's check): a
//! 32-bit binary (i386 on x86_64, armhf on aarch64) run as a sandboxed
//! toolbox dies of `SIGSYS` at its first call. A daemon built for another
//! architecture (armv7 among them) has no filter to offer: [`prepare`]
//! answers [`Unsupported::Arch`] and the caller fails the child's start.

use std::sync::OnceLock;

use seccompiler::{BpfProgram, TargetArch};

#[cfg(test)]
mod tests;

/// Where the kernel lists the actions its seccomp filters can take. It
/// exists when the kernel has filter mode (`CONFIG_SECCOMP_FILTER`, Linux
/// 4.14 and later), so reading it is a probe without side effects.
const ACTIONS_AVAIL: &str = "/proc/sys/kernel/seccomp/actions_avail";

/// The actions [`Prepared`] programs return: allow, errno, and the
/// architecture check's kill.
const ACTIONS_NEEDED: [&str; 3] = ["allow", "errno", "kill_process"];

/// Whether seccomp filters can be applied here, and for which architecture.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Support {
    /// [`prepare`] builds filters for `arch` (as Rust names it).
    Available {
        /// The architecture the filter is built for: the daemon's own.
        arch: &'static str,
    },
    /// No filter can be had, and why.
    Unsupported(Unsupported),
}

impl Support {
    /// The architecture filters are built for, or why there are none.
    pub fn arch(self) -> Result<&'static str, Unsupported> {
        match self {
            Support::Available { arch } => Ok(arch),
            Support::Unsupported(why) => Err(why),
        }
    }
}

/// Why seccomp filters cannot be applied here.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Unsupported {
    /// The daemon was built for an architecture it has no filter for.
    #[error("no seccomp filter for the {0} architecture (only x86_64 and aarch64)")]
    Arch(&'static str),
    /// The kernel has no seccomp filter mode (or hides it); the OS error of
    /// reading its list of actions.
    #[error(
        "the kernel has no seccomp filter mode ({ACTIONS_AVAIL}: {})",
        std::io::Error::from_raw_os_error(*.0)
    )]
    Kernel(i32),
    /// The kernel's filters cannot take an action the filter needs.
    #[error("the kernel's seccomp filters lack the {0} action (Linux 4.14 or later is needed)")]
    Action(&'static str),
}

/// Why no filter could be prepared.
#[derive(Debug, thiserror::Error)]
pub enum SeccompError {
    /// Not on this architecture or kernel: the child must not start.
    #[error("seccomp unsupported: {0}")]
    Unsupported(#[from] Unsupported),
    /// seccompiler refused the rules (a bug in the table below).
    #[error("building the seccomp filter: {0}")]
    Build(#[from] seccompiler::BackendError),
}

/// Whether seccomp filters can be applied here and for which architecture,
/// or why not. Probed once (one read of a /proc file), then cached.
pub fn support() -> Support {
    static SUPPORT: OnceLock<Support> = OnceLock::new();
    *SUPPORT.get_or_init(probe)
}

/// [`support`], uncached.
fn probe() -> Support {
    if target_arch().is_none() {
        return Support::Unsupported(Unsupported::Arch(std::env::consts::ARCH));
    }
    let listed = match std::fs::read_to_string(ACTIONS_AVAIL) {
        Ok(listed) => listed,
        Err(e) => {
            let errno = e.raw_os_error().unwrap_or(libc::ENOENT);
            return Support::Unsupported(Unsupported::Kernel(errno));
        }
    };
    let listed: Vec<&str> = listed.split_whitespace().collect();
    for action in ACTIONS_NEEDED {
        if !listed.contains(&action) {
            return Support::Unsupported(Unsupported::Action(action));
        }
    }
    Support::Available {
        arch: std::env::consts::ARCH,
    }
}

/// seccompiler's name for the architecture the daemon was built for (the
/// one its children run on), if it has a filter for it.
fn target_arch() -> Option<TargetArch> {
    #[cfg(target_arch = "x86_64")]
    return Some(TargetArch::x86_64);
    #[cfg(target_arch = "aarch64")]
    return Some(TargetArch::aarch64);
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    return None;
}

/// A compiled filter, built in the daemon before the child starts (allocation happens
/// here), installed in a child by [`Prepared::apply_in_child`].
#[derive(Debug, Clone)]
pub struct Prepared {
    /// The BPF program. A seccompiler filter has one answer for all the
    /// calls it matches, so the `EPERM` refusals and `clone3`'s `ENOSYS` are
    /// built as separate programs, and the x32 guard (a test on the call
    /// number, which seccompiler cannot express) as a third on x86_64; they
    /// are chained into this one ([`build::chain`]). The program is as long
    /// as the three, but what the kernel spends per filter (a `prctl`, a
    /// `seccomp` call, an allocation and a JIT image, a walk over every
    /// call number for its cache of always-allowed calls, a run on each call
    /// not in that cache) comes once instead of three times.
    program: BpfProgram,
    /// What is refused, one entry per refused syscall (and one for the x32
    /// guard), for `check --sandbox` reports.
    refused: Vec<&'static str>,
}

impl Prepared {
    /// In the child before its exec (`child/exec.rs`), last of what runs
    /// there: sets `PR_SET_NO_NEW_PRIVS`, then installs the program with
    /// `seccomp(SECCOMP_SET_MODE_FILTER)`. Only system calls: no
    /// allocation, no lock. On an error the child must not exec (an error
    /// there fails the spawn).
    pub fn apply_in_child(&self) -> std::io::Result<()> {
        // seccompiler::apply_filter (0.5) is prctl(PR_SET_NO_NEW_PRIVS) and
        // the seccomp syscall with a `sock_fprog` on its stack pointing at
        // the program; its errors carry `io::Error::last_os_error()`, an OS
        // code with no allocation.
        seccompiler::apply_filter(&self.program).map_err(|e| match e {
            seccompiler::Error::Prctl(e) | seccompiler::Error::Seccomp(e) => e,
            // EmptyFilter (the program is not empty) or ThreadSync (not
            // asked for): an OS code, since a boxed error allocates.
            _ => std::io::Error::from_raw_os_error(libc::EINVAL),
        })
    }

    /// The syscalls refused (with the arguments that are, where not all
    /// calls are), for `check --sandbox` reports.
    pub fn refused(&self) -> &[&'static str] {
        &self.refused
    }
}

/// Which sockets a child may open.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sockets {
    /// `AF_UNIX` only (`network = "none"`).
    UnixOnly,
    /// IP sockets too; of the kinds refused by default, those named here.
    Ip {
        /// `AF_NETLINK` (addresses, routes, the kernel's events).
        netlink: bool,
        /// `AF_PACKET` (every frame on an interface).
        packet: bool,
        /// `SOCK_RAW` of `AF_INET` and `AF_INET6` (forged packets).
        raw: bool,
        /// Whether Landlock limits TCP (`network = "internet"`): then what
        /// passes its rules by is refused too: MPTCP and SCTP sockets
        /// (Landlock's TCP rules do not see them) and TCP Fast Open
        /// (`MSG_FASTOPEN` connects from `sendto`/`sendmsg`).
        tcp_restricted: bool,
    },
}

impl Sockets {
    /// IP sockets, none of the refused-by-default kinds.
    pub const IP: Sockets = Sockets::Ip {
        netlink: false,
        packet: false,
        raw: false,
        tcp_restricted: false,
    };
}

/// Compiles the filter for this architecture: the table in the module doc,
/// with `socket` refused as `sockets` says. Fails with
/// [`SeccompError::Unsupported`] where [`support`] says so: the caller fails
/// the child's start rather than run it unconfined.
pub fn prepare(sockets: Sockets) -> Result<Prepared, SeccompError> {
    support().arch()?;
    build::prepared(sockets)
}

/// Where there is no filter for the architecture, there is nothing to build
/// ([`support`] has said so already).
#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
mod build {
    use super::{Prepared, SeccompError, Sockets, Unsupported};

    /// Always [`Unsupported::Arch`].
    pub(super) fn prepared(_sockets: Sockets) -> Result<Prepared, SeccompError> {
        Err(Unsupported::Arch(std::env::consts::ARCH).into())
    }
}

/// The table of the module doc and its compilation, for the architectures
/// that have one (syscall numbers differ between them: libc's `SYS_*` are
/// this architecture's).
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
mod build;
