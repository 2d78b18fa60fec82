//! Reading the small files an operator hands toolboxd (manifests,
//! mycroft.conf) without trusting what is at the path: never blocking on a
//! FIFO, never reading a device or a huge file without end.

use std::io::Read;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::Path;

/// Why a file could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// Nothing is there.
    #[error("it does not exist")]
    NotFound,
    /// Something that is not a regular file is there.
    #[error("it is {0}, not a regular file")]
    NotRegular(&'static str),
    /// It is larger than the limit.
    #[error("it is larger than {0} bytes, which it never needs to be; is it the right file?")]
    TooLarge(u64),
    /// Reading failed.
    #[error("cannot read it: {0}")]
    Io(std::io::Error),
    /// It is not the daemon's own private file.
    #[error("it is owned by uid {owner} with mode {mode:04o}, not the daemon's own 0600 file")]
    NotOwn { owner: u32, mode: u32 },
}

/// Reads a regular file (a symlink to one is fine) of at most `max` bytes.
pub fn read_small_regular(path: &Path, max: u64) -> Result<String, ReadError> {
    read_checked(path, max, false)
}

/// Reads a file the daemon wrote for itself: a regular file of at most
/// `max` bytes, not a symlink, owned by the daemon's user, which nobody
/// else may read or write (a file a toolbox or a local user planted, or
/// opened up, is refused).
pub fn read_own_private(path: &Path, max: u64) -> Result<String, ReadError> {
    read_checked(path, max, true)
}

fn read_checked(path: &Path, max: u64, own_private: bool) -> Result<String, ReadError> {
    use std::os::unix::fs::MetadataExt;
    let flags = if own_private {
        libc::O_NONBLOCK | libc::O_NOFOLLOW
    } else {
        libc::O_NONBLOCK
    };
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(flags)
        .open(path)
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => ReadError::NotFound,
            _ if e.raw_os_error() == Some(libc::ELOOP) => ReadError::NotRegular("a symlink"),
            _ => ReadError::Io(e),
        })?;
    let meta = file.metadata().map_err(ReadError::Io)?;
    if own_private && (meta.uid() != nix::unistd::geteuid().as_raw() || meta.mode() & 0o077 != 0) {
        return Err(ReadError::NotOwn {
            owner: meta.uid(),
            mode: meta.mode() & 0o7777,
        });
    }
    let kind = meta.file_type();
    if !kind.is_file() {
        return Err(ReadError::NotRegular(if kind.is_dir() {
            "a directory"
        } else if kind.is_fifo() {
            "a FIFO"
        } else if kind.is_char_device() || kind.is_block_device() {
            "a device"
        } else if kind.is_socket() {
            "a socket"
        } else {
            "something else"
        }));
    }
    if meta.len() > max {
        return Err(ReadError::TooLarge(max));
    }
    let mut text = String::new();
    file.take(max + 1)
        .read_to_string(&mut text)
        .map_err(ReadError::Io)?;
    if text.len() as u64 > max {
        return Err(ReadError::TooLarge(max));
    }
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_up_to_the_limit_whole_and_refuses_more() {
        let dir = std::env::temp_dir().join(format!("toolboxd-files-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("f");
        std::fs::write(&path, "abcdefgh").unwrap();
        assert_eq!(read_small_regular(&path, 8).unwrap(), "abcdefgh");
        assert!(matches!(
            read_small_regular(&path, 7),
            Err(ReadError::TooLarge(7))
        ));
        assert!(matches!(
            read_small_regular(&dir, 8),
            Err(ReadError::NotRegular("a directory"))
        ));
        assert!(matches!(
            read_small_regular(&dir.join("nope"), 8),
            Err(ReadError::NotFound)
        ));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn an_own_private_file_is_not_a_link_nor_open_to_others() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("toolboxd-own-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("f");
        std::fs::write(&path, "mine").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(read_own_private(&path, 8).unwrap(), "mine");
        let link = dir.join("link");
        std::os::unix::fs::symlink(&path, &link).unwrap();
        assert!(matches!(
            read_own_private(&link, 8),
            Err(ReadError::NotRegular("a symlink"))
        ));
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert!(matches!(
            read_own_private(&path, 8),
            Err(ReadError::NotOwn { mode: 0o644, .. })
        ));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
