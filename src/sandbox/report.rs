//! `toolboxd check --sandbox`: what the sandbox of a toolbox would hold on
//! this machine, and what not, without starting anything.

use super::{landlock, limits, seccomp};
use crate::manifest::{Manifest, Network, Profile};

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
    if sandbox.network == Network::None {
        say(
            lock.network() && filter.arch().is_ok(),
            "network = \"none\": seccomp refuses IP sockets, Landlock TCP".to_owned(),
        );
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
    if let Some(user) = &sandbox.user {
        say(true, format!("runs as user {user}"));
    }
    say(
        true,
        format!(
            "state directory and private tmp under {}",
            state_dir(manifest)
        ),
    );
    (lines, ok)
}

fn state_dir(manifest: &Manifest) -> String {
    match super::state_root() {
        Ok(root) => root.join(&manifest.id).display().to_string(),
        Err(e) => e.to_string(),
    }
}
