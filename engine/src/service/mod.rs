//! The run service: where every front end (`pycell run`, `batch`,
//! `repl`, `mcp` over stdio or HTTP, the cluster front end) sends runs
//! and sessions.
//!
//! [`Sandboxes`] is what a place that runs code does: a run, and a
//! session's start, calls, end and listing. It has three implementations,
//! chosen once by [`Backend::choose`]:
//!
//! - [`embedded`]: this process jails each run itself (as root), through
//!   `pycell-jailer`, and holds its sessions;
//! - [`daemon`]: a pycelld client (no privilege needed here);
//! - [`in_cluster`]: the nodes of a cluster, each a pycelld
//!   ([`crate::cluster`] places and routes).
//!
//! [`RunService`] is what a front end holds: a backend, the runs in
//! flight (which [`RunService::shutdown`] cancels and waits for), and whom
//! and with which tools it asks ([`Asker`]). Cheap to clone.
//!
//! Threat model: requests come from clients (an LLM's choices) and are
//! untrusted: policies are chosen by name only, sizes are bounded, and the
//! jailer (or pycelld) checks the spec again. The event stream comes from
//! our own jailer (root) but carries the sandbox's output, so frames are
//! size-checked and output is capped again by the collector.

pub mod daemon;
pub mod detached;
pub mod embedded;
pub mod in_cluster;
mod zygote;

use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::{oneshot, watch};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

pub use pycell_launch::launcher::RequestError;
use pycell_launch::launcher::{Launcher, PolicyChoice};
pub use pycell_launch::session::OutputSink;
use pycell_launch::supervisor::{Patience, PATIENCE};
use pycell_protocol::client::{daemon_socket, ClientError};
use pycell_protocol::info::PolicySummary;
use pycell_protocol::messages::RunRequest;
use pycell_protocol::result::RunResult;
use pycell_protocol::session::{
    SessionAnswer, SessionCall, SessionEndInfo, SessionForkInfo, SessionInfo, SessionStartRequest,
    SessionSummary, SnapshotInfo,
};
use pycell_wire::codes::{FailureCode, Layer};
use pycell_wire::events::Stream;
use pycell_wire::report::JailFailure;

use crate::cluster::Nodes;
use crate::tool_source::ToolSource;

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
    /// A step of this process's own work for the run is done (what
    /// `--timings` marks).
    Step { what: &'static str },
}

/// Where a run's events go.
pub type OnEvent<'a> = &'a mut (dyn FnMut(RunEvent<'_>) + Send);

/// What a server over stdio is given besides its request (see
/// [`RunService::serve`]).
#[derive(Debug)]
pub struct Serving {
    /// The descriptors of the request's `grants`, in order, each opened by
    /// the front end on the host path it grants (so its user could reach
    /// it).
    pub granted: Vec<OwnedFd>,
    /// Where the socket of the server's stdin and stdout goes once its
    /// jail is up.
    pub stdio: oneshot::Sender<OwnedFd>,
}

/// A session call that could not be served; `code` is stable.
#[derive(Debug, Clone)]
pub struct SessionFailure {
    pub code: FailureCode,
    pub message: String,
}

impl SessionFailure {
    pub fn new(code: FailureCode, message: impl Into<String>) -> SessionFailure {
        SessionFailure {
            code,
            message: message.into(),
        }
    }

    /// A refusal, its hint included.
    pub fn refused(f: &JailFailure) -> SessionFailure {
        let mut message = f.message.clone();
        if let Some(h) = &f.hint {
            message.push_str(&format!(" ({h})"));
        }
        SessionFailure::new(f.code, message)
    }

    pub fn from_client(e: ClientError) -> SessionFailure {
        match e {
            ClientError::Refused { code, message } => SessionFailure::new(code.into(), message),
            ClientError::Failed(f) => SessionFailure::refused(&f),
            e @ ClientError::Connect { .. } => {
                SessionFailure::new(FailureCode::DaemonUnavailable, e.to_string())
            }
            e => SessionFailure::new(FailureCode::DaemonFailed, e.to_string()),
        }
    }

    /// A request the run service refused, in the terms MCP tools use.
    pub fn request(e: &RequestError) -> SessionFailure {
        SessionFailure::new(FailureCode::InvalidRequest, request_message(e))
    }
}

/// A request's problem, naming its field as the MCP tools spell it.
pub fn request_message(e: &RequestError) -> String {
    let field = match e.field {
        "timeout" => "timeout_s",
        other => other,
    };
    // Some messages name the field themselves ("timeout: must be...");
    // say it once.
    let problem = e
        .problem
        .strip_prefix(&format!("{}: ", e.field))
        .unwrap_or(&e.problem);
    format!("`{field}`: {problem}")
}

/// Who asks, and what they bring: whom pycelld is to treat the request as
/// from (a trusted front end's caller), and the tool servers offered to
/// the run.
#[derive(Debug, Clone, Default)]
pub struct Asker {
    pub identity: Option<Arc<str>>,
    pub tools: Option<Arc<dyn ToolSource>>,
    /// The terminal's ^C presses, counted: a daemon run passes each to
    /// its program as an interrupt (an embedded run's jailer is in the
    /// terminal's process group and gets ^C itself).
    pub ctrl_c: Option<watch::Receiver<u64>>,
}

/// What a front end lets its own user ask beyond what a client may: the
/// command line's user is this process's.
#[derive(Debug, Clone)]
pub struct Options {
    /// A run's policy may be a path to a .toml file (embedded runs only;
    /// through pycelld such a run is refused, saying so), and so a
    /// server's `allow` adds hosts to its policy, as such a file could,
    /// where a client's only narrows the policy's. Never for a client's
    /// request: a client names policies.
    pub policy_files: bool,
    /// Embedded runs at once; more wait for a slot.
    pub max_runs: usize,
    /// Each embedded run's steps marked in its result (`--timings`).
    pub timings: bool,
    /// The terminal's ^C presses (see [`Asker::ctrl_c`]).
    pub ctrl_c: Option<watch::Receiver<u64>>,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            policy_files: false,
            max_runs: embedded::MAX_CONCURRENT_RUNS,
            timings: false,
            ctrl_c: None,
        }
    }
}

/// How a run names its policy: by name, or (if the front end's user may)
/// by a path to a .toml file.
fn policy_choice(policy_files: bool, policy: &str) -> PolicyChoice<'_> {
    match policy_files {
        true => PolicyChoice::from_arg(policy),
        false => PolicyChoice::Name(policy),
    }
}

/// Why a run that names a policy file is refused through pycelld.
const POLICY_FILE_NEEDS_EMBEDDED: &str = "pycelld runs only the operator's policies (by name); a policy file needs embedded mode (--embedded, as root)";

/// A caller a trusted front end speaks for (pycelld checks its identity's
/// quotas and policies too; this process checks them first, where the
/// request arrives).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    /// Its name for pycelld.
    pub identity: Arc<str>,
    /// Whether its runs are offered the tool servers.
    pub tools: bool,
    /// The policies it may name.
    pub policies: Arc<[String]>,
    /// How the operator grants it more, said with a refusal.
    pub grant_hint: Arc<str>,
}

/// A policy a caller may not name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("policy {policy:?} is not one this caller may use (it may use: {}); {hint}", .allowed.join(", "))]
pub struct PolicyNotAllowed {
    pub policy: String,
    /// The policies it may name.
    pub allowed: Arc<[String]>,
    /// How the operator grants it more.
    pub hint: Arc<str>,
}

impl Caller {
    /// Whether it may run under `policy`.
    pub fn may_use(&self, policy: &str) -> Result<(), PolicyNotAllowed> {
        match self.policies.iter().any(|p| p == policy) {
            true => Ok(()),
            false => Err(PolicyNotAllowed {
                policy: policy.to_string(),
                allowed: Arc::clone(&self.policies),
                hint: Arc::clone(&self.grant_hint),
            }),
        }
    }
}

/// A place that runs code in sandboxes.
#[async_trait]
pub trait Sandboxes: Send + Sync + std::fmt::Debug {
    /// Run `req`, a server over stdio if `serving` is given. `on_event`
    /// sees the run start and its output as it arrives; cancelling
    /// `cancel` kills the sandbox (the result then says `killed`). A
    /// refused run is an `Ok` result with status `refused`; `Err` means
    /// the request itself is wrong.
    async fn run(
        &self,
        asker: &Asker,
        req: RunRequest,
        serving: Option<Serving>,
        on_event: OnEvent<'_>,
        cancel: CancellationToken,
    ) -> Result<RunResult, RequestError>;

    /// The policy `name`, as a run here would have it.
    async fn describe_policy(
        &self,
        asker: &Asker,
        name: &str,
    ) -> Result<PolicySummary, RequestError>;

    /// Start a session for `req` (its policy, dependencies and limits).
    async fn start_session(
        &self,
        asker: &Asker,
        req: SessionStartRequest,
    ) -> Result<SessionInfo, SessionFailure>;

    /// `call` in session `handle`, with the policy's clocks (the wall
    /// timeout `timeout_s`, if given). A cancelled call is interrupted
    /// (KeyboardInterrupt in a cell); its answer still comes. `watch`
    /// hears its output as it comes.
    async fn session_call(
        &self,
        asker: &Asker,
        handle: &str,
        call: SessionCall,
        timeout_s: Option<f64>,
        cancel: CancellationToken,
        watch: Option<OutputSink>,
    ) -> Result<SessionAnswer, SessionFailure>;

    /// End session `handle` and wait until its jail is gone.
    async fn end_session(
        &self,
        asker: &Asker,
        handle: &str,
    ) -> Result<SessionEndInfo, SessionFailure>;

    /// The asker's open sessions.
    async fn list_sessions(&self, asker: &Asker) -> Result<Vec<SessionSummary>, SessionFailure>;

    /// A new session of the asker's whose Python state and /workspace are
    /// a copy of session `handle`'s (`pycell_launch::session_fork`),
    /// started and admitted as any session (with the source's policy,
    /// limits and dependencies); the source goes on unchanged.
    async fn fork_session(
        &self,
        asker: &Asker,
        handle: &str,
    ) -> Result<SessionForkInfo, SessionFailure>;

    /// Keep session `handle`'s state in the snapshot store of the server
    /// that holds it, under the asker; `start_session` with
    /// `from_snapshot` starts a session from it.
    async fn snapshot_session(
        &self,
        asker: &Asker,
        handle: &str,
    ) -> Result<SnapshotInfo, SessionFailure>;

    /// `embedded`, `daemon (SOCKET)` or `cluster (nodes ...)`.
    fn mode(&self) -> String;

    /// Whether a run here may name a policy file (embedded, when the
    /// front end's [`Options::policy_files`] allows it).
    fn takes_policy_files(&self) -> bool {
        false
    }

    /// Start python once for `policy` (a zygote, `slots` runs at once)
    /// and fork the runs that name it from it. Blocking: call it from the
    /// thread that outlives the zygote, not a runtime's, with `rt` the
    /// runtime an install of its dependencies runs on; `stop` stops that
    /// install.
    fn start_zygote(
        &self,
        _policy: &str,
        _slots: usize,
        _rt: &tokio::runtime::Handle,
        _stop: &CancellationToken,
    ) -> Result<(), JailFailure> {
        Err(JailFailure::new(
            FailureCode::InvalidRequest,
            Layer::Request,
            "a zygote is started only by embedded mode (--embedded, as root)",
        ))
    }

    /// End what this process holds (its sessions), waiting at most
    /// `grace`; what pycelld holds outlives this process.
    async fn end_all(&self, _grace: Duration) {}
}

/// `daemon (SOCKET)` or `embedded`, as `info` and `sandbox_info` say.
pub fn mode_name(daemon_socket: Option<&std::path::Path>) -> String {
    match daemon_socket {
        Some(socket) => format!("daemon ({})", socket.display()),
        None => "embedded".to_string(),
    }
}

/// Where runs may go.
#[derive(Debug, Clone)]
pub enum Backend {
    /// Always jailed by this process (as root).
    Embedded,
    /// Always through the pycelld at this socket; never embedded.
    Daemon(PathBuf),
    /// Through pycelld when one is configured or listening (asked at each
    /// call), else embedded.
    Either,
    /// On the nodes of a cluster; never embedded.
    Cluster(Arc<Nodes>),
}

impl Backend {
    /// `--embedded` or not, `--socket PATH` or not (an empty path is
    /// none): the one place the embedded-or-daemon choice is made.
    pub fn choose(embedded: bool, socket: Option<PathBuf>) -> Backend {
        match (embedded, socket.filter(|s| !s.as_os_str().is_empty())) {
            (true, _) => Backend::Embedded,
            (false, Some(s)) => Backend::Daemon(s),
            (false, None) => Backend::Either,
        }
    }

    /// The same backend with its choice made now: [`Backend::Either`]
    /// becomes the pycelld listening now, or embedded (for a command whose
    /// calls must all go to one place).
    pub fn settled(self) -> Backend {
        match self {
            Backend::Either => match daemon_socket(None) {
                Some(socket) => Backend::Daemon(socket),
                None => Backend::Embedded,
            },
            other => other,
        }
    }

    /// The same choice for a command that runs once, made now: the socket
    /// of the pycelld its runs go to, or None: this process jails them.
    pub fn choose_now(embedded: bool, socket: Option<PathBuf>) -> Option<PathBuf> {
        match Backend::choose(embedded, socket).settled() {
            Backend::Daemon(s) => Some(s),
            _ => None,
        }
    }

    /// The backend; `launcher` is asked only where this process jails.
    fn build(
        self,
        launcher: impl FnOnce() -> Result<Launcher, JailFailure>,
        patience: Patience,
        options: &Options,
        shutdown: &CancellationToken,
    ) -> Arc<dyn Sandboxes> {
        let embedded = || embedded::Embedded::new(launcher(), patience, options, shutdown.clone());
        match self {
            Backend::Embedded => Arc::new(embedded()),
            Backend::Daemon(socket) => Arc::new(daemon::Daemon::new(socket, shutdown.clone())),
            Backend::Either => Arc::new(daemon::DaemonOr::new(embedded(), shutdown.clone())),
            Backend::Cluster(nodes) => Arc::new(in_cluster::Cluster::new(nodes, shutdown.clone())),
        }
    }
}

/// How a service is built besides its backend.
struct Built {
    patience: Patience,
    tools: Option<Arc<dyn ToolSource>>,
    options: Options,
}

#[derive(Debug)]
struct Shared {
    backend: Arc<dyn Sandboxes>,
    tracker: TaskTracker,
    shutdown: CancellationToken,
    /// Code mode: the client's tool servers (`--tool-servers`).
    tools: Option<Arc<dyn ToolSource>>,
    /// Whether the front end's user may name policy files.
    policy_files: bool,
    ctrl_c: Option<watch::Receiver<u64>>,
    /// Session cells left running past their call's wait.
    detached: detached::DetachedCells,
}

/// Runs and sessions, wherever they go. Cheap to clone; clones share one
/// set of runs in flight, which [`RunService::shutdown`] cancels and
/// waits for (sessions this process holds it ends).
#[derive(Debug, Clone)]
pub struct RunService {
    shared: Arc<Shared>,
    /// The caller this view's requests are for (a trusted front end's);
    /// None: this process's own user.
    caller: Option<Arc<Caller>>,
}

impl RunService {
    /// Runs go where `backend` says, offered the tools of `tools`.
    /// Embedded mode's configuration comes from the environment
    /// (`PYCELL_JAILER`, `PYCELL_UID_RANGE`); its problems are reported by
    /// each run, as a refusal, so that a server still starts and can
    /// explain.
    pub fn new(backend: Backend, tools: Option<Arc<dyn ToolSource>>) -> RunService {
        RunService::with_options(backend, tools, Options::default())
    }

    /// The same, with what the front end's own user may ask besides.
    pub fn with_options(
        backend: Backend,
        tools: Option<Arc<dyn ToolSource>>,
        options: Options,
    ) -> RunService {
        let built = Built {
            patience: PATIENCE,
            tools,
            options,
        };
        RunService::built(backend, Launcher::embedded_from_env, built)
    }

    /// The same with a given launcher and patience (tests).
    pub fn with_launcher(
        backend: Backend,
        launcher: Result<Launcher, JailFailure>,
        patience: Patience,
        tools: Option<Arc<dyn ToolSource>>,
    ) -> RunService {
        let built = Built {
            patience,
            tools,
            options: Options::default(),
        };
        RunService::built(backend, move || launcher, built)
    }

    fn built(
        backend: Backend,
        launcher: impl FnOnce() -> Result<Launcher, JailFailure>,
        built: Built,
    ) -> RunService {
        let shutdown = CancellationToken::new();
        let Built {
            patience,
            tools,
            options,
        } = built;
        RunService {
            caller: None,
            shared: Arc::new(Shared {
                backend: backend.build(launcher, patience, &options, &shutdown),
                tracker: TaskTracker::new(),
                shutdown,
                tools,
                policy_files: options.policy_files,
                ctrl_c: options.ctrl_c,
                detached: detached::DetachedCells::default(),
            }),
        }
    }

    /// Start the zygote of `policy` (see [`Sandboxes::start_zygote`]).
    pub fn start_zygote(
        &self,
        policy: &str,
        slots: usize,
        rt: &tokio::runtime::Handle,
        stop: &CancellationToken,
    ) -> Result<(), JailFailure> {
        self.shared.backend.start_zygote(policy, slots, rt, stop)
    }

    /// The client's tool servers, if it configured any and this view
    /// offers them.
    pub fn tool_servers(&self) -> Option<&Arc<dyn ToolSource>> {
        let offered = self.caller.as_ref().is_none_or(|c| c.tools);
        self.shared.tools.as_ref().filter(|_| offered)
    }

    /// The same service, with requests for `caller` (pycelld refuses an
    /// identity unless this process is one of its trusted front ends).
    pub fn speaking_for(&self, caller: Arc<Caller>) -> RunService {
        RunService {
            shared: Arc::clone(&self.shared),
            caller: Some(caller),
        }
    }

    /// The caller this view speaks for, if any.
    pub fn caller(&self) -> Option<&Arc<Caller>> {
        self.caller.as_ref()
    }

    /// Whether this view's caller may name `policy`; no caller: any (the
    /// backend still refuses a policy it does not have).
    pub fn may_use(&self, policy: &str) -> Result<(), PolicyNotAllowed> {
        match &self.caller {
            Some(c) => c.may_use(policy),
            None => Ok(()),
        }
    }

    /// `daemon (SOCKET)`, `cluster (...)` or `embedded`.
    pub fn mode(&self) -> String {
        self.shared.backend.mode()
    }

    fn asker(&self) -> Asker {
        Asker {
            identity: self.caller.as_ref().map(|c| c.identity.clone()),
            tools: self.tool_servers().cloned(),
            ctrl_c: self.shared.ctrl_c.clone(),
        }
    }

    /// Run `req` (see [`Sandboxes::run`]), offered the tool servers.
    pub async fn run(
        &self,
        req: RunRequest,
        on_event: impl FnMut(RunEvent<'_>) + Send,
        cancel: CancellationToken,
    ) -> Result<RunResult, RequestError> {
        self.start(req, None, on_event, cancel).await
    }

    /// Serve `req` (`serve_stdio` set): a run whose program's stdin and
    /// stdout are a socket, sent to `serving.stdio` once the jail is up;
    /// its result comes when it ends. Its grants are bound in from the
    /// descriptors of `serving.granted`.
    pub async fn serve(
        &self,
        req: RunRequest,
        serving: Serving,
        on_event: impl FnMut(RunEvent<'_>) + Send,
        cancel: CancellationToken,
    ) -> Result<RunResult, RequestError> {
        self.start(req, Some(serving), on_event, cancel).await
    }

    /// A run or (with `serving`) a server, checked, then where the backend
    /// runs it, tracked; a run is offered the tool servers.
    async fn start(
        &self,
        mut req: RunRequest,
        serving: Option<Serving>,
        mut on_event: impl FnMut(RunEvent<'_>) + Send,
        cancel: CancellationToken,
    ) -> Result<RunResult, RequestError> {
        let serves = req.serve_stdio || !req.grants.is_empty();
        if serves != serving.is_some() {
            let problem = match serving {
                None => "a run's program has no socket for its stdio and no granted paths; a server over stdio is served (pycell mcp-server)",
                Some(_) => "only a server over stdio (serve_stdio) is served",
            };
            return Err(RequestError {
                field: "serve_stdio",
                problem: problem.into(),
            });
        }
        if let Some(refused) = self.refused(&req)? {
            return Ok(refused);
        }
        let asker = self.asker();
        if let (Some(servers), None) = (&asker.tools, &serving) {
            req.tools = Some(servers.catalog().await.into());
        }
        let run = self
            .shared
            .backend
            .run(&asker, req, serving, &mut on_event, cancel);
        self.shared.tracker.track_future(run).await
    }

    /// The policy `name` as a run here would have it (a path to a .toml
    /// file, where the front end's user may name one and runs are
    /// embedded).
    pub async fn policy(&self, name: &str) -> Result<PolicySummary, RequestError> {
        self.may_use(name).map_err(|e| RequestError {
            field: "policy",
            problem: e.to_string(),
        })?;
        if self.policy_file_unusable(name) {
            return Err(RequestError {
                field: "policy",
                problem: POLICY_FILE_NEEDS_EMBEDDED.into(),
            });
        }
        self.shared
            .backend
            .describe_policy(&self.asker(), name)
            .await
    }

    /// Whether a server's `allow` adds hosts to its policy here (embedded,
    /// for the front end's own user, who may name policy files) rather
    /// than narrowing it.
    pub fn widens_allow(&self) -> bool {
        self.shared.policy_files && self.shared.backend.takes_policy_files()
    }

    /// Whether `name` is a policy file the front end's user may name but
    /// the backend cannot take.
    fn policy_file_unusable(&self, name: &str) -> bool {
        let file = matches!(PolicyChoice::from_arg(name), PolicyChoice::File(_));
        file && self.shared.policy_files && !self.shared.backend.takes_policy_files()
    }

    /// Why `req` is not to run at all: a policy its caller may not name
    /// (`Err`), or a policy file where the backend cannot take one (the
    /// run's refusal).
    fn refused(&self, req: &RunRequest) -> Result<Option<RunResult>, RequestError> {
        self.may_use(req.policy_name()).map_err(|e| RequestError {
            field: "policy",
            problem: e.to_string(),
        })?;
        Ok(self.policy_file_refused(req))
    }

    /// A policy file where the front end's user may name one but the
    /// backend cannot take it: the run's refusal.
    fn policy_file_refused(&self, req: &RunRequest) -> Option<RunResult> {
        let name = req.policy_name();
        self.policy_file_unusable(name).then(|| {
            let f = JailFailure::new(
                FailureCode::InvalidPolicy,
                Layer::Daemon,
                POLICY_FILE_NEEDS_EMBEDDED,
            );
            RunResult::refused("", name, f)
        })
    }

    /// Start a session (see [`Sandboxes::start_session`]).
    pub async fn start_session(
        &self,
        mut req: SessionStartRequest,
    ) -> Result<SessionInfo, SessionFailure> {
        let not_allowed =
            |e: PolicyNotAllowed| SessionFailure::new(FailureCode::InvalidRequest, e.to_string());
        // A snapshot names its policy: checked once the session says it.
        let restoring = req.from_snapshot.is_some();
        if !restoring {
            self.may_use(req.policy_name()).map_err(not_allowed)?;
        }
        let asker = self.asker();
        if let Some(servers) = &asker.tools {
            req.tools = Some(servers.catalog().await.into());
        }
        let info = self.shared.backend.start_session(&asker, req).await?;
        if let (true, Err(e)) = (restoring, self.may_use(&info.policy)) {
            let _ = self.shared.backend.end_session(&asker, &info.session).await;
            return Err(not_allowed(e));
        }
        Ok(info)
    }

    /// A call in a session (see [`Sandboxes::session_call`]).
    pub async fn session_call(
        &self,
        handle: &str,
        call: SessionCall,
        timeout_s: Option<f64>,
        cancel: CancellationToken,
    ) -> Result<SessionAnswer, SessionFailure> {
        self.session_call_watched(handle, call, timeout_s, cancel, None)
            .await
    }

    /// [`RunService::session_call`], its output heard by `watch`.
    pub async fn session_call_watched(
        &self,
        handle: &str,
        call: SessionCall,
        timeout_s: Option<f64>,
        cancel: CancellationToken,
        watch: Option<OutputSink>,
    ) -> Result<SessionAnswer, SessionFailure> {
        self.shared
            .backend
            .session_call(&self.asker(), handle, call, timeout_s, cancel, watch)
            .await
    }

    /// A cell in session `handle` that the call waits for at most `wait`
    /// (see [`detached`]): past it the cell goes on, detached, and the
    /// session's next call here collects its answer instead of running
    /// its own code.
    pub async fn cell_within(
        &self,
        handle: &str,
        code: String,
        timeout_s: Option<f64>,
        cancel: CancellationToken,
        wait: Duration,
        watch: Option<OutputSink>,
    ) -> detached::CellTurn {
        let key = self.detached_key(handle);
        if let Some(turn) = self.shared.detached.collect(&key, wait, &cancel).await {
            return turn;
        }
        let service = self.clone();
        let handle = handle.to_string();
        let cell = move |stop| {
            let call = SessionCall::Cell { code };
            let tracker = service.shared.tracker.clone();
            tracker.spawn(async move {
                service
                    .session_call_watched(&handle, call, timeout_s, stop, watch)
                    .await
            })
        };
        self.shared.detached.run(key, cell, wait, &cancel).await
    }

    fn detached_key(&self, handle: &str) -> (Option<Arc<str>>, String) {
        let identity = self.caller.as_ref().map(|c| Arc::clone(&c.identity));
        (identity, handle.to_string())
    }

    pub async fn end_session(&self, handle: &str) -> Result<SessionEndInfo, SessionFailure> {
        self.shared.detached.drop_cell(&self.detached_key(handle));
        self.shared.backend.end_session(&self.asker(), handle).await
    }

    pub async fn list_sessions(&self) -> Result<Vec<SessionSummary>, SessionFailure> {
        self.shared.backend.list_sessions(&self.asker()).await
    }

    /// Snapshot session `handle` (see [`Sandboxes::snapshot_session`]).
    pub async fn snapshot_session(&self, handle: &str) -> Result<SnapshotInfo, SessionFailure> {
        let asker = self.asker();
        self.shared.backend.snapshot_session(&asker, handle).await
    }

    /// Fork session `handle` (see [`Sandboxes::fork_session`]).
    pub async fn fork_session(&self, handle: &str) -> Result<SessionForkInfo, SessionFailure> {
        self.shared
            .backend
            .fork_session(&self.asker(), handle)
            .await
    }

    /// Cancel every run in flight (their results say `killed`) and refuse
    /// new ones.
    pub fn cancel_all(&self) {
        self.shared.shutdown.cancel();
        self.shared.detached.stop_all();
    }

    /// Cancel every run in flight, end every session this process holds,
    /// and wait (at most `grace`) for their jails to be cleaned up. New
    /// runs are refused afterwards.
    pub async fn shutdown(&self, grace: Duration) {
        self.shared.shutdown.cancel();
        self.shared.detached.stop_all();
        self.shared.tracker.close();
        let runs = tokio::time::timeout(grace, self.shared.tracker.wait());
        let (_, ()) = tokio::join!(runs, self.shared.backend.end_all(grace));
    }
}

/// Resolves when the call is cancelled or the service shuts down.
async fn stopped(cancel: &CancellationToken, shutdown: &CancellationToken) {
    tokio::select! {
        _ = cancel.cancelled() => {}
        _ = shutdown.cancelled() => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn caller_of_default() -> Arc<Caller> {
        Arc::new(Caller {
            identity: "ci-bot".into(),
            tools: false,
            policies: vec!["default".to_string()].into(),
            grant_hint: "ask the operator".into(),
        })
    }

    #[tokio::test]
    async fn a_caller_is_held_to_its_policies_before_anything_runs() {
        // Runs would go to a pycelld that is not there: a request that got
        // past the check would come back refused, not as the caller's
        // mistake.
        let service = RunService::new(Backend::Daemon("/nonexistent/pycell.sock".into()), None);
        let view = service.speaking_for(caller_of_default());
        let req = RunRequest {
            code: "print(1)".into(),
            policy: Some("network".into()),
            ..Default::default()
        };
        let e = view
            .run(req, |_| {}, CancellationToken::new())
            .await
            .unwrap_err();
        assert_eq!(e.field, "policy");
        assert!(
            e.problem.contains("it may use: default") && e.problem.ends_with("ask the operator"),
            "{e}"
        );
        let start = SessionStartRequest {
            policy: Some("network".into()),
            ..Default::default()
        };
        let f = view.start_session(start).await.unwrap_err();
        assert_eq!(f.code, FailureCode::InvalidRequest, "{f:?}");
        assert!(view.may_use("default").is_ok());
        // The service itself (no caller) may name any policy.
        assert!(service.may_use("network").is_ok());
    }
}
