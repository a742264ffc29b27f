//! Runs and sessions this process jails itself (embedded mode, as root).
//!
//! Each run takes the one launch path of `pycell_launch::launcher`: the
//! request is resolved under its policy, its env got (installed if need
//! be), a sandbox uid leased, and the single-threaded `pycell-jailer`
//! started with the spec on its stdin (this process is a multi-threaded
//! tokio program and never builds a jail itself); its events are decoded
//! and collected into the result. Cancelling a run sends the jailer
//! SIGTERM, which its supervisor turns into "kill the sandbox, clean up,
//! report status killed". The uid lease is held until the jailer has
//! exited, so no later run can get the uid while a process of this one
//! might still hold it.
//!
//! Sessions are jails whose python stays alive between calls
//! (`pycell_launch::session`), in a table by handle for as long as this
//! process lives, at most the policy's `[session] per_uid` of them at once.

use std::os::fd::OwnedFd;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use pycell_deps::build::Ensured;
use pycell_launch::host_info;
use pycell_launch::launcher::{JailerStderr, LaunchError, Launcher, PolicyChoice, Prepared};
use pycell_launch::resolve::Extras;
use pycell_launch::serving;
use pycell_launch::session::{Session, SessionParts, SessionTiming};
use pycell_launch::session_fork;
use pycell_launch::session_table::{self, Entry, Lookup, SessionTable};
use pycell_launch::snapshots::{Quota, SnapshotStore};
use pycell_launch::supervisor::{supervise, Patience, Services, StoppedBy};
use pycell_launch::tool_grant::ToolGrant;
use pycell_policy::Policy;
use pycell_protocol::info::PolicySummary;
use pycell_protocol::messages::RunRequest;
use pycell_protocol::result::{RunLimits, RunResult};
use pycell_protocol::session::{
    SessionAnswer, SessionCall, SessionEndInfo, SessionForkInfo, SessionInfo, SessionStartRequest,
    SessionSummary, SnapshotInfo,
};
use pycell_wire::codes::{FailureCode, Layer};
use pycell_wire::report::JailFailure;
use pycell_wire::spec::Grant;

use super::{
    Asker, OnEvent, Options, OutputSink, RequestError, RunEvent, Sandboxes, Serving, SessionFailure,
};
use crate::local::{self, Installer};
use crate::tool_source::ToolSource;

/// Sandboxes one process runs at once; further calls wait for a slot.
/// Each sandbox is bounded by its policy, but a client firing calls in
/// parallel must not multiply that without limit (pycelld has its own
/// quotas).
pub const MAX_CONCURRENT_RUNS: usize = 8;

/// How long a session's python may take to import its policy's modules
/// and get ready.
const READY_WITHIN: Duration = Duration::from_secs(60);

/// What this process keeps of a session besides the session.
#[derive(Debug, Clone)]
pub struct SessionHeld {
    pub policy: Arc<Policy>,
    pub limits: RunLimits,
    /// Its env, held in use (safe from removal) while the session lives.
    pub _env: Option<Arc<Ensured>>,
    /// What started it: what starts its forks.
    pub start: Arc<SessionStartRequest>,
}

impl session_table::HeldPolicy for SessionHeld {
    fn policy(&self) -> &Policy {
        &self.policy
    }

    fn limits(&self) -> &RunLimits {
        &self.limits
    }

    fn start(&self) -> &SessionStartRequest {
        &self.start
    }
}

type Table = Arc<Mutex<SessionTable<SessionHeld>>>;

/// This process, jailing as root.
#[derive(Debug)]
pub struct Embedded {
    /// The launcher, or why there is none (reported per run, so that a
    /// server still starts and `sandbox_info` can explain).
    launcher: Result<Launcher, JailFailure>,
    slots: Semaphore,
    /// How long a silent or stopping jailer is given (`PATIENCE`; shorter
    /// in tests).
    patience: Patience,
    /// Open sessions, by handle.
    sessions: Table,
    shutdown: CancellationToken,
    /// Whether a run's policy may be a path to a .toml file.
    policy_files: bool,
    /// Whether each run's steps are marked in its result.
    timings: bool,
    /// The zygote runs of its policy are forked from, once started.
    zygote: std::sync::OnceLock<super::zygote::Forked>,
    /// Set once the task that pauses idle sessions runs.
    pauser: std::sync::OnceLock<()>,
    /// Sessions' snapshots, or why there are none: opened when first used.
    snapshots: std::sync::OnceLock<Result<SnapshotStore, String>>,
}

/// The uid that owns embedded sessions: this process's.
fn owner() -> u32 {
    nix::unistd::getuid().as_raw()
}

/// Embedded sessions' snapshots: `snapshots` in the embedded env store's
/// directory (`$PYCELL_ENV_STORE`, else /var/cache/pycell), checked as
/// the env store is (root's, writable by no one else, no symlink on the
/// way), under this process's uid. Other processes of the same uid may
/// use it at once: only their `.partial` files an hour old are taken for
/// dead ones.
fn open_snapshot_store() -> Result<SnapshotStore, String> {
    let store = pycell_deps::build::embedded_store().map_err(|f| f.message)?;
    let root = store.root().join("snapshots");
    SnapshotStore::open(&root, Quota::default(), STALE_PARTIAL).map_err(|e| e.to_string())
}

/// How old a `.partial` snapshot of the embedded store must be to be
/// taken for one a killed process left.
const STALE_PARTIAL: std::time::Duration = std::time::Duration::from_secs(3600);

fn owner_key() -> String {
    format!("uid-{}", owner())
}

fn failed((code, m): (FailureCode, String)) -> SessionFailure {
    SessionFailure::new(code, m)
}

/// The tool service of a run granted tools, answered by `servers`.
fn tool_service(
    grant: Option<ToolGrant>,
    servers: Option<&Arc<dyn ToolSource>>,
) -> Option<pycell_tools::service::ToolService> {
    grant.zip(servers.cloned()).map(|(grant, servers)| {
        let upstream: Arc<dyn pycell_tools::service::Upstream> = servers;
        grant.service(upstream, None)
    })
}

impl Embedded {
    pub fn new(
        launcher: Result<Launcher, JailFailure>,
        patience: Patience,
        options: &Options,
        shutdown: CancellationToken,
    ) -> Embedded {
        Embedded {
            launcher,
            slots: Semaphore::new(options.max_runs.max(1)),
            patience,
            sessions: Table::default(),
            shutdown,
            policy_files: options.policy_files,
            timings: options.timings,
            zygote: std::sync::OnceLock::new(),
            pauser: std::sync::OnceLock::new(),
            snapshots: std::sync::OnceLock::new(),
        }
    }

    fn table(&self) -> Result<MutexGuard<'_, SessionTable<SessionHeld>>, ()> {
        self.sessions.lock().map_err(|_| ())
    }

    fn launcher(&self) -> Result<Launcher, JailFailure> {
        self.launcher.clone()
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
                "pycell is shutting down",
            )
        };
        tokio::select! {
            biased;
            _ = self.shutdown.cancelled() => Err(shutting_down()),
            _ = cancel.cancelled() => Err(JailFailure::new(
                FailureCode::Cancelled,
                Layer::Jailer,
                "the call was cancelled before its sandbox started",
            )),
            slot = self.slots.acquire() => slot.map_err(|_| shutting_down()),
        }
    }

    /// The live session `handle` of this process.
    fn session(&self, handle: &str) -> Result<Entry<SessionHeld>, SessionFailure> {
        let looked = match self.table() {
            Ok(mut t) => t.get(&owner(), handle),
            Err(_) => Err(Lookup::Unknown),
        };
        looked.map_err(|l| gone(&l, handle))
    }

    /// Start a session for `req` (see [`Sandboxes::start_session`]); as
    /// paused session `resume` (under its handle) if given, whose
    /// snapshot `req` names.
    async fn start_session_as(
        &self,
        asker: &Asker,
        req: SessionStartRequest,
        resume: Option<&str>,
    ) -> Result<SessionInfo, SessionFailure> {
        self.keep_pausing();
        let key = match resume {
            Some(_) => session_fork::paused_key(&owner_key()),
            None => owner_key(),
        };
        let (req, restoring) = match req.from_snapshot.is_some() {
            false => (req, None),
            true => {
                let store = self.snapshot_store()?;
                let found = session_fork::snapshot_to_start(store, &key, &req);
                let (kept, bundle) = found.map_err(failed)?.expect("from_snapshot is set");
                let start = SessionStartRequest {
                    tools: req.tools.or_else(|| kept.start.tools.clone()),
                    ..kept.start.clone()
                };
                (start, Some((kept, bundle)))
            }
        };
        let start = Arc::new(req.clone());
        let run_req = RunRequest {
            policy: req.policy,
            limits: req.limits,
            dependencies: req.dependencies,
            tools: req.tools,
            ..RunRequest::default()
        };
        let (prepared, policy, ensured, grant) = self.prepare_session(run_req).await?;
        let per_uid = policy.session.per_uid as usize;
        if self.table().map(|t| t.count(&owner())).unwrap_or(0) >= per_uid {
            return Err(too_many(&policy));
        }
        let tools = tool_service(grant, asker.tools.as_ref());
        let session = self.launch_session(prepared, &policy, tools).await?;
        let mut info = self.admit(session, policy, ensured, start, resume).await?;
        if let Some(snapshot) = restoring {
            let id = snapshot.0.info.snapshot.clone();
            let entry = match resume {
                // Calls wait for a session being resumed: only this finds it.
                Some(h) => self.table().ok().and_then(|t| t.resuming(h)),
                None => self.session(&info.session).ok(),
            };
            let entry = entry.ok_or_else(|| {
                let m = format!("session {} ended as it started", info.session);
                SessionFailure::new(FailureCode::SessionGone, m)
            })?;
            let held = &entry.info;
            let restored =
                session_fork::restore(&entry.session, snapshot, &held.policy, &held.limits).await;
            if let (Some(h), Ok(mut t)) = (resume, self.table()) {
                t.resumed(h);
            }
            if resume.is_some() {
                self.snapshot_store()?.remove(&key, &id);
            }
            info.restored = Some(restored.map_err(failed)?);
        }
        Ok(info)
    }

    fn snapshot_store(&self) -> Result<&SnapshotStore, SessionFailure> {
        let store = self.snapshots.get_or_init(open_snapshot_store);
        store.as_ref().map_err(|why| {
            let m = format!("this process keeps no snapshots: {why}");
            SessionFailure::new(FailureCode::Internal, m)
        })
    }

    /// The live session `handle`, resumed first if it was paused (then
    /// true); a call to one being paused waits until it is.
    async fn live_or_resumed(
        &self,
        asker: &Asker,
        handle: &str,
    ) -> Result<(Entry<SessionHeld>, bool), SessionFailure> {
        let deadline = std::time::Instant::now() + PAUSE_WAIT;
        let mut resumed = false;
        loop {
            let looked = match self.table() {
                Ok(mut t) => t.get(&owner(), handle),
                Err(_) => Err(Lookup::Unknown),
            };
            match looked {
                Ok(e) => return Ok((e, resumed)),
                Err(Lookup::Pausing) if std::time::Instant::now() < deadline => {
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await
                }
                Err(Lookup::Paused(snapshot)) if !resumed => {
                    let key = session_fork::paused_key(&owner_key());
                    if self.snapshot_store()?.get(&key, &snapshot).is_err() {
                        if let Ok(mut t) = self.table() {
                            t.forget_paused(&owner(), handle);
                        }
                        return Err(paused_state_gone(handle));
                    }
                    let req = SessionStartRequest {
                        from_snapshot: Some(snapshot),
                        ..SessionStartRequest::default()
                    };
                    self.start_session_as(asker, req, Some(handle)).await?;
                    resumed = true;
                }
                Err(l) => return Err(gone(&l, handle)),
            }
        }
    }

    /// Pause this process's idle sessions whose policy says so, every
    /// second, for as long as it lives (started with its first session).
    fn keep_pausing(&self) {
        let table = Arc::clone(&self.sessions);
        let shutdown = self.shutdown.clone();
        let Ok(store) = self.snapshot_store().cloned() else {
            return;
        };
        self.pauser.get_or_init(|| {
            tokio::spawn(async move {
                let mut tick = tokio::time::interval(std::time::Duration::from_secs(1));
                loop {
                    tokio::select! {
                        _ = tick.tick() => {}
                        _ = shutdown.cancelled() => return,
                    }
                    session_fork::pause_idle(&table, &store, |_| owner_key()).await;
                }
            });
        });
    }
}

/// A paused session whose snapshot is gone (expired, or removed).
fn paused_state_gone(handle: &str) -> SessionFailure {
    let m = format!("session {handle} is over: it was paused while idle, and its kept state is gone (expired); start a new one with session_start");
    SessionFailure::new(FailureCode::SessionGone, m)
}

/// How long a call to a session being paused waits for the pause.
const PAUSE_WAIT: std::time::Duration = std::time::Duration::from_secs(60);

/// Load the policy, get the env of the run's dependencies (installing
/// them if they are not cached) and prepare the run, a server's grants
/// bound in from `granted`: blocking work (policy files, interpreter
/// paths, the uid database, lock files, the install jail, which this
/// thread waits for).
fn prepare(
    launcher: &Launcher,
    req: &RunRequest,
    granted: Vec<OwnedFd>,
    policy_files: bool,
    installer: &mut Installer,
    progress: &mut dyn FnMut(&str),
) -> Result<PreparedRun, LaunchError> {
    serving::check_grants(req, &granted)?;
    let mut policy = load_policy(launcher, req.policy_name(), policy_files)?;
    // The operator's own allow widens the policy; a client's narrows it.
    let narrowed = match policy_files {
        true => serving::widen(&mut policy, &req.allow).map(|()| None),
        false => serving::narrowed_egress(&policy, req),
    }?;
    let (ensured, extras, grant) = env_and_tools(launcher, &policy, req, installer, progress)?;
    let mut prepared = launcher.prepare_with(&policy, req, &extras)?;
    if narrowed.is_some() {
        prepared.egress = narrowed;
    }
    if !granted.is_empty() {
        let grants = req.grants.iter().map(|g| Grant {
            target: g.target.clone(),
            writable: g.writable,
            owner: None,
        });
        prepared
            .grant(grants.zip(granted).collect())
            .map_err(LaunchError::Refused)?;
    }
    Ok((prepared, ensured, grant))
}

/// What a run and a session of `policy` both need before their jail is
/// prepared: the env of the request's dependencies (installed if need be),
/// the extras that bind it, and the tools the request is granted.
fn env_and_tools(
    launcher: &Launcher,
    policy: &Policy,
    req: &RunRequest,
    installer: &mut Installer,
    progress: &mut dyn FnMut(&str),
) -> Result<(Option<Ensured>, Extras, Option<ToolGrant>), LaunchError> {
    let ensured =
        local::env_for(launcher, policy, req, installer, progress).map_err(LaunchError::Refused)?;
    let extras = Extras {
        env: ensured.as_ref().map(|e| e.env.dir.clone()),
        ..Extras::default()
    };
    let grant = ToolGrant::for_request(policy, req.tools.as_ref())?;
    Ok((ensured, extras, grant))
}

/// The policy `name` names (by name, or if the front end's user may, a
/// path to a .toml file).
fn load_policy(launcher: &Launcher, name: &str, policy_files: bool) -> Result<Policy, LaunchError> {
    let choice = super::policy_choice(policy_files, name);
    launcher.load_policy(choice).map_err(|e| match e {
        LaunchError::Request(mut r) if r.field == "policy" && policy_files => {
            r.problem += "; in embedded mode you can also pass a path to a .toml file";
            LaunchError::Request(r)
        }
        e => e,
    })
}

#[async_trait]
impl Sandboxes for Embedded {
    async fn run(
        &self,
        asker: &Asker,
        req: RunRequest,
        serving: Option<Serving>,
        on_event: OnEvent<'_>,
        cancel: CancellationToken,
    ) -> Result<RunResult, RequestError> {
        let policy_name = req.policy_name().to_string();
        let refused = |f: JailFailure| Ok(RunResult::refused("", &policy_name, f));
        let _slot = match self.slot(&cancel).await {
            Ok(s) => s,
            Err(f) => return refused(f),
        };
        let launcher = match self.launcher() {
            Ok(l) => l,
            Err(f) => return refused(f),
        };
        if let Some(zygote) = self.zygote.get().filter(|_| serving.is_none()) {
            let warm = zygote.run(&req, self.patience, self.stopped(&cancel), on_event);
            if let Some(result) = warm.await {
                return Ok(result);
            }
        }
        // One stop path for the install and the run: a cancel, or the
        // service shutting down.
        let (stop, _forwarding) = self.stop_request(cancel);
        let (granted, stdio) = match serving {
            Some(s) => (s.granted, Some(s.stdio)),
            None => (Vec::new(), None),
        };
        let prepared = self
            .prepare(launcher, (req, granted), &stop, on_event)
            .await;
        let (mut prepared, ensured, grant) = match prepared {
            Ok(p) => p,
            Err(LaunchError::Request(e)) => return Err(e),
            Err(LaunchError::Refused(f)) => return refused(f),
        };
        if self.timings {
            prepared.mark_timings();
        }
        on_event(RunEvent::Step {
            what: "pycell: spec resolved, uid leased",
        });
        // Started from this async task, i.e. from a runtime worker thread
        // (or the thread that blocks on it), never from a blocking-pool
        // thread (see `Prepared::spawn_async`).
        let launched = match prepared.spawn_async(JailerStderr::Capture).await {
            Ok(l) => l,
            Err(result) => return Ok(*result),
        };
        on_event(RunEvent::Started {
            run_id: &launched.run_id,
            sandbox_uid: Some(launched.lease.uid),
        });
        let services = Services {
            stdio,
            ..Services::local(tool_service(grant, asker.tools.as_ref()))
        };
        let (mut result, _) = supervise(
            launched,
            self.patience,
            local::stopped(stop),
            services,
            |stream, bytes| on_event(RunEvent::Output { stream, bytes }),
        )
        .await;
        on_event(RunEvent::Step {
            what: "pycell: jailer ended, its uid given back",
        });
        // The env stayed in use (safe from removal) until here.
        result.env = ensured.map(|e| e.report);
        Ok(result)
    }

    async fn start_session(
        &self,
        asker: &Asker,
        req: SessionStartRequest,
    ) -> Result<SessionInfo, SessionFailure> {
        self.start_session_as(asker, req, None).await
    }

    async fn snapshot_session(
        &self,
        _asker: &Asker,
        handle: &str,
    ) -> Result<SnapshotInfo, SessionFailure> {
        let store = self.snapshot_store()?;
        let entry = self.session(handle)?;
        let held = (&*entry.info.policy, &entry.info.limits, &*entry.info.start);
        session_fork::snapshot(&entry.session, handle, held, store, &owner_key())
            .await
            .map_err(failed)
    }

    async fn fork_session(
        &self,
        asker: &Asker,
        handle: &str,
    ) -> Result<SessionForkInfo, SessionFailure> {
        let began = std::time::Instant::now();
        let source = self.session(handle)?;
        let started = self
            .start_session(asker, (*source.info.start).clone())
            .await?;
        let fork = self.session(&started.session)?;
        let held = &source.info;
        let carried =
            session_fork::fill_fork(&source.session, &fork.session, &held.policy, &held.limits)
                .await
                .map_err(|(code, m)| SessionFailure::new(code, m))?;
        Ok(session_fork::fork_info(
            started,
            handle,
            carried,
            began.elapsed(),
        ))
    }

    async fn session_call(
        &self,
        asker: &Asker,
        handle: &str,
        call: SessionCall,
        timeout_s: Option<f64>,
        cancel: CancellationToken,
        watch: Option<OutputSink>,
    ) -> Result<SessionAnswer, SessionFailure> {
        let (entry, resumed) = self.live_or_resumed(asker, handle).await?;
        let op = session_table::op_for(
            &entry.info.policy,
            entry.info.limits.max_output,
            call,
            timeout_s,
        )
        .map_err(|(code, m)| SessionFailure::new(code, m))?;
        let session = entry.session;
        let asked = session.request_watched(op, watch);
        tokio::pin!(asked);
        let answered = tokio::select! {
            a = &mut asked => a,
            _ = cancel.cancelled() => {
                session.interrupt();
                asked.await
            }
        };
        let answer = answered.map_err(|e| {
            let (code, message) = match self.table() {
                Ok(mut t) => t.call_failed(handle, e),
                Err(_) => (
                    FailureCode::Internal,
                    "the session table is poisoned".into(),
                ),
            };
            SessionFailure::new(code, message)
        })?;
        // Idle from the end of the call, not its start.
        if let Ok(mut t) = self.table() {
            t.touch(handle);
        }
        Ok(SessionAnswer { resumed, ..answer })
    }

    async fn end_session(
        &self,
        _asker: &Asker,
        handle: &str,
    ) -> Result<SessionEndInfo, SessionFailure> {
        let paused = self
            .table()
            .ok()
            .and_then(|mut t| t.forget_paused(&owner(), handle));
        if let Some(snapshot) = paused {
            let key = session_fork::paused_key(&owner_key());
            self.snapshot_store()?.remove(&key, &snapshot);
            return Ok(session_table::paused_end_info(handle));
        }
        let entry = self.session(handle)?;
        let ended = entry.session.end().await;
        if let Ok(mut t) = self.table() {
            t.forget(handle, ended.clone());
        }
        Ok(session_table::end_info(handle, &ended))
    }

    async fn list_sessions(&self, _asker: &Asker) -> Result<Vec<SessionSummary>, SessionFailure> {
        Ok(self
            .table()
            .map(|mut t| t.summaries(&owner()))
            .unwrap_or_default())
    }

    async fn describe_policy(
        &self,
        _asker: &Asker,
        name: &str,
    ) -> Result<PolicySummary, RequestError> {
        let launcher = self.launcher().map_err(|f| RequestError {
            field: "policy",
            problem: f.message,
        })?;
        let policy_files = self.policy_files;
        let name = name.to_string();
        let loaded = tokio::task::spawn_blocking(move || {
            let source = match super::policy_choice(policy_files, &name) {
                PolicyChoice::File(_) => "file",
                PolicyChoice::Name(n) => host_info::source_of(&launcher.policy_dir, n),
            };
            let policy = load_policy(&launcher, &name, policy_files)?;
            Ok::<_, LaunchError>(host_info::summary(policy, source))
        })
        .await;
        match loaded {
            Ok(Ok(summary)) => Ok(summary),
            Ok(Err(LaunchError::Request(e))) => Err(e),
            Ok(Err(LaunchError::Refused(f))) => Err(RequestError {
                field: "policy",
                problem: f.message,
            }),
            Err(e) => Err(RequestError {
                field: "policy",
                problem: format!("loading the policy: {e}"),
            }),
        }
    }

    fn mode(&self) -> String {
        super::mode_name(None)
    }

    fn takes_policy_files(&self) -> bool {
        self.policy_files
    }

    fn start_zygote(
        &self,
        policy: &str,
        slots: usize,
        rt: &tokio::runtime::Handle,
        stop: &CancellationToken,
    ) -> Result<(), JailFailure> {
        let launcher = self.launcher()?;
        let mut installer = Installer {
            handle: rt.clone(),
            stop: super::zygote::stop_request(rt, stop.clone()),
        };
        let forked = super::zygote::Forked::start(
            launcher,
            policy,
            self.policy_files,
            slots,
            &mut installer,
        )?;
        self.zygote.set(forked).map_err(|_| {
            JailFailure::new(
                FailureCode::Internal,
                Layer::Jailer,
                "a zygote was started already",
            )
        })
    }

    async fn end_all(&self, grace: Duration) {
        let all = self.table().map(|t| t.all()).unwrap_or_default();
        session_table::end_every(all, grace).await;
        // Its paused sessions end with it: their snapshots too.
        let paused = self
            .table()
            .map(|t| t.paused_snapshots())
            .unwrap_or_default();
        if let (false, Ok(store)) = (paused.is_empty(), self.snapshot_store()) {
            let key = session_fork::paused_key(&owner_key());
            for id in paused {
                store.remove(&key, &id);
            }
        }
        // Gone before we are, rather than after, by its parent-death
        // signal: its jailer takes a few milliseconds.
        if let Some(zygote) = self.zygote.get() {
            zygote.stop();
        }
    }
}

/// What [`prepare`] gives: the run, its env (held in use) and its tools.
type PreparedRun = (Prepared, Option<Ensured>, Option<ToolGrant>);

impl Embedded {
    /// [`prepare`] on a blocking thread (an install waits for the install
    /// jail, stopped by `stop`), its install steps to `on_event` as they
    /// come; a server's request comes with the descriptors of its grants.
    async fn prepare(
        &self,
        launcher: Launcher,
        (req, granted): (RunRequest, Vec<OwnedFd>),
        stop: &local::StopRequest,
        on_event: OnEvent<'_>,
    ) -> Result<PreparedRun, LaunchError> {
        let (tx, mut installing) = tokio::sync::mpsc::unbounded_channel::<String>();
        let install_stop = stop.clone();
        let policy_files = self.policy_files;
        let preparing = tokio::task::spawn_blocking(move || {
            let mut installer = Installer {
                handle: tokio::runtime::Handle::current(),
                stop: install_stop,
            };
            let mut progress = |m: &str| {
                let _ = tx.send(m.to_string());
            };
            prepare(
                &launcher,
                &req,
                granted,
                policy_files,
                &mut installer,
                &mut progress,
            )
        });
        tokio::pin!(preparing);
        let done = loop {
            tokio::select! {
                Some(message) = installing.recv() => on_event(RunEvent::Installing { message: &message }),
                done = &mut preparing => break done,
            }
        };
        done.unwrap_or_else(|e| {
            let m = format!("preparing the run: {e}");
            Err(LaunchError::Refused(JailFailure::new(
                FailureCode::Internal,
                Layer::Jailer,
                m,
            )))
        })
    }

    /// A run's stop request: set when `cancel` is cancelled or the service
    /// shuts down (forwarded for as long as the guard lives).
    fn stop_request(&self, cancel: CancellationToken) -> (local::StopRequest, AbortOnDrop) {
        let (stop_tx, stop) = tokio::sync::watch::channel(None);
        let stopped = self.stopped(&cancel);
        let forward = tokio::spawn(async move {
            let _ = stop_tx.send(Some(stopped.await));
        });
        (stop, AbortOnDrop(forward))
    }

    /// Resolves when `cancel` is cancelled or the service shuts down.
    fn stopped(
        &self,
        cancel: &CancellationToken,
    ) -> impl std::future::Future<Output = StoppedBy> + Send + 'static {
        let (cancel, shutdown) = (cancel.clone(), self.shutdown.clone());
        async move {
            tokio::select! {
                _ = cancel.cancelled() => StoppedBy::Request,
                _ = shutdown.cancelled() => StoppedBy::Shutdown,
            }
        }
    }

    /// Policy, env and spec for a session: blocking work, on a thread of
    /// its own (an install waits for the install jail).
    async fn prepare_session(
        &self,
        req: RunRequest,
    ) -> Result<(Prepared, Policy, Option<Ensured>, Option<ToolGrant>), SessionFailure> {
        let launcher = self.launcher().map_err(|f| SessionFailure::refused(&f))?;
        let stop = tokio::sync::watch::channel(None).1;
        let prepared = tokio::task::spawn_blocking(move || {
            let policy = launcher.load_policy(PolicyChoice::Name(req.policy_name()))?;
            if policy.session.per_uid == 0 {
                return Ok(Err(SessionFailure::new(
                    FailureCode::SessionsUnavailable,
                    session_table::no_sessions(&policy),
                )));
            }
            let mut installer = Installer {
                handle: tokio::runtime::Handle::current(),
                stop,
            };
            let (ensured, extras, grant) =
                env_and_tools(&launcher, &policy, &req, &mut installer, &mut |_| {})?;
            let prepared = launcher.prepare_session(&policy, &req, &extras)?;
            Ok::<_, LaunchError>(Ok((prepared, policy, ensured, grant)))
        })
        .await;
        match prepared {
            Ok(Ok(p)) => p,
            Ok(Err(LaunchError::Request(e))) => Err(SessionFailure::request(&e)),
            Ok(Err(LaunchError::Refused(f))) => Err(SessionFailure::refused(&f)),
            Err(e) => Err(SessionFailure::new(
                FailureCode::Internal,
                format!("preparing the session: {e}"),
            )),
        }
    }

    async fn launch_session(
        &self,
        prepared: Prepared,
        policy: &Policy,
        tools: Option<pycell_tools::service::ToolService>,
    ) -> Result<(Session, RunLimits), SessionFailure> {
        let limits = prepared.limits.clone();
        let egress = prepared.egress.clone();
        let launched = prepared
            .spawn_async(JailerStderr::Capture)
            .await
            .map_err(|r| {
                SessionFailure::new(
                    r.error.as_ref().map_or(FailureCode::Internal, |e| e.code),
                    r.error.map(|e| e.message).unwrap_or_default(),
                )
            })?;
        let services = Services {
            egress: egress.map(|rules| {
                (
                    pycell_egress::EgressConfig::from_env(&policy.name, rules),
                    None,
                )
            }),
            tools,
            stdio: None,
        };
        let timing = SessionTiming {
            ready_within: READY_WITHIN,
            lifetime: policy.session.lifetime,
        };
        let parts =
            SessionParts::embedded(launched, services, self.patience, timing).map_err(|r| {
                SessionFailure::new(
                    FailureCode::Internal,
                    r.error.map(|e| e.message).unwrap_or_default(),
                )
            })?;
        let session = Session::start(parts, READY_WITHIN, self.shutdown.child_token())
            .await
            .map_err(|e| SessionFailure::new(e.code(), e.message))?;
        Ok((session, limits))
    }

    /// Into the table (counted again as it goes in: another start may
    /// have finished meanwhile), out of it once it ends.
    async fn admit(
        &self,
        (session, limits): (Session, RunLimits),
        policy: Policy,
        ensured: Option<Ensured>,
        start: Arc<SessionStartRequest>,
        resume: Option<&str>,
    ) -> Result<SessionInfo, SessionFailure> {
        let policy = Arc::new(policy);
        let env = ensured.as_ref().map(|e| e.report.clone());
        let held = SessionHeld {
            policy: Arc::clone(&policy),
            limits: limits.clone(),
            _env: ensured.map(Arc::new),
            start,
        };
        let admitted = self
            .table()
            .ok()
            .and_then(|mut t| t.admit_as(resume, owner(), session.clone(), held));
        let Some(handle) = admitted else {
            session.end().await;
            return Err(too_many(&policy));
        };
        let (table, h) = (Arc::clone(&self.sessions), handle.clone());
        session_table::when_ended(session.clone(), move |ended| {
            if let Ok(mut t) = table.lock() {
                t.forget(&h, ended);
            }
        });
        Ok(session_table::session_info(
            handle, &session, &policy, limits, env,
        ))
    }
}

fn too_many(policy: &Policy) -> SessionFailure {
    let who = format!("uid {}", owner());
    SessionFailure::new(
        FailureCode::TooManySessions,
        session_table::too_many(&who, policy),
    )
}

fn gone(l: &Lookup, handle: &str) -> SessionFailure {
    let (code, message) = session_table::lookup_message(l, handle);
    SessionFailure::new(code, message)
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
    use crate::service::{Backend, RunService, Serving};
    use pycell_launch::supervisor::PATIENCE;
    use std::path::{Path, PathBuf};

    /// Embedded mode's launcher with `jailer` in place of pycell-jailer.
    fn with_jailer(jailer: PathBuf) -> Result<Launcher, JailFailure> {
        Launcher::embedded_from_env().map(|l| Launcher {
            jailer: Ok(jailer),
            ..l
        })
    }

    fn embedded(launcher: Result<Launcher, JailFailure>, patience: Patience) -> RunService {
        RunService::with_launcher(Backend::Embedded, launcher, patience, None)
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
        let b = embedded(with_jailer(jailer), PATIENCE);
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
        let b = embedded(with_jailer(jailer), patience);
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
        let b = embedded(with_jailer(jailer), PATIENCE);
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
        let b = embedded(
            with_jailer(PathBuf::from("/nonexistent/pycell-jailer")),
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
        let b = RunService::new(Backend::Embedded, None);
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

    /// A server's request as a client (no policy files) would send it.
    fn server(allow: &[&str]) -> RunRequest {
        RunRequest {
            code: "print(1)".into(),
            serve_stdio: true,
            allow: allow.iter().map(|a| a.to_string()).collect(),
            ..Default::default()
        }
    }

    async fn serve(b: &RunService, req: RunRequest) -> Result<RunResult, RequestError> {
        let (stdio, _socket) = tokio::sync::oneshot::channel();
        let serving = Serving {
            granted: Vec::new(),
            stdio,
        };
        b.serve(req, serving, |_| {}, CancellationToken::new())
            .await
    }

    #[tokio::test]
    async fn a_clients_server_only_narrows_its_policy_and_brings_a_descriptor_per_grant() {
        let b = RunService::new(Backend::Embedded, None);
        // `default` has no network: a client cannot give it one.
        let e = serve(&b, server(&["api.example.net"])).await.unwrap_err();
        assert_eq!(e.field, "allow", "{e}");
        assert!(e.problem.contains("has no network"), "{e}");
        let mut req = server(&[]);
        req.grants = vec![pycell_protocol::messages::PathGrant {
            target: "/srv/data".into(),
            writable: false,
        }];
        let e = serve(&b, req.clone()).await.unwrap_err();
        assert_eq!(e.field, "grants", "{e}");
        assert!(e.problem.contains("1 paths, but 0 descriptors"), "{e}");
        // A run is never a server, and a server is served.
        let e = b.run(req, |_| {}, CancellationToken::new()).await;
        assert_eq!(e.unwrap_err().field, "serve_stdio");
        let e = serve(&b, print1()).await.unwrap_err();
        assert_eq!(e.field, "serve_stdio");
    }
}
