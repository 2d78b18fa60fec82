//! The process-group leader: a tiny process between toolboxd and each toolbox
//! so that the toolbox's whole process group dies with the daemon, even when
//! the daemon is killed with SIGKILL.
//!
//! A parent-death signal reaches only a direct child; a toolbox's own children
//! would be orphaned and survive. So toolboxd runs `toolboxd __leader PPID --
//! PROGRAM ARGS...` as the group leader. The leader starts the toolbox in its
//! group (the toolbox inherits the stdio pipes), then waits for one of two
//! things: the toolbox exits — the leader exits with the same status, so
//! toolboxd sees the toolbox's own exit code or signal; or toolboxd dies — the
//! parent-death signal wakes the leader, which SIGKILLs the whole group.
//!
//! The leader holds none of the pipes (its stdio is /dev/null once the toolbox
//! runs), so end-of-file on them still means the toolbox closed them. It
//! ignores SIGTERM and the like: toolboxd signals the whole group, and the
//! leader exits when the toolbox does.

use std::ffi::OsString;
use std::sync::OnceLock;

use nix::sys::signal::{SigSet, Signal};

/// The hidden subcommand that runs the leader.
pub const SUBCOMMAND: &str = "__leader";

/// The executable that provides [`SUBCOMMAND`]: set once by the `toolboxd`
/// binary. When unset (the library used on its own), toolboxes are spawned
/// directly and only the parent-death signal protects against orphans.
static LEADER: OnceLock<std::path::PathBuf> = OnceLock::new();

/// Registers the executable that runs the leader (the `toolboxd` binary).
pub fn install(executable: std::path::PathBuf) {
    let _ = LEADER.set(executable);
}

/// The leader executable, if installed.
pub fn executable() -> Option<&'static std::path::Path> {
    LEADER.get().map(|p| p.as_path())
}

fn signals() -> SigSet {
    let mut set = SigSet::empty();
    for s in [
        Signal::SIGUSR1,
        Signal::SIGCHLD,
        Signal::SIGTERM,
        Signal::SIGINT,
        Signal::SIGHUP,
        Signal::SIGQUIT,
    ] {
        set.add(s);
    }
    set
}

/// Kills the whole process group, the leader included.
fn kill_group() -> ! {
    let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(0), Signal::SIGKILL);
    std::process::exit(137)
}

/// Runs the leader: never returns. `parent` is toolboxd's pid.
pub fn run(parent: u32, program: OsString, args: Vec<OsString>) -> ! {
    use std::os::unix::process::CommandExt;

    let set = signals();
    if set.thread_block().is_err() {
        std::process::exit(126);
    }
    // SAFETY: plain prctl/getppid calls in a single-threaded process.
    unsafe {
        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGUSR1);
        if libc::getppid() as u32 != parent {
            kill_group();
        }
    }
    let mut command = std::process::Command::new(&program);
    command.args(&args);
    // SAFETY: only async-signal-safe calls between fork and exec.
    unsafe {
        command.pre_exec(|| {
            let mut none = std::mem::zeroed::<libc::sigset_t>();
            libc::sigemptyset(&mut none);
            libc::sigprocmask(libc::SIG_SETMASK, &none, std::ptr::null_mut());
            // The toolbox dies with its leader, too.
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            Ok(())
        });
    }
    let mut child = match command.spawn() {
        Ok(child) => child,
        Err(e) => {
            eprintln!(
                "toolboxd: cannot start {}: {e}; check the manifest's command",
                program.to_string_lossy()
            );
            std::process::exit(127);
        }
    };
    // Let go of the pipes: only the toolbox holds them now.
    if let Ok(null) = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/null")
    {
        use std::os::fd::AsRawFd;
        for fd in 0..3 {
            // SAFETY: dup2 onto the standard descriptors of this process.
            unsafe {
                libc::dup2(null.as_raw_fd(), fd);
            }
        }
    }
    loop {
        match set.wait() {
            Ok(Signal::SIGUSR1) => kill_group(),
            Ok(Signal::SIGCHLD) => {
                if let Ok(Some(status)) = child.try_wait() {
                    exit_like(status);
                }
            }
            // SIGTERM and friends reach the toolbox directly (group signals).
            _ => {}
        }
    }
}

/// Exits the way the toolbox did: same code, or death by the same signal.
fn exit_like(status: std::process::ExitStatus) -> ! {
    use std::os::unix::process::ExitStatusExt;
    if let Some(code) = status.code() {
        std::process::exit(code);
    }
    if let Some(signal) = status.signal() {
        // SAFETY: restoring the default action and raising a signal in a
        // single-threaded process about to end.
        unsafe {
            libc::signal(signal, libc::SIG_DFL);
            let mut only = std::mem::zeroed::<libc::sigset_t>();
            libc::sigemptyset(&mut only);
            libc::sigaddset(&mut only, signal);
            libc::sigprocmask(libc::SIG_UNBLOCK, &only, std::ptr::null_mut());
            libc::raise(signal);
        }
        std::process::exit(128 + signal);
    }
    std::process::exit(1)
}
