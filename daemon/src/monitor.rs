//! The root half of pycelld: small, single-threaded, and it accepts only the
//! closed set of [`ToMonitor`] messages from the broker over a socketpair.
//!
//! Threat model: the broker handles untrusted clients and may be
//! compromised. So the monitor never takes a jail spec from it, and never
//! parses client input: it gets a run as the broker resolved it (a
//! [`RunOrder`]: a policy name, final limits, the code as an opaque blob,
//! normalized requirements), re-checks each field cheaply and resolves it
//! itself against the operator's policies, exactly as for any client. Its
//! root powers are used for: creating the socket, sweeping leftover cgroups,
//! leasing sandbox uids, spawning `pycell-jailer` (which creates the run's
//! cgroup) and killing runs.

use std::collections::HashMap;
use std::fs;
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::signal::{kill, sigprocmask, SigSet, SigmaskHow, Signal};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::{Gid, Group, Pid, Uid, User};
use pycell_deps::{self as deps, build::Plan, store::EnvInUse, store::EnvStore};
use pycell_host::cgroup::CgroupLayout;
use pycell_launch::launcher::{self as launch, JailerStderr, Launched, Launcher, PolicyChoice};
use pycell_launch::resolve::Extras;
use pycell_protocol::framing;
use pycell_protocol::messages::{ErrorCode, RunRequest};
use pycell_protocol::result::{EnvReport, LimitsReport};
use pycell_wire::codes::FailureCode;

use crate::audit::{AuditLog, RunStart};
use crate::config::is_proxy_setting;
use crate::config::Config;
use crate::envs::{Build, Builders};
use crate::link::{refusal, PeerIds, RunOrder, ToBroker, ToMonitor};
use crate::listen;
use crate::pool::Pools;
use pycell_launch::supervisor::{Escalation, JailerProcess, StoppedBy, PATIENCE};

#[derive(Debug, thiserror::Error)]
pub enum MonitorError {
    #[error("pycelld must start as root (the monitor creates cgroups and maps sandbox uids)")]
    NotRoot,
    #[error("user {0:?} does not exist: create it (the Debian package does: adduser --system --group pycell)")]
    NoUser(String),
    #[error(
        "group {0:?} does not exist: create it, or set socket_group/allowed_groups in the config"
    )]
    NoGroup(String),
    #[error("socket {path}: {source}")]
    Socket { path: PathBuf, source: io::Error },
    #[error("starting the broker: {0}")]
    Broker(io::Error),
    #[error("{0}")]
    Cgroup(#[from] pycell_host::cgroup::CgroupError),
    #[error("{0}")]
    Jailer(String),
    #[error("{0}")]
    Sys(String),
}

struct Run {
    run_id: String,
    /// Its jailer and uid lease, its deadline (the run's wall timeout and
    /// [`PATIENCE`]'s slack) and stop escalation: the supervisor's process
    /// side, the same as in embedded mode.
    process: JailerProcess<Child>,
    /// The env of its dependencies: in use (so kept) while the run goes.
    _env: Option<EnvInUse>,
    started: Instant,
}

/// The monitor's answer to a spawn request: a message for the broker and
/// the descriptors it carries, or a refusal.
type Reply = Result<(ToBroker, Vec<OwnedFd>), Box<ToBroker>>;

/// Where a run's env stands when it is asked for.
enum EnvStep {
    NoDependencies,
    Ready((EnvInUse, EnvReport)),
    /// Its builder started; this is the reply for the broker.
    Building((ToBroker, Vec<OwnedFd>)),
}

/// The monitor's loop turns at least this often (deadlines, the watchdog).
const TICK: Duration = Duration::from_millis(200);
/// A frame from the broker, once begun, must arrive whole within this; a
/// frame to it must be taken within this. Otherwise the broker is taken
/// for wedged or compromised, and the service stops (systemd restarts it).
const LINK_TIMEOUT: Duration = Duration::from_secs(5);
/// Jailers the monitor runs at most, per admitted run slot: the broker
/// frees a slot when a run's result is in, its jailer exits just after.
const JAILERS_PER_SLOT: usize = 2;

/// The ids the broker needs to check peers.
#[derive(Debug)]
pub struct ResolvedIds {
    pub broker_uid: Uid,
    pub broker_gid: Gid,
    pub socket_gid: Gid,
    pub allowed_gids: Vec<u32>,
}

pub fn resolve_ids(config: &Config) -> Result<ResolvedIds, MonitorError> {
    let user = User::from_name(&config.broker_user)
        .ok()
        .flatten()
        .ok_or_else(|| MonitorError::NoUser(config.broker_user.clone()))?;
    let group = |name: &str| {
        Group::from_name(name)
            .ok()
            .flatten()
            .map(|g| g.gid)
            .ok_or_else(|| MonitorError::NoGroup(name.to_string()))
    };
    let socket_gid = group(&config.socket_group)?;
    let allowed_gids = config
        .allowed_groups
        .iter()
        .map(|g| group(g).map(|g| g.as_raw()))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(ResolvedIds {
        broker_uid: user.uid,
        broker_gid: user.gid,
        socket_gid,
        allowed_gids,
    })
}

fn clear_cloexec(fd: &impl AsFd) -> Result<(), MonitorError> {
    use nix::fcntl::{fcntl, FcntlArg, FdFlag};
    fcntl(fd, FcntlArg::F_SETFD(FdFlag::empty()))
        .map(|_| ())
        .map_err(|e| MonitorError::Sys(format!("fcntl: {e}")))
}

/// Run the daemon: set up, start the broker, serve until SIGTERM.
pub fn run(config: Config, config_path: &Path) -> Result<(), MonitorError> {
    if !nix::unistd::geteuid().is_root() {
        return Err(MonitorError::NotRoot);
    }
    let ids = resolve_ids(&config)?;
    // Runs live below this service's own (systemd-delegated) cgroup; on v2
    // the monitor first moves into a leaf of it, before any child exists.
    let layout = CgroupLayout::detect()?;
    let cgroup_parent =
        layout.adopt_own_subtree(crate::config::SUPERVISOR_CGROUP, &config.cgroup_parent)?;
    // Leftovers of an earlier instance that was killed: nothing of ours runs yet.
    layout.remove_stale(&cgroup_parent, "pycell-");
    let created_cgroups = layout.missing_dirs(&cgroup_parent);
    let launcher = Launcher {
        policy_dir: config.policy_dir.clone(),
        uid_range: config.uid_range.clone(),
        uid_lock_dir: PathBuf::from(launch::UID_LOCK_DIR),
        cgroup_parent: cgroup_parent.clone(),
        jailer: Ok(launch::find_jailer().map_err(|f| MonitorError::Jailer(f.message))?),
    };
    let audit = AuditLog::open(&config.audit)
        .map_err(|e| MonitorError::Sys(format!("audit log {:?}: {e}", config.audit)))?;
    let (listener, origin) = listening_socket(&config, ids.socket_gid)?;
    let sfd = block_signals()?;
    let (plans, warnings) = crate::pool::plan(&config);
    let warm_reserved = crate::pool::reserved_memory(&plans);
    let (link, broker_pid) = start_broker(&config, config_path, &ids, listener, warm_reserved)?;
    let envs = open_envs(&config, &launcher);
    if let Err(why) = &envs {
        eprintln!("pycelld monitor: runs with dependencies will be refused: {why}");
    }
    for w in warnings {
        eprintln!("pycelld monitor: {w}");
    }
    let pools = Pools::new(plans, config.warm_idle);
    let mut m = Monitor {
        config,
        layout,
        created_cgroups,
        launcher,
        link,
        runs: HashMap::new(),
        envs,
        builds: HashMap::new(),
        pools,
        pools_reported: Vec::new(),
        broker_pid,
        broker_alive: true,
        stopping_since: None,
        audit,
        origin,
        watchdog: Watchdog::from_env(),
        broker_seen: Instant::now(),
        failure: None,
    };
    let result = m.serve(&sfd);
    m.kill_everything();
    result
}

/// pycelld's env store (created if need be) and its builders.
fn open_envs(config: &Config, launcher: &Launcher) -> Result<(EnvStore, Builders), String> {
    let store = EnvStore::open(&config.env_store)
        .map_err(|e| format!("the env store {}: {e}", config.env_store.display()))?;
    crate::envs::check_store_path(&config.env_store)?;
    Ok((store, Builders::new(config, launcher)?))
}

fn block_signals() -> Result<SignalFd, MonitorError> {
    let mut mask = SigSet::empty();
    for s in [
        Signal::SIGCHLD,
        Signal::SIGTERM,
        Signal::SIGINT,
        Signal::SIGHUP,
    ] {
        mask.add(s);
    }
    sigprocmask(SigmaskHow::SIG_BLOCK, Some(&mask), None)
        .map_err(|e| MonitorError::Sys(format!("sigprocmask: {e}")))?;
    SignalFd::with_flags(&mask, SfdFlags::SFD_CLOEXEC | SfdFlags::SFD_NONBLOCK)
        .map_err(|e| MonitorError::Sys(format!("signalfd: {e}")))
}

/// The listening socket: systemd's (socket activation), else our own.
fn listening_socket(
    config: &Config,
    socket_gid: Gid,
) -> Result<(UnixListener, listen::Origin), MonitorError> {
    let sock_err = |source| MonitorError::Socket {
        path: config.socket.clone(),
        source,
    };
    if let Some(l) = listen::from_systemd(&config.socket).map_err(sock_err)? {
        return Ok((l, listen::Origin::Systemd));
    }
    let l = listen::bind(&config.socket, socket_gid, config.socket_mode).map_err(sock_err)?;
    Ok((l, listen::Origin::Bound))
}

/// Start the broker: this same executable with `--broker`, as the broker
/// user, its end of the monitor link as its stdin; then hand it the
/// listening socket and the configuration over that link. Returns our end
/// of the link (with timeouts set) and the broker's pid.
fn start_broker(
    config: &Config,
    config_path: &Path,
    ids: &ResolvedIds,
    listener: UnixListener,
    warm_reserved_bytes: u64,
) -> Result<(UnixStream, Pid), MonitorError> {
    let (mine, theirs) = UnixStream::pair().map_err(MonitorError::Broker)?;
    // The broker execs this binary through a descriptor opened here as root:
    // as the broker user it may not be able to reach the file by its path
    // (say, a build under /root), and /proc/self/fd needs no search right.
    // This process is single-threaded, so clearing close-on-exec here
    // cannot leak it into any other child.
    let exe = std::env::current_exe()
        .and_then(fs::File::open)
        .map_err(MonitorError::Broker)?;
    clear_cloexec(&exe)?;
    let gids: Vec<String> = ids.allowed_gids.iter().map(|g| g.to_string()).collect();
    let broker = Command::new(format!("/proc/self/fd/{}", exe.as_raw_fd()))
        .arg0("pycelld")
        .args(["--broker", "--allowed-gids", &gids.join(",")])
        .env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        // The egress proxy (in the broker) goes out the way the host's
        // own proxy settings say: pass those, and nothing else.
        .envs(std::env::vars().filter(|(k, _)| is_proxy_setting(k)))
        .uid(ids.broker_uid.as_raw())
        .gid(ids.broker_gid.as_raw())
        .stdin(Stdio::from(OwnedFd::from(theirs)))
        .spawn()
        .map_err(MonitorError::Broker)?;
    let frame = framing::encode(&ToBroker::Handoff {
        config_path: config_path.to_path_buf(),
        config_text: config.source_text.clone(),
        warm_reserved_bytes,
    })
    .map_err(|e| MonitorError::Sys(e.to_string()))?;
    crate::sockets::send_with_fds(mine.as_fd(), &frame, &[listener.as_fd()])
        .map_err(MonitorError::Broker)?;
    mine.set_read_timeout(Some(LINK_TIMEOUT))
        .and_then(|()| mine.set_write_timeout(Some(LINK_TIMEOUT)))
        .map_err(MonitorError::Broker)?;
    Ok((mine, Pid::from_raw(broker.id() as i32)))
}

struct Monitor {
    config: Config,
    layout: CgroupLayout,
    /// The run cgroups' parent directories this instance made (removed
    /// when it stops).
    created_cgroups: Vec<PathBuf>,
    /// Prepares and starts runs (the launch path every mode shares).
    launcher: Launcher,
    link: UnixStream,
    runs: HashMap<i32, Run>,
    /// Where runs' envs are kept and how they are built, or why they
    /// cannot be (runs that need one are then refused, saying so).
    envs: Result<(EnvStore, Builders), String>,
    /// Envs being built, by builder pid.
    builds: HashMap<i32, Build>,
    /// Warm jails waiting for runs.
    pools: Pools,
    /// What the broker was last told of them.
    pools_reported: Vec<pycell_protocol::info::WarmPoolStatus>,
    broker_pid: Pid,
    broker_alive: bool,
    stopping_since: Option<Instant>,
    audit: AuditLog,
    origin: listen::Origin,
    watchdog: Option<Watchdog>,
    /// When the broker last said it is alive.
    broker_seen: Instant,
    /// Why the service stops, if it is for a failure (the exit status says so).
    failure: Option<String>,
}

/// systemd's watchdog (`WatchdogSec=`): pinged at half its interval while
/// the monitor's loop turns and the broker's keeps saying it is alive.
#[derive(Debug)]
struct Watchdog {
    every: Duration,
    last: Instant,
}

impl Watchdog {
    fn from_env() -> Option<Watchdog> {
        let pid_ok =
            std::env::var("WATCHDOG_PID").map_or(true, |p| p == std::process::id().to_string());
        let usec: u64 = std::env::var("WATCHDOG_USEC").ok()?.parse().ok()?;
        for var in ["WATCHDOG_USEC", "WATCHDOG_PID"] {
            std::env::remove_var(var);
        }
        (pid_ok && usec > 0).then(|| Watchdog {
            every: Duration::from_micros(usec / 2),
            last: Instant::now() - Duration::from_micros(usec),
        })
    }
}

fn notify_systemd(state: &str) {
    let Some(path) = std::env::var_os("NOTIFY_SOCKET") else {
        return;
    };
    let sock = match std::os::unix::net::UnixDatagram::unbound() {
        Ok(s) => s,
        Err(_) => return,
    };
    let p = path.to_string_lossy().into_owned();
    if let Some(name) = p.strip_prefix('@') {
        use std::os::linux::net::SocketAddrExt;
        if let Ok(addr) = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()) {
            let _ = sock.send_to_addr(state.as_bytes(), &addr);
        }
    } else {
        let _ = sock.send_to(state.as_bytes(), &p);
    }
}

impl Monitor {
    fn serve(&mut self, sfd: &SignalFd) -> Result<(), MonitorError> {
        loop {
            if let Some(since) = self.stopping_since {
                // The broker drains for the grace period; after that (and a
                // little slack) everything left is killed.
                let deadline = since + self.config.shutdown_grace + Duration::from_secs(2);
                let idle = self.runs.is_empty() && self.builds.is_empty() && self.pools.is_empty();
                if (!self.broker_alive && idle) || Instant::now() >= deadline {
                    // A stop for a broker that failed is a failure (so
                    // that systemd restarts the service).
                    return match self.failure.take() {
                        Some(why) => Err(MonitorError::Sys(why)),
                        None => Ok(()),
                    };
                }
            } else if !self.broker_alive {
                return Err(MonitorError::Sys("the broker exited; stopping".into()));
            }
            self.escalate_kills();
            self.ping_watchdog();
            self.tend_pools();
            let (sig_ready, link_ready) = self.wait(sfd)?;
            if sig_ready {
                while let Ok(Some(info)) = sfd.read_signal() {
                    let sig = info.ssi_signo as i32;
                    if sig == Signal::SIGCHLD as i32 {
                        self.reap();
                    } else if self.stopping_since.is_none() {
                        self.stopping_since = Some(Instant::now());
                        notify_systemd("STOPPING=1");
                        let _ = kill(self.broker_pid, Signal::SIGTERM);
                        self.pools.stop_all();
                        for run in self.runs.values_mut() {
                            run.process.blame(StoppedBy::Shutdown);
                        }
                    }
                }
            }
            if link_ready {
                match framing::read_sync::<ToMonitor>(&mut self.link) {
                    Ok(msg) => self.handle(msg),
                    Err(e) if broker_went_away(&e) => {
                        self.broker_alive = false;
                        if self.stopping_since.is_none() {
                            self.stopping_since = Some(Instant::now());
                            self.failure = Some("the broker exited; stopping".into());
                        }
                        self.kill_all_runs();
                    }
                    Err(e) => self.broker_failed(&format!("bad message from the broker ({e})")),
                }
            }
        }
    }

    /// Wait (up to [`TICK`], or until a pool is due to refill) for a
    /// signal, the broker, or a warm jail's event; take the warm jails'
    /// events. Whether the signalfd and the link are readable.
    fn wait(&mut self, sfd: &SignalFd) -> Result<(bool, bool), MonitorError> {
        let warming = self.pools.warming();
        let mut fds = vec![
            PollFd::new(sfd.as_fd(), PollFlags::POLLIN),
            PollFd::new(self.link.as_fd(), PollFlags::POLLIN),
        ];
        fds.extend(
            warming
                .iter()
                .map(|(_, fd)| PollFd::new(*fd, PollFlags::POLLIN)),
        );
        let wait = self.pools.next_refill().map_or(TICK, |t| {
            t.saturating_duration_since(Instant::now()).min(TICK)
        });
        match poll(
            &mut fds,
            PollTimeout::try_from(wait).unwrap_or(PollTimeout::MAX),
        ) {
            Ok(_) | Err(nix::errno::Errno::EINTR) => {}
            Err(e) => return Err(MonitorError::Sys(format!("poll: {e}"))),
        }
        let ready = |f: &PollFd<'_>| f.revents().is_some_and(|r| !r.is_empty());
        let (sig_ready, link_ready) = (ready(&fds[0]), ready(&fds[1]));
        let members: Vec<i32> = warming
            .iter()
            .zip(&fds[2..])
            .filter(|(_, f)| ready(f))
            .map(|((pid, _), _)| *pid)
            .collect();
        drop(fds);
        drop(warming);
        for pid in members {
            self.pools.event(pid);
        }
        Ok((sig_ready, link_ready))
    }

    /// Warm pools: retire idle members, start missing ones (not while
    /// stopping).
    fn tend_pools(&mut self) {
        if self.stopping_since.is_some() {
            return;
        }
        self.pools.retire_idle();
        let store = self.envs.as_ref().ok().map(|(s, _)| s);
        self.pools.refill(&self.launcher, store);
        self.report_pools();
    }

    /// Tell the broker how the pools stand, if that changed.
    fn report_pools(&mut self) {
        let now = self.pools.status();
        if now != self.pools_reported {
            self.send(&ToBroker::WarmPools { pools: now.clone() });
            self.pools_reported = now;
        }
    }

    /// A broker that sends what it must not, stalls inside a frame or
    /// stops taking ours is treated as compromised: stop everything.
    fn broker_failed(&mut self, why: &str) {
        eprintln!("pycelld monitor: {why}; stopping");
        self.failure.get_or_insert_with(|| why.to_string());
        let _ = kill(self.broker_pid, Signal::SIGKILL);
        self.broker_alive = false;
        self.stopping_since.get_or_insert_with(Instant::now);
        self.kill_all_runs();
    }

    fn send(&mut self, msg: &ToBroker) {
        if let Err(e) = framing::write_sync(&mut self.link, msg) {
            // A broker that drains and exits as asked is not a failure.
            if self.broker_alive && self.stopping_since.is_none() {
                self.broker_failed(&format!("cannot write to the broker ({e})"));
            }
        }
    }

    /// Tell systemd we are well: our loop turns (we are here) and the
    /// broker's does (it said so lately).
    fn ping_watchdog(&mut self) {
        let Some(w) = self.watchdog.as_mut() else {
            return;
        };
        let broker_ok = self.broker_seen.elapsed() < w.every * 2;
        if broker_ok && w.last.elapsed() >= w.every {
            w.last = Instant::now();
            notify_systemd("WATCHDOG=1");
        }
    }

    fn handle(&mut self, msg: ToMonitor) {
        match msg {
            ToMonitor::Ready => {
                self.broker_seen = Instant::now();
                notify_systemd("READY=1");
            }
            ToMonitor::Alive => self.broker_seen = Instant::now(),
            ToMonitor::Kill { run_id } => {
                if let Some(run) = self.runs.values_mut().find(|r| r.run_id == run_id) {
                    run.process.stop(StoppedBy::Request);
                }
            }
            ToMonitor::Abandon { req } => {
                if let Some(build) = self.builds.values_mut().find(|b| b.req == req) {
                    build.stop();
                }
            }
            ToMonitor::Egress { run_id, connection } => {
                // Any well-formed run id: the broker reports a connection
                // when it ends, which may be just after its run was reaped.
                if run_id.len() <= 40 && run_id.starts_with("r-") {
                    self.audit.egress(&run_id, &connection);
                }
            }
            ToMonitor::Spawn { req, peer, order } => {
                if self.stopping_since.is_some() {
                    self.send(&ToBroker::Refused {
                        req,
                        code: ErrorCode::ShuttingDown,
                        message: "pycelld is shutting down".into(),
                    });
                    return;
                }
                let reply = self.spawn(req, peer, order, None);
                self.reply(req, peer, reply);
            }
        }
    }

    /// Send the answer to a spawn request, with its descriptors.
    fn reply(&mut self, req: u64, peer: PeerIds, reply: Reply) {
        let (msg, fds) = match reply {
            Ok(sent) => sent,
            Err(refusal) => (*refusal, Vec::new()),
        };
        let fds: Vec<_> = fds.iter().map(|f| f.as_fd()).collect();
        let sent = framing::encode(&msg)
            .map_err(|e| e.to_string())
            .and_then(|frame| {
                crate::sockets::send_with_fds(self.link.as_fd(), &frame, &fds)
                    .map_err(|e| e.to_string())
            });
        if let Err(e) = sent {
            eprintln!(
                "pycelld monitor: cannot answer request {req} (peer uid {}) to the broker: {e}",
                peer.uid
            );
        }
    }

    /// Start the run, or its env's build first. `built` is the outcome of
    /// that build, once it is done.
    fn spawn(
        &mut self,
        req: u64,
        peer: PeerIds,
        order: RunOrder,
        built: Option<EnvReport>,
    ) -> Reply {
        let refuse = |(code, message)| Box::new(ToBroker::Refused { req, code, message });
        let cap = self.config.max_concurrent_runs * JAILERS_PER_SLOT;
        if self.runs.len() + self.builds.len() >= cap {
            return Err(refuse((
                ErrorCode::Busy,
                format!("the monitor already runs {cap} jailers and env builds (twice max_concurrent_runs); try again shortly"),
            )));
        }
        let policy = self
            .launcher
            .load_policy(PolicyChoice::Name(&order.policy))
            .map_err(|e| refuse(refusal(e)))?;
        order.check(&policy).map_err(|failure| {
            Box::new(ToBroker::Failed {
                req,
                policy: policy.name.clone(),
                failure,
            })
        })?;
        let request = order.to_request();
        let env = match self.env_for(req, peer, &policy, order, built)? {
            EnvStep::Building(reply) => return Ok(reply),
            EnvStep::Ready(env) => Some(env),
            EnvStep::NoDependencies => None,
        };
        let extras = Extras {
            env: env.as_ref().map(|(e, _)| e.dir.clone()),
            ..Extras::default()
        };
        if let Some(reply) = self.start_warm(req, peer, &policy, &request, &extras, &env) {
            return Ok(reply);
        }
        let prepared = self
            .launcher
            .prepare_with(&policy, &request, &extras)
            .map_err(|e| refuse(refusal(e)))?;
        let launched = prepared.spawn(JailerStderr::Inherit).map_err(|r| {
            let message = r.error.map_or_else(String::new, |e| e.message);
            refuse((ErrorCode::Internal, message))
        })?;
        Ok(self.started(req, peer, launched, env, &request.code, false))
    }

    /// Hand the run to a warm jail of the pool, if one is exactly the jail
    /// the run would get.
    fn start_warm(
        &mut self,
        req: u64,
        peer: PeerIds,
        policy: &pycell_policy::Policy,
        request: &RunRequest,
        extras: &Extras,
        env: &Option<(EnvInUse, EnvReport)>,
    ) -> Option<(ToBroker, Vec<OwnedFd>)> {
        let resolved = pycell_launch::resolve::resolve_with(policy, request, extras).ok()?;
        let taken = self.pools.take(&policy.name, &resolved.spec)?;
        let mut launched = taken.launched;
        // The run's own limits (its timeout, its output cap), which its
        // work carried.
        launched.limits = LimitsReport::from(&resolved.limits);
        // The member holds the env; the report is the run's.
        let env = match (taken.env, env) {
            (Some((held, _)), Some((_, report))) => Some((held, report.clone())),
            (held, _) => held,
        };
        Some(self.started(req, peer, launched, env, &request.code, true))
    }

    /// A run's jailer started (cold, or a warm jail given its work): the
    /// broker's message and descriptors; the run is kept until reaped.
    fn started(
        &mut self,
        req: u64,
        peer: PeerIds,
        launched: Launched,
        env: Option<(EnvInUse, EnvReport)>,
        code: &str,
        warm: bool,
    ) -> (ToBroker, Vec<OwnedFd>) {
        self.audit.run_started(&RunStart {
            run_id: &launched.run_id,
            peer,
            code,
            policy: &launched.policy,
            limits: &launched.limits,
            sandbox_uid: launched.lease.uid,
            warm,
        });
        let started = Instant::now();
        let wall = Duration::from_secs_f64(launched.limits.wall_timeout_s);
        let mut fds = vec![OwnedFd::from(launched.events)];
        fds.extend(launched.handouts);
        let egress = launched.egress;
        let (env, report) = env.unzip();
        let msg = ToBroker::Spawned {
            req,
            run_id: launched.run_id.clone(),
            sandbox_uid: launched.lease.uid,
            policy: launched.policy,
            limits: launched.limits,
            egress,
            env: report,
        };
        let process = JailerProcess::new(launched.child, launched.lease, wall, PATIENCE);
        self.runs.insert(
            process.pid(),
            Run {
                run_id: launched.run_id,
                process,
                _env: env,
                started,
            },
        );
        (msg, fds)
    }

    /// The run's env: none needed, in the store, or being built now (the
    /// run starts when its builder is done, see [`Monitor::built`]).
    fn env_for(
        &mut self,
        req: u64,
        peer: PeerIds,
        policy: &pycell_policy::Policy,
        order: RunOrder,
        built: Option<EnvReport>,
    ) -> Result<EnvStep, Box<ToBroker>> {
        let failed = |failure| {
            Box::new(ToBroker::Failed {
                req,
                policy: policy.name.clone(),
                failure,
            })
        };
        let Some(wanted) = &order.dependencies else {
            return Ok(EnvStep::NoDependencies);
        };
        let (store, builders) = self.envs.as_ref().map_err(|why| {
            failed(deps::failure(
                FailureCode::DepsUnavailable,
                format!("pycelld cannot build dependency envs: {why}"),
            ))
        })?;
        let plan: Plan = deps::build::plan(&self.launcher, policy, wanted).map_err(failed)?;
        if let Some(env) = store.lookup(&plan.key) {
            let report = built.unwrap_or_else(|| {
                deps::build::report(&env, pycell_protocol::result::CacheOutcome::Hit, 0.0)
            });
            return Ok(EnvStep::Ready((env, report)));
        }
        if built.is_some() {
            return Err(failed(deps::failure(
                FailureCode::DepsInstallFailed,
                "the env was built, yet the store does not have it (removed meanwhile?); try again",
            )));
        }
        let (child, progress) = builders.start(&policy.name, wanted).map_err(|e| {
            failed(deps::failure(
                FailureCode::DepsUnavailable,
                format!("starting the env builder: {e}"),
            ))
        })?;
        let deadline = builders.deadline(plan.install_timeout());
        // Kept until the build is done.
        let build = Build::new(req, peer, order, policy.name.clone(), child, deadline);
        self.builds.insert(build.pid(), build);
        Ok(EnvStep::Building((
            ToBroker::Installing { req },
            vec![progress],
        )))
    }

    /// A builder ended: start its run, or say why it cannot start.
    fn built(&mut self, mut build: Build, how: &str) {
        let (req, peer) = (build.req, build.peer);
        let reply = match build.outcome(how) {
            Ok(env) => {
                let reply = self.spawn(req, peer, build.order, Some(env));
                // After the run holds its env: gc never removes one in use.
                self.collect_garbage();
                reply
            }
            Err(failure) => Err(Box::new(ToBroker::Failed {
                req,
                policy: build.policy.clone(),
                failure,
            })),
        };
        self.reply(req, peer, reply);
    }

    /// After a build: envs over the store's age and size caps go (by a
    /// `pycell env gc` child, so the monitor never waits on the disk).
    fn collect_garbage(&self) {
        if let Ok((_, builders)) = &self.envs {
            if let Err(e) = builders.collect_garbage(&self.config) {
                eprintln!("pycelld monitor: cannot start the env store's gc: {e}");
            }
        }
    }

    fn reap(&mut self) {
        loop {
            match waitpid(None, Some(WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::StillAlive) | Err(_) => return,
                Ok(status) => {
                    let Some(pid) = status.pid() else { return };
                    if pid == self.broker_pid {
                        self.broker_alive = false;
                    } else if let Some(mut run) = self.runs.remove(&pid.as_raw()) {
                        run.process.reaped_elsewhere();
                        let how = describe_wait(&status);
                        self.audit.run_ended(
                            &run.run_id,
                            run.started.elapsed(),
                            &how,
                            run.process.stopped_by(),
                        );
                        // The lease goes (and the run's cgroups with it)
                        // before the broker hears the jailer is gone.
                        let run_id = std::mem::take(&mut run.run_id);
                        drop(run);
                        self.send(&ToBroker::Exited { run_id });
                    } else if let Some(build) = self.builds.remove(&pid.as_raw()) {
                        let how = describe_wait(&status);
                        self.built(build, &how);
                    } else {
                        self.pools.exited(pid.as_raw());
                    }
                }
            }
        }
    }

    /// Stop jailers past the monitor's own deadline (whatever their
    /// clients or the broker do), and SIGKILL those that ignored a SIGTERM
    /// for [`PATIENCE`]'s grace.
    fn escalate_kills(&mut self) {
        for run in self.runs.values_mut() {
            if run.process.escalate() == Some(Escalation::Stopped) {
                eprintln!(
                    "pycelld monitor: run {} outlived its timeout by {} s; stopping its jailer",
                    run.run_id,
                    PATIENCE.slack.as_secs()
                );
            }
        }
        for build in self.builds.values_mut() {
            build.escalate();
        }
    }

    fn kill_all_runs(&mut self) {
        for run in self.runs.values_mut() {
            run.process.stop(StoppedBy::Shutdown);
        }
        for build in self.builds.values_mut() {
            build.stop();
        }
        self.pools.stop_all();
    }

    /// On the way out: every jailer gets SIGTERM (each kills its sandbox and
    /// removes its cgroup), then, after a bounded wait, SIGKILL.
    fn kill_everything(&mut self) {
        if self.broker_alive {
            let _ = kill(self.broker_pid, Signal::SIGKILL);
        }
        self.kill_all_runs();
        let deadline = Instant::now() + Duration::from_secs(5);
        let idle = |m: &Self| m.runs.is_empty() && m.builds.is_empty() && m.pools.is_empty();
        while !idle(self) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
            self.reap();
        }
        let members = self.pools.pids();
        let pids = self.runs.keys().chain(self.builds.keys()).chain(&members);
        for pid in pids {
            let _ = kill(Pid::from_raw(*pid), Signal::SIGKILL);
        }
        let _ = waitpid(self.broker_pid, Some(WaitPidFlag::WNOHANG));
        self.layout
            .remove_stale(&self.launcher.cgroup_parent, "pycell-");
        self.layout.remove_created(&self.created_cgroups);
        // systemd's socket stays for the next instance (clients wait in
        // its backlog); our own goes with us.
        if let listen::Origin::Bound = self.origin {
            let _ = fs::remove_file(&self.config.socket);
        }
    }
}

/// The broker closed its end (exited, or was killed): a clean EOF, or a
/// reset when it left frames of ours unread.
fn broker_went_away(e: &framing::FrameError) -> bool {
    match e {
        framing::FrameError::Closed => true,
        framing::FrameError::Io(e) => matches!(
            e.kind(),
            io::ErrorKind::ConnectionReset | io::ErrorKind::UnexpectedEof
        ),
        _ => false,
    }
}

/// A jailer's wait status for the audit log.
fn describe_wait(status: &WaitStatus) -> String {
    match status {
        WaitStatus::Exited(_, code) => format!("exited {code}"),
        WaitStatus::Signaled(_, sig, _) => format!("killed by {sig}"),
        other => format!("{other:?}"),
    }
}
