//! The server's stdio, relayed: our stdin to its socket and its socket to
//! our stdout, byte for byte, each way on a thread of its own (blocking
//! reads: a message goes on as soon as it is read, never waiting for more).

use std::io::{Read, Write};
use std::net::Shutdown;
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Mutex};

use tokio::sync::oneshot;

/// The size of one read.
const CHUNK: usize = 64 * 1024;

/// Relay between our stdio and `sock` (the server's stdin and stdout);
/// `closed` fires once the client has closed its side: our stdin ended
/// (the server then reads EOF) or our stdout is gone.
pub fn start(sock: OwnedFd, closed: oneshot::Sender<()>) {
    let sock = UnixStream::from(sock);
    let Ok(up_sock) = sock.try_clone() else {
        let _ = closed.send(());
        return;
    };
    let closed = Arc::new(Mutex::new(Some(closed)));
    let up_closed = Arc::clone(&closed);
    std::thread::spawn(move || {
        pump(std::io::stdin().lock(), &up_sock);
        let _ = up_sock.shutdown(Shutdown::Write);
        fire(&up_closed);
    });
    std::thread::spawn(move || {
        if pump(&sock, std::io::stdout().lock()) == Ended::WriteFailed {
            fire(&closed);
        }
    });
}

fn fire(closed: &Mutex<Option<oneshot::Sender<()>>>) {
    if let Some(tx) = closed.lock().unwrap_or_else(|p| p.into_inner()).take() {
        let _ = tx.send(());
    }
}

/// How a pump ended.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Ended {
    /// Its source ended (or broke).
    SourceEnded,
    /// Its destination would take no more.
    WriteFailed,
}

/// Copy `from` to `to`, flushing after each read, until either ends.
pub(crate) fn pump(mut from: impl Read, mut to: impl Write) -> Ended {
    let mut buf = vec![0u8; CHUNK];
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) => return Ended::SourceEnded,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => return Ended::SourceEnded,
        };
        if to.write_all(&buf[..n]).and_then(|()| to.flush()).is_err() {
            return Ended::WriteFailed;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pump_copies_everything_and_says_which_side_ended() {
        let data: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
        let mut out = Vec::new();
        assert_eq!(pump(&data[..], &mut out), Ended::SourceEnded);
        assert_eq!(out, data);
        let mut full = [0u8; 10];
        assert_eq!(pump(&data[..], &mut full[..]), Ended::WriteFailed);
    }
}
