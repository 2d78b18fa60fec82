//! A view of the filesystem of the child's own (docs/security.md,
//! "Filesystem view"), where the daemon may make one: a mount namespace,
//! made in the child before its exec by a daemon running as root.
//!
//! In it:
//!
//! - `/tmp` and `/dev/shm` are new, empty, size-bounded tmpfs mounts,
//!   private to the child's tree and gone with it (their pages count
//!   against its memory limit as they are written); `TMPDIR` is `/tmp`.
//! - `/run` (and `/var/run` where it is a directory, not the usual link)
//!   is an empty read-only tmpfs, so no service's unix socket there (D-Bus,
//!   systemd, the user sessions' buses) can be reached: Landlock up to ABI
//!   7 does not govern connecting to a pathname socket.
//! - What the toolbox may read or write under a hidden directory is bound
//!   back in place, the same files: its own files and the manifest's
//!   `read_only` and `read_write` paths (a socket it needs is named there),
//!   and the resolver's directory when `/etc/resolv.conf` leads into `/run`.
//!
//! Mounts are made private first, so nothing propagates to the host.
//! Everything is prepared in the daemon ([`prepare`]) as C strings; the
//! child only makes system calls ([`Prepared::apply_in_child`]). A path to
//! keep is cloned as a detached mount (`open_tree`) in the new namespace
//! before anything covers it, and attached in place (`move_mount`) after:
//! a bind mount's source must be in the caller's namespace, which a
//! descriptor opened by the daemon is not. Both calls need Linux 5.2.

use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI32, Ordering};

/// The directories covered by a tmpfs. `/tmp` and `/dev/shm` are the
/// child's to write; the others are read-only and empty.
const HIDDEN: [&str; 2] = ["/run", "/var/run"];
const PRIVATE: [&str; 2] = ["/tmp", "/dev/shm"];

/// Largest size of each private tmpfs when the toolbox has no memory limit.
const UNLIMITED_TMPFS_MIB: u64 = 256;

/// Why no private view could be prepared.
#[derive(Debug, thiserror::Error)]
pub enum MountError {
    #[error("a path to keep visible has a NUL byte: {0}")]
    Nul(PathBuf),
}

/// `OPEN_TREE_CLONE` (linux/mount.h): a detached copy of the mount.
const OPEN_TREE_CLONE: libc::c_uint = 1;
/// `AT_RECURSIVE`: with the mounts beneath it.
const AT_RECURSIVE: libc::c_uint = 0x8000;
/// `MOVE_MOUNT_F_EMPTY_PATH`: the source is the descriptor itself.
const MOVE_MOUNT_F_EMPTY_PATH: libc::c_uint = 0x4;

/// One step in the child, in order.
#[derive(Debug)]
enum Step {
    /// `mount(NULL, "/", NULL, MS_REC | MS_PRIVATE)`: nothing propagates.
    Private,
    /// A tmpfs on `target` with `options` (`MS_NOSUID | MS_NODEV`, and
    /// `MS_RDONLY` once its mount points are made when `read_only`).
    Tmpfs { target: CString, options: CString },
    /// `mkdir(path, 0755)` in a covering tmpfs (an existing one is fine).
    Dir(CString),
    /// An empty file at `path` to bind a file onto.
    File(CString),
    /// Clones the mount at `path` (with those beneath) into `slot`, before
    /// anything covers it.
    Clone { path: CString, slot: usize },
    /// Attaches the clone in `slot` at `target`.
    Attach { slot: usize, target: CString },
    /// Remounts the tmpfs at `target` read-only.
    ReadOnly(CString),
    /// Makes the bind mount at `target` read-only.
    BindReadOnly(CString),
}

/// The private view, ready for a child to make.
#[derive(Debug)]
pub struct Prepared {
    /// The steps, in order.
    steps: Vec<Step>,
    /// The clones' descriptors, written by the child (its own copy, or
    /// memory it borrows while the daemon's thread waits for it).
    trees: Vec<AtomicI32>,
    /// The private tmpfs mounts' paths, for the child's Landlock rules.
    pub writable: Vec<CString>,
    /// The user namespace's maps, when the daemon is not root.
    user_namespace: Option<UserMaps>,
    /// What it holds, in words.
    pub words: String,
}

/// Prepares the private view of a child whose Landlock read set is `read`
/// and write set `read_write` (what is under a hidden directory there is
/// bound back), with tmpfs mounts of at most `memory_max_mib` (0: no limit).
pub fn prepare(
    read: &[PathBuf],
    read_write: &[PathBuf],
    memory_max_mib: u64,
) -> Result<Prepared, MountError> {
    let c = |path: &Path| {
        CString::new(path.as_os_str().as_bytes()).map_err(|_| MountError::Nul(path.to_owned()))
    };
    let size = if memory_max_mib == 0 {
        UNLIMITED_TMPFS_MIB
    } else {
        memory_max_mib
    };
    let mut steps = vec![Step::Private];
    let mut clones = Vec::new();
    let mut attach = Vec::new();
    let mut writable = Vec::new();
    let covered: Vec<PathBuf> = HIDDEN
        .iter()
        .chain(&PRIVATE)
        .map(PathBuf::from)
        // A link (`/var/run` -> `/run`) is covered where it leads.
        .filter(|dir| std::fs::symlink_metadata(dir).is_ok_and(|m| m.is_dir()))
        .collect();
    for dir in &covered {
        let private = PRIVATE.iter().any(|p| Path::new(p) == dir);
        let options = if private {
            format!("size={size}m,mode=1777")
        } else {
            "size=1m,mode=0755".to_owned()
        };
        let target = c(dir)?;
        attach.push(Step::Tmpfs {
            target: target.clone(),
            options: CString::new(options).map_err(|_| MountError::Nul(dir.clone()))?,
        });
        if private {
            writable.push(target.clone());
        }
        // What to keep visible beneath it, shallow first: as the kernel
        // resolves it (no `..`, no link: a path as written, a `#!` line's
        // say, must not lead the steps, run as root, outside the tmpfs),
        // writable where `read_write` has it, read-only else.
        let mut kept: Vec<(PathBuf, bool)> = read
            .iter()
            .map(|p| (p, false))
            .chain(read_write.iter().map(|p| (p, true)))
            .filter_map(|(p, rw)| Some((std::fs::canonicalize(p).ok()?, rw)))
            .filter(|(p, _)| p.starts_with(dir) && p != dir)
            .collect();
        // Writable first among equals, so that the dedup keeps it.
        kept.sort_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)));
        kept.dedup_by(|later, first| later.0 == first.0);
        let mut made: Vec<(PathBuf, bool)> = Vec::new();
        for (path, rw) in kept {
            let inside = made.iter().rev().find(|(m, _)| path.starts_with(m));
            // Inside one already bound as it is: nothing to add. A writable
            // path inside a read-only one is bound again, writable, onto
            // itself (it exists in the clone).
            let nested = match inside {
                Some((_, outer_rw)) if *outer_rw || !rw => continue,
                Some(_) => true,
                None => false,
            };
            let Ok(meta) = std::fs::metadata(&path) else {
                continue;
            };
            let slot = clones.len();
            clones.push(Step::Clone {
                path: c(&path)?,
                slot,
            });
            if nested {
                attach.push(Step::Attach {
                    slot,
                    target: c(&path)?,
                });
                made.push((path, rw));
                continue;
            }
            let rel = path.strip_prefix(dir).unwrap_or(&path);
            let mut at = dir.clone();
            let parts: Vec<_> = rel.components().collect();
            for (i, part) in parts.iter().enumerate() {
                at.push(part);
                let last = i + 1 == parts.len();
                if last && !meta.is_dir() {
                    attach.push(Step::File(c(&at)?));
                } else {
                    attach.push(Step::Dir(c(&at)?));
                }
            }
            attach.push(Step::Attach {
                slot,
                target: c(&path)?,
            });
            if !rw {
                // The tmpfs's root is writable to the child (Landlock adds
                // up the rights of every directory above a file): the mount
                // itself keeps a read-only path read-only.
                attach.push(Step::BindReadOnly(c(&path)?));
            }
            made.push((path, rw));
        }
        if !private {
            attach.push(Step::ReadOnly(target));
        }
    }
    let trees = (0..clones.len()).map(|_| AtomicI32::new(-1)).collect();
    steps.extend(clones);
    steps.extend(attach);
    let words = format!(
        "filesystem view: private /tmp and /dev/shm (tmpfs, {size} MiB each), {} hidden (mount \
         namespace)",
        covered
            .iter()
            .filter(|d| HIDDEN.iter().any(|h| Path::new(h) == d.as_path()))
            .map(|d| d.display().to_string())
            .collect::<Vec<_>>()
            .join(" and ")
    );
    let user_namespace = match availability() {
        Ok(How::UserNamespace) => Some(UserMaps::of_daemon()),
        _ => None,
    };
    let words = match user_namespace {
        Some(_) => format!("{words}, in a user namespace of the daemon's user"),
        None => words,
    };
    Ok(Prepared {
        steps,
        trees,
        writable,
        user_namespace,
        words,
    })
}

impl Prepared {
    /// Whether the child makes a user namespace (and must then leave it
    /// with no capability, and may have its memory marked dumpable).
    pub fn in_user_namespace(&self) -> bool {
        self.user_namespace.is_some()
    }

    /// Makes the view, in the child before its exec and before it drops
    /// root: a new mount namespace, then the steps. Only system calls.
    pub fn apply_in_child(&self) -> io::Result<()> {
        let check = |r: libc::c_int| {
            if r != 0 {
                Err(io::Error::last_os_error())
            } else {
                Ok(())
            }
        };
        let null = std::ptr::null::<libc::c_char>();
        let tree = |slot: usize| {
            self.trees
                .get(slot)
                .map_or(-1, |t| t.load(Ordering::Relaxed))
        };
        // SAFETY: system calls on C strings prepared before the child
        // started (or literals), which outlive them.
        let made = unsafe {
            match &self.user_namespace {
                Some(maps) => maps.enter()?,
                None => check(libc::unshare(libc::CLONE_NEWNS))?,
            }
            for step in &self.steps {
                match step {
                    Step::Private => check(libc::mount(
                        null,
                        c"/".as_ptr(),
                        null,
                        libc::MS_REC | libc::MS_PRIVATE,
                        std::ptr::null(),
                    ))?,
                    Step::Tmpfs { target, options } => check(libc::mount(
                        c"tmpfs".as_ptr(),
                        target.as_ptr(),
                        c"tmpfs".as_ptr(),
                        libc::MS_NOSUID | libc::MS_NODEV,
                        options.as_ptr().cast(),
                    ))?,
                    Step::Dir(path) => {
                        if libc::mkdir(path.as_ptr(), 0o755) == 0 {
                            // The umask (077 by now) must not close the way
                            // in; only a directory made here is changed.
                            check(libc::chmod(path.as_ptr(), 0o755))?;
                        } else if io::Error::last_os_error().raw_os_error() != Some(libc::EEXIST) {
                            return Err(io::Error::last_os_error());
                        }
                    }
                    Step::File(path) => {
                        let fd = libc::open(
                            path.as_ptr(),
                            libc::O_CREAT | libc::O_WRONLY | libc::O_CLOEXEC,
                            0o644,
                        );
                        if fd < 0 {
                            return Err(io::Error::last_os_error());
                        }
                        libc::close(fd);
                    }
                    Step::Clone { path, slot } => {
                        let fd = libc::syscall(
                            libc::SYS_open_tree,
                            libc::AT_FDCWD,
                            path.as_ptr(),
                            OPEN_TREE_CLONE | libc::O_CLOEXEC as libc::c_uint | AT_RECURSIVE,
                        );
                        if fd < 0 {
                            return Err(io::Error::last_os_error());
                        }
                        if let Some(t) = self.trees.get(*slot) {
                            t.store(fd as i32, Ordering::Relaxed);
                        }
                    }
                    Step::Attach { slot, target } => {
                        let moved = libc::syscall(
                            libc::SYS_move_mount,
                            tree(*slot),
                            c"".as_ptr(),
                            libc::AT_FDCWD,
                            target.as_ptr(),
                            MOVE_MOUNT_F_EMPTY_PATH,
                        );
                        if moved != 0 {
                            return Err(io::Error::last_os_error());
                        }
                    }
                    Step::BindReadOnly(target) => check(libc::mount(
                        null,
                        target.as_ptr(),
                        null,
                        libc::MS_REMOUNT
                            | libc::MS_BIND
                            | libc::MS_RDONLY
                            | libc::MS_NOSUID
                            | libc::MS_NODEV,
                        std::ptr::null(),
                    ))?,
                    Step::ReadOnly(target) => check(libc::mount(
                        null,
                        target.as_ptr(),
                        null,
                        libc::MS_REMOUNT | libc::MS_RDONLY | libc::MS_NOSUID | libc::MS_NODEV,
                        std::ptr::null(),
                    ))?,
                }
            }
            Ok(())
        };
        for slot in 0..self.trees.len() {
            let fd = tree(slot);
            if fd >= 0 {
                // SAFETY: a descriptor this child opened; closed once.
                unsafe { libc::close(fd) };
            }
        }
        made
    }
}

/// How the daemon makes a child's private view.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum How {
    /// A mount namespace, as root.
    Root,
    /// A user namespace that maps the daemon's own user (and nothing
    /// else), and a mount namespace in it: a daemon that is not root, on a
    /// kernel that lets users make them. The child leaves it with no
    /// capability.
    UserNamespace,
}

/// Whether the daemon can make a private view here, and how, or why not:
/// as root, when its own confinement lets it make a mount namespace and
/// mount in it (a systemd unit with `RestrictNamespaces=yes` or
/// `SystemCallFilter=~@mount` does not); as another user, when the kernel
/// lets it make a user namespace too (Ubuntu 24.04 and later restrict
/// them). Probed once, in a throwaway child.
pub fn availability() -> Result<How, &'static str> {
    static AVAILABLE: std::sync::OnceLock<Result<How, &'static str>> = std::sync::OnceLock::new();
    *AVAILABLE.get_or_init(|| {
        if nix::unistd::geteuid().is_root() {
            return match probe(None) {
                Ok(()) => Ok(How::Root),
                Err(_) => Err(
                    "the daemon cannot make a mount namespace (its own confinement refuses \
                     unshare or mount: systemd's RestrictNamespaces= or SystemCallFilter=, or \
                     no CAP_SYS_ADMIN): /tmp and /dev/shm are shared, and the unix sockets \
                     under /run are reachable to the toolbox's user",
                ),
            };
        }
        match probe(Some(UserMaps::of_daemon())) {
            Ok(()) => Ok(How::UserNamespace),
            Err(_) => Err(
                "the daemon is not root and cannot make a user namespace here (the kernel, or \
                 its confinement, refuses them): /tmp and /dev/shm are shared, and the unix \
                 sockets under /run are reachable to the toolbox's user",
            ),
        }
    })
}

/// The lines a user namespace's maps get: the daemon's own uid and gid,
/// mapped to themselves, and nothing else.
#[derive(Debug)]
pub struct UserMaps {
    uid_map: CString,
    gid_map: CString,
}

impl UserMaps {
    fn of_daemon() -> UserMaps {
        let (uid, gid) = (nix::unistd::geteuid(), nix::unistd::getegid());
        // Digits and spaces only: no NUL.
        let line = |id: u32| CString::new(format!("{id} {id} 1")).unwrap_or_default();
        UserMaps {
            uid_map: line(uid.as_raw()),
            gid_map: line(gid.as_raw()),
        }
    }

    /// In the child: a new user namespace and mount namespace, the maps
    /// written. Only system calls.
    fn enter(&self) -> io::Result<()> {
        // SAFETY: system calls on C strings made before the child started.
        unsafe {
            if libc::unshare(libc::CLONE_NEWUSER | libc::CLONE_NEWNS) != 0 {
                return Err(io::Error::last_os_error());
            }
            // The daemon keeps itself undumpable, which makes a child's own
            // /proc files root's: dumpable while it writes its maps (this
            // child has a copy of the daemon's memory: `in_user_namespace`),
            // and not after.
            libc::prctl(libc::PR_SET_DUMPABLE, 1, 0, 0, 0);
            let written = write_file(c"/proc/self/setgroups", c"deny")
                .and_then(|()| write_file(c"/proc/self/uid_map", &self.uid_map))
                .and_then(|()| write_file(c"/proc/self/gid_map", &self.gid_map));
            libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0);
            written
        }
    }
}

/// Writes `text` to the file at `path` (a /proc map). Only system calls.
///
/// # Safety
/// None beyond the calls': both are NUL-terminated and outlive them.
unsafe fn write_file(path: &std::ffi::CStr, text: &std::ffi::CStr) -> io::Result<()> {
    // SAFETY: as the function says.
    unsafe {
        let fd = libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        let bytes = text.to_bytes();
        let written = libc::write(fd, bytes.as_ptr().cast(), bytes.len());
        let error = io::Error::last_os_error();
        libc::close(fd);
        if written != bytes.len() as isize {
            return Err(error);
        }
    }
    Ok(())
}

/// Makes a mount namespace (in a user namespace with `maps`) and a tmpfs in
/// it, in a child that then runs `true`: what a private view needs, tried
/// once.
fn probe(maps: Option<UserMaps>) -> io::Result<()> {
    use std::os::unix::process::CommandExt;
    let mut command = std::process::Command::new("/bin/true");
    command
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    // SAFETY: between fork and exec, only system calls on literals.
    unsafe {
        command.pre_exec(move || {
            let null = std::ptr::null::<libc::c_char>();
            let private = libc::MS_REC | libc::MS_PRIVATE;
            match &maps {
                Some(maps) => maps.enter()?,
                None if libc::unshare(libc::CLONE_NEWNS) != 0 => {
                    return Err(io::Error::last_os_error())
                }
                None => {}
            }
            if libc::mount(null, c"/".as_ptr(), null, private, std::ptr::null()) != 0
                || libc::mount(
                    c"tmpfs".as_ptr(),
                    c"/tmp".as_ptr(),
                    c"tmpfs".as_ptr(),
                    libc::MS_NOSUID | libc::MS_NODEV,
                    c"size=1m".as_ptr().cast(),
                ) != 0
            {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let status = command.status()?;
    if status.success() {
        Ok(())
    } else {
        Err(io::Error::other("the probe failed"))
    }
}
