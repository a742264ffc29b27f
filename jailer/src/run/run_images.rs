//! A python run's way back: its stdin is a socket, on which the runner,
//! once the run's code is done, sends one frame (a 4-byte big-endian
//! length, then JSON) with the figures it left open and the image files it
//! wrote (see `pycell_runner`). The jailer reads it, bounded, without
//! parsing it, and passes it on as a reply event before the result; the
//! launcher checks it. The program can write on its stdin too: whatever
//! comes is the run's own and is treated as untrusted.

use std::fs::File;
use std::io::{self, Read};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use pycell_wire::events::MAX_REPLY;

/// The most a run may send back (a larger frame is dropped whole).
const MAX_BACK: usize = MAX_REPLY as usize + 4;

/// Our end of a run's stdin socket, for reading what comes back.
pub(crate) struct BackChannel {
    socket: Option<File>,
    buf: Vec<u8>,
    /// More came than a run may send: nothing is passed on.
    overflowed: bool,
}

impl BackChannel {
    /// A second handle on the stdin socket (`ours`), which the relay goes
    /// on writing the run's stdin to.
    pub(crate) fn new(ours: &OwnedFd) -> io::Result<BackChannel> {
        let socket = ours.try_clone()?;
        nix::fcntl::fcntl(
            &socket,
            nix::fcntl::FcntlArg::F_SETFL(nix::fcntl::OFlag::O_NONBLOCK),
        )?;
        Ok(BackChannel {
            socket: Some(File::from(socket)),
            buf: Vec::new(),
            overflowed: false,
        })
    }

    /// The run's stdin is all written: the program sees its end.
    pub(crate) fn end_stdin(&self) {
        if let Some(s) = &self.socket {
            use std::os::fd::AsRawFd;
            let _ = nix::sys::socket::shutdown(s.as_raw_fd(), nix::sys::socket::Shutdown::Write);
        }
    }

    /// The descriptor to wait on while it may bring more.
    pub(crate) fn fd(&self) -> Option<BorrowedFd<'_>> {
        self.socket.as_ref().map(|s| s.as_fd())
    }

    /// Read what is there; the channel closes at its end or on overflow.
    pub(crate) fn read(&mut self) {
        let Some(s) = self.socket.as_mut() else {
            return;
        };
        let mut chunk = [0u8; 64 << 10];
        loop {
            match s.read(&mut chunk) {
                Ok(0) => break,
                Ok(n) if self.buf.len() + n > MAX_BACK => {
                    self.overflowed = true;
                    self.buf = Vec::new();
                    break;
                }
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => break,
            }
        }
        self.socket = None;
    }

    /// The frame's body, if exactly one whole frame came.
    pub(crate) fn take_frame(mut self) -> Option<Vec<u8>> {
        self.read();
        if self.overflowed {
            return None;
        }
        one_frame(self.buf)
    }
}

/// `buf` as one frame's body: a 4-byte big-endian length and exactly that
/// many bytes.
fn one_frame(mut buf: Vec<u8>) -> Option<Vec<u8>> {
    let head: [u8; 4] = buf.get(..4)?.try_into().ok()?;
    let len = u32::from_be_bytes(head) as usize;
    if buf.len() != 4 + len || len == 0 {
        return None;
    }
    Some(buf.split_off(4))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixStream;

    #[test]
    fn only_one_whole_frame_is_passed_on() {
        let frame = |body: &[u8]| {
            let mut v = (body.len() as u32).to_be_bytes().to_vec();
            v.extend_from_slice(body);
            v
        };
        assert_eq!(one_frame(frame(b"{}")), Some(b"{}".to_vec()));
        assert_eq!(one_frame(frame(b"")), None);
        let mut two = frame(b"{}");
        two.extend(frame(b"{}"));
        assert_eq!(one_frame(two), None);
        let cut = frame(b"{\"images\": []}")[..6].to_vec();
        assert_eq!(one_frame(cut), None);
        assert_eq!(one_frame(vec![0, 0]), None);
    }

    #[test]
    fn what_the_run_sends_is_read_after_its_stdin_ends() {
        let (ours, theirs) = UnixStream::pair().unwrap();
        let ours = OwnedFd::from(ours);
        let back = BackChannel::new(&ours).unwrap();
        back.end_stdin();
        let mut theirs = theirs;
        let mut stdin = Vec::new();
        theirs.read_to_end(&mut stdin).unwrap();
        assert!(stdin.is_empty(), "the run sees the end of its stdin");
        use std::io::Write;
        theirs.write_all(&[0, 0, 0, 2, b'{', b'}']).unwrap();
        drop(theirs);
        drop(ours);
        assert_eq!(back.take_frame(), Some(b"{}".to_vec()));
    }
}
