//! Runs this process starts itself (embedded mode, as root, no pycelld):
//! the env of a run's dependencies, built here if it must be, and the way
//! a launched jailer is supervised and stopped. `pycell run`, `pycell env
//! build` and embedded `pycell mcp` share it; the supervision itself is
//! `pycell_launch::supervisor`, the same for every mode.

use std::os::fd::{AsFd, OwnedFd};
use std::sync::{Arc, Mutex};

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::signal::{SigSet, SigmaskHow, Signal};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use pycell_deps::build::{Ensured, InstallRunner, ProgressLines};
use pycell_deps::store::EnvStore;
use pycell_deps::{self as deps, DepsRequest};
use pycell_launch::launcher::{JailerStderr, Launcher, Prepared};
use pycell_launch::supervisor::{supervise, Patience, Services, StoppedBy};
use pycell_policy::Policy;
use pycell_protocol::messages::RunRequest;
use pycell_protocol::result::{CacheOutcome, RunResult};
use pycell_tools::service::ToolService;
use pycell_wire::events::Stream;
use pycell_wire::report::JailFailure;
use tokio::runtime::Handle;
use tokio::sync::watch;

/// Whether, and why, this process's runs are to stop: `None` until then.
pub(crate) type StopRequest = watch::Receiver<Option<StoppedBy>>;

/// Resolves when `stop` asks for it (never, if nobody can any more).
pub(crate) async fn stopped(mut stop: StopRequest) -> StoppedBy {
    let by = stop.wait_for(Option::is_some).await.ok().and_then(|by| *by);
    match by {
        Some(by) => by,
        None => std::future::pending().await,
    }
}

/// The stop request of a command-line process: SIGTERM or SIGHUP to us
/// stop its runs (the jailer then kills the sandbox and reports the run as
/// killed). ^C goes to the whole foreground process group: the jailer
/// passes it to the program, and we must not die of it. The three are
/// blocked here, before any thread exists, so every thread (and the
/// jailer, which resets its own mask) starts with them blocked, and read
/// on a thread of their own.
pub(crate) fn stop_on_signals() -> nix::Result<StopRequest> {
    // SIGINT only goes to the program, which the jailer did.
    stop_request(false)
}

/// The stop request of `pycell batch`: SIGINT too stops every run (and
/// the batch takes no new line). Blocked here like [`stop_on_signals`]'.
pub(crate) fn stop_on_every_signal() -> nix::Result<StopRequest> {
    stop_request(true)
}

/// SIGINT, SIGTERM and SIGHUP blocked and read; the latter two, and
/// SIGINT if `sigint_stops`, stop this process's runs.
fn stop_request(sigint_stops: bool) -> nix::Result<StopRequest> {
    let (tx, rx) = watch::channel(None);
    on_signals(
        &[Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP],
        move |sig| {
            if sigint_stops || sig != Signal::SIGINT as i32 {
                let _ = tx.send(Some(StoppedBy::Request));
            }
        },
    )?;
    Ok(rx)
}

/// Block `signals` (call it before any thread exists, so that every
/// thread has them blocked: a blocked signal is kept even when our starter
/// made us ignore it) and call `on` with each that arrives, on a thread of
/// its own.
fn on_signals(signals: &[Signal], mut on: impl FnMut(i32) + Send + 'static) -> nix::Result<()> {
    let mut set = SigSet::empty();
    for s in signals {
        set.add(*s);
    }
    nix::sys::signal::sigprocmask(SigmaskHow::SIG_BLOCK, Some(&set), None)?;
    let fd = SignalFd::with_flags(&set, SfdFlags::SFD_CLOEXEC)?;
    std::thread::spawn(move || loop {
        let mut fds = [PollFd::new(fd.as_fd(), PollFlags::POLLIN)];
        let _ = poll(&mut fds, PollTimeout::NONE);
        while let Ok(Some(info)) = fd.read_signal() {
            on(info.ssi_signo as i32);
        }
    });
    Ok(())
}

/// ^C for a run through pycelld: SIGINT, blocked (so it reaches us even
/// when whoever started us ignores it), becomes an `interrupt` message
/// for the run of the latest connection, which the daemon passes to its
/// program.
pub(crate) struct CtrlC {
    target: Arc<Mutex<Option<pycell_protocol::client::Canceller>>>,
}

impl CtrlC {
    /// The run of `client`'s connection is the one ^C now interrupts.
    pub(crate) fn connected(&self, client: &pycell_protocol::client::DaemonClient) {
        let canceller = client.canceller().ok();
        *self.target.lock().unwrap_or_else(|p| p.into_inner()) = canceller;
    }
}

pub(crate) fn interrupt_on_ctrl_c() -> nix::Result<CtrlC> {
    let target: Arc<Mutex<Option<pycell_protocol::client::Canceller>>> = Arc::default();
    let theirs = Arc::clone(&target);
    on_signals(&[Signal::SIGINT], move |_| {
        if let Some(c) = theirs.lock().unwrap_or_else(|p| p.into_inner()).as_mut() {
            let _ = c.interrupt();
        }
    })?;
    Ok(CtrlC { target })
}

/// A runtime for a command-line process's runs: one worker, so that the
/// calling thread can drive runs with `Handle::block_on` (the jailer's
/// parent-death signal follows that thread, which lives as long as we do).
pub(crate) fn runtime() -> std::io::Result<Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .map(|rt| Runtime(Some(rt)))
}

/// A command-line process's runtime, which does not wait, when dropped,
/// for blocking work still in flight: a name lookup the egress proxy
/// started (getaddrinfo cannot be cancelled) kept `pycell run` of a new
/// env alive ~8 s after its result. The runs themselves are over by then.
pub(crate) struct Runtime(Option<tokio::runtime::Runtime>);

impl std::ops::Deref for Runtime {
    type Target = tokio::runtime::Runtime;

    fn deref(&self) -> &tokio::runtime::Runtime {
        self.0.as_ref().expect("taken only when dropped")
    }
}

impl Drop for Runtime {
    fn drop(&mut self) {
        if let Some(rt) = self.0.take() {
            rt.shutdown_background();
        }
    }
}

/// Start `prepared` and supervise it to its end from this thread (which
/// must outlive the run), `stop` stopping it; its output to `on_output`.
pub(crate) fn run_here(
    handle: &Handle,
    prepared: Prepared,
    patience: Patience,
    stop: &StopRequest,
    tools: Option<ToolService>,
    on_output: &mut dyn FnMut(Stream, &[u8]),
) -> (RunResult, Option<OwnedFd>) {
    handle.block_on(async {
        match prepared.spawn_async(JailerStderr::Capture).await {
            Ok(l) => {
                let services = Services::local(tools);
                supervise(l, patience, stopped(stop.clone()), services, on_output).await
            }
            Err(result) => (*result, None),
        }
    })
}

/// A warm run (one from a zygote) from this thread: its jailer started,
/// its work sent at once (the jailer takes it when the jail is ready),
/// supervised to its end.
pub(crate) fn run_warm_here(
    handle: &Handle,
    prepared: Prepared,
    work: &pycell_runner::Work,
    stop: &StopRequest,
    on_output: &mut dyn FnMut(Stream, &[u8]),
) -> RunResult {
    let patience = pycell_launch::supervisor::PATIENCE;
    handle.block_on(async {
        match prepared.spawn_async(JailerStderr::Capture).await {
            Ok(mut l) => {
                // If it fails, the jailer sees the stream end and says so.
                let _ = l.send_work(work);
                supervise(
                    l,
                    patience,
                    stopped(stop.clone()),
                    Services::default(),
                    on_output,
                )
                .await
                .0
            }
            Err(result) => *result,
        }
    })
}

/// Runs the install jail from this process, like a run.
pub(crate) struct Installer {
    pub handle: Handle,
    pub stop: StopRequest,
}

impl InstallRunner for Installer {
    fn run_install(
        &mut self,
        prepared: Prepared,
        progress: &mut dyn FnMut(&str),
    ) -> (RunResult, Option<OwnedFd>) {
        let mut lines = ProgressLines::default();
        let patience = pycell_launch::supervisor::PATIENCE;
        run_here(
            &self.handle,
            prepared,
            patience,
            &self.stop,
            None,
            &mut |s, b| {
                if s == Stream::Stdout {
                    lines.feed(b, progress)
                }
            },
        )
    }
}

/// The env of an embedded run's dependencies (built now if it must be,
/// from this thread, which waits for the install jail), the install's
/// progress to `progress`; `None` if the run names none.
pub(crate) fn env_for(
    launcher: &Launcher,
    policy: &Policy,
    req: &RunRequest,
    installer: &mut Installer,
    progress: &mut dyn FnMut(&str),
) -> Result<Option<Ensured>, JailFailure> {
    let Some(deps) = deps::gather(policy, &req.code, &req.dependencies)? else {
        return Ok(None);
    };
    let store = deps::build::embedded_store()?;
    ensure_here(launcher, &store, policy, &deps, installer, progress).map(Some)
}

/// The env for `deps` from `store`, built by this process if it must be.
pub(crate) fn ensure_here(
    launcher: &Launcher,
    store: &EnvStore,
    policy: &Policy,
    deps: &DepsRequest,
    installer: &mut Installer,
    progress: &mut dyn FnMut(&str),
) -> Result<Ensured, JailFailure> {
    let ensured = deps::build::ensure_env(launcher, store, policy, deps, installer, progress)?;
    if ensured.report.cache == CacheOutcome::Miss {
        let secs = ensured.report.install_ms / 1000.0;
        progress(&format!("dependencies installed in {secs:.1}s"));
    }
    Ok(ensured)
}
