//! What a request to a child is owed: its result or why there is none
//! ([`RpcFailure`]), and what it keeps taken until the child is done with
//! it ([`Kept`]).

use super::ExitInfo;
use crate::mcp::RpcError;

/// Why a request to a child got no result.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum RpcFailure {
    /// The child answered with a JSON-RPC error.
    #[error("{}", .0.message)]
    Rpc(RpcError),
    /// The process ended before answering.
    #[error("exited ({0})")]
    Exited(ExitInfo),
    /// The child broke the protocol and is being killed.
    #[error("broke the protocol: {0}")]
    Broken(String),
    /// The deadline passed first; the child was told to cancel.
    #[error("did not answer in time")]
    TimedOut,
    /// A stop cancelled the call first; the child was told to cancel.
    #[error("cancelled by stop")]
    Cancelled,
    /// The request would be larger than the child's stdin may hold
    /// (`max_message_bytes`): it was not sent, and the child is not at fault.
    #[error("the request is {bytes} bytes, more than max_message_bytes ({limit}); the child was not sent it")]
    TooLarge { bytes: usize, limit: usize },
}

/// What a request keeps taken until the child is done with it, even past
/// its caller's deadline: for a call, its slot (the child is still working
/// on it). Held, never read; given back when dropped.
pub struct Kept {
    /// The value held.
    _held: Box<dyn Send>,
}

impl Kept {
    /// Keeps `held` until the request is over.
    pub fn new(held: impl Send + 'static) -> Kept {
        Kept {
            _held: Box::new(held),
        }
    }
}
