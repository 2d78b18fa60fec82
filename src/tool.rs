//! A tool as toolboxd checks it: the bus definition built once, and the
//! compiled JSON Schema validators for its arguments and its output.
//!
//! The schemas are compiled when a child lists its tools (a tool whose
//! schema does not compile is left out), and again at a tool's first call,
//! kept from then on; used by the bus side to check arguments before a
//! child sees them and results before a caller does.

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

use serde_json::value::RawValue;
use serde_json::{json, Value};

use crate::mcp::{self, ToolSpec};

/// Most schema violations quoted in one error message.
const MAX_REPORTED_VIOLATIONS: usize = 5;

/// One tool: its definition, and its validators once it is called.
pub struct Tool {
    /// The tool's name, unique inside its toolbox.
    pub name: String,
    /// The bus definition (OVOS-TOOLS-1 §3), serialized once: the list
    /// splices it as it is, and as text it takes a tenth of the memory of a
    /// JSON tree (10,000 idle toolboxes keep theirs).
    definition: Box<RawValue>,
    /// Whether the child declared an output schema (else the generic one applies).
    pub has_output_schema: bool,
    /// Its schemas compiled, at its first call: a tool never called (most
    /// of an idle toolbox's) keeps no validator. (They compiled when it was
    /// listed, or it would not be.)
    validators: OnceLock<Result<Validators, String>>,
}

/// A tool's compiled schemas.
struct Validators {
    /// The argument schema: checked before the child sees anything.
    arguments: jsonschema::Validator,
    /// The output schema: a result that fails it is never passed on.
    /// Shared by every tool without an output schema of its own.
    output: Arc<jsonschema::Validator>,
}

impl Validators {
    /// Compiles `input` and `output` (`None`: the generic output schema).
    /// The error says which schema and why.
    fn compile(input: &Value, output: Option<&Value>) -> Result<Validators, String> {
        let arguments = validator(input).map_err(|e| format!("its inputSchema {e}"))?;
        let output = match output {
            Some(schema) => {
                Arc::new(validator(schema).map_err(|e| format!("its outputSchema {e}"))?)
            }
            None => generic_output()?,
        };
        Ok(Validators { arguments, output })
    }
}

/// Most values one `enum` of a tool's schema may list: every call's value
/// is compared with each, on the bus's path.
pub const MAX_ENUM_VALUES: usize = 4096;

/// Compiles `schema` so that checking a value against it takes time linear
/// in the value: `pattern`s run on the `regex` crate's engine (no
/// backtracking; a pattern it cannot express, with look-around or
/// back-references, is refused here with the reason), and no `enum` lists
/// more than [`MAX_ENUM_VALUES`] values.
pub fn validator(schema: &Value) -> Result<jsonschema::Validator, String> {
    if let Some(n) = largest_enum(schema, 0).filter(|&n| n > MAX_ENUM_VALUES) {
        return Err(format!(
            "has an enum of {n} values; at most {MAX_ENUM_VALUES} are accepted (every call is \
             compared with each)"
        ));
    }
    jsonschema::options()
        // A compiled pattern of at most 256 KiB: what matching may cost
        // grows with it.
        .with_pattern_options(jsonschema::PatternOptions::regex().size_limit(256 * 1024))
        .build(schema)
        .map_err(|e| {
            // Where in the schema: a misspelt type deep in it is found at once.
            let at = e.instance_path().to_string();
            let at = if at.is_empty() {
                String::new()
            } else {
                format!(" at {at}")
            };
            format!(
                "does not compile{at}: {e} (patterns use the regex crate's syntax: no \
                 look-around or back-references)"
            )
        })
}

/// The most values any `enum` in `schema` lists (schemas nest at most as
/// deep as a bus message's JSON: [`crate::bus`] bounds that).
fn largest_enum(schema: &Value, depth: usize) -> Option<usize> {
    if depth > 256 {
        return None;
    }
    match schema {
        Value::Object(map) => {
            let own = map.get("enum").and_then(Value::as_array).map(Vec::len);
            map.values()
                .filter_map(|v| largest_enum(v, depth + 1))
                .chain(own)
                .max()
        }
        Value::Array(items) => items
            .iter()
            .filter_map(|v| largest_enum(v, depth + 1))
            .max(),
        _ => None,
    }
}

impl std::fmt::Debug for Tool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tool").field("name", &self.name).finish()
    }
}

impl Tool {
    /// One of its annotations (`destructiveHint`, `title`, ...), as its
    /// definition on the bus carries it (the manifest's over the child's).
    /// Read from the kept text: only a call that asks needs it.
    pub fn annotation(&self, key: &str) -> Option<Value> {
        #[derive(serde::Deserialize)]
        struct Annotated {
            annotations: Option<serde_json::Map<String, Value>>,
        }
        let read: Annotated = serde_json::from_str(self.definition.get()).ok()?;
        read.annotations?.remove(key)
    }

    /// What to call it when speaking to a person: its `title`, else its name.
    pub fn title(&self) -> String {
        match self.annotation("title") {
            Some(Value::String(title)) if !title.trim().is_empty() => title,
            _ => self.name.clone(),
        }
    }

    /// Compiles a listed tool's schemas. The error says which schema and why.
    pub fn compile(toolbox_id: &str, spec: ToolSpec) -> Result<Tool, String> {
        if !valid_name(&spec.name) {
            return Err(
                "its name is not 1-128 characters of A-Z a-z 0-9 _ - . (the MCP tool-name \
                 rule; control characters and look-alike Unicode could forge a log line or \
                 mislead a reader)"
                    .to_owned(),
            );
        }
        let has_output_schema = spec.output_schema.is_some();
        // Compiled to know they compile; kept only from the first call on.
        Validators::compile(&spec.input_schema, spec.output_schema.as_ref())?;
        let output_schema = spec
            .output_schema
            .unwrap_or_else(mcp::generic_output_schema);
        let mut definition = json!({
            "name": spec.name,
            "description": spec.description,
            "argument_schema": spec.input_schema,
            "output_schema": output_schema,
            "toolbox_id": toolbox_id,
        });
        // Beside the five fields, only when the tool has any (docs/protocol.md).
        if let Some(annotations) = spec.annotations {
            definition["annotations"] = annotations;
        }
        let definition = serde_json::value::to_raw_value(&definition)
            .map_err(|e| format!("its definition does not serialize: {e}"))?;
        Ok(Tool {
            name: spec.name,
            definition,
            has_output_schema,
            validators: OnceLock::new(),
        })
    }

    /// Compiles its validators now, if not yet (they are kept).
    pub fn prepare(&self) -> Result<(), String> {
        self.validators().map(|_| ())
    }

    /// Its validators, compiled on first use.
    fn validators(&self) -> Result<&Validators, String> {
        self.validators
            .get_or_init(|| {
                let definition = self.definition();
                let output = &definition["output_schema"];
                Validators::compile(
                    &definition["argument_schema"],
                    self.has_output_schema.then_some(output),
                )
            })
            .as_ref()
            .map_err(Clone::clone)
    }

    /// The bus definition, serialized.
    pub fn definition_json(&self) -> &str {
        self.definition.get()
    }

    /// The bus definition, as a JSON tree (for the rare topics that send
    /// one tool's, or each toolbox's, definitions on their own).
    pub fn definition(&self) -> Value {
        // invariant: the text was serialized from a JSON value here.
        serde_json::from_str(self.definition.get()).unwrap_or(Value::Null)
    }

    /// Checks call arguments; the error lists failing JSON Pointers and reasons.
    pub fn check_arguments(&self, args: &Value) -> Result<(), String> {
        violations(&self.validators()?.arguments, args)
    }

    /// Checks a result against the output schema.
    pub fn check_output(&self, result: &Value) -> Result<(), String> {
        violations(&self.validators()?.output, result)
    }
}

/// The generic output schema's validator, compiled once and shared: a tool
/// without an output schema costs no validator of its own.
fn generic_output() -> Result<Arc<jsonschema::Validator>, String> {
    static GENERIC: OnceLock<Arc<jsonschema::Validator>> = OnceLock::new();
    if let Some(shared) = GENERIC.get() {
        return Ok(shared.clone());
    }
    let compiled = validator(&mcp::generic_output_schema())
        .map_err(|e| format!("the generic output schema {e}"))?;
    Ok(GENERIC.get_or_init(|| Arc::new(compiled)).clone())
}

/// The MCP tool-name rule: 1-128 characters of A-Z a-z 0-9 `_` `-` `.`.
pub fn valid_name(name: &str) -> bool {
    (1..=128).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
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
    /// What the definitions take serialized: what they add to an
    /// `ovos.tools.list` answer, which must fit in one bus message.
    bytes: usize,
}

/// Most bytes one toolbox's tool definitions may take on the bus: half the
/// bus's message limit, so one toolbox cannot fill an `ovos.tools.list`
/// answer on its own.
pub const MAX_TOOLBOX_BYTES: usize = crate::bus::MAX_FRAME_BYTES / 2;

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
            set.bytes += tool.definition_json().len();
            set.tools.push(Arc::new(tool));
        }
        (set, dropped)
    }

    /// Whether the definitions fit in [`MAX_TOOLBOX_BYTES`]; if not, why.
    pub fn fits_on_the_bus(&self) -> Result<(), String> {
        if self.bytes <= MAX_TOOLBOX_BYTES {
            return Ok(());
        }
        Err(format!(
            "its tool definitions take {} bytes on the bus, more than one toolbox may \
             ({MAX_TOOLBOX_BYTES}, half the bus's message limit); list fewer or smaller tools",
            self.bytes
        ))
    }

    /// Compiles listed tools into a set; also returns why each tool left out
    /// was (a schema that does not compile, a name listed twice).
    pub fn compile(toolbox_id: &str, specs: Vec<ToolSpec>) -> (ToolSet, Vec<String>) {
        let mut problems = Vec::new();
        let tools = specs
            .into_iter()
            .filter_map(|spec| {
                let name = spec.name.clone();
                Tool::compile(toolbox_id, spec)
                    .map_err(|why| problems.push(format!("tool {name:?}: {why}")))
                    .ok()
            })
            .collect();
        let (set, dropped) = ToolSet::new(tools);
        problems.extend(
            dropped
                .into_iter()
                .map(|name| format!("tool {name:?}: its name is listed twice")),
        );
        (set, problems)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_schema_that_does_not_compile_is_said_with_where() {
        let spec = ToolSpec {
            name: "t".into(),
            description: String::new(),
            input_schema: json!({"type": "object",
                                 "properties": {"when": {"type": "integr"}}}),
            output_schema: None,
            annotations: None,
        };
        let why = Tool::compile("box", spec).unwrap_err();
        assert!(why.contains("at /properties/when/type"), "{why}");
    }

    #[test]
    fn patterns_run_without_backtracking_and_large_enums_are_refused() {
        // Nested quantifiers: exponential for a backtracking engine on a
        // near miss; linear here, and answered.
        let evil = validator(&serde_json::json!({"type": "string", "pattern": "^(a|aa)+$"}))
            .expect("compiles");
        assert!(!evil.is_valid(&Value::String(format!("{}!", "a".repeat(40)))));
        assert!(evil.is_valid(&Value::String("a".repeat(40))));
        // What the regex crate cannot express is refused, saying why.
        let lookahead = validator(&serde_json::json!({"pattern": "^(?=a)a$"})).unwrap_err();
        assert!(lookahead.contains("does not compile"), "{lookahead}");
        assert!(lookahead.contains("look-around"), "{lookahead}");
        let values: Vec<Value> = (0..=MAX_ENUM_VALUES)
            .map(|n| Value::from(n as u64))
            .collect();
        let deep = serde_json::json!({"properties": {"x": {"items": {"enum": values}}}});
        let err = validator(&deep).unwrap_err();
        assert!(
            err.contains(&format!("enum of {} values", MAX_ENUM_VALUES + 1)),
            "{err}"
        );
        let fits: Vec<Value> = values[..MAX_ENUM_VALUES].to_vec();
        assert!(validator(&serde_json::json!({"enum": fits})).is_ok());
    }

    #[test]
    fn tool_names_follow_the_mcp_rule() {
        for good in ["add", "get_current_time", "a.b-c_9", &"x".repeat(128)] {
            assert!(valid_name(good), "{good}");
        }
        for bad in [
            "",
            "a b",
            "evil\nline",
            "rtl\u{202E}txt",
            "ü",
            &"x".repeat(129),
        ] {
            assert!(!valid_name(bad), "{bad:?}");
        }
    }

    fn tool(schema: Value) -> Tool {
        Tool::compile(
            "math",
            ToolSpec {
                name: "add".into(),
                description: "Add.".into(),
                input_schema: schema,
                output_schema: None,
                annotations: None,
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
                annotations: None,
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
        assert_eq!(
            t.definition()["output_schema"]["title"],
            "AdapterToolOutput"
        );
    }

    fn spec(name: &str, description: &str, input: Value, output: Option<Value>) -> ToolSpec {
        ToolSpec {
            name: name.into(),
            description: description.into(),
            input_schema: input,
            output_schema: output,
            annotations: None,
        }
    }

    #[test]
    fn definition_carries_the_spec_and_the_declared_output_schema() {
        let output = json!({"type": "object", "required": ["sum"],
            "properties": {"sum": {"type": "integer"}}});
        let t = Tool::compile(
            "math",
            spec(
                "add",
                "Add.",
                json!({"type": "object"}),
                Some(output.clone()),
            ),
        )
        .unwrap();
        assert_eq!(t.name, "add");
        assert!(t.has_output_schema);
        assert_eq!(
            t.definition(),
            json!({"name": "add", "description": "Add.",
                   "argument_schema": {"type": "object"},
                   "output_schema": output, "toolbox_id": "math"})
        );
        assert!(!tool(json!({})).has_output_schema);
        assert_eq!(format!("{t:?}"), "Tool { name: \"add\" }");
    }

    #[test]
    fn output_is_checked_against_the_declared_schema() {
        let t = Tool::compile(
            "math",
            spec(
                "add",
                "",
                json!({}),
                Some(json!({"type": "object", "required": ["sum"],
                    "properties": {"sum": {"type": "integer"}}})),
            ),
        )
        .unwrap();
        assert_eq!(t.check_output(&json!({"sum": 5})), Ok(()));
        assert_eq!(
            t.check_output(&json!({"sum": "5"})),
            Err("/sum: \"5\" is not of type \"integer\"".to_owned())
        );
        let e = t.check_output(&json!({})).unwrap_err();
        assert!(e.starts_with("/: ") && e.contains("\"sum\""), "{e}");
        // The generic schema still refuses what the adapter could not produce.
        assert!(tool(json!({}))
            .check_output(&json!({"content": 1}))
            .unwrap_err()
            .starts_with("/content: "));
    }

    #[test]
    fn at_most_five_violations_are_quoted() {
        let t = tool(json!({"type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"},
                "c": {"type": "integer"}, "d": {"type": "integer"},
                "e": {"type": "integer"}, "f": {"type": "integer"}}}));
        let e = t
            .check_arguments(&json!({"a": "x", "b": "x", "c": "x", "d": "x", "e": "x", "f": "x"}))
            .unwrap_err();
        assert_eq!(e.split("; ").count(), MAX_REPORTED_VIOLATIONS, "{e}");
    }

    #[test]
    fn a_set_keeps_what_compiles_in_listing_order_and_says_why_the_rest_left() {
        let object = || json!({"type": "object"});
        let (set, problems) = ToolSet::compile(
            "math",
            vec![
                spec("add", "first", object(), None),
                spec("bad_in", "", json!({"type": 12}), None),
                spec("add", "second", object(), None),
                spec("bad_out", "", object(), Some(json!({"type": 12}))),
                spec("mul", "", object(), None),
            ],
        );
        let names: Vec<&str> = set.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names, ["add", "mul"]);
        assert_eq!(set.len(), 2);
        assert!(!set.is_empty());
        assert_eq!(set.get("add").unwrap().definition()["description"], "first");
        assert_eq!(set.get("mul").unwrap().name, "mul");
        assert!(set.get("bad_in").is_none() && set.get("nope").is_none());
        assert_eq!(problems.len(), 3, "{problems:?}");
        assert!(
            problems[0].starts_with("tool \"bad_in\": its inputSchema does not compile at /type: ")
        );
        assert!(problems[1]
            .starts_with("tool \"bad_out\": its outputSchema does not compile at /type: "));
        assert_eq!(problems[2], "tool \"add\": its name is listed twice");

        let (empty, problems) = ToolSet::compile("math", Vec::new());
        assert!(empty.is_empty() && problems.is_empty());
        assert_eq!(empty.len(), 0);
        assert_eq!(empty.iter().count(), 0);
    }
}
