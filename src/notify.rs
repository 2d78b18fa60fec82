//! systemd's readiness protocol (sd_notify), for `Type=notify` units: READY=1
//! once the toolboxes are up, RELOADING=1 / READY=1 around a reload,
//! STOPPING=1 on shutdown, and WATCHDOG=1 pings when the unit sets
//! `WatchdogSec=`. Without `NOTIFY_SOCKET` every call is a no-op.

use std::os::unix::net::{SocketAddr, UnixDatagram};
use std::time::Duration;

/// Where notifications go, if systemd asked for them.
pub struct Notifier {
    /// An unbound datagram socket and systemd's address.
    target: Option<(UnixDatagram, SocketAddr)>,
    /// How often to ping the watchdog: half of `WATCHDOG_USEC`.
    watchdog: Option<Duration>,
}

impl Notifier {
    /// Reads `NOTIFY_SOCKET` (a path, or `@name` for the abstract namespace)
    /// and `WATCHDOG_USEC` (honoured when `WATCHDOG_PID` is unset or ours).
    pub fn from_env() -> Notifier {
        let target = std::env::var("NOTIFY_SOCKET")
            .ok()
            .filter(|s| !s.is_empty())
            .and_then(|path| {
                let addr = match path.strip_prefix('@') {
                    Some(name) => abstract_addr(name)?,
                    None => SocketAddr::from_pathname(&path).ok()?,
                };
                // Non-blocking: a receiver that stops reading must never
                // stall the daemon's loop (the kernel queues only a few
                // datagrams per socket); a notification it cannot take is
                // dropped and logged.
                match UnixDatagram::unbound().and_then(|s| s.set_nonblocking(true).map(|()| s)) {
                    Ok(socket) => Some((socket, addr)),
                    Err(e) => {
                        tracing::warn!("NOTIFY_SOCKET is set but no socket could be made: {e}");
                        None
                    }
                }
            });
        let ours = std::env::var("WATCHDOG_PID")
            .ok()
            .and_then(|p| p.parse::<u32>().ok())
            .is_none_or(|p| p == std::process::id());
        let watchdog = std::env::var("WATCHDOG_USEC")
            .ok()
            .and_then(|u| u.parse::<u64>().ok())
            .filter(|&u| u > 0 && ours && target.is_some())
            .map(|u| Duration::from_micros(u / 2));
        Notifier { target, watchdog }
    }

    /// Sends one notification (newline-separated `KEY=VALUE` assignments).
    pub fn send(&self, state: &str) {
        if let Some((socket, addr)) = &self.target {
            match socket.send_to_addr(state.as_bytes(), addr) {
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    tracing::debug!("systemd's notify socket is full; dropped {state:?}")
                }
                Err(e) => tracing::warn!("cannot notify systemd ({state:?}): {e}"),
            }
        }
    }

    /// How often the watchdog wants a ping, if it is on.
    pub fn watchdog_interval(&self) -> Option<Duration> {
        self.watchdog
    }
}

#[cfg(target_os = "linux")]
fn abstract_addr(name: &str) -> Option<SocketAddr> {
    use std::os::linux::net::SocketAddrExt;
    SocketAddr::from_abstract_name(name.as_bytes()).ok()
}

#[cfg(not(target_os = "linux"))]
fn abstract_addr(_name: &str) -> Option<SocketAddr> {
    None
}

/// `MONOTONIC_USEC=` for a RELOADING=1 message: CLOCK_MONOTONIC in µs.
pub fn monotonic_usec() -> u64 {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC)
        .map(|t| t.tv_sec() as u64 * 1_000_000 + t.tv_nsec() as u64 / 1000)
        .unwrap_or(0)
}
