//! What the actor is doing between events ([`Mode`]), what callers and
//! status are shown of it ([`View`]), and what it acts on ([`Event`]).

use std::sync::Arc;

use super::super::running::Running;
use super::super::{Command, Serving, Slot, State};
use crate::process::child::{ChildEvent, ExitInfo};

/// What the actor is doing between events. The state status shows and the
/// slot calls look for are both derived from it ([`Mode::view`], [`Actor::show`]).
// One `Mode` per actor, moved between its states: boxing the large
// variant would buy nothing but an allocation per start.
#[allow(clippy::large_enum_variant)]
pub(super) enum Mode {
    /// A child serves calls.
    Serving(Running),
    /// The child went down; the next start is due at `until`.
    Backoff {
        /// When to start again.
        until: tokio::time::Instant,
        /// How the child ended, for status.
        last_exit: String,
    },
    /// Failed: calls fail at once; started again by an operator, or at `retry`.
    Failed {
        /// Why, for status and callers.
        reason: String,
        /// When the failed cool-down ends (`None`: the policy never restarts).
        retry: Option<tokio::time::Instant>,
    },
    /// Stopped by an operator or by `enabled = false`.
    Stopped,
    /// No child until a call or a prewarm topic asks for one (`[start]`).
    Idle,
}

/// What callers and status are shown: a [`Mode`], or `Starting` while a child
/// launches from stopped or failed.
#[derive(Clone, Copy)]
pub(super) enum View<'a> {
    Starting,
    Serving(&'a Arc<Serving>),
    Idle,
    /// A child starts for an idle toolbox: still listed (as `idle`), and
    /// callers wait for the child.
    Waking,
    Restarting(&'a str),
    Failed(&'a str),
    Stopped,
}

impl Mode {
    pub(super) fn view(&self) -> View<'_> {
        match self {
            Mode::Serving(running) => View::Serving(&running.serving),
            Mode::Backoff { last_exit, .. } => View::Restarting(last_exit),
            Mode::Failed { reason, .. } => View::Failed(reason),
            Mode::Stopped => View::Stopped,
            Mode::Idle => View::Idle,
        }
    }
}

/// Something the actor acts on: the one input of its loop.
pub(super) enum Event {
    /// An operator or the registry asks (`None`: every handle is gone).
    Command(Option<Command>),
    /// The serving child exited.
    Exited(ExitInfo),
    /// The serving child let too many calls in a row run past their deadline.
    Wedged,
    /// The serving child said something its owner acts on.
    Child(ChildEvent),
    /// Time for the serving child's liveness probe.
    Probe,
    /// Time for a tool-list refresh the child asked for earlier.
    RefreshDue,
    /// The backoff delay or the failed cool-down is over.
    Timer,
    /// A caller or a prewarm topic asks an idle toolbox for a child.
    Wake,
    /// The serving child may have been idle for `idle_stop_s`.
    IdleCheck,
    /// A lazy toolbox's turn to start once and list its tools.
    ListingTurn(super::turns::ListingTurn),
}

impl View<'_> {
    /// What `self` reads as: the toolbox's state (status) and the slot
    /// callers find.
    pub(super) fn published(self) -> (State, Slot) {
        match self {
            View::Starting => (State::Starting, Slot::Waiting),
            View::Serving(serving) => (State::Ready, Slot::Serving(serving.clone())),
            View::Restarting(last_exit) => (
                State::Restarting {
                    last_exit: last_exit.to_owned(),
                },
                Slot::Waiting,
            ),
            View::Failed(reason) => (
                State::Failed {
                    reason: reason.to_owned(),
                },
                Slot::Failed(reason.to_owned()),
            ),
            View::Stopped => (State::Stopped, Slot::Stopped),
            View::Idle => (State::Idle, Slot::Idle),
            View::Waking => (State::Idle, Slot::Waiting),
        }
    }
}
