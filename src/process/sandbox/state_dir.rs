//! A toolbox's state directory (docs/security.md): where the daemon keeps
//! them, how one is made and given to the toolbox's user, and its bound.

use std::path::{Path, PathBuf};

use super::SandboxError;
use crate::manifest::{Manifest, Profile};

/// Where the daemon keeps its toolboxes' state: `$STATE_DIRECTORY` (set by
/// systemd's `StateDirectory=`), else `/var/lib/toolboxd` for root, else
/// `$XDG_STATE_HOME/toolboxd` or `~/.local/state/toolboxd`.
pub fn state_root() -> Result<PathBuf, SandboxError> {
    if let Some(dirs) = std::env::var_os("STATE_DIRECTORY") {
        // systemd gives a colon-separated list when several are configured.
        if let Some(first) = dirs.to_string_lossy().split(':').next() {
            if !first.is_empty() {
                return Ok(PathBuf::from(first));
            }
        }
    }
    if nix::unistd::geteuid().is_root() {
        return Ok(PathBuf::from("/var/lib/toolboxd"));
    }
    if let Some(state) = std::env::var_os("XDG_STATE_HOME").filter(|s| !s.is_empty()) {
        return Ok(PathBuf::from(state).join("toolboxd"));
    }
    match std::env::var_os("HOME").filter(|s| !s.is_empty()) {
        Some(home) => Ok(PathBuf::from(home).join(".local/state/toolboxd")),
        None => Err(SandboxError::NoStateRoot(
            "neither STATE_DIRECTORY, XDG_STATE_HOME nor HOME is set".to_owned(),
        )),
    }
}

/// Most entries of a state directory walked to measure it: more counts as
/// over its bound (a toolbox's files are its own business, a million of
/// them is not).
const STATE_MAX_ENTRIES: u64 = 100_000;

/// The state directory of `manifest`'s toolbox, where it has one.
pub fn state_dir_of(manifest: &Manifest) -> Option<PathBuf> {
    (manifest.sandbox.profile == Profile::Standard)
        .then(|| {
            state_root()
                .ok()
                .map(|root| root.join(&manifest.id).join("state"))
        })
        .flatten()
}

/// Why the state directory `dir` is over `max_mib` (0: no bound), if it is:
/// the disk space of what is in it (blocks, so a sparse file counts what it
/// takes), on its own filesystem, links not followed. Blocking: a walk of
/// up to [`STATE_MAX_ENTRIES`].
pub fn state_over(dir: &Path, max_mib: u64) -> Option<String> {
    use std::os::unix::fs::MetadataExt;
    if max_mib == 0 {
        return None;
    }
    let max = max_mib.saturating_mul(1024 * 1024);
    let top = std::fs::symlink_metadata(dir).ok()?;
    let (mut bytes, mut entries) = (0u64, 0u64);
    let mut pending = vec![dir.to_path_buf()];
    while let Some(path) = pending.pop() {
        let Ok(read) = std::fs::read_dir(&path) else {
            continue;
        };
        for entry in read.flatten() {
            entries += 1;
            if entries > STATE_MAX_ENTRIES {
                return Some(format!(
                    "the toolbox's state directory {} holds more than {STATE_MAX_ENTRIES} \
                     entries; remove what it does not need",
                    dir.display()
                ));
            }
            let Ok(meta) = entry.path().symlink_metadata() else {
                continue;
            };
            bytes = bytes.saturating_add(meta.blocks().saturating_mul(512));
            if meta.is_dir() && meta.dev() == top.dev() {
                pending.push(entry.path());
            }
        }
        if bytes > max {
            return Some(format!(
                "the toolbox's state directory {} holds more than state_max_mib = {max_mib} \
                 MiB; remove what it does not need, or raise state_max_mib in its [sandbox]",
                dir.display()
            ));
        }
    }
    None
}

/// Makes `dir` (mode 0700, owned by the child's user); `fresh` empties it first.
pub(super) fn make_dir(
    dir: &Path,
    ids: Option<(libc::uid_t, libc::gid_t)>,
    fresh: bool,
) -> Result<(), SandboxError> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    let fail = |source| SandboxError::Dir {
        path: dir.to_owned(),
        source,
    };
    if fresh {
        match std::fs::remove_dir_all(dir) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(fail(e)),
        }
    }
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(fail)?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)).map_err(fail)?;
    if let Some((uid, gid)) = ids {
        std::os::unix::fs::chown(dir, Some(uid), Some(gid)).map_err(fail)?;
    }
    Ok(())
}
