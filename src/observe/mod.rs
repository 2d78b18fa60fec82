//! What a finished call tells the operator: how it ended ([`ending`]), and
//! the one place the call pipeline reports it ([`Observer::call_finished`]) to the
//! sinks below it, each when enabled: the [`metrics`] (Prometheus,
//! `--metrics`) and the [`audit`] log (`--audit-log`).

use std::sync::Arc;

use audit::Audit;
use metrics::Metrics;

pub mod audit;
pub mod ending;
pub mod metrics;

pub use ending::{Ending, Finished};

/// Where finished calls are reported: the metrics and the audit log, each
/// only when the daemon was asked for it. Cheap to clone.
#[derive(Clone, Default)]
pub struct Observer {
    /// `--metrics`: the calls counters and duration histograms.
    metrics: Option<Arc<Metrics>>,
    /// `--audit-log`: a line per call.
    audit: Option<Arc<Audit>>,
}

impl Observer {
    /// An observer reporting to `metrics` and `audit`, each when given.
    pub fn new(metrics: Option<Arc<Metrics>>, audit: Option<Arc<Audit>>) -> Observer {
        Observer { metrics, audit }
    }

    /// Whether an audit log is written: a call whose toolbox says
    /// `audit_arguments = true` then keeps its arguments for it.
    pub fn audits(&self) -> bool {
        self.audit.is_some()
    }

    /// Reports a progress message relayed for a call of `tool` in `toolbox`.
    pub fn progress_relayed(&self, toolbox: &str, tool: &str) {
        if let Some(metrics) = &self.metrics {
            metrics.progress_relayed(toolbox, tool);
        }
    }

    /// Reports a finished call.
    pub fn call_finished(&self, call: &Finished<'_>) {
        if let Some(metrics) = &self.metrics {
            metrics.call_finished(call.toolbox, call.tool, call.outcome, call.took);
        }
        if let Some(audit) = &self.audit {
            if !audit.record(call) {
                if let Some(metrics) = &self.metrics {
                    metrics.audit_line_dropped();
                }
            }
        }
    }
}
