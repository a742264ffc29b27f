//! Bind sources, checked on the host and opened again in the jail without a
//! window in between.
//!
//! A bind source is walked from `/` one component at a time with
//! `O_PATH | O_NOFOLLOW`, so no symlink is followed anywhere on the way
//! (a source that is itself a symlink is recreated as that symlink, never
//! followed). The jailer, in the host's user namespace, checks that every
//! component is owned by root and writable by nobody else (no write bit for
//! others, nor for a group other than root's): a directory a less-trusted
//! user could change would let them point a policy's or a venv's mount at
//! any host directory. It records the inode it found. The jail's first
//! process, which sees root as an unmapped uid and so cannot check owners,
//! walks the same way and mounts the source only if it reaches that very
//! inode.

use std::ffi::OsStr;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Component, Path, PathBuf};

use nix::fcntl::{openat, OFlag};
use nix::sys::stat::{fstat, FileStat, Mode, SFlag};

/// Where a checked source leads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(crate) enum SourceId {
    /// A file or directory: its device and inode.
    Inode { dev: u64, ino: u64 },
    /// A symlink, recreated in the jail, never followed.
    Symlink,
}

/// A source reached by [`walk`]: the directory it is in, its name there,
/// the final component opened `O_PATH | O_NOFOLLOW`, and its status.
pub(crate) struct Walked {
    pub parent: OwnedFd,
    pub name: std::ffi::OsString,
    pub fd: OwnedFd,
    pub stat: FileStat,
}

impl Walked {
    pub fn is_symlink(&self) -> bool {
        SFlag::from_bits_truncate(self.stat.st_mode) & SFlag::S_IFMT == SFlag::S_IFLNK
    }

    pub fn is_dir(&self) -> bool {
        SFlag::from_bits_truncate(self.stat.st_mode) & SFlag::S_IFMT == SFlag::S_IFDIR
    }

    pub fn id(&self) -> SourceId {
        if self.is_symlink() {
            SourceId::Symlink
        } else {
            SourceId::Inode {
                dev: self.stat.st_dev,
                ino: self.stat.st_ino,
            }
        }
    }
}

/// Why a walk to a bind source stopped.
#[derive(Debug, thiserror::Error)]
pub(crate) enum WalkError {
    /// A component could not be opened or looked at.
    #[error("{at}: {source}")]
    Open { at: String, source: nix::Error },
    #[error("the source is / itself")]
    IsRoot,
    #[error("{} is not a regular file of at most {max} bytes", .path.display())]
    NotAFile { path: PathBuf, max: u64 },
    #[error("{} is not a directory (a symlink on the way is not followed)", .0.display())]
    NotADirectory(PathBuf),
    #[error("{} {why}; a bind source and every directory above it must be owned by root and writable by no one else", .at.display())]
    Untrusted {
        at: PathBuf,
        why: pycell_wire::spec::Untrusted,
    },
}

/// A bind source refused.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SourceError {
    #[error("mount source {}: {why}", .path.display())]
    Refused { path: PathBuf, why: WalkError },
    #[error("mount source {} changed between the jailer's check and the mount; refusing it", .0.display())]
    Changed(PathBuf),
}

fn open_component(dir: BorrowedFd<'_>, name: &OsStr) -> Result<(OwnedFd, FileStat), WalkError> {
    let failed = |source| WalkError::Open {
        at: name.to_string_lossy().into_owned(),
        source,
    };
    let fd = openat(
        dir,
        name,
        OFlag::O_PATH | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(failed)?;
    let stat = fstat(&fd).map_err(failed)?;
    Ok((fd, stat))
}

/// Walk `path` (absolute, normalized) from `/` without following symlinks;
/// `check` sees every directory on the way (with its path) and the end.
pub(crate) fn walk(
    path: &Path,
    mut check: impl FnMut(&Path, &FileStat) -> Result<(), WalkError>,
) -> Result<Walked, WalkError> {
    let at_root = |source| WalkError::Open {
        at: "/".into(),
        source,
    };
    let root = nix::fcntl::open(
        "/",
        OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(at_root)?;
    let root_stat = fstat(&root).map_err(at_root)?;
    check(Path::new("/"), &root_stat)?;
    let names: Vec<&OsStr> = path
        .components()
        .filter_map(|c| match c {
            Component::Normal(n) => Some(n),
            _ => None,
        })
        .collect();
    let Some((last, dirs)) = names.split_last() else {
        return Err(WalkError::IsRoot);
    };
    let mut parent = root;
    let mut so_far = Path::new("/").to_path_buf();
    for name in dirs {
        so_far.push(name);
        let (fd, stat) = open_component(parent.as_fd(), name)?;
        if SFlag::from_bits_truncate(stat.st_mode) & SFlag::S_IFMT != SFlag::S_IFDIR {
            return Err(WalkError::NotADirectory(so_far));
        }
        check(&so_far, &stat)?;
        parent = fd;
    }
    let (fd, stat) = open_component(parent.as_fd(), last)?;
    let walked = Walked {
        parent,
        name: last.to_os_string(),
        fd,
        stat,
    };
    if !walked.is_symlink() {
        check(path, &walked.stat)?;
    }
    Ok(walked)
}

pub(crate) use pycell_wire::spec::trusted;

/// Host side: check `path` and say where it leads.
pub(crate) fn check_on_host(path: &Path) -> Result<SourceId, SourceError> {
    let walked = walk(path, |at, st| {
        trusted(st.st_uid, st.st_gid, st.st_mode).map_err(|why| WalkError::Untrusted {
            at: at.to_path_buf(),
            why,
        })
    })
    .map_err(|why| SourceError::Refused {
        path: path.to_path_buf(),
        why,
    })?;
    Ok(walked.id())
}

/// Host side: open the regular file at `path` for reading, every
/// component checked as a bind source's are, and at most `max` bytes.
pub(crate) fn open_trusted_file(path: &Path, max: u64) -> Result<OwnedFd, SourceError> {
    let refused = |why| SourceError::Refused {
        path: path.to_path_buf(),
        why,
    };
    let walked = walk(path, |at, st| {
        trusted(st.st_uid, st.st_gid, st.st_mode).map_err(|why| WalkError::Untrusted {
            at: at.to_path_buf(),
            why,
        })
    })
    .map_err(refused)?;
    let regular = SFlag::from_bits_truncate(walked.stat.st_mode) & SFlag::S_IFMT == SFlag::S_IFREG;
    if !regular || walked.stat.st_size < 0 || walked.stat.st_size as u64 > max {
        return Err(refused(WalkError::NotAFile {
            path: path.to_path_buf(),
            max,
        }));
    }
    let open_failed = |source| {
        refused(WalkError::Open {
            at: path.display().to_string(),
            source,
        })
    };
    let fd = openat(
        walked.parent.as_fd(),
        walked.name.as_os_str(),
        OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(open_failed)?;
    let now = fstat(&fd).map_err(open_failed)?;
    if (now.st_dev, now.st_ino) != (walked.stat.st_dev, walked.stat.st_ino) {
        return Err(SourceError::Changed(path.to_path_buf()));
    }
    Ok(fd)
}

/// Jail side: walk `path` again and insist on reaching `expected`.
pub(crate) fn reopen_in_jail(path: &Path, expected: SourceId) -> Result<Walked, SourceError> {
    let walked = walk(path, |_, _| Ok(())).map_err(|why| SourceError::Refused {
        path: path.to_path_buf(),
        why,
    })?;
    if walked.id() != expected {
        return Err(SourceError::Changed(path.to_path_buf()));
    }
    Ok(walked)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_root_owned_and_not_writable_by_others() {
        assert!(trusted(0, 0, 0o40755).is_ok());
        assert!(trusted(0, 0, 0o40775).is_ok(), "root's group may write");
        assert!(trusted(1000, 0, 0o40755)
            .unwrap_err()
            .to_string()
            .contains("uid 1000"));
        assert!(trusted(0, 0, 0o41777)
            .unwrap_err()
            .to_string()
            .contains("others"));
        assert!(trusted(0, 50, 0o40775)
            .unwrap_err()
            .to_string()
            .contains("group 50"));
    }

    #[test]
    fn a_path_through_a_symlink_is_not_followed() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("real")).unwrap();
        std::os::unix::fs::symlink("real", dir.path().join("link")).unwrap();
        let through = dir.path().join("link/x");
        std::fs::write(dir.path().join("real/x"), b"").unwrap();
        let e = walk(&through, |_, _| Ok(())).err().unwrap().to_string();
        assert!(e.contains("not a directory"), "{e}");
        let at_end = walk(&dir.path().join("link"), |_, _| Ok(())).unwrap();
        assert!(at_end.is_symlink());
        assert_eq!(at_end.id(), SourceId::Symlink);
    }

    #[test]
    fn a_source_under_a_world_writable_directory_is_refused() {
        // The temp dir lives under /tmp (mode 1777).
        let dir = tempfile::tempdir().unwrap();
        let e = check_on_host(dir.path()).unwrap_err().to_string();
        assert!(
            e.contains("writable by others") || e.contains("not root"),
            "{e}"
        );
        assert!(check_on_host(Path::new("/usr")).is_ok());
    }
}
