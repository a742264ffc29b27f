//! The monitor's setup: the ids the broker runs as and checks, the signals
//! it reads, the listening socket, the broker's start, and systemd's
//! notifications and watchdog.

use super::*;
use crate::logging::{JOURNAL_ENV, LOG_ENV};

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

pub(super) fn clear_cloexec(fd: &impl AsFd) -> Result<(), MonitorError> {
    use nix::fcntl::{fcntl, FcntlArg, FdFlag};
    fcntl(fd, FcntlArg::F_SETFD(FdFlag::empty()))
        .map(|_| ())
        .map_err(|e| MonitorError::Sys(format!("fcntl: {e}")))
}

/// The broker's snapshot store (`Config::snapshot_dir`): made here, as
/// root, and given to the broker user alone (0700). A path there that is
/// not a plain directory (a symlink) is left as it is, and snapshots are
/// refused.
fn prepare_snapshot_dir(config: &Config, ids: &ResolvedIds) {
    if let Err(e) = snapshot_dir(&config.env_store, ids) {
        tracing::warn!(
            "sessions' snapshots will be refused: {}: {e}",
            config.snapshot_dir().display()
        );
    }
}

/// `snapshots` in `store`, made if missing and given to the broker: by
/// descriptor, no symlink followed, so that nothing else is chowned or
/// chmodded if the path changes under us.
fn snapshot_dir(store: &Path, ids: &ResolvedIds) -> nix::Result<()> {
    use nix::fcntl::{open, openat, OFlag};
    use nix::sys::stat::{fchmod, mkdirat, Mode};
    fs::create_dir_all(store)
        .map_err(|e| nix::errno::Errno::from_raw(e.raw_os_error().unwrap_or(0)))?;
    let dir = OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    let store = open(store, dir, Mode::empty())?;
    match mkdirat(&store, "snapshots", Mode::S_IRWXU) {
        Ok(()) | Err(nix::errno::Errno::EEXIST) => {}
        Err(e) => return Err(e),
    }
    let snapshots = openat(&store, "snapshots", dir, Mode::empty())?;
    nix::unistd::fchown(&snapshots, Some(ids.broker_uid), Some(ids.broker_gid))?;
    fchmod(&snapshots, Mode::S_IRWXU)
}

/// pycelld's env store (created if need be) and its builders.
pub(super) fn open_envs(
    config: &Config,
    launcher: &Launcher,
) -> Result<(EnvStore, Builders), EnvsError> {
    let store = EnvStore::open(&config.env_store).map_err(|source| EnvsError::Open {
        path: config.env_store.clone(),
        source,
    })?;
    crate::monitor::envs::check_store_path(&config.env_store)?;
    Ok((store, Builders::new(config, launcher)?))
}

pub(super) fn block_signals() -> Result<SignalFd, MonitorError> {
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
pub(super) fn listening_socket(
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

/// Start the broker: its snapshot directory made, then this same
/// executable with `--broker`, as the broker user, its end of the monitor
/// link as its stdin; then hand it the
/// listening socket and the configuration over that link. Returns our end
/// of the link (with timeouts set) and the broker's pid.
pub(super) fn start_broker(
    config: &Config,
    config_path: &Path,
    ids: &ResolvedIds,
    listener: UnixListener,
    warm_reserved_bytes: u64,
    pools: Vec<pycell_protocol::info::WarmPoolStatus>,
) -> Result<(UnixStream, Pid), MonitorError> {
    prepare_snapshot_dir(config, ids);
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
    let env = std::env::var(LOG_ENV).ok();
    let log_filter = crate::logging::directives(env.as_deref(), config.log_level);
    let broker = Command::new(format!("/proc/self/fd/{}", exe.as_raw_fd()))
        .arg0("pycelld")
        .args(["--broker", "--allowed-gids", &gids.join(",")])
        .env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        // The egress proxy (in the broker) goes out the way the host's
        // own proxy settings say: pass those, and nothing else.
        .envs(std::env::vars().filter(|(k, _)| is_proxy_setting(k)))
        // Our log filter and, under systemd, where the journal is.
        .env(LOG_ENV, &log_filter)
        .envs(std::env::var(JOURNAL_ENV).map(|j| (JOURNAL_ENV, j)))
        .uid(ids.broker_uid.as_raw())
        .gid(ids.broker_gid.as_raw())
        .stdin(Stdio::from(OwnedFd::from(theirs)))
        .spawn()
        .map_err(MonitorError::Broker)?;
    let frame = framing::encode(&ToBroker::Handoff {
        config_path: config_path.to_path_buf(),
        config_text: config.source_text.clone(),
        warm_reserved_bytes,
        pools,
    })
    .map_err(|e| MonitorError::Sys(e.to_string()))?;
    crate::sockets::send_with_fds(mine.as_fd(), &frame, &[listener.as_fd()])
        .map_err(MonitorError::Broker)?;
    mine.set_read_timeout(Some(LINK_TIMEOUT))
        .and_then(|()| mine.set_write_timeout(Some(LINK_TIMEOUT)))
        .map_err(MonitorError::Broker)?;
    Ok((mine, Pid::from_raw(broker.id() as i32)))
}

/// systemd's watchdog (`WatchdogSec=`): pinged at half its interval while
/// the monitor's loop turns and the broker's keeps saying it is alive.
#[derive(Debug)]
pub(super) struct Watchdog {
    pub(super) every: Duration,
    pub(super) last: Instant,
}

impl Watchdog {
    pub(super) fn from_env() -> Option<Watchdog> {
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

pub(super) fn notify_systemd(state: &str) {
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
