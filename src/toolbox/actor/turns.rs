//! The daemon-wide turns every toolbox's actor takes: at most
//! [`STARTS_AT_ONCE`] children starting at once, and at most
//! [`LISTINGS_AT_ONCE`] lazy toolboxes started only to list their tools.

use tokio::sync::{AcquireError, Semaphore, SemaphorePermit};

/// Children starting at once, daemon-wide, whatever starts them (the
/// daemon's start, a reload, a restart, a lazy toolbox's listing, a call or
/// a prewarm topic waking an idle toolbox): a client calling thirty idle
/// toolboxes at once does not start thirty interpreters on two cores, and a
/// cold start under load leaves each child the CPU to answer its handshake
/// in time. A start holds its turn from spawn until the child serves or
/// failed.
pub(super) const STARTS_AT_ONCE: usize = 4;

/// The turns of [`STARTS_AT_ONCE`] (never closed).
pub(super) static START_TURNS: Semaphore = Semaphore::const_new(STARTS_AT_ONCE);

/// Lazy toolboxes without a cached catalog started at once to list their
/// tools, daemon-wide: a device given many new lazy toolboxes starts a few
/// children at a time, not one per manifest at once (descriptors, memory
/// and CPU would run out).
pub(super) const LISTINGS_AT_ONCE: usize = 4;

/// The turns of [`LISTINGS_AT_ONCE`].
pub(super) static LISTING_TURNS: Semaphore = Semaphore::const_new(LISTINGS_AT_ONCE);

/// A lazy toolbox's turn to start once, held until that child stops or is
/// found in use (never `Err`: the semaphore is never closed).
pub(super) type ListingTurn = Result<SemaphorePermit<'static>, AcquireError>;
