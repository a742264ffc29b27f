//! Descriptors that come with a client's messages (SCM_RIGHTS): a `run`
//! message's grants. The reader takes every descriptor that arrives and
//! keeps those of a `run` that names grants, by the run's id, for the run
//! to claim; any other is closed at once.

use std::collections::VecDeque;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{ready, Context, Poll};

use pycell_protocol::messages::ClientMessage;
use tokio::io::{AsyncRead, Interest, ReadBuf};
use tokio::net::unix::OwnedReadHalf;

/// Runs' descriptors not yet claimed: one run at a time is served on a
/// connection, so a couple at most (older ones are closed).
const KEPT: usize = 2;

/// A connection's read half, read with `recvmsg`.
pub(super) struct WithFds {
    half: OwnedReadHalf,
    fds: Vec<OwnedFd>,
}

impl WithFds {
    pub(super) fn new(half: OwnedReadHalf) -> WithFds {
        WithFds {
            half,
            fds: Vec::new(),
        }
    }

    /// The descriptors that came since the last call.
    pub(super) fn take(&mut self) -> Vec<OwnedFd> {
        std::mem::take(&mut self.fds)
    }
}

impl AsyncRead for WithFds {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let sock: &tokio::net::UnixStream = this.half.as_ref();
        loop {
            ready!(sock.poll_read_ready(cx))?;
            let unfilled = buf.initialize_unfilled();
            let got = sock.try_io(Interest::READABLE, || {
                pycell_wire::fdpass::recv_with_fds(sock.as_fd(), unfilled)
            });
            match got {
                Ok((n, fds)) => {
                    this.fds.extend(fds);
                    buf.advance(n);
                    return Poll::Ready(Ok(()));
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
    }
}

/// A run's id and the descriptors its message came with.
type RunFds = (String, Vec<OwnedFd>);

/// The descriptors of runs that named grants, by run id.
#[derive(Clone, Default)]
pub(super) struct Granted(Arc<Mutex<VecDeque<RunFds>>>);

impl Granted {
    /// Keep `fds` if `msg` is a run that names grants (else they close).
    pub(super) fn keep(&self, msg: &ClientMessage, fds: Vec<OwnedFd>) {
        let ClientMessage::Run { id, request } = msg else {
            return;
        };
        if request.grants.is_empty() || fds.is_empty() {
            return;
        }
        let mut kept = self.0.lock().unwrap_or_else(|p| p.into_inner());
        kept.retain(|(other, _)| other != id);
        while kept.len() >= KEPT {
            kept.pop_front();
        }
        kept.push_back((id.clone(), fds));
    }

    /// Run `id`'s descriptors (none if it sent none).
    pub(super) fn claim(&self, id: &str) -> Vec<OwnedFd> {
        let mut kept = self.0.lock().unwrap_or_else(|p| p.into_inner());
        match kept.iter().position(|(other, _)| other == id) {
            Some(i) => kept.remove(i).map(|(_, fds)| fds).unwrap_or_default(),
            None => Vec::new(),
        }
    }
}
