//! `toolboxd check`: validate manifests, and with `--probe` start each child,
//! list its tools, compile their schemas and stop it.

use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use crate::child::Child;
use crate::manifest::{self, Manifest};
use crate::session::Session;
use crate::tool::Tool;

/// Checks every manifest in `dirs`, printing one line per toolbox (and one per
/// problem) to `out`. Returns whether everything was fine.
pub async fn check(dirs: &[PathBuf], probe: bool, out: &mut impl Write) -> bool {
    let set = manifest::load_dirs(dirs);
    let mut ok = set.errors.is_empty();
    for e in &set.errors {
        let _ = writeln!(out, "error {e}");
    }
    for m in &set.manifests {
        if !probe {
            let _ = writeln!(out, "ok    {}  {}", m.id, m.path.display());
            continue;
        }
        match probe_one(m).await {
            Ok(summary) => {
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

/// Starts the child, lists and compiles its tools, stops it.
async fn probe_one(m: &Manifest) -> Result<String, Vec<String>> {
    let (child, _events) = Child::spawn(m).map_err(|e| vec![e.to_string()])?;
    let probe_timeout = Duration::from_secs(m.limits.probe_timeout_s);
    let timeout = Duration::from_secs(m.limits.call_timeout_s);
    let result = async {
        let session = Session::open(
            child.rpc().clone(),
            m.protocol.as_deref(),
            probe_timeout,
            timeout,
        )
        .await
        .map_err(|e| vec![format!("handshake: {e}")])?;
        let (specs, mut problems) = session
            .list_tools(timeout)
            .await
            .map_err(|e| vec![format!("listing tools: {e}")])?;
        let mut names = Vec::new();
        for spec in specs {
            let name = spec.name.clone();
            match Tool::compile(&m.id, spec) {
                Ok(_) => names.push(name),
                Err(why) => problems.push(format!("tool {name:?}: {why}")),
            }
        }
        if !problems.is_empty() {
            return Err(problems);
        }
        Ok(format!(
            "{}, {} tools: {}",
            session.era(),
            names.len(),
            names.join(", ")
        ))
    }
    .await;
    child.stop(Duration::from_secs(2)).await;
    result
}
