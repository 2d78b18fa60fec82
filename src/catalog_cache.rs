//! The tool lists of lazy and idle toolboxes, cached on disk, so that such a
//! toolbox is listed with no process running (docs/manifest.md, `[start]`).
//!
//! One file per toolbox, `<state root>/.catalog/<id>.json` (no toolbox id
//! starts with a dot, so no toolbox's state directory can be this one). An
//! entry holds for as long as what defines the toolbox is unchanged: its
//! command, arguments, environment, working directory and pinned protocol,
//! and the size and modification time of its executable and of every
//! argument that names a file (its script). Anything else — a changed
//! script, an unreadable or corrupt file — is a miss, and the toolbox is
//! probed again. The file is written whole and renamed into place.
//!
//! The cache is trusted only as far as it is the daemon's own: the
//! directory is made 0700, and used only while it is a directory (not a
//! link) of the daemon's user that no one else may write; each file is
//! created new (`O_EXCL | O_NOFOLLOW`, so no link planted at its name is
//! followed) and read back only while it is a regular file of the daemon's
//! user that no one else may read or write. A planted or opened-up file is
//! a miss (the toolbox is probed again), never a tool list.

use std::path::{Path, PathBuf};

use serde_json::{json, Value};

use crate::manifest::Manifest;
use crate::mcp::{self, ToolSpec};

/// Largest cache file read back (a tool list may take at most half a bus
/// message, so a larger file is not one of ours).
const MAX_FILE_BYTES: u64 = crate::bus::MAX_FRAME_BYTES as u64;

/// A toolbox's cached tool list.
#[derive(Debug, Clone, PartialEq)]
pub struct Cached {
    /// The MCP version its child spoke (so the next start need not probe).
    pub version: String,
    /// Its tools as listed.
    pub tools: Vec<ToolSpec>,
}

/// Where the cache of `id` lives.
fn path_of(id: &str) -> Option<PathBuf> {
    let root = crate::process::sandbox::state_root().ok()?;
    Some(root.join(".catalog").join(format!("{id}.json")))
}

/// Where the era of `id` is kept (toolbox ids hold no `.`, so no tool list
/// is at this name).
fn era_path_of(id: &str) -> Option<PathBuf> {
    let root = crate::process::sandbox::state_root().ok()?;
    Some(root.join(".catalog").join(format!("{id}.era.json")))
}

/// Whether `dir` is a directory of the daemon's user that no one else may
/// write (so what is in it was put there by the daemon).
fn is_own_dir(dir: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    std::fs::symlink_metadata(dir).is_ok_and(|meta| {
        meta.is_dir() && meta.uid() == nix::unistd::geteuid().as_raw() && meta.mode() & 0o022 == 0
    })
}

/// What defines the toolbox's tools, as far as the daemon can tell.
fn key(manifest: &Manifest) -> Value {
    let mut files = vec![stamp(&manifest.program)];
    for arg in &manifest.args {
        let path = manifest.cwd.join(arg);
        if path.is_file() {
            files.push(stamp(&path));
        }
    }
    // Paths as text, lossily: a path need not be UTF-8, and a JSON string must.
    json!({
        "program": manifest.program.to_string_lossy(),
        "args": manifest.args,
        "cwd": manifest.cwd.to_string_lossy(),
        "env": manifest.env,
        "env_clear": manifest.env_clear,
        "protocol": manifest.protocol,
        "files": files,
    })
}

/// A file's path, size and modification time (nanoseconds), or its path
/// alone when it cannot be read.
fn stamp(path: &Path) -> Value {
    use std::os::unix::fs::MetadataExt;
    let name = path.to_string_lossy();
    match std::fs::metadata(path) {
        Ok(m) => json!([name, m.len(), m.mtime(), m.mtime_nsec()]),
        Err(_) => json!([name]),
    }
}

/// The cached tool list of `manifest`'s toolbox, if one holds. Only a
/// regular file of bounded size is read (never a FIFO left at the path).
pub fn load(manifest: &Manifest) -> Option<Cached> {
    let entry = load_entry(manifest, &path_of(&manifest.id)?)?;
    let version = entry.get("version")?.as_str()?.to_owned();
    let (tools, _) = mcp::parse_tools_page(&json!({ "tools": entry.get("tools")? }));
    let tools: Vec<ToolSpec> = tools.into_iter().collect::<Result<_, _>>().ok()?;
    Some(Cached { version, tools })
}

/// The MCP version `manifest`'s child spoke when its era was last found,
/// if what defines the toolbox is unchanged since: its next start needs no
/// probe (an SDK 1.x server logs the probe as a validation error at every
/// start otherwise).
pub fn load_era(manifest: &Manifest) -> Option<String> {
    let entry = load_entry(manifest, &era_path_of(&manifest.id)?)?;
    Some(entry.get("version")?.as_str()?.to_owned())
}

/// Keeps the era `version` found for `manifest`'s child (a small file,
/// written here and now).
pub fn store_era(manifest: &Manifest, version: &str) {
    if let Some(path) = era_path_of(&manifest.id) {
        write_entry(
            manifest,
            &path,
            json!({"key": key(manifest), "version": version}),
            "era",
        );
    }
}

/// Forgets the era kept for `manifest`'s child (it did not hold: the next
/// start probes).
pub fn forget_era(manifest: &Manifest) {
    if let Some(path) = era_path_of(&manifest.id) {
        let _ = std::fs::remove_file(path);
    }
}

/// The entry at `path` when it is the daemon's own and its key is
/// `manifest`'s.
fn load_entry(manifest: &Manifest, path: &Path) -> Option<Value> {
    if !is_own_dir(path.parent()?) {
        return None;
    }
    let text = match crate::util::files::read_own_private(path, MAX_FILE_BYTES) {
        Ok(text) => text,
        Err(crate::util::files::ReadError::NotFound) => return None,
        Err(e) => {
            tracing::warn!(
                toolbox = %manifest.id,
                "not using the cached {}: {e}; the toolbox is probed instead",
                path.display()
            );
            return None;
        }
    };
    let entry: Value = serde_json::from_str(&text).ok()?;
    (entry.get("key")? == &key(manifest)).then_some(entry)
}

/// Caches `manifest`'s tool list, listed by a child that spoke `version`, on
/// a blocking thread when called on the runtime (a tool list may be
/// megabytes). A failure is logged: the toolbox then is probed again at its
/// next start.
pub fn store(manifest: &Manifest, version: &str, tools: &[ToolSpec]) {
    let (manifest, version, tools) = (manifest.clone(), version.to_owned(), tools.to_vec());
    let write = move || write(&manifest, &version, &tools);
    match tokio::runtime::Handle::try_current() {
        Ok(runtime) => drop(runtime.spawn_blocking(write)),
        Err(_) => write(),
    }
}

/// [`store`], here and now (for `check --probe`, which exits next).
pub fn write(manifest: &Manifest, version: &str, tools: &[ToolSpec]) {
    let Some(path) = path_of(&manifest.id) else {
        return;
    };
    let entry = json!({
        "key": key(manifest),
        "version": version,
        "tools": tools.iter().map(mcp::tool_definition).collect::<Vec<_>>(),
    });
    write_entry(manifest, &path, entry, "tool list");
}

/// Writes `entry` (`what` it is, for the log) at `path`, whole: a file made
/// new beside it, then renamed into place.
fn write_entry(manifest: &Manifest, path: &Path, entry: Value, what: &str) {
    let written = (|| -> std::io::Result<()> {
        use std::io::Write;
        use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
        let dir = path.parent().unwrap_or(Path::new("."));
        if let Some(root) = dir.parent() {
            std::fs::create_dir_all(root)?;
        }
        match std::fs::DirBuilder::new().mode(0o700).create(dir) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e),
        }
        if !is_own_dir(dir) {
            return Err(std::io::Error::other(
                "the directory is not the daemon's own (a link, another owner, or writable by \
                 others); remove it and the daemon makes it again",
            ));
        }
        let partial = dir.join(format!(".{}.{}.partial", manifest.id, std::process::id()));
        // The daemon's own: its environment values are in the key. Made new,
        // never through a link at its name: a leftover of this pid's (a
        // crash) is removed first (unlink removes a link, not its target).
        let open = || {
            std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .custom_flags(libc::O_NOFOLLOW)
                .mode(0o600)
                .open(&partial)
        };
        let mut file = match open() {
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                std::fs::remove_file(&partial)?;
                open()?
            }
            file => file?,
        };
        file.write_all(entry.to_string().as_bytes())?;
        drop(file);
        std::fs::rename(&partial, path)
    })();
    if let Err(e) = written {
        tracing::warn!(
            toolbox = %manifest.id,
            "cannot cache the {what} in {}: {e}; the toolbox is probed again at its next \
             start",
            path.display()
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_changed_script_is_a_miss() {
        let dir = std::env::temp_dir().join(format!("toolboxd-cache-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let script = dir.join("box.py");
        std::fs::write(&script, "print(1)\n").unwrap();
        let manifest_path = dir.join("box.toml");
        std::fs::write(
            &manifest_path,
            "id = \"box\"\ncommand = \"python3\"\nargs = [\"box.py\"]\n",
        )
        .unwrap();
        let manifest = Manifest::load(&manifest_path).unwrap();
        let before = key(&manifest);
        assert_eq!(before, key(&manifest), "the same toolbox, the same key");
        std::fs::write(&script, "print(22)\n").unwrap();
        assert_ne!(before, key(&manifest), "a changed script changes the key");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
