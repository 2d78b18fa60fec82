//! What is wrong with a manifest, and where: [`ManifestError`] (the file,
//! the line, the fix), and the reading that finds every wrong value of a
//! file in one pass rather than stopping at the first.

use std::fmt;
use std::path::PathBuf;

use super::RawManifest;

/// A manifest that cannot be used, and why.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub struct ManifestError {
    /// The file (or directory) at fault.
    pub path: PathBuf,
    /// 1-based line of the fault, when one line is to blame.
    pub line: Option<usize>,
    /// What is wrong, and what to do about it.
    pub message: String,
}

impl fmt::Display for ManifestError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The file's name and what the message quotes from it (a key, a
        // value, a path) may hold control characters: escaped, so that an
        // error is one line and cannot forge another.
        let text = match self.line {
            Some(line) => format!("{}:{}: {}", self.path.display(), line, self.message),
            None => format!("{}: {}", self.path.display(), self.message),
        };
        f.write_str(&crate::util::throttle::escape_controls(&text))
    }
}

/// The most problems one manifest is reported with.
pub const MAX_PROBLEMS: usize = 16;

/// The largest manifest read again for its further problems.
const REREAD_MAX_BYTES: usize = 64 * 1024;

/// The first of a manifest's problems (there is always one).
pub(super) fn first(mut problems: Vec<ManifestError>) -> ManifestError {
    // invariant: the parse fails only with at least one problem; an empty
    // list would still say something.
    if problems.is_empty() {
        return ManifestError {
            path: PathBuf::new(),
            line: None,
            message: "invalid manifest".to_owned(),
        };
    }
    problems.swap_remove(0)
}

/// The manifest's keys and values as typed, and the problems met reading
/// them (line, message). A wrong value (a word where a number goes, an
/// unknown key) is reported, its line blanked and the rest read again, so
/// that every such line is named, up to [`MAX_PROBLEMS`], and what remains
/// is returned to be checked further; bad TOML stops the reading at once
/// (what follows it cannot be read), and so does a required key blanked.
pub(super) fn read_raw(text: &str) -> (Option<RawManifest>, Vec<(Option<usize>, String)>) {
    let mut problems = Vec::new();
    let mut text = text.to_owned();
    let mut blanked: Vec<usize> = Vec::new();
    loop {
        let e = match toml::from_str::<RawManifest>(&text) {
            // With the wrong lines left out (their keys at their defaults):
            // the rest is still checked.
            Ok(raw) => return (Some(raw), in_order(problems)),
            Err(e) => e,
        };
        let line = e.span().map(|span| line_of_offset(&text, span.start));
        let message = e.message().trim().to_owned();
        // A key blanked for its wrong value is not also missing.
        if !blanked.is_empty() && message.starts_with("missing field") {
            return (None, in_order(problems));
        }
        let fix = if message.starts_with("unknown field") {
            "; remove the key or fix its spelling (see docs/manifest.md)"
        } else if message.starts_with("missing field") {
            "; add it (see docs/manifest.md)"
        } else {
            ""
        };
        problems.push((line, format!("{message}{fix}")));
        // Read again only what a manifest is (a few hundred bytes): a huge
        // file is not read sixteen times.
        if text.len() > REREAD_MAX_BYTES {
            return (None, problems);
        }
        let syntax = toml::from_str::<toml::Table>(&text).is_err();
        let Some(line) = line.filter(|l| !syntax && !blanked.contains(l)) else {
            return (None, in_order(problems));
        };
        if problems.len() >= MAX_PROBLEMS {
            return (None, in_order(problems));
        }
        blanked.push(line);
        text = text
            .split('\n')
            .enumerate()
            .map(|(i, l)| if i + 1 == line { "" } else { l })
            .collect::<Vec<_>>()
            .join("\n");
        // Blanking a line that opened a value over several lines breaks
        // the TOML: stop there.
        if toml::from_str::<toml::Table>(&text).is_err() {
            return (None, in_order(problems));
        }
    }
}

/// Problems in the order of their lines (serde finds unknown keys first).
fn in_order(mut problems: Vec<(Option<usize>, String)>) -> Vec<(Option<usize>, String)> {
    problems.sort_by_key(|(line, _)| line.unwrap_or(usize::MAX));
    problems
}

fn line_of_offset(text: &str, offset: usize) -> usize {
    text[..offset.min(text.len())].matches('\n').count() + 1
}

/// The line where `key = ...` is first written, for pointing at a bad value.
pub(super) fn line_of_key(text: &str, key: &str) -> Option<usize> {
    text.lines()
        .position(|line| {
            let line = line.trim_start();
            line.strip_prefix(key)
                .is_some_and(|rest| rest.trim_start().starts_with('='))
        })
        .map(|i| i + 1)
}
