//! `[annotations.<tool>]`: a tool's MCP annotations set or overridden by
//! its manifest, for toolboxes that declare none (a script, an OVOS
//! plugin): `title`, `readOnlyHint`, `destructiveHint`, `idempotentHint`,
//! `openWorldHint` (docs/manifest.md). They travel with the tool's
//! definition on the bus (docs/protocol.md, "Annotations").

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::{Map, Value};

use crate::mcp::{self, ToolSpec};

/// One tool's annotations as the manifest gives them: each key the manifest
/// sets wins over the child's.
#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Annotations {
    /// A human-readable title.
    pub title: Option<String>,
    /// The tool changes nothing.
    #[serde(rename = "readOnlyHint")]
    pub read_only_hint: Option<bool>,
    /// The tool may destroy or change things for good.
    #[serde(rename = "destructiveHint")]
    pub destructive_hint: Option<bool>,
    /// Calling it twice with the same arguments does nothing more.
    #[serde(rename = "idempotentHint")]
    pub idempotent_hint: Option<bool>,
    /// It reaches the world outside (the web, a device).
    #[serde(rename = "openWorldHint")]
    pub open_world_hint: Option<bool>,
}

/// The `[annotations]` table: tool name → its annotations.
#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
#[serde(transparent)]
pub struct ToolAnnotations(pub BTreeMap<String, Annotations>);

impl ToolAnnotations {
    /// Why the table cannot be used, if it cannot (a title past the bound).
    pub fn check(&self) -> Result<(), String> {
        for (tool, annotations) in &self.0 {
            if let Some(title) = &annotations.title {
                if title.len() > mcp::MAX_TITLE_BYTES {
                    return Err(format!(
                        "[annotations.{tool}] title is {} bytes; at most {} are kept",
                        title.len(),
                        mcp::MAX_TITLE_BYTES
                    ));
                }
            }
        }
        Ok(())
    }

    /// Applies the table to a listing: each key it sets replaces the
    /// child's.
    pub fn apply(&self, specs: &mut [ToolSpec]) {
        for spec in specs {
            let Some(set) = self.0.get(&spec.name) else {
                continue;
            };
            let mut annotations = match spec.annotations.take() {
                Some(Value::Object(annotations)) => annotations,
                _ => Map::new(),
            };
            let title = set.title.clone().map(Value::String);
            let hints = [
                ("title", title),
                ("readOnlyHint", set.read_only_hint.map(Value::Bool)),
                ("destructiveHint", set.destructive_hint.map(Value::Bool)),
                ("idempotentHint", set.idempotent_hint.map(Value::Bool)),
                ("openWorldHint", set.open_world_hint.map(Value::Bool)),
            ];
            for (key, value) in hints {
                if let Some(value) = value {
                    annotations.insert(key.to_owned(), value);
                }
            }
            spec.annotations = (!annotations.is_empty()).then_some(Value::Object(annotations));
        }
    }
}
