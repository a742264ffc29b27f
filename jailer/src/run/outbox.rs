//! Event frames on their way out of the jailer while the jail runs. The
//! event descriptor is non-blocking, so a reader that stops reading (a
//! client that does not read its output, a wedged broker) can never stall
//! the relay loop, which also enforces the wall-clock deadline. What the
//! reader has not taken yet waits here, up to a bound; an output chunk that
//! does not fit is refused, and the relay then stops forwarding that stream
//! and reports it truncated.

use std::io;
use std::os::fd::BorrowedFd;

use nix::fcntl::{fcntl, FcntlArg, OFlag};
use pycell_wire::events::{self, Stream};

/// Most bytes kept for a slow reader: the whole output a run may produce
/// (both streams at their cap), but never more than this.
const MAX_PENDING: usize = 4 << 20;

#[derive(Debug)]
pub(crate) struct Outbox {
    fd: BorrowedFd<'static>,
    /// The descriptor's flags before we made it non-blocking.
    saved: OFlag,
    pending: Vec<u8>,
    /// Bytes of `pending` already written.
    start: usize,
    limit: usize,
}

/// How much an outbox keeps for a run whose streams are each capped at
/// `max_output` bytes.
pub(crate) fn pending_limit(max_output: u64) -> usize {
    let whole = usize::try_from(max_output)
        .unwrap_or(usize::MAX)
        .saturating_mul(2)
        .saturating_add(64 << 10);
    whole.min(MAX_PENDING)
}

impl Outbox {
    pub(crate) fn new(fd: BorrowedFd<'static>, limit: usize) -> io::Result<Outbox> {
        let saved = OFlag::from_bits_truncate(fcntl(fd, FcntlArg::F_GETFL)?);
        fcntl(fd, FcntlArg::F_SETFL(saved | OFlag::O_NONBLOCK))?;
        Ok(Outbox {
            fd,
            saved,
            pending: Vec::new(),
            start: 0,
            limit,
        })
    }

    pub(crate) fn fd(&self) -> BorrowedFd<'static> {
        self.fd
    }

    /// Queue one output chunk and write what the reader takes. False if
    /// the chunk was dropped because the reader is that far behind.
    pub(crate) fn offer(&mut self, stream: Stream, bytes: &[u8]) -> io::Result<bool> {
        let mut frame = Vec::with_capacity(bytes.len() + 8);
        events::write_output(&mut frame, stream, bytes)?;
        if self.waiting() + frame.len() > self.limit {
            return Ok(false);
        }
        self.pending.extend_from_slice(&frame);
        self.flush_some()?;
        Ok(true)
    }

    /// A warm jail is ready: the frame goes out whatever the bound.
    pub(crate) fn offer_ready(&mut self) -> io::Result<()> {
        events::write_ready(&mut self.pending)?;
        self.flush_some()
    }

    /// A session's reply: it goes out whatever the bound (the runner's
    /// channel bounded it already).
    pub(crate) fn offer_reply(
        &mut self,
        measure: &events::ReplyMeasure,
        body: &[u8],
    ) -> io::Result<()> {
        events::write_reply(&mut self.pending, measure, body)?;
        self.flush_some()
    }

    pub(crate) fn set_limit(&mut self, limit: usize) {
        self.limit = limit;
    }

    /// Bytes not yet taken by the reader.
    pub(crate) fn waiting(&self) -> usize {
        self.pending.len() - self.start
    }

    /// Write as much as the reader takes now, without blocking.
    pub(crate) fn flush_some(&mut self) -> io::Result<()> {
        while self.waiting() > 0 {
            match nix::unistd::write(self.fd, &self.pending[self.start..]) {
                Ok(n) => self.start += n,
                Err(nix::errno::Errno::EAGAIN) => break,
                Err(nix::errno::Errno::EINTR) => continue,
                Err(e) => return Err(e.into()),
            }
        }
        if self.start == self.pending.len() {
            self.pending.clear();
            self.start = 0;
        } else if self.start > self.pending.len() / 2 {
            self.pending.drain(..self.start);
            self.start = 0;
        }
        Ok(())
    }

    /// What the reader has not taken yet, to be written (blocking) before
    /// the result; the descriptor gets its flags back.
    pub(crate) fn into_unsent(mut self) -> Vec<u8> {
        self.pending.drain(..self.start);
        std::mem::take(&mut self.pending)
    }
}

impl Drop for Outbox {
    fn drop(&mut self) {
        let _ = fcntl(self.fd, FcntlArg::F_SETFL(self.saved));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;
    use std::os::fd::AsFd;

    #[test]
    fn the_bound_is_the_whole_output_up_to_4mib() {
        assert_eq!(pending_limit(1 << 20), (2 << 20) + (64 << 10));
        assert_eq!(pending_limit(16 << 20), MAX_PENDING);
        assert_eq!(pending_limit(u64::MAX), MAX_PENDING);
    }

    /// A reader that reads nothing: chunks queue up to the bound, the next
    /// one is refused at once (never blocks), and what was queued comes out
    /// whole and in order once it reads.
    #[test]
    fn a_stalled_reader_never_blocks_and_loses_nothing_queued() {
        let (r, w) = nix::unistd::pipe().unwrap();
        // 'static for the test: the write end lives until the process ends.
        let w: &'static std::os::fd::OwnedFd = Box::leak(Box::new(w));
        let mut outbox = Outbox::new(w.as_fd(), 256 << 10).unwrap();
        let chunk = vec![b'x'; 60_000];
        let mut accepted = 0;
        let started = std::time::Instant::now();
        while outbox.offer(Stream::Stdout, &chunk).unwrap() {
            accepted += 1;
            assert!(accepted < 100, "the bound never applied");
        }
        assert!(started.elapsed() < std::time::Duration::from_secs(2));
        // The pipe took 64 KiB, the outbox at most its bound.
        assert!(accepted >= 5, "{accepted}");
        let unsent = outbox.into_unsent();
        let mut all = Vec::new();
        let mut reader = std::fs::File::from(r);
        let mut buf = vec![0u8; 1 << 20];
        let in_pipe = reader.read(&mut buf).unwrap();
        all.extend_from_slice(&buf[..in_pipe]);
        all.extend_from_slice(&unsent);
        let mut cursor = &all[..];
        let mut frames = 0;
        while let Some(ev) = events::read_event(&mut cursor).unwrap() {
            match ev {
                events::Event::Output(Stream::Stdout, b) => assert_eq!(b, chunk),
                other => panic!("unexpected {other:?}"),
            }
            frames += 1;
        }
        assert_eq!(frames, accepted);
    }
}
