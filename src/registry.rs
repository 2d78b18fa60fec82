//! The catalog: every hosted toolbox, its state and its tools (with their
//! compiled validators, [`crate::tool`]).
//!
//! The catalog is an immutable snapshot behind an `Arc`; a change builds a new
//! snapshot and swaps it in whole, so a reader never sees a half-updated
//! catalog and never holds a lock while it validates or calls.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, RwLock};

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
    /// Whether it may answer on the bus: not until no other host on the bus
    /// turned out to answer for the same id (see `Supervisor::admit`).
    pub admitted: bool,
}

impl Entry {
    /// Hosted on the bus: admitted, and neither stopped nor refused.
    pub fn is_hosted(&self) -> bool {
        self.admitted && !matches!(self.state, State::Stopped | State::Conflict { .. })
    }

    /// Listed on discover and the flat namespace: hosted, and `ready` or `restarting`.
    pub fn is_listed(&self) -> bool {
        self.admitted && matches!(self.state, State::Ready | State::Restarting { .. })
    }
}

/// An immutable snapshot of every hosted toolbox.
#[derive(Default)]
pub struct Catalog {
    /// Hosted toolboxes by id.
    entries: BTreeMap<String, Entry>,
    /// Flat namespace over listed toolboxes: tool name → owning toolbox ids.
    owners: HashMap<String, Vec<String>>,
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
        for (id, entry) in entries.iter().filter(|(_, e)| e.is_listed()) {
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
                out.push_str(&tool.definition.to_string());
            }
            out.push(']');
            out
        })
    }
}

/// The owner of the current catalog snapshot.
#[derive(Default)]
pub struct Registry {
    /// The snapshot; replaced whole on every change.
    current: RwLock<Arc<Catalog>>,
}

impl Registry {
    /// The current snapshot.
    pub fn snapshot(&self) -> Arc<Catalog> {
        self.current
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Applies `change` to a copy of the entries and swaps the result in.
    fn update(&self, change: impl FnOnce(&mut BTreeMap<String, Entry>)) {
        let mut current = self.current.write().unwrap_or_else(|e| e.into_inner());
        let mut entries = current.entries.clone();
        change(&mut entries);
        *current = Arc::new(Catalog::build(entries));
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
