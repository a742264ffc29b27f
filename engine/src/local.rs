//! Runs this process starts itself (embedded mode, as root, no pycelld):
//! the env of a run's dependencies, built here if it must be, and the way
//! a launched jailer is supervised and stopped. `pycell run`, `pycell env
//! build`, embedded `pycell mcp` and pycelld's env builders share it; the
//! supervision itself is `pycell_launch::supervisor`, the same for every
//! mode.

use std::os::fd::{AsFd, OwnedFd};
use std::sync::{Arc, Mutex};

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::signal::{SigSet, SigmaskHow, Signal};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use pycell_deps::build::{Ensured, InstallRunner, ProgressLines};
use pycell_deps::store::EnvStore;
use pycell_deps::{self as deps, DepsRequest};
use pycell_launch::launcher::{JailerStderr, LaunchError, Launcher, PolicyChoice, Prepared};
use pycell_launch::resolve::Extras;
use pycell_launch::supervisor::{supervise, Patience, Services, StoppedBy, PATIENCE};
use pycell_policy::Policy;
use pycell_protocol::messages::RunRequest;
use pycell_protocol::result::{CacheOutcome, RunResult};
use pycell_tools::service::ToolService;
use pycell_wire::codes::{FailureCode, Layer};
use pycell_wire::events::Stream;
use pycell_wire::report::JailFailure;
use pycell_wire::timings::Recorder;
use tokio::runtime::Handle;
use tokio::sync::watch;

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
    // SIGINT only goes to the program, which the jailer did.
    stop_request(false)
}

/// The stop request of `pycell batch`: SIGINT too stops every run (and
/// the batch takes no new line). Blocked here like [`stop_on_signals`]'.
pub fn stop_on_every_signal() -> nix::Result<StopRequest> {
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
#[derive(Debug)]
pub struct CtrlC {
    target: Arc<Mutex<Option<pycell_protocol::client::Canceller>>>,
}

impl CtrlC {
    /// The run of `client`'s connection is the one ^C now interrupts.
    pub fn connected(&self, client: &pycell_protocol::client::DaemonClient) {
        let canceller = client.canceller().ok();
        *self.target.lock().unwrap_or_else(|p| p.into_inner()) = canceller;
    }
}

pub fn interrupt_on_ctrl_c() -> nix::Result<CtrlC> {
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
pub fn runtime() -> std::io::Result<Runtime> {
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

/// A warm run (one from a zygote) from this thread: its jailer started,
/// its work sent at once (the jailer takes it when the jail is ready),
/// supervised to its end.
pub fn run_warm_here(
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

/// What a process needs to run jails from its own thread: a stop request
/// (SIGTERM, SIGHUP), a runtime, and an installer on both. `pycell run`,
/// `pycell env build`, `pycell mcp-server` and pycelld's jobs start one.
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

/// How an embedded run is run: its dependencies' installer, what stops
/// it, the tools it may call, where its steps are marked, and where its
/// output goes as it arrives.
pub struct HowToRun<'a> {
    pub installer: &'a mut Installer,
    pub stop: &'a StopRequest,
    pub tools: Option<ToolService>,
    /// Where the run's steps are marked (`--timings`), if anywhere.
    pub marks: Option<&'a Recorder>,
    pub on_output: &'a mut dyn FnMut(Stream, &[u8]),
}

impl std::fmt::Debug for HowToRun<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HowToRun")
            .field("installer", &self.installer)
            .field("tools", &self.tools.is_some())
            .field("marks", &self.marks.is_some())
            .finish_non_exhaustive()
    }
}

impl EmbeddedRun {
    /// The run, embedded, from this thread (which must outlive it): its
    /// dependencies' env found or built, its spec resolved and uid leased,
    /// its jailer started and supervised to its end.
    pub fn run(self, how: HowToRun<'_>) -> RunResult {
        let name = &self.policy.name;
        let mut progress = |m: &str| eprintln!("pycell: {m}");
        let ensured = match env_for(
            &self.launcher,
            &self.policy,
            &self.req,
            how.installer,
            &mut progress,
        ) {
            Ok(e) => e,
            Err(f) => return RunResult::refused("", name, f),
        };
        mark(how.marks, "pycell: dependencies' env found");
        let extras = Extras {
            env: ensured.as_ref().map(|e| e.env.dir.clone()),
            ..Extras::default()
        };
        let mut prepared = match self.launcher.prepare_with(&self.policy, &self.req, &extras) {
            Ok(p) => p,
            Err(e) => return RunResult::refused("", name, e.failure()),
        };
        if how.marks.is_some() {
            prepared.mark_timings();
        }
        mark(how.marks, "pycell: spec resolved, uid leased");
        let handle = how.installer.handle.clone();
        let (mut result, _) = run_here(
            &handle,
            prepared,
            PATIENCE,
            how.stop,
            how.tools,
            how.on_output,
        );
        mark(how.marks, "pycell: jailer ended, its uid given back");
        result.env = ensured.map(|e| e.report);
        result
    }
}

impl EmbeddedRun {
    /// The run, embedded, from this thread, with a stop request (SIGTERM,
    /// SIGHUP) and a runtime of its own, no tools and no marks.
    pub fn run_alone(self, on_output: &mut dyn FnMut(Stream, &[u8])) -> RunResult {
        let mut here = match Here::start() {
            Ok(h) => h,
            Err(f) => return RunResult::refused("", &self.policy.name, f),
        };
        self.run(HowToRun {
            installer: &mut here.installer,
            stop: &here.stop,
            tools: None,
            marks: None,
            on_output,
        })
    }
}

fn mark(marks: Option<&Recorder>, what: &str) {
    if let Some(m) = marks {
        m.mark(what);
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
