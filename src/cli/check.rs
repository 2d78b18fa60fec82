//! `toolboxd check`: validate manifests, and with `--probe` start each child,
//! list its tools, compile their schemas and stop it (caching the tool list
//! of lazy and idle toolboxes, as the daemon would).

use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use crate::launch::launch;
use crate::manifest::{self, Manifest};

/// Checks every manifest in `dirs`, printing one line per toolbox (and one per
/// problem) to `out`. Returns whether everything was fine.
pub async fn check(dirs: &[PathBuf], probe: bool, sandbox: bool, out: &mut impl Write) -> bool {
    let set = manifest::load_dirs(dirs);
    let mut ok = set.errors.is_empty();
    for e in &set.errors {
        let _ = writeln!(out, "error {e}");
    }
    for m in &set.manifests {
        if sandbox {
            let (lines, holds) = crate::process::sandbox::report(m);
            ok &= holds;
            for line in lines {
                let _ = writeln!(out, "sandbox {}  {line}", m.id);
            }
        }
        if !probe {
            let _ = writeln!(out, "ok    {}  {}", m.id, m.path.display());
            continue;
        }
        match probe_one(m).await {
            Ok((summary, 0)) => {
                let _ = writeln!(
                    out,
                    "warn  {}  {}: {summary}: it {}",
                    m.id,
                    m.path.display(),
                    crate::operator::NO_TOOLS
                );
            }
            Ok((summary, _)) => {
                let _ = writeln!(out, "ok    {}  {}: {summary}", m.id, m.path.display());
            }
            Err(problems) => {
                ok = false;
                for p in problems {
                    let _ = writeln!(out, "error {}: toolbox {}: {p}", m.path.display(), m.id);
                }
            }
        }
    }
    if probe {
        // The probed children are gone: so are their limit cgroups.
        crate::process::sandbox::limits::remove_daemon_groups();
    }
    if set.manifests.is_empty() && set.errors.is_empty() {
        let _ = writeln!(
            out,
            "no manifests (*.toml) found in {}",
            dirs.iter()
                .map(|d| d.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    ok
}

/// Starts the child as `run` would, lists and compiles its tools, stops it.
async fn probe_one(m: &Manifest) -> Result<(String, usize), Vec<String>> {
    let stderr = std::sync::Arc::default();
    let launched = match launch(m, m.protocol.as_deref(), &stderr).await {
        Ok(launched) => launched,
        Err(failed) => {
            let (exit, stderr) = failed.reap().await;
            let mut problems = vec![format!("{} (child {exit})", failed.why)];
            problems.extend(stderr.into_iter().map(|l| format!("stderr: {l}")));
            return Err(problems);
        }
    };
    launched.child.stop(Duration::from_secs(2)).await;
    if !launched.left_out.is_empty() {
        return Err(launched.left_out);
    }
    let version = launched.session.era().version();
    if m.start.on_demand() {
        // What the daemon lists a lazy or idle toolbox from.
        crate::catalog_cache::write(m, version, &launched.specs);
    }
    if m.protocol.is_none() {
        // The daemon's first start of it needs no era probe.
        crate::catalog_cache::store_era(m, version);
    }
    let names: Vec<&str> = launched.tools.iter().map(|t| t.name.as_str()).collect();
    let summary = format!(
        "{}, {} tools: {}",
        launched.session.era(),
        names.len(),
        names.join(", ")
    );
    Ok((summary, names.len()))
}
