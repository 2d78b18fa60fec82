//! The system paths every child of the standard profile may read, or read
//! and write (devices), whatever its manifest says.

use std::path::{Path, PathBuf};

/// The system directories every child of the standard profile may read and
/// execute from, those that exist here:
///
/// - `/usr`, `/bin`, `/sbin`, `/lib`, `/lib64`, `/lib32`, `/libx32`:
///   programs, interpreters, shared libraries and the loader (on a merged
///   /usr the short ones are links into /usr and add nothing).
/// - `/etc`: the loader cache, users and groups, name service and TLS
///   configuration, time zones, interpreters' site configuration. Whole,
///   because runtimes read many files there and tools replace them by
///   renaming (a rule on a file would keep its old inode); files only root
///   may read (shadow, host keys) stay protected by their permissions, not
///   by Landlock.
/// - where `/etc/resolv.conf` leads when it is a link out of `/etc` (the
///   directory of systemd-resolved's or NetworkManager's file, which is
///   replaced, not rewritten), so names resolve.
/// - `/opt`: software installed outside the package manager.
/// - `/proc/sys` and the system-wide files of `/proc` that runtimes read
///   (`cpuinfo`, `meminfo`, `stat`, `uptime`, `loadavg`, `version`,
///   `filesystems`), not `/proc` as a whole: Landlock's ptrace restriction
///   keeps `mem`, `cwd` or `exe` of processes outside the domain closed,
///   but not their `environ` or `maps`, and the environments of the daemon
///   and of the other toolboxes hold their secrets. The child's own
///   `/proc/<pid>` (its `/proc/self`) is granted by
///   [`Prepared::apply_in_child`]; a process it starts has none.
/// - `/sys/devices/system/cpu`: how many CPUs a runtime may use (glibc,
///   node, BLAS); not the rest of /sys. Of `/sys/fs/cgroup`, where
///   runtimes read how much memory they may use, only the child's own
///   groups are added (`sandbox/mod.rs`): the rest lists every toolbox's
///   processes.
///
/// Not included: `/snap` (snap programs start through a setuid helper that
/// no_new_privs disables), `/home`, `/root`, `/run`, `/var`, `/tmp`, `/srv`,
/// `/mnt`, `/media`: a toolbox names what it needs from those.
pub fn system_read_paths() -> Vec<PathBuf> {
    const CANDIDATES: &[&str] = &[
        "/usr",
        "/bin",
        "/sbin",
        "/lib",
        "/lib64",
        "/lib32",
        "/libx32",
        "/etc",
        "/opt",
        "/proc/sys",
        "/proc/cpuinfo",
        "/proc/meminfo",
        "/proc/stat",
        "/proc/uptime",
        "/proc/loadavg",
        "/proc/version",
        "/proc/filesystems",
        "/sys/devices/system/cpu",
    ];
    let mut paths: Vec<PathBuf> = CANDIDATES
        .iter()
        .map(PathBuf::from)
        .filter(|path| path.exists())
        .collect();
    if let Some(dir) = resolver_dir(Path::new("/etc/resolv.conf"), &paths) {
        paths.push(dir);
    }
    paths
}

/// The directory `resolv_conf` leads to when it is a link to a file no
/// path of `covered` holds.
pub(super) fn resolver_dir(resolv_conf: &Path, covered: &[PathBuf]) -> Option<PathBuf> {
    let target = std::fs::canonicalize(resolv_conf).ok()?;
    if covered.iter().any(|root| target.starts_with(root)) {
        return None;
    }
    target.parent().map(Path::to_path_buf)
}

/// The devices every child of the standard profile may read and write,
/// those that exist here: `/dev/null` (shells and runtimes redirect to it),
/// `/dev/zero`, `/dev/random` and `/dev/urandom` (runtimes without
/// getrandom(2) read them). Not `/dev/tty` nor `/dev/pts`: a child has no
/// terminal and must not reach the operator's; not `/dev/shm` (POSIX
/// semaphores, as Python's multiprocessing uses): a toolbox that needs it
/// names it.
pub fn system_read_write_paths() -> Vec<PathBuf> {
    ["/dev/null", "/dev/zero", "/dev/random", "/dev/urandom"]
        .iter()
        .map(PathBuf::from)
        .filter(|path| path.exists())
        .collect()
}
