//! The unprivileged half of pycelld (runs as the `pycell` user): accepts
//! clients on the socket, checks each peer's credentials, speaks the framed
//! JSON protocol ([`connection`]), admits runs through the queue of
//! [`admission`], asks the monitor to start and stop runs over its
//! [`link`], and relays each run's events. The audit log is the monitor's.

pub mod admission;
mod connection;
mod link;
mod order;
pub mod policy_access;
pub mod principal;
mod sessions;
mod tool_relay;

use std::collections::HashMap;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream as StdUnixStream;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use pycell_protocol::info::{DaemonInfo, DaemonStatus};
use pycell_protocol::messages::{ErrorCode, RunRequest};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{watch, Notify};

use crate::broker::admission::{Admission, AdmissionLimits, Refusal};
use crate::broker::principal::Principal;
use crate::config::Config;
use crate::link::ToBroker;
use link::MonitorLink;

pub(crate) struct Broker {
    config: Config,
    allowed_gids: Vec<u32>,
    link: Arc<MonitorLink>,
    admission: Arc<Admission>,
    connections: Connections,
    /// Runs between admission and their result written to the client
    /// (what a drain waits for).
    active: AtomicUsize,
    idle: Notify,
    /// Becomes true when the daemon stops: new runs are refused, waiting
    /// ones give up.
    stop: watch::Sender<bool>,
    /// Open sessions, by handle (see `sessions`).
    sessions: sessions::Sessions,
    /// Cancelled when the daemon stops: every session is killed.
    session_stop: tokio_util::sync::CancellationToken,
    /// Sessions' snapshots, or why there are none.
    snapshots: Result<pycell_launch::snapshots::SnapshotStore, String>,
}

/// A run the monitor started: its id, policy and limits, its events, and
/// the jailer's stdin (on which its jail hands out the egress proxy's
/// listener) with the services for it.
pub(crate) struct SpawnedRun {
    pub(crate) run_id: String,
    pub(crate) sandbox_uid: u32,
    /// A pooled session jail, ready already.
    pub(crate) ready: bool,
    pub(crate) policy: String,
    pub(crate) limits: pycell_protocol::result::RunLimits,
    /// The run's `[images]` and `[output]` bounds.
    pub(crate) media: Option<pycell_wire::spec::MediaLimits>,
    pub(crate) events: tokio::net::unix::pipe::Receiver,
    pub(crate) handouts: Option<std::os::fd::OwnedFd>,
    pub(crate) services: pycell_launch::supervisor::Services,
    /// A server over stdio: its socket, once the jail hands it out, for
    /// the client.
    pub(crate) stdio: Option<tokio::sync::oneshot::Receiver<std::os::fd::OwnedFd>>,
    pub(crate) env: Option<pycell_protocol::result::EnvReport>,
}

/// Credentials of a connected peer, as the kernel recorded them when it
/// connected (SO_PEERCRED).
#[derive(Debug, Clone)]
pub(crate) struct Peer {
    uid: u32,
    gid: u32,
    pid: i32,
    /// The identity a trusted front end said this connection speaks for.
    identity: Option<Arc<str>>,
}

impl Peer {
    /// Who its requests are for.
    pub(crate) fn principal(&self) -> Principal {
        match &self.identity {
            None => Principal::Uid(self.uid),
            Some(name) => Principal::Identity {
                front_end: self.uid,
                name: name.clone(),
            },
        }
    }

    fn ids(&self) -> crate::link::PeerIds {
        crate::link::PeerIds {
            uid: self.uid,
            gid: self.gid,
            pid: self.pid,
            identity: self.identity.as_deref().map(str::to_string),
        }
    }
}

/// Open connections, all together and per uid, under the configured caps.
#[derive(Debug)]
struct Connections {
    max: usize,
    max_per_uid: usize,
    open: Mutex<(usize, HashMap<u32, usize>)>,
}

/// Why a connection is not taken: too many are open.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
enum TooManyConnections {
    #[error("uid {uid} already has {open} connections open (max_connections_per_uid); close some")]
    OfUid { uid: u32, open: usize },
    #[error("{0} connections are open (max_connections); try again shortly")]
    InAll(usize),
}

/// A counted connection; dropping it uncounts it.
struct Counted<'a> {
    connections: &'a Connections,
    uid: u32,
}

impl Connections {
    /// Count a connection of `uid`; a trusted front end's (which carries
    /// many identities) is capped only by the total.
    fn enter(&self, uid: u32, front_end: bool) -> Result<Counted<'_>, TooManyConnections> {
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        let of_uid = open.1.get(&uid).copied().unwrap_or(0);
        if of_uid >= self.max_per_uid && !front_end {
            return Err(TooManyConnections::OfUid { uid, open: of_uid });
        }
        if open.0 >= self.max {
            return Err(TooManyConnections::InAll(open.0));
        }
        open.0 += 1;
        *open.1.entry(uid).or_insert(0) += 1;
        Ok(Counted {
            connections: self,
            uid,
        })
    }

    fn count(&self) -> usize {
        self.open.lock().unwrap_or_else(|p| p.into_inner()).0
    }
}

impl Drop for Counted<'_> {
    fn drop(&mut self) {
        let mut open = self
            .connections
            .open
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        open.0 -= 1;
        if let Some(n) = open.1.get_mut(&self.uid) {
            *n -= 1;
            if *n == 0 {
                open.1.remove(&self.uid);
            }
        }
    }
}

/// A run between admission and result; dropping it may end a drain.
struct ActiveRun<'a>(&'a Broker);

impl Drop for ActiveRun<'_> {
    fn drop(&mut self) {
        if self.0.active.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.0.idle.notify_waiters();
        }
    }
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

    fn stopping(&self) -> bool {
        *self.stop.borrow()
    }

    fn active_run(&self) -> ActiveRun<'_> {
        self.active.fetch_add(1, Ordering::SeqCst);
        ActiveRun(self)
    }

    /// The order for a client's request, before it waits for a slot (a
    /// request that cannot run is refused at once; admission needs its
    /// memory limit): its parsing is CPU work on untrusted input, done on
    /// a blocking thread, off the runtime.
    async fn order(
        &self,
        request: RunRequest,
        granted: Vec<std::os::fd::OwnedFd>,
    ) -> Result<order::Ordered, order::NotOrdered> {
        let dir = self.config.policy_dir.clone();
        tokio::task::spawn_blocking(move || order::order(&dir, request, granted))
            .await
            .unwrap_or_else(|e| {
                let m = format!("ordering the run: {e}");
                Err(order::NotOrdered::Refused(ErrorCode::Internal, m))
            })
    }

    fn refusal_message(&self, r: Refusal, memory: u64) -> String {
        let c = &self.config;
        match r {
            Refusal::NeverFits => format!(
                "the run's memory limit ({} MiB) is more than the daemon's whole memory_budget ({} MiB); ask for less memory",
                memory >> 20,
                c.memory_budget >> 20
            ),
            Refusal::QueueFull => format!(
                "{} runs are already waiting for a slot (max_queued_runs); try again later",
                c.max_queued_runs
            ),
        }
    }

    /// A run's egress proxy, each connection audited by the monitor.
    fn egress_service(
        &self,
        run_id: &str,
        policy: &str,
        rules: pycell_policy::network::EgressRules,
    ) -> (
        pycell_egress::EgressConfig,
        Option<pycell_egress::AuditHook>,
    ) {
        let link = Arc::clone(&self.link);
        let run_id = run_id.to_string();
        let audit: pycell_egress::AuditHook = Arc::new(move |c| {
            let _ = link.send(&crate::link::ToMonitor::Egress {
                run_id: run_id.clone(),
                connection: crate::link::EgressLine::from(c),
            });
        });
        let config = pycell_egress::EgressConfig::from_env(policy, rules);
        (config, Some(audit))
    }

    /// A run's tool service: calls go to `upstream` (its client), each
    /// audited by the monitor.
    fn tool_service(
        &self,
        run_id: &str,
        grant: pycell_launch::tool_grant::ToolGrant,
        upstream: Arc<dyn pycell_tools::service::Upstream>,
    ) -> pycell_tools::service::ToolService {
        let link = Arc::clone(&self.link);
        let run_id = run_id.to_string();
        let audit: pycell_tools::service::AuditHook = Arc::new(move |call| {
            let _ = link.send(&crate::link::ToMonitor::ToolCall {
                run_id: run_id.clone(),
                call: call.clone(),
            });
        });
        grant.service(upstream, Some(audit))
    }

    /// What `info` answers: the host as measured now, and our own state.
    fn info(&self) -> DaemonInfo {
        let c = &self.config;
        DaemonInfo {
            host: pycell_launch::host_info::host_info(
                "daemon".into(),
                &c.policy_dir,
                pycell_launch::layers::layers(),
            ),
            daemon: self.status(),
        }
    }

    fn status(&self) -> DaemonStatus {
        let c = &self.config;
        let (running, queued, memory) = self.admission.status();
        DaemonStatus {
            socket: c.socket.clone(),
            max_concurrent_runs: c.max_concurrent_runs,
            max_runs_per_uid: c.max_runs_per_uid,
            active_runs: running,
            queued_runs: queued,
            max_queued_runs: c.max_queued_runs,
            queue_wait_s: c.queue_wait.as_secs_f64(),
            memory_budget_bytes: c.memory_budget,
            memory_admitted_bytes: memory,
            max_connections: c.max_connections,
            max_connections_per_uid: c.max_connections_per_uid,
            connections: self.connections.count(),
            uid_range: format!("{}-{}", c.uid_range.start(), c.uid_range.end()),
            warm_pools: self.link.warm_pools(),
        }
    }
}

/// The peer's credentials and groups as the kernel recorded them.
fn peer_of(stream: &UnixStream) -> Option<(Peer, Vec<u32>)> {
    let c = stream.peer_cred().ok()?;
    let groups = pycell_syscall::peer_groups(stream.as_fd()).ok()?;
    let peer = Peer {
        uid: c.uid(),
        gid: c.gid(),
        pid: c.pid().unwrap_or(0),
        identity: None,
    };
    Some((peer, groups))
}

/// Entry point of `pycelld --broker` (already running as the broker user,
/// its monitor link as stdin).
pub fn main(allowed_gids: Vec<u32>) -> i32 {
    // The monitor blocks the signals it reads through a signalfd, and a
    // blocked mask survives exec: unblock them, or SIGTERM (our cue to stop
    // accepting and drain) would never arrive.
    let _ = nix::sys::signal::sigprocmask(
        nix::sys::signal::SigmaskHow::SIG_SETMASK,
        Some(&nix::sys::signal::SigSet::empty()),
        None,
    );
    // If the monitor dies, so do we.
    let _ = nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGTERM);
    // Started through /proc/self/fd/N, whose number would be our name.
    let _ = nix::sys::prctl::set_name(c"pycelld");
    // The monitor passes its log filter (and systemd's JOURNAL_STREAM).
    let env = std::env::var(crate::logging::LOG_ENV).ok();
    crate::logging::init(&crate::logging::directives(
        env.as_deref(),
        Default::default(),
    ));
    if nix::unistd::geteuid().is_root() {
        tracing::error!("refusing to run the broker as root");
        return 1;
    }
    let handoff = match take_handoff() {
        Ok(h) => h,
        Err(e) => {
            tracing::error!("{e} (--broker is internal: the monitor starts it)");
            return 1;
        }
    };
    // Each connection holds a descriptor, each run a few more.
    raise_open_files();
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .max_blocking_threads(8)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            tracing::error!("cannot start the broker's runtime: {e}");
            return 1;
        }
    };
    rt.block_on(serve(handoff, allowed_gids))
}

/// The soft RLIMIT_NOFILE up to the hard one.
fn raise_open_files() {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    if let Ok((_, hard)) = getrlimit(Resource::RLIMIT_NOFILE) {
        let _ = setrlimit(Resource::RLIMIT_NOFILE, hard, hard);
    }
}

/// What the monitor hands the broker at its start.
struct Handoff {
    listener: OwnedFd,
    /// The monitor link (our stdin).
    monitor: StdUnixStream,
    config: Config,
    /// Memory the warm pools may use, set aside from admission's budget.
    warm_reserved_bytes: u64,
    /// The pools as planned, until the monitor reports them.
    pools: Vec<pycell_protocol::info::WarmPoolStatus>,
}

/// The monitor link (our stdin) and what the monitor sends first over it:
/// the listening socket, the configuration it read, the pools' memory.
fn take_handoff() -> std::io::Result<Handoff> {
    let mut link = StdUnixStream::from(crate::sockets::take_stdin_link()?);
    let (msg, fds) = link::read_monitor_frame(&mut link)?;
    let ToBroker::Handoff {
        config_path,
        config_text,
        warm_reserved_bytes,
        pools,
    } = msg
    else {
        return Err(std::io::Error::other(
            "the monitor's first message was not the handoff",
        ));
    };
    let listener = fds
        .into_iter()
        .next()
        .ok_or_else(|| std::io::Error::other("the handoff carried no listening socket"))?;
    let config = Config::parse(&config_text, &config_path).map_err(std::io::Error::other)?;
    Ok(Handoff {
        listener,
        monitor: link,
        config,
        warm_reserved_bytes,
        pools,
    })
}

/// Admission's limits: the configuration's, with the memory the warm
/// pools' members may use (as the monitor planned them) set aside from
/// the budget.
fn admission_limits(c: &Config, warm_reserved_bytes: u64) -> AdmissionLimits {
    AdmissionLimits {
        max_running: c.max_concurrent_runs,
        max_running_per_uid: c.max_runs_per_uid,
        memory_budget: c.memory_budget.saturating_sub(warm_reserved_bytes),
        max_queued: c.max_queued_runs,
    }
}

impl Broker {
    fn new(
        config: Config,
        warm_reserved_bytes: u64,
        allowed_gids: Vec<u32>,
        link: Arc<MonitorLink>,
    ) -> Arc<Broker> {
        let snapshots = pycell_launch::snapshots::SnapshotStore::open(
            &config.snapshot_dir(),
            config.snapshots,
            Duration::ZERO,
        )
        .map_err(|e| e.to_string());
        // The sessions paused by an earlier pycelld ended with it.
        if let Ok(store) = &snapshots {
            store.clear_paused();
        }
        Arc::new(Broker {
            snapshots,
            admission: Admission::new(admission_limits(&config, warm_reserved_bytes)),
            connections: Connections {
                max: config.max_connections,
                max_per_uid: config.max_connections_per_uid,
                open: Mutex::new((0, HashMap::new())),
            },
            config,
            allowed_gids,
            link,
            active: AtomicUsize::new(0),
            idle: Notify::new(),
            stop: watch::channel(false).0,
            sessions: Default::default(),
            session_stop: Default::default(),
        })
    }

    /// Stop: no new runs (waiting ones are told); running ones get the
    /// grace period.
    async fn drain(&self) {
        self.stop.send_replace(true);
        // Sessions end with the daemon that holds them.
        self.end_all_sessions(self.config.shutdown_grace).await;
        let deadline = Instant::now() + self.config.shutdown_grace;
        while self.active.load(Ordering::SeqCst) > 0 && Instant::now() < deadline {
            let left = deadline.saturating_duration_since(Instant::now());
            let _ =
                tokio::time::timeout(left.min(Duration::from_millis(100)), self.idle.notified())
                    .await;
        }
    }
}

/// Tell the monitor every second that this runtime turns (its watchdog
/// pings depend on it).
fn spawn_heartbeat(link: Arc<MonitorLink>) {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        loop {
            tick.tick().await;
            let link = Arc::clone(&link);
            let _ = tokio::task::spawn_blocking(move || link.send(&crate::link::ToMonitor::Alive))
                .await;
        }
    });
}

/// Serve connections until SIGTERM. A stop comes first: once told to stop,
/// take no more connections (under socket activation they wait for the
/// next instance).
async fn accept_until_term(
    listener: UnixListener,
    broker: &Arc<Broker>,
) -> Result<(), std::io::Error> {
    let kind = tokio::signal::unix::SignalKind::terminate();
    let mut term = tokio::signal::unix::signal(kind)?;
    loop {
        tokio::select! {
            biased;
            _ = term.recv() => return Ok(()),
            conn = listener.accept() => match conn {
                Ok((stream, _)) => {
                    tokio::spawn(connection::serve(Arc::clone(broker), stream));
                }
                // Out of descriptors or memory: let some connections end
                // rather than spin.
                Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            },
        }
    }
}

async fn serve(handoff: Handoff, allowed_gids: Vec<u32>) -> i32 {
    let Handoff {
        listener,
        monitor,
        config,
        warm_reserved_bytes,
        pools,
    } = handoff;
    let started = (|| {
        let std_listener = std::os::unix::net::UnixListener::from(listener);
        std_listener.set_nonblocking(true)?;
        Ok::<_, std::io::Error>((
            UnixListener::from_std(std_listener)?,
            MonitorLink::start(monitor, pools)?,
        ))
    })();
    let (listener, link) = match started {
        Ok(s) => s,
        Err(e) => {
            tracing::error!("cannot serve the socket: {e}");
            return 1;
        }
    };
    let broker = Broker::new(config, warm_reserved_bytes, allowed_gids, link);
    let _ = broker.link.send(&crate::link::ToMonitor::Ready);
    spawn_heartbeat(Arc::clone(&broker.link));
    broker.keep_pausing();
    if let Err(e) = accept_until_term(listener, &broker).await {
        tracing::error!("the broker stopped accepting: {e}");
        return 1;
    }
    broker.drain().await;
    0
}
