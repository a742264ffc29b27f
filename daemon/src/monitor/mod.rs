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
//! leasing sandbox uids, starting `pycell-jailer` (which creates the run's
//! cgroup; forked by its fork server, `pycell_launch::fork_server`, but
//! a pool's zygote's, executed) and killing runs.
//!
//! By job: `setup.rs` (ids, signals, the socket, the broker's start,
//! systemd), `serve.rs` (the loop: signals, the broker's messages, reaping,
//! the way out), `runs.rs` (starting runs, cold or warm, and their
//! deadlines), `builds.rs` (the envs of runs' dependencies).

use std::collections::HashMap;
use std::fs;
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::signal::{kill, sigprocmask, SigSet, SigmaskHow, Signal};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::{Gid, Group, Pid, Uid, User};
use pycell_deps::{self as deps, build::Plan, store::EnvInUse, store::EnvStore};
use pycell_host::cgroup::CgroupLayout;
use pycell_launch::fork_server::{ForkServer, ForkedJailer};
use pycell_launch::launcher::{self as launch, read_outcome, ForkedLaunch, Launcher, PolicyChoice};
use pycell_launch::resolve::Extras;
use pycell_protocol::framing;
use pycell_protocol::messages::{ErrorCode, RunRequest};
use pycell_protocol::result::EnvReport;
use pycell_wire::codes::FailureCode;

use crate::config::is_proxy_setting;
use crate::config::Config;
use crate::link::{refusal, PeerIds, RunOrder, ToBroker, ToMonitor};
use crate::monitor::audit::{AuditLog, RunEnd, RunStart};
use crate::monitor::envs::{Build, Builders, EnvsError};
use crate::monitor::pool::Pools;
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
    #[error("pycelld cannot build a jail here, so it does not start: {0}. In a container, the pod lacks what this step needs: docs/cluster.md lists what a pod must have")]
    SelfCheck(String),
    #[error("pycelld cannot limit runs here, so it does not start: {0}. The cgroup hierarchy is read-only: a container needs a writable cgroup v2 of its own (Kubernetes: the pycell RuntimeClass, docs/cluster.md; podman: --security-opt unmask=/sys/fs/cgroup)")]
    CgroupReadOnly(pycell_host::cgroup::CgroupError),
}

impl MonitorError {
    /// A cgroup error, told apart when the hierarchy is read-only.
    fn cgroup(e: pycell_host::cgroup::CgroupError) -> MonitorError {
        if e.is_read_only() {
            MonitorError::CgroupReadOnly(e)
        } else {
            MonitorError::Cgroup(e)
        }
    }
}

struct Run {
    run_id: String,
    /// Its jailer and uid lease, its deadline (the run's wall timeout and
    /// [`PATIENCE`]'s slack) and stop escalation: the supervisor's process
    /// side, the same as in embedded mode.
    process: JailerProcess<ForkedJailer>,
    /// The env of its dependencies: in use (so kept) while the run goes.
    _env: Option<EnvInUse>,
    started: Instant,
    /// The jailer's outcome pipe, read once it is reaped.
    outcome: OwnedFd,
}

/// The monitor's answer to a spawn request: a message for the broker and
/// the descriptors it carries, or a refusal.
type Reply = Result<(ToBroker, Vec<OwnedFd>), Box<ToBroker>>;

/// The monitor's loop turns at least this often (deadlines, the watchdog).
const TICK: Duration = Duration::from_millis(200);
/// A frame from the broker, once begun, must arrive whole within this; a
/// frame to it must be taken within this. Otherwise the broker is taken
/// for wedged or compromised, and the service stops (systemd restarts it).
const LINK_TIMEOUT: Duration = Duration::from_secs(5);
/// Jailers the monitor runs at most, per admitted run slot: the broker
/// frees a slot when a run's result is in, its jailer exits just after.
const JAILERS_PER_SLOT: usize = 2;

/// Run the daemon: set up, start the broker, serve until SIGTERM.
pub fn run(config: Config, config_path: &Path) -> Result<(), MonitorError> {
    if !nix::unistd::geteuid().is_root() {
        return Err(MonitorError::NotRoot);
    }
    let ids = resolve_ids(&config)?;
    // Runs live below this service's own (systemd-delegated) cgroup; on v2
    // the monitor first moves into a leaf of it, before any child exists.
    let layout = CgroupLayout::detect()?;
    let cgroup_parent = layout
        .adopt_own_subtree(crate::config::SUPERVISOR_CGROUP, &config.cgroup_parent)
        .map_err(MonitorError::cgroup)?;
    // Leftovers of an earlier instance that was killed: nothing of ours runs yet.
    layout.remove_stale(&cgroup_parent, "pycell-");
    let created_cgroups = layout.missing_dirs(&cgroup_parent);
    let launcher = Launcher {
        policy_dir: config.policy_dir.clone(),
        uid_range: config.uid_range.clone(),
        uid_lock_dir: PathBuf::from(launch::UID_LOCK_DIR),
        cgroup_parent: cgroup_parent.clone(),
        // Kept v1 cgroups are removed with the other leftovers when this
        // monitor stops, and when the next one starts.
        keep_cgroups: true,
        jailer: Ok(launch::find_jailer().map_err(|f| MonitorError::Jailer(f.message))?),
    };
    let took = self_check::check(&config, &launcher).inspect_err(|_| {
        layout.remove_stale(&cgroup_parent, "pycell-");
        layout.remove_created(&created_cgroups);
    })?;
    tracing::info!("self-check: a jail of the default policy built and ran in {took:?}");
    let audit = AuditLog::open(&config.audit)
        .map_err(|e| MonitorError::Sys(format!("audit log {:?}: {e}", config.audit)))?;
    let (listener, origin) = listening_socket(&config, ids.socket_gid)?;
    let sfd = block_signals()?;
    let (plans, warnings) = crate::monitor::pool::plan(&config);
    let warm_reserved = crate::monitor::pool::reserved_memory(&plans);
    let pools = Pools::new(plans, config.warm_idle);
    let pools_reported = pools.status();
    let (link, broker_pid) = start_broker(
        &config,
        config_path,
        &ids,
        listener,
        warm_reserved,
        pools_reported.clone(),
    )?;
    let envs = open_envs(&config, &launcher);
    if let Err(why) = &envs {
        tracing::warn!(
            layer = "dependencies",
            "runs with dependencies will be refused: {why}"
        );
    }
    for w in warnings {
        tracing::warn!("{w}");
    }
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
        pools_reported,
        forks: ForkServer::default(),
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
    envs: Result<(EnvStore, Builders), EnvsError>,
    /// Envs being built, by builder pid.
    builds: HashMap<i32, Build>,
    /// Warm jails waiting for runs.
    pools: Pools,
    /// What the broker was last told of them.
    pools_reported: Vec<pycell_protocol::info::WarmPoolStatus>,
    /// Forks every jailer of a run, a session or a pool member (started
    /// on first use; started again if it died).
    forks: ForkServer,
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

pub mod audit;
mod builds;
pub mod envs;
pub mod jobs;
pub mod listen;
pub mod pool;
mod runs;
mod self_check;
pub(crate) use runs::SESSION_READY_WITHIN;
mod serve;
mod setup;

use builds::EnvStep;
use setup::{block_signals, listening_socket, notify_systemd, open_envs, start_broker, Watchdog};
pub use setup::{resolve_ids, ResolvedIds};
