//! The metrics read when scraped: each toolbox's state, calls in flight and
//! restarts (from the catalog and the toolboxes' counters), the bus
//! connection, and the process's own resident memory and open descriptors
//! (from /proc/self).

use std::sync::atomic::Ordering;
use std::sync::Arc;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use tokio::sync::watch;

use crate::toolbox::State;

/// Reads the daemon's state at each scrape.
pub(super) struct Live {
    /// The toolboxes, their states and counters.
    catalog: Arc<crate::registry::Registry>,
    /// Whether the bus connection is up.
    bus_connected: watch::Receiver<bool>,
}

impl std::fmt::Debug for Live {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Live")
    }
}

impl Live {
    pub(super) fn new(
        catalog: Arc<crate::registry::Registry>,
        bus_connected: watch::Receiver<bool>,
    ) -> Live {
        Live {
            catalog,
            bus_connected,
        }
    }
}

impl Collector for Live {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let catalog = self.catalog.snapshot();

        let mut states = encoder.encode_descriptor(
            "toolboxd_toolbox_state",
            "1 for the toolbox's current state, 0 for the others",
            None,
            MetricType::Gauge,
        )?;
        for (id, entry) in catalog.toolboxes() {
            for state in State::NAMES {
                let labels = [("toolbox", id.as_str()), ("state", state)];
                let value = i64::from(entry.state.name() == state);
                ConstGauge::new(value).encode(states.encode_family(&labels)?)?;
            }
        }

        let mut in_flight = encoder.encode_descriptor(
            "toolboxd_calls_in_flight",
            "Calls waiting for or running on the toolbox's children",
            None,
            MetricType::Gauge,
        )?;
        for (id, entry) in catalog.toolboxes() {
            let labels = [("toolbox", id.as_str())];
            let value = entry.handle.stats().in_flight.load(Ordering::Relaxed);
            ConstGauge::new(i64::try_from(value).unwrap_or(i64::MAX))
                .encode(in_flight.encode_family(&labels)?)?;
        }

        let mut restarts = encoder.encode_descriptor(
            "toolboxd_restarts",
            "Children replaced, by toolbox and reason",
            None,
            MetricType::Counter,
        )?;
        for (id, entry) in catalog.toolboxes() {
            for (reason, count) in entry.handle.stats().restarts_by_reason() {
                let labels = [("toolbox", id.as_str()), ("reason", reason.name())];
                ConstCounter::new(count).encode(restarts.encode_family(&labels)?)?;
            }
        }

        let connected = i64::from(*self.bus_connected.borrow());
        let bus = encoder.encode_descriptor(
            "toolboxd_bus_connected",
            "1 while the daemon's bus connection is up",
            None,
            MetricType::Gauge,
        )?;
        ConstGauge::new(connected).encode(bus)?;

        if let Some(bytes) = resident_memory_bytes() {
            let m = encoder.encode_descriptor(
                "process_resident_memory_bytes",
                "Resident memory size in bytes",
                None,
                MetricType::Gauge,
            )?;
            ConstGauge::new(i64::try_from(bytes).unwrap_or(i64::MAX)).encode(m)?;
        }
        if let Some(fds) = open_fds() {
            let m = encoder.encode_descriptor(
                "process_open_fds",
                "Number of open file descriptors",
                None,
                MetricType::Gauge,
            )?;
            ConstGauge::new(i64::try_from(fds).unwrap_or(i64::MAX)).encode(m)?;
        }
        Ok(())
    }
}

/// The daemon's resident set size (/proc/self/statm).
fn resident_memory_bytes() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    // SAFETY: sysconf only reads a configuration value.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    Some(pages * u64::try_from(page).ok().filter(|&p| p > 0)?)
}

/// The daemon's open descriptors (/proc/self/fd; the one reading it included).
fn open_fds() -> Option<usize> {
    Some(std::fs::read_dir("/proc/self/fd").ok()?.count())
}
