//! A toolbox's replicas (`instances = N`): each replica is an actor with its
//! own child; the toolbox's state in the registry is the best of theirs.

use std::sync::{Arc, Mutex};

use super::{Publish, State};
use crate::tool::ToolSet;

/// Collects what each replica publishes and gives the registry one state.
pub(super) struct Publisher {
    /// The toolbox's id in the registry.
    id: String,
    /// Where the aggregate goes (the registry, in the daemon).
    sink: Arc<dyn Publish>,
    /// Each replica's last state.
    states: Mutex<Vec<State>>,
}

/// How good a state is for serving: the toolbox shows its best replica's.
fn rank(state: &State) -> u8 {
    match state {
        State::Ready => 6,
        State::Idle => 5,
        State::Restarting { .. } => 4,
        State::Starting => 3,
        State::Failed { .. } => 2,
        State::Conflict { .. } => 1,
        State::Stopped => 0,
    }
}

impl Publisher {
    pub(super) fn new(id: &str, sink: Arc<dyn Publish>, replicas: usize) -> Arc<Publisher> {
        Arc::new(Publisher {
            id: id.to_owned(),
            sink,
            states: Mutex::new(vec![State::Starting; replicas]),
        })
    }

    /// Replica `index` is now in `state` (with a new tool list, if given).
    pub(super) fn publish(&self, index: usize, state: State, tools: Option<Arc<ToolSet>>) {
        let mut states = self.states.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(slot) = states.get_mut(index) {
            *slot = state;
        }
        let best = states
            .iter()
            .max_by_key(|s| rank(s))
            .cloned()
            .unwrap_or(State::Stopped);
        // Under the lock, so that two replicas' updates reach the registry in order.
        self.sink.set(&self.id, best, tools);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_toolbox_shows_its_best_replica() {
        assert!(
            rank(&State::Ready)
                > rank(&State::Restarting {
                    last_exit: String::new()
                })
        );
        assert!(
            rank(&State::Restarting {
                last_exit: String::new()
            }) > rank(&State::Starting)
        );
        assert!(
            rank(&State::Starting)
                > rank(&State::Failed {
                    reason: String::new()
                })
        );
        assert!(
            rank(&State::Failed {
                reason: String::new()
            }) > rank(&State::Stopped)
        );
    }
}
