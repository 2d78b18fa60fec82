//! The owner of the set of toolbox actors: starts one per manifest, applies a
//! manifest reload as a diff, and stops them all on shutdown.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::path::PathBuf;
use std::sync::Arc;

use futures_util::future::join_all;

use crate::manifest::{self, Manifest};
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

    /// Lets every toolbox not yet on the bus answer there, except those whose
    /// id another host already answers for (`taken`): OVOS-TOOLS-1 §3 wants ids
    /// unique on a bus, so those are stopped and reported as `conflict`.
    /// Returns (manifest path, reason) per refused toolbox.
    pub async fn admit(&mut self, taken: &BTreeSet<String>) -> Vec<(String, String)> {
        let waiting: Vec<String> = self
            .hosted
            .iter()
            .filter(|(_, h)| !h.admitted)
            .map(|(id, _)| id.clone())
            .collect();
        let mut refused = Vec::new();
        for id in waiting {
            if !taken.contains(&id) {
                self.registry.admit(&id);
                if let Some(h) = self.hosted.get_mut(&id) {
                    h.admitted = true;
                }
                continue;
            }
            let reason = format!(
                "another host on the bus already answers for toolbox_id '{id}', so this daemon \
                 does not host it (ids must be unique on a bus); rename one, or stop the other \
                 and reload"
            );
            tracing::error!(toolbox = %id, "{reason}");
            if let Some(h) = self.hosted.remove(&id) {
                let _ = h.handle.stop().await;
                refused.push((h.manifest.path.display().to_string(), reason.clone()));
            }
            self.registry
                .set(&id, toolbox::State::Conflict { reason }, None);
        }
        refused
    }

    /// Handles of every hosted toolbox.
    pub fn handles(&self) -> impl Iterator<Item = &ToolboxHandle> {
        self.hosted.values().map(|h| &h.handle)
    }

    /// Waits until every toolbox has finished its first start (ready, failed
    /// or stopped), each up to its call timeout.
    pub async fn wait_started(&self) {
        let now = std::time::Instant::now();
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
    /// New toolboxes whose id is in `taken` (answered by another host) are refused.
    pub async fn reload(&mut self, taken: &BTreeSet<String>) -> ReloadReport {
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
        join_all(refresh.iter().map(|h| h.refresh())).await;
        let refused = self.admit(taken).await;
        report.errors.extend(refused);
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
        assert!(supervisor.admit(&BTreeSet::new()).await.is_empty());
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
    async fn an_id_another_host_answers_for_is_refused_as_conflict() {
        let dir = manifests_dir("conflict");
        write(&dir, "mine", "");
        write(&dir, "theirs", "");
        let registry = Arc::new(Registry::default());
        let (mut supervisor, _) = Supervisor::start(vec![dir.clone()], registry.clone());
        let taken = BTreeSet::from(["theirs".to_owned()]);
        let refused = supervisor.admit(&taken).await;
        assert_eq!(refused.len(), 1);
        assert!(refused[0].0.ends_with("theirs.toml"));
        assert!(refused[0]
            .1
            .contains("already answers for toolbox_id 'theirs'"));
        assert_eq!(state(&registry, "theirs").as_deref(), Some("conflict"));
        assert!(supervisor.handle("theirs").is_none());
        supervisor.wait_started().await;
        assert!(registry.snapshot().toolbox("mine").unwrap().is_listed());
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
        supervisor.admit(&BTreeSet::new()).await;
        supervisor.wait_started().await;
        let before: BTreeMap<&str, u32> = ["same", "changed", "removed"]
            .into_iter()
            .map(|id| (id, pid(&supervisor, id)))
            .collect();

        write(&dir, "changed", "env = { CHANGED = \"1\" }");
        std::fs::remove_file(dir.join("removed.toml")).unwrap();
        write(&dir, "added", "");
        let report = supervisor.reload(&BTreeSet::new()).await;

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
