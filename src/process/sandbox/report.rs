//! `toolboxd check --sandbox`: what the sandbox of a toolbox would hold on
//! this machine, and what not, without starting anything.

use super::{landlock, limits, seccomp};
use crate::manifest::{Manifest, Profile};

/// One line per mechanism, and whether the sandbox can be set up as
/// declared (if not, the toolbox would fail to start, and `check` exits 1).
pub fn report(manifest: &Manifest) -> (Vec<String>, bool) {
    let sandbox = &manifest.sandbox;
    if sandbox.profile == Profile::Off {
        return (
            vec![
                "profile off: nothing is confined (the daemon's rights, environment and network)"
                    .to_owned(),
            ],
            true,
        );
    }
    let mut lines = Vec::new();
    let mut ok = true;
    let mut say = |holds: bool, line: String| {
        ok &= holds;
        lines.push(format!("{}  {line}", if holds { "ok  " } else { "FAIL" }));
    };
    say(
        true,
        format!(
            "environment: {} passed ({}), {} set, {} secrets",
            sandbox.env_pass.len(),
            sandbox.env_pass.join(" "),
            manifest.env.len(),
            sandbox.secrets.len()
        ),
    );
    for (name, source) in &sandbox.secrets {
        match super::secret(name, source) {
            Ok(_) => say(true, format!("secret {name}: readable")),
            Err(e) => say(false, e.to_string()),
        }
    }
    let lock = landlock::support();
    say(lock.abi().is_some(), format!("Landlock: {lock}"));
    let filter = seccomp::support();
    match filter.arch() {
        Ok(arch) => say(true, format!("seccomp: filter for {arch}")),
        Err(why) => say(false, format!("seccomp: {why}")),
    }
    let (holds, words) = super::network_words(sandbox);
    say(holds, words);
    match super::mounts::availability() {
        Ok(_) => say(
            true,
            "filesystem view: private /tmp and /dev/shm (tmpfs), /run hidden but for the paths \
             the manifest names (mount namespace)"
                .to_owned(),
        ),
        Err(why) => say(true, format!("filesystem view: not private: {why}")),
    }
    for (key, value, controller) in [
        ("tasks_max", sandbox.tasks_max, "pids"),
        ("memory_max_mib", sandbox.memory_max_mib, "memory"),
    ] {
        if value == 0 {
            continue;
        }
        match limits::availability(controller) {
            Ok(how) => say(true, format!("{key} = {value}: {how}")),
            Err(why) if sandbox.limits_declared => say(
                false,
                format!("{key} = {value}: cannot be enforced ({why})"),
            ),
            Err(why) => say(
                true,
                format!("{key} = {value} (default): not enforced ({why})"),
            ),
        }
    }
    match super::identity::identity(&manifest.id, sandbox) {
        Ok(identity) => {
            say(true, identity.words());
            if let Some((uid, gid)) = identity.ids() {
                match super::reachable(manifest, uid, gid) {
                    Ok(()) => say(true, "its user can reach its program and files".to_owned()),
                    Err(e) => say(false, e.to_string()),
                }
                for why in super::identity::unwritable(uid, gid, &sandbox.read_write) {
                    say(true, format!("warning: {why}"));
                }
            }
        }
        Err(e) => say(false, e.to_string()),
    }
    // Path by path, what it may read and write beside the system.
    let state = super::state_dir_of(manifest).unwrap_or_default();
    let private = super::mounts::availability().is_ok();
    let tmp = (!private).then(|| state.with_file_name("tmp").join("<daemon pid>-<n>"));
    let reach = super::reach_of(manifest, &state, tmp.as_ref());
    for grant in &reach.read {
        say(
            true,
            format!("reads  {}  ({})", grant.path.display(), grant.why),
        );
    }
    if private {
        say(
            true,
            "writes /tmp, /dev/shm  (its private tmpfs mounts)".to_owned(),
        );
    }
    for grant in &reach.write {
        say(
            true,
            format!("writes {}  ({})", grant.path.display(), grant.why),
        );
    }
    say(
        true,
        format!(
            "reads  the system: {}",
            super::landlock::system_read_paths()
                .iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(" ")
        ),
    );
    say(
        true,
        format!(
            "state directory and private tmp under {}{}",
            state_dir(manifest),
            match sandbox.state_max_mib {
                0 => String::new(),
                max => format!("; at most {max} MiB on disk (checked at start and every probe)"),
            }
        ),
    );
    (lines, ok)
}

/// Ports as a manifest lists them: `80 443`.
pub(crate) fn ports(ports: &[u16]) -> String {
    let words: Vec<String> = ports.iter().map(u16::to_string).collect();
    words.join(" ")
}

fn state_dir(manifest: &Manifest) -> String {
    match super::state_root() {
        Ok(root) => root.join(&manifest.id).display().to_string(),
        Err(e) => e.to_string(),
    }
}
