//! Descriptor passing over unix sockets, in safe code (rustix's
//! `sendmsg`/`recvmsg` hand received descriptors over as `OwnedFd`):
//! between pycelld's processes, and from a jailer to whoever runs its
//! egress proxy.

use std::io::{self, IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use rustix::net::{
    recvmsg, sendmsg, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags,
};

/// Most descriptors one message carries.
const MAX_FDS: usize = 16;

/// Send all of `data` on a unix stream socket with `fds` attached to its
/// first byte.
pub fn send_with_fds(sock: BorrowedFd<'_>, data: &[u8], fds: &[BorrowedFd<'_>]) -> io::Result<()> {
    let sent = send_some_with_fds(sock, data, fds)?;
    // The descriptors went with the first part; the rest is plain data.
    let mut rest = &data[sent..];
    while !rest.is_empty() {
        let n = rustix::io::write(sock, rest)?;
        rest = &rest[n..];
    }
    Ok(())
}

/// One `sendmsg` of `data` (or of its first part: the count is returned)
/// with `fds` attached: for a non-blocking socket, whose caller writes
/// the rest as it can.
pub fn send_some_with_fds(
    sock: BorrowedFd<'_>,
    data: &[u8],
    fds: &[BorrowedFd<'_>],
) -> io::Result<usize> {
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    if !fds.is_empty() && !control.push(SendAncillaryMessage::ScmRights(fds)) {
        return Err(io::Error::other("too many descriptors for one message"));
    }
    let sent = sendmsg(
        sock,
        &[IoSlice::new(data)],
        &mut control,
        SendFlags::empty(),
    )?;
    Ok(sent)
}

/// A unix stream socket read with `recvmsg`, keeping the descriptors that
/// come with the bytes (see [`FdReader::take`]).
#[derive(Debug)]
pub struct FdReader<'a, S: AsFd> {
    pub stream: &'a S,
    fds: Vec<OwnedFd>,
}

impl<'a, S: AsFd> FdReader<'a, S> {
    pub fn new(stream: &'a S) -> FdReader<'a, S> {
        FdReader {
            stream,
            fds: Vec::new(),
        }
    }

    /// The descriptors received since the last call.
    pub fn take(&mut self) -> Vec<OwnedFd> {
        std::mem::take(&mut self.fds)
    }
}

impl<S: AsFd> io::Read for FdReader<'_, S> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let (n, fds) = recv_with_fds(self.stream.as_fd(), buf)?;
        self.fds.extend(fds);
        Ok(n)
    }
}

/// Receive into `buf` from a unix stream socket, taking any descriptors
/// that came with it (close-on-exec). Returns the byte count and them.
pub fn recv_with_fds(sock: BorrowedFd<'_>, buf: &mut [u8]) -> io::Result<(usize, Vec<OwnedFd>)> {
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let msg = recvmsg(
        sock,
        &mut [IoSliceMut::new(buf)],
        &mut control,
        RecvFlags::CMSG_CLOEXEC,
    )?;
    let mut fds = Vec::new();
    for m in control.drain() {
        if let RecvAncillaryMessage::ScmRights(received) = m {
            fds.extend(received);
        }
    }
    Ok((msg.bytes, fds))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Seek, Write};
    use std::os::unix::net::UnixStream;

    #[test]
    fn descriptors_travel_with_the_data() {
        let (a, b) = UnixStream::pair().unwrap();
        let mut file = tempfile::tempfile().unwrap();
        file.write_all(b"passed").unwrap();
        send_with_fds(a.as_fd(), b"hello", &[file.as_fd()]).unwrap();
        let mut buf = [0u8; 16];
        let (n, fds) = recv_with_fds(b.as_fd(), &mut buf).unwrap();
        assert_eq!(&buf[..n], b"hello");
        assert_eq!(fds.len(), 1);
        let mut got = std::fs::File::from(fds.into_iter().next().unwrap());
        got.rewind().unwrap();
        let mut s = String::new();
        got.read_to_string(&mut s).unwrap();
        assert_eq!(s, "passed");
    }
}
