//! `--metrics`: the daemon's Prometheus metrics (docs/operations.md,
//! "Metrics"), served as text by [`server`].
//!
//! Calls are counted as they finish ([`Metrics::call_finished`], on the call
//! path: a read lock, two map lookups, atomic adds, no allocation once a tool
//! has been called). Everything else — toolbox states, calls in flight,
//! restarts, the bus connection, the process's memory and descriptors — is
//! read when scraped (`live`), so nothing else in the daemon reports to it.
//!
//! Series are bounded: labels are toolbox ids (from manifests), tool names
//! the catalog listed (never a name a caller sent) and fixed words; past
//! [`MAX_TOOL_SERIES`] (toolbox, tool) pairs, or [`MAX_TOOL_SERIES_PER_TOOLBOX`]
//! tools of one toolbox, further tools are counted under `tool=""`, so a
//! child that renames its tools without end cannot grow them, nor take the
//! other toolboxes' series.

mod live;
pub mod server;

use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue, LabelValueEncoder};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use tokio::sync::watch;

use crate::observe::ending::Ending;

/// Most (toolbox, tool) pairs with series of their own.
pub const MAX_TOOL_SERIES: usize = 1000;
/// Most tools of one toolbox with series of their own: a child that renames
/// its tools at every listing takes no other toolbox's share.
pub const MAX_TOOL_SERIES_PER_TOOLBOX: usize = 128;

/// Upper bounds of the call duration buckets, in seconds: from a relay's
/// fraction of a millisecond to the longest deadlines.
const DURATION_BUCKETS: [f64; 16] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
    60.0,
];

impl EncodeLabelValue for Ending {
    fn encode(&self, encoder: &mut LabelValueEncoder) -> Result<(), std::fmt::Error> {
        EncodeLabelValue::encode(&self.name(), encoder)
    }
}

/// Labels of `toolboxd_calls_total`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct CallLabels {
    toolbox: Arc<str>,
    tool: Arc<str>,
    outcome: Ending,
}

/// Labels of `toolboxd_call_duration_seconds`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ToolLabels {
    toolbox: Arc<str>,
    tool: Arc<str>,
}

/// One (toolbox, tool) pair's series, held for the call path.
struct ToolSeries {
    /// `toolboxd_calls_total`, one per [`Ending`] (in `Ending::ALL` order).
    calls: [Counter; Ending::ALL.len()],
    /// `toolboxd_call_duration_seconds`.
    duration: Histogram,
    /// `toolboxd_progress_messages_total`.
    progress: Counter,
}

/// The series of every (toolbox, tool) pair called so far.
#[derive(Default)]
struct SeriesTable {
    /// By toolbox, then tool: looked up with borrowed names.
    by_toolbox: HashMap<Arc<str>, HashMap<Arc<str>, Arc<ToolSeries>>>,
    /// Pairs with series of their own (the `tool=""` ones not counted).
    pairs: usize,
}

/// The daemon's metrics.
pub struct Metrics {
    /// What `/metrics` encodes: the families below and the scrape-time collector.
    registry: prometheus_client::registry::Registry,
    /// `toolboxd_calls_total{toolbox,tool,outcome}`.
    calls: Family<CallLabels, Counter>,
    /// `toolboxd_call_duration_seconds{toolbox,tool}`.
    durations: Family<ToolLabels, Histogram, fn() -> Histogram>,
    /// `toolboxd_progress_messages_total{toolbox,tool}`.
    progress: Family<ToolLabels, Counter>,
    /// The call path's handles into the families.
    series: RwLock<SeriesTable>,
    /// `toolboxd_audit_dropped_lines_total`.
    audit_dropped: Counter,
}

impl Metrics {
    /// The daemon's metrics: calls as they finish, and at each scrape the
    /// state of the toolboxes in `catalog` and of the bus connection.
    pub fn new(
        catalog: Arc<crate::registry::Registry>,
        bus_connected: watch::Receiver<bool>,
    ) -> Metrics {
        let mut registry = prometheus_client::registry::Registry::default();
        let calls = Family::<CallLabels, Counter>::default();
        let durations: Family<ToolLabels, Histogram, fn() -> Histogram> =
            Family::new_with_constructor(|| Histogram::new(DURATION_BUCKETS));
        let audit_dropped = Counter::default();
        let progress = Family::<ToolLabels, Counter>::default();
        registry.register(
            "toolboxd_progress_messages",
            "Progress messages relayed from children to callers, by toolbox and tool",
            progress.clone(),
        );
        registry.register(
            "toolboxd_calls",
            "Calls answered, by toolbox, tool and outcome",
            calls.clone(),
        );
        registry.register(
            "toolboxd_call_duration_seconds",
            "Time from a call's arrival to its answer, by toolbox and tool",
            durations.clone(),
        );
        registry.register(
            "toolboxd_audit_dropped_lines",
            "Audit log lines dropped because the writer was behind",
            audit_dropped.clone(),
        );
        registry.register_collector(Box::new(live::Live::new(catalog, bus_connected)));
        Metrics {
            registry,
            calls,
            durations,
            progress,
            series: RwLock::new(SeriesTable::default()),
            audit_dropped,
        }
    }

    /// Counts a finished call of `tool` in `toolbox`, which took `took`.
    pub fn call_finished(&self, toolbox: &str, tool: &str, outcome: Ending, took: Duration) {
        let series = self.series_of(toolbox, tool);
        if let Some(i) = Ending::ALL.iter().position(|&o| o == outcome) {
            series.calls[i].inc();
        }
        series.duration.observe(took.as_secs_f64());
    }

    /// Counts a progress message relayed for a call of `tool` in `toolbox`.
    pub fn progress_relayed(&self, toolbox: &str, tool: &str) {
        self.series_of(toolbox, tool).progress.inc();
    }

    /// Counts an audit line that was dropped.
    pub fn audit_line_dropped(&self) {
        self.audit_dropped.inc();
    }

    /// The series of (`toolbox`, `tool`), created on its first call; past
    /// [`MAX_TOOL_SERIES`] pairs, the toolbox's `tool=""` series.
    fn series_of(&self, toolbox: &str, tool: &str) -> Arc<ToolSeries> {
        {
            let table = self.series.read().unwrap_or_else(|e| e.into_inner());
            if let Some(found) = table.by_toolbox.get(toolbox).and_then(|t| t.get(tool)) {
                return found.clone();
            }
        }
        let mut table = self.series.write().unwrap_or_else(|e| e.into_inner());
        let own = table
            .by_toolbox
            .get(toolbox)
            .map_or(0, |tools| tools.len() - usize::from(tools.contains_key("")));
        let tool = if table.pairs < MAX_TOOL_SERIES && own < MAX_TOOL_SERIES_PER_TOOLBOX {
            tool
        } else {
            ""
        };
        let toolbox: Arc<str> = toolbox.into();
        let tools = table.by_toolbox.entry(toolbox.clone()).or_default();
        if let Some(found) = tools.get(tool) {
            return found.clone();
        }
        let tool: Arc<str> = tool.into();
        let series = Arc::new(self.new_series(&toolbox, &tool));
        tools.insert(tool.clone(), series.clone());
        if !tool.is_empty() {
            table.pairs += 1;
        }
        series
    }

    fn new_series(&self, toolbox: &Arc<str>, tool: &Arc<str>) -> ToolSeries {
        let calls = Ending::ALL.map(|outcome| {
            self.calls.get_or_create_owned(&CallLabels {
                toolbox: toolbox.clone(),
                tool: tool.clone(),
                outcome,
            })
        });
        let labels = ToolLabels {
            toolbox: toolbox.clone(),
            tool: tool.clone(),
        };
        let duration = self.durations.get_or_create_owned(&labels);
        let progress = self.progress.get_or_create_owned(&labels);
        ToolSeries {
            calls,
            duration,
            progress,
        }
    }

    /// Every metric in the Prometheus text format (version 0.0.4).
    pub fn encode(&self) -> String {
        let mut text = String::new();
        // Writing to a String does not fail; a collector's error would leave
        // a partial text, which Prometheus reports as a failed scrape.
        if let Err(e) =
            prometheus_client::encoding::prometheus_text::encode(&mut text, &self.registry)
        {
            tracing::warn!("encoding the metrics failed: {e}");
        }
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn metrics() -> Metrics {
        let (_, connected) = watch::channel(true);
        Metrics::new(Arc::default(), connected)
    }

    #[test]
    fn counts_calls_by_toolbox_tool_and_outcome_with_their_durations() {
        let m = metrics();
        m.call_finished("math", "add", Ending::Ok, Duration::from_millis(2));
        m.call_finished("math", "add", Ending::Ok, Duration::from_millis(3));
        m.call_finished("math", "add", Ending::Timeout, Duration::from_secs(40));
        m.audit_line_dropped();
        let text = m.encode();
        for line in [
            "toolboxd_calls_total{toolbox=\"math\",tool=\"add\",outcome=\"ok\"} 2",
            "toolboxd_calls_total{toolbox=\"math\",tool=\"add\",outcome=\"timeout\"} 1",
            "toolboxd_calls_total{toolbox=\"math\",tool=\"add\",outcome=\"busy\"} 0",
            "toolboxd_call_duration_seconds_bucket{toolbox=\"math\",tool=\"add\",le=\"0.0025\"} 1",
            "toolboxd_call_duration_seconds_bucket{toolbox=\"math\",tool=\"add\",le=\"0.005\"} 2",
            "toolboxd_call_duration_seconds_bucket{toolbox=\"math\",tool=\"add\",le=\"60\"} 3",
            "toolboxd_call_duration_seconds_bucket{toolbox=\"math\",tool=\"add\",le=\"+Inf\"} 3",
            "toolboxd_call_duration_seconds_count{toolbox=\"math\",tool=\"add\"} 3",
            "toolboxd_audit_dropped_lines_total 1",
            "toolboxd_bus_connected 1",
        ] {
            assert!(text.lines().any(|l| l == line), "no {line:?} in\n{text}");
        }
    }

    #[test]
    fn tool_series_are_bounded_per_toolbox_and_in_all() {
        let m = metrics();
        // One toolbox renaming its tools: its share, then `tool=""`.
        for i in 0..MAX_TOOL_SERIES_PER_TOOLBOX + 50 {
            m.call_finished("box", &format!("t{i}"), Ending::Ok, Duration::ZERO);
        }
        // Others keep theirs, up to the bound over all.
        let others = MAX_TOOL_SERIES - MAX_TOOL_SERIES_PER_TOOLBOX;
        for i in 0..others {
            let toolbox = format!("b{}", i / MAX_TOOL_SERIES_PER_TOOLBOX);
            m.call_finished(&toolbox, &format!("u{i}"), Ending::Ok, Duration::ZERO);
        }
        m.call_finished("other", "new", Ending::Error, Duration::ZERO);
        let text = m.encode();
        let counted = |tool: &str| {
            text.lines()
                .filter(|l| l.starts_with("toolboxd_calls_total{") && l.contains(tool))
                .count()
        };
        assert_eq!(counted("tool=\"t0\""), Ending::ALL.len());
        let first_cut = format!("tool=\"t{MAX_TOOL_SERIES_PER_TOOLBOX}\"");
        assert_eq!(counted(&first_cut), 0);
        assert!(text.contains("toolboxd_calls_total{toolbox=\"box\",tool=\"\",outcome=\"ok\"} 50"));
        assert_eq!(
            counted(&format!("tool=\"u{}\"", others - 1)),
            Ending::ALL.len()
        );
        assert!(
            text.contains("toolboxd_calls_total{toolbox=\"other\",tool=\"\",outcome=\"error\"} 1")
        );
    }
}
