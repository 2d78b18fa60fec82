//! The memory and task limits of a toolbox's whole tree (`memory_max_mib`,
//! `tasks_max`), through a cgroup controller where the daemon can use one:
//! cgroup v2 with the controller enabled below the daemon's cgroup, else a
//! cgroup v1 hierarchy of that controller. Where neither is possible a limit
//! the manifest declares fails the start (never silently weaker); a default
//! one is reported as not enforced.

use std::ffi::CString;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

use super::SandboxError;
use crate::manifest::Sandbox;

/// One limit: its knob, its cgroup v2 file, its cgroup v1 controller and file.
struct Knob {
    key: &'static str,
    v2_file: &'static str,
    v1_controller: &'static str,
    v1_file: &'static str,
}

const TASKS: Knob = Knob {
    key: "tasks_max",
    v2_file: "pids.max",
    v1_controller: "pids",
    v1_file: "pids.max",
};
const MEMORY: Knob = Knob {
    key: "memory_max_mib",
    v2_file: "memory.max",
    v1_controller: "memory",
    v1_file: "memory.limit_in_bytes",
};

/// Names v1 groups uniquely.
static NEXT: AtomicU64 = AtomicU64::new(0);
/// The daemon's own v1 groups (one per controller), removed at its exit.
static DAEMON_GROUPS: std::sync::Mutex<Vec<PathBuf>> = std::sync::Mutex::new(Vec::new());

/// A child's limits, set up before it starts.
#[derive(Debug, Default)]
pub struct Limited {
    /// `tasks` of the v1 groups the child enters before its exec.
    pub entries: Vec<CString>,
    /// Those v1 groups, removed once the child is gone.
    v1_dirs: Vec<PathBuf>,
    /// How each limit holds, in words, for `check --sandbox` and status.
    pub how: Vec<String>,
    /// Whether a limit was written into the child's own (v2) cgroup: a
    /// child started without that cgroup would run without it.
    pub in_child_cgroup: bool,
}

impl Limited {
    /// The directories of the v1 groups made for the child (readable to
    /// it: a runtime reads its limits there).
    pub fn dirs(&self) -> &[PathBuf] {
        &self.v1_dirs
    }
}

/// Sets `sandbox`'s limits for a child of toolbox `id`, in its v2 cgroup
/// `v2_child` (if it has one) or in v1 groups made for it.
pub fn set_up(
    id: &str,
    v2_child: Option<&Path>,
    sandbox: &Sandbox,
) -> Result<Limited, SandboxError> {
    let mut limited = Limited::default();
    let memory_bytes = sandbox.memory_max_mib.saturating_mul(1024 * 1024);
    for (knob, value) in [(&TASKS, sandbox.tasks_max), (&MEMORY, memory_bytes)] {
        if value == 0 {
            continue;
        }
        let shown = if knob.key == MEMORY.key {
            format!("{} = {}", knob.key, sandbox.memory_max_mib)
        } else {
            format!("{} = {value}", knob.key)
        };
        if let Some(dir) = v2_child.filter(|dir| dir.join(knob.v2_file).exists()) {
            write(&dir.join(knob.v2_file), value)?;
            limited.in_child_cgroup = true;
            limited
                .how
                .push(format!("{shown}: cgroup v2 {}", knob.v2_file));
            continue;
        }
        match v1_group(id, knob.v1_controller) {
            Ok(dir) => {
                write(&dir.join(knob.v1_file), value)?;
                // The child, one thread until its exec, moves that thread:
                // a thread's move takes no global lock, where a process's
                // waits for an RCU grace period first after a pause.
                let procs = dir.join("tasks");
                let entry =
                    CString::new(procs.into_os_string().into_encoded_bytes()).map_err(|e| {
                        SandboxError::Dir {
                            path: dir.clone(),
                            source: std::io::Error::other(e),
                        }
                    })?;
                limited.entries.push(entry);
                limited
                    .how
                    .push(format!("{shown}: cgroup v1 {}", knob.v1_file));
                limited.v1_dirs.push(dir);
            }
            Err(why) if sandbox.limits_declared => {
                return Err(SandboxError::Limit { key: knob.key, why })
            }
            Err(why) => limited.how.push(format!("{shown}: not enforced ({why})")),
        }
    }
    Ok(limited)
}

/// How a limit through `controller` would hold here, or why it would not
/// (without creating anything).
pub fn availability(controller: &str) -> Result<String, String> {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo")
        .map_err(|e| format!("cannot read /proc/self/mountinfo: {e}"))?;
    let own = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
    // v2: the controller is available in our own cgroup, to enable below it.
    if let (Some(mount), Some(path)) = (
        crate::process::cgroup::cgroup2_mount(&mountinfo),
        crate::process::cgroup::own_cgroup2_path(&own),
    ) {
        let available = mount
            .join(path.trim_start_matches('/'))
            .join("cgroup.controllers");
        let available = std::fs::read_to_string(available).unwrap_or_default();
        if available.split_whitespace().any(|c| c == controller) {
            return Ok(format!("cgroup v2 {controller} controller"));
        }
    }
    match (v1_mount(&mountinfo, controller), v1_path(&own, controller)) {
        (Some(_), Some(_)) => Ok(format!("cgroup v1 {controller} controller")),
        _ => Err(format!(
            "no {controller} controller is available to the daemon (cgroup v2 without \
             delegation, and no v1 hierarchy)"
        )),
    }
}

/// Writes `value` into a cgroup control file.
fn write(file: &Path, value: u64) -> Result<(), SandboxError> {
    std::fs::write(file, value.to_string()).map_err(|source| SandboxError::Dir {
        path: file.to_owned(),
        source,
    })
}

/// A new v1 group of `controller` for a child of toolbox `id`, below the
/// daemon's own group: `<mount>/<own>/toolboxd-<pid>/<id>-<n>`.
fn v1_group(id: &str, controller: &str) -> Result<PathBuf, String> {
    let (mountinfo, own) = proc_view()?;
    let mount = v1_mount(mountinfo, controller)
        .ok_or_else(|| format!("no {controller} controller is available to the daemon"))?;
    let own = v1_path(own, controller)
        .ok_or_else(|| format!("the daemon is in no {controller} cgroup"))?;
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let daemon = mount
        .join(own.trim_start_matches('/'))
        .join(format!("toolboxd-{}", std::process::id()));
    {
        let mut known = DAEMON_GROUPS.lock().unwrap_or_else(|e| e.into_inner());
        if !known.contains(&daemon) {
            known.push(daemon.clone());
        }
    }
    let dir = daemon.join(format!("{id}-{n}"));
    std::fs::create_dir_all(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    Ok(dir)
}

/// The daemon's /proc/self/mountinfo and /proc/self/cgroup, read at its
/// first v1 group and kept (a failed read is tried again next time): every
/// child's limits were reading both, a walk of every mount in the kernel,
/// and the daemon's groups stay where it made them.
fn proc_view() -> Result<&'static (String, String), String> {
    static VIEW: OnceLock<(String, String)> = OnceLock::new();
    if let Some(view) = VIEW.get() {
        return Ok(view);
    }
    let read =
        |path: &str| std::fs::read_to_string(path).map_err(|e| format!("cannot read {path}: {e}"));
    let view = (read("/proc/self/mountinfo")?, read("/proc/self/cgroup")?);
    Ok(VIEW.get_or_init(|| view))
}

/// The mount point of the v1 hierarchy holding `controller`.
fn v1_mount(mountinfo: &str, controller: &str) -> Option<PathBuf> {
    mountinfo.lines().find_map(|line| {
        let (left, right) = line.split_once(" - ")?;
        let mut right = right.split_whitespace();
        if right.next()? != "cgroup" {
            return None;
        }
        let options = right.nth(1)?;
        options
            .split(',')
            .any(|o| o == controller)
            .then(|| left.split_whitespace().nth(4).map(PathBuf::from))?
    })
}

/// This process's path in the v1 hierarchy of `controller`.
fn v1_path<'a>(cgroup: &'a str, controller: &str) -> Option<&'a str> {
    cgroup.lines().find_map(|line| {
        let mut parts = line.splitn(3, ':');
        let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        controllers
            .split(',')
            .any(|c| c == controller)
            .then_some(path)
    })
}

impl Drop for Limited {
    /// Removes the v1 groups: at once when the child is gone (as at the
    /// daemon's exit), else in the background while the kernel empties them.
    fn drop(&mut self) {
        let dirs = std::mem::take(&mut self.v1_dirs);
        if dirs.is_empty() || remove_all(&dirs) {
            return;
        }
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn_blocking(move || {
                for _ in 0..50 {
                    std::thread::sleep(std::time::Duration::from_millis(20));
                    if remove_all(&dirs) {
                        return;
                    }
                }
            });
        }
    }
}

/// Removes `dirs`, and the daemon's group above each once it is empty (so
/// a process that never shuts down cleanly, a test, leaves nothing);
/// `false` while one is still populated.
fn remove_all(dirs: &[PathBuf]) -> bool {
    if !dirs
        .iter()
        .all(|d| std::fs::remove_dir(d).is_ok() || !d.exists())
    {
        return false;
    }
    for parent in dirs.iter().filter_map(|d| d.parent()) {
        let _ = std::fs::remove_dir(parent);
    }
    true
}

/// Removes the daemon's v1 groups and what is left in them (at its exit,
/// once every toolbox is stopped). Blocking; gives up after about a second.
pub fn remove_daemon_groups() {
    let groups = std::mem::take(&mut *DAEMON_GROUPS.lock().unwrap_or_else(|e| e.into_inner()));
    for group in groups {
        crate::process::cgroup::remove_tree(&group);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_a_v1_controller_and_our_path_in_it() {
        let mountinfo = "33 25 0:28 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw\n\
                         34 25 0:29 / /sys/fs/cgroup/pids rw - cgroup cgroup rw,pids\n\
                         35 25 0:30 / /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct\n";
        assert_eq!(
            v1_mount(mountinfo, "pids"),
            Some(PathBuf::from("/sys/fs/cgroup/pids"))
        );
        assert_eq!(
            v1_mount(mountinfo, "cpuacct"),
            Some(PathBuf::from("/sys/fs/cgroup/cpu,cpuacct"))
        );
        assert_eq!(v1_mount(mountinfo, "memory"), None);
        let cgroup = "8:pids:/a/b\n4:memory:/m\n2:cpu,cpuacct:/\n0::/\n";
        assert_eq!(v1_path(cgroup, "pids"), Some("/a/b"));
        assert_eq!(v1_path(cgroup, "cpuacct"), Some("/"));
        assert_eq!(v1_path(cgroup, "blkio"), None);
    }
}
