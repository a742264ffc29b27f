//! Descriptors the jail hands out, each with a frame naming what it is: a
//! 4-byte big-endian length, then a JSON [`Handout`], with the descriptor
//! attached to the frame's first byte. The jail's first process sends them
//! on the jailer's stdin socket (to its launcher) and on the jailer's own
//! socketpair; a new kind of channel is one more variant, not one more
//! position in a fixed order.

use std::io;
use std::os::fd::{BorrowedFd, OwnedFd};

use serde::{Deserialize, Serialize};

use crate::fdpass::{recv_with_fds, send_with_fds};
use crate::framing::{decode, encode_within, frame_len};

/// The largest handout frame.
pub const MAX_HANDOUT_FRAME: u64 = 1024;

/// What a handed-out descriptor is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Handout {
    /// The jail's /workspace, a directory: `O_PATH` for the jailer's disk
    /// measurement, read-only for the install jail's launcher, which
    /// copies the built env out of it.
    Workspace,
    /// The listening socket of the egress proxy on the jail's loopback.
    EgressListener,
    /// The launcher's end of the jail's tool channel (code mode): the
    /// program's `pycell_tools` requests arrive on it.
    ToolChannel,
    /// A zygote's channel (a seqpacket socket): each message on it is one
    /// run's fork request, with that run's descriptors.
    ZygoteChannel,
    /// The launcher's end of the program's stdin and stdout (a stream
    /// socket), for a server over stdio.
    Stdio,
    /// The listener of the jail's seccomp filter, to the jailer only: the
    /// calls the filter refuses with EPERM wait on it for their answer.
    SeccompListener,
}

/// Hand `fd` out on `sock` as `what`.
pub fn send(sock: BorrowedFd<'_>, what: Handout, fd: BorrowedFd<'_>) -> io::Result<()> {
    let frame = encode_within(&what, MAX_HANDOUT_FRAME).map_err(io::Error::other)?;
    send_with_fds(sock, &frame, &[fd])
}

/// Read one whole handout frame with `read` (a blocking `recv_with_fds`,
/// or a non-blocking one that waits for readiness), collecting the
/// descriptors that came with it; `None` at a clean end of the stream.
pub fn read_frame(
    mut read: impl FnMut(&mut [u8]) -> io::Result<(usize, Vec<OwnedFd>)>,
) -> io::Result<Option<(Handout, OwnedFd)>> {
    let mut fds = Vec::new();
    let mut head = [0u8; 4];
    if !fill(&mut read, &mut head, &mut fds, true)? {
        return Ok(None);
    }
    let len = frame_len(head, MAX_HANDOUT_FRAME).map_err(io::Error::other)?;
    let mut body = vec![0u8; len];
    fill(&mut read, &mut body, &mut fds, false)?;
    let what: Handout = decode(&body).map_err(io::Error::other)?;
    let fd = fds
        .into_iter()
        .next()
        .ok_or_else(|| io::Error::other(format!("a {what:?} handout without its descriptor")))?;
    Ok(Some((what, fd)))
}

/// Fill `buf`; false if the stream ended before its first byte (and
/// `at_start`).
fn fill(
    read: &mut impl FnMut(&mut [u8]) -> io::Result<(usize, Vec<OwnedFd>)>,
    buf: &mut [u8],
    fds: &mut Vec<OwnedFd>,
    at_start: bool,
) -> io::Result<bool> {
    let mut got = 0;
    while got < buf.len() {
        let (n, mut more) = read(&mut buf[got..])?;
        fds.append(&mut more);
        if n == 0 {
            if at_start && got == 0 {
                return Ok(false);
            }
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        got += n;
    }
    Ok(true)
}

/// The next handout on a blocking socket.
pub fn recv(sock: BorrowedFd<'_>) -> io::Result<Option<(Handout, OwnedFd)>> {
    read_frame(|buf| recv_with_fds(sock, buf))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Seek, Write};
    use std::os::fd::AsFd;
    use std::os::unix::net::UnixStream;

    #[test]
    fn each_descriptor_comes_with_what_it_is() {
        let (a, b) = UnixStream::pair().unwrap();
        let mut file = tempfile::tempfile().unwrap();
        file.write_all(b"workspace").unwrap();
        send(a.as_fd(), Handout::Workspace, file.as_fd()).unwrap();
        send(a.as_fd(), Handout::EgressListener, file.as_fd()).unwrap();
        drop(a);
        let (what, fd) = recv(b.as_fd()).unwrap().unwrap();
        assert_eq!(what, Handout::Workspace);
        let mut got = std::fs::File::from(fd);
        got.rewind().unwrap();
        let mut text = String::new();
        got.read_to_string(&mut text).unwrap();
        assert_eq!(text, "workspace");
        assert_eq!(recv(b.as_fd()).unwrap().unwrap().0, Handout::EgressListener);
        assert!(recv(b.as_fd()).unwrap().is_none());
    }

    #[test]
    fn a_frame_without_its_descriptor_or_of_another_kind_is_refused() {
        let (mut a, b) = UnixStream::pair().unwrap();
        a.write_all(&encode_within(&Handout::Workspace, MAX_HANDOUT_FRAME).unwrap())
            .unwrap();
        let e = recv(b.as_fd()).unwrap_err();
        assert!(e.to_string().contains("without its descriptor"), "{e}");
        let (mut a, b) = UnixStream::pair().unwrap();
        a.write_all(&encode_within(&"tool_channel", MAX_HANDOUT_FRAME).unwrap())
            .unwrap();
        assert!(recv(b.as_fd()).is_err());
    }
}
