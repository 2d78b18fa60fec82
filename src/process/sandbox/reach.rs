//! What a confined toolbox may read and write, path by path and each with
//! why (docs/security.md, "Its own files"): worked out once per spawn for
//! its Landlock rules and private view, printed by `check --sandbox`, and
//! read back to explain a refusal (`refusal.rs`).

use std::path::{Path, PathBuf};

use crate::manifest::Manifest;

/// One path a toolbox may reach, and why.
#[derive(Debug, Clone, PartialEq)]
pub struct Grant {
    /// The path (a directory or a file; everything beneath a directory).
    pub path: PathBuf,
    /// Why it may: the manifest key or the rule that gives it.
    pub why: &'static str,
}

/// Every path a toolbox may read and write, beside the system's.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Reach {
    /// What it may read (and execute), writable ones not repeated.
    pub read: Vec<Grant>,
    /// What it may read and write.
    pub write: Vec<Grant>,
    /// Its manifest, for the line a refusal's explanation points at.
    pub manifest: PathBuf,
}

impl Reach {
    /// Whether `path` lies in what it may read (the system's paths included).
    pub fn reads(&self, path: &Path) -> bool {
        self.read
            .iter()
            .chain(&self.write)
            .any(|g| path.starts_with(&g.path))
    }

    /// Whether `path` lies in what it may write.
    pub fn writes(&self, path: &Path) -> bool {
        self.write.iter().any(|g| path.starts_with(&g.path))
    }

    /// The paths it may read, as Landlock and the private view take them.
    pub fn read_paths(&self) -> Vec<PathBuf> {
        self.read.iter().map(|g| g.path.clone()).collect()
    }

    /// The paths it may write.
    pub fn write_paths(&self) -> Vec<PathBuf> {
        self.write.iter().map(|g| g.path.clone()).collect()
    }

    /// Its MCP roots (`roots/list`'s result): the directories it may keep
    /// files in (its state directory, `read_write`) and those its arguments
    /// name, as `file://` URIs.
    pub fn roots(&self) -> serde_json::Value {
        let kept = self
            .write
            .iter()
            .filter(|g| [WHY_STATE, WHY_READ_WRITE].contains(&g.why));
        let named = self.read.iter().filter(|g| g.why == WHY_DIRECTORY_ARGUMENT);
        let mut seen = std::collections::HashSet::new();
        let roots: Vec<serde_json::Value> = kept
            .chain(named)
            .filter(|g| g.path.is_dir() || g.why == WHY_STATE)
            .filter(|g| seen.insert(&g.path))
            .map(|g| {
                serde_json::json!({
                    "uri": file_uri(&g.path),
                    "name": g.path.file_name().map(|n| n.to_string_lossy()).unwrap_or_default(),
                })
            })
            .collect();
        serde_json::json!({ "roots": roots })
    }
}

/// `path` as a `file://` URI: bytes other than unreserved ones and `/`
/// percent-encoded (RFC 3986, RFC 8089).
fn file_uri(path: &Path) -> String {
    use std::os::unix::ffi::OsStrExt;
    let mut uri = String::from("file://");
    for &b in path.as_os_str().as_bytes() {
        if b.is_ascii_alphanumeric() || b"-._~/".contains(&b) {
            uri.push(b as char);
        } else {
            uri.push_str(&format!("%{b:02X}"));
        }
    }
    uri
}

/// Files that mark the root of a project: a script inside one may read the
/// whole project (its modules, its data).
const PROJECT_MARKERS: [&str; 5] = [
    ".git",
    "pyproject.toml",
    "setup.py",
    "package.json",
    "Cargo.toml",
];

/// Why each kind of own path may be read.
pub const WHY_MANIFEST_DIR: &str = "the manifest's directory";
pub const WHY_CWD: &str = "its working directory (cwd)";
pub const WHY_INSTALLATION: &str = "the installation its program belongs to";
pub const WHY_PROJECT: &str = "the project of a script it runs";
pub const WHY_NODE_MODULES: &str = "the node_modules a script it runs is installed in";
pub const WHY_PYTHON_PACKAGES: &str =
    "the Python environment (virtual environment or site-packages) a script it runs is in";
pub const WHY_DIRECTORY_ARGUMENT: &str = "a directory its arguments name (read only)";
pub const WHY_READ_ONLY: &str = "[sandbox] read_only";
pub const WHY_READ_WRITE: &str = "[sandbox] read_write";
pub const WHY_STATE: &str = "its state directory ($TOOLBOXD_STATE_DIR)";
pub const WHY_TMP: &str = "its tmp ($TMPDIR)";
pub const WHY_SHARED_MEMORY: &str = "shared memory (no private view)";
pub const WHY_PRIVATE_TMP: &str = "its private /tmp and /dev/shm";
pub const WHY_CGROUPS: &str = "its own cgroups";

/// What a toolbox may read besides the system: the manifest's directory
/// and its working directory; where its program lives (the prefix above
/// the program's `bin/`, as written and as resolved: a virtual environment,
/// an interpreter's installation, and the same for a script's `#!`
/// interpreter); for the program and each argument naming a file, what it
/// needs to run ([`script_reach`]); each argument naming a directory (read
/// only); and `read_only`. Arguments are read whole and after the `=` of
/// `--option=value`. Only paths that exist, never `/` itself.
pub fn own_reads(manifest: &Manifest) -> Vec<Grant> {
    let mut grants = vec![Grant {
        path: manifest.cwd.clone(),
        why: WHY_CWD,
    }];
    if let Some(dir) = manifest.path.parent() {
        grants.push(Grant {
            path: dir.to_owned(),
            why: WHY_MANIFEST_DIR,
        });
    }
    let mut programs = vec![manifest.program.clone(), canonical(&manifest.program)];
    // A script run through its `#!` line: its interpreter's installation too.
    if let Some(interpreter) = shebang(&manifest.program) {
        programs.push(canonical(&interpreter));
        programs.push(interpreter);
    }
    for program in &programs {
        if let Some(prefix) = program.parent().and_then(Path::parent) {
            grants.push(Grant {
                path: prefix.to_owned(),
                why: WHY_INSTALLATION,
            });
        }
    }
    // A program that is itself a script (node_modules/.bin/x, resolved).
    grants.extend(script_reach(&canonical(&manifest.program)));
    for value in manifest.args.iter().filter_map(|arg| argument_value(arg)) {
        let path = manifest.cwd.join(value);
        if path.is_file() {
            grants.extend(script_reach(&canonical(&path)));
        } else if path.is_dir() {
            grants.push(Grant {
                path: canonical(&path),
                why: WHY_DIRECTORY_ARGUMENT,
            });
        }
    }
    grants.extend(manifest.sandbox.read_only.iter().map(|path| Grant {
        path: path.clone(),
        why: WHY_READ_ONLY,
    }));
    tidy(grants)
}

/// What a toolbox may write besides its state directory and tmp: `read_write`.
pub fn own_writes(manifest: &Manifest) -> Vec<Grant> {
    manifest
        .sandbox
        .read_write
        .iter()
        .map(|path| Grant {
            path: path.clone(),
            why: WHY_READ_WRITE,
        })
        .collect()
}

/// The path an argument may name: itself, or the value of `--option=value`.
fn argument_value(arg: &str) -> Option<&str> {
    let value = match arg.strip_prefix('-') {
        Some(_) => arg.split_once('=')?.1,
        None => arg,
    };
    (!value.is_empty()).then_some(value)
}

/// What a script at `file` (resolved) needs to read to run: the whole
/// `node_modules` it is installed in (the outermost: its dependencies sit
/// beside it), the Python environment it is in (a virtual environment's
/// root, found by its `pyvenv.cfg`, else the `site-packages` or
/// `dist-packages` directory), else its project (the nearest enclosing
/// directory with a [`PROJECT_MARKERS`] file), else its own directory.
/// Never the root, nor what encloses the package directory.
fn script_reach(file: &Path) -> Vec<Grant> {
    let Some(dir) = file.parent() else {
        return Vec::new();
    };
    let above_root = |a: &&Path| a.components().count() > 1;
    let named = |a: &&Path, names: &[&str]| {
        a.file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| names.contains(&n))
    };
    let ancestors = || dir.ancestors().take_while(above_root);
    let grant = |path: &Path, why| Grant {
        path: path.to_owned(),
        why,
    };
    if let Some(modules) = ancestors().filter(|a| named(a, &["node_modules"])).last() {
        return vec![grant(modules, WHY_NODE_MODULES)];
    }
    if let Some(venv) = ancestors().find(|a| a.join("pyvenv.cfg").is_file()) {
        return vec![grant(venv, WHY_PYTHON_PACKAGES)];
    }
    if let Some(packages) = ancestors().find(|a| named(a, &["site-packages", "dist-packages"])) {
        return vec![grant(packages, WHY_PYTHON_PACKAGES)];
    }
    let project = ancestors().find(|a| PROJECT_MARKERS.iter().any(|m| a.join(m).exists()));
    match project {
        Some(project) => vec![grant(project, WHY_PROJECT)],
        None if above_root(&dir) => vec![grant(dir, WHY_PROJECT)],
        None => Vec::new(),
    }
}

/// Sorted, each path once (its first reason), only those that exist, never
/// the root.
fn tidy(grants: Vec<Grant>) -> Vec<Grant> {
    let mut kept: Vec<Grant> = Vec::new();
    for grant in grants {
        let fine = grant.path.components().count() > 1 && grant.path.exists();
        if fine && !kept.iter().any(|k| k.path == grant.path) {
            kept.push(grant);
        }
    }
    kept.sort_by(|a, b| a.path.cmp(&b.path));
    kept
}

/// The interpreter a script names on its `#!` line, if it is one.
fn shebang(program: &Path) -> Option<PathBuf> {
    use std::io::Read;
    let mut head = [0u8; 256];
    let n = std::fs::File::open(program).ok()?.read(&mut head).ok()?;
    let line = head[..n].strip_prefix(b"#!")?;
    let line = line.split(|&b| b == b'\n').next()?;
    let text = std::str::from_utf8(line).ok()?;
    text.split_whitespace().next().map(PathBuf::from)
}

fn canonical(path: &Path) -> PathBuf {
    std::fs::canonicalize(path).unwrap_or_else(|_| path.to_owned())
}

/// `value` with the child's own variables (`$NAME` or `${NAME}` of
/// `vars`) replaced by their values: how a manifest's `env` points into
/// the toolbox's state directory (`$TOOLBOXD_STATE_DIR/memory.json`).
/// Any other `$` is left as written.
pub fn expand(value: &str, vars: &[(&str, &Path)]) -> String {
    let mut out = String::with_capacity(value.len());
    let mut rest = value;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        let (name, skip) = match after.strip_prefix('{') {
            Some(braced) => match braced.find('}') {
                Some(end) => (&braced[..end], end + 2),
                None => ("", 0),
            },
            None => {
                let end = after
                    .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                    .unwrap_or(after.len());
                (&after[..end], end)
            }
        };
        match vars.iter().find(|(n, _)| !name.is_empty() && *n == name) {
            Some((_, path)) => {
                out.push_str(&path.to_string_lossy());
                rest = &after[skip..];
            }
            None => {
                out.push('$');
                rest = after;
            }
        }
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn manifest_in(dir: &Path, args: &[String]) -> Manifest {
        let text = format!(
            "id = \"t\"\ncommand = \"/bin/sh\"\nargs = {}\n",
            serde_json::to_string(args).unwrap()
        );
        let path = dir.join("t.toml");
        std::fs::write(&path, text).unwrap();
        Manifest::load(&path).unwrap()
    }

    fn reads(manifest: &Manifest) -> Vec<(PathBuf, &'static str)> {
        own_reads(manifest)
            .into_iter()
            .map(|g| (g.path, g.why))
            .collect()
    }

    #[test]
    fn a_script_in_node_modules_reads_its_node_modules_and_no_more() {
        let root = tempfile_dir("reach-node");
        let package = root.join("app/node_modules/@scope/server/dist");
        std::fs::create_dir_all(&package).unwrap();
        std::fs::create_dir_all(root.join("app/node_modules/dep")).unwrap();
        std::fs::write(root.join("app/package.json"), "{}").unwrap();
        std::fs::write(root.join("app/secret.txt"), "x").unwrap();
        std::fs::write(package.join("index.js"), "").unwrap();
        let manifests = root.join("manifests");
        std::fs::create_dir_all(&manifests).unwrap();
        let script = package.join("index.js").display().to_string();
        let m = manifest_in(&manifests, &[script]);
        let granted = reads(&m);
        let modules = canonical(&root.join("app/node_modules"));
        assert!(
            granted.contains(&(modules.clone(), WHY_NODE_MODULES)),
            "{granted:?}"
        );
        let reach = Reach {
            read: own_reads(&m),
            ..Reach::default()
        };
        assert!(reach.reads(&modules.join("dep/index.js")));
        // Not the project that installed it, nor anything beside.
        assert!(!reach.reads(&canonical(&root.join("app/secret.txt"))));
        assert!(!reach.writes(&modules.join("dep/index.js")));
    }

    #[test]
    fn a_script_in_a_virtual_environment_reads_the_environment() {
        let root = tempfile_dir("reach-venv");
        let site = root.join("venv/lib/python3.13/site-packages/pkg");
        std::fs::create_dir_all(&site).unwrap();
        std::fs::write(root.join("venv/pyvenv.cfg"), "home = /usr/bin\n").unwrap();
        std::fs::write(site.join("server.py"), "").unwrap();
        std::fs::write(root.join("beside.txt"), "x").unwrap();
        let script = site.join("server.py").display().to_string();
        let m = manifest_in(&root, &[script]);
        let venv = canonical(&root.join("venv"));
        assert!(reads(&m).contains(&(venv, WHY_PYTHON_PACKAGES)));
        // The bare site-packages of a system Python: that directory only.
        let system = root.join("usr/lib/python3/dist-packages/pkg");
        std::fs::create_dir_all(&system).unwrap();
        std::fs::write(system.join("server.py"), "").unwrap();
        let m = manifest_in(&root, &[system.join("server.py").display().to_string()]);
        let packages = canonical(&root.join("usr/lib/python3/dist-packages"));
        assert!(reads(&m).contains(&(packages, WHY_PYTHON_PACKAGES)));
    }

    #[test]
    fn a_directory_argument_is_read_only_and_the_root_is_never_granted() {
        let root = tempfile_dir("reach-dir");
        let data = root.join("data");
        std::fs::create_dir_all(&data).unwrap();
        let manifests = root.join("m");
        std::fs::create_dir_all(&manifests).unwrap();
        let m = manifest_in(
            &manifests,
            &[
                "--repository".into(),
                data.display().to_string(),
                "--root=/".into(),
                "/".into(),
                "--flag".into(),
            ],
        );
        let granted = reads(&m);
        assert!(granted.contains(&(canonical(&data), WHY_DIRECTORY_ARGUMENT)));
        assert!(
            !granted.iter().any(|(p, _)| p == Path::new("/")),
            "{granted:?}"
        );
        assert!(own_writes(&m).is_empty());
        let m = manifest_in(&manifests, &[format!("--repository={}", data.display())]);
        assert!(reads(&m).contains(&(canonical(&data), WHY_DIRECTORY_ARGUMENT)));
    }

    #[test]
    fn the_roots_are_where_it_keeps_files_and_the_directories_it_was_given() {
        let root = tempfile_dir("reach-roots");
        let given = root.join("a dir");
        std::fs::create_dir_all(&given).unwrap();
        let reach = Reach {
            read: vec![
                Grant {
                    path: given.clone(),
                    why: WHY_DIRECTORY_ARGUMENT,
                },
                Grant {
                    path: root.clone(),
                    why: WHY_PROJECT,
                },
            ],
            write: vec![
                Grant {
                    path: "/var/lib/toolboxd/t/state".into(),
                    why: WHY_STATE,
                },
                Grant {
                    path: "/tmp".into(),
                    why: WHY_PRIVATE_TMP,
                },
            ],
            manifest: PathBuf::new(),
        };
        let uris: Vec<String> = reach.roots()["roots"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["uri"].as_str().unwrap().to_owned())
            .collect();
        assert_eq!(
            uris,
            [
                "file:///var/lib/toolboxd/t/state".to_owned(),
                format!("file://{}/a%20dir", root.display()),
            ]
        );
    }

    #[test]
    fn only_the_childs_own_variables_expand() {
        let state = Path::new("/var/lib/toolboxd/memory/state");
        let vars = [("TOOLBOXD_STATE_DIR", state)];
        assert_eq!(
            expand("$TOOLBOXD_STATE_DIR/memory.json", &vars),
            "/var/lib/toolboxd/memory/state/memory.json"
        );
        assert_eq!(
            expand(
                "${TOOLBOXD_STATE_DIR}x:$HOME:$:${:$TOOLBOXD_STATE_DIRX",
                &vars
            ),
            "/var/lib/toolboxd/memory/statex:$HOME:$:${:$TOOLBOXD_STATE_DIRX"
        );
    }

    fn tempfile_dir(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("toolboxd-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        canonical(&dir)
    }
}
