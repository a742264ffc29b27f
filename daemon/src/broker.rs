//! The unprivileged half of pycelld (runs as the `pycell` user): accepts
//! clients on the socket, checks each peer's credentials, speaks the framed
//! JSON protocol, applies concurrency quotas, asks the monitor to start and
//! stop runs, relays each run's events, and writes the audit log.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream as StdUnixStream;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use pycell_core::events::{read_event_async, Event};
use pycell_core::framing::{self, FrameError};
use pycell_core::info::{DaemonInfo, DaemonStatus, HostInfo};
use pycell_core::launch::{Collector, JailerEnd};
use pycell_core::protocol::{
    encode_b64, ClientMessage, ErrorCode, RunRequest, ServerMessage, PROTOCOL_VERSION,
};
use pycell_core::result::{LimitsReport, RunResult};
use sha2::{Digest, Sha256};
use tokio::net::unix::pipe;
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{oneshot, Notify, Semaphore};

use crate::config::{AuditSink, Config};
use crate::monitor::{ToBroker, ToMonitor};
use crate::sockets;

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

/// One frame from the monitor and the descriptors that came with it.
fn read_monitor_frame(stream: &mut StdUnixStream) -> std::io::Result<(ToBroker, Vec<OwnedFd>)> {
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
    if len > pycell_core::protocol::MAX_FRAME {
        return Err(std::io::Error::other("monitor frame too large"));
    }
    let mut body = vec![0u8; len as usize];
    stream.read_exact(&mut body)?;
    let msg = framing::decode(&body)
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))?;
    Ok((msg, fds))
}

/// Read frames from the monitor; route replies to the waiting runs.
fn monitor_reader(mut stream: StdUnixStream, pending: Pending, gone: Arc<Notify>) {
    loop {
        let (msg, mut fds) = match read_monitor_frame(&mut stream) {
            Ok(m) => m,
            Err(e) if e.kind() == std::io::ErrorKind::InvalidData => continue,
            Err(_) => {
                gone.notify_waiters();
                if let Ok(mut p) = pending.lock() {
                    p.clear();
                }
                // Without the monitor nothing can run: leave.
                std::process::exit(0);
            }
        };
        let req = match &msg {
            ToBroker::Spawned { req, .. } | ToBroker::Refused { req, .. } => *req,
            ToBroker::Exited { .. } | ToBroker::Handoff { .. } => continue,
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

    /// What `info` answers: the host as measured now, and our own state.
    fn info(&self) -> DaemonInfo {
        let c = &self.config;
        DaemonInfo {
            host: HostInfo::collect(
                "daemon".into(),
                &c.policy_dir,
                pycell_jailer::host::layers(),
            ),
            daemon: DaemonStatus {
                socket: c.socket.clone(),
                max_concurrent_runs: c.max_concurrent_runs,
                max_runs_per_uid: c.max_runs_per_uid,
                active_runs: self.active.load(Ordering::SeqCst),
                uid_range: format!("{}-{}", c.uid_range.start(), c.uid_range.end()),
            },
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

/// The peer's credentials and groups as the kernel recorded them.
fn peer_of(stream: &UnixStream) -> Option<(Peer, Vec<u32>)> {
    let c = stream.peer_cred().ok()?;
    let groups = pycell_jailer::peer_groups(stream.as_fd()).ok()?;
    let peer = Peer {
        uid: c.uid(),
        gid: c.gid(),
        pid: c.pid().unwrap_or(0),
    };
    Some((peer, groups))
}

async fn serve_connection(broker: Arc<Broker>, mut stream: UnixStream) {
    let Some((peer, groups)) = peer_of(&stream) else {
        return;
    };
    if !broker.authorized(&peer, &groups) {
        let msg = format!("uid {} is not allowed to use pycell: ask the administrator to add you to the {:?} group", peer.uid, broker.config.socket_group);
        send(&mut stream, &error(None, ErrorCode::Unauthorized, msg)).await;
        return;
    }
    if !handshake(&mut stream).await {
        return;
    }
    loop {
        let msg = match next_message(&mut stream).await {
            Some(Ok(m)) => m,
            Some(Err(reply)) if send(&mut stream, &reply).await => continue,
            _ => return,
        };
        let going = match msg {
            ClientMessage::Hello { .. } => {
                let e = error(None, ErrorCode::BadMessage, "hello was already received");
                send(&mut stream, &e).await
            }
            ClientMessage::Info => {
                let info = ServerMessage::Info {
                    info: Box::new(broker.info()),
                };
                send(&mut stream, &info).await
            }
            ClientMessage::Cancel { id } => {
                let e = error(Some(&id), ErrorCode::NoSuchRun, NO_SUCH_RUN);
                send(&mut stream, &e).await
            }
            ClientMessage::Run { id, request } => {
                run(&broker, &mut stream, peer, id, request).await
            }
        };
        if !going {
            return;
        }
    }
}

const NO_SUCH_RUN: &str = "no run with that id is going on this connection";

/// The next client message: `Err` holds the reply to a bad one (the
/// connection goes on); `None` means the connection is finished (closed, or
/// a frame too large, which has been answered).
async fn next_message(stream: &mut UnixStream) -> Option<Result<ClientMessage, ServerMessage>> {
    let body = match framing::read_async_raw(stream).await {
        Ok(b) => b,
        Err(FrameError::TooLarge(n)) => {
            let msg = format!(
                "frame of {n} bytes exceeds the maximum of {}",
                pycell_core::protocol::MAX_FRAME
            );
            let _ = framing::write_async(stream, &error(None, ErrorCode::FrameTooLarge, msg)).await;
            return None;
        }
        Err(_) => return None,
    };
    Some(
        framing::decode::<ClientMessage>(&body)
            .map_err(|e| error(None, ErrorCode::BadMessage, e.to_string())),
    )
}

/// The version handshake: `hello` first, in our protocol version.
async fn handshake(stream: &mut UnixStream) -> bool {
    let reply = match next_message(stream).await {
        None => return false,
        Some(Err(reply)) => reply,
        Some(Ok(ClientMessage::Hello { version, .. })) if version == PROTOCOL_VERSION => {
            let welcome = ServerMessage::Welcome {
                version: PROTOCOL_VERSION,
                server: format!("pycelld {}", env!("CARGO_PKG_VERSION")),
            };
            return send(stream, &welcome).await;
        }
        Some(Ok(ClientMessage::Hello { version, .. })) => {
            let msg = format!("this pycelld speaks protocol version {PROTOCOL_VERSION}, the client {version}; upgrade the older one");
            error(None, ErrorCode::VersionMismatch, msg)
        }
        Some(Ok(_)) => error(
            None,
            ErrorCode::HandshakeRequired,
            "the first message must be hello",
        ),
    };
    send(stream, &reply).await;
    false
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

/// A run the monitor started: its id, policy and limits, and its events.
struct Started {
    run_id: String,
    policy: String,
    limits: LimitsReport,
    events: pipe::Receiver,
}

/// Ask the monitor to start the run; `Err` is the reply to the client.
async fn start(
    broker: &Arc<Broker>,
    peer: Peer,
    id: &str,
    request: &RunRequest,
) -> Result<Started, ServerMessage> {
    let internal = |m: String| error(Some(id), ErrorCode::Internal, m);
    let (reply, fd) = broker
        .link
        .spawn(peer.uid, request.clone())
        .await
        .map_err(internal)?;
    let (run_id, policy, limits) = match reply {
        ToBroker::Spawned {
            run_id,
            policy,
            limits,
            ..
        } => (run_id, policy, limits),
        ToBroker::Refused { code, message, .. } => return Err(error(Some(id), code, message)),
        _ => return Err(internal("unexpected reply from the monitor".into())),
    };
    let events = fd
        .ok_or_else(|| "the monitor sent no event pipe".to_string())
        .and_then(|fd| pipe::Receiver::from_owned_fd(fd).map_err(|e| e.to_string()));
    match events {
        Ok(events) => Ok(Started {
            run_id,
            policy,
            limits,
            events,
        }),
        Err(m) => {
            let _ = broker.link.send(&ToMonitor::Kill { run_id });
            Err(internal(m))
        }
    }
}

async fn run_admitted(
    broker: &Arc<Broker>,
    stream: &mut UnixStream,
    peer: Peer,
    id: &str,
    request: &RunRequest,
) -> Option<ServerMessage> {
    let started = match start(broker, peer, id, request).await {
        Ok(s) => s,
        Err(reply) => return Some(reply),
    };
    let run_id = started.run_id.clone();
    let kill = || {
        let _ = broker.link.send(&ToMonitor::Kill {
            run_id: run_id.clone(),
        });
    };
    let hello = ServerMessage::Started {
        id: id.to_string(),
        run_id: run_id.clone(),
    };
    if !send(stream, &hello).await {
        kill();
        return None;
    }
    let (result, connection_alive) = relay(stream, id, started, &kill).await;
    broker.audit(&peer, request, &result);
    connection_alive.then(|| ServerMessage::Result {
        id: id.to_string(),
        result: Box::new(result),
    })
}

/// Forward the run's output to the client while answering its messages
/// (cancel); build the result. Returns it and whether the client is still
/// there.
async fn relay(
    stream: &mut UnixStream,
    id: &str,
    mut started: Started,
    kill: &(dyn Fn() + Sync),
) -> (RunResult, bool) {
    let mut collector = Collector::new(&started.run_id, &started.policy, Some(started.limits));
    let (mut connection_alive, mut cancelled) = (true, false);
    let (mut rd, mut wr) = stream.split();
    loop {
        tokio::select! {
            ev = read_event_async(&mut started.events) => match ev {
                Ok(Some(ev)) => {
                    let is_output = matches!(ev, Event::Output(..));
                    let Some((s, bytes)) = collector.record(ev) else {
                        if is_output { continue } else { break }
                    };
                    let msg = ServerMessage::Output { id: id.to_string(), stream: s, data_base64: encode_b64(bytes) };
                    if connection_alive && framing::write_async(&mut wr, &msg).await.is_err() {
                        connection_alive = false;
                        kill();
                    }
                }
                Ok(None) => break,
                Err(e) => {
                    collector.broken(e);
                    kill();
                    break;
                }
            },
            frame = framing::read_async_raw(&mut rd), if connection_alive => {
                let msg = match frame {
                    Ok(body) => framing::decode::<ClientMessage>(&body)
                        .map_err(|e| error(None, ErrorCode::BadMessage, e.to_string())),
                    Err(_) => {
                        // The client went away: its run goes too.
                        connection_alive = false;
                        kill();
                        continue;
                    }
                };
                match msg {
                    Ok(ClientMessage::Cancel { id: cid }) if cid == id => {
                        if !cancelled {
                            cancelled = true;
                            kill();
                        }
                    }
                    other => {
                        let _ = framing::write_async(&mut wr, &reply_during_run(other)).await;
                    }
                }
            }
        }
    }
    (collector.finish(JailerEnd::Elsewhere), connection_alive)
}

/// The answer to a client message other than this run's cancel while the
/// run goes (the connection holds one run at a time).
fn reply_during_run(msg: Result<ClientMessage, ServerMessage>) -> ServerMessage {
    match msg {
        Ok(ClientMessage::Cancel { id }) => error(Some(&id), ErrorCode::NoSuchRun, NO_SUCH_RUN),
        Ok(ClientMessage::Run { id, .. }) => error(
            Some(&id),
            ErrorCode::RunInProgress,
            "this connection already has a run going; open another connection or wait",
        ),
        Ok(_) => error(
            None,
            ErrorCode::BadMessage,
            "only cancel is accepted while a run is going",
        ),
        Err(reply) => reply,
    }
}

/// Entry point of `pycelld --broker` (already running as the broker user,
/// its monitor link as stdin).
pub fn main(allowed_gids: Vec<u32>) -> i32 {
    // If the monitor dies, so do we.
    let _ = nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGTERM);
    // Started through /proc/self/fd/N, whose number would be our name.
    let _ = nix::sys::prctl::set_name(c"pycelld");
    if nix::unistd::geteuid().is_root() {
        eprintln!("pycelld broker: refusing to run as root");
        return 1;
    }
    let (listener, monitor, audit, config) = match take_handoff() {
        Ok(h) => h,
        Err(e) => {
            eprintln!("pycelld broker: {e} (--broker is internal: the monitor starts it)");
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
    rt.block_on(serve(config, listener, monitor, audit, allowed_gids))
}

/// The monitor link (our stdin) and what the monitor sends first over it:
/// the listening socket, the audit log if auditing to a file, and the
/// configuration it read.
fn take_handoff() -> std::io::Result<(OwnedFd, StdUnixStream, Option<std::fs::File>, Config)> {
    let mut link = StdUnixStream::from(sockets::take_stdin_link()?);
    let (msg, fds) = read_monitor_frame(&mut link)?;
    let ToBroker::Handoff {
        audit,
        config_path,
        config_text,
    } = msg
    else {
        return Err(std::io::Error::other(
            "the monitor's first message was not the handoff",
        ));
    };
    let mut fds = fds.into_iter();
    let listener = fds
        .next()
        .ok_or_else(|| std::io::Error::other("the handoff carried no listening socket"))?;
    let audit = match audit {
        true => Some(std::fs::File::from(fds.next().ok_or_else(|| {
            std::io::Error::other("the handoff carried no audit log")
        })?)),
        false => None,
    };
    let config = Config::parse(&config_text, &config_path).map_err(std::io::Error::other)?;
    Ok((listener, link, audit, config))
}

async fn serve(
    config: Config,
    listener: OwnedFd,
    monitor: StdUnixStream,
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
