//! One child process: spawn, exit, signals, and the tasks that serve it.
//!
//! A [`Child`] owns the process. Four small tasks serve it: a writer that owns
//! stdin and a reader that owns stdout (`rpc`: JSON-RPC framing and request
//! multiplexing), a stderr forwarder (`logs`), and a reaper that waits for
//! the exit, kills what is left of the process group, reaps the child and
//! fails every call still in flight with the exit status (`group`: no
//! signal is sent once the pid may be another process's). Dropping the
//! `Child` kills its whole process group and, where the kernel allows, its
//! cgroup ([`crate::process::cgroup`]: every process it started, `setsid` ones too),
//! so nothing leaks. The process also gets a parent-death signal, and the
//! daemon's keeper ([`crate::process::keeper`]) kills its group and cgroup if toolboxd
//! is killed outright.

mod exec;
mod group;
mod logs;
mod rpc;
mod spawner;
#[cfg(test)]
pub(crate) mod stand_in;

pub use logs::{LogLine, StderrLog, LOG_LINES};
pub use rpc::{
    Answering, Kept, PastDeadline, ProgressSender, ProgressWatch, QuestionWatch, Questioner,
    RpcFailure, RpcHandle,
};

use std::ffi::OsString;
use std::fmt;
use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, watch};

use crate::manifest::Manifest;
use group::Group;
use logs::forward_stderr;
use rpc::{read_stdout, write_stdin, Link};

/// How a child process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExitInfo {
    /// It exited with this code.
    Code(i32),
    /// A signal killed it.
    Signal(i32),
}

impl ExitInfo {
    /// Whether the exit counts as a failure for `restart.policy = "on-failure"`.
    pub fn is_failure(self) -> bool {
        self != ExitInfo::Code(0)
    }
}

impl fmt::Display for ExitInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ExitInfo::Code(c) => write!(f, "code {c}"),
            ExitInfo::Signal(s) => write!(f, "signal {s}"),
        }
    }
}

impl From<std::process::ExitStatus> for ExitInfo {
    fn from(status: std::process::ExitStatus) -> Self {
        use std::os::unix::process::ExitStatusExt;
        match (status.code(), status.signal()) {
            (Some(code), _) => ExitInfo::Code(code),
            (None, Some(signal)) => ExitInfo::Signal(signal),
            (None, None) => ExitInfo::Code(-1),
        }
    }
}

/// Something the child told us that its owner must act on.
#[derive(Debug)]
pub enum ChildEvent {
    /// `notifications/tools/list_changed`.
    ToolsChanged,
}

/// Spawning a child failed.
#[derive(Debug, thiserror::Error)]
pub enum SpawnError {
    /// The process could not be started.
    #[error(
        "cannot start {program}: {source}; check the manifest's command and that it is executable"
    )]
    Exec {
        program: String,
        source: std::io::Error,
    },
    /// Its sandbox could not be set up as declared (so it was not started).
    #[error("{0}")]
    Sandbox(#[from] crate::process::sandbox::SandboxError),
}

impl SpawnError {
    /// Whether the system was short of descriptors, processes or memory: a
    /// passing shortage, not the toolbox's fault, so worth another try.
    pub fn is_resource_shortage(&self) -> bool {
        match self {
            SpawnError::Exec { source, .. } => crate::process::sandbox::is_shortage(source),
            SpawnError::Sandbox(e) => e.is_resource_shortage(),
        }
    }
}

/// The descriptor limit (soft, hard) toolboxd started with, when it raised
/// its own: children get the original back.
static INHERITED_NOFILE: std::sync::OnceLock<(libc::rlim_t, libc::rlim_t)> =
    std::sync::OnceLock::new();

/// Raises the daemon's soft descriptor limit to its hard limit, so that many
/// bus connections never leave it unable to spawn a child (each child takes
/// six descriptors for its pipes). Children still start with the soft limit
/// the daemon was given. Returns the limit now in force.
pub fn raise_descriptor_limit() -> std::io::Result<libc::rlim_t> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit write/read the struct they are given.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        if limit.rlim_cur >= limit.rlim_max {
            return Ok(limit.rlim_cur);
        }
        let _ = INHERITED_NOFILE.set((limit.rlim_cur, limit.rlim_max));
        let raised = libc::rlimit {
            rlim_cur: limit.rlim_max,
            rlim_max: limit.rlim_max,
        };
        if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(limit.rlim_max)
}

/// The manifest's command as [`exec`] starts it: the program, its
/// arguments, the child's whole environment (the sandbox's, or the daemon's
/// with the manifest's `env`, or only that with `env_clear`) and directory.
fn command(
    manifest: &Manifest,
    sandbox: Option<&crate::process::sandbox::Plan>,
) -> std::io::Result<exec::Command> {
    let env: Vec<(OsString, OsString)> = match sandbox {
        Some(plan) => plan.env().to_vec(),
        None => {
            let mut env: Vec<(OsString, OsString)> = if manifest.env_clear {
                Vec::new()
            } else {
                std::env::vars_os()
                    .filter(|(key, _)| !manifest.env.contains_key(key.to_string_lossy().as_ref()))
                    .collect()
            };
            env.extend(manifest.env.iter().map(|(k, v)| (k.into(), v.into())));
            env
        }
    };
    exec::Command::new(
        &manifest.program,
        manifest.args.iter().map(String::as_str),
        &env,
        &manifest.cwd,
    )
}

/// What the child does last before `exec`, in its cgroup: a parent-death
/// signal, its descriptor limit, its sandbox. System calls only ([`exec`]'s
/// rules).
fn steps(
    sandbox: Option<&crate::process::sandbox::Plan>,
) -> impl Fn() -> std::io::Result<()> + Sync + '_ {
    let daemon = std::process::id();
    let nofile = INHERITED_NOFILE.get().copied();
    move || {
        die_with_the_daemon(daemon)?;
        if let Some((soft, hard)) = nofile {
            let limit = libc::rlimit {
                rlim_cur: soft,
                rlim_max: hard,
            };
            // SAFETY: setrlimit reads the struct it is given.
            if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &limit) } != 0 {
                return Err(std::io::Error::last_os_error());
            }
        }
        // Last: it may drop to another user, and forbids new privileges.
        if let Some(plan) = sandbox {
            plan.apply_in_child()?;
            // A change of user clears the parent-death signal: set again.
            die_with_the_daemon(daemon)?;
        }
        Ok(())
    }
}

/// The child's parent-death signal, then a check that the daemon (pid
/// `daemon`) was not already gone. The signal fires when the *thread* that
/// started the child exits; children are started on the spawner threads,
/// which live as long as the daemon ([`spawner`]).
fn die_with_the_daemon(daemon: u32) -> std::io::Result<()> {
    // SAFETY: prctl and getppid are plain system calls; _exit ends only the child.
    unsafe {
        if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        if libc::getppid() as u32 != daemon {
            libc::_exit(1);
        }
    }
    Ok(())
}

/// A running child process. Dropping it kills the process group.
pub struct Child {
    /// Process id (and process group id).
    pid: u32,
    /// Its process group, for signals that cannot reach a reused pid.
    group: Arc<Group>,
    /// Sends requests to the child.
    rpc: RpcHandle,
    /// Becomes `Some` when the process has exited and been reaped.
    exit: watch::Receiver<Option<ExitInfo>>,
    /// The toolbox's stderr log, which this child's lines go to.
    stderr: Arc<StderrLog>,
    /// Becomes `true` when its stderr pipe has ended: its last lines are in
    /// the log then.
    stderr_closed: watch::Receiver<bool>,
    /// Its cgroup, where cgroups are used: killed and removed with the child.
    cgroup: Option<crate::process::cgroup::Cgroup>,
    /// What it keeps of its sandbox: the summary, and the limit cgroups
    /// that go with it.
    sandbox: Option<Box<crate::process::sandbox::KeptSandbox>>,
}

impl Child {
    /// Spawns the manifest's command with piped stdio, in its own process group;
    /// its stderr lines go to `stderr` (the toolbox's log) as well as to the
    /// daemon's log. Returns the child and the receiver of its events (closed
    /// when it exits). The child is started on a spawner thread (`spawner`).
    pub async fn spawn(
        manifest: &Manifest,
        stderr_log: Arc<StderrLog>,
    ) -> Result<(Child, mpsc::UnboundedReceiver<ChildEvent>), SpawnError> {
        let owned = manifest.clone();
        let spawned = spawner::run(move || start(&owned));
        let exec_error = |source| SpawnError::Exec {
            program: manifest.program.display().to_string(),
            source,
        };
        let failed = |why: String| exec_error(std::io::Error::other(why));
        // A spawn left behind is killed when it ends (`Started`'s drop).
        let mut started = tokio::time::timeout(SPAWN_DEADLINE, spawned)
            .await
            .map_err(|_| {
                failed(format!(
                    "it did not start within {} s (its executable or the file system it is on \
                     may be hanging)",
                    SPAWN_DEADLINE.as_secs()
                ))
            })?
            .ok_or_else(|| failed("the spawn failed unexpectedly (a bug: see the log)".into()))??;
        // invariant: `start` returns it with its process; only here is it taken.
        let (Some(pid), Some(pipes)) = (started.pid, started.pipes.take()) else {
            return Err(failed("the spawn lost its process (a bug)".into()));
        };
        // On an error, `started` is dropped: nothing serves the child, so it
        // is ended and reaped (its pid is still its own).
        let (stdin, stdout, stderr) = async_pipes(pipes).map_err(exec_error)?;
        // Taken over: from here on, the child's `group` ends and reaps it.
        started.pid = None;
        if let Some(keeper) = started.keeper {
            keeper.watch(pid);
        }
        let (cgroup, kept, keeper) = (started.cgroup.take(), started.kept.take(), started.keeper);
        // Its refusals are explained against what it may reach.
        stderr_log
            .refusals
            .started(kept.as_ref().and_then(|k| k.reach.clone()));
        let group = Arc::new(Group::new(pid));

        let (stdin_tx, stdin_rx) = mpsc::unbounded_channel();
        let killed = group.clone();
        let (link, queued) = Link::new(
            manifest.id.clone(),
            pid,
            stdin_tx,
            manifest.limits.max_message_bytes,
            Box::new(move || killed.signal(nix::sys::signal::Signal::SIGKILL)),
            kept.as_ref()
                .and_then(|k| k.reach.as_ref())
                .map(|r| r.roots()),
            manifest.asking.elicitation,
        );
        let (events_tx, events_rx) = mpsc::unbounded_channel();
        let (exit_tx, exit_rx) = watch::channel(None);

        tokio::spawn(write_stdin(stdin, stdin_rx, queued));
        tokio::spawn(read_stdout(
            link.clone(),
            stdout,
            manifest.limits.max_message_bytes,
            events_tx,
            exit_rx.clone(),
        ));
        let (closed_tx, stderr_closed) = watch::channel(false);
        tokio::spawn(forward_stderr(
            manifest.id.clone(),
            pid,
            stderr,
            stderr_log.clone(),
            closed_tx,
        ));
        let reaper_link = link.clone();
        let reaped = group.clone();
        tokio::spawn(async move {
            let exit = match reaped.reap().await {
                Ok(exit) => exit,
                Err(e) => {
                    tracing::error!(toolbox = %reaper_link.toolbox, pid, "cannot wait for the child: {e}");
                    ExitInfo::Code(-1)
                }
            };
            // Its group is dead and its pid released: the keeper must not
            // signal either any more.
            if let Some(keeper) = keeper {
                keeper.forget(pid);
            }
            reaper_link.close(RpcFailure::Exited(exit));
            let _ = exit_tx.send(Some(exit));
        });

        Ok((
            Child {
                pid,
                group,
                rpc: RpcHandle { link },
                exit: exit_rx,
                stderr: stderr_log,
                stderr_closed,
                cgroup,
                sandbox: kept,
            },
            events_rx,
        ))
    }

    /// What confines it, in words: `off`, or how each limit holds.
    pub fn sandbox_summary(&self) -> String {
        self.sandbox_mechanisms().join("; ")
    }

    /// What confines it, one mechanism per entry: `["off"]`, or
    /// `["standard", "Landlock ABI 6", ...]`.
    pub fn sandbox_mechanisms(&self) -> Vec<String> {
        match &self.sandbox {
            None => vec!["off".to_owned()],
            Some(kept) => std::iter::once("standard".to_owned())
                .chain(kept.summary.iter().cloned())
                .collect(),
        }
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// A handle for requests to this child.
    pub fn rpc(&self) -> &RpcHandle {
        &self.rpc
    }

    /// The last lines the child wrote to stderr, oldest first (bounded in
    /// lines and bytes, for a failure report).
    pub fn stderr_tail(&self) -> Vec<String> {
        self.stderr.tail_of(self.pid)
    }

    /// [`Child::stderr_tail`] once its stderr has ended, waiting at most
    /// `within` for that (a process it left behind may hold the pipe open).
    pub async fn final_stderr_tail(&self, within: Duration) -> Vec<String> {
        let mut closed = self.stderr_closed.clone();
        let _ = tokio::time::timeout(within, closed.wait_for(|done| *done)).await;
        self.stderr_tail()
    }

    /// Waits until the process has exited and been reaped.
    pub async fn exited(&self) -> ExitInfo {
        let mut exit = self.exit.clone();
        loop {
            if let Some(info) = *exit.borrow_and_update() {
                return info;
            }
            if exit.changed().await.is_err() {
                // The reaper never drops its sender before sending.
                return ExitInfo::Code(-1);
            }
        }
    }

    /// Sends `signal` to the child's whole process group, unless the child
    /// has been reaped (its group was killed then, and its pid may be reused).
    pub fn signal_group(&self, signal: nix::sys::signal::Signal) {
        self.group.signal(signal);
    }

    /// Stops the child: close stdin, wait `grace`, SIGTERM the group, wait
    /// `grace`, SIGKILL the group. Returns how it exited. (What is left of
    /// its group after it exits is killed by the reaper.)
    pub async fn stop(&self, grace: Duration) -> ExitInfo {
        use nix::sys::signal::Signal;
        // Closing stdin is what MCP's stdio transport defines as "shut down".
        self.rpc
            .link
            .close(RpcFailure::Broken("the toolbox is stopping".to_owned()));
        let _ = self.rpc.link.stdin.send(Vec::new());
        if let Ok(exit) = tokio::time::timeout(grace, self.exited()).await {
            return exit;
        }
        self.signal_group(Signal::SIGTERM);
        if let Ok(exit) = tokio::time::timeout(grace, self.exited()).await {
            return exit;
        }
        self.signal_group(Signal::SIGKILL);
        self.exited().await
    }
}

/// Longest wait for a spawn (the sandbox plan, the clone, the child's set-up
/// and its `exec`): an executable on a hung file system must not hold a
/// start, and so the daemon's shutdown, for ever.
const SPAWN_DEADLINE: Duration = Duration::from_secs(10);

/// A started child before the runtime takes it over; killed and reaped if
/// dropped before (a spawn nobody waits for any more).
struct Started {
    /// The process, until taken over.
    pid: Option<u32>,
    /// The daemon's ends of its stdin, stdout and stderr, until taken over.
    pipes: Option<[OwnedFd; 3]>,
    /// Its cgroup, where one could be made and entered.
    cgroup: Option<crate::process::cgroup::Cgroup>,
    /// What it keeps of its sandbox.
    kept: Option<Box<crate::process::sandbox::KeptSandbox>>,
    /// The keeper that kills it if the daemon dies.
    keeper: Option<&'static crate::process::keeper::Keeper>,
}

impl Drop for Started {
    fn drop(&mut self) {
        if let Some(pid) = self.pid.take() {
            // SAFETY: our own child, not yet reaped (so the pid is its own).
            unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) };
            exec::reap(pid as libc::pid_t);
        }
    }
}

/// Plans the child's sandbox and starts it (blocking: runs on a spawner
/// thread).
fn start(manifest: &Manifest) -> Result<Started, SpawnError> {
    // The keeper must exist before the child does (it is started once).
    let keeper = crate::process::keeper::Keeper::get();
    let mut cgroup = crate::process::cgroup::Cgroups::get().and_then(|cgroups| {
        cgroups
            .new_child(&manifest.id)
            .map_err(|e| {
                tracing::warn!(toolbox = %manifest.id, "cannot create a cgroup for the child: {e}")
            })
            .ok()
    });
    let v2_cgroup = cgroup.as_ref().map(crate::process::cgroup::Cgroup::dir);
    let sandbox = crate::process::sandbox::plan(manifest, v2_cgroup)?;
    if sandbox.is_none() {
        tracing::warn!(
            toolbox = %manifest.id,
            "sandbox profile \"off\": the child runs with the daemon's rights, environment \
             and network"
        );
    }
    let spawn_error = |source| SpawnError::Exec {
        program: manifest.program.display().to_string(),
        source,
    };
    let command = command(manifest, sandbox.as_ref()).map_err(spawn_error)?;
    let entry = cgroup.as_ref().map(crate::process::cgroup::Cgroup::entry);
    // Open for clone3, which starts the child in it.
    let dir = cgroup
        .as_ref()
        .map(|c| std::fs::File::open(c.dir()))
        .transpose()
        .map_err(spawn_error)?;
    let target = dir
        .as_ref()
        .zip(entry.as_deref())
        .map(|(dir, procs)| exec::Cgroup {
            dir: std::os::fd::AsFd::as_fd(dir),
            procs,
        });
    // A child that becomes another user gets a copy of the daemon's memory
    // (see `exec::Memory::Copied`) unless the change cannot make that
    // memory dumpable; every other one borrows it.
    let memory = match &sandbox {
        Some(plan) if plan.changes_user() && !user_change_keeps_memory_private() => {
            exec::Memory::Copied
        }
        Some(plan) if plan.in_user_namespace() => exec::Memory::Copied,
        _ => exec::Memory::Shared,
    };
    let spawned = exec::spawn(&command, &steps(sandbox.as_ref()), memory, target);
    let process = match spawned {
        Ok(process) => process,
        // The move into the cgroup may be what failed (a parent cgroup
        // that refuses it): try once without, and say so if that works;
        // never when the child's limits are in that cgroup.
        Err(first)
            if cgroup.is_some()
                && !sandbox
                    .as_ref()
                    .is_some_and(crate::process::sandbox::Plan::limits_in_cgroup) =>
        {
            let process = exec::spawn(&command, &steps(sandbox.as_ref()), memory, None)
                .map_err(spawn_error)?;
            tracing::warn!(
                toolbox = %manifest.id,
                "started the child without its cgroup ({first}): what it starts may \
                 outlive its stop if it leaves its process group"
            );
            cgroup = None;
            process
        }
        Err(e) => return Err(spawn_error(e)),
    };
    // Keep only what must outlive the spawn, and let Landlock's descriptors go.
    let kept = sandbox.map(|plan| Box::new(plan.into_kept()));
    Ok(Started {
        pid: Some(process.pid),
        pipes: Some([process.stdin, process.stdout, process.stderr]),
        cgroup,
        kept,
        keeper,
    })
}

/// Whether a child that shares the daemon's memory may change its user.
/// The kernel marks the memory of a process whose credentials change as
/// dumpable per `fs.suid_dumpable` (`commit_creds`); at 0, the default, that
/// is "not dumpable", as the daemon keeps itself
/// ([`crate::process::sandbox::make_daemon_undumpable`]), so sharing changes nothing.
/// Any other value, or one that cannot be read: the child gets a copy.
fn user_change_keeps_memory_private() -> bool {
    static PRIVATE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *PRIVATE.get_or_init(|| {
        let setting = std::fs::read_to_string("/proc/sys/fs/suid_dumpable");
        let daemon_undumpable = unsafe {
            // SAFETY: a plain prctl query of the calling process.
            libc::prctl(libc::PR_GET_DUMPABLE, 0, 0, 0, 0) == 0
        };
        daemon_undumpable && setting.is_ok_and(|text| text.trim() == "0")
    })
}

/// The child's pipes, made asynchronous.
fn async_pipes(
    [stdin, stdout, stderr]: [OwnedFd; 3],
) -> std::io::Result<(
    tokio::process::ChildStdin,
    tokio::process::ChildStdout,
    tokio::process::ChildStderr,
)> {
    Ok((
        tokio::process::ChildStdin::from_std(stdin.into())?,
        tokio::process::ChildStdout::from_std(stdout.into())?,
        tokio::process::ChildStderr::from_std(stderr.into())?,
    ))
}

impl Drop for Child {
    fn drop(&mut self) {
        // Only while it is unreaped: then the group id is still its own.
        self.signal_group(nix::sys::signal::Signal::SIGKILL);
        if let Some(cgroup) = self.cgroup.take() {
            cgroup.kill_and_remove();
        }
    }
}
