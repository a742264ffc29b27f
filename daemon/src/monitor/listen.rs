//! The listening socket: handed over by systemd (socket activation, so it
//! outlives restarts and clients wait in its backlog instead of failing),
//! or, when pycelld is started by hand, bound here with its owner and mode
//! set before it can be reached.

use std::fs;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};

use nix::unistd::{Gid, Uid};

/// The first descriptor systemd passes (`SD_LISTEN_FDS_START`).
const LISTEN_FDS_START: i32 = 3;

/// Where the socket came from.
#[derive(Debug)]
pub enum Origin {
    /// Passed by systemd; it owns the path and keeps the socket.
    Systemd,
    /// Bound by us; we remove the path when we stop.
    Bound,
}

/// What `LISTEN_PID`/`LISTEN_FDS` say: how many descriptors were passed to
/// this process (None: socket activation is not in use).
pub fn passed_count(
    listen_pid: Option<&str>,
    listen_fds: Option<&str>,
    our_pid: u32,
) -> Option<usize> {
    let pid: u32 = listen_pid?.parse().ok()?;
    if pid != our_pid {
        return None;
    }
    listen_fds?.parse().ok().filter(|n| *n > 0)
}

/// The socket systemd passed, checked to be a listening unix stream socket
/// at `expected`; None if none was passed.
pub fn from_systemd(expected: &Path) -> io::Result<Option<UnixListener>> {
    let count = passed_count(
        std::env::var("LISTEN_PID").ok().as_deref(),
        std::env::var("LISTEN_FDS").ok().as_deref(),
        std::process::id(),
    );
    // Our children must not see them.
    for var in ["LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"] {
        std::env::remove_var(var);
    }
    let Some(count) = count else {
        return Ok(None);
    };
    if count != 1 {
        return Err(io::Error::other(format!(
            "systemd passed {count} sockets; pycelld.socket must have exactly one ListenStream="
        )));
    }
    let fd = pycell_syscall::adopt_inherited_fd(LISTEN_FDS_START)?;
    check_passed(&fd, expected)?;
    Ok(Some(UnixListener::from(fd)))
}

/// A passed descriptor must be a listening unix stream socket bound to the
/// configured path: anything else is a configuration mistake worth
/// stopping for.
fn check_passed(fd: &OwnedFd, expected: &Path) -> io::Result<()> {
    use rustix::net::sockopt;
    let listening = sockopt::socket_acceptconn(fd.as_fd()).unwrap_or(false);
    let addr = rustix::net::getsockname(fd.as_fd()).map_err(io::Error::from)?;
    let path = rustix::net::SocketAddrUnix::try_from(addr)
        .ok()
        .and_then(|u| {
            u.path()
                .map(|p| PathBuf::from(p.to_string_lossy().into_owned()))
        });
    match path {
        Some(p) if listening && p == expected => Ok(()),
        Some(p) if listening => Err(io::Error::other(format!(
            "systemd passed a socket at {} but the configuration says socket = {}; make pycelld.socket's ListenStream= and pycelld.toml agree",
            p.display(),
            expected.display()
        ))),
        _ => Err(io::Error::other(
            "systemd passed a descriptor that is not a listening unix stream socket",
        )),
    }
}

/// Bind `path` for a hand-started daemon: in a private directory next to
/// it, owned root:`group` with `mode` there, then renamed into place, so
/// that nobody can connect before the owner and mode are right.
pub fn bind(path: &Path, group: Gid, mode: u32) -> io::Result<UnixListener> {
    let dir = path
        .parent()
        .ok_or_else(|| io::Error::other("the socket path has no directory"))?;
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o755)
        .create(dir)?;
    let private = dir.join(format!(".pycelld-bind-{}", std::process::id()));
    let _ = fs::remove_dir_all(&private);
    fs::DirBuilder::new().mode(0o700).create(&private)?;
    let staged = private.join("sock");
    let bound = (|| {
        let listener = UnixListener::bind(&staged)?;
        nix::unistd::chown(&staged, Some(Uid::from_raw(0)), Some(group))?;
        fs::set_permissions(&staged, fs::Permissions::from_mode(mode))?;
        fs::rename(&staged, path)?;
        Ok(listener)
    })();
    let _ = fs::remove_dir_all(&private);
    bound
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listen_pid_must_be_ours() {
        assert_eq!(passed_count(Some("42"), Some("1"), 42), Some(1));
        assert_eq!(passed_count(Some("42"), Some("1"), 43), None);
        assert_eq!(passed_count(None, Some("1"), 42), None);
        assert_eq!(passed_count(Some("42"), Some("0"), 42), None);
        assert_eq!(passed_count(Some("42"), Some("x"), 42), None);
    }

    #[test]
    fn a_bound_socket_has_its_mode_and_no_staging_left() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.sock");
        let gid = nix::unistd::getegid();
        let _l = bind(&path, gid, 0o660).unwrap();
        let meta = fs::metadata(&path).unwrap();
        assert_eq!(meta.permissions().mode() & 0o777, 0o660);
        let names: Vec<_> = fs::read_dir(dir.path())
            .unwrap()
            .flatten()
            .map(|e| e.file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from("s.sock")]);
    }
}
