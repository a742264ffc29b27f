//! One client connection. Reading, writing and each run's events are
//! separate tasks joined by bounded channels, so that nothing a client does
//! (not reading, reading slowly, sending half a frame) can stall a run, its
//! deadline, or the broker:
//!
//! - the reader task turns frames into messages; a frame once begun must
//!   arrive whole within [`FRAME_TIMEOUT`];
//! - the writer task writes replies; a write that does not finish within
//!   [`WRITE_STALL`] ends the connection (and so its run);
//! - a run's output is offered to the writer without waiting: when the
//!   client is that far behind, streaming of that stream stops, and what it
//!   missed follows in one piece once the run is over.
//!
//! This file is the connection's I/O (its reader, writer, handshake and
//! the dispatch of its messages); a run's lifecycle on it (ordered,
//! admitted, started, relayed) is [`lifecycle`]'s, a session call's
//! [`session_calls`]'.

use std::sync::Arc;
use std::time::Duration;

use pycell_launch::launcher::{Collector, JailerEnd};
use pycell_launch::supervisor::{RunStream, Services};
use pycell_protocol::framing::{self, FrameError};
use pycell_protocol::messages::{
    encode_b64, ClientMessage, ErrorCode, RunRequest, ServerMessage, Stream, PROTOCOL_VERSION,
};
use pycell_protocol::result::RunResult;
use pycell_wire::report::{JailFailure, RunStatus};
use tokio::net::unix::{pipe, OwnedReadHalf, OwnedWriteHalf};
use tokio::net::UnixStream;
use tokio::sync::mpsc;
use tokio::time::{sleep, timeout, Instant};

mod descriptors;
mod installing;
mod lifecycle;
mod session_calls;

use descriptors::{Granted, WithFds};
use lifecycle::run;

use super::order::{NotOrdered, Ordered};
use super::{Broker, Peer, SpawnedRun};
use crate::broker::admission::{Ask, Entry, Slot, Waiting};
use crate::link::{RunOrder, ToBroker, ToMonitor};

use super::tool_relay::ToolRelay;

/// The first message (`hello`) must come within this.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);
/// A connection with no run that sends nothing for this long is closed.
const IDLE_TIMEOUT: Duration = Duration::from_secs(60);
/// A frame, once its first byte is in, must be complete within this.
const FRAME_TIMEOUT: Duration = Duration::from_secs(10);
/// A reply the client does not take within this ends the connection.
const WRITE_STALL: Duration = Duration::from_secs(30);
/// Malformed messages answered on one connection before it is closed.
const MAX_BAD_MESSAGES: usize = 16;
/// Replies waiting for the writer (output chunks are at most 64 KiB).
const OUTBOUND_MESSAGES: usize = 64;
/// How often a waiting run is told its place.
const QUEUE_TICK: Duration = Duration::from_secs(1);

const NO_SUCH_RUN: &str = "no run with that id is going on this connection";

pub(crate) fn error(
    id: Option<&str>,
    code: ErrorCode,
    message: impl Into<String>,
) -> ServerMessage {
    ServerMessage::Error {
        id: id.map(str::to_string),
        code,
        message: message.into(),
    }
}

/// The writer side of a connection.
struct Outbound {
    tx: mpsc::Sender<ServerMessage>,
    /// Messages queued so far, and (from the writer task) written so far.
    queued: std::sync::atomic::AtomicU64,
    written: tokio::sync::watch::Receiver<u64>,
    /// The descriptor a queued `stdio` message carries.
    attached: Attached,
}

type Attached = Arc<std::sync::Mutex<Option<std::os::fd::OwnedFd>>>;

impl Outbound {
    fn start(mut wr: OwnedWriteHalf) -> Outbound {
        let (tx, mut rx) = mpsc::channel::<ServerMessage>(OUTBOUND_MESSAGES);
        let (written_tx, written) = tokio::sync::watch::channel(0u64);
        let attached = Attached::default();
        let theirs = Arc::clone(&attached);
        tokio::spawn(async move {
            while let Some(msg) = rx.recv().await {
                let fd = match msg {
                    ServerMessage::Stdio { .. } => theirs.lock().ok().and_then(|mut a| a.take()),
                    _ => None,
                };
                match timeout(WRITE_STALL, write_message(&mut wr, &msg, fd)).await {
                    Ok(Ok(())) => written_tx.send_modify(|n| *n += 1),
                    _ => return,
                }
            }
        });
        Outbound {
            tx,
            queued: std::sync::atomic::AtomicU64::new(0),
            written,
            attached,
        }
    }

    /// Queue `msg` (a `stdio` message) with `fd` attached.
    async fn send_with_fd(&self, msg: ServerMessage, fd: std::os::fd::OwnedFd) -> bool {
        if let Ok(mut slot) = self.attached.lock() {
            *slot = Some(fd);
        }
        self.send(msg).await
    }

    /// Queue a reply, waiting for room; false if the connection is gone.
    async fn send(&self, msg: ServerMessage) -> bool {
        let sent = self.tx.send(msg).await.is_ok();
        self.count_queued(sent)
    }

    /// Queue a reply if there is room now.
    fn offer(&self, msg: ServerMessage) -> bool {
        let sent = self.tx.try_send(msg).is_ok();
        self.count_queued(sent)
    }

    fn count_queued(&self, sent: bool) -> bool {
        if sent {
            self.queued
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        sent
    }

    /// Wait until everything queued so far is written (or the writer gave
    /// up: a stalled or gone client).
    async fn flushed(&self) {
        let queued = self.queued.load(std::sync::atomic::Ordering::Relaxed);
        let mut written = self.written.clone();
        let _ = written.wait_for(|n| *n >= queued).await;
    }

    async fn closed(&self) {
        self.tx.closed().await
    }
}

/// Write one message, with `fd` attached to its first byte if given
/// (SCM_RIGHTS; the rest of the frame follows as plain data).
async fn write_message(
    wr: &mut OwnedWriteHalf,
    msg: &ServerMessage,
    fd: Option<std::os::fd::OwnedFd>,
) -> std::io::Result<()> {
    use std::os::fd::AsFd;
    use tokio::io::AsyncWriteExt;
    let Some(fd) = fd else {
        return framing::write_async(wr, msg)
            .await
            .map_err(std::io::Error::other);
    };
    let frame = framing::encode(msg).map_err(std::io::Error::other)?;
    let sock: &UnixStream = wr.as_ref();
    let first = loop {
        sock.writable().await?;
        let sent = sock.try_io(tokio::io::Interest::WRITABLE, || {
            pycell_wire::fdpass::send_some_with_fds(sock.as_fd(), &frame[..1], &[fd.as_fd()])
        });
        match sent {
            Ok(n) => break n,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
            Err(e) => return Err(e),
        }
    };
    wr.write_all(&frame[first..]).await?;
    wr.flush().await
}

/// What the reader task hands on: a message, or the reply to a bad one.
type Incoming = Result<ClientMessage, ServerMessage>;

/// Read frames until the client closes, sends something fatal, or stalls
/// inside a frame. The channel closing means the connection is over. The
/// descriptors of a run's grants go to `granted`.
fn start_reader(rd: OwnedReadHalf, granted: Granted) -> mpsc::Receiver<Incoming> {
    let (tx, rx) = mpsc::channel::<Incoming>(4);
    let mut rd = WithFds::new(rd);
    tokio::spawn(async move {
        let mut bad = 0;
        loop {
            let body = match framing::read_async_raw_within(&mut rd, FRAME_TIMEOUT).await {
                Ok(b) => b,
                Err(e @ FrameError::TooLarge(..)) => {
                    let msg = e.to_string();
                    let _ = tx
                        .send(Err(error(None, ErrorCode::FrameTooLarge, msg)))
                        .await;
                    return;
                }
                _ => return,
            };
            let msg = framing::decode_client_message(&body)
                .map_err(|e| error(None, ErrorCode::BadMessage, e.to_string()));
            let fds = rd.take();
            if let Ok(m) = &msg {
                granted.keep(m, fds);
            }
            if msg.is_err() {
                bad += 1;
            }
            if tx.send(msg).await.is_err() || bad >= MAX_BAD_MESSAGES {
                return;
            }
        }
    });
    rx
}

/// A connection's two halves, as the serving code sees them.
struct Conn {
    out: Outbound,
    inbox: mpsc::Receiver<Incoming>,
    /// The descriptors its runs' grants came with.
    granted: Granted,
}

pub(crate) async fn serve(broker: Arc<Broker>, stream: UnixStream) {
    let Some((mut peer, groups)) = super::peer_of(&stream) else {
        return;
    };
    let (rd, wr) = stream.into_split();
    let granted = Granted::default();
    let mut conn = Conn {
        out: Outbound::start(wr),
        inbox: start_reader(rd, granted.clone()),
        granted,
    };
    let front_end = broker.config.front_end_uids.contains(&peer.uid);
    let _counted = match broker.connections.enter(peer.uid, front_end) {
        Ok(c) => c,
        Err(full) => {
            let message = full.to_string();
            conn.out.send(error(None, ErrorCode::Busy, message)).await;
            return;
        }
    };
    if !broker.authorized(&peer, &groups) {
        let msg = format!("uid {} is not allowed to use pycell: ask the administrator to add you to the {:?} group", peer.uid, broker.config.socket_group);
        conn.out
            .send(error(None, ErrorCode::Unauthorized, msg))
            .await;
        return;
    }
    match handshake(&mut conn, &broker.config.front_end_uids, peer.uid).await {
        Some(identity) => peer.identity = identity,
        None => return,
    }
    loop {
        let msg = match timeout(IDLE_TIMEOUT, conn.inbox.recv()).await {
            Ok(Some(Ok(m))) => m,
            Ok(Some(Err(reply))) => match conn.out.send(reply).await {
                true => continue,
                false => return,
            },
            _ => return,
        };
        if !answer(&broker, &mut conn, &peer, msg).await {
            return;
        }
    }
}

/// One message of a connection past its handshake. False once the
/// connection is finished.
async fn answer(broker: &Arc<Broker>, conn: &mut Conn, peer: &Peer, msg: ClientMessage) -> bool {
    match msg {
        ClientMessage::Hello { .. } => {
            let e = error(None, ErrorCode::BadMessage, "hello was already received");
            conn.out.send(e).await
        }
        ClientMessage::Info => {
            let info = ServerMessage::Info {
                info: Box::new(broker.info()),
            };
            conn.out.send(info).await
        }
        ClientMessage::Status => {
            let status = ServerMessage::Status {
                status: Box::new(broker.status()),
            };
            conn.out.send(status).await
        }
        ClientMessage::Cancel { id } | ClientMessage::Interrupt { id } => {
            let e = error(Some(&id), ErrorCode::NoSuchRun, NO_SUCH_RUN);
            conn.out.send(e).await
        }
        ClientMessage::Run { id, request } => run(broker, conn, peer, id, request).await,
        ClientMessage::SessionStart { id, request } => {
            session_calls::start_session(broker, conn, peer, id, request).await
        }
        ClientMessage::Session {
            id,
            session,
            call,
            timeout_s,
            watch,
        } => {
            let asked = session_calls::Asked {
                id,
                handle: session,
                call,
                timeout_s,
                watch,
            };
            session_calls::call(broker, conn, peer, asked).await
        }
        ClientMessage::SessionEnd { id, session } => {
            session_calls::end(broker, conn, peer, id, session).await
        }
        ClientMessage::SessionList { id } => session_calls::list(broker, conn, peer, id).await,
        ClientMessage::SessionFork { id, session } => {
            session_calls::fork(broker, conn, peer, id, session).await
        }
        ClientMessage::SessionSnapshot { id, session } => {
            session_calls::snapshot(broker, conn, peer, id, session).await
        }
        ClientMessage::ToolAnswer { id, .. } => {
            let e = error(Some(&id), ErrorCode::NoSuchRun, NO_SUCH_RUN);
            conn.out.send(e).await
        }
    }
}

/// The version handshake: `hello` first, in our protocol version, soon;
/// an identity only from a trusted front end. The identity the connection
/// speaks for, if it goes on.
async fn handshake(conn: &mut Conn, front_ends: &[u32], peer_uid: u32) -> Option<Option<Arc<str>>> {
    let first = match timeout(HANDSHAKE_TIMEOUT, conn.inbox.recv()).await {
        Ok(Some(m)) => m,
        _ => return None,
    };
    let reply = match first {
        Err(reply) => reply,
        Ok(ClientMessage::Hello {
            version, identity, ..
        }) if version == PROTOCOL_VERSION => {
            let problem = identity
                .as_deref()
                .and_then(|i| crate::broker::principal::identity_problem(peer_uid, front_ends, i));
            if let Some(message) = problem {
                conn.out
                    .send(error(None, ErrorCode::Unauthorized, message))
                    .await;
                return None;
            }
            let welcome = ServerMessage::Welcome {
                version: PROTOCOL_VERSION,
                server: format!("pycelld {}", env!("CARGO_PKG_VERSION")),
            };
            return conn
                .out
                .send(welcome)
                .await
                .then(|| identity.map(Arc::from));
        }
        Ok(ClientMessage::Hello { version, .. }) => {
            let msg = format!("this pycelld speaks protocol version {PROTOCOL_VERSION}, the client {version}; upgrade the older one");
            error(None, ErrorCode::VersionMismatch, msg)
        }
        Ok(_) => error(
            None,
            ErrorCode::HandshakeRequired,
            "the first message must be hello",
        ),
    };
    conn.out.send(reply).await;
    None
}
