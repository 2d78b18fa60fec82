//! The catalog: every hosted toolbox, its state, its tools and their compiled
//! JSON Schema validators.
//!
//! The catalog is an immutable snapshot behind an `Arc`; a change builds a new
//! snapshot and swaps it in whole, so a reader never sees a half-updated
//! catalog and never holds a lock while it validates or calls.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, RwLock};

use serde_json::{json, Value};

use crate::mcp::{self, ToolSpec};
use crate::toolbox::{State, ToolboxHandle};

/// Most schema violations quoted in one error message.
const MAX_REPORTED_VIOLATIONS: usize = 5;

/// One tool with its compiled validators.
pub struct Tool {
    /// The tool's name, unique inside its toolbox.
    pub name: String,
    /// The bus definition (OVOS-TOOLS-1 §3), built once.
    pub definition: Value,
    /// Whether the child declared an output schema (else the generic one applies).
    pub has_output_schema: bool,
    /// Compiled argument schema: checked before the child sees anything.
    arguments: jsonschema::Validator,
    /// Compiled output schema: a result that fails it is never passed on.
    output: jsonschema::Validator,
}

impl std::fmt::Debug for Tool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tool").field("name", &self.name).finish()
    }
}

impl Tool {
    /// Compiles a listed tool's schemas. The error says which schema and why.
    pub fn compile(toolbox_id: &str, spec: ToolSpec) -> Result<Tool, String> {
        let has_output_schema = spec.output_schema.is_some();
        let output_schema = spec
            .output_schema
            .unwrap_or_else(mcp::generic_output_schema);
        let arguments = jsonschema::validator_for(&spec.input_schema)
            .map_err(|e| format!("its inputSchema does not compile: {e}"))?;
        let output = jsonschema::validator_for(&output_schema)
            .map_err(|e| format!("its outputSchema does not compile: {e}"))?;
        let definition = json!({
            "name": spec.name,
            "description": spec.description,
            "argument_schema": spec.input_schema,
            "output_schema": output_schema,
            "toolbox_id": toolbox_id,
        });
        Ok(Tool {
            name: spec.name,
            definition,
            has_output_schema,
            arguments,
            output,
        })
    }

    /// Checks call arguments; the error lists failing JSON Pointers and reasons.
    pub fn check_arguments(&self, args: &Value) -> Result<(), String> {
        violations(&self.arguments, args)
    }

    /// Checks a result against the output schema.
    pub fn check_output(&self, result: &Value) -> Result<(), String> {
        violations(&self.output, result)
    }
}

fn violations(validator: &jsonschema::Validator, instance: &Value) -> Result<(), String> {
    if validator.is_valid(instance) {
        return Ok(());
    }
    let found: Vec<String> = validator
        .iter_errors(instance)
        .take(MAX_REPORTED_VIOLATIONS)
        .map(|e| {
            let path = e.instance_path().as_str();
            format!("{}: {}", if path.is_empty() { "/" } else { path }, e)
        })
        .collect();
    Err(found.join("; "))
}

/// The tools of one toolbox, by name.
#[derive(Debug, Default)]
pub struct ToolSet {
    /// In the order the child listed them.
    tools: Vec<Arc<Tool>>,
    /// Index into `tools` by name.
    by_name: HashMap<String, usize>,
}

impl ToolSet {
    /// Builds the set; a later duplicate name replaces nothing and is reported.
    pub fn new(tools: Vec<Tool>) -> (ToolSet, Vec<String>) {
        let mut set = ToolSet::default();
        let mut dropped = Vec::new();
        for tool in tools {
            if set.by_name.contains_key(&tool.name) {
                dropped.push(tool.name.clone());
                continue;
            }
            set.by_name.insert(tool.name.clone(), set.tools.len());
            set.tools.push(Arc::new(tool));
        }
        (set, dropped)
    }

    /// The tool called `name`.
    pub fn get(&self, name: &str) -> Option<&Arc<Tool>> {
        self.by_name.get(name).map(|&i| &self.tools[i])
    }

    /// Every tool, in listing order.
    pub fn iter(&self) -> impl Iterator<Item = &Arc<Tool>> {
        self.tools.iter()
    }

    /// How many tools.
    pub fn len(&self) -> usize {
        self.tools.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.tools.is_empty()
    }
}

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

#[cfg(test)]
mod tests {
    use super::*;

    fn tool(schema: Value) -> Tool {
        Tool::compile(
            "math",
            ToolSpec {
                name: "add".into(),
                description: "Add.".into(),
                input_schema: schema,
                output_schema: None,
            },
        )
        .unwrap()
    }

    #[test]
    fn argument_errors_name_pointer_and_reason() {
        let t = tool(json!({"type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"]}));
        assert!(t.check_arguments(&json!({"a": 1, "b": 2})).is_ok());
        let e = t.check_arguments(&json!({"a": 1, "b": "x"})).unwrap_err();
        assert_eq!(e, "/b: \"x\" is not of type \"integer\"");
        let e = t.check_arguments(&json!({"a": 1})).unwrap_err();
        assert!(e.starts_with("/: ") && e.contains("\"b\""), "{e}");
    }

    #[test]
    fn local_refs_and_draft7_compile() {
        let t = tool(json!({"$schema": "http://json-schema.org/draft-07/schema#",
            "definitions": {"n": {"type": "integer"}},
            "type": "object", "properties": {"a": {"$ref": "#/definitions/n"}}}));
        assert!(t
            .check_arguments(&json!({"a": "x"}))
            .unwrap_err()
            .starts_with("/a: "));
        let t = tool(json!({"$defs": {"n": {"type": "integer", "minimum": 0}},
            "type": "object", "properties": {"a": {"items": {"$ref": "#/$defs/n"}}}}));
        assert!(t
            .check_arguments(&json!({"a": [1, -1]}))
            .unwrap_err()
            .starts_with("/a/1: "));
    }

    #[test]
    fn uncompilable_schema_is_reported() {
        let e = Tool::compile(
            "m",
            ToolSpec {
                name: "x".into(),
                description: String::new(),
                input_schema: json!({"type": 12}),
                output_schema: None,
            },
        )
        .unwrap_err();
        assert!(e.contains("inputSchema"), "{e}");
    }

    #[test]
    fn generic_output_schema_accepts_mapped_results() {
        let t = tool(json!({}));
        assert!(t
            .check_output(&json!({"content": "a", "is_error": false, "raw": [{"type": "text"}]}))
            .is_ok());
        assert_eq!(t.definition["output_schema"]["title"], "AdapterToolOutput");
    }
}
