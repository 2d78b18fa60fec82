//! The `[start]` table: when a toolbox's child runs (docs/manifest.md). By
//! default it runs from the daemon's start to its stop; a lazy toolbox has
//! no child until its first call, and an idle one gives its child up after
//! a quiet spell.

use serde::Deserialize;

/// When the child is first started.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum StartMode {
    /// At the daemon's start (and after every reload that adds it).
    #[default]
    Eager,
    /// At its first call (or a `prewarm_on` topic); until then its tools are
    /// listed from the cached catalog (probed once when there is none).
    Lazy,
}

/// A validated `[start]` table.
#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Start {
    /// When the child is first started.
    pub mode: StartMode,
    /// A child with no call for this many seconds is stopped (drained); the
    /// next call starts it again. 0: never.
    pub idle_stop_s: u64,
    /// Bus topics that start the child ahead of its first call.
    pub prewarm_on: Vec<String>,
}

/// Most seconds `idle_stop_s` may say (a day).
pub const MAX_IDLE_STOP_S: u64 = 86_400;
/// Most `prewarm_on` topics, and the longest one.
pub const MAX_PREWARM_TOPICS: usize = 16;
const MAX_TOPIC_BYTES: usize = 256;

impl Start {
    /// Whether the child may be stopped while the toolbox stays listed
    /// (so its tool list is worth caching).
    pub fn on_demand(&self) -> bool {
        self.mode == StartMode::Lazy || self.idle_stop_s > 0
    }

    /// Checks the bounds; the key and the message when one is passed.
    pub(super) fn check(&self) -> Result<(), (&'static str, String)> {
        if self.idle_stop_s > MAX_IDLE_STOP_S {
            return Err((
                "idle_stop_s",
                format!(
                    "[start] idle_stop_s = {} must be between 0 and {MAX_IDLE_STOP_S}",
                    self.idle_stop_s
                ),
            ));
        }
        if self.prewarm_on.len() > MAX_PREWARM_TOPICS {
            return Err((
                "prewarm_on",
                format!(
                    "[start] prewarm_on names {} topics; at most {MAX_PREWARM_TOPICS}",
                    self.prewarm_on.len()
                ),
            ));
        }
        for topic in &self.prewarm_on {
            let printable = topic.chars().all(|c| !c.is_control() && !c.is_whitespace());
            if topic.is_empty() || topic.len() > MAX_TOPIC_BYTES || !printable {
                return Err((
                    "prewarm_on",
                    format!(
                        "[start] prewarm_on: {topic:?} is not a bus topic (1-{MAX_TOPIC_BYTES} \
                         bytes, no spaces or control characters), e.g. \
                         \"recognizer_loop:wakeword\""
                    ),
                ));
            }
            if topic.ends_with(".response") || crate::protocol::topics::answers_itself(topic) {
                return Err((
                    "prewarm_on",
                    format!(
                        "[start] prewarm_on: {topic:?} never starts a toolbox: toolboxd answers \
                         it itself, or it is an answer; name a topic that comes before the \
                         calls, e.g. \"recognizer_loop:wakeword\""
                    ),
                ));
            }
        }
        Ok(())
    }
}
