//! A toolbox's network level (`network`, `ports`, `sockets`;
//! docs/security.md, "Network"): what Landlock's TCP rules and the seccomp
//! filter's socket rules make of it, and how it is said.

use super::{landlock, report, seccomp};
use crate::manifest::{Network, Sandbox, SocketKind};

/// What the child's TCP and sockets may do, from its `network`, `ports`
/// and `sockets`.
pub(super) fn network(sandbox: &Sandbox) -> (landlock::Tcp, seccomp::Sockets) {
    let has = |kind| sandbox.sockets.contains(&kind);
    let ip = |tcp_restricted| seccomp::Sockets::Ip {
        netlink: has(SocketKind::Netlink),
        packet: has(SocketKind::Packet),
        raw: has(SocketKind::Raw),
        tcp_restricted,
    };
    match sandbox.network {
        Network::Full => (landlock::Tcp::Open, ip(false)),
        // The default level on a kernel that cannot hold it: open, and
        // said so ([`network_words`]); a written one fails the start.
        Network::Internet if !sandbox.network_declared && !landlock::support().network() => {
            (landlock::Tcp::Open, ip(false))
        }
        Network::Internet => (landlock::Tcp::ConnectTo(sandbox.ports.clone()), ip(true)),
        Network::None => (landlock::Tcp::Closed, seccomp::Sockets::UnixOnly),
    }
}

/// What the child's network is, in words, for logs, status and `check
/// --sandbox`: the level, and whether it holds here.
pub(crate) fn network_words(sandbox: &Sandbox) -> (bool, String) {
    let level = sandbox.network.as_str();
    let lock = landlock::support();
    match sandbox.network {
        Network::Full => (
            true,
            "network = full: every address, the bus and local services included".to_owned(),
        ),
        Network::Internet if !lock.network() => (
            !sandbox.network_declared,
            format!(
                "network = {level}{}: not enforced ({lock}); the child may reach every address",
                if sandbox.network_declared {
                    ""
                } else {
                    " (default)"
                },
            ),
        ),
        Network::Internet => (
            true,
            format!(
                "network = {level}: TCP to ports {} only, no listening (Landlock; UDP is not \
                 governed)",
                report::ports(&sandbox.ports)
            ),
        ),
        Network::None => (
            lock.network() && seccomp::support().arch().is_ok(),
            format!("network = {level}: no IP socket (seccomp), no TCP (Landlock)"),
        ),
    }
}
