//! The keeper: one small helper process per daemon that makes everything a
//! toolbox started die with the daemon, even when the daemon is SIGKILLed.
//!
//! A parent-death signal reaches only a direct child: each toolbox gets one,
//! but its own children would outlive a killed daemon. So the daemon starts
//! `toolboxd __keeper [CGROUP_DIR]` once, with a pipe on its stdin, and tells
//! it the process group of every toolbox it spawns (`+PGID`) and reaps
//! (`-PGID`), one per line. When the pipe reaches end-of-file — the daemon
//! exited, or died — the keeper SIGKILLs every group still listed and, where
//! the daemon runs each toolbox in a cgroup of its own ([`crate::process::cgroup`]),
//! kills every process in those cgroups (`setsid` ones included), removes
//! them and exits.
//!
//! The keeper ignores the signals a terminal or an operator sends to a
//! process group (it runs in a group of its own); only the end of the daemon
//! ends it. The library used without the `toolboxd` binary has no keeper:
//! then only the parent-death signal protects against orphans.

use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Mutex, OnceLock};

/// The hidden subcommand that runs the keeper.
pub const SUBCOMMAND: &str = "__keeper";

/// The executable that provides [`SUBCOMMAND`]: set once by the `toolboxd` binary.
static EXECUTABLE: OnceLock<PathBuf> = OnceLock::new();

/// The daemon's side of its keeper, started on first use.
static KEEPER: OnceLock<Option<Keeper>> = OnceLock::new();

/// Registers the executable that runs the keeper (the `toolboxd` binary).
/// Only that binary knows [`SUBCOMMAND`]: a program that runs the daemon
/// inside itself (a test, with `env!("CARGO_BIN_EXE_toolboxd")`) names the
/// `toolboxd` binary here, never its own executable, or has no keeper.
/// The first registration wins.
pub fn install(executable: PathBuf) {
    let _ = EXECUTABLE.set(executable);
}

/// The daemon's end of the keeper.
pub struct Keeper {
    /// The pipe to the keeper's stdin; its end-of-file is the daemon's end.
    to_keeper: Mutex<std::process::ChildStdin>,
    /// The keeper's pid, for logs and tests.
    pid: u32,
}

impl Keeper {
    /// The daemon's keeper, started the first time a toolbox is spawned;
    /// `None` without the `toolboxd` binary, or if it could not start.
    pub fn get() -> Option<&'static Keeper> {
        KEEPER.get_or_init(Keeper::start).as_ref()
    }

    fn start() -> Option<Keeper> {
        use std::os::unix::process::CommandExt;
        let exe = EXECUTABLE.get()?;
        let mut command = Command::new(exe);
        command.arg(SUBCOMMAND);
        if let Some(cgroups) = crate::process::cgroup::Cgroups::get() {
            command.arg(cgroups.root());
        }
        let started = command
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .process_group(0)
            .spawn();
        match started {
            Ok(mut child) => {
                let pid = child.id();
                let to_keeper = child.stdin.take()?;
                // Non-blocking: a keeper that stops reading (a toolbox of the
                // same user could SIGSTOP it) must never stall the daemon.
                {
                    use std::os::fd::AsRawFd;
                    let fd = to_keeper.as_raw_fd();
                    // SAFETY: fcntl on a descriptor this process owns.
                    unsafe {
                        let flags = libc::fcntl(fd, libc::F_GETFL);
                        if flags >= 0 {
                            libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK);
                        }
                    }
                }
                // The keeper outlives us by design; nothing waits for it here
                // and the init process reaps it once we are gone. (Dropping
                // the handle does not kill it.)
                drop(child);
                tracing::debug!(pid, "keeper started");
                Some(Keeper {
                    to_keeper: Mutex::new(to_keeper),
                    pid,
                })
            }
            Err(e) => {
                tracing::warn!(
                    "cannot start the keeper ({e}): a toolbox's own children may outlive a \
                     killed daemon"
                );
                None
            }
        }
    }

    /// The keeper's pid.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// A toolbox's process group was spawned.
    pub fn watch(&self, pgid: u32) {
        self.send(&format!("+{pgid}\n"));
    }

    /// A toolbox's process group was reaped.
    pub fn forget(&self, pgid: u32) {
        self.send(&format!("-{pgid}\n"));
    }

    fn send(&self, line: &str) {
        let mut pipe = self.to_keeper.lock().unwrap_or_else(|e| e.into_inner());
        // A line is a few bytes, below the pipe's atomic write size: it is
        // written whole or not at all, and never blocks (non-blocking pipe).
        if let Err(e) = pipe.write_all(line.as_bytes()) {
            tracing::warn!(
                "cannot tell the keeper ({e}); a toolbox's own children may outlive a killed \
                 daemon (its cgroup, where used, still ends them at its stop)"
            );
        }
    }
}

/// Runs the keeper: reads group changes until end-of-file, then kills what is
/// left. Never returns.
pub fn run(cgroup_root: Option<PathBuf>) -> ! {
    // Terminal and group signals are not ours to act on: only the daemon's
    // end (end-of-file) ends the keeper.
    // SAFETY: setting signal dispositions to SIG_IGN in a single-threaded process.
    unsafe {
        for signal in [
            libc::SIGINT,
            libc::SIGTERM,
            libc::SIGHUP,
            libc::SIGQUIT,
            libc::SIGPIPE,
        ] {
            libc::signal(signal, libc::SIG_IGN);
        }
    }
    let mut groups = std::collections::BTreeSet::new();
    for line in std::io::stdin().lock().lines() {
        let Ok(line) = line else { break };
        let (sign, pgid) = line.split_at(line.len().min(1));
        let Ok(pgid) = pgid.parse::<i32>() else {
            continue;
        };
        match sign {
            "+" => groups.insert(pgid),
            "-" => groups.remove(&pgid),
            _ => false,
        };
    }
    for pgid in groups {
        let _ = nix::sys::signal::killpg(
            nix::unistd::Pid::from_raw(pgid),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
    if let Some(root) = cgroup_root {
        crate::process::cgroup::kill_and_remove_tree(&root);
    }
    std::process::exit(0)
}

/// The keeper's cgroup argument, as `main` reads it.
pub fn cgroup_arg(arg: Option<std::ffi::OsString>) -> Option<PathBuf> {
    arg.map(PathBuf::from)
        .filter(|p| Path::new(p).is_absolute())
}
