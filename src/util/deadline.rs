//! A call's one deadline: the instant it ends, and the time it was given
//! (which the text of a timeout names). Computed once, when the call is
//! admitted; every wait of the call after that (for a start, a slot, the
//! child's answer) ends at the same instant.

use std::time::Duration;

use tokio::time::Instant;

/// When a call's time is up, and how long it had from its arrival.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Deadline {
    /// The instant every wait of the call ends.
    at: Instant,
    /// The time it was given from its arrival: what a timeout names.
    limit: Duration,
}

impl Deadline {
    /// `limit` after `arrived`.
    pub fn after(arrived: Instant, limit: Duration) -> Deadline {
        Deadline {
            at: arrived + limit,
            limit,
        }
    }

    /// The instant the call's time is up.
    pub fn at(&self) -> Instant {
        self.at
    }

    /// The time the call was given from its arrival.
    pub fn limit(&self) -> Duration {
        self.limit
    }

    /// The time left from now (zero once passed).
    pub fn left(&self) -> Duration {
        self.at.saturating_duration_since(Instant::now())
    }
}
