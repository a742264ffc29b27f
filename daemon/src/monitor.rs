//! The root half of pycelld: small, single-threaded, and it accepts only the
//! closed set of [`ToMonitor`] messages from the broker over a socketpair.
//!
//! Threat model: the broker handles untrusted clients and may be
//! compromised. So the monitor never takes a jail spec from it: it gets the
//! typed run request (bounded, unknown fields rejected) and resolves it
//! itself against the operator's policies, exactly as for any client. Its
//! root powers are used for: creating the socket, sweeping leftover cgroups,
//! leasing sandbox uids, spawning `pycell-jailer` (which creates the run's
//! cgroup) and killing runs.

use std::collections::HashMap;
use std::fs;
use std::io::{self, Write};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
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
use pycell_jailer::cgroup::CgroupLayout;
use pycell_jailer::uidalloc::{self, UidLease};
use serde::{Deserialize, Serialize};

use crate::config::Config;
use crate::framing;
use crate::protocol::{ErrorCode, RunRequest};
use crate::resolve;

/// Uid leases of daemon runs (distinct from embedded mode's directory only
/// in name; both use flock, so they never collide).
const UID_LOCK_DIR: &str = "/run/pycell/uids";

/// Broker → monitor: the only things the broker can ask for.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum ToMonitor {
    /// The broker is accepting connections (for readiness).
    Ready,
    /// Start a run for a peer (whose uid the broker checked).
    Spawn {
        req: u64,
        peer_uid: u32,
        request: RunRequest,
    },
    /// Stop a run (cancel, client gone, shutdown).
    Kill { run_id: String },
}

/// Monitor → broker. `Spawned` carries the read end of the jailer's event
/// pipe as SCM_RIGHTS.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum ToBroker {
    Spawned {
        req: u64,
        run_id: String,
        sandbox_uid: u32,
        policy: String,
        limits: serde_json::Value,
    },
    Refused {
        req: u64,
        code: ErrorCode,
        message: String,
    },
    Exited {
        run_id: String,
    },
}

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
    Cgroup(#[from] pycell_jailer::cgroup::CgroupError),
    #[error("{0}")]
    Sys(String),
}

struct Run {
    run_id: String,
    child: Child,
    _lease: UidLease,
    killed_at: Option<Instant>,
}

pub fn jailer_path() -> PathBuf {
    if let Some(p) = std::env::var_os("PYCELL_JAILER") {
        return PathBuf::from(p);
    }
    let beside = std::env::current_exe()
        .ok()
        .and_then(|e| e.parent().map(|d| d.join("pycell-jailer")));
    match beside {
        Some(p) if p.exists() => p,
        _ => PathBuf::from("/usr/libexec/pycell/pycell-jailer"),
    }
}

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

fn bind_socket(config: &Config, socket_gid: Gid) -> Result<UnixListener, MonitorError> {
    let sock_err = |source| MonitorError::Socket {
        path: config.socket.clone(),
        source,
    };
    if let Some(dir) = config.socket.parent() {
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o755)
            .create(dir)
            .map_err(sock_err)?;
    }
    match fs::remove_file(&config.socket) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(sock_err(e)),
    }
    let listener = UnixListener::bind(&config.socket).map_err(sock_err)?;
    nix::unistd::chown(&config.socket, Some(Uid::from_raw(0)), Some(socket_gid))
        .map_err(|e| sock_err(io::Error::from(e)))?;
    fs::set_permissions(
        &config.socket,
        fs::Permissions::from_mode(config.socket_mode),
    )
    .map_err(sock_err)?;
    Ok(listener)
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
    let listener = bind_socket(&config, ids.socket_gid)?;
    let (mine, theirs) = UnixStream::pair().map_err(MonitorError::Broker)?;

    // Signals are handled in the loop below through a signalfd.
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
    let sfd = SignalFd::with_flags(&mask, SfdFlags::SFD_CLOEXEC | SfdFlags::SFD_NONBLOCK)
        .map_err(|e| MonitorError::Sys(format!("signalfd: {e}")))?;

    // The broker: this same executable, as the unprivileged user, with the
    // listening socket and its end of the socketpair inherited (this process
    // is single-threaded, so clearing close-on-exec here cannot leak them
    // into any other child).
    clear_cloexec(&listener)?;
    clear_cloexec(&theirs)?;
    // The audit log is opened here, as root, so the broker can append to it
    // without being able to open (or create) anything else.
    let audit = match &config.audit {
        crate::config::AuditSink::File(p) => {
            use std::os::unix::fs::OpenOptionsExt;
            let f = fs::OpenOptions::new()
                .create(true)
                .append(true)
                .mode(0o640)
                .open(p)
                .map_err(|e| MonitorError::Sys(format!("audit log {}: {e}", p.display())))?;
            clear_cloexec(&f)?;
            Some(f)
        }
        _ => None,
    };
    // The broker execs this binary through a descriptor opened here as root:
    // as the broker user it may not be able to reach the file by its path
    // (say, a build under /root), and /proc/self/fd needs no search right.
    let exe = std::env::current_exe()
        .and_then(fs::File::open)
        .map_err(MonitorError::Broker)?;
    clear_cloexec(&exe)?;
    let mut cmd = Command::new(format!("/proc/self/fd/{}", exe.as_raw_fd()));
    cmd.arg0("pycelld")
        .arg("--broker")
        .arg("--config")
        .arg(config_path)
        .arg("--listen-fd")
        .arg(listener.as_raw_fd().to_string())
        .arg("--monitor-fd")
        .arg(theirs.as_raw_fd().to_string())
        .args(
            audit
                .iter()
                .flat_map(|f| ["--audit-fd".to_string(), f.as_raw_fd().to_string()]),
        )
        .arg("--allowed-gids")
        .arg(
            ids.allowed_gids
                .iter()
                .map(|g| g.to_string())
                .collect::<Vec<_>>()
                .join(","),
        )
        .env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .uid(ids.broker_uid.as_raw())
        .gid(ids.broker_gid.as_raw())
        .stdin(Stdio::null());
    let broker = cmd.spawn().map_err(MonitorError::Broker)?;
    let broker_pid = Pid::from_raw(broker.id() as i32);
    drop(theirs);
    drop(listener);
    drop(audit);
    drop(exe);

    let mut m = Monitor {
        config,
        layout,
        cgroup_parent,
        link: mine,
        runs: HashMap::new(),
        broker_pid,
        broker_alive: true,
        stopping_since: None,
    };
    let result = m.serve(&sfd);
    m.kill_everything();
    result
}

struct Monitor {
    config: Config,
    layout: CgroupLayout,
    /// Parent of the run cgroups, as the jailer's spec takes it.
    cgroup_parent: String,
    link: UnixStream,
    runs: HashMap<i32, Run>,
    broker_pid: Pid,
    broker_alive: bool,
    stopping_since: Option<Instant>,
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
                if !self.broker_alive && self.runs.is_empty() {
                    return Ok(());
                }
                // The broker drains for the grace period; after that (and a
                // little slack) everything left is killed.
                let deadline = since + self.config.shutdown_grace + Duration::from_secs(2);
                if Instant::now() >= deadline {
                    return Ok(());
                }
            } else if !self.broker_alive {
                return Err(MonitorError::Sys("the broker exited; stopping".into()));
            }
            self.escalate_kills();
            let mut fds = [
                PollFd::new(sfd.as_fd(), PollFlags::POLLIN),
                PollFd::new(self.link.as_fd(), PollFlags::POLLIN),
            ];
            match poll(&mut fds, PollTimeout::from(200u16)) {
                Ok(_) | Err(nix::errno::Errno::EINTR) => {}
                Err(e) => return Err(MonitorError::Sys(format!("poll: {e}"))),
            }
            let sig_ready = fds[0].revents().is_some_and(|r| !r.is_empty());
            let link_ready = fds[1].revents().is_some_and(|r| !r.is_empty());
            if sig_ready {
                while let Ok(Some(info)) = sfd.read_signal() {
                    let sig = info.ssi_signo as i32;
                    if sig == Signal::SIGCHLD as i32 {
                        self.reap();
                    } else if self.stopping_since.is_none() {
                        self.stopping_since = Some(Instant::now());
                        notify_systemd("STOPPING=1");
                        let _ = kill(self.broker_pid, Signal::SIGTERM);
                    }
                }
            }
            if link_ready {
                match framing::read_sync::<ToMonitor>(&mut self.link) {
                    Ok(msg) => self.handle(msg),
                    Err(framing::FrameError::Closed) => {
                        self.broker_alive = false;
                        if self.stopping_since.is_none() {
                            self.stopping_since = Some(Instant::now());
                        }
                        self.kill_all_runs();
                    }
                    Err(e) => {
                        // A broker that sends what it must not is treated as
                        // compromised: stop everything.
                        eprintln!("pycelld monitor: bad message from the broker ({e}); stopping");
                        let _ = kill(self.broker_pid, Signal::SIGKILL);
                        self.broker_alive = false;
                        self.stopping_since = Some(Instant::now());
                        self.kill_all_runs();
                    }
                }
            }
        }
    }

    fn send(&mut self, msg: &ToBroker) {
        let _ = framing::write_sync(&mut self.link, msg);
    }

    fn handle(&mut self, msg: ToMonitor) {
        match msg {
            ToMonitor::Ready => notify_systemd("READY=1"),
            ToMonitor::Kill { run_id } => {
                if let Some(run) = self.runs.values_mut().find(|r| r.run_id == run_id) {
                    // The jailer turns SIGTERM into: kill the sandbox, clean
                    // up, report "killed". SIGKILL follows if it dawdles.
                    let _ = kill(Pid::from_raw(run.child.id() as i32), Signal::SIGTERM);
                    run.killed_at.get_or_insert_with(Instant::now);
                }
            }
            ToMonitor::Spawn {
                req,
                peer_uid,
                request,
            } => {
                if self.stopping_since.is_some() {
                    self.send(&ToBroker::Refused {
                        req,
                        code: ErrorCode::ShuttingDown,
                        message: "pycelld is shutting down".into(),
                    });
                    return;
                }
                match self.spawn(req, &request) {
                    Ok((msg, fd)) => {
                        let sent =
                            framing::encode(&msg)
                                .map_err(|e| e.to_string())
                                .and_then(|frame| {
                                    pycell_jailer::syscall::send_with_fd(
                                        self.link.as_fd(),
                                        &frame,
                                        fd.as_fd(),
                                    )
                                    .map_err(|e| e.to_string())
                                });
                        if let Err(e) = sent {
                            eprintln!("pycelld monitor: cannot hand run {req} (peer uid {peer_uid}) to the broker: {e}");
                        }
                    }
                    Err((code, message)) => self.send(&ToBroker::Refused { req, code, message }),
                }
            }
        }
    }

    fn spawn(
        &mut self,
        req: u64,
        request: &RunRequest,
    ) -> Result<(ToBroker, OwnedFd), (ErrorCode, String)> {
        let invalid = |e: resolve::ResolveError| (ErrorCode::InvalidRequest, e.to_string());
        let policy = resolve::load_policy_by_name(request.policy_name(), &self.config.policy_dir)
            .map_err(invalid)?;
        let mut resolved = resolve::resolve(&policy, request).map_err(invalid)?;
        let lease = uidalloc::allocate(&self.config.uid_range, Path::new(UID_LOCK_DIR))
            .map_err(|e| (ErrorCode::Busy, e.to_string()))?;
        let run_id = pycell_jailer::spec::new_run_id();
        resolved.spec.run_id = run_id.clone();
        resolved.spec.sandbox_uid = lease.uid;
        resolved.spec.sandbox_gid = lease.gid;
        resolved.spec.cgroup.parent = self.cgroup_parent.clone();
        resolved
            .spec
            .validate()
            .map_err(|e| (ErrorCode::InvalidRequest, e.to_string()))?;
        let spec =
            serde_json::to_vec(&resolved.spec).map_err(|e| (ErrorCode::Internal, e.to_string()))?;
        let internal = |e: io::Error| (ErrorCode::Internal, format!("starting pycell-jailer: {e}"));
        let mut child = Command::new(jailer_path())
            .env_clear()
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(internal)?;
        let stdin = child.stdin.take();
        let stdout = child.stdout.take();
        let (Some(mut stdin), Some(stdout)) = (stdin, stdout) else {
            let _ = child.kill();
            return Err((ErrorCode::Internal, "jailer pipes missing".into()));
        };
        if let Err(e) = stdin.write_all(&spec) {
            let _ = child.kill();
            return Err(internal(e));
        }
        drop(stdin);
        let pid = child.id() as i32;
        self.runs.insert(
            pid,
            Run {
                run_id: run_id.clone(),
                child,
                _lease: lease,
                killed_at: None,
            },
        );
        let limits = serde_json::to_value(&resolved.limits).unwrap_or(serde_json::Value::Null);
        Ok((
            ToBroker::Spawned {
                req,
                run_id,
                sandbox_uid: resolved.spec.sandbox_uid,
                policy: policy.name.clone(),
                limits,
            },
            OwnedFd::from(stdout),
        ))
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
                        // Already reaped by waitpid; Child::wait would fail.
                        let _ = run.child.try_wait();
                        self.send(&ToBroker::Exited { run_id: run.run_id });
                    }
                }
            }
        }
    }

    /// SIGKILL jailers that ignored a SIGTERM for 5 s.
    fn escalate_kills(&mut self) {
        for run in self.runs.values() {
            if run
                .killed_at
                .is_some_and(|t| t.elapsed() > Duration::from_secs(5))
            {
                let _ = kill(Pid::from_raw(run.child.id() as i32), Signal::SIGKILL);
            }
        }
    }

    fn kill_all_runs(&mut self) {
        for run in self.runs.values_mut() {
            let _ = kill(Pid::from_raw(run.child.id() as i32), Signal::SIGTERM);
            run.killed_at.get_or_insert_with(Instant::now);
        }
    }

    /// On the way out: every jailer gets SIGTERM (each kills its sandbox and
    /// removes its cgroup), then, after a bounded wait, SIGKILL.
    fn kill_everything(&mut self) {
        if self.broker_alive {
            let _ = kill(self.broker_pid, Signal::SIGKILL);
        }
        self.kill_all_runs();
        let deadline = Instant::now() + Duration::from_secs(5);
        while !self.runs.is_empty() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
            self.reap();
        }
        for run in self.runs.values() {
            let _ = kill(Pid::from_raw(run.child.id() as i32), Signal::SIGKILL);
        }
        let _ = waitpid(self.broker_pid, Some(WaitPidFlag::WNOHANG));
        self.layout.remove_stale(&self.cgroup_parent, "pycell-");
        let _ = fs::remove_file(&self.config.socket);
    }
}
