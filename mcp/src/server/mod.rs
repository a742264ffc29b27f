//! `pycell mcp`: the stdio MCP server that agents' MCP clients launch.
//!
//! It speaks MCP with the official Rust SDK (`rmcp`) on stdin/stdout, offers
//! the `run_python` and `sandbox_info` tools, and hands each run to the
//! [`RunService`]. While a run goes it sends progress notifications if the
//! client asked for them; a client's `notifications/cancelled` kills the
//! run's sandbox. At the end of stdin it cancels what is still running,
//! waits for the sandboxes to be cleaned up, and exits.
//!
//! Threat model: the client (and the LLM behind it) is untrusted as far as
//! the sandbox goes: tool arguments are checked here, again when the run is
//! prepared, and by the jailer, and nothing it sends runs outside a sandbox. This
//! process holds no privilege beyond what embedded mode needs to start the
//! jailer; with the daemon it needs none.

pub(crate) mod cancels;
mod cell_output;
mod eof;
pub(crate) mod handoff;
pub(crate) mod jsonrpc;
mod output;
pub(crate) mod session_tools;
mod stdio;
pub(crate) mod tools;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, CancelTaskParams, ContentBlock,
    CustomRequest, CustomResult, GetTaskParams, GetTaskResult, Implementation, ListToolsResult,
    PaginatedRequestParams, ProgressNotificationParam, ProgressToken, ServerCapabilities,
    ServerConfig, Tool,
};
use rmcp::service::{Peer, RequestContext, ServerInitializeError};
use rmcp::{ErrorData as McpError, RoleServer, ServerHandler, ServiceExt};
use tokio_util::sync::CancellationToken;

use pycell_launch::resolve::POLICY_DIR;
use pycell_wire::events::Stream;

use crate::args::McpArgs;
use crate::tool_servers::ToolServers;
use output::{human_bytes, RunPythonOutput};
use pycell_engine::service::{Backend, OutputSink, RunEvent, RunService};
use pycell_engine::tool_source::ToolSource;
use pycell_protocol::info::ToolsInfo;

/// How often a run with a progress token reports progress.
const PROGRESS_EVERY: Duration = Duration::from_secs(1);
/// The most of a run's newest output a progress notification carries.
const PROGRESS_TAIL: usize = 240;
/// How long, after stdin ends, runs still going get to be killed and cleaned up.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

const INSTRUCTIONS: &str = "pycell runs Python code in a locked-down Linux sandbox: call run_python with the code (each call is a fresh sandbox with no state from earlier calls and no network beyond the hosts its policy allowlists; print what you want to see). For work that builds up over several steps, call session_start and pass its handle as run_python's `session`: variables, imports and files then persist between calls, a cell's last expression is shown, and matplotlib figures come back as images; move files with write_file, read_file and list_files, and call session_end when done; session_fork branches a session (a copy of its variables and files, in a sandbox of its own) to try something without losing what you have, and session_snapshot keeps its state for a later session_start with from_snapshot. Call sandbox_info to see the policies (limits, network) you can choose and what isolation this host enforces.";

/// The tools that run code or touch a session: over HTTP they need the
/// `pycell:run` scope and count in the caller's quotas.
pub(crate) const CODE_TOOLS: [&str; 8] = [
    tools::RUN_PYTHON,
    session_tools::SESSION_START,
    session_tools::WRITE_FILE,
    session_tools::READ_FILE,
    session_tools::LIST_FILES,
    session_tools::SESSION_END,
    session_tools::SESSION_FORK,
    session_tools::SESSION_SNAPSHOT,
];

/// The layer in front of the server that says who makes each call (over
/// HTTP: its authentication, which leaves the caller in the request) and
/// whether a call that runs code may go now (its quotas). The server
/// knows nothing else of it.
pub trait Gate: Send + Sync + std::fmt::Debug {
    /// The caller of the request whose HTTP `parts` these are, and, if
    /// the call `runs_code`, its place in the caller's quotas, held until
    /// the guard is dropped.
    fn enter(
        &self,
        parts: Option<&http::request::Parts>,
        runs_code: bool,
    ) -> Result<Entered, Turned>;
}

/// A call the gate let in.
pub struct Entered {
    pub caller: Arc<pycell_engine::service::Caller>,
    /// Held while the call goes (its place in the caller's quotas).
    pub held: Option<Box<dyn Send>>,
}

impl std::fmt::Debug for Entered {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Entered")
            .field("caller", &self.caller)
            .field("held", &self.held.is_some())
            .finish()
    }
}

/// A call the gate turned away.
#[derive(Debug)]
pub enum Turned {
    /// The request came without the caller the layer in front leaves.
    NoCaller,
    /// Over the caller's quotas: what to say.
    Quota(String),
}

/// The MCP server: its tools and where runs go.
#[derive(Debug, Clone)]
pub struct PycellServer {
    sandboxes: RunService,
    default_policy: String,
    tools: Arc<Vec<Tool>>,
    /// Over authenticated HTTP: every call must come with its caller
    /// (`pycell mcp --http` puts it in the request), whose quotas the gate
    /// counts. None: stdio, or HTTP without authentication.
    gate: Option<Arc<dyn Gate>>,
    /// Over HTTP: the calls in flight, for the front end to cancel when
    /// their caller sends `notifications/cancelled` (stdio: rmcp pairs them).
    cancels: Option<Arc<cancels::Cancels>>,
    /// Calls that outlive their wait: tasks, detached cells.
    handoff: handoff::Handoff,
}

impl PycellServer {
    pub fn new(
        sandboxes: RunService,
        default_policy: String,
        code_mode: Option<&ToolsInfo>,
    ) -> Self {
        let policy = pycell_launch::resolve::load_policy_by_name(
            &default_policy,
            std::path::Path::new(POLICY_DIR),
        )
        .ok();
        let mut tools = tools::tools(&default_policy, policy.as_ref(), code_mode);
        tools.extend(session_tools::session_tools());
        PycellServer {
            sandboxes,
            default_policy,
            tools: Arc::new(tools),
            gate: None,
            cancels: None,
            handoff: handoff::Handoff::default(),
        }
    }

    /// The same server, handing off calls still going after `after`.
    pub fn with_hand_off_after(mut self, after: Duration) -> Self {
        self.handoff = handoff::Handoff::after(after);
        self
    }

    /// The same server, keeping its calls where `cancels` can cancel them.
    pub fn with_cancels(mut self, cancels: Arc<cancels::Cancels>) -> Self {
        self.cancels = Some(cancels);
        self
    }

    /// The same server, requiring a caller on every call (see `gate`).
    pub fn with_gate(mut self, gate: Arc<dyn Gate>) -> Self {
        self.gate = Some(gate);
        self
    }

    /// Whether this view's caller may name `policy` (the server's default
    /// when None): the run service's check, made before anything else.
    pub(super) fn may_use(
        &self,
        policy: Option<&str>,
    ) -> Result<(), pycell_engine::service::PolicyNotAllowed> {
        self.sandboxes
            .may_use(policy.unwrap_or(&self.default_policy))
    }

    /// This server as the HTTP caller of `context` may use it: its
    /// identity's sandboxes (tool servers only with `pycell:tools`), and for
    /// a tool that runs code, a place in its quotas.
    fn as_caller(
        &self,
        tool: &str,
        context: &RequestContext<RoleServer>,
    ) -> Result<(PycellServer, Option<Box<dyn Send>>), CallToolResult> {
        let Some(gate) = &self.gate else {
            return Ok((self.clone(), None));
        };
        let parts = context.extensions.get::<http::request::Parts>();
        match gate.enter(parts, CODE_TOOLS.contains(&tool)) {
            Ok(Entered { caller, held }) => {
                let mut view = self.clone();
                view.sandboxes = self.sandboxes.speaking_for(caller);
                Ok((view, held))
            }
            Err(Turned::NoCaller) => Err(internal_error(
                "the call came without an authenticated caller; refused",
            )),
            Err(Turned::Quota(m)) => Err(CallToolResult::error(vec![ContentBlock::text(format!(
                "{tool} was not run: {m}"
            ))])),
        }
    }

    /// The identity of the HTTP caller of `context` (None: stdio, or HTTP
    /// without authentication), for the tasks it owns.
    fn caller_identity(&self, context: &RequestContext<RoleServer>) -> Option<Arc<str>> {
        let gate = self.gate.as_ref()?;
        let parts = context.extensions.get::<http::request::Parts>();
        gate.enter(parts, false)
            .ok()
            .map(|e| e.caller.identity.clone())
    }

    /// `run_python`: a run or a cell, answered when it ends, or handed off
    /// (a task, a detached cell) when it outlives the wait.
    async fn run_python(
        &self,
        params: CallToolRequestParams,
        context: RequestContext<RoleServer>,
        held: Option<Box<dyn Send>>,
    ) -> CallToolResponse {
        let call = match tools::run_python_call(params.arguments, &self.default_policy) {
            Ok(call) => call,
            Err(e) => return argument_error(&e.0).into(),
        };
        let progress = Arc::new(Progress::default());
        let handed_off = CancellationToken::new();
        let stop = CancellationToken::new();
        let reporter = Reporter::of(&context, &handed_off);
        let (server, stop_run, shown) = (self.clone(), stop.clone(), Arc::clone(&progress));
        let (answer, ceiling): (handoff::Answer, _) = match call {
            tools::RunPythonCall::Run(req) => {
                if let Err(m) = self.may_use(req.policy.as_deref()) {
                    return argument_error(&m.to_string()).into();
                }
                let ceiling = CeilingOf::Run {
                    timeout_s: req.limits.timeout_s,
                    policy: req.policy_name().to_string(),
                };
                let run = async move { server.run_once(*req, shown, stop_run).await };
                (
                    Box::pin(with_progress(run, reporter, progress.clone())),
                    ceiling,
                )
            }
            tools::RunPythonCall::Cell {
                session,
                code,
                timeout,
            } => {
                progress.label_cell(&session);
                let heard = Arc::clone(&progress);
                let watch: OutputSink =
                    Arc::new(move |stream, bytes| heard.record(RunEvent::Output { stream, bytes }));
                let wait = match handoff::client_takes_tasks(&context) {
                    true => handoff::NO_DETACH,
                    false => self.handoff.wait(),
                };
                let ceiling = CeilingOf::Cell {
                    timeout_s: timeout.map(|t| t.as_secs_f64()),
                    session: session.clone(),
                };
                let cell = async move {
                    let asked = session_tools::CellAsked {
                        session: &session,
                        code,
                        timeout,
                        wait,
                        watch: Some(watch),
                    };
                    server.run_cell(asked, stop_run).await
                };
                (
                    Box::pin(with_progress(cell, reporter, progress.clone())),
                    ceiling,
                )
            }
        };
        let work = handoff::Work {
            answer,
            stop,
            handed_off,
            status: Arc::new(move |elapsed| progress.status(elapsed)),
            ceiling: Box::pin(self.clone().ceiling(ceiling)),
            held,
        };
        let owner = self.caller_identity(&context);
        self.handoff.answer(work, &context, owner).await
    }

    /// A one-shot run, its events recorded in `progress`.
    async fn run_once(
        &self,
        req: pycell_protocol::messages::RunRequest,
        progress: Arc<Progress>,
        stop: CancellationToken,
    ) -> CallToolResult {
        let on_event = move |ev: RunEvent<'_>| progress.record(ev);
        match self.sandboxes.run(req, on_event, stop).await {
            Ok(r) => {
                let images = cell_output::media_content(&r.images, &r.displays);
                RunPythonOutput::from(r).tool_result(images)
            }
            Err(e) => argument_error(&pycell_engine::service::request_message(&e)),
        }
    }

    /// How long the call may run at most: its `timeout_s`, else its
    /// policy's wall timeout (a session's: the policy it was started
    /// with); the longest a policy may have if neither can be found.
    async fn ceiling(self, of: CeilingOf) -> Duration {
        let (given, policy) = match of {
            CeilingOf::Run { timeout_s, policy } => (timeout_s, Some(policy)),
            CeilingOf::Cell { timeout_s, session } => {
                let sessions = self.sandboxes.list_sessions().await.unwrap_or_default();
                let policy = sessions.into_iter().find(|s| s.session == session);
                (timeout_s, policy.map(|s| s.policy))
            }
        };
        if let Some(t) = given {
            return Duration::from_secs_f64(t);
        }
        let Some(policy) = policy else {
            return pycell_policy::MAX_WALL_TIMEOUT;
        };
        match self.sandboxes.policy(&policy).await {
            Ok(p) => p.limits.wall_timeout,
            Err(_) => pycell_policy::MAX_WALL_TIMEOUT,
        }
    }

    async fn sandbox_info(&self) -> CallToolResult {
        let mode = self.sandboxes.mode();
        let code_mode = match self.sandboxes.tool_servers() {
            Some(servers) => Some(code_mode(servers.as_ref(), &self.default_policy).await),
            None => None,
        };
        match tokio::task::spawn_blocking(move || pycell_engine::local::host_info(mode)).await {
            Ok(mut info) => {
                info.tools = code_mode;
                let text = render_info(&info);
                match serde_json::to_value(&info) {
                    Ok(v) => {
                        let mut r = CallToolResult::structured(v);
                        r.content = vec![ContentBlock::text(text)];
                        r
                    }
                    Err(e) => internal_error(&format!("cannot encode the report: {e}")),
                }
            }
            Err(e) => internal_error(&format!("measuring the host failed: {e}")),
        }
    }
}

/// A tool error the model can act on (MCP: a result with isError, so that
/// the client shows the message to the model rather than a protocol error).
fn argument_error(message: &str) -> CallToolResult {
    CallToolResult::error(vec![ContentBlock::text(format!(
        "run_python was not run: {message}"
    ))])
}

/// pycell's own failure (not the caller's, not the code's).
fn internal_error(message: &str) -> CallToolResult {
    CallToolResult::error(vec![ContentBlock::text(format!(
        "pycell mcp failed: {message}"
    ))])
}

fn render_info(info: &pycell_protocol::info::HostInfo) -> String {
    let mut t = format!(
        "pycell {} ({} mode)\n\npolicies:\n",
        info.version, info.mode
    );
    for p in &info.policies {
        if !p.for_code() {
            let m = format!(
                "  {}: {} (purpose {}: not for run_python or sessions)\n",
                p.name, p.description, p.purpose
            );
            t.push_str(&m);
            continue;
        }
        let (l, m) = (&p.limits, &p.max);
        t.push_str(&format!(
            "  {}: {} network: {}; limits: {} s wall (timeout_s up to {} s), {} s CPU, {} memory, {} processes, {} output per stream, {} disk\n",
            p.name,
            p.description,
            p.network_label(),
            l.wall_timeout.as_secs_f64(),
            m.wall_timeout.as_secs_f64(),
            l.cpu_time.as_secs_f64(),
            human_bytes(l.memory.get()),
            l.pids,
            human_bytes(l.max_output.get()),
            human_bytes(l.disk.get()),
        ));
    }
    for p in &info.policy_problems {
        t.push_str(&format!("  {}: does not load: {}\n", p.name, p.message));
    }
    t.push_str("\nisolation layers on this host:\n");
    for l in &info.layers {
        t.push_str(&format!(
            "  {}: {} ({})\n",
            l.layer,
            if l.available { "yes" } else { "NO" },
            l.detail
        ));
    }
    if let Some(tools) = &info.tools {
        t.push_str("\ntools the code may call (import pycell_tools):\n");
        for line in &tools.callable {
            t.push_str(&format!("  {line}\n"));
        }
        for why in &tools.unavailable {
            t.push_str(&format!("  unavailable: {why}\n"));
        }
    }
    t
}

/// What a call's time ceiling is found from.
enum CeilingOf {
    Run {
        timeout_s: Option<f64>,
        policy: String,
    },
    Cell {
        timeout_s: Option<f64>,
        session: String,
    },
}

/// Where a call's progress notifications go: the client that asked for
/// them with a progress token, until the call is handed off.
struct Reporter {
    peer: Peer<RoleServer>,
    token: ProgressToken,
    handed_off: CancellationToken,
}

impl Reporter {
    fn of(context: &RequestContext<RoleServer>, handed_off: &CancellationToken) -> Option<Self> {
        Some(Reporter {
            peer: context.peer.clone(),
            token: context.meta.get_progress_token()?,
            handed_off: handed_off.clone(),
        })
    }

    /// Reports `progress` until the call is handed off. Never returns.
    async fn report(self, progress: Arc<Progress>) -> std::convert::Infallible {
        tokio::select! {
            never = report_progress(self.peer, self.token, progress) => never,
            () = self.handed_off.cancelled() => std::future::pending().await,
        }
    }
}

/// `work`, with its progress reported by `reporter` meanwhile (in the
/// same task: the reporter stops when the work does).
async fn with_progress<T>(
    work: impl std::future::Future<Output = T>,
    reporter: Option<Reporter>,
    progress: Arc<Progress>,
) -> T {
    match reporter {
        None => work.await,
        Some(r) => tokio::select! {
            done = work => done,
            never = r.report(progress) => match never {},
        },
    }
}

/// What a run has done so far, for progress notifications.
#[derive(Debug, Default)]
struct Progress {
    started: tokio::sync::Notify,
    sandbox: Mutex<Option<(String, Option<u32>)>>,
    /// Place in pycelld's queue while the run waits for a slot (0: not waiting).
    queued: AtomicU64,
    stdout_bytes: AtomicU64,
    stderr_bytes: AtomicU64,
    /// The latest message of the install of the run's dependencies.
    installing: Mutex<Option<String>>,
    /// Install steps not yet sent, each worth a notification of its own.
    notes: Mutex<Vec<String>>,
    news: tokio::sync::Notify,
    /// The end of the output that came since the last notification (at
    /// most [`PROGRESS_TAIL`] bytes, both streams as they came).
    tail: Mutex<Vec<u8>>,
    /// The newest output, never taken: a task's status shows it.
    latest: Mutex<Vec<u8>>,
    /// A session cell's call: `cell in session HANDLE`.
    cell: Mutex<Option<String>>,
}

impl Progress {
    fn record(&self, ev: RunEvent<'_>) {
        match ev {
            RunEvent::Started {
                run_id,
                sandbox_uid,
            } => {
                if let Ok(mut s) = self.sandbox.lock() {
                    *s = Some((run_id.to_string(), sandbox_uid));
                }
                self.started.notify_one();
            }
            RunEvent::Queued { position } => {
                self.queued.store(position as u64, Ordering::Relaxed);
            }
            RunEvent::Installing { message } => {
                if let Ok(mut m) = self.installing.lock() {
                    *m = Some(message.to_string());
                }
                if let Ok(mut n) = self.notes.lock() {
                    n.push(format!("installing dependencies: {message}"));
                }
                self.news.notify_one();
            }
            RunEvent::Output { stream, bytes } => {
                let counter = match stream {
                    Stream::Stdout => &self.stdout_bytes,
                    Stream::Stderr => &self.stderr_bytes,
                };
                // Under the tail's lock: a message sees both or neither.
                let tail = self.tail.lock();
                counter.fetch_add(bytes.len() as u64, Ordering::Relaxed);
                if let Ok(mut tail) = tail {
                    keep_tail(&mut tail, bytes, PROGRESS_TAIL);
                }
                if let Ok(mut latest) = self.latest.lock() {
                    keep_tail(&mut latest, bytes, PROGRESS_TAIL);
                }
            }
            RunEvent::Step { .. } => {}
        }
    }

    fn label_cell(&self, session: &str) {
        if let Ok(mut c) = self.cell.lock() {
            *c = Some(format!("cell in session {session}"));
        }
    }

    /// A progress notification's message: the output since the last one.
    fn message(&self, elapsed: Duration) -> String {
        self.say(elapsed, true)
    }

    /// A task's status message: the newest output.
    fn status(&self, elapsed: Duration) -> String {
        self.say(elapsed, false)
    }

    fn say(&self, elapsed: Duration, take_tail: bool) -> String {
        let started = self.sandbox.lock().is_ok_and(|s| s.is_some());
        let installing = self.installing.lock().ok().and_then(|m| m.clone());
        if let (false, Some(step)) = (started, installing) {
            return format!("installing dependencies: {step}");
        }
        let place = self.queued.load(Ordering::Relaxed);
        if place > 0 {
            return format!(
                "waiting for a free sandbox slot for {:.0} s: number {place} in the queue",
                elapsed.as_secs_f64().floor()
            );
        }
        let cell = self.cell.lock().ok().and_then(|c| c.clone());
        let who = match (cell, self.sandbox.lock().ok().and_then(|s| s.clone())) {
            (Some(cell), _) => cell,
            (None, Some((run_id, Some(uid)))) => format!("run {run_id} in sandbox uid {uid}"),
            (None, Some((run_id, None))) => format!("run {run_id}"),
            (None, None) => "run".to_string(),
        };
        let (stdout, stderr, tail) = {
            let tail = self.tail.lock();
            let counts = (
                self.stdout_bytes.load(Ordering::Relaxed),
                self.stderr_bytes.load(Ordering::Relaxed),
            );
            let tail = match take_tail {
                true => tail.map(|mut t| std::mem::take(&mut *t)).ok(),
                false => self.latest.lock().map(|t| t.clone()).ok(),
            };
            (counts.0, counts.1, tail.unwrap_or_default())
        };
        let mut message = format!(
            "{who}: running for {:.0} s; output so far: {} stdout, {} stderr",
            elapsed.as_secs_f64().floor(),
            human_bytes(stdout),
            human_bytes(stderr),
        );
        if !tail.is_empty() {
            message.push_str(&format!("; latest output: {}", shown_tail(&tail)));
        }
        message
    }
}

/// Append `bytes` to `tail`, keeping its last `max` bytes.
fn keep_tail(tail: &mut Vec<u8>, bytes: &[u8], max: usize) {
    let new = &bytes[bytes.len().saturating_sub(max)..];
    tail.extend_from_slice(new);
    let excess = tail.len().saturating_sub(max);
    tail.drain(..excess);
}

/// A tail of output for a progress message, as one quoted string
/// (newlines as `\n`, other controls escaped).
fn shown_tail(tail: &[u8]) -> String {
    let text = String::from_utf8_lossy(tail);
    let text = text.trim_start_matches('\u{FFFD}');
    format!("{:?}", text.trim_end_matches('\n'))
}

/// Sends a progress notification when the sandbox starts (or after
/// [`PROGRESS_EVERY`] if the sandboxes does not say) and then every
/// [`PROGRESS_EVERY`]; `progress` is the elapsed time in seconds (it only
/// grows, as MCP requires). Never returns: dropped when the run ends.
async fn report_progress(
    peer: Peer<RoleServer>,
    token: ProgressToken,
    progress: Arc<Progress>,
) -> std::convert::Infallible {
    let start = Instant::now();
    let mut last = 0.0_f64;
    let mut send = |message: String| {
        // `progress` must grow with every notification.
        last = start.elapsed().as_secs_f64().max(last + 0.001);
        ProgressNotificationParam::new(token.clone(), last).with_message(message)
    };
    // The daemon path does not announce the sandbox; tick anyway.
    tokio::select! {
        _ = tokio::time::sleep(PROGRESS_EVERY) => {}
        _ = progress.started.notified() => {}
        _ = progress.news.notified() => {}
    }
    let mut tick = tokio::time::interval(PROGRESS_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let ticked = tokio::select! {
            _ = tick.tick() => true,
            _ = progress.news.notified() => false,
        };
        let notes = progress
            .notes
            .lock()
            .map(|mut n| std::mem::take(&mut *n))
            .unwrap_or_default();
        let mut messages = notes;
        if ticked {
            messages.push(progress.message(start.elapsed()));
        }
        for message in messages {
            // A client that went away is noticed by the service loop; a
            // lost progress note is not worth failing the run for.
            let _ = peer.notify_progress(send(message)).await;
        }
    }
}

impl ServerHandler for PycellServer {
    fn get_info(&self) -> ServerConfig {
        let capabilities = ServerCapabilities::builder()
            .enable_tools()
            .enable_tasks()
            .build();
        ServerConfig::new(capabilities)
            .with_server_info(
                Implementation::new("pycell", env!("CARGO_PKG_VERSION"))
                    .with_title("pycell: a sandbox for untrusted Python"),
            )
            .with_instructions(INSTRUCTIONS)
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        Ok(ListToolsResult::with_all_items(self.tools.as_ref().clone()))
    }

    async fn get_task(
        &self,
        request: GetTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<GetTaskResult, McpError> {
        let caller = self.caller_identity(&context);
        let task = self.handoff.get(&request.task_id, caller)?;
        Ok(GetTaskResult::new(task))
    }

    async fn cancel_task(
        &self,
        request: CancelTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        let caller = self.caller_identity(&context);
        self.handoff.cancel(&request.task_id, caller)
    }

    fn get_tool(&self, name: &str) -> Option<Tool> {
        self.tools.iter().find(|t| t.name == name).cloned()
    }

    /// A request rmcp did not parse into an MCP type: an MCP method whose
    /// params did not fit it (`-32602`), or a method MCP does not have.
    async fn on_custom_request(
        &self,
        request: CustomRequest,
        _context: RequestContext<RoleServer>,
    ) -> Result<CustomResult, McpError> {
        match jsonrpc::invalid_params(&request.method) {
            Some(m) => Err(McpError::invalid_params(m, None)),
            None => Err(McpError::new(
                rmcp::model::ErrorCode::METHOD_NOT_FOUND,
                format!("Method not found: {}", request.method),
                None,
            )),
        }
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let (server, permit) = match self.as_caller(request.name.as_ref(), &context) {
            Ok(v) => v,
            Err(refused) => return Ok(refused.into()),
        };
        let _in_flight = self.cancels.as_ref().map(|c| {
            let caller = server.sandboxes.caller().map(|c| c.identity.clone());
            c.register(caller, &context.id, context.ct.clone())
        });
        let server = &server;
        let _permit = match request.name.as_ref() {
            // A task holds the permit until its run ends.
            tools::RUN_PYTHON => return Ok(server.run_python(request, context, permit).await),
            _ => permit,
        };
        let result = match request.name.as_ref() {
            tools::SANDBOX_INFO => server.sandbox_info().await,
            session_tools::SESSION_START => server.session_start(request.arguments).await,
            session_tools::WRITE_FILE => {
                server
                    .write_file(request.arguments, context.ct.clone())
                    .await
            }
            session_tools::READ_FILE => {
                server
                    .read_file(request.arguments, context.ct.clone())
                    .await
            }
            session_tools::LIST_FILES => {
                server
                    .list_files(request.arguments, context.ct.clone())
                    .await
            }
            session_tools::SESSION_END => server.session_end(request.arguments).await,
            session_tools::SESSION_FORK => server.session_fork(request.arguments).await,
            session_tools::SESSION_SNAPSHOT => server.session_snapshot(request.arguments).await,
            session_tools::SESSION_LIST => server.session_list().await,
            other => {
                let names: Vec<String> = self.tools.iter().map(|t| t.name.to_string()).collect();
                return Err(McpError::invalid_params(
                    format!(
                        "no tool named {other:?}; pycell offers {}",
                        names.join(", ")
                    ),
                    None,
                ));
            }
        };
        Ok(result.into())
    }
}

/// `pycell mcp`.
pub fn main(args: &McpArgs) -> i32 {
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("pycell-mcp")
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("pycell mcp: cannot start the async runtime: {e}");
            return 1;
        }
    };
    runtime.block_on(serve(args))
}

/// `--policy` names a policy that loads and runs code.
pub(crate) fn check_policy(name: &str) -> Result<(), BadPolicyFlag> {
    let bad = |problem: String| BadPolicyFlag {
        name: name.to_string(),
        problem,
    };
    let policy =
        pycell_launch::resolve::load_policy_by_name(name, std::path::Path::new(POLICY_DIR))
            .map_err(|e| bad(e.to_string()))?;
    match policy.purpose_problem(false) {
        Some(problem) => Err(bad(problem)),
        None => Ok(()),
    }
}

/// A `--policy` that does not load, or runs no code.
#[derive(Debug, thiserror::Error)]
#[error("--policy {name}: {problem}")]
pub struct BadPolicyFlag {
    pub name: String,
    pub problem: String,
}

/// A `--tool-servers` file that does not load.
#[derive(Debug, thiserror::Error)]
#[error("--tool-servers {0}")]
pub struct ToolServersFlag(#[from] pub crate::tool_servers::LoadError);

/// The `--tool-servers` file's servers, if it names one.
pub(crate) fn load_tool_servers(args: &McpArgs) -> Result<Option<ToolServers>, ToolServersFlag> {
    let servers = args.tool_servers.as_deref().map(ToolServers::load);
    Ok(servers.transpose()?)
}

async fn serve(args: &McpArgs) -> i32 {
    let checked = check_policy(&args.policy)
        .map_err(|e| e.to_string())
        .and_then(|()| load_tool_servers(args).map_err(|e| e.to_string()));
    let servers = match checked {
        Ok(s) => s,
        Err(e) => {
            eprintln!("pycell mcp: {e}");
            return 2;
        }
    };
    // Started now, from this runtime thread (which lives as long as we do:
    // their parent-death signal follows it), so that run_python's
    // description can list their tools.
    let code_mode = match &servers {
        Some(servers) => Some(code_mode(servers, &args.policy).await),
        None => None,
    };
    let tools = servers.clone().map(|s| Arc::new(s) as Arc<dyn ToolSource>);
    let backend = Backend::choose(args.embedded, None);
    let jails_here = matches!(backend.clone().settled(), Backend::Embedded);
    let sandboxes = RunService::new(backend, tools);
    if jails_here {
        start_zygote(&sandboxes, &args.policy);
    }
    let server = PycellServer::new(sandboxes.clone(), args.policy.clone(), code_mode.as_ref())
        .with_hand_off_after(args.hand_off_after);
    // The end of stdin means the client is gone: nobody can read the results
    // of runs still going, so stop them at once rather than after rmcp's
    // grace period for in-flight handlers (longer than clients wait for a
    // server to exit before they kill it). SIGTERM/SIGINT end the session too.
    let eof = CancellationToken::new();
    let stop = CancellationToken::new();
    let watcher = tokio::spawn(watch_for_the_end(
        eof.clone(),
        stop.clone(),
        sandboxes.clone(),
    ));
    let (stdin, stdout) = rmcp::transport::stdio_pipes();
    let transport = stdio::StdioTransport::new(eof::EofSignal::new(stdin, eof), stdout);
    let answers = transport.answers();
    let quit = match server.serve_with_ct(transport, stop).await {
        Ok(service) => service
            .waiting()
            .await
            .map(|_| ())
            .map_err(|e| e.to_string()),
        // The client left (or we were told to stop) before a lifecycle was
        // chosen, e.g. after a lone server/discover probe: a normal end.
        Err(ServerInitializeError::ConnectionClosed(_) | ServerInitializeError::Cancelled) => {
            Ok(())
        }
        Err(e) => Err(format!("the MCP session did not start: {e}")),
    };
    // Answers to lines that were never messages, written before we end
    // (rmcp drops the transport unclosed when input ends before initialize).
    stdio::wait_for_answers(answers, stdio::ANSWER_GRACE).await;
    watcher.abort();
    sandboxes.shutdown(SHUTDOWN_GRACE).await;
    if let Some(servers) = servers {
        servers.shutdown().await;
    }
    match quit {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("pycell mcp: {e}");
            1
        }
    }
}

/// Runs forked from a zygote of `policy` when this process jails them
/// (no pycelld is there): python and the policy's warm imports started
/// once, in the background, each run of that policy forked from it into
/// a jail of its own; until it is ready, and for runs it cannot take, a
/// run goes the cold way. Started from a thread of its own that lives as
/// long as we do (the zygote's jailer dies with the thread that started
/// it); stopped when the service shuts down.
fn start_zygote(sandboxes: &RunService, policy: &str) {
    let (sandboxes, policy) = (sandboxes.clone(), policy.to_string());
    let rt = tokio::runtime::Handle::current();
    let started = std::thread::Builder::new()
        .name("zygote".into())
        .spawn(move || {
            let stop = CancellationToken::new();
            match sandboxes.start_zygote(&policy, ZYGOTE_SLOTS, &rt, &stop) {
                Ok(()) => {
                    drop(sandboxes);
                    loop {
                        std::thread::park();
                    }
                }
                Err(f) => eprintln!(
                    "pycell mcp: runs of {policy} start cold (no zygote: {})",
                    f.message
                ),
            }
        });
    if let Err(e) = started {
        eprintln!("pycell mcp: runs start cold (no thread for a zygote: {e})");
    }
}

/// Runs a `pycell mcp` zygote forks at once; more go the cold way.
const ZYGOTE_SLOTS: usize = 4;

/// The client's tools as `policy` lets code call them.
pub(crate) async fn code_mode(servers: &dyn ToolSource, policy: &str) -> ToolsInfo {
    let catalog = servers.catalog().await;
    match pycell_launch::resolve::load_policy_by_name(policy, std::path::Path::new(POLICY_DIR)) {
        Ok(p) => pycell_launch::tool_grant::tools_info(&p, &catalog),
        Err(e) => ToolsInfo {
            callable: Vec::new(),
            unavailable: vec![format!("policy {policy}: {e}")],
        },
    }
}

/// Cancels every run when stdin ends or a termination signal arrives (and,
/// for a signal, stops the MCP session as well).
async fn watch_for_the_end(eof: CancellationToken, stop: CancellationToken, sandboxes: RunService) {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        // Without handlers the signals keep their default action; the
        // jailers' parent-death signal still stops their sandboxes.
        eof.cancelled().await;
        sandboxes.cancel_all();
        return;
    };
    tokio::select! {
        _ = eof.cancelled() => {}
        _ = term.recv() => stop.cancel(),
        _ = int.recv() => stop.cancel(),
    }
    sandboxes.cancel_all();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_progress_message_carries_the_newest_output_once_and_bounded() {
        let p = Progress::default();
        p.record(RunEvent::Output {
            stream: Stream::Stdout,
            bytes: b"epoch 1 loss 0.9\nepoch 2 loss 0.5\n",
        });
        let m = p.message(Duration::from_secs(3));
        assert!(
            m.ends_with("; latest output: \"epoch 1 loss 0.9\\nepoch 2 loss 0.5\""),
            "{m}"
        );
        // Nothing new: no output in the next message.
        assert!(!p.message(Duration::from_secs(4)).contains("latest output"));
        let flood = vec![b'x'; 10_000];
        p.record(RunEvent::Output {
            stream: Stream::Stderr,
            bytes: &flood,
        });
        let m = p.message(Duration::from_secs(5));
        let shown = m.split("latest output: ").nth(1).unwrap();
        assert_eq!(shown.len(), PROGRESS_TAIL + 2, "{m}");
    }

    #[test]
    fn the_tail_keeps_the_last_bytes_across_chunks() {
        let mut tail = Vec::new();
        keep_tail(&mut tail, b"abcdef", 4);
        assert_eq!(tail, b"cdef");
        keep_tail(&mut tail, b"gh", 4);
        assert_eq!(tail, b"efgh");
    }
}
