//! What a writable grant may leave on the host, enforced once its jail
//! has ended. A file the jail writes into a grant lands on the host owned
//! by the granted path's owner (root, when root granted it), so a grant
//! may leave only what that owner would find harmless:
//!
//! - regular files and directories, never set-uid, never set-gid (a
//!   directory keeps a set-gid bit it inherited from its parent), never
//!   writable by others;
//! - symbolic links that stay inside the grant (relative, never climbing
//!   out of it): a link out of it is a trap for whoever writes through it;
//! - nothing else: FIFOs, sockets and device nodes are removed.
//!
//! Only what changed while the jail lived (its inode's ctime, which no
//! unprivileged call can set back, is at or after the jail's start) is
//! looked at, so the caller's own files keep their modes. seccomp already
//! refuses set-id modes in the jail; this is the second line, and the
//! report says what it undid. The jail is dead when this runs, and every
//! component is opened relative to its parent with `O_NOFOLLOW`: nothing
//! is ever followed.

use std::ffi::CStr;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use nix::dir::Dir;
use nix::fcntl::{openat, readlinkat, AtFlags, OFlag};
use nix::sys::stat::{fchmod, fstat, fstatat, FileStat, Mode, SFlag};
use nix::unistd::{unlinkat, UnlinkatFlags};
use pycell_wire::report::GrantCleanup;

use crate::setup::grants::GrantRoot;

/// Directory entries looked at, at most, over every grant of a jail.
const MAX_SCANNED: usize = 1_000_000;
/// Directories followed, at most this deep below a grant.
const MAX_DEPTH: usize = 128;
/// Cleanups listed, at most; the rest are counted in one more line.
pub(crate) const MAX_LISTED: usize = 100;
/// The ctime clock is coarse (a tick behind real time): what changed this
/// long before the jail's start still counts as the jail's.
const CLOCK_SLACK: Duration = Duration::from_secs(1);

/// What one entry needs.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Fix {
    Keep,
    Remove(&'static str),
    Chmod {
        from: u32,
        to: u32,
        why: &'static str,
    },
}

/// The mode a file or directory may keep, and why it may not keep its own.
pub(crate) fn allowed_mode(mode: u32, is_dir: bool, parent_setgid: bool) -> Fix {
    let perms = mode & 0o7777;
    let mut to = perms & !libc::S_IWOTH;
    let mut why = "writable by others";
    if perms & libc::S_ISUID != 0 {
        to &= !libc::S_ISUID;
        why = "set-uid";
    }
    if perms & libc::S_ISGID != 0 && !(is_dir && parent_setgid) {
        to &= !libc::S_ISGID;
        why = if perms & libc::S_ISUID != 0 {
            "set-uid and set-gid"
        } else {
            "set-gid"
        };
    }
    match to == perms {
        true => Fix::Keep,
        false => Fix::Chmod {
            from: perms,
            to,
            why,
        },
    }
}

/// Whether a link whose text is `target`, in a directory `depth` levels
/// below the grant, points out of the grant.
pub(crate) fn link_leaves(target: &[u8], depth: usize) -> bool {
    if target.first() == Some(&b'/') || target.is_empty() {
        return true;
    }
    let mut level = depth as isize;
    for part in target.split(|b| *b == b'/') {
        match part {
            b"" | b"." => {}
            b".." => level -= 1,
            _ => level += 1,
        }
        if level < 0 {
            return true;
        }
    }
    false
}

/// What an entry of kind `kind` needs (a link's text is `link`).
pub(crate) fn fix_for(
    kind: SFlag,
    mode: u32,
    parent_setgid: bool,
    link: Option<&[u8]>,
    depth: usize,
) -> Fix {
    match kind {
        SFlag::S_IFREG => allowed_mode(mode, false, parent_setgid),
        SFlag::S_IFDIR => allowed_mode(mode, true, parent_setgid),
        SFlag::S_IFLNK => match link.is_none_or(|l| link_leaves(l, depth)) {
            true => Fix::Remove("a symbolic link out of the grant"),
            false => Fix::Keep,
        },
        SFlag::S_IFIFO => Fix::Remove("a FIFO"),
        SFlag::S_IFSOCK => Fix::Remove("a socket"),
        _ => Fix::Remove("a device node"),
    }
}

/// Sweep every grant in `roots` for what changed since `started`.
pub(crate) fn sweep(roots: &[GrantRoot], started: SystemTime) -> Vec<GrantCleanup> {
    let since = started
        .checked_sub(CLOCK_SLACK)
        .unwrap_or(UNIX_EPOCH)
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    let mut s = Sweep {
        since,
        scanned: 0,
        done: Vec::new(),
        more: 0,
        incomplete: None,
    };
    for root in roots {
        s.root(root);
    }
    s.finish()
}

struct Sweep {
    since: Duration,
    scanned: usize,
    done: Vec<GrantCleanup>,
    more: usize,
    incomplete: Option<String>,
}

impl Sweep {
    fn root(&mut self, root: &GrantRoot) {
        let Ok(st) = fstat(&root.source) else { return };
        let path = root.target.display().to_string();
        if self.changed(&st) {
            if let Fix::Chmod { from, to, why } = allowed_mode(st.st_mode, is_dir(&st), false) {
                self.chmod(root.source.as_fd(), &path, from, to, why);
            }
        }
        if is_dir(&st) {
            match reopen_dir(root.source.as_fd()) {
                Ok(dir) => self.dir(dir, &path, st.st_mode & libc::S_ISGID != 0, 0),
                Err(e) => self.incomplete = Some(format!("{path}: not swept: {e}")),
            }
        }
    }

    fn changed(&self, st: &FileStat) -> bool {
        let ctime = Duration::new(
            st.st_ctime.max(0) as u64,
            st.st_ctime_nsec.clamp(0, 999_999_999) as u32,
        );
        ctime >= self.since
    }

    /// The entries of `dir`, at `path`, `depth` levels below its grant.
    fn dir(&mut self, dir: OwnedFd, path: &str, setgid: bool, depth: usize) {
        let Ok(mut listing) = Dir::from_fd(dir) else {
            return;
        };
        let mut names = Vec::new();
        for entry in listing.iter() {
            let Ok(entry) = entry else { break };
            let name = entry.file_name();
            if name == c"." || name == c".." {
                continue;
            }
            self.scanned += 1;
            if self.scanned > MAX_SCANNED {
                self.incomplete = Some(format!(
                    "{path}: not swept whole: more than {MAX_SCANNED} entries"
                ));
                return;
            }
            names.push(name.to_owned());
        }
        let fd = listing.as_fd();
        for name in names {
            self.entry(fd, &name, path, setgid, depth);
        }
    }

    fn entry(
        &mut self,
        dir: BorrowedFd<'_>,
        name: &CStr,
        parent: &str,
        setgid: bool,
        depth: usize,
    ) {
        let path = format!("{parent}/{}", String::from_utf8_lossy(name.to_bytes()));
        let Ok(st) = fstatat(dir, name, AtFlags::AT_SYMLINK_NOFOLLOW) else {
            return;
        };
        let kind = SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT;
        if self.changed(&st) {
            let link = (kind == SFlag::S_IFLNK)
                .then(|| readlinkat(dir, name).ok().map(|l| l.into_encoded_bytes()))
                .flatten();
            match fix_for(kind, st.st_mode, setgid, link.as_deref(), depth) {
                Fix::Keep => {}
                Fix::Remove(what) => self.remove(dir, name, &st, &path, what),
                Fix::Chmod { from, to, why } => {
                    if let Ok(fd) = open_same(dir, name, &st) {
                        self.chmod(fd.as_fd(), &path, from, to, why);
                    }
                }
            }
        }
        if kind != SFlag::S_IFDIR {
            return;
        }
        if depth + 1 >= MAX_DEPTH {
            self.incomplete = Some(format!(
                "{path}: not swept: deeper than {MAX_DEPTH} directories"
            ));
            return;
        }
        let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
        if let Ok(sub) = openat(dir, name, flags, Mode::empty()) {
            let sgid = fstat(&sub).is_ok_and(|s| s.st_mode & libc::S_ISGID != 0);
            self.dir(sub, &path, sgid, depth + 1);
        }
    }

    fn remove(&mut self, dir: BorrowedFd<'_>, name: &CStr, was: &FileStat, path: &str, what: &str) {
        // Still the entry we looked at (a host user who can write here
        // could have swapped it).
        let same = fstatat(dir, name, AtFlags::AT_SYMLINK_NOFOLLOW)
            .is_ok_and(|now| (now.st_dev, now.st_ino) == (was.st_dev, was.st_ino));
        let action = match same && unlinkat(dir, name, UnlinkatFlags::NoRemoveDir).is_ok() {
            true => format!("removed ({what})"),
            false => format!("could not be removed ({what})"),
        };
        self.record(path, action);
    }

    fn chmod(&mut self, fd: BorrowedFd<'_>, path: &str, from: u32, to: u32, why: &str) {
        let action = match fchmod(fd, Mode::from_bits_truncate(to)) {
            Ok(()) => format!("mode {from:04o} -> {to:04o} ({why})"),
            Err(e) => format!("mode {from:04o} could not be changed ({why}): {e}"),
        };
        self.record(path, action);
    }

    fn record(&mut self, path: &str, action: String) {
        match self.done.len() < MAX_LISTED {
            true => self.done.push(GrantCleanup {
                path: path.to_string(),
                action,
            }),
            false => self.more += 1,
        }
    }

    fn finish(mut self) -> Vec<GrantCleanup> {
        if self.more > 0 {
            let action = format!("and {} more cleanups, not listed", self.more);
            self.done.push(GrantCleanup {
                path: String::new(),
                action,
            });
        }
        if let Some(why) = self.incomplete {
            self.done.push(GrantCleanup {
                path: String::new(),
                action: why,
            });
        }
        self.done
    }
}

fn is_dir(st: &FileStat) -> bool {
    SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT == SFlag::S_IFDIR
}

fn reopen_dir(fd: BorrowedFd<'_>) -> nix::Result<OwnedFd> {
    let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC;
    openat(fd, c".", flags, Mode::empty())
}

/// `name` in `dir`, opened without following it or blocking, if it is
/// still the file `was` describes.
fn open_same(dir: BorrowedFd<'_>, name: &CStr, was: &FileStat) -> nix::Result<OwnedFd> {
    let flags = OFlag::O_RDONLY
        | OFlag::O_NOFOLLOW
        | OFlag::O_NONBLOCK
        | OFlag::O_NOCTTY
        | OFlag::O_CLOEXEC;
    let fd = openat(dir, name, flags, Mode::empty())?;
    let now = fstat(&fd)?;
    match (now.st_dev, now.st_ino) == (was.st_dev, was.st_ino) {
        true => Ok(fd),
        false => Err(nix::errno::Errno::ESTALE),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;
    use std::os::unix::fs::{symlink, PermissionsExt};

    #[test]
    fn set_id_bits_and_others_write_go_a_set_gid_directory_inherits_its_parents() {
        assert_eq!(allowed_mode(0o100644, false, false), Fix::Keep);
        assert_eq!(
            allowed_mode(0o104755, false, false),
            Fix::Chmod {
                from: 0o4755,
                to: 0o755,
                why: "set-uid"
            }
        );
        assert_eq!(
            allowed_mode(0o106755, false, true),
            Fix::Chmod {
                from: 0o6755,
                to: 0o755,
                why: "set-uid and set-gid"
            }
        );
        assert_eq!(
            allowed_mode(0o40777, true, false),
            Fix::Chmod {
                from: 0o777,
                to: 0o775,
                why: "writable by others"
            }
        );
        assert_eq!(allowed_mode(0o42775, true, true), Fix::Keep);
        assert_eq!(
            allowed_mode(0o42775, true, false),
            Fix::Chmod {
                from: 0o2775,
                to: 0o775,
                why: "set-gid"
            }
        );
    }

    #[test]
    fn a_link_may_stay_only_inside_the_grant() {
        assert!(link_leaves(b"/etc/shadow", 3));
        assert!(link_leaves(b"", 0));
        assert!(link_leaves(b"..", 0));
        assert!(link_leaves(b"a/../../b", 0));
        assert!(link_leaves(b"../../x", 1));
        assert!(!link_leaves(b"../x", 1));
        assert!(!link_leaves(b"./a/./b/../c", 0));
        assert!(!link_leaves(b"sub/file", 0));
    }

    #[test]
    fn fifos_sockets_and_devices_are_removed() {
        for kind in [
            SFlag::S_IFIFO,
            SFlag::S_IFSOCK,
            SFlag::S_IFCHR,
            SFlag::S_IFBLK,
        ] {
            assert!(
                matches!(fix_for(kind, 0o644, false, None, 0), Fix::Remove(_)),
                "{kind:?}"
            );
        }
        assert_eq!(
            fix_for(SFlag::S_IFLNK, 0o777, false, Some(b"x"), 0),
            Fix::Keep
        );
    }

    #[test]
    fn only_what_changed_since_the_start_is_swept_and_links_are_not_followed() {
        let d = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        let victim = outside.path().join("victim");
        fs::write(&victim, "").unwrap();
        fs::set_permissions(&victim, fs::Permissions::from_mode(0o666)).unwrap();
        let old = d.path().join("old");
        fs::write(&old, "").unwrap();
        fs::set_permissions(&old, fs::Permissions::from_mode(0o666)).unwrap();
        let now = SystemTime::now();
        let new = d.path().join("sub/new");
        fs::create_dir(d.path().join("sub")).unwrap();
        fs::write(&new, "").unwrap();
        fs::set_permissions(&new, fs::Permissions::from_mode(0o666)).unwrap();
        symlink(&victim, d.path().join("sub/out")).unwrap();
        nix::unistd::mkfifo(&d.path().join("fifo"), Mode::from_bits_truncate(0o644)).unwrap();
        // Nothing changed after a start still to come; everything, after
        // one a minute ago.
        let root = GrantRoot {
            source: nix::fcntl::open(
                d.path(),
                OFlag::O_RDONLY | OFlag::O_DIRECTORY,
                Mode::empty(),
            )
            .unwrap(),
            target: d.path().to_path_buf(),
        };
        let nothing = sweep(std::slice::from_ref(&root), now + Duration::from_secs(60));
        assert_eq!(nothing, vec![]);
        let done = sweep(std::slice::from_ref(&root), now - Duration::from_secs(60));
        let lines: Vec<String> = done.iter().map(GrantCleanup::line).collect();
        let root_path = d.path().display();
        for want in [
            format!("{root_path}/fifo: removed (a FIFO)"),
            format!("{root_path}/sub/out: removed (a symbolic link out of the grant)"),
            format!("{root_path}/sub/new: mode 0666 -> 0664 (writable by others)"),
            format!("{root_path}/old: mode 0666 -> 0664 (writable by others)"),
        ] {
            assert!(lines.contains(&want), "{want} not in {lines:?}");
        }
        let mode = |p: &std::path::Path| fs::metadata(p).unwrap().permissions().mode() & 0o7777;
        assert_eq!(mode(&new), 0o664);
        assert_eq!(mode(&victim), 0o666, "the link's target was followed");
        assert!(!d.path().join("fifo").exists());
    }
}
