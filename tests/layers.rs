//! The direction of the crate's dependencies (docs/architecture.md,
//! "Layers"): every module of `src/` (top-level, or one of a group
//! directory) sits in one layer below, and may use only modules of the
//! layers below its own. Every `crate::` path
//! counts, inline ones too (a third of the edges appear only inline, never
//! in a `use` block); comments do not. A new module must be placed here; a
//! back edge fails with the names that make it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The layers, from the top (what the binary starts) to the leaves. Modules
/// of one layer do not use each other.
const LAYERS: &[(&str, &[&str])] = &[
    (
        "commands",
        &["daemon", "cli::check", "cli::bus_request", "cli::scaffold"],
    ),
    ("faces", &["service", "control", "mcp_face"]),
    ("operator channel", &["operator"]),
    ("the call pipeline", &["pipeline"]),
    ("reporting and supervision", &["observe", "supervisor"]),
    ("the catalog", &["registry"]),
    ("one toolbox", &["toolbox"]),
    ("starting a child", &["launch"]),
    (
        "the MCP conversation, one call",
        &["session", "call", "ask"],
    ),
    ("one child process", &["process::child", "catalog_cache"]),
    (
        "confinement, tools, peers",
        &["process::sandbox", "tool", "peers"],
    ),
    (
        "foundations",
        &["bus", "process::keeper", "manifest", "process::proctree"],
    ),
    (
        "leaves",
        &[
            "protocol",
            "mcp",
            "cancel",
            "process::cgroup",
            "util::clock",
            "util::deadline",
            "util::files",
            "notify",
            "shutdown",
            "util::throttle",
            "util::or_never",
        ],
    ),
];

/// Directories of `src/` that group modules (their `mod.rs` only declares
/// them): each module in one is placed on its own, as `group::module`.
const GROUPS: &[&str] = &["process", "cli", "util"];

/// The modules of `src/` the layers place: the top-level ones, and those in
/// a group directory (not `lib.rs`, `main.rs`, a group's `mod.rs`).
fn modules(src: &Path) -> BTreeSet<String> {
    let mut modules = BTreeSet::new();
    for entry in std::fs::read_dir(src).unwrap() {
        let entry = entry.unwrap();
        let name = entry.file_name().into_string().unwrap();
        if GROUPS.contains(&name.as_str()) {
            for inner in std::fs::read_dir(entry.path()).unwrap() {
                let inner = inner.unwrap().file_name().into_string().unwrap();
                let inner = inner.strip_suffix(".rs").unwrap_or(&inner).to_owned();
                if inner != "mod" {
                    modules.insert(format!("{name}::{inner}"));
                }
            }
        } else if entry.file_type().unwrap().is_dir() {
            modules.insert(name);
        } else if let Some(stem) = name.strip_suffix(".rs") {
            if stem != "lib" && stem != "main" {
                modules.insert(stem.to_owned());
            }
        }
    }
    modules
}

/// The module a file of `src/` belongs to (`None`: the crate root, a
/// group's `mod.rs`).
fn module_of(relative: &Path) -> Option<String> {
    let parts: Vec<&str> = relative
        .components()
        .map(|c| c.as_os_str().to_str().unwrap())
        .collect();
    let stem = |part: &str| part.strip_suffix(".rs").unwrap_or(part).to_owned();
    match parts.as_slice() {
        ["lib.rs" | "main.rs"] => None,
        [group, "mod.rs"] if GROUPS.contains(group) => None,
        [group, inner, ..] if GROUPS.contains(group) => Some(format!("{group}::{}", stem(inner))),
        [first, ..] => Some(stem(first)),
        [] => None,
    }
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

/// The modules named by each `crate::` path in `code` (its first segment,
/// or its first two in a group), the names of a `crate::{a, b::c}` group
/// included.
fn crate_paths(code: &str) -> Vec<String> {
    let mut paths = Vec::new();
    let mut rest = code;
    while let Some(at) = rest.find("crate::") {
        rest = &rest[at + "crate::".len()..];
        full_paths_at(rest, &[], &mut paths);
    }
    paths
        .into_iter()
        .map(|path| match path.as_slice() {
            [group, inner, ..] if GROUPS.contains(&group.as_str()) => format!("{group}::{inner}"),
            [first, ..] => first.clone(),
            [] => String::new(),
        })
        .collect()
}

/// Which modules each module uses.
fn edges(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let modules = modules(src);
    let mut files = Vec::new();
    sources(src, &mut files);
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for file in files {
        let Some(from) = module_of(file.strip_prefix(src).unwrap()) else {
            continue;
        };
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
    assert_seen(
        &edges,
        &[
            ("daemon", "service"),
            ("service", "toolbox"),
            ("toolbox", "process::child"),
            ("process::child", "process::sandbox"),
        ],
    );
}

/// Fails unless every (from, to) is among `edges`: a scan that saw nothing
/// would pass every other check.
fn assert_seen(edges: &BTreeMap<String, BTreeSet<String>>, expected: &[(&str, &str)]) {
    for (from, to) in expected {
        assert!(
            edges.get(*from).is_some_and(|t| t.contains(*to)),
            "{from} -> {to} not seen"
        );
    }
}

#[test]
fn a_back_edge_is_named() {
    let mut edges = BTreeMap::new();
    edges.insert(
        "process::sandbox".to_owned(),
        BTreeSet::from(["process::child".to_owned()]),
    );
    edges.insert("service".to_owned(), BTreeSet::from(["control".to_owned()]));
    assert_eq!(
        back_edges(&edges),
        [
            "process::sandbox (confinement, tools, peers) uses process::child (one child process), which is above it",
            "service (faces) uses control (faces), which is beside it",
        ]
    );
}

#[test]
fn paths_are_read_inline_grouped_and_not_in_comments() {
    let text = "use crate::{bus::envelope::Message, tool, util::{clock, files::x}};\n\
                let x = crate::process::child::spawn(); // crate::daemon\n\
                /// [`crate::registry`]\n";
    assert_eq!(
        crate_paths(&code(text)),
        [
            "bus",
            "tool",
            "util::clock",
            "util::files",
            "process::child"
        ]
    );
    assert_eq!(
        module_of(Path::new("process/child/rpc.rs")).as_deref(),
        Some("process::child")
    );
    assert_eq!(
        module_of(Path::new("service/admission.rs")).as_deref(),
        Some("service")
    );
    assert_eq!(module_of(Path::new("util/mod.rs")), None);
}

/// The full paths (every segment) of the path or `{...}` group `text`
/// starts with, each after `prefix`.
fn full_paths_at(text: &str, prefix: &[String], into: &mut Vec<Vec<String>>) {
    let Some(group) = text.strip_prefix('{') else {
        let end = text
            .find(|c: char| !(c.is_alphanumeric() || c == '_'))
            .unwrap_or(text.len());
        let first = &text[..end];
        if first.is_empty() {
            return;
        }
        let mut path = prefix.to_vec();
        path.push(first.to_owned());
        match text[end..].strip_prefix("::") {
            Some(after) => full_paths_at(after, &path, into),
            None => into.push(path),
        }
        return;
    };
    let (mut depth, mut start) = (0, 0);
    for (i, c) in group.char_indices() {
        match c {
            '{' => depth += 1,
            '}' if depth == 0 => {
                full_paths_at(group[start..i].trim_start(), prefix, into);
                return;
            }
            '}' => depth -= 1,
            ',' if depth == 0 => {
                full_paths_at(group[start..i].trim_start(), prefix, into);
                start = i + 1;
            }
            _ => {}
        }
    }
}

/// The module path of a file of `src/` (`lib.rs`: the crate root, empty).
fn module_path(relative: &Path) -> Vec<String> {
    let mut parts: Vec<String> = relative
        .components()
        .map(|c| c.as_os_str().to_str().unwrap().to_owned())
        .collect();
    let last = parts.pop().unwrap();
    let stem = last.strip_suffix(".rs").unwrap();
    if !matches!(stem, "mod" | "lib" | "main") {
        parts.push(stem.to_owned());
    }
    parts
}

/// Whether a file holds only tests (`tests.rs`, or under a `tests/` directory).
fn is_tests(relative: &Path) -> bool {
    relative
        .components()
        .any(|c| matches!(c.as_os_str().to_str(), Some("tests" | "tests.rs")))
}

/// Which files of `src/` each file uses: every `crate::` and `super::` path
/// (inline ones too) resolved to the file of its longest module prefix.
/// Test code (test files, a `#[cfg(test)] mod tests` block) is left out.
fn file_edges(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let mut files = Vec::new();
    sources(src, &mut files);
    let by_module: BTreeMap<Vec<String>, String> = files
        .iter()
        .map(|f| {
            let relative = f.strip_prefix(src).unwrap();
            (module_path(relative), relative.display().to_string())
        })
        .collect();
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for file in &files {
        let relative = file.strip_prefix(src).unwrap();
        if is_tests(relative) {
            continue;
        }
        let name = relative.display().to_string();
        let text = code(&std::fs::read_to_string(file).unwrap());
        let text = match text.find("#[cfg(test)]\nmod tests {") {
            Some(at) => &text[..at],
            None => &text[..],
        };
        let own = module_path(relative);
        let mut paths = Vec::new();
        let mut rest = text;
        while let Some(at) = rest.find("crate::") {
            rest = &rest[at + "crate::".len()..];
            full_paths_at(rest, &[], &mut paths);
        }
        let mut rest = text;
        while let Some(at) = rest.find("super::") {
            // Only a path's first `super`: the others are read with it.
            let before = &rest[..at];
            rest = &rest[at..];
            if before.ends_with("super::") {
                rest = &rest["super::".len()..];
                continue;
            }
            let mut base = own.clone();
            while let Some(after) = rest.strip_prefix("super::") {
                base.pop();
                rest = after;
            }
            full_paths_at(rest, &base, &mut paths);
        }
        for path in paths {
            let target = (1..=path.len())
                .rev()
                .find_map(|n| by_module.get(&path[..n]));
            if let Some(target) = target {
                let target_path = Path::new(target);
                if *target != name && !is_tests(target_path) {
                    edges
                        .entry(name.clone())
                        .or_default()
                        .insert(target.clone());
                }
            }
        }
    }
    edges
}

/// The cycles of `edges` (strongly connected components of more than one
/// node), each sorted.
fn cycles(edges: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    // Two nodes are in one cycle when each reaches the other.
    let reach = |from: &String| {
        let mut seen = BTreeSet::new();
        let mut todo = vec![from.clone()];
        while let Some(node) = todo.pop() {
            for next in edges.get(&node).into_iter().flatten() {
                if seen.insert(next.clone()) {
                    todo.push(next.clone());
                }
            }
        }
        seen
    };
    let reached: BTreeMap<&String, BTreeSet<String>> =
        edges.keys().map(|node| (node, reach(node))).collect();
    let mut found: BTreeSet<Vec<String>> = BTreeSet::new();
    for (node, from_node) in &reached {
        let cycle: Vec<String> = from_node
            .iter()
            .filter(|other| reached.get(other).is_some_and(|r| r.contains(*node)))
            .cloned()
            .collect();
        if cycle.len() > 1 {
            found.insert(cycle);
        }
    }
    found.into_iter().collect()
}

#[test]
fn no_two_files_use_each_other_even_through_others() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let edges = file_edges(&src);
    let cycles = cycles(&edges);
    assert!(
        cycles.is_empty(),
        "files that use each other (through crate:: and super:: paths): {cycles:?}"
    );
    // Not vacuous: the scan sees super:: paths and inline crate:: paths.
    assert_seen(
        &edges,
        &[
            ("service/call.rs", "service/replies.rs"),
            ("pipeline/mod.rs", "toolbox/mod.rs"),
            ("pipeline/output.rs", "pipeline/texts.rs"),
        ],
    );
}

#[test]
fn a_file_cycle_is_found() {
    let mut edges = BTreeMap::new();
    edges.insert("a.rs".to_owned(), BTreeSet::from(["b.rs".to_owned()]));
    edges.insert("b.rs".to_owned(), BTreeSet::from(["c.rs".to_owned()]));
    edges.insert("c.rs".to_owned(), BTreeSet::from(["a.rs".to_owned()]));
    edges.insert("d.rs".to_owned(), BTreeSet::from(["a.rs".to_owned()]));
    assert_eq!(cycles(&edges), [["a.rs", "b.rs", "c.rs"]]);
}
