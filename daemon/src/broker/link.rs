//! The broker's link to the monitor: typed requests out, replies (with the
//! descriptors they carry) routed back to the waiting run by request number.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream as StdUnixStream;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use pycell_protocol::framing;
use pycell_protocol::info::WarmPoolStatus;
use tokio::sync::mpsc;

use crate::link::{PeerIds, RunOrder, SpawnFd, ToBroker, ToMonitor};
use crate::sockets;

/// Spawn requests up to this size are written from the runtime's thread:
/// far below a unix socket's buffer, which the monitor drains at once.
const INLINE_FRAME: usize = 32 << 10;

/// A reply of the monitor and the descriptors that came with it.
pub(crate) type Reply = (ToBroker, Vec<OwnedFd>);
type Pending = Arc<Mutex<HashMap<u64, mpsc::UnboundedSender<Reply>>>>;
type Pools = Arc<Mutex<Vec<WarmPoolStatus>>>;

/// The broker's connection to the monitor.
#[derive(Debug)]
pub(crate) struct MonitorLink {
    writer: Mutex<StdUnixStream>,
    pending: Pending,
    next_req: AtomicU64,
    /// The warm pools as the monitor last reported them.
    pools: Pools,
}

impl MonitorLink {
    /// Start routing the monitor's replies (on a thread of its own: the
    /// link is a blocking socket). When the monitor goes, so does the
    /// broker: nothing can run without it. `planned` is what the pools
    /// are until the monitor first reports them.
    pub(crate) fn start(
        stream: StdUnixStream,
        planned: Vec<WarmPoolStatus>,
    ) -> std::io::Result<Arc<MonitorLink>> {
        let reader = stream.try_clone()?;
        let pending: Pending = Arc::new(Mutex::new(HashMap::new()));
        let pools: Pools = Arc::new(Mutex::new(planned));
        let (routes, reported) = (Arc::clone(&pending), Arc::clone(&pools));
        std::thread::spawn(move || route_replies(reader, routes, reported));
        Ok(Arc::new(MonitorLink {
            writer: Mutex::new(stream),
            pending,
            next_req: AtomicU64::new(1),
            pools,
        }))
    }

    /// Whether the monitor is gone: its end of the link is closed, as the
    /// kernel sees it now (a dead monitor's descriptors are closed before
    /// its children get their parent-death signal).
    pub(crate) fn monitor_gone(&self) -> bool {
        self.writer.lock().map_or(true, |w| peer_closed(w.as_fd()))
    }

    /// The warm pools as the monitor last reported them.
    pub(crate) fn warm_pools(&self) -> Vec<WarmPoolStatus> {
        self.pools.lock().map(|p| p.clone()).unwrap_or_default()
    }

    pub(crate) fn send(&self, msg: &ToMonitor) -> Result<(), LinkError> {
        self.send_frame(&framing::encode(msg)?)
    }

    fn send_frame(&self, frame: &[u8]) -> Result<(), LinkError> {
        self.send_frame_with(frame, &[])
    }

    /// `frame`, with `fds` attached to its first byte.
    fn send_frame_with(&self, frame: &[u8], fds: &[OwnedFd]) -> Result<(), LinkError> {
        let mut w = self.writer.lock().map_err(|_| LinkError::Poisoned)?;
        match fds.is_empty() {
            true => w.write_all(frame),
            false => {
                let fds: Vec<_> = fds.iter().map(|f| f.as_fd()).collect();
                crate::sockets::send_with_fds(w.as_fd(), frame, &fds)
            }
        }
        .map_err(framing::FrameError::from)?;
        Ok(())
    }

    /// Ask the monitor to start a run. The replies come on the receiver:
    /// `Installing` while its env is built, then `Spawned`, `Refused` or
    /// `Failed`; the channel closes after that last one (or if the monitor
    /// goes away).
    /// `grant_sources` (the descriptors of `order.grants`) go with it.
    pub(crate) async fn spawn(
        self: &Arc<Self>,
        peer: PeerIds,
        order: RunOrder,
        grant_sources: Vec<OwnedFd>,
    ) -> Result<(u64, mpsc::UnboundedReceiver<Reply>), LinkError> {
        let req = self.next_req.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = mpsc::unbounded_channel();
        self.pending
            .lock()
            .map_err(|_| LinkError::Poisoned)?
            .insert(req, tx);
        let descriptors = (0..grant_sources.len())
            .map(|grant| SpawnFd::GrantSource { grant })
            .collect();
        let frame = framing::encode(&ToMonitor::Spawn {
            req,
            peer,
            order,
            descriptors,
        })?;
        // A small request goes at once: the socket's buffer takes it whole
        // (a hop through a blocking thread costs a run about 1 ms of wake-
        // ups). A large one may block on the socket for a moment: not on a
        // runtime worker.
        if frame.len() <= INLINE_FRAME {
            self.send_frame_with(&frame, &grant_sources)?;
        } else {
            let link = Arc::clone(self);
            tokio::task::spawn_blocking(move || link.send_frame_with(&frame, &grant_sources))
                .await??;
        }
        Ok((req, rx))
    }
}

/// Why a message could not go to the monitor.
#[derive(Debug, thiserror::Error)]
pub(crate) enum LinkError {
    #[error("monitor link poisoned")]
    Poisoned,
    #[error(transparent)]
    Frame(#[from] framing::FrameError),
    #[error(transparent)]
    Task(#[from] tokio::task::JoinError),
}

/// Whether the other end of unix socket `sock` is closed (it then reports
/// POLLHUP, which is always polled).
fn peer_closed(sock: std::os::fd::BorrowedFd<'_>) -> bool {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    let mut fds = [PollFd::new(sock, PollFlags::empty())];
    matches!(poll(&mut fds, PollTimeout::ZERO), Ok(1..))
        && fds[0]
            .revents()
            .is_some_and(|r| r.contains(PollFlags::POLLHUP))
}

/// One frame from the monitor and the descriptors that came with it.
pub(crate) fn read_monitor_frame(
    stream: &mut StdUnixStream,
) -> std::io::Result<(ToBroker, Vec<OwnedFd>)> {
    let mut head = [0u8; 4];
    let mut got = 0;
    let mut fds = Vec::new();
    while got < 4 {
        let (n, mut f) = sockets::recv_with_fds(stream.as_fd(), &mut head[got..])?;
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        got += n;
        fds.append(&mut f);
    }
    let len = u32::from_be_bytes(head);
    if len > pycell_protocol::messages::MAX_FRAME {
        return Err(std::io::Error::other("monitor frame too large"));
    }
    let mut body = vec![0u8; len as usize];
    stream.read_exact(&mut body)?;
    let msg = framing::decode(&body)
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))?;
    Ok((msg, fds))
}

/// Read frames from the monitor; route replies to the waiting runs, keep
/// the pools' status.
fn route_replies(mut stream: StdUnixStream, pending: Pending, pools: Pools) {
    loop {
        let (msg, fds) = match read_monitor_frame(&mut stream) {
            Ok(m) => m,
            Err(e) if e.kind() == std::io::ErrorKind::InvalidData => continue,
            Err(_) => {
                if let Ok(mut p) = pending.lock() {
                    p.clear();
                }
                // Without the monitor nothing can run: leave.
                std::process::exit(0);
            }
        };
        let (req, last) = match &msg {
            ToBroker::Installing { req } => (*req, false),
            ToBroker::Spawned { req, .. }
            | ToBroker::Refused { req, .. }
            | ToBroker::Failed { req, .. } => (*req, true),
            ToBroker::WarmPools { pools: now } => {
                if let Ok(mut p) = pools.lock() {
                    *p = now.clone();
                }
                continue;
            }
            ToBroker::Exited { .. } | ToBroker::Handoff { .. } => continue,
        };
        let Ok(mut p) = pending.lock() else { continue };
        let tx = match last {
            true => p.remove(&req),
            false => p.get(&req).cloned(),
        };
        if let Some(tx) = tx {
            let _ = tx.send((msg, fds));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_closed_peer_is_seen_without_reading() {
        let (ours, theirs) = StdUnixStream::pair().unwrap();
        assert!(!peer_closed(ours.as_fd()));
        let mut t = theirs;
        std::io::Write::write_all(&mut t, b"unread").unwrap();
        drop(t);
        assert!(peer_closed(ours.as_fd()));
    }
}
