//! Shared test harness: a real `toolboxd run` process with an embedded bus on
//! port 0, manifest directories in temp folders, and a websocket bus client.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::{SinkExt, StreamExt};
use serde_json::{json, Value};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::Message as WsMessage;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

mod bus;
mod daemon;

// Each test file uses a part of the harness.
#[allow(unused_imports)]
pub use bus::*;
#[allow(unused_imports)]
pub use daemon::*;

pub const BIN: &str = env!("CARGO_BIN_EXE_toolboxd");

/// The repository root.
pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// A path inside the repository.
pub fn repo(path: &str) -> String {
    root().join(path).display().to_string()
}

/// `command` with its OVOS configuration, data, cache and state under
/// `home` (the XDG directories the OVOS libraries read and write).
pub fn ovos_home<'c>(command: &'c mut Command, home: &Path) -> &'c mut Command {
    command
        .env("XDG_CONFIG_HOME", home)
        .env("XDG_DATA_HOME", home.join("data"))
        .env("XDG_CACHE_HOME", home.join("cache"))
        .env("XDG_STATE_HOME", home.join("state"))
}

/// The port of a `ws://HOST:PORT/ROUTE` URL.
pub fn port_of(url: &str) -> u16 {
    url.rsplit(':')
        .next()
        .unwrap()
        .split('/')
        .next()
        .unwrap()
        .parse()
        .unwrap()
}

/// A temporary directory removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        static COUNTER: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir =
            std::env::temp_dir().join(format!("toolboxd-test-{tag}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }

    /// A directory outside /tmp (a toolbox's /tmp is its own) and outside
    /// this repository (which the fixtures' toolboxes may read, as their
    /// project): what a toolbox may reach only if its manifest says so.
    pub fn outside(tag: &str) -> TempDir {
        static COUNTER: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = PathBuf::from("/var/tmp")
            .join(format!("toolboxd-test-{tag}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }

    /// A directory the tests' toolboxes may write in (`read_write`): under a
    /// root daemon each runs as a user of its own, which a root-owned 0755
    /// directory would refuse.
    pub fn writable(tag: &str) -> TempDir {
        use std::os::unix::fs::PermissionsExt;
        let dir = TempDir::new(tag);
        std::fs::set_permissions(&dir.0, std::fs::Permissions::from_mode(0o777)).unwrap();
        dir
    }

    pub fn path(&self) -> &Path {
        &self.0
    }

    pub fn write(&self, name: &str, text: &str) -> PathBuf {
        let path = self.0.join(name);
        std::fs::write(&path, text).unwrap();
        path
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Manifest text for the example math toolbox under `id`.
pub fn math_manifest(id: &str) -> String {
    format!(
        "id = \"{id}\"\ncommand = \"python3\"\nargs = [\"{}\"]\n",
        repo("examples/python/math_toolbox.py")
    )
}

/// Manifest text for the example bash + jq toolbox under `id`.
pub fn text_manifest(id: &str) -> String {
    format!(
        "id = \"{id}\"\ncommand = \"{}\"\n",
        repo("examples/shell/text_toolbox.sh")
    )
}

/// Manifest text for the test fixture toolbox under `id`, with extra lines.
pub fn fixture_manifest(id: &str, extra: &str) -> String {
    format!(
        "id = \"{id}\"\ncommand = \"python3\"\nargs = [\"{}\"]\n{extra}\n",
        repo("tests/fixtures/fixture_toolbox.py")
    )
}

/// Waits until `cond` holds, polling every 10 ms; fails the test with `what`
/// after `within`.
pub fn wait_until(what: &str, within: Duration, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !cond() {
        assert!(Instant::now() < deadline, "{what}: not within {within:?}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A loopback port for a server that must be told its port before it starts
/// (a bus restarted on the same address, a port written into mycroft.conf).
/// Everything else binds port 0 and reads the port back. The port is picked
/// below the kernel's ephemeral range (where outgoing connections never take
/// ports) and checked free, so only an explicit bind elsewhere can race it.
pub fn fixed_port() -> u16 {
    static NEXT: std::sync::atomic::AtomicU16 = std::sync::atomic::AtomicU16::new(0);
    let base = 20_000 + (std::process::id() % 500) as u16 * 20;
    for _ in 0..1000 {
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let port = base + n % 10_000;
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free loopback port below the ephemeral range");
}

/// A process a test started, SIGKILLed and reaped when dropped, so that a
/// failing test leaves nothing running.
pub struct Reaped(pub Child);

impl std::ops::Deref for Reaped {
    type Target = Child;
    fn deref(&self) -> &Child {
        &self.0
    }
}

impl std::ops::DerefMut for Reaped {
    fn deref_mut(&mut self) -> &mut Child {
        &mut self.0
    }
}

impl Reaped {
    /// Starts `command` with its stdout piped and returns once it writes a
    /// line `ready` accepts (within `within`; the test fails otherwise),
    /// with that line. Later lines are read and dropped, so it never
    /// blocks on a full pipe.
    pub fn spawn_until(
        command: &mut Command,
        within: Duration,
        ready: impl Fn(&str) -> bool,
    ) -> (Reaped, String) {
        let mut child = Reaped(command.stdout(Stdio::piped()).spawn().unwrap());
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        let deadline = Instant::now() + within;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok(line) if ready(&line) => return (child, line),
                Ok(_) => {}
                Err(e) => panic!("{command:?} did not say it is ready within {within:?}: {e}"),
            }
        }
    }
}

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `toolboxd bus` listening on 127.0.0.1:`port` (0: any), the port it
/// listens on, once it says so.
pub fn start_bus(port: u16) -> (Reaped, u16) {
    let mut bus = Command::new(BIN)
        .args(["--log-format", "json", "bus", "--listen"])
        .arg(format!("127.0.0.1:{port}"))
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = bus.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let deadline = Instant::now() + ANSWER_DEADLINE;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let Ok(line) = rx.recv_timeout(left) else {
            let _ = bus.kill();
            let _ = bus.wait();
            panic!("toolboxd bus never said it listens");
        };
        let Ok(v) = serde_json::from_str::<Value>(&line) else {
            continue;
        };
        if v["message"] == "messagebus listening" {
            let addr: std::net::SocketAddr = v["addr"].as_str().unwrap().parse().unwrap();
            std::thread::spawn(move || while rx.recv().is_ok() {});
            return (Reaped(bus), addr.port());
        }
    }
}

/// Runs `command` to completion, failing the test after `within`.
pub fn output_within(command: &mut Command, within: Duration) -> std::process::Output {
    let child = command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let (tx, rx) = std::sync::mpsc::channel();
    let pid = child.id();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(within) {
        Ok(out) => out.expect("wait for command"),
        Err(_) => {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid as i32),
                nix::sys::signal::Signal::SIGKILL,
            );
            panic!("{command:?} did not finish within {within:?}");
        }
    }
}

/// A loopback port held bound but not listening, so connections to it are
/// refused and no other process can take it while the guard lives: an address
/// where, for sure, no bus is.
pub fn refusing_port() -> (std::os::fd::OwnedFd, u16) {
    use std::os::fd::FromRawFd;
    // SAFETY: plain socket calls on a descriptor this function owns; every
    // return value is checked.
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
        assert!(fd >= 0, "socket: {}", std::io::Error::last_os_error());
        let owned = std::os::fd::OwnedFd::from_raw_fd(fd);
        let mut addr: libc::sockaddr_in = std::mem::zeroed();
        addr.sin_family = libc::AF_INET as libc::sa_family_t;
        addr.sin_addr.s_addr = u32::from(std::net::Ipv4Addr::LOCALHOST).to_be();
        let len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
        let rc = libc::bind(fd, std::ptr::addr_of!(addr).cast(), len);
        assert_eq!(rc, 0, "bind: {}", std::io::Error::last_os_error());
        let mut out_len = len;
        let rc = libc::getsockname(fd, std::ptr::addr_of_mut!(addr).cast(), &mut out_len);
        assert_eq!(rc, 0, "getsockname: {}", std::io::Error::last_os_error());
        (owned, u16::from_be(addr.sin_port))
    }
}

/// The established IPv4 TCP connections on this machine (/proc/net/tcp), as
/// (local port, remote port).
pub fn established_tcp() -> Vec<(u16, u16)> {
    let table = std::fs::read_to_string("/proc/net/tcp").unwrap();
    let port = |addr: &str| u16::from_str_radix(addr.rsplit(':').next().unwrap(), 16).unwrap();
    table
        .lines()
        .skip(1)
        .map(|line| line.split_whitespace().collect::<Vec<_>>())
        .filter(|f| f[3] == "01")
        .map(|f| (port(f[1]), port(f[2])))
        .collect()
}
