//! The bus's tool catalog as an MCP client sees it: each tool definition of
//! `ovos.tools.list` made an MCP tool, under a name unique in the catalog
//! (docs/agents.md, "Names").

use std::collections::{HashMap, HashSet};

use serde_json::{Map, Value};

/// Between a toolbox id and a tool name, in the name of a tool whose bare
/// name more than one toolbox owns: `math__add` (a name function-calling
/// APIs take: letters, digits, `_`, `-`). A toolbox id may hold `__`
/// itself, so a name is never split: the catalog keeps whose each one is.
pub const SEPARATOR: &str = "__";

/// One tool, as MCP names it and as the bus calls it.
#[derive(Debug, Clone, PartialEq)]
pub struct Entry {
    /// The toolbox that owns it (`toolbox_id` of the bus definition).
    pub toolbox: String,
    /// Its name on the bus.
    pub name: String,
    /// Its MCP tool definition (`name` is the unique one).
    pub definition: Value,
}

/// The tools of the bus, by their MCP names, in the bus's order.
#[derive(Debug, Default, PartialEq)]
pub struct Catalog {
    /// Every tool.
    entries: Vec<Entry>,
    /// MCP name → its place in `entries`.
    by_name: HashMap<String, usize>,
}

impl Catalog {
    /// The catalog of the bus definitions `tools` (an `ovos.tools.list`
    /// answer's `tools`). A tool whose name several toolboxes own is named
    /// `<toolbox>__<name>`, the others by their own name; definitions with
    /// no name or toolbox are left out, and so is a second tool that would
    /// take a name already taken.
    pub fn from_bus(tools: &[Value]) -> Catalog {
        let named = |t: &Value, key: &str| t.get(key).and_then(Value::as_str).map(str::to_owned);
        let mut owners: HashMap<String, HashSet<String>> = HashMap::new();
        for tool in tools {
            if let (Some(name), Some(toolbox)) = (named(tool, "name"), named(tool, "toolbox_id")) {
                owners.entry(name).or_default().insert(toolbox);
            }
        }
        let mut catalog = Catalog::default();
        for tool in tools {
            let (Some(name), Some(toolbox)) = (named(tool, "name"), named(tool, "toolbox_id"))
            else {
                continue;
            };
            let shared = owners.get(&name).is_some_and(|o| o.len() > 1);
            let unique = if shared {
                format!("{toolbox}{SEPARATOR}{name}")
            } else {
                name.clone()
            };
            if catalog.by_name.contains_key(&unique) {
                tracing::warn!(
                    toolbox = %toolbox,
                    tool = %name,
                    "a tool named {unique:?} is listed already; this one is left out"
                );
                continue;
            }
            let definition = mcp_definition(&unique, tool);
            catalog.by_name.insert(unique, catalog.entries.len());
            catalog.entries.push(Entry {
                toolbox,
                name,
                definition,
            });
        }
        catalog
    }

    /// The tool MCP calls `name`.
    pub fn get(&self, name: &str) -> Option<&Entry> {
        self.by_name.get(name).map(|&i| &self.entries[i])
    }

    /// Every MCP tool definition, for `tools/list`.
    pub fn definitions(&self) -> Vec<Value> {
        self.entries.iter().map(|e| e.definition.clone()).collect()
    }
}

/// The MCP tool definition of bus definition `tool`, named `name`: its
/// description, its argument schema as `inputSchema`, its output schema as
/// `outputSchema`, its annotations (and their `title`) when it has them.
fn mcp_definition(name: &str, tool: &Value) -> Value {
    let mut definition = Map::new();
    definition.insert("name".to_owned(), Value::from(name));
    if let Some(annotations) = tool.get("annotations").filter(|a| a.is_object()) {
        if let Some(title) = annotations.get("title").filter(|t| t.is_string()) {
            definition.insert("title".to_owned(), title.clone());
        }
        definition.insert("annotations".to_owned(), annotations.clone());
    }
    let description = tool
        .get("description")
        .and_then(Value::as_str)
        .unwrap_or("");
    definition.insert("description".to_owned(), Value::from(description));
    let input = tool
        .get("argument_schema")
        .filter(|s| s.is_object())
        .cloned()
        .unwrap_or_else(|| serde_json::json!({"type": "object"}));
    definition.insert("inputSchema".to_owned(), input);
    // MCP wants an object schema here; one for any other output is left out
    // (the result is still given, as text).
    if let Some(output) = tool
        .get("output_schema")
        .filter(|s| s.get("type").and_then(Value::as_str) == Some("object"))
    {
        definition.insert("outputSchema".to_owned(), output.clone());
    }
    Value::Object(definition)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn tool(toolbox: &str, name: &str) -> Value {
        json!({"name": name, "toolbox_id": toolbox, "description": format!("{name} of {toolbox}"),
               "argument_schema": {"type": "object", "properties": {"a": {"type": "integer"}}},
               "output_schema": {"type": "object", "properties": {"sum": {"type": "integer"}}}})
    }

    #[test]
    fn a_name_several_toolboxes_own_is_made_unique_with_its_toolbox() {
        let catalog = Catalog::from_bus(&[
            tool("math", "add"),
            tool("calc", "add"),
            tool("text", "shout"),
        ]);
        assert_eq!(catalog.definitions().len(), 3);
        let names: Vec<Value> = catalog
            .definitions()
            .iter()
            .map(|d| d["name"].clone())
            .collect();
        assert_eq!(
            names,
            [json!("math__add"), json!("calc__add"), json!("shout")]
        );
        let entry = catalog.get("calc__add").unwrap();
        assert_eq!(
            (entry.toolbox.as_str(), entry.name.as_str()),
            ("calc", "add")
        );
        assert!(catalog.get("add").is_none());
        assert_eq!(catalog.get("shout").unwrap().toolbox, "text");
    }

    #[test]
    fn a_definition_reads_as_mcp_wants_it() {
        let mut bus = tool("math", "add");
        bus["annotations"] = json!({"title": "Add", "readOnlyHint": true});
        let catalog = Catalog::from_bus(&[bus, json!({"name": "nameless"})]);
        assert_eq!(catalog.definitions().len(), 1);
        assert_eq!(
            catalog.get("add").unwrap().definition,
            json!({"name": "add", "title": "Add", "description": "add of math",
                   "annotations": {"title": "Add", "readOnlyHint": true},
                   "inputSchema": {"type": "object", "properties": {"a": {"type": "integer"}}},
                   "outputSchema": {"type": "object", "properties": {"sum": {"type": "integer"}}}})
        );
    }
}
