//! Finding the bus the OVOS way: the `websocket` section of mycroft.conf.
//!
//! Files are read in order, later ones overriding earlier ones key by key:
//! the system file (`$MYCROFT_SYSTEM_CONFIG`, default
//! `/etc/mycroft/mycroft.conf`), then the user file
//! (`$XDG_CONFIG_HOME/mycroft/mycroft.conf`, default
//! `~/.config/mycroft/mycroft.conf`). Missing files are skipped; a malformed
//! one is reported and skipped. What no file sets keeps the OVOS default,
//! `ws://127.0.0.1:8181/core`.

use std::path::{Path, PathBuf};

use serde_json::{Map, Value};

/// The bus URL and how it was found.
#[derive(Debug, Clone, PartialEq)]
pub struct BusSettings {
    /// `ws://host:port/route` (`wss://` when `ssl` is set).
    pub url: String,
    /// The files that set something, in the order applied.
    pub sources: Vec<PathBuf>,
    /// Files that could not be used, and why.
    pub warnings: Vec<String>,
}

/// The config files OVOS reads, lowest precedence first.
pub fn default_files() -> Vec<PathBuf> {
    let system = std::env::var_os("MYCROFT_SYSTEM_CONFIG")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/etc/mycroft/mycroft.conf"));
    let user_base = std::env::var_os("XDG_CONFIG_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".config")));
    let mut files = vec![system];
    if let Some(base) = user_base {
        files.push(base.join("mycroft").join("mycroft.conf"));
    }
    files
}

/// The bus settings from the default files.
pub fn lookup() -> BusSettings {
    from_files(&default_files())
}

/// The bus settings from `files`, later files overriding earlier ones.
pub fn from_files(files: &[PathBuf]) -> BusSettings {
    let mut section = Map::new();
    let mut sources = Vec::new();
    let mut warnings = Vec::new();
    for file in files {
        let text = match crate::util::files::read_small_regular(file, MAX_CONFIG_BYTES) {
            Ok(text) => text,
            Err(crate::util::files::ReadError::NotFound) => continue,
            Err(e) => {
                warnings.push(format!("cannot use {}: {e}; ignoring it", file.display()));
                continue;
            }
        };
        match serde_json::from_str::<Value>(&strip_comments(&text)) {
            Ok(Value::Object(config)) => match config.get("websocket") {
                Some(Value::Object(ws)) => {
                    section.extend(ws.clone());
                    sources.push(file.clone());
                }
                None => {}
                Some(_) => warnings.push(format!(
                    "{}: \"websocket\" is not an object; ignoring it",
                    file.display()
                )),
            },
            Ok(_) => warnings.push(format!(
                "{}: not a JSON object; ignoring it",
                file.display()
            )),
            Err(e) => warnings.push(format!(
                "{} is not valid JSON ({e}); ignoring it",
                file.display()
            )),
        }
    }
    let host = section
        .get("host")
        .and_then(Value::as_str)
        .unwrap_or("127.0.0.1");
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    let unspecified = bare
        .parse::<std::net::IpAddr>()
        .is_ok_and(|ip| ip.is_unspecified());
    if unspecified {
        warnings.push(format!(
            "the bus host {host:?} means every interface: an embedded bus would listen on each \
             of them, and whatever reaches the device's network could control OVOS through the \
             bus (it has no authentication); write 127.0.0.1"
        ));
    } else if !is_loopback_host(host) {
        warnings.push(format!(
            "the bus host {host:?} is not loopback: whatever reaches that address can control \
             OVOS through the bus (it has no authentication); an embedded bus would listen there"
        ));
    }
    // An IPv6 address goes in brackets in a URL (`::1` -> `[::1]`).
    let host = if bare.contains(':') {
        format!("[{bare}]")
    } else {
        host.to_owned()
    };
    // OVOS writes the port as a number; a numeric string is taken too.
    let port = match section.get("port") {
        None => 8181,
        Some(value) => match value
            .as_u64()
            .or_else(|| value.as_str()?.trim().parse().ok())
            .filter(|p| (1..=65535).contains(p))
        {
            Some(port) => port,
            None => {
                warnings.push(format!(
                    "websocket.port {value} is not a port (1-65535); using 8181"
                ));
                8181
            }
        },
    };
    let route = section
        .get("route")
        .and_then(Value::as_str)
        .unwrap_or("/core");
    let ssl = section.get("ssl").and_then(Value::as_bool).unwrap_or(false);
    let scheme = if ssl { "wss" } else { "ws" };
    let slash = if route.starts_with('/') { "" } else { "/" };
    BusSettings {
        url: format!("{scheme}://{host}:{port}{slash}{route}"),
        sources,
        warnings,
    }
}

/// The largest mycroft.conf read: real ones are a few KiB.
const MAX_CONFIG_BYTES: u64 = 1024 * 1024;

/// Whether a configured host names this machine's loopback.
fn is_loopback_host(host: &str) -> bool {
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    bare.eq_ignore_ascii_case("localhost")
        || bare
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// Removes `//` and `/* */` comments outside strings (mycroft.conf allows them).
fn strip_comments(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    let mut in_string = false;
    while let Some(c) = chars.next() {
        if in_string {
            out.push(c);
            match c {
                '\\' => {
                    if let Some(next) = chars.next() {
                        out.push(next);
                    }
                }
                '"' => in_string = false,
                _ => {}
            }
            continue;
        }
        match (c, chars.peek()) {
            ('"', _) => {
                in_string = true;
                out.push(c);
            }
            ('/', Some('/')) => {
                for c in chars.by_ref() {
                    if c == '\n' {
                        out.push('\n');
                        break;
                    }
                }
            }
            ('/', Some('*')) => {
                chars.next();
                let mut last = ' ';
                for c in chars.by_ref() {
                    if last == '*' && c == '/' {
                        break;
                    }
                    last = c;
                }
            }
            _ => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        path
    }

    fn tmp(tag: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("toolboxd-cfg-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn defaults_without_files() {
        let s = from_files(&[PathBuf::from("/nonexistent/mycroft.conf")]);
        assert_eq!(s.url, "ws://127.0.0.1:8181/core");
        assert!(s.sources.is_empty() && s.warnings.is_empty());
    }

    #[test]
    fn user_overrides_system_key_by_key() {
        let dir = tmp("prec");
        let system = write(
            &dir,
            "system.conf",
            "{\n // the system file\n \"websocket\": {\"host\": \"10.0.0.1\", \"port\": 9000, \"route\": \"/core\"}\n}",
        );
        let user = write(
            &dir,
            "user.conf",
            "{\"websocket\": {\"port\": 9999} /* user */}",
        );
        let s = from_files(&[system.clone(), user.clone()]);
        assert_eq!(s.url, "ws://10.0.0.1:9999/core");
        assert_eq!(s.sources, [system, user]);
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn ports_hosts_and_odd_files_are_checked() {
        let dir = tmp("checked");
        let conf = |name: &str, ws: &str| write(&dir, name, &format!("{{\"websocket\": {ws}}}"));
        // 70000 used to bind port 4464 (70000 mod 65536) while the log said 70000.
        let s = from_files(&[conf("a.conf", "{\"port\": 70000}")]);
        assert_eq!(s.url, "ws://127.0.0.1:8181/core");
        assert!(
            s.warnings[0].contains("70000 is not a port"),
            "{:?}",
            s.warnings
        );
        let s = from_files(&[conf("b.conf", "{\"port\": \"19437\"}")]);
        assert_eq!(s.url, "ws://127.0.0.1:19437/core");
        assert!(s.warnings.is_empty(), "{:?}", s.warnings);
        let s = from_files(&[conf("c.conf", "{\"host\": \"10.0.0.7\"}")]);
        assert!(
            s.warnings[0].contains("is not loopback"),
            "{:?}",
            s.warnings
        );
        let s = from_files(&[conf("d.conf", "{\"host\": \"localhost\"}")]);
        assert!(s.warnings.is_empty(), "{:?}", s.warnings);
        // IPv6: bracketed, as a URL needs ("invalid authority" before).
        for host in ["::1", "[::1]"] {
            let s = from_files(&[conf("e.conf", &format!("{{\"host\": \"{host}\"}}"))]);
            assert_eq!(s.url, "ws://[::1]:8181/core");
            assert!(s.warnings.is_empty(), "{:?}", s.warnings);
        }
        for host in ["0.0.0.0", "::"] {
            let s = from_files(&[conf("f.conf", &format!("{{\"host\": \"{host}\"}}"))]);
            assert!(
                s.warnings[0].contains("every interface"),
                "{:?}",
                s.warnings
            );
        }
        // A FIFO as mycroft.conf once blocked `run` and `list` for ever.
        let fifo = dir.join("fifo.conf");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).unwrap();
        let s = from_files(&[fifo]);
        assert_eq!(s.url, "ws://127.0.0.1:8181/core");
        assert!(s.warnings[0].contains("a FIFO"), "{:?}", s.warnings);
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn a_malformed_file_is_reported_not_fatal() {
        let dir = tmp("bad");
        let system = write(&dir, "system.conf", "{\"websocket\": {\"port\": 9100}}");
        let user = write(&dir, "user.conf", "{\"websocket\": {\"port\": ");
        let s = from_files(&[system, user]);
        assert_eq!(s.url, "ws://127.0.0.1:9100/core");
        assert_eq!(s.warnings.len(), 1);
        assert!(
            s.warnings[0].contains("user.conf is not valid JSON"),
            "{:?}",
            s.warnings
        );
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn comments_inside_strings_are_kept_and_ssl_gives_wss() {
        let dir = tmp("ssl");
        let f = write(
            &dir,
            "c.conf",
            "{\"websocket\": {\"host\": \"a//b\", \"ssl\": true, \"route\": \"x\"}}",
        );
        assert_eq!(from_files(&[f]).url, "wss://a//b:8181/x");
        std::fs::remove_dir_all(dir).unwrap();
    }
}
