//! The direction of the crate's dependencies (docs/architecture.md,
//! "Layers"): every top-level module of `src/` sits in one layer below, and
//! may use only modules of the layers below its own. Every `crate::` path
//! counts, inline ones too (a third of the edges appear only inline, never
//! in a `use` block); comments do not. A new module must be placed here; a
//! back edge fails with the names that make it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The layers, from the top (what the binary starts) to the leaves. Modules
/// of one layer do not use each other.
const LAYERS: &[(&str, &[&str])] = &[
    ("commands", &["daemon", "check", "caller", "scaffold"]),
    ("faces", &["service", "control"]),
    ("operator channel", &["operator", "progress"]),
    ("reporting and supervision", &["observe", "supervisor"]),
    ("the catalog and its wording", &["registry", "answers"]),
    ("one toolbox", &["toolbox"]),
    ("starting a child", &["launch"]),
    ("the MCP conversation", &["session"]),
    ("one child process", &["child", "catalog_cache"]),
    ("confinement, tools, peers", &["sandbox", "tool", "peers"]),
    ("foundations", &["bus", "keeper", "manifest", "proctree"]),
    (
        "leaves",
        &[
            "protocol", "mcp", "cancel", "cgroup", "clock", "files", "notify", "shutdown",
            "throttle", "wait",
        ],
    ),
];

/// The top-level modules of `src/` (files and directories; not `lib.rs`,
/// `main.rs`).
fn modules(src: &Path) -> BTreeSet<String> {
    std::fs::read_dir(src)
        .unwrap()
        .filter_map(|entry| {
            let entry = entry.unwrap();
            let name = entry.file_name().into_string().unwrap();
            if entry.file_type().unwrap().is_dir() {
                Some(name)
            } else {
                let stem = name.strip_suffix(".rs")?;
                (stem != "lib" && stem != "main").then(|| stem.to_owned())
            }
        })
        .collect()
}

/// Every `.rs` file under `dir`.
fn sources(dir: &Path, into: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            sources(&path, into);
        } else if path.extension().is_some_and(|e| e == "rs") {
            into.push(path);
        }
    }
}

/// The text of a source file without its comments (`//` to the end of the
/// line: doc links are not dependencies).
fn code(text: &str) -> String {
    text.lines()
        .map(|line| match line.find("//") {
            Some(at) => &line[..at],
            None => line,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The first path segment after each `crate::` in `code`, the names of a
/// `crate::{a, b::c}` group included.
fn crate_paths(code: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut rest = code;
    while let Some(at) = rest.find("crate::") {
        rest = &rest[at + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            // Top-level names of the group, up to its closing brace.
            let (mut depth, mut item) = (0, String::new());
            for c in group.chars() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => names.push(std::mem::take(&mut item)),
                    _ if depth == 0 => item.push(c),
                    _ => {}
                }
            }
            names.push(item);
        } else {
            names.push(rest.to_owned());
        }
    }
    names
        .iter()
        .filter_map(|name| {
            let name = name.trim_start();
            let end = name
                .find(|c: char| !(c.is_alphanumeric() || c == '_'))
                .unwrap_or(name.len());
            (end > 0).then(|| name[..end].to_owned())
        })
        .collect()
}

/// Which top-level modules each top-level module uses.
fn edges(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let modules = modules(src);
    let mut files = Vec::new();
    sources(src, &mut files);
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for file in files {
        let relative = file.strip_prefix(src).unwrap();
        let first = relative.components().next().unwrap();
        let first = first.as_os_str().to_str().unwrap();
        let from = first.strip_suffix(".rs").unwrap_or(first).to_owned();
        if from == "lib" || from == "main" {
            continue;
        }
        let text = std::fs::read_to_string(&file).unwrap();
        for to in crate_paths(&code(&text)) {
            if to != from && modules.contains(&to) {
                edges.entry(from.clone()).or_default().insert(to);
            }
        }
    }
    edges
}

fn layer_of(module: &str) -> Option<usize> {
    LAYERS
        .iter()
        .position(|(_, members)| members.contains(&module))
}

/// Every edge that does not go down, as "A (layer) uses B (layer)".
fn back_edges(edges: &BTreeMap<String, BTreeSet<String>>) -> Vec<String> {
    let mut wrong = Vec::new();
    for (from, tos) in edges {
        for to in tos {
            if let (Some(a), Some(b)) = (layer_of(from), layer_of(to)) {
                if b <= a {
                    wrong.push(format!(
                        "{from} ({}) uses {to} ({}), which is {} it",
                        LAYERS[a].0,
                        LAYERS[b].0,
                        if a == b { "beside" } else { "above" }
                    ));
                }
            }
        }
    }
    wrong
}

#[test]
fn every_module_is_in_a_layer_and_uses_only_the_layers_below() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let unplaced: Vec<String> = modules(&src)
        .into_iter()
        .filter(|m| layer_of(m).is_none())
        .collect();
    assert!(
        unplaced.is_empty(),
        "modules in no layer of tests/layers.rs: {unplaced:?}: place each where what it uses is below it"
    );
    let edges = edges(&src);
    let wrong = back_edges(&edges);
    assert!(
        wrong.is_empty(),
        "dependencies against the layers (tests/layers.rs, docs/architecture.md):\n  {}",
        wrong.join("\n  ")
    );
    // Not vacuous: the scan sees the call path's edges, inline ones too.
    for (from, to) in [
        ("daemon", "service"),
        ("service", "toolbox"),
        ("toolbox", "child"),
    ] {
        assert!(
            edges.get(from).is_some_and(|t| t.contains(to)),
            "{from} -> {to} not seen"
        );
    }
}

#[test]
fn a_back_edge_is_named() {
    let mut edges = BTreeMap::new();
    edges.insert("sandbox".to_owned(), BTreeSet::from(["child".to_owned()]));
    edges.insert("service".to_owned(), BTreeSet::from(["control".to_owned()]));
    assert_eq!(
        back_edges(&edges),
        [
            "sandbox (confinement, tools, peers) uses child (one child process), which is above it",
            "service (faces) uses control (faces), which is beside it",
        ]
    );
}

#[test]
fn paths_are_read_inline_grouped_and_not_in_comments() {
    let text = "use crate::{bus::envelope::Message, tool};\n\
                let x = crate::child::spawn(); // crate::daemon\n\
                /// [`crate::registry`]\n";
    assert_eq!(crate_paths(&code(text)), ["bus", "tool", "child"]);
}
