//! A session cell's output past its cap, kept whole in the session's
//! workspace: `/workspace/outputs/cell-N-stdout.txt` (or `-stderr`) gets
//! every byte of the stream after the part the answer carries, so that
//! the answer's head and this file together are all the cell printed.
//! One-shot runs keep none (their workspace ends with them).
//!
//! The file is created with the sandbox's own rights: a short-lived
//! thread takes the sandbox's filesystem ids (they are per thread, and so
//! are the capabilities and the parent-death signal the switch clears),
//! makes `outputs` and the file relative to the jail's /workspace without
//! following a symlink, and ends. The relay then writes to it, at most a
//! quarter of the disk budget (the tmpfs's size) per stream, so that the
//! cell's own files keep at least half of it; a write that fails ends it.

use std::fs::File;
use std::io::{self, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use nix::errno::Errno;
use nix::fcntl::{openat, OFlag};
use nix::sys::stat::{mkdirat, Mode};
use nix::unistd::{setfsgid, setfsuid, Gid, Uid};
use pycell_wire::events::Stream;
use pycell_wire::report::StreamTail;

/// The directory of /workspace the files go in.
const DIR: &str = "outputs";

/// Where cell `cell`'s `stream` past its cap goes, as the jail sees it.
pub(crate) fn rest_path(cell: u64, stream: Stream) -> String {
    format!(
        "{}/{DIR}/{}",
        pycell_wire::spec::WORKSPACE,
        file_name(cell, stream)
    )
}

fn file_name(cell: u64, stream: Stream) -> String {
    let name = match stream {
        Stream::Stdout => "stdout",
        Stream::Stderr => "stderr",
    };
    format!("cell-{cell}-{name}.txt")
}

/// One stream's file, once its output went past the cap.
#[derive(Debug)]
pub(crate) struct RestFile {
    file: Option<File>,
    path: String,
    written: u64,
    /// The most it may hold.
    limit: u64,
}

/// The share of the disk budget one stream's file may take.
const SHARE_OF_BUDGET: u64 = 4;

impl RestFile {
    /// The file for cell `cell`'s `stream`, made in `workspace` as
    /// `owner` (uid, gid); None if it cannot be (a name the code already
    /// took, a full disk budget).
    pub fn create(
        workspace: BorrowedFd<'_>,
        cell: u64,
        stream: Stream,
        owner: (u32, u32),
    ) -> Option<RestFile> {
        let budget = nix::sys::statvfs::fstatvfs(workspace)
            .map(|s| s.blocks() * s.fragment_size())
            .ok()?;
        let workspace = workspace.try_clone_to_owned().ok()?;
        let name = file_name(cell, stream);
        let made = std::thread::scope(|s| {
            // A thread that cannot be made (the jail's pids limit, say)
            // makes no file; the relay goes on.
            std::thread::Builder::new()
                .name("rest-file".into())
                .spawn_scoped(s, || create_as(owner, &workspace, &name))
                .ok()?
                .join()
                .ok()
        })?;
        Some(RestFile {
            file: Some(File::from(made.ok()?)),
            path: rest_path(cell, stream),
            written: 0,
            limit: budget / SHARE_OF_BUDGET,
        })
    }

    /// Append `bytes`, as far as the file's share of the disk budget
    /// goes; after that, or a failed write, nothing more is written.
    pub fn write(&mut self, bytes: &[u8]) {
        let Some(f) = self.file.as_mut() else { return };
        let room = usize::try_from(self.limit - self.written).unwrap_or(usize::MAX);
        let take = &bytes[..bytes.len().min(room)];
        match f.write_all(take) {
            Ok(()) => self.written += take.len() as u64,
            Err(_) => self.file = None,
        }
        if take.len() < bytes.len() {
            self.file = None;
        }
    }

    /// `tail` naming this file and what it holds.
    pub fn name_in(&self, mut tail: StreamTail) -> StreamTail {
        tail.rest_file = Some(self.path.clone());
        tail.rest_file_bytes = self.written;
        tail
    }
}

/// In this thread only: take `owner`'s filesystem ids, then make
/// `outputs` (if missing) and a new file `name` in it, relative to
/// `workspace`, following no symlink.
fn create_as(owner: (u32, u32), workspace: &OwnedFd, name: &str) -> io::Result<OwnedFd> {
    let (uid, gid) = (Uid::from_raw(owner.0), Gid::from_raw(owner.1));
    setfsgid(gid);
    setfsuid(uid);
    // setfsuid answers with the previous id: asking again with an invalid
    // one tells whether the switch took.
    if setfsuid(Uid::from_raw(u32::MAX)) != uid || setfsgid(Gid::from_raw(u32::MAX)) != gid {
        return Err(io::Error::other(
            "the sandbox's filesystem ids did not take",
        ));
    }
    let ws = workspace.as_fd();
    match mkdirat(ws, DIR, Mode::from_bits_truncate(0o755)) {
        Ok(()) | Err(Errno::EEXIST) => {}
        Err(e) => return Err(e.into()),
    }
    let dir_flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    let dir = openat(ws, DIR, dir_flags, Mode::empty())?;
    let file_flags =
        OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    Ok(openat(
        dir.as_fd(),
        name,
        file_flags,
        Mode::from_bits_truncate(0o644),
    )?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_files_are_named_by_cell_and_stream() {
        assert_eq!(
            rest_path(3, Stream::Stdout),
            "/workspace/outputs/cell-3-stdout.txt"
        );
        assert_eq!(file_name(12, Stream::Stderr), "cell-12-stderr.txt");
    }

    /// As root, in a directory of its own: the file is made as the given
    /// ids, never over a name the code took, never through a symlink.
    #[test]
    fn a_rest_file_is_the_owners_new_file_and_never_follows_a_link() {
        if !nix::unistd::geteuid().is_root() {
            panic!("this test needs root (it makes files as another uid)");
        }
        let dir = tempfile::tempdir().unwrap();
        let owner = (4321, 4321);
        std::os::unix::fs::chown(dir.path(), Some(owner.0), Some(owner.1)).unwrap();
        let ws = File::open(dir.path()).unwrap();
        let mut rest = RestFile::create(ws.as_fd(), 1, Stream::Stdout, owner).unwrap();
        rest.write(b"past the cap\n");
        let path = dir.path().join("outputs/cell-1-stdout.txt");
        assert_eq!(std::fs::read(&path).unwrap(), b"past the cap\n");
        let meta = std::fs::metadata(&path).unwrap();
        use std::os::unix::fs::MetadataExt;
        assert_eq!((meta.uid(), meta.gid()), owner);
        // Past its share of the disk budget, nothing more is written.
        let mut small = RestFile::create(ws.as_fd(), 9, Stream::Stderr, owner).unwrap();
        small.limit = 10;
        small.write(b"0123456");
        small.write(b"789abc");
        small.write(b"def");
        assert_eq!(small.written, 10);
        let kept = std::fs::read(dir.path().join("outputs/cell-9-stderr.txt")).unwrap();
        assert_eq!(kept, b"0123456789");
        // The same name again (the code could have made it): no file.
        assert!(RestFile::create(ws.as_fd(), 1, Stream::Stdout, owner).is_none());
        // `outputs` a symlink to elsewhere: no file there.
        let elsewhere = tempfile::tempdir().unwrap();
        let ws2 = tempfile::tempdir().unwrap();
        std::os::unix::fs::chown(ws2.path(), Some(owner.0), Some(owner.1)).unwrap();
        std::os::unix::fs::symlink(elsewhere.path(), ws2.path().join("outputs")).unwrap();
        let ws2_fd = File::open(ws2.path()).unwrap();
        assert!(RestFile::create(ws2_fd.as_fd(), 2, Stream::Stderr, owner).is_none());
        assert_eq!(std::fs::read_dir(elsewhere.path()).unwrap().count(), 0);
        // This thread's ids were never changed.
        assert!(nix::unistd::geteuid().is_root());
        assert_eq!(setfsuid(Uid::from_raw(u32::MAX)), Uid::from_raw(0));
    }
}
