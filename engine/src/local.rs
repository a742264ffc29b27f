//! What a process that jails itself (embedded mode, as root, no pycelld)
//! needs besides the run service: a command line's signals and stop
//! request, its runtime, the env of a run's dependencies (built here if it
//! must be, through the install runner), a policy and request for
//! `pycell debug spec`, and the host as it measures it. The run service's
//! embedded backend, the command line's front ends, `pycell env build`
//! and pycelld's env builders use it; the supervision itself is
//! `pycell_launch::supervisor`, the same for every mode.

use std::os::fd::{AsFd, OwnedFd};

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::signal::{SigSet, SigmaskHow, Signal};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use pycell_deps::build::{Ensured, InstallRunner, ProgressLines};
use pycell_deps::store::EnvStore;
use pycell_deps::{self as deps, DepsRequest};
use pycell_launch::launcher::{JailerStderr, LaunchError, Launcher, PolicyChoice, Prepared};
use pycell_launch::supervisor::{supervise, Patience, Services, StoppedBy};
use pycell_policy::Policy;
use pycell_protocol::messages::RunRequest;
use pycell_protocol::result::{CacheOutcome, RunResult};
use pycell_tools::service::ToolService;
use pycell_wire::codes::{FailureCode, Layer};
use pycell_wire::events::Stream;
use pycell_wire::report::JailFailure;
use tokio::runtime::Handle;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// Whether, and why, this process's runs are to stop: `None` until then.
pub type StopRequest = watch::Receiver<Option<StoppedBy>>;

/// Resolves when `stop` asks for it (never, if nobody can any more).
pub async fn stopped(mut stop: StopRequest) -> StoppedBy {
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
pub fn stop_on_signals() -> nix::Result<StopRequest> {
    let (tx, rx) = watch::channel(None);
    // SIGINT only goes to the program, which the jailer did.
    on_signals(
        &[Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP],
        move |sig| {
            if sig != Signal::SIGINT as i32 {
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

/// A command-line process's signals, as its runs are to see them.
#[derive(Debug)]
pub struct Signals {
    /// Cancelled by SIGTERM or SIGHUP (and SIGINT, if it stops runs):
    /// the runs are then killed, their results say so.
    pub stop: CancellationToken,
    /// Each other SIGINT (^C), counted: a run through pycelld passes it
    /// to its program (an embedded run's jailer gets ^C from the terminal
    /// itself, being in its process group).
    pub ctrl_c: watch::Receiver<u64>,
}

/// SIGINT, SIGTERM and SIGHUP blocked (call it before any thread exists,
/// so that every thread, and each jailer until it resets its mask, has
/// them blocked) and read on a thread of their own. With `sigint_stops`
/// (`pycell batch`), ^C stops the runs too.
pub fn command_line_signals(sigint_stops: bool) -> nix::Result<Signals> {
    let stop = CancellationToken::new();
    let (presses, ctrl_c) = watch::channel(0u64);
    let stopper = stop.clone();
    on_signals(
        &[Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP],
        move |sig| match sig == Signal::SIGINT as i32 && !sigint_stops {
            true => presses.send_modify(|n| *n += 1),
            false => stopper.cancel(),
        },
    )?;
    Ok(Signals { stop, ctrl_c })
}

/// A runtime for a command-line process's runs: one worker, so that the
/// calling thread can drive runs with `Handle::block_on` (the jailer's
/// parent-death signal follows that thread, which lives as long as we do).
pub fn runtime() -> std::io::Result<Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .map(|rt| Runtime(Some(rt)))
}

/// A runtime for one call driven by `Runtime::block_on` from the thread
/// that outlives it (`pycell run`'s): no worker thread of its own (its
/// tasks run on the calling thread while it blocks on the call; blocking
/// work, such as an install, on the blocking pool, whose own
/// `Handle::block_on` the calling thread's drives).
pub fn runtime_on_this_thread() -> std::io::Result<Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map(|rt| Runtime(Some(rt)))
}

/// A command-line process's runtime, which does not wait, when dropped,
/// for blocking work still in flight: a name lookup the egress proxy
/// started (getaddrinfo cannot be cancelled) kept `pycell run` of a new
/// env alive ~8 s after its result. The runs themselves are over by then.
#[derive(Debug)]
pub struct Runtime(Option<tokio::runtime::Runtime>);

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
pub fn run_here(
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

/// What a process needs to run jails from its own thread: a stop request
/// (SIGTERM, SIGHUP), a runtime, and an installer on both. `pycell env
/// build` and pycelld's env-build job (the same code) start one.
#[derive(Debug)]
pub struct Here {
    pub stop: StopRequest,
    pub installer: Installer,
    pub rt: Runtime,
}

impl Here {
    pub fn start() -> Result<Here, JailFailure> {
        let internal = |what: &str, e: &dyn std::fmt::Display| {
            JailFailure::new(FailureCode::Internal, Layer::Jailer, format!("{what}: {e}"))
        };
        let stop = stop_on_signals().map_err(|e| internal("signalfd", &e))?;
        let rt = runtime().map_err(|e| internal("starting a runtime", &e))?;
        let installer = Installer {
            handle: rt.handle().clone(),
            stop: stop.clone(),
        };
        Ok(Here {
            stop,
            installer,
            rt,
        })
    }
}

/// Runs the install jail from this process, like a run.
#[derive(Debug)]
pub struct Installer {
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
pub fn env_for(
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
pub fn ensure_here(
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

/// An embedded run before anything is leased: where it launches, its
/// policy and its request.
#[derive(Debug)]
pub struct EmbeddedRun {
    pub launcher: Launcher,
    pub policy: Policy,
    pub req: RunRequest,
}

impl EmbeddedRun {
    /// `req` under the policy `policy` names (a name, or in embedded mode
    /// a path to a .toml file).
    pub fn new(policy: &str, req: RunRequest) -> Result<EmbeddedRun, JailFailure> {
        let launcher = Launcher::embedded_from_env()?;
        let policy = launcher
            .load_policy(PolicyChoice::from_arg(policy))
            .map_err(|e| match e {
                LaunchError::Request(r) if r.field == "policy" => {
                    let mut f = r.failure();
                    f.message += "; in embedded mode you can also pass a path to a .toml file";
                    f
                }
                e => e.failure(),
            })?;
        Ok(EmbeddedRun {
            launcher,
            policy,
            req,
        })
    }
}

/// The host as this process measures it (each isolation layer, the
/// policies a run may name, and whether embedded mode has the root it
/// needs), with `mode` saying where runs go.
pub fn host_info(mode: String) -> pycell_protocol::info::HostInfo {
    let mut layers = pycell_launch::layers::layers();
    layers.push(pycell_protocol::info::LayerStatus::new(
        "root",
        nix::unistd::geteuid().is_root(),
        "embedded mode (no pycelld) needs root",
    ));
    let policies = std::path::Path::new(pycell_launch::resolve::POLICY_DIR);
    pycell_launch::host_info::host_info(mode, policies, layers)
}
