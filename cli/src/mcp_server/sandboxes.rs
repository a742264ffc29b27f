//! Where `pycell mcp`'s runs execute: [`Sandboxes`], the MCP server's
//! runs and their limits.
//!
//! With a pycelld socket the daemon runs them (no privilege needed here).
//! Without one (embedded mode, as root) each run takes the one launch path
//! of `pycell_launch::launcher`: the request is resolved under its policy, a
//! sandbox uid leased, and the single-threaded `pycell-jailer` started with
//! the spec on its stdin (this process is a multi-threaded tokio program and
//! never builds a jail itself); its events are decoded and collected into
//! the result. Cancelling a run sends the jailer SIGTERM, which its
//! supervisor turns into "kill the sandbox, clean up, report status killed".
//! The uid lease is held until the jailer has exited, so no later run can
//! get the uid while a process of this one might still hold it.
//!
//! Threat model: the request comes from an MCP client (an LLM's choices) and
//! is untrusted: policies are chosen by name only, sizes are bounded, and the
//! jailer re-validates the spec. The event stream comes from our own jailer
//! (root) but carries the sandbox's output, so frames are size-checked and
//! output is capped again by the collector.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, Semaphore};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use pycell_deps::build::Ensured;
pub use pycell_launch::launcher::RequestError;
use pycell_launch::launcher::{JailerStderr, LaunchError, Launcher, PolicyChoice, Prepared};
use pycell_launch::resolve::Extras;
use pycell_launch::supervisor::{supervise, Patience, Services, StoppedBy, PATIENCE};
use pycell_protocol::client::{daemon_socket, ClientError, Endpoint, Stage};
use pycell_protocol::messages::{ErrorCode, RunRequest};
use pycell_protocol::result::RunResult;
use pycell_wire::codes::{FailureCode, Layer};
use pycell_wire::events::Stream;
use pycell_wire::report::JailFailure;

use crate::tool_servers::{offer, DaemonToolCalls, ToolServers};
use pycell_engine::local::{self, stopped, Installer};
use pycell_launch::session_table::SessionTable;
use pycell_launch::tool_grant::ToolGrant;
use pycell_policy::Policy;
use pycell_protocol::result::LimitsReport;

/// Sandboxes one server runs at once; further calls wait for a slot. Each
/// sandbox is bounded by its policy, but a client firing calls in parallel
/// must not multiply that without limit (the daemon has its own quotas).
pub const MAX_CONCURRENT_RUNS: usize = 8;
/// What happens during a run, as it happens.
#[derive(Debug)]
pub enum RunEvent<'a> {
    /// The jailer was started for this run, as this sandbox uid (which a
    /// daemon run learns only from its result).
    Started {
        run_id: &'a str,
        sandbox_uid: Option<u32>,
    },
    /// A chunk of the program's output (already capped).
    Output { stream: Stream, bytes: &'a [u8] },
    /// The run waits for a free slot in pycelld; 1 goes next.
    Queued { position: usize },
    /// The run's dependencies are being installed: what is happening.
    Installing { message: &'a str },
}

/// What the daemon client's thread hands to the async side.
enum DaemonEvent {
    Output(Stream, Vec<u8>),
    Queued(usize),
    Installing(String),
    Started(String),
}

impl DaemonEvent {
    fn deliver(&self, on_event: &mut impl FnMut(RunEvent<'_>)) {
        match self {
            DaemonEvent::Output(stream, bytes) => on_event(RunEvent::Output {
                stream: *stream,
                bytes,
            }),
            DaemonEvent::Queued(position) => on_event(RunEvent::Queued {
                position: *position,
            }),
            DaemonEvent::Installing(message) => on_event(RunEvent::Installing { message }),
            DaemonEvent::Started(run_id) => {
                on_event(RunEvent::Queued { position: 0 });
                on_event(RunEvent::Started {
                    run_id,
                    sandbox_uid: None,
                });
            }
        }
    }
}

/// Where a daemon run's current connection leaves its canceller.
type Canceller = Arc<std::sync::Mutex<Option<pycell_protocol::client::Canceller>>>;

/// The blocking side of a daemon run (on a worker thread): its events to
/// `events`, its canceller to `canceller`, its tool calls to `calls`.
fn run_on_daemon(
    endpoint: &Endpoint,
    req: RunRequest,
    events: &mpsc::UnboundedSender<DaemonEvent>,
    canceller: &Canceller,
    calls: Option<&DaemonToolCalls>,
) -> Result<RunResult, ClientError> {
    pycell_protocol::client::run_patiently(
        endpoint,
        req,
        |stream, bytes| {
            let _ = events.send(DaemonEvent::Output(stream, bytes.to_vec()));
        },
        |stage| {
            let ev = match stage {
                Stage::Queued(position) => DaemonEvent::Queued(position),
                Stage::Started(run_id) => DaemonEvent::Started(run_id.to_string()),
                Stage::Installing(m) => DaemonEvent::Installing(m.to_string()),
                tool_call @ Stage::ToolCall { .. } => {
                    DaemonToolCalls::take(calls, tool_call);
                    return;
                }
            };
            let _ = events.send(ev);
        },
        |client| {
            if let Ok(mut c) = canceller.lock() {
                *c = client.canceller().ok();
            }
            if let Some(calls) = calls {
                calls.connected(client);
            }
        },
    )
}

/// Where runs may go.
#[derive(Debug, Clone)]
pub enum Mode {
    /// Always jailed by this process (as root).
    Embedded,
    /// Always through the pycelld at this socket; never embedded.
    Daemon(PathBuf),
    /// Through pycelld when one is configured or listening, else embedded.
    Either,
    /// On the nodes of a cluster (`crate::cluster`); never embedded.
    Cluster(Arc<crate::cluster::Nodes>),
}

impl Mode {
    /// `--embedded` or not.
    pub fn from_flag(embedded: bool) -> Mode {
        match embedded {
            true => Mode::Embedded,
            false => Mode::Either,
        }
    }
}

/// What this process keeps of an embedded session besides the session.
#[derive(Debug, Clone)]
pub struct SessionHeld {
    pub policy: Arc<Policy>,
    pub limits: LimitsReport,
    /// Its env, held in use (safe from removal) while the session lives.
    pub _env: Option<Arc<Ensured>>,
}

/// Runs requests in sandboxes. Cheap to clone; clones share one set of
/// in-flight runs, which [`Sandboxes::shutdown`] cancels and waits for.
#[derive(Debug, Clone)]
pub struct Sandboxes {
    inner: Arc<Inner>,
    /// The identity this view's requests are for (a front end's caller).
    identity: Option<Arc<str>>,
    /// Whether this view's runs are offered the tool servers (an HTTP
    /// caller needs the `pycell:tools` scope).
    offer_tools: bool,
}

#[derive(Debug)]
struct Inner {
    /// Embedded mode's launcher, or why there is none (reported per run, so
    /// that the server still starts and `sandbox_info` can explain).
    launcher: Result<Launcher, JailFailure>,
    tracker: TaskTracker,
    shutdown: CancellationToken,
    slots: Semaphore,
    /// Where runs may go: embedded only (`pycell mcp --embedded`), through
    /// pycelld only (`pycell mcp --http`: a front end never jails), or
    /// through pycelld when one listens.
    mode: Mode,
    /// How long a silent or stopping jailer is given (`PATIENCE`; shorter
    /// in tests).
    patience: Patience,
    /// Open sessions (embedded mode), by handle.
    sessions: std::sync::Mutex<SessionTable<SessionHeld>>,
    /// Code mode: the client's tool servers (`--tool-servers`).
    tools: Option<ToolServers>,
}

impl Sandboxes {
    /// Configuration from the environment (`PYCELL_JAILER`,
    /// `PYCELL_UID_RANGE`). Problems are reported by each run, as a refusal,
    /// so that the MCP server still starts and `sandbox_info` can explain.
    /// With `embedded_only`, runs never go to a daemon, even if one is
    /// listening.
    pub fn from_env(embedded_only: bool) -> Sandboxes {
        Sandboxes::new(
            Launcher::embedded_from_env(),
            Mode::from_flag(embedded_only),
            PATIENCE,
        )
    }

    /// The same, offering every run the tools of `servers`.
    pub fn with_tools(mode: Mode, servers: Option<ToolServers>) -> Sandboxes {
        let launcher = match mode {
            // A front end never jails: no launcher to hold or report.
            Mode::Daemon(_) | Mode::Cluster(_) => Err(JailFailure::new(
                FailureCode::Internal,
                Layer::Daemon,
                "this server runs code only through pycelld",
            )),
            _ => Launcher::embedded_from_env(),
        };
        Sandboxes::build(launcher, mode, PATIENCE, servers)
    }

    /// The client's tool servers, if it configured any.
    pub fn tool_servers(&self) -> Option<&ToolServers> {
        self.inner.tools.as_ref().filter(|_| self.offer_tools)
    }

    /// The same sandboxes, with requests for `identity` (pycelld refuses
    /// an identity unless this process is one of its trusted front ends).
    /// Without `offer_tools`, its runs get no tool servers.
    pub fn speaking_for(&self, identity: Option<Arc<str>>, offer_tools: bool) -> Sandboxes {
        Sandboxes {
            inner: Arc::clone(&self.inner),
            identity,
            offer_tools,
        }
    }

    /// Where runs go: the daemon's socket (and for whom), if they go to one.
    pub fn daemon(&self) -> Option<Endpoint> {
        let socket = match self.inner.mode {
            Mode::Embedded | Mode::Cluster(_) => None,
            Mode::Daemon(ref socket) => Some(socket.clone()),
            Mode::Either => daemon_socket(None),
        }?;
        Some(Endpoint {
            socket,
            identity: self.identity.clone(),
        })
    }

    /// The cluster runs go to, if they go to one.
    pub fn cluster(&self) -> Option<&Arc<crate::cluster::Nodes>> {
        match &self.inner.mode {
            Mode::Cluster(nodes) => Some(nodes),
            _ => None,
        }
    }

    /// Whom this view's requests are for.
    pub fn identity(&self) -> Option<Arc<str>> {
        self.identity.clone()
    }

    /// `daemon (SOCKET)`, `cluster (...)` or `embedded`, as `sandbox_info`
    /// reports it.
    pub fn mode(&self) -> String {
        match self.cluster() {
            Some(nodes) => format!("cluster (nodes {})", nodes.names().join(", ")),
            None => crate::info::mode_name(self.daemon().map(|e| e.socket).as_deref()),
        }
    }

    fn new(launcher: Result<Launcher, JailFailure>, mode: Mode, patience: Patience) -> Sandboxes {
        Sandboxes::build(launcher, mode, patience, None)
    }

    fn build(
        launcher: Result<Launcher, JailFailure>,
        mode: Mode,
        patience: Patience,
        tools: Option<ToolServers>,
    ) -> Sandboxes {
        Sandboxes {
            identity: None,
            offer_tools: true,
            inner: Arc::new(Inner {
                mode,
                launcher,
                tracker: TaskTracker::new(),
                shutdown: CancellationToken::new(),
                slots: Semaphore::new(MAX_CONCURRENT_RUNS),
                patience,
                sessions: Default::default(),
                tools,
            }),
        }
    }

    /// Run `req` in a sandbox. `on_event` sees the run start and its output
    /// as it arrives; cancelling `cancel` kills the sandbox (the result then
    /// says `killed`). A refused run is an `Ok` result with status
    /// `refused`; `Err` means the request itself is wrong.
    pub async fn run(
        &self,
        mut req: RunRequest,
        on_event: impl FnMut(RunEvent<'_>) + Send,
        cancel: CancellationToken,
    ) -> Result<RunResult, RequestError> {
        if let Some(servers) = self.tool_servers() {
            offer(servers, &mut req).await;
        }
        if let Some(nodes) = self.cluster() {
            let run = self.run_in_cluster(nodes, req, on_event, cancel);
            return self.inner.tracker.track_future(run).await;
        }
        // With a pycelld socket the daemon runs it (no root needed here);
        // otherwise this process is the embedded daemon.
        if let Some(endpoint) = self.daemon() {
            return self
                .inner
                .tracker
                .track_future(self.run_via_daemon(endpoint, req, on_event, cancel))
                .await;
        }
        self.inner
            .tracker
            .track_future(self.run_embedded(req, on_event, cancel))
            .await
    }

    /// A run through pycelld: the blocking client on a worker thread, its
    /// output relayed to `on_event`, cancellation sent as the protocol's
    /// `cancel` (the daemon kills the sandbox; the result says `killed`).
    pub(super) async fn run_via_daemon(
        &self,
        endpoint: Endpoint,
        req: RunRequest,
        mut on_event: impl FnMut(RunEvent<'_>) + Send,
        cancel: CancellationToken,
    ) -> Result<RunResult, RequestError> {
        let policy = req.policy_name().to_string();
        // The blocking client on a worker thread; each connection it makes
        // leaves its canceller here for `cancel`.
        let canceller: Canceller = Arc::default();
        let (tx, mut rx) = mpsc::unbounded_channel::<DaemonEvent>();
        let calls = self
            .tool_servers()
            .cloned()
            .map(|servers| DaemonToolCalls::new(servers, tokio::runtime::Handle::current()));
        let slot = Arc::clone(&canceller);
        let mut handle = tokio::task::spawn_blocking(move || {
            run_on_daemon(&endpoint, req, &tx, &slot, calls.as_ref())
        });
        let mut cancel_sent = false;
        let outcome = loop {
            tokio::select! {
                Some(ev) = rx.recv() => ev.deliver(&mut on_event),
                _ = self.stopped(&cancel), if !cancel_sent => {
                    cancel_sent = true;
                    if let Some(c) = canceller.lock().ok().as_mut().and_then(|c| c.as_mut()) {
                        let _ = c.cancel();
                    }
                }
                done = &mut handle => break done,
            }
        };
        // Chunks still queued when the run ended.
        while let Ok(ev) = rx.try_recv() {
            ev.deliver(&mut on_event);
        }
        match outcome {
            Ok(Ok(result)) => Ok(result),
            Ok(Err(ClientError::Refused {
                code: ErrorCode::InvalidRequest,
                message,
            })) => Err(RequestError {
                field: "request",
                problem: message,
            }),
            Ok(Err(e)) => Ok(e.into_result(&policy)),
            Err(e) => {
                let f = JailFailure::new(FailureCode::Internal, Layer::Daemon, e.to_string());
                Ok(RunResult::refused("", &policy, f))
            }
        }
    }

    /// Resolves when the call is cancelled or the server shuts down.
    async fn stopped(&self, cancel: &CancellationToken) {
        tokio::select! {
            _ = cancel.cancelled() => {}
            _ = self.inner.shutdown.cancelled() => {}
        }
    }

    /// Cancel every run in flight (their results say `killed`) and refuse
    /// new ones.
    pub fn cancel_all(&self) {
        self.inner.shutdown.cancel();
    }

    /// Cancel every run in flight, end every session, and wait (at most
    /// `grace`) for their jailers to clean up and exit. New runs are
    /// refused afterwards.
    pub async fn shutdown(&self, grace: Duration) {
        self.inner.shutdown.cancel();
        self.inner.tracker.close();
        let runs = tokio::time::timeout(grace, self.inner.tracker.wait());
        let (_, ()) = tokio::join!(runs, self.end_all_sessions(grace));
    }

    pub(super) fn sessions(
        &self,
    ) -> Result<std::sync::MutexGuard<'_, SessionTable<SessionHeld>>, ()> {
        self.inner.sessions.lock().map_err(|_| ())
    }

    pub(super) fn patience(&self) -> Patience {
        self.inner.patience
    }

    pub(super) fn shutdown_token(&self) -> &CancellationToken {
        &self.inner.shutdown
    }

    pub(super) fn launcher(&self) -> Result<&Launcher, JailFailure> {
        self.inner.launcher.as_ref().map_err(Clone::clone)
    }

    /// Load the policy, get the env of the run's dependencies (installing
    /// them if they are not cached) and prepare the run: blocking work
    /// (policy files, interpreter paths, the uid database, lock files, the
    /// install jail, which this thread waits for).
    fn prepare(
        &self,
        req: &RunRequest,
        installer: &mut Installer,
        progress: &mut dyn FnMut(&str),
    ) -> Result<(Prepared, Option<Ensured>, Option<ToolGrant>), LaunchError> {
        let launcher = self
            .inner
            .launcher
            .as_ref()
            .map_err(|f| LaunchError::Refused(f.clone()))?;
        let policy = launcher.load_policy(PolicyChoice::Name(req.policy_name()))?;
        let ensured = local::env_for(launcher, &policy, req, installer, progress)
            .map_err(LaunchError::Refused)?;
        let extras = Extras {
            env: ensured.as_ref().map(|e| e.env.dir.clone()),
            ..Extras::default()
        };
        let grant = ToolGrant::for_request(&policy, req.tools.as_ref())?;
        Ok((
            launcher.prepare_with(&policy, req, &extras)?,
            ensured,
            grant,
        ))
    }

    /// Wait for a run slot; `Err` is the result of a run that never starts
    /// (cancelled or shut down while waiting).
    async fn slot(
        &self,
        cancel: &CancellationToken,
    ) -> Result<tokio::sync::SemaphorePermit<'_>, JailFailure> {
        let shutting_down = || {
            JailFailure::new(
                FailureCode::ShuttingDown,
                Layer::Jailer,
                "pycell mcp is shutting down",
            )
        };
        tokio::select! {
            biased;
            _ = self.inner.shutdown.cancelled() => Err(shutting_down()),
            _ = cancel.cancelled() => Err(JailFailure::new(
                FailureCode::Cancelled,
                Layer::Jailer,
                "the call was cancelled before its sandbox started",
            )),
            slot = self.inner.slots.acquire() => slot.map_err(|_| shutting_down()),
        }
    }

    async fn run_embedded(
        &self,
        req: RunRequest,
        mut on_event: impl FnMut(RunEvent<'_>) + Send,
        cancel: CancellationToken,
    ) -> Result<RunResult, RequestError> {
        let policy_name = req.policy_name().to_string();
        let refused = |f: JailFailure| Ok(RunResult::refused("", &policy_name, f));
        let _slot = match self.slot(&cancel).await {
            Ok(s) => s,
            Err(f) => return refused(f),
        };
        // One stop path for the install and the run: a cancel, or the
        // server shutting down.
        let (stop_tx, stop) = tokio::sync::watch::channel(None);
        let this = self.clone();
        let forward = tokio::spawn(async move {
            let by = tokio::select! {
                _ = cancel.cancelled() => StoppedBy::Request,
                _ = this.inner.shutdown.cancelled() => StoppedBy::Shutdown,
            };
            let _ = stop_tx.send(Some(by));
        });
        let _forwarding = AbortOnDrop(forward);
        let this = self.clone();
        let (tx, mut installing) = tokio::sync::mpsc::unbounded_channel::<String>();
        let install_stop = stop.clone();
        let preparing = tokio::task::spawn_blocking(move || {
            let mut installer = Installer {
                handle: tokio::runtime::Handle::current(),
                stop: install_stop,
            };
            this.prepare(&req, &mut installer, &mut |m: &str| {
                let _ = tx.send(m.to_string());
            })
        });
        tokio::pin!(preparing);
        let prepared = loop {
            tokio::select! {
                Some(message) = installing.recv() => on_event(RunEvent::Installing { message: &message }),
                done = &mut preparing => break done,
            }
        };
        let (prepared, ensured, grant) = match prepared {
            Ok(Ok(p)) => p,
            Ok(Err(LaunchError::Request(e))) => return Err(e),
            Ok(Err(LaunchError::Refused(f))) => return refused(f),
            Err(e) => {
                let m = format!("preparing the run: {e}");
                return refused(JailFailure::new(FailureCode::Internal, Layer::Jailer, m));
            }
        };
        // Started from this async task, i.e. from a runtime worker thread,
        // never from a blocking-pool thread (see `Prepared::spawn_async`).
        let launched = match prepared.spawn_async(JailerStderr::Capture).await {
            Ok(l) => l,
            Err(result) => return Ok(*result),
        };
        on_event(RunEvent::Started {
            run_id: &launched.run_id,
            sandbox_uid: Some(launched.lease.uid),
        });
        let tools = grant
            .zip(self.tool_servers().cloned())
            .map(|(grant, servers)| {
                let upstream: Arc<dyn pycell_tools::service::Upstream> = Arc::new(servers);
                grant.service(upstream, None)
            });
        let (mut result, _) = supervise(
            launched,
            self.inner.patience,
            stopped(stop),
            Services::local(tools),
            |stream, bytes| on_event(RunEvent::Output { stream, bytes }),
        )
        .await;
        // The env stayed in use (safe from removal) until here.
        result.env = ensured.map(|e| e.report);
        Ok(result)
    }
}

/// Aborts a task when dropped (the run's future was).
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    /// Embedded mode's launcher with `jailer` in place of pycell-jailer.
    fn with_jailer(jailer: PathBuf) -> Result<Launcher, JailFailure> {
        Launcher::embedded_from_env().map(|l| Launcher {
            jailer: Ok(jailer),
            ..l
        })
    }

    /// A stand-in for pycell-jailer: a shell script.
    fn fake_jailer(dir: &Path, body: &str) -> PathBuf {
        use std::os::unix::fs::PermissionsExt;
        let p = dir.join("fake-jailer");
        std::fs::write(&p, format!("#!/bin/sh\n{body}\n")).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        p
    }

    fn print1() -> RunRequest {
        RunRequest {
            code: "print(1)".into(),
            ..Default::default()
        }
    }

    /// These tests lease a real sandbox uid, which needs root (as CI has).
    fn require_root() {
        assert!(
            nix::unistd::geteuid().is_root(),
            "this test needs root (it leases a sandbox uid): run it as root, e.g. with scripts/test"
        );
    }

    /// Run print(1) with a fake jailer whose script is `body`; its failure.
    async fn failure_with_fake_jailer(body: &str) -> JailFailure {
        require_root();
        let dir = tempfile::tempdir().unwrap();
        let jailer = fake_jailer(dir.path(), body);
        let b = Sandboxes::new(with_jailer(jailer), Mode::Embedded, PATIENCE);
        let r = b.run(print1(), |_| {}, CancellationToken::new()).await;
        r.unwrap().error.expect("an error")
    }

    #[tokio::test]
    async fn a_jailer_that_dies_without_a_result_is_a_refusal_that_says_why() {
        let e = failure_with_fake_jailer("cat >/dev/null; echo 'no cgroup here' >&2; exit 3").await;
        assert_eq!(e.code, FailureCode::JailerFailed, "{e:?}");
        assert!(e.message.contains("exit status: 3"), "{e:?}");
        assert!(e.message.contains("no cgroup here"), "{e:?}");
    }

    #[tokio::test]
    async fn a_corrupt_event_stream_is_a_refusal() {
        let e = failure_with_fake_jailer("cat >/dev/null; printf 'garbage'").await;
        assert_eq!(e.code, FailureCode::JailerFailed, "{e:?}");
        assert!(e.message.contains("event stream is corrupt"), "{e:?}");
    }

    #[tokio::test]
    async fn a_jailer_that_hangs_is_stopped_then_killed() {
        require_root();
        let dir = tempfile::tempdir().unwrap();
        // Ignores SIGTERM and never answers: only SIGKILL ends it.
        let jailer = fake_jailer(dir.path(), "trap '' TERM; cat >/dev/null; exec sleep 600");
        let margin = Duration::from_millis(300);
        let patience = Patience {
            slack: margin,
            grace: Duration::from_millis(300),
        };
        let b = Sandboxes::new(with_jailer(jailer), Mode::Embedded, patience);
        let mut req = print1();
        req.limits.timeout_s = Some(0.2);
        let start = std::time::Instant::now();
        let r = tokio::time::timeout(
            Duration::from_secs(20),
            b.run(req, |_| {}, CancellationToken::new()),
        )
        .await
        .expect("the backend gave up on the jailer")
        .unwrap();
        let took = start.elapsed();
        assert!(took >= Duration::from_millis(700), "{took:?}");
        let e = r.error.expect("an error");
        assert_eq!(e.code, FailureCode::JailerFailed, "{e:?}");
        assert!(e.message.contains("signal: 9"), "{e:?}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_cancel_reaches_an_install_in_progress() {
        require_root();
        let dir = tempfile::tempdir().unwrap();
        // Stands in for the install jail's jailer: it never finishes by
        // itself, and it ends (143) when told to stop.
        let jailer = fake_jailer(
            dir.path(),
            "trap 'exit 143' TERM; cat >/dev/null; while :; do sleep 0.05; done",
        );
        let b = Sandboxes::new(with_jailer(jailer), Mode::Embedded, PATIENCE);
        let req = RunRequest {
            code: "print(1)".into(),
            // A request no env in the store answers, so an install starts.
            dependencies: vec![format!("pycell-never-built-{}==1.0", std::process::id())],
            ..Default::default()
        };
        let cancel = CancellationToken::new();
        let canceller = cancel.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(500)).await;
            canceller.cancel();
        });
        let r = tokio::time::timeout(Duration::from_secs(60), b.run(req, |_| {}, cancel))
            .await
            .expect("the cancel did not reach the install")
            .unwrap();
        // The install jail's jailer was told to stop (SIGTERM: 143).
        let e = r.error.expect("an error");
        assert_eq!(e.code, FailureCode::JailerFailed, "{e:?}");
        assert!(
            e.message.starts_with("the install jail: ") && e.message.contains("exit status: 143"),
            "{e:?}"
        );
    }

    #[tokio::test]
    async fn a_missing_jailer_is_a_refusal() {
        require_root();
        let b = Sandboxes::new(
            with_jailer(PathBuf::from("/nonexistent/pycell-jailer")),
            Mode::Embedded,
            PATIENCE,
        );
        let r = b
            .run(print1(), |_| {}, CancellationToken::new())
            .await
            .unwrap();
        let e = r.error.expect("an error");
        assert_eq!(e.code, FailureCode::JailerUnavailable, "{e:?}");
        assert!(e.message.contains("/nonexistent/pycell-jailer"), "{e:?}");
    }

    #[tokio::test]
    async fn an_unknown_policy_is_the_callers_mistake() {
        let b = Sandboxes::from_env(true);
        let req = RunRequest {
            code: "print(1)".into(),
            policy: Some("no-such-policy".into()),
            ..Default::default()
        };
        let e = b
            .run(req, |_| {}, CancellationToken::new())
            .await
            .unwrap_err();
        assert_eq!(e.field, "policy");
        assert!(
            e.problem.contains("no policy named \"no-such-policy\""),
            "{e}"
        );
        assert!(e.problem.contains("default"), "{e}");
    }
}
