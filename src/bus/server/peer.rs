//! Who is behind a connection: on loopback, the user owning the client's
//! socket (the kernel knows it; every toolbox has a uid of its own);
//! otherwise the remote address. The bus gives each peer a share of its
//! connections, and the service a share of its room for calls, so that one
//! peer with many connections cannot take what all share.

use std::net::{IpAddr, SocketAddr};

/// A peer of the bus.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Peer {
    /// A loopback client, by the uid owning its socket.
    Uid(u32),
    /// A client on another host, or one whose socket's owner could not be
    /// read, by its address.
    Addr(IpAddr),
}

impl std::fmt::Display for Peer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Peer::Uid(uid) => write!(f, "uid {uid}"),
            Peer::Addr(ip) => write!(f, "{ip}"),
        }
    }
}

impl Peer {
    /// The peer at the other end of a connection from `remote` to our
    /// `local` address: a loopback client by the owner of its socket, read
    /// from /proc/net/tcp (or tcp6), else by its address.
    pub fn of(remote: SocketAddr, local: SocketAddr) -> Peer {
        if remote.ip().is_loopback() || remote.ip() == local.ip() {
            if let Some(uid) = socket_owner(remote, local) {
                return Peer::Uid(uid);
            }
        }
        Peer::Addr(remote.ip())
    }
}

/// The uid owning the socket bound to `client` and connected to `server`
/// on this host: the `uid` column of its line in /proc/net/tcp{,6}.
fn socket_owner(client: SocketAddr, server: SocketAddr) -> Option<u32> {
    let table = match client {
        SocketAddr::V4(_) => "/proc/net/tcp",
        SocketAddr::V6(_) => "/proc/net/tcp6",
    };
    let text = std::fs::read_to_string(table).ok()?;
    let (local, remote) = (hex(client), hex(server));
    text.lines().skip(1).find_map(|line| {
        let mut fields = line.split_whitespace();
        let (_, l, r) = (fields.next()?, fields.next()?, fields.next()?);
        if !l.eq_ignore_ascii_case(&local) || !r.eq_ignore_ascii_case(&remote) {
            return None;
        }
        // st, tx:rx queues, tr:when, retransmits, then the uid.
        fields.nth(4)?.parse().ok()
    })
}

/// An address as /proc/net/tcp writes it: the address's 32-bit words as the
/// machine stores them, in hex, then the port.
fn hex(addr: SocketAddr) -> String {
    let words: Vec<[u8; 4]> = match addr.ip() {
        IpAddr::V4(ip) => vec![ip.octets()],
        IpAddr::V6(ip) => ip
            .octets()
            .chunks_exact(4)
            .map(|w| [w[0], w[1], w[2], w[3]])
            .collect(),
    };
    let mut out: String = words
        .iter()
        .map(|w| format!("{:08X}", u32::from_ne_bytes(*w)))
        .collect();
    out.push_str(&format!(":{:04X}", addr.port()));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_loopback_clients_socket_is_found_with_its_owner() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (_, remote) = listener.accept().unwrap();
        assert_eq!(remote, client.local_addr().unwrap());
        let peer = Peer::of(remote, listener.local_addr().unwrap());
        assert_eq!(peer, Peer::Uid(nix::unistd::geteuid().as_raw()));
    }

    #[test]
    fn an_unknown_socket_is_its_address() {
        let nowhere: SocketAddr = "127.0.0.1:1".parse().unwrap();
        let peer = Peer::of(nowhere, "127.0.0.1:2".parse().unwrap());
        assert_eq!(peer, Peer::Addr(nowhere.ip()));
    }
}
