//! The unprivileged half of pycelld (runs as the `pycell` user): accepts
//! clients on the socket, checks each peer's credentials, speaks the framed
//! JSON protocol, applies concurrency quotas, asks the monitor to start and
//! stop runs, relays each run's events, and writes the audit log.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::os::fd::{AsFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream as StdUnixStream;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};
use tokio::io::AsyncReadExt;
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{oneshot, Notify, Semaphore};

use crate::config::{AuditSink, Config};
use crate::framing::{self, FrameError};
use crate::monitor::{ToBroker, ToMonitor};
use crate::protocol::{
    encode_b64, ClientMessage, ErrorCode, RunRequest, ServerMessage, Stream, PROTOCOL_VERSION,
};
use crate::result::RunResult;

type Pending = Arc<Mutex<HashMap<u64, oneshot::Sender<(ToBroker, Option<OwnedFd>)>>>>;

/// The broker's connection to the monitor.
struct MonitorLink {
    writer: Mutex<StdUnixStream>,
    pending: Pending,
    next_req: AtomicU64,
}

impl MonitorLink {
    fn send(&self, msg: &ToMonitor) -> Result<(), String> {
        let mut w = self
            .writer
            .lock()
            .map_err(|_| "monitor link poisoned".to_string())?;
        framing::write_sync(&mut *w, msg).map_err(|e| e.to_string())
    }

    async fn spawn(
        self: &Arc<Self>,
        peer_uid: u32,
        request: RunRequest,
    ) -> Result<(ToBroker, Option<OwnedFd>), String> {
        let req = self.next_req.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        self.pending.lock().map_err(|_| "poisoned")?.insert(req, tx);
        let link = Arc::clone(self);
        let msg = ToMonitor::Spawn {
            req,
            peer_uid,
            request,
        };
        // Large requests may block on the socket for a moment: not on a
        // runtime worker.
        tokio::task::spawn_blocking(move || link.send(&msg))
            .await
            .map_err(|e| e.to_string())??;
        rx.await.map_err(|_| "the monitor went away".to_string())
    }
}

/// Read frames from the monitor; route replies to the waiting runs.
fn monitor_reader(stream: StdUnixStream, pending: Pending, gone: Arc<Notify>) {
    let mut stream = stream;
    loop {
        let mut head = [0u8; 4];
        let mut got = 0;
        let mut fds = Vec::new();
        while got < 4 {
            match pycell_jailer::syscall::recv_with_fds(stream.as_fd(), &mut head[got..]) {
                Ok((0, _)) | Err(_) => {
                    gone.notify_waiters();
                    if let Ok(mut p) = pending.lock() {
                        p.clear();
                    }
                    // Without the monitor nothing can run: leave.
                    std::process::exit(0);
                }
                Ok((n, mut f)) => {
                    got += n;
                    fds.append(&mut f);
                }
            }
        }
        let len = u32::from_be_bytes(head) as usize;
        let mut body = vec![0u8; len.min(crate::protocol::MAX_FRAME as usize)];
        if stream.read_exact(&mut body).is_err() {
            std::process::exit(0);
        }
        let Ok(msg) = framing::decode::<ToBroker>(&body) else {
            continue;
        };
        let req = match &msg {
            ToBroker::Spawned { req, .. } | ToBroker::Refused { req, .. } => *req,
            ToBroker::Exited { .. } => continue,
        };
        let fd = fds.pop();
        if let Some(tx) = pending.lock().ok().and_then(|mut p| p.remove(&req)) {
            let _ = tx.send((msg, fd));
        }
    }
}

struct Broker {
    config: Config,
    allowed_gids: Vec<u32>,
    link: Arc<MonitorLink>,
    global: Arc<Semaphore>,
    per_uid: Mutex<HashMap<u32, usize>>,
    active: AtomicUsize,
    stopping: AtomicBool,
    idle: Notify,
    audit: Mutex<Option<std::fs::File>>,
}

/// Credentials of a connected peer, as the kernel recorded them when it
/// connected (SO_PEERCRED).
#[derive(Debug, Clone, Copy)]
struct Peer {
    uid: u32,
    gid: u32,
    pid: i32,
}

impl Broker {
    /// `groups`: the peer's supplementary groups (SO_PEERGROUPS).
    fn authorized(&self, p: &Peer, groups: &[u32]) -> bool {
        if p.uid == 0
            || self.config.allowed_uids.contains(&p.uid)
            || self.allowed_gids.contains(&p.gid)
        {
            return true;
        }
        groups.iter().any(|g| self.allowed_gids.contains(g))
    }

    /// Take a slot for a run of `uid`, or say why not.
    fn admit(&self, uid: u32) -> Result<tokio::sync::OwnedSemaphorePermit, (ErrorCode, String)> {
        if self.stopping.load(Ordering::SeqCst) {
            return Err((
                ErrorCode::ShuttingDown,
                "pycelld is shutting down; try again when it is back".into(),
            ));
        }
        let mut per = self
            .per_uid
            .lock()
            .map_err(|_| (ErrorCode::Internal, "poisoned".to_string()))?;
        let n = per.entry(uid).or_insert(0);
        if *n >= self.config.max_runs_per_uid {
            return Err((
                ErrorCode::Busy,
                format!("uid {uid} already has {} runs going (max_runs_per_uid); wait for one to finish", *n),
            ));
        }
        let permit = Arc::clone(&self.global).try_acquire_owned().map_err(|_| {
            (
                ErrorCode::Busy,
                format!(
                    "{} runs are going (max_concurrent_runs); try again shortly",
                    self.config.max_concurrent_runs
                ),
            )
        })?;
        *n += 1;
        self.active.fetch_add(1, Ordering::SeqCst);
        Ok(permit)
    }

    fn release(&self, uid: u32) {
        if let Ok(mut per) = self.per_uid.lock() {
            if let Some(n) = per.get_mut(&uid) {
                *n = n.saturating_sub(1);
            }
        }
        if self.active.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.idle.notify_waiters();
        }
    }

    fn audit(&self, peer: &Peer, request: &RunRequest, result: &RunResult) {
        let line = serde_json::json!({
            "ts": std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0),
            "event": "run",
            "run_id": result.run_id,
            "peer_uid": peer.uid,
            "peer_gid": peer.gid,
            "peer_pid": peer.pid,
            "policy": result.policy,
            "code_sha256": format!("{:x}", Sha256::digest(request.code.as_bytes())),
            "status": result.status,
            "exit_code": result.exit_code,
            "signal": result.signal,
            "wall_ms": result.wall_ms,
            "cpu_ms": result.cpu_ms,
            "peak_memory_bytes": result.peak_memory_bytes,
            "layers": result.layers,
            "error": result.error.as_ref().map(|e| &e.code),
        });
        match &self.config.audit {
            AuditSink::Off => {}
            AuditSink::Stderr => eprintln!("{line}"),
            AuditSink::File(_) => {
                if let Ok(mut f) = self.audit.lock() {
                    if let Some(f) = f.as_mut() {
                        let _ = writeln!(f, "{line}");
                    }
                }
            }
        }
    }
}

async fn send(stream: &mut UnixStream, msg: &ServerMessage) -> bool {
    framing::write_async(stream, msg).await.is_ok()
}

fn error(id: Option<&str>, code: ErrorCode, message: impl Into<String>) -> ServerMessage {
    ServerMessage::Error {
        id: id.map(str::to_string),
        code,
        message: message.into(),
    }
}

async fn serve_connection(broker: Arc<Broker>, mut stream: UnixStream) {
    use std::os::fd::AsFd;
    let (peer, groups) = match (
        stream.peer_cred(),
        pycell_jailer::syscall::peer_groups(stream.as_fd()),
    ) {
        (Ok(c), Ok(groups)) => (
            Peer {
                uid: c.uid(),
                gid: c.gid(),
                pid: c.pid().unwrap_or(0),
            },
            groups,
        ),
        _ => return,
    };
    if !broker.authorized(&peer, &groups) {
        send(
            &mut stream,
            &error(
                None,
                ErrorCode::Unauthorized,
                format!("uid {} is not allowed to use pycell: ask the administrator to add you to the {:?} group", peer.uid, broker.config.socket_group),
            ),
        )
        .await;
        return;
    }
    // Handshake.
    match framing::read_async_raw(&mut stream).await {
        Ok(body) => match framing::decode::<ClientMessage>(&body) {
            Ok(ClientMessage::Hello { version, .. }) if version == PROTOCOL_VERSION => {
                let welcome = ServerMessage::Welcome {
                    version: PROTOCOL_VERSION,
                    server: format!("pycelld {}", env!("CARGO_PKG_VERSION")),
                };
                if !send(&mut stream, &welcome).await {
                    return;
                }
            }
            Ok(ClientMessage::Hello { version, .. }) => {
                let msg = format!("this pycelld speaks protocol version {PROTOCOL_VERSION}, the client {version}; upgrade the older one");
                send(&mut stream, &error(None, ErrorCode::VersionMismatch, msg)).await;
                return;
            }
            Ok(_) => {
                send(
                    &mut stream,
                    &error(
                        None,
                        ErrorCode::HandshakeRequired,
                        "the first message must be hello",
                    ),
                )
                .await;
                return;
            }
            Err(e) => {
                send(
                    &mut stream,
                    &error(None, ErrorCode::BadMessage, e.to_string()),
                )
                .await;
                return;
            }
        },
        Err(FrameError::TooLarge(n)) => {
            send(
                &mut stream,
                &error(
                    None,
                    ErrorCode::FrameTooLarge,
                    format!("frame of {n} bytes is too large"),
                ),
            )
            .await;
            return;
        }
        Err(_) => return,
    }
    loop {
        let body = match framing::read_async_raw(&mut stream).await {
            Ok(b) => b,
            Err(FrameError::TooLarge(n)) => {
                let msg = format!(
                    "frame of {n} bytes exceeds the maximum of {}",
                    crate::protocol::MAX_FRAME
                );
                send(&mut stream, &error(None, ErrorCode::FrameTooLarge, msg)).await;
                return;
            }
            Err(_) => return,
        };
        let msg = match framing::decode::<ClientMessage>(&body) {
            Ok(m) => m,
            Err(e) => {
                if !send(
                    &mut stream,
                    &error(None, ErrorCode::BadMessage, e.to_string()),
                )
                .await
                {
                    return;
                }
                continue;
            }
        };
        match msg {
            ClientMessage::Hello { .. } => {
                send(
                    &mut stream,
                    &error(None, ErrorCode::BadMessage, "hello was already received"),
                )
                .await;
            }
            ClientMessage::Info => {
                let info = crate::hostinfo::collect("daemon", &broker.config.policy_dir);
                let mut v = serde_json::to_value(&info).unwrap_or_default();
                v["daemon"] = serde_json::json!({
                    "socket": broker.config.socket,
                    "max_concurrent_runs": broker.config.max_concurrent_runs,
                    "max_runs_per_uid": broker.config.max_runs_per_uid,
                    "active_runs": broker.active.load(Ordering::SeqCst),
                    "uid_range": format!("{}-{}", broker.config.uid_range.start(), broker.config.uid_range.end()),
                });
                if !send(&mut stream, &ServerMessage::Info { info: v }).await {
                    return;
                }
            }
            ClientMessage::Cancel { id } => {
                send(
                    &mut stream,
                    &error(
                        Some(&id),
                        ErrorCode::NoSuchRun,
                        "no run with that id is going on this connection",
                    ),
                )
                .await;
            }
            ClientMessage::Run { id, request } => {
                if !run(&broker, &mut stream, peer, id, request).await {
                    return;
                }
            }
        }
    }
}

/// One run on a connection. Returns false if the connection is finished.
async fn run(
    broker: &Arc<Broker>,
    stream: &mut UnixStream,
    peer: Peer,
    id: String,
    request: RunRequest,
) -> bool {
    let permit = match broker.admit(peer.uid) {
        Ok(p) => p,
        Err((code, msg)) => return send(stream, &error(Some(&id), code, msg)).await,
    };
    let last = run_admitted(broker, stream, peer, &id, &request).await;
    // Free the slot before the client hears the run is over, so that its
    // next run is admitted.
    drop(permit);
    broker.release(peer.uid);
    match last {
        Some(msg) => send(stream, &msg).await,
        None => false,
    }
}

async fn run_admitted(
    broker: &Arc<Broker>,
    stream: &mut UnixStream,
    peer: Peer,
    id: &str,
    request: &RunRequest,
) -> Option<ServerMessage> {
    let (reply, fd) = match broker.link.spawn(peer.uid, request.clone()).await {
        Ok(r) => r,
        Err(e) => return Some(error(Some(id), ErrorCode::Internal, e)),
    };
    let (run_id, policy, limits) = match reply {
        ToBroker::Spawned {
            run_id,
            policy,
            limits,
            ..
        } => (run_id, policy, limits),
        ToBroker::Refused { code, message, .. } => return Some(error(Some(id), code, message)),
        ToBroker::Exited { .. } => {
            return Some(error(Some(id), ErrorCode::Internal, "unexpected reply"))
        }
    };
    let Some(fd) = fd else {
        let _ = broker.link.send(&ToMonitor::Kill { run_id });
        return Some(error(
            Some(id),
            ErrorCode::Internal,
            "the monitor sent no event pipe",
        ));
    };
    if !send(
        stream,
        &ServerMessage::Started {
            id: id.to_string(),
            run_id: run_id.clone(),
        },
    )
    .await
    {
        let _ = broker.link.send(&ToMonitor::Kill { run_id });
        return None;
    }
    let mut events = match tokio::net::unix::pipe::Receiver::from_owned_fd(fd) {
        Ok(r) => r,
        Err(e) => {
            let _ = broker.link.send(&ToMonitor::Kill { run_id });
            return Some(error(Some(id), ErrorCode::Internal, e.to_string()));
        }
    };
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let mut connection_alive = true;
    let mut cancelled = false;
    let (mut rd, mut wr) = stream.split();
    let report = loop {
        tokio::select! {
            ev = read_event(&mut events) => match ev {
                Some(JailerEvent::Output(s, bytes)) => {
                    let msg = ServerMessage::Output { id: id.to_string(), stream: s, data_base64: encode_b64(&bytes) };
                    match s { Stream::Stdout => out.extend_from_slice(&bytes), Stream::Stderr => err.extend_from_slice(&bytes) }
                    if connection_alive && framing::write_async(&mut wr, &msg).await.is_err() {
                        connection_alive = false;
                        let _ = broker.link.send(&ToMonitor::Kill { run_id: run_id.clone() });
                    }
                }
                Some(JailerEvent::Result(r)) => break Some(r),
                None => break None,
            },
            frame = framing::read_async_raw(&mut rd), if connection_alive => match frame {
                Ok(body) => match framing::decode::<ClientMessage>(&body) {
                    Ok(ClientMessage::Cancel { id: cid }) if cid == id => {
                        if !cancelled {
                            cancelled = true;
                            let _ = broker.link.send(&ToMonitor::Kill { run_id: run_id.clone() });
                        }
                    }
                    Ok(ClientMessage::Cancel { id: cid }) => {
                        let _ = framing::write_async(&mut wr, &error(Some(&cid), ErrorCode::NoSuchRun, "no run with that id is going on this connection")).await;
                    }
                    Ok(ClientMessage::Run { id: rid, .. }) => {
                        let _ = framing::write_async(&mut wr, &error(Some(&rid), ErrorCode::RunInProgress, "this connection already has a run going; open another connection or wait")).await;
                    }
                    Ok(_) => {
                        let _ = framing::write_async(&mut wr, &error(None, ErrorCode::BadMessage, "only cancel is accepted while a run is going")).await;
                    }
                    Err(e) => {
                        let _ = framing::write_async(&mut wr, &error(None, ErrorCode::BadMessage, e.to_string())).await;
                    }
                },
                Err(_) => {
                    // The client went away: its run goes too.
                    connection_alive = false;
                    let _ = broker.link.send(&ToMonitor::Kill { run_id: run_id.clone() });
                }
            },
        }
    };
    let result = match report {
        Some(r) => RunResult::new(&run_id, &policy, None, *r, &out, &err),
        None => RunResult::refused(
            &run_id,
            &policy,
            pycell_jailer::report::JailFailure {
                code: "jailer_failed".into(),
                layer: "jailer".into(),
                message: "the jailer ended without a result".into(),
                hint: None,
            },
        ),
    };
    let mut result = result;
    result.limits = Some(limits);
    broker.audit(&peer, request, &result);
    if !connection_alive {
        return None;
    }
    Some(ServerMessage::Result {
        id: id.to_string(),
        result: Box::new(result),
    })
}

enum JailerEvent {
    Output(Stream, Vec<u8>),
    Result(Box<pycell_jailer::report::JailReport>),
}

/// Next event frame from the jailer (its binary format, see
/// `pycell_jailer::events`); None at the end or on a malformed stream.
async fn read_event(r: &mut tokio::net::unix::pipe::Receiver) -> Option<JailerEvent> {
    use pycell_jailer::events::{KIND_RESULT, KIND_STDERR, KIND_STDOUT, MAX_FRAME};
    let mut head = [0u8; 5];
    r.read_exact(&mut head).await.ok()?;
    let len = u32::from_le_bytes([head[1], head[2], head[3], head[4]]);
    if len > MAX_FRAME {
        return None;
    }
    let mut payload = vec![0u8; len as usize];
    r.read_exact(&mut payload).await.ok()?;
    match head[0] {
        KIND_STDOUT => Some(JailerEvent::Output(Stream::Stdout, payload)),
        KIND_STDERR => Some(JailerEvent::Output(Stream::Stderr, payload)),
        KIND_RESULT => serde_json::from_slice(&payload)
            .ok()
            .map(|r| JailerEvent::Result(Box::new(r))),
        _ => None,
    }
}

/// Entry point of `pycelld --broker` (already running as the broker user).
pub fn main(
    config: Config,
    listen_fd: RawFd,
    monitor_fd: RawFd,
    audit_fd: Option<RawFd>,
    allowed_gids: Vec<u32>,
) -> i32 {
    // If the monitor dies, so do we.
    let _ = nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGTERM);
    // Started through /proc/self/fd/N, whose number would be our name.
    let _ = nix::sys::prctl::set_name(c"pycelld");
    if nix::unistd::geteuid().is_root() {
        eprintln!("pycelld broker: refusing to run as root");
        return 1;
    }
    // The descriptors were inherited from the monitor at these numbers
    // (documented in `monitor::run`); take ownership exactly once.
    let (listener, monitor) = match (take_fd(listen_fd), take_fd(monitor_fd)) {
        (Some(l), Some(m)) => (l, m),
        _ => {
            eprintln!("pycelld broker: --listen-fd/--monitor-fd are not open descriptors");
            return 1;
        }
    };
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .max_blocking_threads(8)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("pycelld broker: {e}");
            return 1;
        }
    };
    let audit = audit_fd.and_then(take_fd).map(std::fs::File::from);
    rt.block_on(serve(config, listener, monitor, audit, allowed_gids))
}

fn take_fd(fd: RawFd) -> Option<OwnedFd> {
    pycell_jailer::syscall::adopt_inherited_fd(fd)
}

async fn serve(
    config: Config,
    listener: OwnedFd,
    monitor: OwnedFd,
    audit: Option<std::fs::File>,
    allowed_gids: Vec<u32>,
) -> i32 {
    let std_listener = std::os::unix::net::UnixListener::from(listener);
    if std_listener.set_nonblocking(true).is_err() {
        return 1;
    }
    let listener = match UnixListener::from_std(std_listener) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("pycelld broker: {e}");
            return 1;
        }
    };
    let monitor = StdUnixStream::from(monitor);
    let reader = match monitor.try_clone() {
        Ok(r) => r,
        Err(_) => return 1,
    };
    let pending: Pending = Arc::new(Mutex::new(HashMap::new()));
    let gone = Arc::new(Notify::new());
    {
        let (p, g) = (Arc::clone(&pending), Arc::clone(&gone));
        std::thread::spawn(move || monitor_reader(reader, p, g));
    }
    let broker = Arc::new(Broker {
        global: Arc::new(Semaphore::new(config.max_concurrent_runs)),
        config,
        allowed_gids,
        link: Arc::new(MonitorLink {
            writer: Mutex::new(monitor),
            pending,
            next_req: AtomicU64::new(1),
        }),
        per_uid: Mutex::new(HashMap::new()),
        active: AtomicUsize::new(0),
        stopping: AtomicBool::new(false),
        idle: Notify::new(),
        audit: Mutex::new(audit),
    });
    let _ = broker.link.send(&ToMonitor::Ready);
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(s) => s,
        Err(_) => return 1,
    };
    loop {
        tokio::select! {
            conn = listener.accept() => {
                if let Ok((stream, _)) = conn {
                    tokio::spawn(serve_connection(Arc::clone(&broker), stream));
                }
            }
            _ = term.recv() => break,
            _ = gone.notified() => return 0,
        }
    }
    // Drain: no new runs; running ones get the grace period.
    broker.stopping.store(true, Ordering::SeqCst);
    drop(listener);
    let deadline = Instant::now() + broker.config.shutdown_grace;
    while broker.active.load(Ordering::SeqCst) > 0 && Instant::now() < deadline {
        let left = deadline.saturating_duration_since(Instant::now());
        let _ = tokio::time::timeout(left.min(Duration::from_millis(100)), broker.idle.notified())
            .await;
    }
    0
}
