//! TOML manifests: one file per toolbox, parsed, validated and resolved.
//!
//! A manifest names an executable and how to run and supervise it (docs/manifest.md).
//! Everything an operator can get wrong is caught here, before anything is
//! spawned, with an error that names the file, the line and the fix.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use serde::Deserialize;

/// MCP protocol versions toolboxd can speak, newest first. The first is the
/// modern (stateless) era; the rest are legacy (initialize handshake).
pub const MODERN_VERSIONS: &[&str] = &["2026-07-28"];
/// Most children one toolbox may run.
pub const MAX_INSTANCES: usize = 64;
/// What a toolbox does when another host on the bus is found answering for
/// its id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum OnConflict {
    /// Report it (log, status) and keep serving: no message from the bus,
    /// forged or not, can stop a toolbox.
    #[default]
    Warn,
    /// Withdraw, but only from a claim that held over a whole peer check
    /// (two probes in a row) by a host listing tools for the id.
    Yield,
}

/// Legacy MCP protocol versions, newest first.
pub const LEGACY_VERSIONS: &[&str] = &["2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05"];

/// A validated manifest, with every path resolved.
#[derive(Debug, Clone, PartialEq)]
pub struct Manifest {
    /// The file it came from, for every message about it.
    pub path: PathBuf,
    /// The toolbox_id: unique on the bus, `[A-Za-z0-9_-]+`.
    pub id: String,
    /// The executable, resolved to a path that exists when the manifest was read.
    pub program: PathBuf,
    /// Arguments passed verbatim; no shell is involved.
    pub args: Vec<String>,
    /// Working directory of the child.
    pub cwd: PathBuf,
    /// Variables added to (or, with `env_clear`, forming) the child's environment.
    pub env: BTreeMap<String, String>,
    /// Start the child from an empty environment plus `env`.
    pub env_clear: bool,
    /// `false` keeps the toolbox stopped.
    pub enabled: bool,
    /// Children run for this toolbox; calls go to the least busy ready one.
    pub instances: usize,
    /// `None` probes the era; `Some(version)` pins an MCP protocol version.
    pub protocol: Option<String>,
    /// What to do when another host answers for this id.
    pub on_conflict: OnConflict,
    /// The audit log records this toolbox's call arguments and results.
    pub audit_arguments: bool,
    /// How the child is confined.
    pub sandbox: Sandbox,
    /// When and how fast a dead child is replaced.
    pub restart: Restart,
    /// Per-call and per-child bounds.
    pub limits: Limits,
    /// When the child runs: from the start, or on demand.
    pub start: Start,
    /// `[annotations.<tool>]`: annotations set or overridden per tool.
    pub annotations: ToolAnnotations,
    /// `confirm`, `ask_timeout_s`, `elicitation`: which calls wait for a
    /// person's yes, and whether the child may ask the person questions.
    pub asking: Asking,
}

/// Restart policy knobs (`[restart]` in docs/manifest.md).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Restart {
    /// always | on-failure | never.
    pub policy: RestartPolicy,
    /// First delay before a restart.
    pub backoff_initial_ms: u64,
    /// Ceiling of the doubling delay.
    pub backoff_max_ms: u64,
    /// More restarts than this within `window_s` mark the toolbox `failed`.
    pub max_restarts: u32,
    /// The window of the restart budget.
    pub window_s: u64,
    /// A child up this long resets the backoff.
    pub stable_after_s: u64,
    /// A failed toolbox is tried again after this cool-down.
    pub failed_retry_s: u64,
}

impl Default for Restart {
    fn default() -> Self {
        Restart {
            policy: RestartPolicy::Always,
            backoff_initial_ms: 100,
            backoff_max_ms: 30_000,
            max_restarts: 5,
            window_s: 60,
            stable_after_s: 10,
            failed_retry_s: 300,
        }
    }
}

/// Which exits are followed by a restart.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RestartPolicy {
    /// Every exit.
    Always,
    /// Only a non-zero exit or a death by signal.
    OnFailure,
    /// None: the toolbox stays down.
    Never,
}

/// Bounds on calls and child output (`[limits]` in docs/manifest.md).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Limits {
    /// Deadline of one call, in seconds.
    pub call_timeout_s: u64,
    /// Calls in flight per child; more wait in arrival order.
    pub max_concurrent_calls: usize,
    /// Calls that may wait for a slot, over all instances; one more is
    /// answered "busy" at once.
    pub max_queued_calls: usize,
    /// Largest call arguments accepted (JSON bytes); larger ones are refused
    /// before validation.
    pub max_argument_bytes: usize,
    /// Interval of the liveness probe.
    pub probe_interval_s: u64,
    /// Deadline of one liveness probe.
    pub probe_timeout_s: u64,
    /// How long an old child may finish its calls on restart or stop.
    pub drain_timeout_s: u64,
    /// Longest stdout line accepted from the child.
    pub max_message_bytes: usize,
    /// Calls in a row that run past their deadline before the child is
    /// deemed wedged, killed and restarted.
    pub max_timeouts_in_a_row: u32,
    /// Shorter deadlines for particular tools, by tool name (never longer
    /// than `call_timeout_s`).
    pub tool_timeouts: BTreeMap<String, u64>,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            call_timeout_s: 30,
            max_concurrent_calls: 8,
            max_queued_calls: 256,
            max_argument_bytes: 1024 * 1024,
            probe_interval_s: 10,
            probe_timeout_s: 5,
            drain_timeout_s: 30,
            max_message_bytes: 16 * 1024 * 1024,
            max_timeouts_in_a_row: 3,
            tool_timeouts: BTreeMap::new(),
        }
    }
}

/// The file as written, before validation.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawManifest {
    id: String,
    command: String,
    #[serde(default)]
    args: Vec<String>,
    cwd: Option<PathBuf>,
    #[serde(default)]
    env: BTreeMap<String, String>,
    #[serde(default)]
    env_clear: bool,
    #[serde(default = "default_true")]
    enabled: bool,
    #[serde(default = "default_instances")]
    instances: usize,
    #[serde(default = "default_protocol")]
    protocol: String,
    #[serde(default)]
    on_conflict: OnConflict,
    #[serde(default)]
    audit_arguments: bool,
    #[serde(default)]
    sandbox: RawSandbox,
    #[serde(default)]
    restart: Restart,
    #[serde(default)]
    limits: Limits,
    #[serde(default)]
    start: Start,
    #[serde(default)]
    annotations: ToolAnnotations,
    #[serde(default)]
    confirm: Confirm,
    #[serde(default = "default_ask_timeout_s")]
    ask_timeout_s: u64,
    #[serde(default)]
    elicitation: bool,
}

fn default_ask_timeout_s() -> u64 {
    Asking::default().ask_timeout_s
}

fn default_true() -> bool {
    true
}

fn default_instances() -> usize {
    1
}

fn default_protocol() -> String {
    "auto".to_owned()
}

/// The largest manifest read: a real one is a few hundred bytes.
pub const MAX_MANIFEST_BYTES: u64 = 1024 * 1024;

/// Reads a manifest file without ever blocking on, or reading without end
/// from, something that is not a regular file (a FIFO, a device, a directory).
fn read_manifest(path: &Path) -> Result<String, String> {
    use crate::util::files::ReadError;
    crate::util::files::read_small_regular(path, MAX_MANIFEST_BYTES).map_err(|e| match e {
        ReadError::NotRegular(what) => format!(
            "is {what}, not a manifest; a manifest must be a regular file: move it out of \
             the manifests directory or rename it"
        ),
        ReadError::TooLarge(max) => {
            format!("is larger than {max} bytes, which no manifest needs; is it the right file?")
        }
        ReadError::NotFound => "cannot read the manifest: it does not exist".to_owned(),
        ReadError::Io(e) => format!("cannot read the manifest: {e}"),
        e @ ReadError::NotOwn { .. } => format!("cannot read the manifest: {e}"),
    })
}

impl Manifest {
    /// Reads and validates one manifest file: a regular file (a symlink to
    /// one is fine) of at most [`MAX_MANIFEST_BYTES`]. Its first problem;
    /// [`Manifest::load_all`] gives every one.
    pub fn load(path: &Path) -> Result<Manifest, ManifestError> {
        Manifest::load_all(path).map_err(first)
    }

    /// [`Manifest::load`], with every problem found.
    pub fn load_all(path: &Path) -> Result<Manifest, Vec<ManifestError>> {
        let text = read_manifest(path).map_err(|message| {
            vec![ManifestError {
                path: path.to_owned(),
                line: None,
                message,
            }]
        })?;
        Manifest::parse_all(path, &text)
    }

    /// Validates manifest text that was read from `path`: its first problem.
    pub fn parse(path: &Path, text: &str) -> Result<Manifest, ManifestError> {
        Manifest::parse_all(path, text).map_err(first)
    }

    /// Validates manifest text that was read from `path`, finding every
    /// problem (at most [`MAX_PROBLEMS`]) so that one `check` names them
    /// all: each wrong value (its line left out, the rest read again), then
    /// each value out of its range or pointing nowhere.
    pub fn parse_all(path: &Path, text: &str) -> Result<Manifest, Vec<ManifestError>> {
        let err = |line: Option<usize>, message: String| ManifestError {
            path: path.to_owned(),
            line,
            message,
        };
        let (raw, mut problems) = read_raw(text);
        let Some(raw) = raw else {
            return Err(problems
                .into_iter()
                .map(|(line, message)| err(line, message))
                .collect());
        };
        let key_line = |key: &str| line_of_key(text, key);
        let mut problem = |key: &str, message: String| problems.push((key_line(key), message));

        if !valid_id(&raw.id) {
            problem(
                "id",
                format!(
                    "id {:?} is not a valid toolbox_id; use only letters, digits, '_' and '-' \
                     (never ':' or '.'), e.g. id = \"my_tools\"",
                    raw.id
                ),
            );
        }
        let dir = path
            .parent()
            .map(Path::to_owned)
            .unwrap_or_else(|| PathBuf::from("."));
        let dir = if dir.as_os_str().is_empty() {
            PathBuf::from(".")
        } else {
            dir
        };
        // Absolute, so that neither the command nor the cwd depends on the
        // daemon's own working directory once the child has changed into its own.
        let dir = std::path::absolute(&dir).unwrap_or(dir);
        let cwd = match &raw.cwd {
            Some(cwd) => dir.join(cwd),
            None => dir.clone(),
        };
        if !cwd.is_dir() {
            problem(
                "cwd",
                format!(
                    "cwd {} is not a directory; fix the path (relative paths resolve against \
                     the manifest's directory)",
                    cwd.display()
                ),
            );
        }
        let search_path = raw
            .env
            .get("PATH")
            .cloned()
            .or_else(|| (!raw.env_clear).then(|| std::env::var("PATH").unwrap_or_default()))
            .unwrap_or_default();
        let program = resolve_command(&raw.command, &dir, &search_path)
            .map_err(|message| problem("command", message))
            .ok();

        let protocol = match raw.protocol.as_str() {
            "auto" => None,
            v if MODERN_VERSIONS.contains(&v) || LEGACY_VERSIONS.contains(&v) => Some(v.to_owned()),
            v => {
                problem(
                    "protocol",
                    format!(
                        "protocol {v:?} is not an MCP version toolboxd speaks; use \"auto\" or one \
                         of {}",
                        MODERN_VERSIONS
                            .iter()
                            .chain(LEGACY_VERSIONS)
                            .map(|v| format!("\"{v}\""))
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                );
                None
            }
        };
        for (key, message) in check_knobs(&raw.restart, &raw.limits) {
            problem(key, message);
        }
        if !(1..=MAX_INSTANCES).contains(&raw.instances) {
            problem(
                "instances",
                format!(
                    "instances = {} must be between 1 and {MAX_INSTANCES}",
                    raw.instances
                ),
            );
        }
        if let Err((key, message)) = raw.start.check() {
            problem(key, message);
        }
        let sandbox = raw
            .sandbox
            .validate(&dir, raw.limits.max_concurrent_calls)
            .map_err(|(key, message)| problem(key, format!("[sandbox] {message}")))
            .ok();
        if let Err(message) = raw.annotations.check() {
            problem("title", message);
        }
        if let Err(message) = raw.confirm.check() {
            problem("confirm", message);
        }
        if !(1..=MAX_ASK_TIMEOUT_S).contains(&raw.ask_timeout_s) {
            problem(
                "ask_timeout_s",
                format!(
                    "ask_timeout_s = {} must be between 1 and {MAX_ASK_TIMEOUT_S}",
                    raw.ask_timeout_s
                ),
            );
        }
        let (Some(program), Some(sandbox), true) = (program, sandbox, problems.is_empty()) else {
            problems.truncate(MAX_PROBLEMS);
            return Err(problems
                .into_iter()
                .map(|(line, message)| err(line, message))
                .collect());
        };

        Ok(Manifest {
            path: path.to_owned(),
            id: raw.id,
            program,
            args: raw.args,
            cwd,
            env: raw.env,
            env_clear: raw.env_clear,
            enabled: raw.enabled,
            instances: raw.instances,
            protocol,
            on_conflict: raw.on_conflict,
            audit_arguments: raw.audit_arguments,
            sandbox,
            restart: raw.restart,
            limits: raw.limits,
            start: raw.start,
            annotations: raw.annotations,
            asking: Asking {
                confirm: raw.confirm,
                ask_timeout_s: raw.ask_timeout_s,
                elicitation: raw.elicitation,
            },
        })
    }
}

/// Whether `id` is a valid toolbox_id (the grammar is the protocol's).
pub use crate::protocol::ids::valid_id;

/// Every numeric knob with its allowed range (docs/manifest.md): a value past
/// it is an error at `check`, so no arithmetic on a knob can overflow later.
pub const KNOB_RANGES: [(&str, u64, u64); 15] = [
    ("call_timeout_s", 1, 86_400),
    ("max_concurrent_calls", 1, 1024),
    ("max_queued_calls", 0, 100_000),
    ("max_argument_bytes", 1024, 8 * 1024 * 1024),
    ("probe_interval_s", 1, 3_600),
    ("probe_timeout_s", 1, 600),
    ("drain_timeout_s", 0, 3_600),
    ("max_message_bytes", 1024, 256 * 1024 * 1024),
    ("max_timeouts_in_a_row", 1, 1_000),
    ("backoff_initial_ms", 1, 3_600_000),
    ("backoff_max_ms", 1, 3_600_000),
    ("max_restarts", 0, 10_000),
    ("window_s", 1, 86_400),
    ("stable_after_s", 0, 86_400),
    ("failed_retry_s", 0, 604_800),
];

/// Every numeric knob's value, in the order of [`KNOB_RANGES`].
pub fn knob_values(restart: &Restart, limits: &Limits) -> [u64; 15] {
    [
        limits.call_timeout_s,
        limits.max_concurrent_calls as u64,
        limits.max_queued_calls as u64,
        limits.max_argument_bytes as u64,
        limits.probe_interval_s,
        limits.probe_timeout_s,
        limits.drain_timeout_s,
        limits.max_message_bytes as u64,
        u64::from(limits.max_timeouts_in_a_row),
        restart.backoff_initial_ms,
        restart.backoff_max_ms,
        u64::from(restart.max_restarts),
        restart.window_s,
        restart.stable_after_s,
        restart.failed_retry_s,
    ]
}

fn check_knobs(restart: &Restart, limits: &Limits) -> Vec<(&'static str, String)> {
    let mut problems = Vec::new();
    let values = knob_values(restart, limits);
    for (&(key, min, max), value) in KNOB_RANGES.iter().zip(values) {
        if !(min..=max).contains(&value) {
            problems.push((
                key,
                format!("{key} = {value} must be between {min} and {max}"),
            ));
        }
    }
    if restart.backoff_max_ms < restart.backoff_initial_ms {
        problems.push((
            "backoff_max_ms",
            format!(
                "backoff_max_ms ({}) is below backoff_initial_ms ({}); raise it",
                restart.backoff_max_ms, restart.backoff_initial_ms
            ),
        ));
    }
    for (tool, &secs) in &limits.tool_timeouts {
        if secs == 0 || secs > limits.call_timeout_s {
            problems.push((
                "tool_timeouts",
                format!(
                    "tool_timeouts.{tool} = {secs} must be between 1 and call_timeout_s ({}); \
                     a tool may shorten the deadline, not lengthen it",
                    limits.call_timeout_s
                ),
            ));
        }
    }
    problems
}

/// Resolves `command` the way docs/manifest.md says: with a '/', relative to the
/// manifest's directory; without, looked up in `search_path`.
fn resolve_command(command: &str, dir: &Path, search_path: &str) -> Result<PathBuf, String> {
    if command.is_empty() {
        return Err("command is empty; name an executable, e.g. command = \"python3\"".to_owned());
    }
    if command.contains('/') {
        let candidate = dir.join(command);
        return if is_executable(&candidate) {
            Ok(candidate)
        } else if candidate.exists() {
            Err(format!(
                "command {} is not executable; run chmod +x on it, or name an interpreter in \
                 command and the script in args",
                candidate.display()
            ))
        } else if Path::new(command).is_absolute() {
            Err(format!(
                "command {} does not exist; fix the path, or install what it names",
                candidate.display()
            ))
        } else {
            Err(format!(
                "command {} does not exist; fix the path (it is relative to the manifest's \
                 directory)",
                candidate.display()
            ))
        };
    }
    std::env::split_paths(search_path)
        .map(|p| p.join(command))
        .find(|p| is_executable(p))
        .ok_or_else(|| {
            format!(
                "command {command:?} was not found in PATH; install it, or give a path containing \
                 '/' (relative to the manifest's directory)"
            )
        })
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path)
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

/// Every manifest found in some directories: the good ones, and an error for
/// each file that could not be used (so the good ones still run).
#[derive(Debug, Default)]
pub struct ManifestSet {
    /// Valid manifests with unique ids, in the order of their paths.
    pub manifests: Vec<Manifest>,
    /// One error per unusable file or directory.
    pub errors: Vec<ManifestError>,
}

/// Reads every `*.toml` file in `dirs`, in path order; a later file whose id is
/// already taken is an error naming both files.
pub fn load_dirs(dirs: &[PathBuf]) -> ManifestSet {
    let mut set = ManifestSet::default();
    let mut seen: HashMap<String, PathBuf> = HashMap::new();
    for dir in dirs {
        let entries = match std::fs::read_dir(dir) {
            Ok(entries) => entries,
            Err(e) => {
                set.errors.push(ManifestError {
                    path: dir.clone(),
                    line: None,
                    message: format!(
                        "cannot read the manifests directory: {e}; create it or pass \
                         --manifests DIR"
                    ),
                });
                continue;
            }
        };
        let mut paths: Vec<PathBuf> = entries
            .filter_map(|e| e.ok().map(|e| e.path()))
            // Anything named *.toml is read (and reported if it is not a
            // regular file); nothing is skipped silently.
            .filter(|p| p.extension().is_some_and(|ext| ext == "toml"))
            .collect();
        paths.sort();
        for path in paths {
            match Manifest::load_all(&path) {
                Ok(m) => {
                    if let Some(first) = seen.get(&m.id) {
                        set.errors.push(ManifestError {
                            line: std::fs::read_to_string(&path)
                                .ok()
                                .and_then(|t| line_of_key(&t, "id")),
                            path,
                            message: format!(
                                "id {:?} is already used by {}; toolbox ids must be unique, \
                                 rename one",
                                m.id,
                                first.display()
                            ),
                        });
                    } else {
                        seen.insert(m.id.clone(), m.path.clone());
                        set.manifests.push(m);
                    }
                }
                Err(problems) => set.errors.extend(problems),
            }
        }
    }
    set
}

mod annotations;
mod asking;
mod problems;
mod sandbox;
mod start;
pub use annotations::{Annotations, ToolAnnotations};
pub use asking::{glob_matches, Asking, Confirm, MAX_ASK_TIMEOUT_S};
use problems::{first, line_of_key, read_raw};
pub use problems::{ManifestError, MAX_PROBLEMS};
use sandbox::RawSandbox;
pub use sandbox::{
    Network, Profile, Sandbox, SocketKind, DEFAULT_ENV_PASS, DEFAULT_PORTS, NEVER_PASSED,
    SANDBOX_RANGES,
};
pub use start::{Start, StartMode, MAX_IDLE_STOP_S, MAX_PREWARM_TOPICS};

#[cfg(test)]
mod tests;
