//! The files a run created or changed in /workspace, listed by the jailer
//! once the jail is gone, from the descriptor of /workspace it holds (for
//! the disk accounting). The tree was the sandbox's: every component is
//! opened relative to its parent with `O_NOFOLLOW`, only regular files are
//! read, and the walk is bounded (entries scanned, depth, files listed,
//! bytes hashed) so that a hostile tree costs the jailer little. Names are
//! reported as they are (lossily as UTF-8), never interpreted.

use std::io::Read;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use nix::dir::Dir;
use nix::fcntl::{openat, AtFlags, OFlag};
use nix::sys::stat::{fstatat, Mode, SFlag};
use sha2::{Digest, Sha256};

use pycell_wire::report::ChangedFile;
use pycell_wire::spec::{WorkspaceFile, WORKSPACE};

/// Directory entries looked at, at most.
const MAX_SCANNED: usize = 10_000;
/// Directories below /workspace followed, at most this deep.
const MAX_DEPTH: usize = 16;
/// Files listed, at most.
pub(crate) const MAX_LISTED: usize = 100;
/// Bytes read to hash files, at most, for all files together: past it a
/// file is listed without its sha256.
const HASH_BUDGET: u64 = 64 << 20;

/// What the walk found.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct Changes {
    pub files: Vec<ChangedFile>,
    pub truncated: bool,
}

/// The files under `workspace` that the run created, or whose contents
/// differ from the `inputs` it was given.
pub(crate) fn changed_files(workspace: BorrowedFd<'_>, inputs: &[WorkspaceFile]) -> Changes {
    let mut walk = Walk {
        scanned: 0,
        budget: HASH_BUDGET,
        found: Vec::new(),
        truncated: false,
    };
    if let Ok(top) = reopen(workspace) {
        walk.dir(top, String::new(), 0);
    }
    let mut files: Vec<ChangedFile> = walk
        .found
        .into_iter()
        .filter(|f| !unchanged_input(f, inputs))
        .collect();
    files.sort_by(|a, b| a.path.cmp(&b.path));
    let truncated = walk.truncated || files.len() > MAX_LISTED;
    files.truncate(MAX_LISTED);
    Changes { files, truncated }
}

/// A readable descriptor of the directory `fd` (which may be `O_PATH`).
fn reopen(fd: BorrowedFd<'_>) -> nix::Result<OwnedFd> {
    openat(
        fd,
        ".",
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
}

/// Whether `f` is one of the run's inputs, as it was given.
fn unchanged_input(f: &ChangedFile, inputs: &[WorkspaceFile]) -> bool {
    let Some(name) = f.path.strip_prefix(&format!("{WORKSPACE}/")) else {
        return false;
    };
    inputs.iter().any(|i| {
        i.name == name
            && i.bytes().len() as u64 == f.size
            && f.sha256.as_deref() == Some(hex_sha256(i.bytes()).as_str())
    })
}

fn hex_sha256(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

struct Walk {
    scanned: usize,
    budget: u64,
    found: Vec<ChangedFile>,
    truncated: bool,
}

impl Walk {
    /// The entries of the directory `dir` (at `rel` below /workspace).
    fn dir(&mut self, dir: OwnedFd, rel: String, depth: usize) {
        let Ok(mut listing) = Dir::from_fd(dir) else {
            return;
        };
        let mut subdirs = Vec::new();
        let mut files = Vec::new();
        for entry in listing.iter() {
            let Ok(entry) = entry else { break };
            let name = entry.file_name().to_bytes().to_vec();
            if name == b"." || name == b".." {
                continue;
            }
            self.scanned += 1;
            if self.scanned > MAX_SCANNED {
                self.truncated = true;
                break;
            }
            files.push(name);
        }
        let fd = listing.as_fd();
        for name in files {
            let path = format!("{rel}/{}", String::from_utf8_lossy(&name));
            let Ok(cname) = std::ffi::CString::new(name) else {
                continue;
            };
            let Ok(st) = fstatat(fd, cname.as_c_str(), AtFlags::AT_SYMLINK_NOFOLLOW) else {
                continue;
            };
            match SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT {
                SFlag::S_IFDIR if depth < MAX_DEPTH => subdirs.push((cname, path)),
                SFlag::S_IFDIR => self.truncated = true,
                SFlag::S_IFREG => {
                    let sha256 = self.hash(fd, &cname, st.st_size as u64);
                    self.found.push(ChangedFile {
                        path: format!("{WORKSPACE}{path}"),
                        size: st.st_size as u64,
                        sha256,
                        created: true,
                    });
                }
                _ => {}
            }
        }
        for (cname, path) in subdirs {
            let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
            if let Ok(sub) = openat(fd, cname.as_c_str(), flags, Mode::empty()) {
                self.dir(sub, path, depth + 1);
            }
        }
    }

    /// The sha256 of a regular file, if the budget has room for it and it
    /// is (still) a regular file we may read.
    fn hash(&mut self, dir: BorrowedFd<'_>, name: &std::ffi::CStr, size: u64) -> Option<String> {
        if size > self.budget {
            self.budget = 0;
            return None;
        }
        let flags = OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC;
        let fd = openat(dir, name, flags, Mode::empty()).ok()?;
        let st = nix::sys::stat::fstat(&fd).ok()?;
        if SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT != SFlag::S_IFREG {
            return None;
        }
        let mut file = std::fs::File::from(fd).take(size);
        let mut digest = Sha256::new();
        let mut buf = vec![0u8; 64 << 10];
        let mut read = 0u64;
        loop {
            match file.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => {
                    digest.update(&buf[..n]);
                    read += n as u64;
                }
                Err(_) => return None,
            }
        }
        self.budget = self.budget.saturating_sub(read);
        (read == size).then(|| {
            digest
                .finalize()
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    fn walk(dir: &std::path::Path, inputs: &[WorkspaceFile]) -> Changes {
        let fd = nix::fcntl::open(dir, OFlag::O_PATH | OFlag::O_DIRECTORY, Mode::empty()).unwrap();
        changed_files(fd.as_fd(), inputs)
    }

    #[test]
    fn new_and_changed_files_are_listed_with_their_hash_and_links_are_not_followed() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("main.py"), "print(1)").unwrap();
        std::fs::write(d.path().join("in.csv"), "changed").unwrap();
        std::fs::create_dir_all(d.path().join("out/deep")).unwrap();
        std::fs::write(d.path().join("out/deep/r.txt"), "abc").unwrap();
        symlink("/etc", d.path().join("etc")).unwrap();
        symlink("/etc/passwd", d.path().join("passwd")).unwrap();
        let inputs = [
            WorkspaceFile::text("main.py", "print(1)"),
            WorkspaceFile::text("in.csv", "original"),
        ];
        let c = walk(d.path(), &inputs);
        let paths: Vec<&str> = c.files.iter().map(|f| f.path.as_str()).collect();
        assert_eq!(paths, ["/workspace/in.csv", "/workspace/out/deep/r.txt"]);
        assert_eq!(
            c.files[1].sha256.as_deref(),
            Some("ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad")
        );
        assert_eq!(c.files[1].size, 3);
        assert!(!c.truncated);
    }

    #[test]
    fn a_large_tree_is_cut_short_and_says_so() {
        let d = tempfile::tempdir().unwrap();
        for i in 0..(MAX_LISTED + 5) {
            std::fs::write(d.path().join(format!("f{i:03}")), "x").unwrap();
        }
        let c = walk(d.path(), &[]);
        assert_eq!(c.files.len(), MAX_LISTED);
        assert!(c.truncated);
        let mut deep = d.path().join("deep");
        for _ in 0..(MAX_DEPTH + 3) {
            deep = deep.join("d");
        }
        std::fs::create_dir_all(&deep).unwrap();
        std::fs::write(deep.join("hidden"), "x").unwrap();
        let c = walk(d.path(), &[]);
        assert!(c.files.iter().all(|f| !f.path.ends_with("hidden")));
    }
}
