//! Who a toolbox's child runs as (docs/security.md, "Users").
//!
//! A daemon running as root never hands a toolbox uid 0: every toolbox gets
//! an unprivileged user and group of its own, as systemd's `DynamicUser=`
//! does, with no supplementary groups and every capability set empty; its
//! state directory is owned by that user. `user = NAME` picks a named
//! account instead; `user = "root"` is the one, loudly logged, way to keep
//! root (and its capabilities). A daemon that is not root cannot change
//! users: its toolboxes run as its own user, which status reports.
//!
//! Allocated ids come from [`DYNAMIC_FIRST`]..[`DYNAMIC_FIRST`] +
//! [`DYNAMIC_COUNT`], outside the ranges systemd and distributions use
//! (system users below 1000, people 1000-60000, systemd's `DynamicUser`
//! 61184-65519, containers from 524288, its foreign range 2147352576 on).
//! A toolbox id always maps to the same uid (FNV-1a of the id): files it
//! leaves in its state directory stay its own across restarts of the daemon.
//! A uid that the system's user database knows, or that another toolbox of
//! this daemon holds, is passed over for the next one.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

use super::SandboxError;
use crate::manifest::Sandbox;

/// The first uid (and gid) allocated to a toolbox.
pub const DYNAMIC_FIRST: u32 = 2_130_706_432; // 0x7F00_0000
/// How many uids the allocation range holds.
pub const DYNAMIC_COUNT: u32 = 65_536;

/// Who the child runs as.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Identity {
    /// The daemon's own user: a daemon that is not root cannot change it,
    /// so every toolbox shares it (status says so).
    Daemon {
        /// The daemon's uid.
        uid: u32,
    },
    /// A user and group of its own, every capability dropped.
    Own {
        /// Its uid.
        uid: u32,
        /// Its gid.
        gid: u32,
        /// The manifest's `user` when it named one; `None` when allocated.
        named: Option<String>,
    },
    /// root with the daemon's capabilities: the manifest's `user = "root"`.
    Root,
}

impl Identity {
    /// The uid and gid to change to, when the child changes its user.
    pub fn ids(&self) -> Option<(u32, u32)> {
        match self {
            Identity::Own { uid, gid, .. } => Some((*uid, *gid)),
            Identity::Daemon { .. } | Identity::Root => None,
        }
    }

    /// In words, for logs, status and `check --sandbox`.
    pub fn words(&self) -> String {
        match self {
            Identity::Daemon { uid } => format!(
                "uid {uid} (the daemon's own user, shared with every toolbox: the daemon is not \
                 root); capabilities: none"
            ),
            Identity::Own {
                uid,
                gid,
                named: Some(name),
            } => format!(
                "uid {uid} gid {gid} (user {name}), no supplementary groups; capabilities: none"
            ),
            Identity::Own {
                uid,
                gid,
                named: None,
            } => format!(
                "uid {uid} gid {gid} (allocated for this toolbox), no supplementary groups; \
                 capabilities: none"
            ),
            Identity::Root => {
                "uid 0 (user = \"root\"): root with the daemon's capabilities".to_owned()
            }
        }
    }
}

/// Who the child of toolbox `id` runs as, given its `[sandbox]`.
pub fn identity(id: &str, sandbox: &Sandbox) -> Result<Identity, SandboxError> {
    let daemon = nix::unistd::geteuid();
    if !daemon.is_root() {
        // `user` and `group` are refused at load for a daemon that is not
        // root (manifest/sandbox.rs).
        return Ok(Identity::Daemon {
            uid: daemon.as_raw(),
        });
    }
    if sandbox.user.as_deref() == Some("root") {
        return Ok(Identity::Root);
    }
    let named = match &sandbox.user {
        Some(name) => Some(lookup_user(name)?),
        None => None,
    };
    let group = match &sandbox.group {
        Some(name) => Some(lookup_group(name)?),
        None => None,
    };
    if let Some(user) = named.as_ref().filter(|u| u.uid.is_root()) {
        return Err(SandboxError::Identity {
            key: "user",
            name: user.name.clone(),
            why: "it is uid 0, which owns root's files even without capabilities; write \
                  user = \"root\" to run a toolbox as root knowingly"
                .to_owned(),
        });
    }
    Ok(match named {
        Some(user) => Identity::Own {
            uid: user.uid.as_raw(),
            gid: group.unwrap_or(user.gid.as_raw()),
            named: Some(user.name),
        },
        None => {
            let uid = allocate(id);
            Identity::Own {
                uid,
                gid: group.unwrap_or(uid),
                named: None,
            }
        }
    })
}

fn lookup_user(name: &str) -> Result<nix::unistd::User, SandboxError> {
    nix::unistd::User::from_name(name)
        .map_err(|e| e.to_string())
        .and_then(|u| u.ok_or_else(|| "no such user".to_owned()))
        .map_err(|why| SandboxError::Identity {
            key: "user",
            name: name.to_owned(),
            why,
        })
}

fn lookup_group(name: &str) -> Result<u32, SandboxError> {
    nix::unistd::Group::from_name(name)
        .map_err(|e| e.to_string())
        .and_then(|g| g.ok_or_else(|| "no such group".to_owned()))
        .map(|g| g.gid.as_raw())
        .map_err(|why| SandboxError::Identity {
            key: "group",
            name: name.to_owned(),
            why,
        })
}

/// The uid toolbox `id` gets: its hash's place in the range, or the next
/// one that neither the user database nor another toolbox holds.
fn allocate(id: &str) -> u32 {
    static HELD: OnceLock<Mutex<HashMap<u32, String>>> = OnceLock::new();
    let held = HELD.get_or_init(Default::default);
    // A poisoned lock only means a panic elsewhere while it was held; the
    // map itself is whole (every insert is one call).
    let mut held = held.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    if let Some((&uid, _)) = held.iter().find(|(_, owner)| owner.as_str() == id) {
        return uid;
    }
    let start = fnv1a(id.as_bytes()) % DYNAMIC_COUNT;
    for step in 0..DYNAMIC_COUNT {
        let uid = DYNAMIC_FIRST + (start + step) % DYNAMIC_COUNT;
        if held.contains_key(&uid) || known_to_the_system(uid) {
            continue;
        }
        held.insert(uid, id.to_owned());
        return uid;
    }
    // 65,536 toolboxes in one daemon: the manifests' bound is far below.
    DYNAMIC_FIRST + start
}

/// Whether the user or group database has `uid` (as a uid or a gid).
fn known_to_the_system(uid: u32) -> bool {
    use nix::unistd::{Gid, Group, Uid, User};
    matches!(User::from_uid(Uid::from_raw(uid)), Ok(Some(_)))
        || matches!(Group::from_gid(Gid::from_raw(uid)), Ok(Some(_)))
}

/// 32-bit FNV-1a: a stable hash (std's are randomised per process).
fn fnv1a(bytes: &[u8]) -> u32 {
    bytes.iter().fold(0x811c_9dc5_u32, |hash, &b| {
        (hash ^ u32::from(b)).wrapping_mul(0x0100_0193)
    })
}

/// The highest capability number this kernel knows, read once (for
/// dropping the bounding set in the child, which cannot read files).
pub fn last_capability() -> u32 {
    static LAST: OnceLock<u32> = OnceLock::new();
    *LAST.get_or_init(|| {
        std::fs::read_to_string("/proc/sys/kernel/cap_last_cap")
            .ok()
            .and_then(|text| text.trim().parse().ok())
            // CAP_CHECKPOINT_RESTORE, the last of Linux 5.9 to 6.18.
            .unwrap_or(40)
    })
}

/// Whether the daemon holds `CAP_SETPCAP`, which dropping a child's
/// bounding set takes (a systemd unit may have left it out: the bounding
/// set then stays the daemon's, of no use to a child with no capability and
/// no_new_privs, which no file capability can raise).
pub fn can_drop_bounding_set() -> bool {
    static CAN: OnceLock<bool> = OnceLock::new();
    *CAN.get_or_init(|| {
        const CAP_SETPCAP: u32 = 8;
        std::fs::read_to_string("/proc/self/status")
            .ok()
            .and_then(|status| {
                let hex = status.lines().find_map(|l| l.strip_prefix("CapEff:"))?;
                u64::from_str_radix(hex.trim(), 16).ok()
            })
            .is_some_and(|effective| effective & (1 << CAP_SETPCAP) != 0)
    })
}

/// Drops every capability from the bounding set (the calling process must
/// still hold `CAP_SETPCAP`: before its change of user). Only system calls.
pub fn drop_bounding_set(last: u32) -> std::io::Result<()> {
    for cap in 0..=last {
        // SAFETY: a plain prctl with integer arguments.
        if unsafe { libc::prctl(libc::PR_CAPBSET_DROP, cap as libc::c_ulong, 0, 0, 0) } != 0 {
            let e = std::io::Error::last_os_error();
            // EINVAL: a number this kernel does not have.
            if e.raw_os_error() != Some(libc::EINVAL) {
                return Err(e);
            }
        }
    }
    Ok(())
}

/// Empties the effective, permitted, inheritable and ambient sets (after the
/// change of user, which empties the first two but not the inheritable set).
/// Only system calls.
pub fn drop_capabilities() -> std::io::Result<()> {
    /// `_LINUX_CAPABILITY_VERSION_3`.
    const VERSION_3: u32 = 0x2008_0522;
    #[repr(C)]
    struct Header {
        version: u32,
        pid: libc::c_int,
    }
    #[repr(C)]
    #[derive(Clone, Copy)]
    struct Data {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    let header = Header {
        version: VERSION_3,
        pid: 0,
    };
    let none = [Data {
        effective: 0,
        permitted: 0,
        inheritable: 0,
    }; 2];
    // SAFETY: capset reads a header and two data structs that live on this
    // stack; the prctl takes integers only.
    unsafe {
        if libc::syscall(libc::SYS_capset, &header, none.as_ptr()) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        let clear = libc::PR_CAP_AMBIENT_CLEAR_ALL as libc::c_ulong;
        if libc::prctl(libc::PR_CAP_AMBIENT, clear, 0, 0, 0) != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Checks that `uid`/`gid` (with no supplementary groups) may reach what
/// the child needs before it starts: search every directory above each of
/// `paths` and the path itself (`execute` for the program, read for the
/// rest), so that a toolbox installed under a private home fails its start
/// naming the directory that stops it, not with the runtime's own words.
pub fn check_reachable(uid: u32, gid: u32, paths: &[(&Path, bool)]) -> Result<(), SandboxError> {
    use std::os::unix::fs::MetadataExt;
    for &(path, execute) in paths {
        let mut dirs: Vec<PathBuf> = path.ancestors().skip(1).map(Path::to_path_buf).collect();
        dirs.reverse();
        for dir in dirs.iter().filter(|d| !d.as_os_str().is_empty()) {
            let Ok(meta) = std::fs::metadata(dir) else {
                continue; // what does not exist is for the start to report
            };
            if !allows(uid, gid, meta.uid(), meta.gid(), meta.mode(), 0o1) {
                return Err(SandboxError::Unreachable {
                    path: path.to_owned(),
                    blocked: dir.clone(),
                    mode: meta.mode() & 0o7777,
                    owner: meta.uid(),
                    uid,
                });
            }
        }
        let Ok(meta) = std::fs::metadata(path) else {
            continue;
        };
        let need = if meta.is_dir() || execute { 0o1 } else { 0o4 };
        if !allows(uid, gid, meta.uid(), meta.gid(), meta.mode(), need) {
            return Err(SandboxError::Unreachable {
                path: path.to_owned(),
                blocked: path.to_owned(),
                mode: meta.mode() & 0o7777,
                owner: meta.uid(),
                uid,
            });
        }
    }
    Ok(())
}

/// The `read_write` paths of a toolbox that `uid`/`gid` may not write
/// (a file, or a directory to create in), in words: Landlock allows them,
/// their owner and mode do not.
pub fn unwritable(uid: u32, gid: u32, paths: &[PathBuf]) -> Vec<String> {
    use std::os::unix::fs::MetadataExt;
    paths
        .iter()
        .filter_map(|path| {
            let meta = std::fs::metadata(path).ok()?;
            let need = if meta.is_dir() { 0o3 } else { 0o2 };
            (!allows(uid, gid, meta.uid(), meta.gid(), meta.mode(), need)).then(|| {
                format!(
                    "read_write {}: the toolbox's user (uid {uid}) cannot write it (mode {:04o}, \
                     owner uid {}); give it to that user (chown {uid} {}) or to a group the \
                     manifest names",
                    path.display(),
                    meta.mode() & 0o7777,
                    meta.uid(),
                    path.display()
                )
            })
        })
        .collect()
}

/// Whether the permission bits `need` (of `0o7`) are granted to
/// `uid`/`gid` on a file of `owner`/`group` with `mode`.
fn allows(uid: u32, gid: u32, owner: u32, group: u32, mode: u32, need: u32) -> bool {
    let bits = if uid == owner {
        mode >> 6
    } else if gid == group {
        mode >> 3
    } else {
        mode
    };
    bits & need == need
}

/// Gives the state directory `dir` (and what the toolbox left in it) to
/// `uid`/`gid` when another owner has it: after an upgrade from a daemon
/// that ran toolboxes as root, or a change of `user`. The walk goes by
/// directory descriptors (`openat` with `O_NOFOLLOW`, `fchownat` without
/// following), so a process of the earlier owner that swaps a directory
/// for a link while it runs cannot lead it elsewhere; it stays on one
/// filesystem. Only what the earlier owner owns is changed: directories,
/// links themselves, and regular files with no other hard link (one may be
/// a file outside, linked in); devices, FIFOs and sockets are left alone.
pub fn hand_over(dir: &Path, uid: u32, gid: u32) -> std::io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(dir.as_os_str().as_bytes())
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
    let flags = libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC;
    // SAFETY: a NUL-terminated path; the descriptor is owned below.
    let fd = unsafe { libc::open(c.as_ptr(), flags) };
    if fd < 0 {
        let e = std::io::Error::last_os_error();
        return match e.kind() {
            std::io::ErrorKind::NotFound => Ok(()),
            _ => Err(e),
        };
    }
    // SAFETY: a new descriptor nothing else owns.
    let fd = unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) };
    let top = fstat(fd.as_raw_fd(), None)?;
    if top.st_uid == uid {
        return Ok(());
    }
    Walk {
        previous: top.st_uid,
        device: top.st_dev,
        uid,
        gid,
    }
    .directory(fd, 0)
}

use std::os::fd::{AsRawFd, FromRawFd};

/// One hand-over walk: whose files, on which filesystem, to whom.
struct Walk {
    previous: u32,
    device: libc::dev_t,
    uid: u32,
    gid: u32,
}

/// Deepest directory nesting walked (a state directory deeper than this
/// keeps what lies below with its earlier owner).
const MAX_DEPTH: usize = 64;

impl Walk {
    /// Changes the open directory `dir` and what it holds.
    fn directory(&self, dir: std::os::fd::OwnedFd, depth: usize) -> std::io::Result<()> {
        // SAFETY: fchown on a descriptor we own.
        if unsafe { libc::fchown(dir.as_raw_fd(), self.uid, self.gid) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        if depth >= MAX_DEPTH {
            return Ok(());
        }
        for name in entries(&dir)? {
            let Ok(stat) = fstat(dir.as_raw_fd(), Some(&name)) else {
                continue; // gone meanwhile
            };
            if stat.st_uid != self.previous || stat.st_dev != self.device {
                continue;
            }
            match stat.st_mode & libc::S_IFMT {
                libc::S_IFDIR => {
                    let flags =
                        libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC;
                    // SAFETY: a name read from this directory, NUL-terminated.
                    let fd = unsafe { libc::openat(dir.as_raw_fd(), name.as_ptr(), flags) };
                    if fd < 0 {
                        continue; // swapped for something else meanwhile
                    }
                    // SAFETY: a new descriptor nothing else owns.
                    let sub = unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) };
                    self.directory(sub, depth + 1)?;
                }
                libc::S_IFLNK => self.change(&dir, &name)?,
                libc::S_IFREG if stat.st_nlink == 1 => self.change(&dir, &name)?,
                _ => {}
            }
        }
        Ok(())
    }

    /// Changes the entry `name` of `dir` itself (never what a link names).
    fn change(&self, dir: &std::os::fd::OwnedFd, name: &std::ffi::CStr) -> std::io::Result<()> {
        // SAFETY: a name read from this directory, NUL-terminated.
        let changed = unsafe {
            libc::fchownat(
                dir.as_raw_fd(),
                name.as_ptr(),
                self.uid,
                self.gid,
                libc::AT_SYMLINK_NOFOLLOW,
            )
        };
        if changed != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    }
}

/// `fstat` of `dir` itself, or `fstatat` of its entry `name` (not following it).
fn fstat(dir: i32, name: Option<&std::ffi::CStr>) -> std::io::Result<libc::stat> {
    let mut stat = std::mem::MaybeUninit::<libc::stat>::uninit();
    // SAFETY: the kernel fills `stat` when the call succeeds.
    let r = unsafe {
        match name {
            Some(name) => libc::fstatat(
                dir,
                name.as_ptr(),
                stat.as_mut_ptr(),
                libc::AT_SYMLINK_NOFOLLOW,
            ),
            None => libc::fstat(dir, stat.as_mut_ptr()),
        }
    };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: filled by the successful call above.
    Ok(unsafe { stat.assume_init() })
}

/// The names in the open directory `dir` (without `.` and `..`).
fn entries(dir: &std::os::fd::OwnedFd) -> std::io::Result<Vec<std::ffi::CString>> {
    // SAFETY: fdopendir takes a duplicate, closed by closedir below.
    let dup = unsafe { libc::fcntl(dir.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 0) };
    if dup < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a descriptor of a directory we own.
    let stream = unsafe { libc::fdopendir(dup) };
    if stream.is_null() {
        let e = std::io::Error::last_os_error();
        // SAFETY: fdopendir failed, so `dup` is still ours to close.
        unsafe { libc::close(dup) };
        return Err(e);
    }
    let mut names = Vec::new();
    loop {
        // SAFETY: readdir on the stream opened above; the entry is read
        // before the next call.
        let entry = unsafe { libc::readdir(stream) };
        if entry.is_null() {
            break;
        }
        // SAFETY: d_name is NUL-terminated within the entry.
        let name = unsafe { std::ffi::CStr::from_ptr((*entry).d_name.as_ptr()) };
        if name.to_bytes() != b"." && name.to_bytes() != b".." {
            names.push(name.to_owned());
        }
    }
    // SAFETY: the stream opened above, closed once.
    unsafe { libc::closedir(stream) };
    Ok(names)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_id_maps_to_the_same_uid_in_the_range_and_ids_do_not_share() {
        let a = allocate("identity-test-a");
        assert_eq!(allocate("identity-test-a"), a);
        assert!((DYNAMIC_FIRST..DYNAMIC_FIRST + DYNAMIC_COUNT).contains(&a));
        // The hash alone places it (nothing in this range is a system user).
        assert_eq!(a, DYNAMIC_FIRST + fnv1a(b"identity-test-a") % DYNAMIC_COUNT);
        let b = allocate("identity-test-b");
        assert_ne!(a, b);
    }

    #[test]
    fn permission_bits_are_read_as_the_kernel_does_for_a_user_without_groups() {
        // Owner, group and other triplets.
        assert!(allows(5, 5, 5, 0, 0o700, 0o1));
        assert!(!allows(6, 6, 5, 0, 0o770, 0o1));
        assert!(allows(6, 6, 5, 6, 0o710, 0o1));
        assert!(allows(6, 6, 0, 0, 0o755, 0o4));
        assert!(!allows(6, 6, 0, 0, 0o750, 0o4));
        // The owner's bits decide for the owner, even when "other" has more.
        assert!(!allows(5, 5, 5, 0, 0o007, 0o4));
    }

    #[test]
    fn hand_over_changes_what_the_earlier_owner_left_and_nothing_a_link_names() {
        use std::os::unix::fs::MetadataExt;
        if !nix::unistd::geteuid().is_root() {
            eprintln!("skipped: needs root to change owners");
            return;
        }
        let base = std::env::temp_dir().join(format!("toolboxd-handover-{}", std::process::id()));
        let state = base.join("state");
        std::fs::create_dir_all(state.join("deep/er")).unwrap();
        std::fs::write(state.join("deep/er/file"), "x").unwrap();
        let outside = base.join("outside");
        std::fs::write(&outside, "root's").unwrap();
        std::os::unix::fs::symlink(&outside, state.join("link")).unwrap();
        std::fs::hard_link(&outside, state.join("hard")).unwrap();
        let to = DYNAMIC_FIRST + 11;
        hand_over(&state, to, to).unwrap();
        let owner = |p: &Path| std::fs::symlink_metadata(p).unwrap().uid();
        for path in ["", "deep", "deep/er", "deep/er/file", "link"] {
            assert_eq!(owner(&state.join(path)), to, "{path}");
        }
        assert_eq!(
            owner(&outside),
            0,
            "a link's target, or a hard link, is not handed over"
        );
        // Already the new owner's: nothing to do.
        hand_over(&state, to, to).unwrap();
        std::fs::remove_dir_all(&base).unwrap();
    }

    #[test]
    fn a_private_directory_above_the_program_is_named() {
        let dir = std::env::temp_dir().join(format!("toolboxd-reach-{}", std::process::id()));
        let inner = dir.join("inner");
        std::fs::create_dir_all(&inner).unwrap();
        let program = inner.join("tool");
        std::fs::write(&program, "#!/bin/sh\n").unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&program, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::set_permissions(&inner, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        let stranger = DYNAMIC_FIRST + 7;
        check_reachable(stranger, stranger, &[(&program, true)]).unwrap();
        std::fs::set_permissions(&inner, std::fs::Permissions::from_mode(0o700)).unwrap();
        let err = check_reachable(stranger, stranger, &[(&program, true)]).unwrap_err();
        let text = err.to_string();
        assert!(text.contains(&inner.display().to_string()), "{text}");
        assert!(text.contains("0700"), "{text}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
