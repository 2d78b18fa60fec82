//! Landlock confinement of one toolbox child: what it may read, write and
//! execute, whether it may use TCP, and that its signals and abstract unix
//! sockets stay inside its own domain.
//!
//! The policy is made ready in the daemon ([`prepare`]), where allocating
//! and opening files is fine: each path opened, each rule checked by the
//! kernel once. Before its exec the child ([`Prepared::apply_in_child`])
//! makes its own ruleset from those fds with raw system calls only, adds its
//! own `/proc/<pid>` (which only it can name) and enforces it.
//!
//! Rules are best effort across Landlock versions for what the kernel does
//! not know (an access right the kernel cannot handle is not handled), but
//! never for what the policy asks for: a kernel without Landlock, or a TCP
//! restriction ([`Tcp`]) on a kernel without network rules, is an error,
//! and the caller does not start the child.
//!
//! What Landlock (up to ABI 7) does not cover, so the policy cannot either:
//! UDP and other non-TCP sockets, connecting to a pathname unix socket that
//! exists, and the *contents* of the read set (rules only add access, so a
//! file under a granted directory cannot be held back: secrets under `/etc`
//! are protected by their file permissions, not by this module).

use std::ffi::CStr;
use std::fmt;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

mod system_paths;
#[cfg(test)]
mod tests;

#[cfg(test)]
use system_paths::resolver_dir;
pub use system_paths::{system_read_paths, system_read_write_paths};

/// The newest Landlock ABI whose rights these rules know and were tested
/// on. A newer kernel is used at this level: what it adds (ABI 9 connecting
/// to pathname unix sockets, ABI 10 UDP) changes what a toolbox may do and
/// is left unhandled until vetted here.
const NEWEST_KNOWN_ABI: u32 = 7;

/// The first ABI with TCP bind/connect rules (Linux 6.7).
const ABI_NETWORK: u32 = 4;

/// The first ABI with scoping of signals and abstract unix sockets (Linux 6.12).
const ABI_SCOPING: u32 = 6;

/// The kernel's access-right bits (`include/uapi/linux/landlock.h`).
mod uapi {
    pub const FS_EXECUTE: u64 = 1 << 0;
    pub const FS_WRITE_FILE: u64 = 1 << 1;
    pub const FS_READ_FILE: u64 = 1 << 2;
    pub const FS_READ_DIR: u64 = 1 << 3;
    pub const FS_MAKE_CHAR: u64 = 1 << 6;
    pub const FS_MAKE_BLOCK: u64 = 1 << 11;
    /// Every right of ABI 1 (bits 0 to 12).
    pub const FS_ABI1: u64 = (1 << 13) - 1;
    /// ABI 2.
    pub const FS_REFER: u64 = 1 << 13;
    /// ABI 3.
    pub const FS_TRUNCATE: u64 = 1 << 14;
    /// ABI 5.
    pub const FS_IOCTL_DEV: u64 = 1 << 15;
    /// The rights that apply to a file that is not a directory.
    pub const FS_FILE: u64 = FS_EXECUTE | FS_WRITE_FILE | FS_READ_FILE | FS_TRUNCATE | FS_IOCTL_DEV;
    /// ABI 4.
    pub const NET_BIND_TCP: u64 = 1 << 0;
    /// ABI 4.
    pub const NET_CONNECT_TCP: u64 = 1 << 1;
    /// ABI 6.
    pub const SCOPE_ABSTRACT_UNIX_SOCKET: u64 = 1 << 0;
    /// ABI 6.
    pub const SCOPE_SIGNAL: u64 = 1 << 1;
    /// `landlock_create_ruleset` flag: return the ABI version.
    pub const CREATE_RULESET_VERSION: u32 = 1 << 0;
    /// `landlock_add_rule` type of a [`super::PathBeneathAttr`].
    pub const RULE_PATH_BENEATH: libc::c_int = 1;
    /// `landlock_add_rule` type of a [`super::NetPortAttr`] (ABI 4).
    pub const RULE_NET_PORT: libc::c_int = 2;
}

/// `struct landlock_ruleset_attr`: what a ruleset handles, that is denies
/// unless a rule allows. Kernels before ABI 6 (4) take a shorter struct
/// and accept this one as long as the fields they lack are zero.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct RulesetAttr {
    /// Handled filesystem rights.
    handled_access_fs: u64,
    /// Handled network rights (ABI 4).
    handled_access_net: u64,
    /// Handled scopes (ABI 6).
    scoped: u64,
}

/// `struct landlock_path_beneath_attr` (packed, as the kernel declares it).
#[repr(C, packed)]
struct PathBeneathAttr {
    /// The rights granted beneath `parent_fd`.
    allowed_access: u64,
    /// An fd (O_PATH is enough) of the file or directory the rule is on.
    parent_fd: i32,
}

/// `struct landlock_net_port_attr`.
#[repr(C)]
struct NetPortAttr {
    /// The rights granted on `port`.
    allowed_access: u64,
    /// The TCP port, in host order.
    port: u64,
}

/// What a child may do with TCP.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Tcp {
    /// Anything (`network = "full"`): TCP is not handled.
    #[default]
    Open,
    /// Connect to these ports only (any address), never bind
    /// (`network = "internet"`): the web's ports, not the bus's.
    ConnectTo(Vec<u16>),
    /// Neither bind nor connect (`network = "none"`).
    Closed,
}

/// What a child may touch on the filesystem and network.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FsPolicy {
    /// Read and execute only, for what the child runs from and reads: the
    /// system directories ([`system_read_paths`]), the toolbox's own
    /// directory, the manifest's extra read-only paths. (The child's own
    /// `/proc/<pid>` is always readable: it is granted in the child.)
    pub read: Vec<PathBuf>,
    /// Read, write, create and remove beneath, for what the child keeps: its
    /// state directory, its private tmp, the manifest's extra read-write
    /// paths, and the devices of [`system_read_write_paths`].
    pub read_write: Vec<PathBuf>,
    /// What TCP it may use (a restriction needs Landlock ABI 4; UDP is not
    /// covered by Landlock up to ABI 7).
    pub tcp: Tcp,
}

impl FsPolicy {
    /// The standard profile: the system read set and devices, plus `read`
    /// and `read_write`.
    pub fn standard(read: Vec<PathBuf>, read_write: Vec<PathBuf>, tcp: Tcp) -> Self {
        let mut policy = FsPolicy {
            read: system_read_paths(),
            read_write: system_read_write_paths(),
            tcp,
        };
        policy.read.extend(read);
        policy.read_write.extend(read_write);
        policy
    }
}

/// Whether Landlock can be used on this machine, and which version.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Support {
    /// The kernel enforces Landlock rulesets.
    Available {
        /// The kernel's Landlock ABI version: which rights it can handle.
        abi: u32,
    },
    /// The kernel cannot enforce Landlock rulesets.
    Unavailable(Unavailable),
}

impl Support {
    /// The kernel's Landlock ABI version, if it has Landlock.
    pub fn abi(&self) -> Option<u32> {
        match self {
            Support::Available { abi } => Some(*abi),
            Support::Unavailable(_) => None,
        }
    }

    /// Whether TCP bind/connect can be denied (ABI 4).
    pub fn network(&self) -> bool {
        self.abi().is_some_and(|abi| abi >= ABI_NETWORK)
    }

    /// Whether signals and abstract unix sockets can be kept inside a
    /// domain (ABI 6).
    pub fn scoping(&self) -> bool {
        self.abi().is_some_and(|abi| abi >= ABI_SCOPING)
    }
}

impl fmt::Display for Support {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let abi = match self {
            Support::Unavailable(why) => return write!(f, "unsupported: {why}"),
            Support::Available { abi } => *abi,
        };
        write!(f, "Landlock ABI {abi}")?;
        if abi > NEWEST_KNOWN_ABI {
            write!(f, " (rules of ABI {NEWEST_KNOWN_ABI} used)")?;
        }
        f.write_str(": filesystem")?;
        if self.network() {
            f.write_str(", network")?;
        }
        if self.scoping() {
            f.write_str(", scoping")?;
        }
        if !self.network() {
            f.write_str(" (no network rules: ABI < 4, Linux 6.7)")?;
        } else if !self.scoping() {
            f.write_str(" (no scoping: ABI < 6, Linux 6.12)")?;
        }
        Ok(())
    }
}

/// Why Landlock cannot be used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unavailable {
    /// The kernel has no Landlock (older than 5.13, or built without it).
    NotInKernel,
    /// The kernel has Landlock but it was not enabled at boot.
    NotEnabled,
    /// The version query failed otherwise (a seccomp filter, for one).
    Error(
        /// The errno of the failed query.
        i32,
    ),
}

impl fmt::Display for Unavailable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Unavailable::NotInKernel => f.write_str("kernel without Landlock"),
            Unavailable::NotEnabled => f.write_str(
                "Landlock is in the kernel but not enabled at boot (add landlock to the lsm= kernel parameter)",
            ),
            Unavailable::Error(errno) => write!(
                f,
                "the Landlock version query failed: {}",
                io::Error::from_raw_os_error(*errno)
            ),
        }
    }
}

/// Why a policy could not be turned into a ruleset.
#[derive(Debug, thiserror::Error)]
pub enum LandlockError {
    /// The kernel cannot confine anything.
    #[error(
        "cannot confine the child: {reason}; it is not started unconfined. \
         Use a kernel with Landlock (Linux 5.13 or later, enabled at boot) \
         or give this toolbox a profile without confinement"
    )]
    Unsupported {
        /// What the kernel lacks.
        reason: Unavailable,
    },
    /// The policy denies TCP but the kernel has no network rules.
    #[error(
        "cannot deny the child the network: Landlock ABI {abi} has no network rules \
         (ABI 4, Linux 6.7, needed); it is not started with the network open. \
         Allow the network for this toolbox or use a newer kernel"
    )]
    NetworkUnsupported {
        /// The kernel's Landlock ABI version.
        abi: u32,
    },
    /// A path of the policy could not be opened to grant access to it.
    #[error("cannot grant access to {}: {source}; create it or take it out of the policy", path.display())]
    Path {
        /// The path as the policy names it.
        path: PathBuf,
        /// Why it could not be opened or examined.
        source: io::Error,
    },
    /// The kernel refused the ruleset or a rule of it.
    #[error("the kernel refused the Landlock {what}: {source}")]
    Kernel {
        /// What was refused: "ruleset", or the rule on which path.
        what: String,
        /// The kernel's answer.
        source: io::Error,
    },
}

impl LandlockError {
    /// Whether the kernel lacks what the policy needs (rather than the
    /// policy or a path being wrong).
    pub fn is_unsupported(&self) -> bool {
        matches!(
            self,
            LandlockError::Unsupported { .. } | LandlockError::NetworkUnsupported { .. }
        )
    }
}

/// One rule of a [`Prepared`] ruleset.
#[derive(Debug)]
struct PathRule {
    /// The file or directory, opened O_PATH and close-on-exec in the daemon
    /// (the child must not open what the policy names: that allocates).
    fd: OwnedFd,
    /// The rights granted beneath it, within the handled ones.
    access: u64,
}

/// A policy made ready in the daemon for children to enforce: its paths
/// opened, its rights fitted to this kernel. One may confine any number of
/// children, each with a ruleset of its own.
#[derive(Debug)]
pub struct Prepared {
    /// What the ruleset handles on this kernel.
    attr: RulesetAttr,
    /// The policy's rules.
    rules: Vec<PathRule>,
    /// The TCP ports the child may connect to (with TCP handled).
    ports: Vec<u16>,
    /// Paths the child may write, opened in the child: what only exists
    /// there (its private tmpfs mounts, `mounts.rs`).
    writable_in_child: Vec<std::ffi::CString>,
    /// The rights the child has over its own `/proc/<pid>`, granted in the
    /// child because only there does `/proc/self` name it: Landlock's
    /// ptrace restriction does not cover every file there (environ, maps
    /// and auxv of others stay readable to a confined process), so `/proc`
    /// as a whole is not granted.
    own_proc: u64,
    /// The kernel's Landlock ABI version when it was built, for reports.
    abi: u32,
}

impl Prepared {
    /// The kernel's Landlock ABI version this ruleset was built for.
    pub fn abi(&self) -> u32 {
        self.abi
    }

    /// Grants writing beneath `paths` as the child finds them, for what is
    /// made in the child before this ruleset (a mount over a path hides the
    /// directory a rule made here would be on).
    pub fn grant_writable_in_child(&mut self, paths: Vec<std::ffi::CString>) {
        self.writable_in_child = paths;
    }

    /// Confines the calling process: builds its ruleset from the fds opened
    /// in the daemon plus its own `/proc/<pid>`, sets no_new_privs (so no
    /// setuid program regains what the ruleset takes) and enforces it.
    ///
    /// Made for a child before its exec (`child/exec.rs`): only system
    /// calls (create, add rule, open, close, prctl, restrict) over memory
    /// allocated before the child started, and errno; no allocation, no
    /// lock. It confines the calling thread only, which in a new child is
    /// the whole process.
    pub fn apply_in_child(&self) -> io::Result<()> {
        let ruleset = create_ruleset(&self.attr)?;
        let result = self.fill(ruleset).and_then(|()| {
            no_new_privs()?;
            restrict_self(ruleset)
        });
        close(ruleset);
        result
    }

    /// Adds the rules to `ruleset`, the child's own `/proc/<pid>` last.
    fn fill(&self, ruleset: RawFd) -> io::Result<()> {
        for rule in &self.rules {
            add_path_rule(ruleset, rule.fd.as_raw_fd(), rule.access)?;
        }
        for &port in &self.ports {
            add_port_rule(ruleset, port)?;
        }
        for path in &self.writable_in_child {
            let fd = open_path(path)?;
            let added = add_path_rule(ruleset, fd, READ_WRITE & self.attr.handled_access_fs);
            close(fd);
            added?;
        }
        if self.own_proc != 0 {
            let own = open_path(c"/proc/self")?;
            let added = add_path_rule(ruleset, own, self.own_proc);
            close(own);
            added?;
        }
        Ok(())
    }
}

/// `landlock_create_ruleset(attr)`: the new ruleset's fd (close-on-exec).
fn create_ruleset(attr: &RulesetAttr) -> io::Result<RawFd> {
    // SAFETY: attr points to a live RulesetAttr of the given size, which the
    // kernel only reads.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            attr as *const RulesetAttr,
            std::mem::size_of::<RulesetAttr>(),
            0 as libc::c_uint,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(fd as RawFd)
}

/// `landlock_add_rule(ruleset, PATH_BENEATH, {access, fd})`.
fn add_path_rule(ruleset: RawFd, fd: RawFd, access: u64) -> io::Result<()> {
    let attr = PathBeneathAttr {
        allowed_access: access,
        parent_fd: fd,
    };
    // SAFETY: attr is a live PathBeneathAttr on the stack, which the kernel
    // only reads; the fds are only used by the kernel.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_landlock_add_rule,
            ruleset,
            uapi::RULE_PATH_BENEATH,
            &attr as *const PathBeneathAttr,
            0 as libc::c_uint,
        )
    };
    if ret != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// `landlock_add_rule(ruleset, NET_PORT, {connect, port})`.
fn add_port_rule(ruleset: RawFd, port: u16) -> io::Result<()> {
    let attr = NetPortAttr {
        allowed_access: uapi::NET_CONNECT_TCP,
        port: u64::from(port),
    };
    // SAFETY: attr is a live NetPortAttr on the stack, which the kernel
    // only reads.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_landlock_add_rule,
            ruleset,
            uapi::RULE_NET_PORT,
            &attr as *const NetPortAttr,
            0 as libc::c_uint,
        )
    };
    if ret != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// `prctl(PR_SET_NO_NEW_PRIVS, 1)`: required to restrict without
/// CAP_SYS_ADMIN, and wanted with it: no setuid program regains rights.
fn no_new_privs() -> io::Result<()> {
    // SAFETY: prctl with integer arguments only; arguments 3 to 5 must be
    // zero for PR_SET_NO_NEW_PRIVS and are passed as full-width zeros.
    let ret = unsafe {
        libc::prctl(
            libc::PR_SET_NO_NEW_PRIVS,
            1 as libc::c_ulong,
            0 as libc::c_ulong,
            0 as libc::c_ulong,
            0 as libc::c_ulong,
        )
    };
    if ret != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// `landlock_restrict_self(ruleset)`: the calling thread is confined.
fn restrict_self(ruleset: RawFd) -> io::Result<()> {
    // SAFETY: takes an fd and flags (none); touches no user memory.
    let ret =
        unsafe { libc::syscall(libc::SYS_landlock_restrict_self, ruleset, 0 as libc::c_uint) };
    if ret != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// `open(path, O_PATH | O_CLOEXEC)`, the kind of fd a rule is made of.
fn open_path(path: &CStr) -> io::Result<RawFd> {
    // SAFETY: path is NUL-terminated and outlives the call; these flags
    // need no mode argument.
    let fd = unsafe { libc::open(path.as_ptr(), libc::O_PATH | libc::O_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(fd)
}

/// Closes an fd this module opened and owns; an error is of no use here.
fn close(fd: RawFd) {
    // SAFETY: fd was opened by this module and is closed once.
    unsafe {
        libc::close(fd);
    }
}

/// Whether and which Landlock this kernel has. Asked once, then cached.
pub fn support() -> Support {
    static SUPPORT: OnceLock<Support> = OnceLock::new();
    *SUPPORT.get_or_init(query_support)
}

/// Asks the kernel for its Landlock ABI version.
fn query_support() -> Support {
    // SAFETY: with a null attribute pointer, a size of 0 and the VERSION
    // flag, landlock_create_ruleset reads no memory and returns a number.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<RulesetAttr>(),
            0 as libc::size_t,
            uapi::CREATE_RULESET_VERSION,
        )
    };
    if ret > 0 {
        return Support::Available { abi: ret as u32 };
    }
    match io::Error::last_os_error().raw_os_error() {
        Some(libc::ENOSYS) => Support::Unavailable(Unavailable::NotInKernel),
        Some(libc::EOPNOTSUPP) => Support::Unavailable(Unavailable::NotEnabled),
        Some(errno) => Support::Unavailable(Unavailable::Error(errno)),
        None => Support::Unavailable(Unavailable::Error(0)),
    }
}

/// What the policy needs from the kernel: the ABI version if it has it.
fn check_support(support: Support, policy: &FsPolicy) -> Result<u32, LandlockError> {
    let abi = match support {
        Support::Available { abi } => abi,
        Support::Unavailable(reason) => return Err(LandlockError::Unsupported { reason }),
    };
    if policy.tcp != Tcp::Open && !support.network() {
        return Err(LandlockError::NetworkUnsupported { abi });
    }
    Ok(abi)
}

/// Every filesystem right that ABI `abi` knows (best effort: what an older
/// kernel lacks is not handled, so not denied either).
fn handled_fs(abi: u32) -> u64 {
    let mut rights = uapi::FS_ABI1;
    if abi >= 2 {
        rights |= uapi::FS_REFER;
    }
    if abi >= 3 {
        rights |= uapi::FS_TRUNCATE;
    }
    if abi >= 5 {
        rights |= uapi::FS_IOCTL_DEV;
    }
    rights
}

/// What a ruleset for `policy` handles on ABI `abi`: every filesystem
/// right, TCP when the policy denies it (ABI 4 checked before), and both
/// scopes where the kernel has them.
fn ruleset_attr(abi: u32, policy: &FsPolicy) -> RulesetAttr {
    RulesetAttr {
        handled_access_fs: handled_fs(abi),
        handled_access_net: match policy.tcp {
            Tcp::Open => 0,
            Tcp::ConnectTo(_) | Tcp::Closed => uapi::NET_BIND_TCP | uapi::NET_CONNECT_TCP,
        },
        scoped: if abi >= ABI_SCOPING {
            uapi::SCOPE_ABSTRACT_UNIX_SOCKET | uapi::SCOPE_SIGNAL
        } else {
            0
        },
    }
}

/// The rights of a read path: read files, list directories, execute.
const READ: u64 = uapi::FS_EXECUTE | uapi::FS_READ_FILE | uapi::FS_READ_DIR;

/// The rights of a read-write path: everything but creating device nodes
/// (a root child could make one for a disk and read it raw beneath its own
/// directory) and device ioctls (there are no devices to drive there).
const READ_WRITE: u64 = !(uapi::FS_MAKE_CHAR | uapi::FS_MAKE_BLOCK | uapi::FS_IOCTL_DEV);

/// The rights over the child's own `/proc/<pid>`: read and list.
const OWN_PROC: u64 = uapi::FS_READ_FILE | uapi::FS_READ_DIR;

/// Makes `policy` ready for children to enforce: checks that the kernel
/// can, opens each path, and has the kernel check every rule once (a
/// throwaway ruleset), so a child never fails on what could be known here.
/// Fails when the kernel lacks Landlock or what the policy needs (the child
/// must then not be started), or when a path cannot be opened.
pub fn prepare(policy: &FsPolicy) -> Result<Prepared, LandlockError> {
    let abi = check_support(support(), policy)?;
    let attr = ruleset_attr(abi, policy);
    let handled = attr.handled_access_fs;
    let mut rules = Vec::with_capacity(policy.read.len() + policy.read_write.len());
    for (paths, access) in [(&policy.read, READ), (&policy.read_write, READ_WRITE)] {
        for path in paths {
            rules.push(path_rule(path, access & handled)?);
        }
    }
    let ports = match &policy.tcp {
        Tcp::ConnectTo(ports) => ports.clone(),
        Tcp::Open | Tcp::Closed => Vec::new(),
    };
    let prepared = Prepared {
        attr,
        rules,
        ports,
        writable_in_child: Vec::new(),
        own_proc: OWN_PROC & handled,
        abi,
    };
    prepared.check(policy)?;
    Ok(prepared)
}

impl Prepared {
    /// Builds the ruleset once in the daemon (with the daemon's own
    /// `/proc/<pid>`) and drops it: the kernel's verdict on each rule, with
    /// the path it is about.
    fn check(&self, policy: &FsPolicy) -> Result<(), LandlockError> {
        let kernel = |what: String| move |source| LandlockError::Kernel { what, source };
        let ruleset = create_ruleset(&self.attr).map_err(kernel("ruleset".into()))?;
        // SAFETY: create_ruleset returned a new fd that nothing else owns.
        let ruleset = unsafe { OwnedFd::from_raw_fd(ruleset) };
        let paths = policy.read.iter().chain(&policy.read_write);
        for (rule, path) in self.rules.iter().zip(paths) {
            add_path_rule(ruleset.as_raw_fd(), rule.fd.as_raw_fd(), rule.access)
                .map_err(kernel(format!("rule on {}", path.display())))?;
        }
        for &port in &self.ports {
            add_port_rule(ruleset.as_raw_fd(), port)
                .map_err(kernel(format!("rule on TCP port {port}")))?;
        }
        let own = open_path(c"/proc/self").map_err(|source| LandlockError::Path {
            path: PathBuf::from("/proc/self"),
            source,
        })?;
        // SAFETY: open_path returned a new fd that nothing else owns.
        let own = unsafe { OwnedFd::from_raw_fd(own) };
        add_path_rule(ruleset.as_raw_fd(), own.as_raw_fd(), self.own_proc)
            .map_err(kernel("rule on /proc/self".into()))
    }
}

/// A rule granting `access` beneath `path`; only the file rights of
/// `access` when `path` is not a directory (the kernel refuses directory
/// rights on a file).
fn path_rule(path: &Path, access: u64) -> Result<PathRule, LandlockError> {
    let failed = |source| LandlockError::Path {
        path: path.to_path_buf(),
        source,
    };
    let c_path = std::ffi::CString::new(path.as_os_str().as_encoded_bytes())
        .map_err(|e| failed(io::Error::new(io::ErrorKind::InvalidInput, e)))?;
    let fd = open_path(&c_path).map_err(failed)?;
    // SAFETY: open_path returned a new fd that nothing else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let stat = nix::sys::stat::fstat(&fd).map_err(|e| failed(e.into()))?;
    let is_dir = stat.st_mode & libc::S_IFMT == libc::S_IFDIR;
    let access = if is_dir {
        access
    } else {
        access & uapi::FS_FILE
    };
    Ok(PathRule { fd, access })
}
