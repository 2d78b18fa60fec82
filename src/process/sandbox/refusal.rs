//! A refusal explained: when a confined child's error names a path it was
//! refused (its stderr, or a tool's error text) and that path lies outside
//! what its sandbox lets it read or write, the operator is told which path
//! and which manifest key would allow it, in the log, in `ctl logs` and
//! `ctl status`, and in a failed start's report.

use std::collections::{HashSet, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use super::reach::Reach;

/// Refused paths explained per child start; past them, no more (a child
/// refused in a loop says nothing new).
const PATHS_PER_START: usize = 64;
/// Explanations status keeps, the latest.
const KEPT: usize = 5;

/// A toolbox's explained refusals: what its serving child may reach, and
/// the latest explanations.
#[derive(Debug, Default)]
pub struct Refusals {
    /// Under one lock: they change together, at a start and at a refusal.
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    /// What the latest child may read and write (`None`: not confined).
    reach: Option<Arc<Reach>>,
    /// Paths explained since that child started, each once.
    seen: HashSet<PathBuf>,
    /// The latest explanations, oldest first.
    recent: VecDeque<String>,
}

impl Refusals {
    /// A child started, confined to `reach` (or not confined).
    pub fn started(&self, reach: Option<Arc<Reach>>) {
        let mut inner = self.lock();
        inner.reach = reach;
        inner.seen.clear();
    }

    /// Reads `text`, a line of toolbox `toolbox`'s stderr or a tool's
    /// error: if it names a path its sandbox refuses, not explained since
    /// the child started, returns the explanation (and logs and keeps it).
    pub fn read(&self, toolbox: &str, text: &str) -> Option<String> {
        let (path, writing) = refused_path(text)?;
        let mut inner = self.lock();
        let reach = inner.reach.clone()?;
        if inner.seen.len() >= PATHS_PER_START || !inner.seen.insert(path.clone()) {
            return None;
        }
        // The path is the child's text: escaped, one line.
        let hint = explain(&reach, toolbox, &path, writing)?;
        let hint = crate::util::throttle::escape_controls(&hint).into_owned();
        tracing::warn!(target: "toolboxd::sandbox", toolbox, "{hint}");
        if inner.recent.len() == KEPT {
            inner.recent.pop_front();
        }
        inner.recent.push_back(hint.clone());
        Some(hint)
    }

    /// The latest explanations, oldest first.
    pub fn recent(&self) -> Vec<String> {
        self.lock().recent.iter().cloned().collect()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // Plain data: a panic elsewhere cannot leave it half changed.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Words of an error that the kernel refused access.
const REFUSED: [&str; 6] = [
    "permission denied",
    "eacces",
    "operation not permitted",
    "eperm",
    "read-only file system",
    "erofs",
];

/// Words of an error that say the refused access was a write.
const WRITING: [&str; 9] = [
    "read-only file system",
    "erofs",
    "create",
    "mkdir",
    "write",
    "rename",
    "unlink",
    "remove",
    "mkdtemp",
];

/// The absolute path a refusal error names, and whether it was clearly a
/// write: `cat: /srv/x: Permission denied`, `PermissionError: [Errno 13]
/// Permission denied: '/srv/x'`, `EACCES: permission denied, open '/srv/x'`.
pub fn refused_path(text: &str) -> Option<(PathBuf, bool)> {
    // Its head only: a tool's error may be megabytes.
    let text = crate::util::throttle::cut(text, 4096);
    let lower = text.to_lowercase();
    if !REFUSED.iter().any(|w| lower.contains(w)) {
        return None;
    }
    let writing = WRITING.iter().any(|w| lower.contains(w));
    let quoted = ['\'', '"', '`', '‘', '’', '“', '”'];
    let from_quotes = text
        .split(quoted)
        .skip(1)
        .step_by(2)
        .find(|s| s.starts_with('/') && s.len() > 1);
    let path = from_quotes.or_else(|| {
        text.split_whitespace()
            .map(|t| t.trim_matches(|c: char| ":,;()[]".contains(c) || quoted.contains(&c)))
            .find(|t| t.starts_with('/') && t.len() > 1)
    })?;
    Some((PathBuf::from(path), writing))
}

/// Why `reach` refuses `path` (a write, if `writing`), and the manifest
/// line that would allow it; `None` when its rules allow it (the refusal
/// came from elsewhere: file permissions, the other user's files).
pub fn explain(reach: &Reach, toolbox: &str, path: &Path, writing: bool) -> Option<String> {
    if reach.writes(path) {
        return None;
    }
    let system = super::landlock::system_read_paths();
    let in_system = system.iter().any(|p| path.starts_with(p));
    let readable = in_system || reach.reads(path);
    // A failed read of a file it may read: its permissions, not the sandbox.
    if readable && !writing && in_system {
        return None;
    }
    // The directory above the path the child named (never looked at: the
    // path is the child's word, and the file system may be slow); never
    // the root, whose grant no refusal justifies.
    let dir = path.parent().filter(|d| d.components().count() > 1)?;
    let manifest = reach.manifest.display();
    Some(if readable || writing {
        let may = if readable {
            "may read it but not write it"
        } else {
            "may not write there"
        };
        format!(
            "the sandbox refused {path}: toolbox {toolbox} {may}. If it must write there, add \
             read_write = [\"{dir}\"] under [sandbox] in {manifest}",
            path = path.display(),
            dir = dir.display(),
        )
    } else {
        format!(
            "the sandbox refused {path}: it is outside what toolbox {toolbox} may read (its own \
             files, the system, [sandbox] read_only; `toolboxd check --sandbox` lists them). To \
             allow it, add read_only = [\"{dir}\"] under [sandbox] in {manifest} (read_write if \
             it must write there)",
            path = path.display(),
            dir = dir.display(),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::super::reach::Grant;
    use super::*;

    #[test]
    fn the_refused_path_is_read_from_the_usual_errors() {
        let cases = [
            (
                "cat: /srv/data/x.txt: Permission denied",
                "/srv/data/x.txt",
                false,
            ),
            (
                "PermissionError: [Errno 13] Permission denied: '/srv/a b/x'",
                "/srv/a b/x",
                false,
            ),
            (
                "Error: EACCES: permission denied, open '/srv/notes.md'",
                "/srv/notes.md",
                false,
            ),
            (
                "mkdir: cannot create directory ‘/var/new’: Permission denied",
                "/var/new",
                true,
            ),
            (
                "OSError: [Errno 30] Read-only file system: '/usr/x'",
                "/usr/x",
                true,
            ),
        ];
        for (text, path, writing) in cases {
            assert_eq!(
                refused_path(text),
                Some((PathBuf::from(path), writing)),
                "{text}"
            );
        }
        assert_eq!(refused_path("all fine at /srv/data"), None);
        assert_eq!(refused_path("Permission denied (no path)"), None);
    }

    fn reach() -> Reach {
        Reach {
            read: vec![Grant {
                path: "/srv/app".into(),
                why: "the manifest's directory",
            }],
            write: vec![Grant {
                path: "/var/lib/toolboxd/t/state".into(),
                why: "its state directory",
            }],
            manifest: "/etc/toolboxd/manifests/t.toml".into(),
        }
    }

    #[test]
    fn a_refusal_names_the_path_and_the_key_that_allows_it() {
        let hint = explain(&reach(), "t", Path::new("/srv/data/x.txt"), false).unwrap();
        assert!(hint.contains("/srv/data/x.txt"), "{hint}");
        assert!(
            hint.contains(
                r#"read_only = ["/srv/data"] under [sandbox] in /etc/toolboxd/manifests/t.toml"#
            ),
            "{hint}"
        );
        let hint = explain(&reach(), "t", Path::new("/srv/app/cache/y"), true).unwrap();
        assert!(
            hint.contains(r#"read_write = ["/srv/app/cache"]"#),
            "{hint}"
        );
        // Never the root.
        assert_eq!(explain(&reach(), "t", Path::new("/x"), true), None);
        // Inside what it may write, or a system file it may read: not the sandbox.
        assert_eq!(
            explain(
                &reach(),
                "t",
                Path::new("/var/lib/toolboxd/t/state/f"),
                true
            ),
            None
        );
        assert_eq!(
            explain(&reach(), "t", Path::new("/etc/shadow"), false),
            None
        );
    }

    #[test]
    fn each_path_is_explained_once_per_start_and_only_when_confined() {
        let refusals = Refusals::default();
        let line = "cat: /srv/data/x.txt: Permission denied";
        assert_eq!(refusals.read("t", line), None, "not confined");
        refusals.started(Some(Arc::new(reach())));
        assert!(refusals.read("t", line).is_some());
        assert_eq!(refusals.read("t", line), None, "said already");
        assert_eq!(refusals.recent().len(), 1);
        refusals.started(Some(Arc::new(reach())));
        assert!(
            refusals.read("t", line).is_some(),
            "a new start says it again"
        );
        for i in 0..(PATHS_PER_START + 10) {
            refusals.read("t", &format!("cat: /srv/d{i}: Permission denied"));
        }
        assert_eq!(refusals.recent().len(), KEPT);
    }
}
