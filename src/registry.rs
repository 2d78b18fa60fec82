//! The catalog: every hosted toolbox, its state and its tools (with their
//! compiled validators, [`crate::tool`]).
//!
//! Readers get the catalog as an immutable snapshot behind an `Arc`, built on
//! the first read after a change, so a reader never sees a half-updated
//! catalog and never holds a lock while it validates or calls; a change
//! itself only updates one entry.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use crate::tool::{Tool, ToolSet};
use crate::toolbox::{Publish, State, ToolboxHandle};

/// One hosted toolbox as the bus side sees it.
#[derive(Clone)]
pub struct Entry {
    /// Where its calls go.
    pub handle: ToolboxHandle,
    /// Its lifecycle state, which decides whether it is listed.
    pub state: State,
    /// Its last known tools.
    pub tools: Arc<ToolSet>,
    /// Whether it may answer on the bus: from the moment the daemon is on
    /// the bus (see `Supervisor::admit`).
    pub admitted: bool,
    /// Another host on the bus also answers for this id, as the last peer
    /// check found: reported in status; the toolbox keeps serving unless its
    /// manifest says `on_conflict = "yield"` (see `Supervisor::settle`).
    pub conflict: Option<String>,
}

impl Entry {
    /// Hosted on the bus: admitted, and neither stopped nor refused.
    pub fn is_hosted(&self) -> bool {
        self.admitted && !matches!(self.state, State::Stopped | State::Conflict { .. })
    }

    /// Listed on discover and the flat namespace: hosted, and `ready`,
    /// `idle` or `restarting`.
    pub fn is_listed(&self) -> bool {
        self.admitted
            && matches!(
                self.state,
                State::Ready | State::Idle | State::Restarting { .. }
            )
    }
}

/// An immutable snapshot of every hosted toolbox.
#[derive(Default)]
pub struct Catalog {
    /// Hosted toolboxes by id.
    entries: BTreeMap<String, Entry>,
    /// Flat namespace over listed toolboxes: tool name → owning toolbox ids.
    owners: HashMap<String, Vec<String>>,
    /// `prewarm_on` topics of listed toolboxes → their ids.
    prewarm: HashMap<String, Vec<String>>,
    /// Every listed tool definition as one JSON array, serialized on first
    /// use: `ovos.tools.list` then costs a copy, not a walk of every schema.
    definitions_json: std::sync::OnceLock<String>,
}

/// What a flat-namespace name resolves to.
pub enum Resolved<'a> {
    /// Exactly one listed toolbox owns it.
    One(&'a Entry, &'a Arc<Tool>),
    /// No listed toolbox owns it.
    Unknown,
    /// Several do; their ids, sorted.
    Ambiguous(&'a [String]),
}

impl Catalog {
    fn build(entries: BTreeMap<String, Entry>) -> Catalog {
        let mut owners: HashMap<String, Vec<String>> = HashMap::new();
        let mut prewarm: HashMap<String, Vec<String>> = HashMap::new();
        for (id, entry) in entries.iter().filter(|(_, e)| e.is_listed()) {
            for topic in entry.handle.prewarm_topics() {
                prewarm.entry(topic).or_default().push(id.clone());
            }
            for tool in entry.tools.iter() {
                owners
                    .entry(tool.name.clone())
                    .or_default()
                    .push(id.clone());
            }
        }
        Catalog {
            entries,
            owners,
            prewarm,
            definitions_json: std::sync::OnceLock::new(),
        }
    }

    /// The hosted toolbox `id`.
    pub fn toolbox(&self, id: &str) -> Option<&Entry> {
        self.entries.get(id)
    }

    /// Every hosted toolbox, by id.
    pub fn toolboxes(&self) -> impl Iterator<Item = (&String, &Entry)> {
        self.entries.iter()
    }

    /// Every listed toolbox, by id.
    pub fn listed(&self) -> impl Iterator<Item = (&String, &Entry)> {
        self.entries.iter().filter(|(_, e)| e.is_listed())
    }

    /// Resolves a tool name across every listed toolbox.
    pub fn resolve(&self, name: &str) -> Resolved<'_> {
        match self.owners.get(name).map(Vec::as_slice) {
            Some([id]) => match self
                .entries
                .get(id)
                .and_then(|e| Some((e, e.tools.get(name)?)))
            {
                Some((entry, tool)) => Resolved::One(entry, tool),
                None => Resolved::Unknown,
            },
            Some(ids) if ids.len() > 1 => Resolved::Ambiguous(ids),
            _ => Resolved::Unknown,
        }
    }

    /// The listed toolboxes a bus message of `topic` prewarms.
    pub fn prewarmed_by(&self, topic: &str) -> impl Iterator<Item = &Entry> {
        self.prewarm
            .get(topic)
            .into_iter()
            .flatten()
            .filter_map(|id| self.entries.get(id))
    }

    /// How many tools are listed.
    pub fn listed_tool_count(&self) -> usize {
        self.listed().map(|(_, e)| e.tools.len()).sum()
    }

    /// Every listed tool definition as a JSON array, serialized once per snapshot.
    pub fn definitions_json(&self) -> &str {
        self.definitions_json.get_or_init(|| {
            let mut out = String::from("[");
            for (i, tool) in self.listed().flat_map(|(_, e)| e.tools.iter()).enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(tool.definition_json());
            }
            out.push(']');
            out
        })
    }
}

/// The owner of the catalog: every toolbox's entry, and the snapshot readers
/// get, built on the first read after a change. A change costs one map
/// update, never a copy of the whole catalog, so 10,000 toolboxes starting or
/// stopping cost linear time, not quadratic.
#[derive(Default)]
pub struct Registry {
    /// The entries and the cached snapshot, under one lock (never held across
    /// an await; only for a map update or one snapshot build).
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    /// Every toolbox's entry, changed in place.
    entries: BTreeMap<String, Entry>,
    /// The snapshot of `entries`, until they change.
    snapshot: Option<Arc<Catalog>>,
}

impl Registry {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // A panic under this lock would be a bug in a few lines of map code;
        // the map stays consistent, so recover it rather than panic.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The current snapshot.
    pub fn snapshot(&self) -> Arc<Catalog> {
        let mut inner = self.lock();
        if let Some(snapshot) = &inner.snapshot {
            return snapshot.clone();
        }
        let snapshot = Arc::new(Catalog::build(inner.entries.clone()));
        inner.snapshot = Some(snapshot.clone());
        snapshot
    }

    /// Applies `change` to the entries; the next read builds a new snapshot.
    fn update(&self, change: impl FnOnce(&mut BTreeMap<String, Entry>)) {
        let mut inner = self.lock();
        change(&mut inner.entries);
        inner.snapshot = None;
    }

    /// Adds a toolbox, not yet admitted (replacing any entry of the same id).
    pub fn insert(&self, id: &str, handle: ToolboxHandle, state: State) {
        self.update(|entries| {
            entries.insert(
                id.to_owned(),
                Entry {
                    handle,
                    state,
                    tools: Arc::default(),
                    admitted: false,
                    conflict: None,
                },
            );
        });
    }

    /// Lets a toolbox answer on the bus.
    pub fn admit(&self, id: &str) {
        self.update(|entries| {
            if let Some(entry) = entries.get_mut(id) {
                entry.admitted = true;
            }
        });
    }

    /// Notes that another host also answers for toolbox `id` (`why`), or
    /// that none does any more (`None`).
    pub fn note_conflict(&self, id: &str, why: Option<String>) {
        self.update(|entries| {
            if let Some(entry) = entries.get_mut(id) {
                entry.conflict = why;
            }
        });
    }

    /// Stops hosting a toolbox.
    pub fn remove(&self, id: &str) {
        self.update(|entries| {
            entries.remove(id);
        });
    }

    /// Records a toolbox's new state, and its new tools when given.
    pub fn set(&self, id: &str, state: State, tools: Option<Arc<ToolSet>>) {
        self.update(|entries| {
            if let Some(entry) = entries.get_mut(id) {
                entry.state = state;
                if let Some(tools) = tools {
                    entry.tools = tools;
                }
            }
        });
    }
}

/// Toolboxes publish into the registry.
impl Publish for Registry {
    fn add(&self, handle: ToolboxHandle) {
        let id = handle.id().to_owned();
        self.insert(&id, handle, State::Starting);
    }

    fn set(&self, id: &str, state: State, tools: Option<Arc<ToolSet>>) {
        Registry::set(self, id, state, tools);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mcp::ToolSpec;
    use serde_json::{json, Value};

    const STATES: [fn() -> State; 6] = [
        || State::Starting,
        || State::Ready,
        || State::Restarting {
            last_exit: "code 1".into(),
        },
        || State::Failed {
            reason: "spent".into(),
        },
        || State::Stopped,
        || State::Conflict {
            reason: "twin".into(),
        },
    ];

    fn tools(toolbox: &str, names: &[&str]) -> Arc<ToolSet> {
        let specs = names
            .iter()
            .map(|name| ToolSpec {
                name: (*name).into(),
                description: format!("{name} in {toolbox}"),
                input_schema: json!({"type": "object"}),
                output_schema: None,
                annotations: None,
            })
            .collect();
        let (set, problems) = ToolSet::compile(toolbox, specs);
        assert!(problems.is_empty(), "{problems:?}");
        Arc::new(set)
    }

    /// `math` and `shell` are listed and share `echo`; `quiet` is ready but
    /// not admitted; `broken` is admitted but failed. Each unlisted one owns
    /// `add` too, and a tool of its own.
    fn populated() -> Registry {
        let registry = Registry::default();
        for (id, admitted, state, names) in [
            ("math", true, State::Ready, &["add", "echo"][..]),
            (
                "shell",
                true,
                State::Restarting {
                    last_exit: "code 1".into(),
                },
                &["echo"][..],
            ),
            ("quiet", false, State::Ready, &["add", "hush"][..]),
            (
                "broken",
                true,
                State::Failed {
                    reason: "spent".into(),
                },
                &["add", "div"][..],
            ),
        ] {
            registry.insert(id, ToolboxHandle::detached(id), State::Starting);
            if admitted {
                registry.admit(id);
            }
            registry.set(id, state, Some(tools(id, names)));
        }
        registry
    }

    fn entry(admitted: bool, state: State) -> Entry {
        Entry {
            handle: ToolboxHandle::detached("t"),
            state,
            tools: Arc::default(),
            admitted,
            conflict: None,
        }
    }

    #[test]
    fn hosted_means_admitted_and_neither_stopped_nor_in_conflict() {
        for state in STATES.map(|s| s()) {
            let name = state.name();
            let hosted = !matches!(name, "stopped" | "conflict");
            assert_eq!(entry(true, state.clone()).is_hosted(), hosted, "{name}");
            assert!(!entry(false, state).is_hosted(), "{name}");
        }
    }

    #[test]
    fn listed_means_admitted_and_ready_or_restarting() {
        for state in STATES.map(|s| s()) {
            let name = state.name();
            let listed = matches!(name, "ready" | "restarting");
            assert_eq!(entry(true, state.clone()).is_listed(), listed, "{name}");
            assert!(!entry(false, state).is_listed(), "{name}");
        }
    }

    #[test]
    fn a_toolbox_is_inserted_unadmitted_then_admitted_updated_and_removed() {
        let registry = Registry::default();
        registry.insert("math", ToolboxHandle::detached("math"), State::Starting);
        let before = registry.snapshot();
        let e = before.toolbox("math").expect("inserted");
        assert_eq!(e.handle.id(), "math");
        assert_eq!(e.state, State::Starting);
        assert!(!e.admitted && e.tools.is_empty());

        registry.admit("math");
        registry.admit("nobody");
        registry.set("math", State::Ready, Some(tools("math", &["add"])));
        registry.set("nobody", State::Ready, None);
        let after = registry.snapshot();
        let e = after.toolbox("math").unwrap();
        assert!(e.admitted);
        assert_eq!(e.state, State::Ready);
        assert_eq!(e.tools.len(), 1);
        assert!(after.toolbox("nobody").is_none());
        // A snapshot taken earlier never changes.
        assert!(!before.toolbox("math").unwrap().admitted);

        // A state without tools keeps the last known tools.
        let restarting = State::Restarting {
            last_exit: "signal 9".into(),
        };
        registry.set("math", restarting.clone(), None);
        let e = registry.snapshot().toolbox("math").unwrap().clone();
        assert_eq!(e.state, restarting);
        assert!(e.tools.get("add").is_some());

        // Inserting again replaces the entry: not admitted, no tools.
        registry.insert("math", ToolboxHandle::detached("math"), State::Starting);
        let e = registry.snapshot().toolbox("math").unwrap().clone();
        assert!(!e.admitted && e.tools.is_empty());

        registry.remove("math");
        assert!(registry.snapshot().toolbox("math").is_none());
        assert_eq!(registry.snapshot().toolboxes().count(), 0);
    }

    #[test]
    fn toolboxes_are_every_entry_and_listed_only_the_listed_ones() {
        let catalog = populated().snapshot();
        let ids = |it: &mut dyn Iterator<Item = (&String, &Entry)>| {
            it.map(|(id, e)| {
                assert_eq!(id, e.handle.id());
                id.clone()
            })
            .collect::<Vec<_>>()
        };
        assert_eq!(
            ids(&mut catalog.toolboxes()),
            ["broken", "math", "quiet", "shell"]
        );
        assert_eq!(ids(&mut catalog.listed()), ["math", "shell"]);
    }

    #[test]
    fn names_resolve_across_listed_toolboxes_only() {
        let catalog = populated().snapshot();
        // `add` is also in `quiet` and `broken`, which are not listed.
        let Resolved::One(entry, tool) = catalog.resolve("add") else {
            panic!("add is math's alone")
        };
        assert_eq!(entry.handle.id(), "math");
        assert_eq!(tool.name, "add");
        assert_eq!(tool.definition()["toolbox_id"], "math");
        let Resolved::Ambiguous(ids) = catalog.resolve("echo") else {
            panic!("echo is math's and shell's")
        };
        assert_eq!(ids, ["math", "shell"]);
        for name in ["hush", "div", "nope"] {
            assert!(matches!(catalog.resolve(name), Resolved::Unknown), "{name}");
        }
    }

    #[test]
    fn listed_tools_are_counted_and_serialized_in_order() {
        let catalog = populated().snapshot();
        assert_eq!(catalog.listed_tool_count(), 3);
        let json = catalog.definitions_json();
        let parsed: Value = serde_json::from_str(json).expect(json);
        let expected: Vec<Value> = ["math", "shell"]
            .iter()
            .flat_map(|id| {
                let entry = catalog.toolbox(id).unwrap();
                entry
                    .tools
                    .iter()
                    .map(|t| t.definition())
                    .collect::<Vec<_>>()
            })
            .collect();
        assert_eq!(parsed, Value::Array(expected));
        let names: Vec<&str> = parsed
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["add", "echo", "echo"]);
        // Serialized once: the same string every time.
        assert!(std::ptr::eq(json, catalog.definitions_json()));

        let empty = Registry::default().snapshot();
        assert_eq!(empty.listed_tool_count(), 0);
        assert_eq!(empty.definitions_json(), "[]");
    }

    #[test]
    fn toolboxes_publish_through_the_registry() {
        let registry = Registry::default();
        let sink: &dyn Publish = &registry;
        sink.add(ToolboxHandle::detached("math"));
        let e = registry.snapshot().toolbox("math").unwrap().clone();
        assert_eq!(e.handle.id(), "math");
        assert_eq!(e.state, State::Starting);
        assert!(!e.admitted);
        registry.admit("math");
        sink.set("math", State::Ready, Some(tools("math", &["add", "mul"])));
        let catalog = registry.snapshot();
        let e = catalog.toolbox("math").unwrap();
        assert_eq!(e.state, State::Ready);
        assert_eq!(e.tools.len(), 2);
        assert_eq!(catalog.listed_tool_count(), 2);
    }
}
