//! One cgroup (v2) per toolbox child, where the kernel and the daemon's
//! privileges allow: a cgroup holds every process the child starts, `setsid`
//! ones included, and `cgroup.kill` ends them all at once. So a toolbox's stop
//! (or its exit) leaves nothing behind, and the keeper can end every toolbox
//! of a daemon that was killed outright.
//!
//! The daemon makes `toolboxd-<pid>` under its own cgroup in the cgroup2
//! hierarchy (found in /proc/self/mountinfo and /proc/self/cgroup) and one
//! child cgroup per toolbox child in it. Where that is not possible (no
//! cgroup2 mount, not writable), toolboxes run without: process groups and
//! the parent-death signal remain (see docs/failure-modes.md).

use std::ffi::CString;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::Duration;

static CGROUPS: OnceLock<Option<Cgroups>> = OnceLock::new();

/// The daemon's cgroup directory for its toolboxes.
pub struct Cgroups {
    /// `<cgroup2 mount>/<our cgroup>/toolboxd-<pid>`.
    root: PathBuf,
    /// The same, as a path inside the hierarchy (as /proc/PID/cgroup shows it).
    relative: String,
    /// Names each child's cgroup uniquely.
    next: AtomicU64,
}

/// One toolbox child's cgroup.
#[derive(Debug)]
pub struct Cgroup {
    /// Its directory.
    dir: PathBuf,
    /// `<dir>/cgroup.procs`, prepared before the child starts so that it
    /// can move itself in without allocating (where it is not born in it).
    procs: CString,
}

impl Cgroups {
    /// The daemon's cgroups, created on first use; `None` where cgroups
    /// cannot be used (then said once in the log).
    pub fn get() -> Option<&'static Cgroups> {
        CGROUPS
            .get_or_init(|| match Cgroups::create() {
                Ok(cgroups) => Some(cgroups),
                Err(why) => {
                    tracing::info!("toolboxes run without cgroups: {why}");
                    None
                }
            })
            .as_ref()
    }

    fn create() -> Result<Cgroups, String> {
        let mountinfo = std::fs::read_to_string("/proc/self/mountinfo")
            .map_err(|e| format!("cannot read /proc/self/mountinfo: {e}"))?;
        let mount = cgroup2_mount(&mountinfo).ok_or("no cgroup2 hierarchy is mounted")?;
        let own = std::fs::read_to_string("/proc/self/cgroup")
            .map_err(|e| format!("cannot read /proc/self/cgroup: {e}"))?;
        let own = own_cgroup2_path(&own).ok_or("this process has no cgroup2 path")?;
        become_leaf(&mount.join(own.trim_start_matches('/')));
        let relative = format!(
            "{}/toolboxd-{}",
            own.trim_end_matches('/'),
            std::process::id()
        );
        let root = mount.join(relative.trim_start_matches('/'));
        std::fs::create_dir(&root).map_err(|e| format!("cannot create {}: {e}", root.display()))?;
        if !root.join("cgroup.kill").exists() {
            let _ = std::fs::remove_dir(&root);
            return Err("the kernel has no cgroup.kill (Linux 5.14+)".to_owned());
        }
        // The limits of `[sandbox]`, where these controllers are delegated
        // to us; otherwise v1 controllers or nothing (see sandbox::limits).
        for controller in ["+pids", "+memory"] {
            let _ = std::fs::write(root.join("cgroup.subtree_control"), controller);
        }
        Ok(Cgroups {
            root,
            relative,
            next: AtomicU64::new(0),
        })
    }

    /// The daemon's cgroups if they were created already (never creates them).
    pub fn get_if_created() -> Option<&'static Cgroups> {
        CGROUPS.get()?.as_ref()
    }

    /// Whether process `pid` runs in one of this daemon's toolbox cgroups.
    pub fn holds(&self, pid: i32) -> bool {
        let Ok(text) = std::fs::read_to_string(format!("/proc/{pid}/cgroup")) else {
            return false;
        };
        let Some(path) = own_cgroup2_path(&text) else {
            return false;
        };
        // The root's path inside the hierarchy, e.g. "/toolboxd-123".
        let rel = self.relative.as_str();
        path == rel
            || path
                .strip_prefix(rel)
                .is_some_and(|rest| rest.starts_with('/'))
    }

    /// Every process in the cgroup of process `pid`, if that is one of this
    /// daemon's toolbox cgroups.
    pub fn procs_of(&self, pid: u32) -> Option<Vec<u32>> {
        let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
        let inside = own_cgroup2_path(&text)?
            .strip_prefix(self.relative.as_str())?
            .strip_prefix('/')?;
        let procs = std::fs::read_to_string(self.root.join(inside).join("cgroup.procs")).ok()?;
        Some(
            procs
                .lines()
                .filter_map(|l| l.trim().parse().ok())
                .collect(),
        )
    }

    /// The directory holding every toolbox cgroup of this daemon.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// A new cgroup for one child of toolbox `id`.
    pub fn new_child(&self, id: &str) -> std::io::Result<Cgroup> {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        let dir = self.root.join(format!("{id}-{n}"));
        std::fs::create_dir(&dir)?;
        let procs = CString::new(
            dir.join("cgroup.procs")
                .into_os_string()
                .into_encoded_bytes(),
        )
        .map_err(std::io::Error::other)?;
        Ok(Cgroup { dir, procs })
    }
}

/// A cgroup with processes in it cannot pass controllers on (cgroup v2's
/// "no internal processes" rule). Where the daemon is alone in a cgroup
/// delegated to it (systemd's `Delegate=`), it moves into a leaf, `daemon`,
/// and enables the controllers the limits need for its subtree. Elsewhere
/// (not alone, nothing delegated) it changes nothing.
fn become_leaf(own_dir: &Path) {
    let read = |name: &str| std::fs::read_to_string(own_dir.join(name)).unwrap_or_default();
    let wanted = ["pids", "memory"];
    let offered = read("cgroup.controllers");
    let passed = read("cgroup.subtree_control");
    let missing: Vec<&str> = wanted
        .into_iter()
        .filter(|c| offered.split_whitespace().any(|o| o == *c))
        .filter(|c| !passed.split_whitespace().any(|p| p == *c))
        .collect();
    // Only when alone: never move out of a cgroup others share.
    let alone = read("cgroup.procs").split_whitespace().collect::<Vec<_>>()
        == [std::process::id().to_string()];
    if missing.is_empty() || !alone || !delegated(own_dir) {
        return;
    }
    let leaf = own_dir.join("daemon");
    let moved = std::fs::create_dir(&leaf)
        .or_else(|e| match e.kind() {
            std::io::ErrorKind::AlreadyExists => Ok(()),
            _ => Err(e),
        })
        .and_then(|()| std::fs::write(leaf.join("cgroup.procs"), std::process::id().to_string()));
    if let Err(e) = moved {
        tracing::info!("cannot move into {}: {e}", leaf.display());
        return;
    }
    for controller in missing {
        let enabled = std::fs::write(
            own_dir.join("cgroup.subtree_control"),
            format!("+{controller}"),
        );
        if let Err(e) = enabled {
            tracing::info!(
                "cannot pass the {controller} controller on in {}: {e}",
                own_dir.display()
            );
        }
    }
}

/// Whether the cgroup at `dir` was delegated to this process: systemd marks
/// a `Delegate=` unit's cgroup with a `trusted.delegate` (or, for a user
/// manager, `user.delegate`) extended attribute.
fn delegated(dir: &Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let Ok(path) = CString::new(dir.as_os_str().as_bytes()) else {
        return false;
    };
    [c"trusted.delegate", c"user.delegate"].iter().any(|name| {
        // SAFETY: two valid C strings; a null buffer of size 0 asks only
        // whether the attribute is there (its size).
        unsafe { libc::getxattr(path.as_ptr(), name.as_ptr(), std::ptr::null_mut(), 0) >= 0 }
    })
}

/// Moves the calling process into the cgroup whose `cgroup.procs` is `procs`
/// ([`Cgroup::entry`]). Made for a child before its exec (`child/exec.rs`):
/// it only opens, writes and closes.
pub fn enter(procs: &std::ffi::CStr) -> std::io::Result<()> {
    // SAFETY: a NUL-terminated path and a one-byte buffer that outlive the calls.
    unsafe {
        let fd = libc::open(procs.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let written = libc::write(fd, b"0".as_ptr().cast(), 1);
        let error = std::io::Error::last_os_error();
        libc::close(fd);
        if written != 1 {
            return Err(error);
        }
    }
    Ok(())
}

impl Cgroup {
    /// Its directory (where its controllers' files are, if any).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// What a child needs to enter this cgroup before its exec ([`enter`]).
    pub fn entry(&self) -> CString {
        self.procs.clone()
    }

    /// Kills every process in the cgroup.
    pub fn kill(&self) {
        let _ = std::fs::write(self.dir.join("cgroup.kill"), "1");
    }

    /// Kills what is left and removes the cgroup once it is empty (in the
    /// background: the kernel takes a moment to empty it).
    pub fn kill_and_remove(self) {
        self.kill();
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            let _ = std::fs::remove_dir(&self.dir);
            return;
        };
        runtime.spawn(async move {
            for _ in 0..50 {
                if std::fs::remove_dir(&self.dir).is_ok() {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            tracing::warn!(cgroup = %self.dir.display(), "a toolbox cgroup did not empty; left in place");
        });
    }
}

impl Drop for Cgroup {
    /// A cgroup whose child never started (or is gone) is removed; one still
    /// populated stays, and the keeper removes it with the daemon's root.
    fn drop(&mut self) {
        let _ = std::fs::remove_dir(&self.dir);
    }
}

/// Kills every process under `root` and removes it and its cgroups (the
/// keeper's end of a daemon). Blocking; gives up after about a second.
pub fn kill_and_remove_tree(root: &Path) {
    let _ = std::fs::write(root.join("cgroup.kill"), "1");
    remove_tree(root);
}

/// Removes the cgroup `root` and the cgroups in it once their processes are
/// gone (v1 or v2). Blocking; gives up after about a second.
pub fn remove_tree(root: &Path) {
    for _ in 0..50 {
        let children: Vec<PathBuf> = std::fs::read_dir(root)
            .map(|entries| {
                entries
                    .filter_map(|e| e.ok())
                    .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                    .map(|e| e.path())
                    .collect()
            })
            .unwrap_or_default();
        for child in &children {
            let _ = std::fs::remove_dir(child);
        }
        if std::fs::remove_dir(root).is_ok() || !root.exists() {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The mount point of the cgroup2 hierarchy in a mountinfo text.
pub(crate) fn cgroup2_mount(mountinfo: &str) -> Option<PathBuf> {
    mountinfo.lines().find_map(|line| {
        // "ID PARENT MAJ:MIN ROOT MOUNT OPTS [TAGS...] - FSTYPE SOURCE SUPER"
        let (left, right) = line.split_once(" - ")?;
        (right.split_whitespace().next()? == "cgroup2")
            .then(|| left.split_whitespace().nth(4).map(PathBuf::from))?
    })
}

/// This process's path in the cgroup2 hierarchy (the `0::` line).
pub(crate) fn own_cgroup2_path(cgroup: &str) -> Option<&str> {
    cgroup.lines().find_map(|l| l.strip_prefix("0::"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_cgroup2_mount_and_our_path() {
        let mountinfo = "25 30 0:22 / /sys rw - sysfs sysfs rw\n\
                         33 25 0:28 / /sys/fs/cgroup/unified rw,nosuid - cgroup2 cgroup2 rw\n\
                         34 25 0:29 / /sys/fs/cgroup/pids rw - cgroup cgroup rw,pids\n";
        assert_eq!(
            cgroup2_mount(mountinfo),
            Some(PathBuf::from("/sys/fs/cgroup/unified"))
        );
        assert_eq!(
            cgroup2_mount("34 25 0:29 / /x rw - cgroup cgroup rw\n"),
            None
        );
        assert_eq!(
            own_cgroup2_path("12:pids:/a\n0::/system.slice/toolboxd.service\n"),
            Some("/system.slice/toolboxd.service")
        );
        assert_eq!(own_cgroup2_path("12:pids:/a\n"), None);
    }
}
