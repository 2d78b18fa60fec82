//! A link over in-memory pipes (tests only): what the link's own tests and
//! the stand-in child (`process/child/stand_in.rs`) play the child through.

use tokio::sync::{mpsc, watch};

use super::{read_stdout, write_stdin, ChildEvent, ExitInfo, Kill, Link, RpcHandle};

/// A link over in-memory pipes, for the tests of what uses a child: the
/// link and its stdin writer and stdout reader, as a spawned child's get,
/// and the child's ends of the pipes. `max` bounds both the child's stdin
/// and its lines; `pipe` is the size of its stdin pipe.
pub(in crate::process::child) struct OverPipes {
    /// The link's handle, as the child's owner uses it.
    pub(in crate::process::child) rpc: RpcHandle,
    /// The child's stdin (what the link writes).
    pub(in crate::process::child) child_stdin: tokio::io::DuplexStream,
    /// The child's stdout (what the link reads).
    pub(in crate::process::child) child_stdout: tokio::io::DuplexStream,
    /// What the link tells the child's owner.
    pub(in crate::process::child) events: mpsc::UnboundedReceiver<ChildEvent>,
    /// The child's exit, as its reaper would publish it (kept: the reader
    /// takes a dropped one as "never").
    pub(in crate::process::child) exit: watch::Sender<Option<ExitInfo>>,
}

pub(in crate::process::child) fn over_pipes(
    toolbox: &str,
    max: usize,
    pipe: usize,
    kill: Kill,
) -> OverPipes {
    let (daemon_stdin, child_stdin) = tokio::io::duplex(pipe);
    let (child_stdout, daemon_stdout) = tokio::io::duplex(64 * 1024);
    let (lines_tx, lines_rx) = mpsc::unbounded_channel();
    let (link, queued) = Link::new(toolbox.to_owned(), 0, lines_tx, max, kill, None, false);
    let (events_tx, events) = mpsc::unbounded_channel();
    let (exit, exit_rx) = watch::channel(None);
    tokio::spawn(write_stdin(daemon_stdin, lines_rx, queued));
    tokio::spawn(read_stdout(
        link.clone(),
        daemon_stdout,
        max,
        events_tx,
        exit_rx,
    ));
    OverPipes {
        rpc: RpcHandle { link },
        child_stdin,
        child_stdout,
        events,
        exit,
    }
}
