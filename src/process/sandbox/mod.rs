//! Confinement of a toolbox's child (docs/security.md): what the standard
//! profile applies. Everything that reads files, allocates or may fail for a
//! reason worth saying happens in the daemon before the child starts
//! ([`plan`]); the child, which may share the daemon's memory until its
//! exec (`child/exec.rs`), only makes system calls ([`Plan::apply_in_child`]).
//!
//! The standard profile gives a child: an environment built from an
//! allow-list (`env_pass`), the manifest's `env` and its `secrets`, never the
//! daemon's; a state directory and a private tmp of its own; `umask 077`; no
//! core dumps; its own descriptor limit; no descriptor beyond 0, 1 and 2; no
//! new privileges; under a root daemon, a user of its own and no
//! capabilities (`identity.rs`).

pub mod identity;
pub mod landlock;
pub mod limits;
pub mod mounts;
mod network;
pub mod reach;
pub mod refusal;
mod report;
pub mod seccomp;
mod state_dir;

pub use identity::Identity;
use network::network;
pub(crate) use network::network_words;
pub use report::report;
use state_dir::make_dir;
pub use state_dir::{state_dir_of, state_over, state_root};

use std::ffi::OsString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use nix::sys::resource::Resource;

use crate::manifest::{Manifest, Profile};

/// The variable that tells a child where its state directory is.
pub const STATE_DIR_VAR: &str = "TOOLBOXD_STATE_DIR";
/// Largest secret read from a file.
const MAX_SECRET_BYTES: u64 = 64 * 1024;

/// Why a child's sandbox cannot be set up as declared: its start fails with
/// this (never a weaker sandbox).
#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    #[error("[sandbox] no state directory for toolboxes: {0}; set STATE_DIRECTORY (systemd's StateDirectory=) or XDG_STATE_HOME")]
    NoStateRoot(String),
    #[error("[sandbox] cannot prepare the toolbox's directory {path}: {source}")]
    Dir {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("[sandbox] secrets: cannot read {name} from {path}: {why}")]
    Secret {
        name: String,
        path: PathBuf,
        why: String,
    },
    #[error("[sandbox] secrets: {name} names the credential {credential:?} but CREDENTIALS_DIRECTORY is not set; give an absolute path, or run under systemd with LoadCredential=")]
    NoCredentials { name: String, credential: String },
    #[error("[sandbox] {key} is declared but cannot be enforced here: {why}; remove it, or give the daemon a cgroup controller (systemd: Delegate=yes)")]
    Limit { key: &'static str, why: String },
    #[error("[sandbox] Landlock: {0}")]
    Landlock(#[from] landlock::LandlockError),
    #[error("[sandbox] seccomp: {0}")]
    Seccomp(#[from] seccomp::SeccompError),
    #[error("[sandbox] private filesystem view: {0}")]
    Mounts(#[from] mounts::MountError),
    #[error("[sandbox] {0}")]
    StateFull(String),
    #[error("[sandbox] {key} {name:?} cannot be found: {why}")]
    Identity {
        key: &'static str,
        name: String,
        why: String,
    },
    #[error(
        "[sandbox] the toolbox's user (uid {uid}) cannot reach {}: {} is mode {mode:04o}, owned \
         by uid {owner}. A toolbox runs as a user of its own, not as root: install what it runs \
         where every user may read it (/usr/local, /opt, a directory with o+rx), or name a \
         user that may reach it (user = ...)",
        path.display(),
        blocked.display()
    )]
    Unreachable {
        path: PathBuf,
        blocked: PathBuf,
        mode: u32,
        owner: u32,
        uid: u32,
    },
}

impl SandboxError {
    /// Whether it failed for want of descriptors, processes or memory (a
    /// passing shortage, worth another try), not for what was declared.
    pub fn is_resource_shortage(&self) -> bool {
        let source = match self {
            SandboxError::Dir { source, .. } => source,
            SandboxError::Landlock(landlock::LandlockError::Path { source, .. })
            | SandboxError::Landlock(landlock::LandlockError::Kernel { source, .. }) => source,
            _ => return false,
        };
        is_shortage(source)
    }
}

/// Whether `error` is a shortage of descriptors, processes or memory.
pub fn is_shortage(error: &std::io::Error) -> bool {
    matches!(
        error.raw_os_error(),
        Some(libc::EMFILE | libc::ENFILE | libc::EAGAIN | libc::ENOMEM)
    )
}

/// A child's sandbox, prepared before the child starts.
#[derive(Debug)]
pub struct Plan {
    /// The child's whole environment.
    env: Vec<(OsString, OsString)>,
    /// Who the child runs as.
    pub identity: Identity,
    /// The highest capability number, for dropping the bounding set;
    /// `None` when the daemon cannot (no `CAP_SETPCAP`).
    last_capability: Option<u32>,
    /// The highest capability number, for a child that leaves a user
    /// namespace of its own (where it holds every capability) with none.
    cap_last: u32,
    /// Its network level, in words.
    network: String,
    /// Its `RLIMIT_NOFILE`.
    nofile: libc::rlim_t,
    /// Its state directory (kept across starts), for status and tests.
    pub state_dir: PathBuf,
    /// Its private tmp (its own, new at every start, removed with it): a
    /// directory under the state root, or `/tmp` in its private view.
    pub tmp_dir: PathBuf,
    /// Its private view of the filesystem, where the daemon can make one.
    view: Option<mounts::Prepared>,
    /// Its memory and task limits: the cgroups it enters, and how each holds.
    pub limits: limits::Limited,
    /// Its filesystem (and, with `network = "none"`, TCP) ruleset.
    landlock: landlock::Prepared,
    /// Its system-call filter.
    seccomp: seccomp::Prepared,
    /// What it may read and write, path by path: kept to explain a refusal.
    pub reach: std::sync::Arc<reach::Reach>,
}

/// Prepares the sandbox `manifest` declares, for one spawn: reads the
/// secrets, makes the state directory and a new private tmp, sets the
/// limits (in the child's cgroup `v2_cgroup`, if it has one). `None` for
/// `profile = "off"`.
pub fn plan(manifest: &Manifest, v2_cgroup: Option<&Path>) -> Result<Option<Plan>, SandboxError> {
    let sandbox = &manifest.sandbox;
    if sandbox.profile == Profile::Off {
        return Ok(None);
    }
    let identity = identity::identity(&manifest.id, sandbox)?;
    if identity == Identity::Root {
        tracing::warn!(
            toolbox = %manifest.id,
            "user = \"root\": the child runs as root with the daemon's capabilities; it can \
             change any file's owner and mode, read every secret on the device and signal any \
             process. Give it a user of its own unless it must be root"
        );
    }
    let ids = identity.ids();
    let state_root = state_root()?;
    let root = state_root.join(&manifest.id);
    let state_dir = root.join("state");
    // One per child: instances (and another daemon's child of the same id)
    // never share, nor empty, each other's.
    static NEXT_TMP: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT_TMP.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    // With a private view, its /tmp is its own (a tmpfs, gone with it).
    let private_view = mounts::availability().is_ok();
    let tmp_dir = if private_view {
        PathBuf::from("/tmp")
    } else {
        root.join("tmp").join(format!("{}-{n}", std::process::id()))
    };
    if let Some((uid, gid)) = ids {
        // Before make_dir gives the directory itself to the child's user.
        identity::hand_over(&state_dir, uid, gid).map_err(|source| SandboxError::Dir {
            path: state_dir.clone(),
            source,
        })?;
    }
    make_dir(&state_dir, ids, false)?;
    if let Some(why) = state_over(&state_dir, sandbox.state_max_mib) {
        return Err(SandboxError::StateFull(why));
    }
    if !private_view {
        make_dir(&tmp_dir, ids, true)?;
    }
    if let Some((uid, gid)) = ids {
        // Another user must pass through the directories above its own,
        // which only the daemon may write.
        use std::os::unix::fs::PermissionsExt;
        let mut above = vec![state_root.clone(), root.clone()];
        if !private_view {
            above.push(root.join("tmp"));
        }
        for dir in above {
            let fail = |source| SandboxError::Dir {
                path: dir.clone(),
                source,
            };
            let mode = std::fs::metadata(&dir).map_err(fail)?.permissions().mode();
            let wanted = (mode | 0o711) & 0o755;
            if mode & 0o7777 != wanted {
                std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(wanted))
                    .map_err(fail)?;
            }
        }
        reachable(manifest, uid, gid)?;
        for why in identity::unwritable(uid, gid, &sandbox.read_write) {
            tracing::warn!(toolbox = %manifest.id, "{why}");
        }
    }
    let env = environment(manifest, &state_dir, &tmp_dir)?;
    let (tcp, sockets) = network(sandbox);
    let limits = limits::set_up(&manifest.id, v2_cgroup, sandbox)?;
    warn_once_not_enforced(&manifest.id, &limits.how);
    let mut reach = reach_of(manifest, &state_dir, (!private_view).then_some(&tmp_dir));
    // Of the cgroup tree, only its own groups (where a runtime reads its
    // limits): the others list every toolbox's processes.
    let cgroups = limits
        .dirs()
        .iter()
        .cloned()
        .chain(v2_cgroup.map(Path::to_path_buf));
    reach.read.extend(cgroups.map(|path| reach::Grant {
        path,
        why: reach::WHY_CGROUPS,
    }));
    let policy = landlock::FsPolicy::standard(reach.read_paths(), reach.write_paths(), tcp);
    let mut landlock = landlock::prepare(&policy)?;
    let view = if private_view {
        let view = mounts::prepare(&policy.read, &policy.read_write, sandbox.memory_max_mib)?;
        landlock.grant_writable_in_child(view.writable.clone());
        reach
            .write
            .extend(view.writable.iter().map(|path| reach::Grant {
                path: PathBuf::from(std::ffi::OsStr::from_bytes(path.as_bytes())),
                why: reach::WHY_PRIVATE_TMP,
            }));
        Some(view)
    } else {
        None
    };
    let seccomp = seccomp::prepare(sockets)?;
    Ok(Some(Plan {
        env,
        identity,
        last_capability: identity::can_drop_bounding_set().then(identity::last_capability),
        cap_last: identity::last_capability(),
        network: network_words(sandbox).1,
        nofile: sandbox.nofile as libc::rlim_t,
        state_dir,
        tmp_dir,
        view,
        limits,
        landlock,
        seccomp,
        reach: std::sync::Arc::new(reach),
    }))
}

/// Says once per toolbox, as a warning, which of its default limits this
/// machine does not enforce (a daemon that is not root, or no cgroup
/// controller): the `toolbox ready` line and status say it at every start.
fn warn_once_not_enforced(id: &str, how: &[String]) {
    static WARNED: std::sync::Mutex<Option<std::collections::HashSet<String>>> =
        std::sync::Mutex::new(None);
    let missing: Vec<&String> = how
        .iter()
        .filter(|h| h.contains(": not enforced"))
        .collect();
    if missing.is_empty() {
        return;
    }
    // A poisoned lock only means a panic elsewhere while it was held.
    let mut warned = WARNED.lock().unwrap_or_else(|p| p.into_inner());
    if warned
        .get_or_insert_with(Default::default)
        .insert(id.to_owned())
    {
        let missing: Vec<&str> = missing.iter().map(|h| h.as_str()).collect();
        tracing::warn!(
            toolbox = %id,
            "limits not enforced on this machine: {}; give the daemon a cgroup controller \
             (run it as root, or under systemd with Delegate=yes)",
            missing.join("; ")
        );
    }
}

/// Whether `uid`/`gid` may run the toolbox's program in its working
/// directory and read the scripts its arguments name.
fn reachable(manifest: &Manifest, uid: u32, gid: u32) -> Result<(), SandboxError> {
    let mut needed = vec![(manifest.program.as_path(), true), (&manifest.cwd, true)];
    let scripts: Vec<PathBuf> = manifest
        .args
        .iter()
        .map(|arg| manifest.cwd.join(arg))
        .filter(|path| path.is_file())
        .collect();
    needed.extend(scripts.iter().map(|path| (path.as_path(), false)));
    identity::check_reachable(uid, gid, &needed)
}

/// Where processes share memory and locks (`/run/shm` is a link to
/// `/dev/shm` on most systems): writable in the standard profile.
const SHARED_MEMORY: [&str; 2] = ["/dev/shm", "/run/shm"];

/// What a toolbox may read and write beside the system: its own files and
/// `read_only`; its state directory, its tmp when it has no private view
/// (`tmp`), shared memory then, and `read_write`.
pub fn reach_of(manifest: &Manifest, state_dir: &Path, tmp: Option<&PathBuf>) -> reach::Reach {
    let mut write = vec![reach::Grant {
        path: state_dir.to_owned(),
        why: reach::WHY_STATE,
    }];
    if let Some(tmp) = tmp {
        // Its tmp, and shared memory, where OVOS libraries keep their locks
        // (shared between toolboxes without a private view).
        write.push(reach::Grant {
            path: tmp.clone(),
            why: reach::WHY_TMP,
        });
        write.extend(
            SHARED_MEMORY
                .iter()
                .map(PathBuf::from)
                .filter(|p| p.exists())
                .map(|path| reach::Grant {
                    path,
                    why: reach::WHY_SHARED_MEMORY,
                }),
        );
    }
    write.extend(reach::own_writes(manifest));
    reach::Reach {
        read: reach::own_reads(manifest),
        write,
        manifest: manifest.path.clone(),
    }
}

/// The child's environment: the `env_pass` variables the daemon has (never
/// those of its service manager), then `HOME`, `TMPDIR` and
/// [`STATE_DIR_VAR`], then the manifest's `env`, then the secrets. With
/// `env_clear`, no daemon variable at all.
fn environment(
    manifest: &Manifest,
    state_dir: &Path,
    tmp_dir: &Path,
) -> Result<Vec<(OsString, OsString)>, SandboxError> {
    let sandbox = &manifest.sandbox;
    let mut env: std::collections::BTreeMap<OsString, OsString> = Default::default();
    if !manifest.env_clear {
        for name in &sandbox.env_pass {
            if let Some(value) = std::env::var_os(name) {
                env.insert(name.into(), value);
            }
        }
    }
    let own = [
        ("HOME", state_dir),
        ("TMPDIR", tmp_dir),
        (STATE_DIR_VAR, state_dir),
    ];
    for (name, path) in own {
        env.insert(name.into(), path.into());
    }
    // A value may name the child's own directories ($TOOLBOXD_STATE_DIR).
    for (name, value) in &manifest.env {
        env.insert(name.into(), reach::expand(value, &own).into());
    }
    for (name, source) in &sandbox.secrets {
        env.insert(name.into(), secret(name, source)?.into());
    }
    Ok(env.into_iter().collect())
}

/// Reads secret `name` from `source`: an absolute path, or the name of a
/// credential in `$CREDENTIALS_DIRECTORY`. One trailing newline is dropped.
pub(crate) fn secret(name: &str, source: &str) -> Result<String, SandboxError> {
    let path = if source.contains('/') {
        PathBuf::from(source)
    } else {
        match std::env::var_os("CREDENTIALS_DIRECTORY") {
            Some(dir) => PathBuf::from(dir).join(source),
            None => {
                return Err(SandboxError::NoCredentials {
                    name: name.to_owned(),
                    credential: source.to_owned(),
                })
            }
        }
    };
    let fail = |why: String| SandboxError::Secret {
        name: name.to_owned(),
        path: path.clone(),
        why,
    };
    let mut text = crate::util::files::read_small_regular(&path, MAX_SECRET_BYTES)
        .map_err(|e| fail(format!("{e:?}")))?;
    if text.ends_with('\n') {
        text.pop();
    }
    Ok(text)
}

impl Plan {
    /// Whether a limit of the child's lives in its own cgroup (v2), which it
    /// must then not be started without.
    pub fn limits_in_cgroup(&self) -> bool {
        self.limits.in_child_cgroup
    }

    /// Whether the child becomes another user.
    pub fn changes_user(&self) -> bool {
        self.identity.ids().is_some()
    }

    /// Whether the child makes a user namespace of its own: it must have a
    /// copy of the daemon's memory, which it marks dumpable for a moment.
    pub fn in_user_namespace(&self) -> bool {
        self.view.as_ref().is_some_and(|v| v.in_user_namespace())
    }

    /// The child's whole environment (nothing of the daemon's).
    pub fn env(&self) -> &[(OsString, OsString)] {
        &self.env
    }

    /// Applies the rest in the child, before its exec: only system
    /// calls, no allocation (see the module doc).
    pub fn apply_in_child(&self) -> std::io::Result<()> {
        // First, while still the daemon's user: the limits' cgroups.
        for entry in &self.limits.entries {
            crate::process::cgroup::enter(entry)?;
        }
        // SAFETY: each call below is a plain system call on values prepared
        // before the child started; none allocates or takes a lock.
        unsafe {
            libc::umask(0o077);
            set_limit(Resource::RLIMIT_CORE, 0)?;
            // Only 0, 1 and 2 survive exec: every other descriptor is marked
            // close-on-exec (closing them now would also close the pipe
            // through which a failed exec is reported).
            let marked = libc::syscall(
                libc::SYS_close_range,
                3u32,
                u32::MAX,
                libc::CLOSE_RANGE_CLOEXEC,
            );
            if marked != 0 {
                for fd in 3..self.nofile.min(65_536) as libc::c_int {
                    let flags = libc::fcntl(fd, libc::F_GETFD);
                    if flags >= 0 {
                        libc::fcntl(fd, libc::F_SETFD, flags | libc::FD_CLOEXEC);
                    }
                }
            }
            // Raw system calls: glibc's wrappers change the credentials of
            // every thread they find in the memory they run in, and a child
            // that does not change its user shares the daemon's
            // (child/exec.rs); one that does gets a copy, but keep the
            // calls that are safe in both.
            // Its own view of the filesystem, while it may still mount.
            if let Some(view) = &self.view {
                view.apply_in_child()?;
                if view.in_user_namespace() {
                    // Every capability of the user namespace it made: none
                    // may stay for what it runs.
                    identity::drop_bounding_set(self.cap_last)?;
                    identity::drop_capabilities()?;
                }
            }
            if let Some((uid, gid)) = self.identity.ids() {
                // The bounding set first, while CAP_SETPCAP is still held;
                // the change of user empties the effective and permitted
                // sets, not the inheritable one: emptied after.
                if let Some(last) = self.last_capability {
                    identity::drop_bounding_set(last)?;
                }
                if libc::syscall(libc::SYS_setgroups, 0, std::ptr::null::<libc::gid_t>()) != 0
                    || libc::syscall(libc::SYS_setgid, gid) != 0
                    || libc::syscall(libc::SYS_setuid, uid) != 0
                {
                    return Err(std::io::Error::last_os_error());
                }
                identity::drop_capabilities()?;
            }
            if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
        }
        // After these, little is allowed any more.
        self.landlock.apply_in_child()?;
        self.seccomp.apply_in_child()?;
        // Last, as Landlock needs descriptors while the daemon's (to be
        // closed at exec) may still fill the low numbers. Never above the
        // hard limit it was given: raising one needs a capability the
        // daemon may lack.
        let (_, hard) = nix::sys::resource::getrlimit(Resource::RLIMIT_NOFILE)?;
        set_limit(Resource::RLIMIT_NOFILE, self.nofile.min(hard))
    }

    /// What outlives the spawn: the limits (their cgroups go with the
    /// child) and the summary; the rest (Landlock's descriptors) is let go.
    pub fn into_kept(self) -> KeptSandbox {
        let summary = self.summary();
        KeptSandbox {
            summary,
            reach: Some(self.reach),
            _limits: self.limits,
            // A private view's /tmp goes with its mount namespace.
            tmp_dir: self.view.is_none().then_some(self.tmp_dir),
        }
    }

    /// What confines the child, in words (for logs and status).
    pub fn summary(&self) -> Vec<String> {
        let mut what = vec![
            self.identity.words(),
            self.network.clone(),
            match &self.view {
                Some(view) => view.words.clone(),
                None => format!(
                    "filesystem view: not private ({})",
                    mounts::availability().err().unwrap_or("")
                ),
            },
            format!("Landlock ABI {}", self.landlock.abi()),
            format!("seccomp ({} calls refused)", self.seccomp.refused().len()),
        ];
        what.extend(self.limits.how.iter().cloned());
        what
    }
}

/// What a running child keeps of its sandbox.
#[derive(Debug)]
pub struct KeptSandbox {
    /// What confines it, in words.
    pub summary: Vec<String>,
    /// What it may read and write, to explain a refusal.
    pub reach: Option<std::sync::Arc<reach::Reach>>,
    /// Its limit cgroups, removed when it is dropped with the child.
    _limits: limits::Limited,
    /// Its private tmp, removed when it is dropped with the child.
    tmp_dir: Option<PathBuf>,
}

impl Drop for KeptSandbox {
    fn drop(&mut self) {
        let Some(dir) = self.tmp_dir.take() else {
            return;
        };
        let remove = move || {
            let _ = std::fs::remove_dir_all(dir);
        };
        // Off the runtime thread: a tmp may hold many files.
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => drop(runtime.spawn_blocking(remove)),
            Err(_) => remove(),
        }
    }
}

impl KeptSandbox {
    /// Only the words (when the plan could not be taken back).
    pub fn summary_only(summary: Vec<String>) -> KeptSandbox {
        KeptSandbox {
            summary,
            reach: None,
            _limits: limits::Limited::default(),
            tmp_dir: None,
        }
    }
}

/// Sets both limits of `resource` to `value` (a plain system call: safe
/// in the child before its exec).
fn set_limit(resource: Resource, value: libc::rlim_t) -> std::io::Result<()> {
    nix::sys::resource::setrlimit(resource, value, value).map_err(std::io::Error::from)
}

/// Makes the daemon's `/proc` entries (environment, memory, descriptors)
/// unreadable to processes of the same user that lack `CAP_SYS_PTRACE`.
pub fn make_daemon_undumpable() {
    // SAFETY: a plain prctl on the calling process.
    if unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) } != 0 {
        tracing::warn!(
            "cannot make the daemon non-dumpable: {}",
            std::io::Error::last_os_error()
        );
    }
}
