//! A child's process group, signalled so that a reused pid is never hit.
//!
//! A pid, and with it the id of the group it leads, can go to a new process
//! once the old one is reaped. So the leader is reaped here and nowhere else
//! (the child is a plain `std` process: no runtime reaps it behind our back),
//! in three steps: wait until it has exited *without* reaping it (a pidfd, or
//! a blocking `waitid(WNOWAIT)` where there is none), kill what is left of
//! its group while the zombie leader still holds the group id, then reap it.
//! The reap and every signal take the same lock, and no signal goes out once
//! the leader is reaped.
//!
//! (`pidfd_send_signal` alone would reach only the leader, not its group; the
//! cgroup, where there is one, reaches the whole tree but is not always
//! available. Holding the zombie is what makes the group id safe.)

use std::io;
use std::os::fd::{FromRawFd, OwnedFd};
use std::sync::Mutex;

use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;
use tokio::sync::oneshot;

use super::ExitInfo;

/// A child's process group, led by the child.
pub(super) struct Group {
    /// The leader's pid, which is also the group's id.
    pid: Pid,
    /// Whether the leader has been reaped: from then on its pid, and so the
    /// group id, may be another process's. Held while signalling and while
    /// reaping, so that no signal can cross the reap.
    reaped: Mutex<bool>,
}

impl Group {
    /// The group led by child `pid`, which nothing has reaped yet.
    pub(super) fn new(pid: u32) -> Group {
        Group {
            pid: Pid::from_raw(pid as i32),
            reaped: Mutex::new(false),
        }
    }

    /// Sends `signal` to the whole group, unless its leader has been reaped
    /// (then what was left of the group was killed already).
    pub(super) fn signal(&self, signal: Signal) {
        let reaped = self.reaped.lock().unwrap_or_else(|e| e.into_inner());
        if !*reaped {
            let _ = killpg(self.pid, signal);
        }
    }

    /// Waits until the leader exits, kills what is left of its group, and
    /// reaps the leader. Call it once. On error the leader's state is unknown:
    /// the group counts as reaped (no signal will risk another process).
    pub(super) async fn reap(&self) -> io::Result<ExitInfo> {
        let exited = self.exited().await;
        let mut reaped = self.reaped.lock().unwrap_or_else(|e| e.into_inner());
        if exited.is_ok() {
            // The leader is a zombie: the group id is still its own.
            let _ = killpg(self.pid, Signal::SIGKILL);
            // Immediate: the leader has exited.
            let _ = wait_id(libc::P_PID, self.pid.as_raw() as libc::id_t, libc::WEXITED);
        }
        *reaped = true;
        exited
    }

    /// How the leader exited, once it has; it stays unreaped.
    async fn exited(&self) -> io::Result<ExitInfo> {
        match pidfd(self.pid) {
            Ok(pidfd) => exited_by_pidfd(self.pid, &pidfd).await,
            // No pidfd (a kernel before 5.3, or a sandbox that forbids it).
            Err(_) => exited_by_thread(self.pid).await,
        }
    }
}

/// How `pid` exited, once its `pidfd` says it has; it stays unreaped.
async fn exited_by_pidfd(pid: Pid, pidfd: &AsyncFd<OwnedFd>) -> io::Result<ExitInfo> {
    loop {
        // A pidfd becomes readable when its process exits.
        let mut ready = pidfd.readable().await?;
        // By pid, not P_PIDFD (Linux 5.4+): only we reap it, so it is ours.
        match wait_id(
            libc::P_PID,
            pid.as_raw() as libc::id_t,
            WAIT_EXITED | libc::WNOHANG,
        )? {
            Some(exit) => return Ok(exit),
            None => ready.clear_ready(),
        }
    }
}

/// How `pid` exited, from a thread of its own that blocks in waitid; it
/// stays unreaped. Not `spawn_blocking`: a runtime waits for those when it
/// shuts down, and a child still running would hold the daemon's exit.
async fn exited_by_thread(pid: Pid) -> io::Result<ExitInfo> {
    let (tx, rx) = oneshot::channel();
    let id = pid.as_raw() as libc::id_t;
    std::thread::Builder::new()
        .name("toolboxd-wait".to_owned())
        .stack_size(64 * 1024)
        .spawn(move || {
            let _ = tx.send(wait_id(libc::P_PID, id, WAIT_EXITED));
        })?;
    let waited = rx
        .await
        .map_err(|_| io::Error::other("the waiting thread died"))?;
    waited?.ok_or_else(|| io::Error::other("waitid returned no exited child"))
}

/// Wait for an exit and leave the child unreaped.
const WAIT_EXITED: libc::c_int = libc::WEXITED | libc::WNOWAIT;

/// A pidfd for `pid` (Linux 5.3+), registered with the runtime.
fn pidfd(pid: Pid) -> io::Result<AsyncFd<OwnedFd>> {
    let fd = pidfd_open(pid)?;
    // SAFETY: the `OwnedFd` moves into the `AsyncFd`, which owns it (open,
    // the same descriptor) until it is dropped.
    Ok(unsafe { AsyncFd::register_with_interest(fd, Interest::READABLE) }?)
}

/// A new pidfd for `pid`; pidfds are close-on-exec.
fn pidfd_open(pid: Pid) -> io::Result<OwnedFd> {
    // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid.as_raw(), 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the descriptor was just created and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as std::os::fd::RawFd) })
}

/// `waitid(idtype, id, flags)`: how the child exited, or `None` when it has
/// not yet (under `WNOHANG`). Read from the raw `siginfo_t`, so that any
/// signal number is reported, real-time ones too.
fn wait_id(
    idtype: libc::idtype_t,
    id: libc::id_t,
    flags: libc::c_int,
) -> io::Result<Option<ExitInfo>> {
    loop {
        // SAFETY: a zeroed siginfo_t is a valid one (plain integers), and
        // waitid only writes into it.
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        // SAFETY: `info` outlives the call.
        if unsafe { libc::waitid(idtype, id, &mut info, flags) } != 0 {
            let error = io::Error::last_os_error();
            if error.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(error);
        }
        // SAFETY: after a successful waitid the siginfo is SIGCHLD's, whose
        // pid and status fields are set (or still zero under WNOHANG).
        let (pid, status) = unsafe { (info.si_pid(), info.si_status()) };
        if pid == 0 {
            return Ok(None);
        }
        return Ok(Some(if info.si_code == libc::CLD_EXITED {
            ExitInfo::Code(status)
        } else {
            // CLD_KILLED or CLD_DUMPED: the only others under WEXITED.
            ExitInfo::Signal(status)
        }));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::CommandExt;
    use std::process::{Command, Stdio};
    use std::time::Duration;

    /// `sh -c script` leading a process group of its own; what it prints.
    // The `Group` is what reaps it (the lint cannot see that).
    #[allow(clippy::zombie_processes)]
    fn spawn(script: &str) -> (Group, std::process::ChildStdout) {
        let mut child = Command::new("sh")
            .args(["-c", script])
            .stdout(Stdio::piped())
            .process_group(0)
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        (Group::new(child.id()), stdout)
    }

    /// The first line of `out`, as a pid.
    fn read_pid(out: std::process::ChildStdout) -> Pid {
        use std::io::BufRead;
        let mut line = String::new();
        std::io::BufReader::new(out).read_line(&mut line).unwrap();
        Pid::from_raw(line.trim().parse().unwrap())
    }

    /// Whether `pid` is gone or a zombie (dead, not yet reaped by init).
    fn dead(pid: Pid) -> bool {
        match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
            Err(_) => true,
            Ok(stat) => stat
                .rsplit(')')
                .next()
                .is_some_and(|s| s.trim_start().starts_with('Z')),
        }
    }

    #[tokio::test]
    async fn the_reaper_reports_the_exit_and_kills_what_is_left_of_the_group() {
        let (group, out) = spawn("sleep 60 & echo $!; exit 3");
        let leftover = read_pid(out);
        let exit = tokio::time::timeout(Duration::from_secs(10), group.reap()).await;
        assert_eq!(exit.unwrap().unwrap(), ExitInfo::Code(3));
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while !dead(leftover) {
            assert!(
                std::time::Instant::now() < deadline,
                "the leftover {leftover} lives on"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        // Reaped: no signal goes out any more, and the flag says so.
        assert!(*group.reaped.lock().unwrap());
    }

    #[tokio::test]
    async fn a_signal_reaches_the_group_and_its_exit_says_which() {
        let (group, _out) = spawn("sleep 60");
        group.signal(Signal::SIGTERM);
        let exit = tokio::time::timeout(Duration::from_secs(10), group.reap()).await;
        assert_eq!(exit.unwrap().unwrap(), ExitInfo::Signal(libc::SIGTERM));
    }

    #[tokio::test]
    async fn without_a_pidfd_a_thread_waits_and_leaves_the_child_unreaped() {
        let (group, _out) = spawn("exit 7");
        let exit = tokio::time::timeout(Duration::from_secs(10), exited_by_thread(group.pid)).await;
        assert_eq!(exit.unwrap().unwrap(), ExitInfo::Code(7));
        // Still a zombie, so still ours to reap, and reaped only now.
        assert!(dead(group.pid) && std::fs::metadata(format!("/proc/{}", group.pid)).is_ok());
        let id = group.pid.as_raw() as libc::id_t;
        assert_eq!(
            wait_id(libc::P_PID, id, libc::WEXITED).unwrap(),
            Some(ExitInfo::Code(7))
        );
    }
}
