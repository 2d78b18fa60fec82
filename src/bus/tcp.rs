//! Socket options for low latency on loopback; see docs/protocol.md, "Sockets".
//!
//! The stock Python bus never disables Nagle's algorithm, so a peer that delays
//! its ACKs makes the bus hold the next frame to it for ~40 ms. Every socket
//! toolboxd opens or accepts sets TCP_NODELAY; a client socket also re-arms
//! TCP_QUICKACK after each burst of frames it reads (Linux clears it by
//! itself), so its ACKs leave at once and the bus never waits on them, unless
//! the bus is toolboxd's own, which says in its handshake answer that it sets
//! TCP_NODELAY (`x-toolboxd-nodelay`).

use std::os::fd::AsRawFd;

use tokio::net::TcpStream;

/// Sets TCP_NODELAY, and TCP_QUICKACK where the platform has it.
pub fn tune(stream: &TcpStream) {
    if let Err(e) = stream.set_nodelay(true) {
        tracing::debug!("cannot set TCP_NODELAY: {e}");
    }
    quickack(stream);
}

/// Re-arms TCP_QUICKACK (Linux); a no-op elsewhere.
#[cfg(target_os = "linux")]
pub fn quickack(stream: &impl AsRawFd) {
    let one: libc::c_int = 1;
    // SAFETY: a valid socket fd and a pointer to a c_int of the stated size.
    unsafe {
        libc::setsockopt(
            stream.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_QUICKACK,
            (&one as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        );
    }
}

/// Re-arms TCP_QUICKACK (Linux); a no-op elsewhere.
#[cfg(not(target_os = "linux"))]
pub fn quickack(_stream: &impl AsRawFd) {}

/// A raw socket fd, for options on a stream that has been split into halves.
/// Valid only while the stream it came from is open.
pub struct Fd(pub std::os::fd::RawFd);

impl AsRawFd for Fd {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        self.0
    }
}
