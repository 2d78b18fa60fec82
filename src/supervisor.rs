//! The owner of the set of toolbox actors: starts one per manifest, applies a
//! manifest reload as a diff, and stops them all on shutdown.

use std::collections::{BTreeMap, HashSet};
use std::path::PathBuf;
use std::sync::Arc;

use futures_util::future::join_all;

use crate::manifest::{self, Manifest, OnConflict};
use crate::peers::PeerCheck;
use crate::registry::Registry;
use crate::toolbox::{self, ToolboxHandle};

/// What a reload did, for the reply to whoever asked.
#[derive(Debug, Clone, Default)]
pub struct ReloadReport {
    /// Toolbox ids hosted (not stopped) after the reload.
    pub loaded: Vec<String>,
    /// (manifest path, error) for each manifest that could not be (re)loaded.
    pub errors: Vec<(String, String)>,
}

impl ReloadReport {
    /// `errors` as the bus and the control socket show it: [{manifest, error}].
    pub fn errors_json(&self) -> serde_json::Value {
        self.errors
            .iter()
            .map(|(manifest, error)| serde_json::json!({"manifest": manifest, "error": error}))
            .collect()
    }
}

/// One toolbox this daemon hosts.
struct Hosted {
    /// The configuration its actor runs, to diff on reload.
    manifest: Manifest,
    /// Its actor.
    handle: ToolboxHandle,
    /// Whether it answers on the bus yet (after the check for other hosts).
    admitted: bool,
}

/// Starts, reloads and stops toolbox actors.
pub struct Supervisor {
    /// Where manifests are read from.
    dirs: Vec<PathBuf>,
    /// The catalog every actor publishes into.
    registry: Arc<Registry>,
    /// Hosted toolboxes by id.
    hosted: BTreeMap<String, Hosted>,
}

impl Supervisor {
    /// Reads the manifests and starts an actor for each valid one. The errors
    /// are the manifests that could not be used.
    pub fn start(
        dirs: Vec<PathBuf>,
        registry: Arc<Registry>,
    ) -> (Supervisor, Vec<manifest::ManifestError>) {
        let set = manifest::load_dirs(&dirs);
        let mut supervisor = Supervisor {
            dirs,
            registry,
            hosted: BTreeMap::new(),
        };
        for m in set.manifests {
            supervisor.host(m);
        }
        (supervisor, set.errors)
    }

    fn host(&mut self, manifest: Manifest) {
        let handle = toolbox::spawn(manifest.clone(), self.registry.clone());
        self.hosted.insert(
            manifest.id.clone(),
            Hosted {
                manifest,
                handle,
                admitted: false,
            },
        );
    }

    /// The handle of toolbox `id`.
    pub fn handle(&self, id: &str) -> Option<ToolboxHandle> {
        self.hosted.get(id).map(|h| h.handle.clone())
    }

    /// Lets every toolbox not yet on the bus answer there: at once, without
    /// waiting for the peer check (which runs beside, see [`Supervisor::settle`]).
    pub fn admit(&mut self) {
        for (id, hosted) in self.hosted.iter_mut().filter(|(_, h)| !h.admitted) {
            self.registry.admit(id);
            hosted.admitted = true;
        }
    }

    /// Acts on a peer check: an id another host also answers for is reported
    /// (log, status); a toolbox whose manifest says `on_conflict = "yield"`
    /// gives way, stopped and shown as `conflict`, but only to a claim that
    /// held over the whole check. Returns (manifest path, reason) per toolbox
    /// that gave way.
    pub async fn settle(&mut self, check: &PeerCheck) -> Vec<(String, String)> {
        let mut yielded = Vec::new();
        let ids: Vec<String> = self.hosted.keys().cloned().collect();
        for id in ids {
            let Some(hosted) = self.hosted.get(&id) else {
                continue;
            };
            if !check.seen.contains(&id) {
                self.registry.note_conflict(&id, None);
                continue;
            }
            if hosted.manifest.on_conflict == OnConflict::Yield && check.held.contains(&id) {
                let reason = format!(
                    "another host on the bus already answers for toolbox_id '{id}', so this \
                     daemon does not host it (on_conflict = \"yield\"); rename one, or stop the \
                     other and reload"
                );
                tracing::error!(toolbox = %id, "{reason}");
                if let Some(h) = self.hosted.remove(&id) {
                    let _ = h.handle.stop().await;
                    yielded.push((h.manifest.path.display().to_string(), reason.clone()));
                }
                self.registry
                    .set(&id, toolbox::State::Conflict { reason }, None);
                continue;
            }
            let reason = format!(
                "another host on the bus also answers for toolbox_id '{id}' (ids must be \
                 unique on a bus); this daemon keeps serving it: rename one, stop the other, \
                 or set on_conflict = \"yield\""
            );
            tracing::error!(toolbox = %id, "{reason}");
            self.registry.note_conflict(&id, Some(reason));
        }
        yielded
    }

    /// Handles of every hosted toolbox.
    pub fn handles(&self) -> impl Iterator<Item = &ToolboxHandle> {
        self.hosted.values().map(|h| &h.handle)
    }

    /// Waits until every toolbox has finished its first start (ready, failed
    /// or stopped), each up to its call timeout.
    pub async fn wait_started(&self) {
        let now = tokio::time::Instant::now();
        join_all(
            self.handles()
                .map(|h| h.wait_started(now + h.call_timeout())),
        )
        .await;
    }

    /// Re-reads the manifests and applies the difference: new ones start,
    /// removed ones drain and stop, changed ones get a rolling restart into
    /// their new configuration, unchanged ones only refresh their tools. A manifest that became invalid is reported and
    /// its running toolbox keeps its old configuration.
    /// New toolboxes answer on the bus at once (the peer check follows).
    pub async fn reload(&mut self) -> ReloadReport {
        let set = manifest::load_dirs(&self.dirs);
        let mut report = ReloadReport::default();
        let broken: HashSet<PathBuf> = set.errors.iter().map(|e| e.path.clone()).collect();
        for e in &set.errors {
            tracing::error!("reload: {e}");
            report
                .errors
                .push((e.path.display().to_string(), e.to_string()));
        }
        let mut incoming: BTreeMap<String, Manifest> = set
            .manifests
            .into_iter()
            .map(|m| (m.id.clone(), m))
            .collect();

        let mut retire = Vec::new();
        let mut refresh = Vec::new();
        let ids: Vec<String> = self.hosted.keys().cloned().collect();
        for id in ids {
            let Some(hosted) = self.hosted.get(&id) else {
                continue;
            };
            match incoming.remove(&id) {
                Some(m) if m == hosted.manifest => refresh.push(hosted.handle.clone()),
                Some(m) if m.instances != hosted.manifest.instances => {
                    // A different number of children: replaced, not rolled.
                    tracing::info!(toolbox = %id, "reload: instances changed; replacing the toolbox");
                    if let Some(old) = self.hosted.remove(&id) {
                        let _ = old.handle.stop().await;
                    }
                    self.registry.remove(&id);
                    self.host(m);
                }
                Some(m) => {
                    tracing::info!(toolbox = %id, "reload: manifest changed; rolling restart");
                    let handle = hosted.handle.clone();
                    match handle.reconfigure(m.clone()).await {
                        Ok(what) => {
                            tracing::info!(toolbox = %id, "reload: {what}");
                            if let Some(hosted) = self.hosted.get_mut(&id) {
                                hosted.manifest = m;
                            }
                        }
                        Err(why) => {
                            tracing::error!(toolbox = %id, "reload: {why}");
                            report.errors.push((m.path.display().to_string(), why));
                        }
                    }
                }
                None if broken.contains(&hosted.manifest.path) => {
                    tracing::warn!(toolbox = %id, "reload: manifest is invalid now; keeping the running configuration");
                }
                None => {
                    tracing::info!(toolbox = %id, "reload: manifest removed; stopping the toolbox");
                    if let Some(old) = self.hosted.remove(&id) {
                        retire.push(old.handle);
                    }
                }
            }
        }
        for m in incoming.into_values() {
            tracing::info!(toolbox = %m.id, "reload: new manifest; starting the toolbox");
            self.host(m);
        }
        let registry = &self.registry;
        let stops = retire.into_iter().map(|h| async move {
            let _ = h.stop().await;
            registry.remove(h.id());
        });
        join_all(stops).await;
        join_all(refresh.iter().map(|h| h.refresh(true))).await;
        self.admit();
        self.wait_started().await;

        let catalog = self.registry.snapshot();
        report.loaded = catalog
            .toolboxes()
            .filter(|(_, e)| e.is_hosted())
            .map(|(id, _)| id.clone())
            .collect();
        report
    }

    /// Stops every toolbox, letting in-flight calls drain.
    pub async fn shutdown(self) {
        join_all(self.hosted.values().map(|h| h.handle.stop())).await;
    }
}

#[cfg(test)]
mod tests {
    //! The supervisor over a real manifests directory, with the stand-in
    //! Python fixture toolbox as the child: no bus, no daemon.

    use super::*;
    use std::path::Path;

    /// A fresh, empty manifests directory for one test.
    fn manifests_dir(test: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("toolboxd-supervisor-{}-{test}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    /// Writes manifest `id` running the fixture toolbox, with `extra` TOML.
    fn write(dir: &Path, id: &str, extra: &str) {
        let fixture =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/fixture_toolbox.py");
        let text = format!(
            "id = \"{id}\"\ncommand = \"python3\"\nargs = [\"{}\"]\n{extra}\n",
            fixture.display()
        );
        std::fs::write(dir.join(format!("{id}.toml")), text).unwrap();
    }

    fn state(registry: &Registry, id: &str) -> Option<String> {
        let catalog = registry.snapshot();
        catalog.toolbox(id).map(|e| e.state.name().to_owned())
    }

    fn pid(supervisor: &Supervisor, id: &str) -> u32 {
        supervisor.handle(id).unwrap().pids()[0]
    }

    fn alive(pid: u32) -> bool {
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), None).is_ok()
    }

    #[tokio::test]
    async fn start_hosts_the_valid_manifests_and_reports_the_others() {
        let dir = manifests_dir("start");
        write(&dir, "good", "");
        std::fs::write(dir.join("bad.toml"), "id = \"bad\"\n").unwrap();
        let registry = Arc::new(Registry::default());
        let (mut supervisor, errors) = Supervisor::start(vec![dir.clone()], registry.clone());
        assert_eq!(errors.len(), 1);
        assert!(errors[0].path.ends_with("bad.toml"));
        assert!(errors[0].to_string().contains("command"), "{}", errors[0]);
        supervisor.admit();
        supervisor.wait_started().await;
        let catalog = registry.snapshot();
        let good = catalog.toolbox("good").unwrap();
        assert!(good.is_listed());
        assert!(good.tools.iter().any(|t| t.name == "whoami"));
        assert!(catalog.toolbox("bad").is_none());
        let child = pid(&supervisor, "good");
        supervisor.shutdown().await;
        assert!(!alive(child));
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[tokio::test]
    async fn a_conflict_is_reported_and_only_a_held_claim_makes_a_yielding_toolbox_give_way() {
        let dir = manifests_dir("conflict");
        write(&dir, "warns", "");
        write(&dir, "yields", "on_conflict = \"yield\"");
        write(&dir, "alone", "");
        let registry = Arc::new(Registry::default());
        let (mut supervisor, _) = Supervisor::start(vec![dir.clone()], registry.clone());
        supervisor.admit();
        supervisor.wait_started().await;
        let note = |id: &str| registry.snapshot().toolbox(id).unwrap().conflict.clone();

        // Seen once (one message, forged or not): reported, nobody yields.
        let once = PeerCheck {
            seen: ["warns", "yields"].map(String::from).into(),
            held: Default::default(),
        };
        assert!(supervisor.settle(&once).await.is_empty());
        for id in ["warns", "yields"] {
            assert!(note(id)
                .unwrap()
                .contains(&format!("also answers for toolbox_id '{id}'")));
            assert!(registry.snapshot().toolbox(id).unwrap().is_listed());
        }
        assert_eq!(note("alone"), None);

        // Held over the whole check: only the yielding toolbox gives way.
        let held = PeerCheck {
            seen: once.seen.clone(),
            held: once.seen.clone(),
        };
        let yielded = supervisor.settle(&held).await;
        assert_eq!(yielded.len(), 1);
        assert!(yielded[0].0.ends_with("yields.toml"));
        assert_eq!(state(&registry, "yields").as_deref(), Some("conflict"));
        assert!(supervisor.handle("yields").is_none());
        assert!(registry.snapshot().toolbox("warns").unwrap().is_listed());

        // The claim gone, the report goes too.
        supervisor.settle(&PeerCheck::default()).await;
        assert_eq!(note("warns"), None);
        supervisor.shutdown().await;
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[tokio::test]
    async fn reload_starts_new_rolls_changed_stops_removed_keeps_unchanged() {
        let dir = manifests_dir("reload");
        for id in ["same", "changed", "removed"] {
            write(&dir, id, "");
        }
        let registry = Arc::new(Registry::default());
        let (mut supervisor, _) = Supervisor::start(vec![dir.clone()], registry.clone());
        supervisor.admit();
        supervisor.wait_started().await;
        let before: BTreeMap<&str, u32> = ["same", "changed", "removed"]
            .into_iter()
            .map(|id| (id, pid(&supervisor, id)))
            .collect();

        write(&dir, "changed", "env = { CHANGED = \"1\" }");
        std::fs::remove_file(dir.join("removed.toml")).unwrap();
        write(&dir, "added", "");
        let report = supervisor.reload().await;

        assert!(report.errors.is_empty(), "{:?}", report.errors);
        assert_eq!(report.loaded, ["added", "changed", "same"]);
        assert_eq!(pid(&supervisor, "same"), before["same"]);
        assert_ne!(pid(&supervisor, "changed"), before["changed"]);
        assert!(supervisor.handle("removed").is_none());
        assert!(registry.snapshot().toolbox("removed").is_none());
        assert!(!alive(before["removed"]));
        assert!(registry.snapshot().toolbox("added").unwrap().is_listed());
        supervisor.shutdown().await;
        std::fs::remove_dir_all(dir).unwrap();
    }
}
