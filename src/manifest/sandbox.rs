//! The `[sandbox]` table: how a toolbox's child is confined (docs/manifest.md,
//! docs/security.md). Without the table a toolbox gets the standard profile.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;

/// Which confinement a toolbox gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Profile {
    /// Everything the machine allows (docs/security.md).
    #[default]
    Standard,
    /// None: the child inherits the daemon's environment, descriptors and
    /// rights (logged as a warning at every start).
    Off,
}

/// What the child's sockets may reach (docs/security.md, "Network").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Network {
    /// Anything the machine's network allows, the bus and every local
    /// service included.
    Full,
    /// TCP connections to the `ports` only (80 and 443 by default), on any
    /// address; no listening. The web's APIs, not the bus nor the local
    /// services on other ports. The default: what a toolbox that calls a
    /// web API needs, and no more.
    #[default]
    Internet,
    /// Nothing: no IP socket reaches anything, loopback (and so the bus) included.
    None,
}

impl Network {
    /// The manifest's word for it.
    pub fn as_str(self) -> &'static str {
        match self {
            Network::Full => "full",
            Network::Internet => "internet",
            Network::None => "none",
        }
    }
}

/// A kind of socket the standard profile refuses unless the manifest names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SocketKind {
    /// `AF_NETLINK`: the kernel's address, route and event tables.
    Netlink,
    /// `AF_PACKET`: every frame on an interface.
    Packet,
    /// `SOCK_RAW` of `AF_INET` and `AF_INET6`: forged packets, raw ICMP.
    Raw,
}

/// The TCP ports `network = "internet"` may connect to by default.
pub const DEFAULT_PORTS: [u16; 2] = [80, 443];

/// The daemon variables a child sees by default.
pub const DEFAULT_ENV_PASS: [&str; 4] = ["PATH", "LANG", "LC_ALL", "TZ"];

/// Variables that are never passed to a child, whatever `env_pass` says:
/// they would let it talk to systemd as the daemon, or find its credentials.
pub const NEVER_PASSED: [&str; 7] = [
    "NOTIFY_SOCKET",
    "WATCHDOG_USEC",
    "WATCHDOG_PID",
    "LISTEN_FDS",
    "LISTEN_PID",
    "LISTEN_FDNAMES",
    "CREDENTIALS_DIRECTORY",
];

/// A validated `[sandbox]` table.
#[derive(Debug, Clone, PartialEq)]
pub struct Sandbox {
    /// Standard confinement, or none.
    pub profile: Profile,
    /// Run the child as this user (the daemon must be root).
    pub user: Option<String>,
    /// Run the child with this group (the daemon must be root).
    pub group: Option<String>,
    /// The daemon variables the child sees.
    pub env_pass: Vec<String>,
    /// Variable name → file holding its value (absolute, or a name in
    /// `$CREDENTIALS_DIRECTORY`), read at every spawn.
    pub secrets: BTreeMap<String, String>,
    /// What its sockets may reach.
    pub network: Network,
    /// Whether `network` was written in the manifest: a written level that
    /// cannot be enforced fails the start; the default one, `internet`, is
    /// left open on a kernel without Landlock network rules, and reported.
    pub network_declared: bool,
    /// The TCP ports `network = "internet"` may connect to.
    pub ports: Vec<u16>,
    /// The socket kinds refused by default that it may open.
    pub sockets: Vec<SocketKind>,
    /// Extra paths it may read.
    pub read_only: Vec<PathBuf>,
    /// Extra paths it may write.
    pub read_write: Vec<PathBuf>,
    /// Memory limit of its whole tree, MiB (0: none).
    pub memory_max_mib: u64,
    /// Processes and threads of its whole tree (0: none).
    pub tasks_max: u64,
    /// Its descriptor limit (`RLIMIT_NOFILE`).
    pub nofile: u64,
    /// What its state directory may hold on disk, MiB (0: no bound):
    /// checked at every start and at every liveness probe.
    pub state_max_mib: u64,
    /// Whether `memory_max_mib` and `tasks_max` were written in the
    /// manifest: a written limit that cannot be enforced fails the start; a
    /// default one is applied where the machine allows, and reported.
    pub limits_declared: bool,
}

impl Default for Sandbox {
    fn default() -> Self {
        Sandbox {
            profile: Profile::Standard,
            user: None,
            group: None,
            env_pass: DEFAULT_ENV_PASS.map(str::to_owned).to_vec(),
            secrets: BTreeMap::new(),
            network: Network::default(),
            network_declared: false,
            ports: DEFAULT_PORTS.to_vec(),
            sockets: Vec::new(),
            read_only: Vec::new(),
            read_write: Vec::new(),
            memory_max_mib: 512,
            tasks_max: 64,
            nofile: 1024,
            state_max_mib: 1024,
            limits_declared: false,
        }
    }
}

/// The table as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawSandbox {
    #[serde(default)]
    profile: Profile,
    user: Option<String>,
    group: Option<String>,
    env_pass: Option<Vec<String>>,
    #[serde(default)]
    secrets: BTreeMap<String, String>,
    network: Option<Network>,
    ports: Option<Vec<u16>>,
    #[serde(default)]
    sockets: Vec<SocketKind>,
    #[serde(default)]
    read_only: Vec<PathBuf>,
    #[serde(default)]
    read_write: Vec<PathBuf>,
    memory_max_mib: Option<u64>,
    tasks_max: Option<u64>,
    nofile: Option<u64>,
    state_max_mib: Option<u64>,
}

/// The `[sandbox]` knobs and their ranges (docs/manifest.md).
pub const SANDBOX_RANGES: [(&str, u64, u64); 4] = [
    ("memory_max_mib", 0, 1_048_576),
    ("tasks_max", 0, 100_000),
    ("nofile", 16, 1_048_576),
    ("state_max_mib", 0, 1_048_576),
];

/// Most TCP ports `network = "internet"` may name.
const MAX_PORTS: usize = 64;

/// Whether `name` can be an environment variable's name.
fn valid_var(name: &str) -> bool {
    !name.is_empty()
        && !name.starts_with(|c: char| c.is_ascii_digit())
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

impl RawSandbox {
    /// Validates the table; `dir` is the manifest's directory (relative paths
    /// resolve against it), `concurrent_calls` the toolbox's
    /// `max_concurrent_calls` (the default `tasks_max` leaves room for a
    /// thread or two per call). The error names the key at fault.
    pub(super) fn validate(
        self,
        dir: &Path,
        concurrent_calls: usize,
    ) -> Result<Sandbox, (&'static str, String)> {
        let defaults = Sandbox::default();
        let env_pass = self.env_pass.unwrap_or(defaults.env_pass);
        for name in &env_pass {
            if !valid_var(name) {
                return Err(("env_pass", format!("{name:?} is not a variable name")));
            }
            if NEVER_PASSED.contains(&name.as_str()) {
                return Err((
                    "env_pass",
                    format!(
                        "{name} is never passed to a toolbox (it belongs to the daemon's \
                         service manager); remove it"
                    ),
                ));
            }
        }
        for (name, source) in &self.secrets {
            if !valid_var(name) {
                return Err(("secrets", format!("{name:?} is not a variable name")));
            }
            if source.is_empty() {
                return Err((
                    "secrets",
                    format!("{name} names no file; give a path or a credential name"),
                ));
            }
        }
        let values = [
            ("memory_max_mib", self.memory_max_mib),
            ("tasks_max", self.tasks_max),
            ("nofile", self.nofile),
            ("state_max_mib", self.state_max_mib),
        ];
        for ((key, min, max), (_, value)) in SANDBOX_RANGES.iter().zip(values) {
            if let Some(v) = value {
                if v < *min || v > *max {
                    return Err((key, format!("{key} = {v} must be between {min} and {max}")));
                }
            }
        }
        let network = self.network.unwrap_or_default();
        if let Some(ports) = &self.ports {
            if network != Network::Internet {
                return Err((
                    "ports",
                    format!(
                        "ports limit network = \"internet\" only; this toolbox has network = \"{}\"; \
                         remove ports, or set network = \"internet\"",
                        network.as_str()
                    ),
                ));
            }
            if ports.is_empty() || ports.contains(&0) || ports.len() > MAX_PORTS {
                return Err((
                    "ports",
                    format!(
                        "ports must name 1 to {MAX_PORTS} TCP ports from 1 to 65535 (for no network \
                         at all, write network = \"none\")"
                    ),
                ));
            }
        }
        if !self.sockets.is_empty() && network == Network::None {
            return Err((
                "sockets",
                "names sockets a toolbox with network = \"none\" cannot open (only AF_UNIX); \
                 remove sockets, or open the network"
                    .to_owned(),
            ));
        }
        if self.user.is_some() || self.group.is_some() {
            let key = if self.user.is_some() { "user" } else { "group" };
            if !nix::unistd::geteuid().is_root() {
                return Err((
                    key,
                    "runs the toolbox as another user, which only a daemon running as root \
                     can do; remove it, or run toolboxd as root"
                        .to_owned(),
                ));
            }
        }
        if let Some(user) = &self.user {
            match nix::unistd::User::from_name(user) {
                Ok(Some(_)) => {}
                Ok(None) => {
                    return Err((
                        "user",
                        format!("user {user:?} does not exist; create it or fix the name"),
                    ))
                }
                Err(e) => return Err(("user", format!("cannot look up user {user:?}: {e}"))),
            }
        }
        if let Some(group) = &self.group {
            match nix::unistd::Group::from_name(group) {
                Ok(Some(_)) => {}
                Ok(None) => {
                    return Err((
                        "group",
                        format!("group {group:?} does not exist; create it or fix the name"),
                    ))
                }
                Err(e) => return Err(("group", format!("cannot look up group {group:?}: {e}"))),
            }
        }
        let resolve = |paths: Vec<PathBuf>| -> Vec<PathBuf> {
            paths.into_iter().map(|p| dir.join(p)).collect()
        };
        Ok(Sandbox {
            profile: self.profile,
            user: self.user,
            group: self.group,
            env_pass,
            secrets: self.secrets,
            network,
            network_declared: self.network.is_some(),
            ports: {
                let mut ports = self.ports.unwrap_or_else(|| DEFAULT_PORTS.to_vec());
                ports.sort_unstable();
                ports.dedup();
                ports
            },
            sockets: {
                let mut sockets = self.sockets;
                sockets.sort_unstable();
                sockets.dedup();
                sockets
            },
            read_only: resolve(self.read_only),
            read_write: resolve(self.read_write),
            limits_declared: self.memory_max_mib.is_some() || self.tasks_max.is_some(),
            memory_max_mib: self.memory_max_mib.unwrap_or(defaults.memory_max_mib),
            tasks_max: self
                .tasks_max
                // Saturating: the manifest's other problems (a knob out of
                // range) are found in the same pass.
                .unwrap_or(
                    defaults
                        .tasks_max
                        .saturating_add(2u64.saturating_mul(concurrent_calls as u64)),
                ),
            nofile: self.nofile.unwrap_or(defaults.nofile),
            state_max_mib: self.state_max_mib.unwrap_or(defaults.state_max_mib),
        })
    }
}
