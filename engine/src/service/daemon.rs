//! Runs and sessions in pycelld: the blocking daemon client on a worker
//! thread, its events relayed to the caller, cancellation sent as the
//! protocol's `cancel` (pycelld kills the sandbox; the result says
//! `killed`), and the run's tool calls answered by the client's servers.
//! [`DaemonOr`] is the default of a front end that was given neither
//! `--embedded` nor a socket: pycelld when one listens, else embedded.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use pycell_protocol::client::{daemon_socket, ClientError, DaemonClient, Endpoint, Stage};
use pycell_protocol::info::PolicySummary;
use pycell_protocol::messages::{ErrorCode, RunRequest};
use pycell_protocol::result::RunResult;
use pycell_protocol::session::{
    SessionAnswer, SessionCall, SessionEndInfo, SessionForkInfo, SessionInfo, SessionStartRequest,
    SessionSummary, SnapshotInfo,
};
use pycell_wire::codes::{FailureCode, Layer};
use pycell_wire::events::Stream;
use pycell_wire::report::JailFailure;

use super::embedded::Embedded;
use super::{
    mode_name, stopped, Asker, OnEvent, OutputSink, RequestError, RunEvent, Sandboxes, Serving,
    SessionFailure,
};
use crate::tool_source::DaemonToolCalls;

/// The pycelld at one socket.
#[derive(Debug)]
pub struct Daemon {
    socket: PathBuf,
    shutdown: CancellationToken,
}

impl Daemon {
    pub fn new(socket: PathBuf, shutdown: CancellationToken) -> Daemon {
        Daemon { socket, shutdown }
    }

    fn endpoint(&self, asker: &Asker) -> Endpoint {
        Endpoint {
            socket: self.socket.clone(),
            identity: asker.identity.clone(),
        }
    }
}

#[async_trait]
impl Sandboxes for Daemon {
    async fn run(
        &self,
        asker: &Asker,
        req: RunRequest,
        serving: Option<Serving>,
        on_event: OnEvent<'_>,
        cancel: CancellationToken,
    ) -> Result<RunResult, RequestError> {
        let endpoint = self.endpoint(asker);
        let shutdown = &self.shutdown;
        run(endpoint, asker, (req, serving), on_event, &cancel, shutdown).await
    }

    async fn describe_policy(
        &self,
        asker: &Asker,
        name: &str,
    ) -> Result<PolicySummary, RequestError> {
        describe_policy(self.endpoint(asker), name).await
    }

    async fn start_session(
        &self,
        asker: &Asker,
        req: SessionStartRequest,
    ) -> Result<SessionInfo, SessionFailure> {
        via_daemon(self.endpoint(asker), move |c| c.session_start(req, |_| {})).await
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
        let asked = Asked {
            handle,
            call,
            timeout_s,
            watch,
        };
        session_call(self.endpoint(asker), asker, asked, cancel).await
    }

    async fn end_session(
        &self,
        asker: &Asker,
        handle: &str,
    ) -> Result<SessionEndInfo, SessionFailure> {
        let h = handle.to_string();
        via_daemon(self.endpoint(asker), move |c| c.session_end(&h)).await
    }

    async fn list_sessions(&self, asker: &Asker) -> Result<Vec<SessionSummary>, SessionFailure> {
        via_daemon(self.endpoint(asker), |c| c.session_list()).await
    }

    async fn fork_session(
        &self,
        asker: &Asker,
        handle: &str,
    ) -> Result<SessionForkInfo, SessionFailure> {
        let h = handle.to_string();
        via_daemon(self.endpoint(asker), move |c| c.session_fork(&h, |_| {})).await
    }

    async fn snapshot_session(
        &self,
        asker: &Asker,
        handle: &str,
    ) -> Result<SnapshotInfo, SessionFailure> {
        let h = handle.to_string();
        via_daemon(self.endpoint(asker), move |c| c.session_snapshot(&h)).await
    }

    fn mode(&self) -> String {
        mode_name(Some(&self.socket))
    }
}

/// pycelld when one is configured or listening (asked at each call), else
/// this process, embedded.
#[derive(Debug)]
pub struct DaemonOr {
    embedded: Embedded,
    shutdown: CancellationToken,
}

impl DaemonOr {
    pub fn new(embedded: Embedded, shutdown: CancellationToken) -> DaemonOr {
        DaemonOr { embedded, shutdown }
    }

    /// The daemon if one is there now; else the embedded backend.
    fn now(&self) -> Now<'_> {
        match daemon_socket(None) {
            Some(socket) => Now::Daemon(Daemon::new(socket, self.shutdown.clone())),
            None => Now::Embedded(&self.embedded),
        }
    }
}

/// Where a [`DaemonOr`] call goes, chosen at the call.
enum Now<'a> {
    Daemon(Daemon),
    Embedded(&'a Embedded),
}

impl Now<'_> {
    fn place(&self) -> &dyn Sandboxes {
        match self {
            Now::Daemon(d) => d,
            Now::Embedded(e) => *e,
        }
    }
}

#[async_trait]
impl Sandboxes for DaemonOr {
    async fn run(
        &self,
        asker: &Asker,
        req: RunRequest,
        serving: Option<Serving>,
        on_event: OnEvent<'_>,
        cancel: CancellationToken,
    ) -> Result<RunResult, RequestError> {
        let place = self.now();
        place
            .place()
            .run(asker, req, serving, on_event, cancel)
            .await
    }

    async fn describe_policy(
        &self,
        asker: &Asker,
        name: &str,
    ) -> Result<PolicySummary, RequestError> {
        self.now().place().describe_policy(asker, name).await
    }

    async fn start_session(
        &self,
        asker: &Asker,
        req: SessionStartRequest,
    ) -> Result<SessionInfo, SessionFailure> {
        self.now().place().start_session(asker, req).await
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
        self.now()
            .place()
            .session_call(asker, handle, call, timeout_s, cancel, watch)
            .await
    }

    async fn end_session(
        &self,
        asker: &Asker,
        handle: &str,
    ) -> Result<SessionEndInfo, SessionFailure> {
        self.now().place().end_session(asker, handle).await
    }

    async fn list_sessions(&self, asker: &Asker) -> Result<Vec<SessionSummary>, SessionFailure> {
        self.now().place().list_sessions(asker).await
    }

    async fn fork_session(
        &self,
        asker: &Asker,
        handle: &str,
    ) -> Result<SessionForkInfo, SessionFailure> {
        self.now().place().fork_session(asker, handle).await
    }

    async fn snapshot_session(
        &self,
        asker: &Asker,
        handle: &str,
    ) -> Result<SnapshotInfo, SessionFailure> {
        self.now().place().snapshot_session(asker, handle).await
    }

    fn mode(&self) -> String {
        mode_name(daemon_socket(None).as_deref())
    }

    fn takes_policy_files(&self) -> bool {
        self.now().place().takes_policy_files()
    }

    async fn end_all(&self, grace: Duration) {
        self.embedded.end_all(grace).await;
    }

    /// Embedded's, while no pycelld is there to take the runs.
    fn start_zygote(
        &self,
        policy: &str,
        slots: usize,
        rt: &tokio::runtime::Handle,
        stop: &CancellationToken,
    ) -> Result<(), JailFailure> {
        match self.now() {
            Now::Embedded(e) => e.start_zygote(policy, slots, rt, stop),
            Now::Daemon(d) => d.start_zygote(policy, slots, rt, stop),
        }
    }
}

/// What the daemon client's thread hands to the async side.
enum DaemonEvent {
    Output(Stream, Vec<u8>),
    Queued(usize),
    Installing(String),
    Started(String),
}

impl DaemonEvent {
    fn deliver(&self, on_event: &mut (dyn FnMut(RunEvent<'_>) + Send)) {
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

/// A daemon run's way to be stopped: its current connection's canceller,
/// and whether a stop was asked for (a stop asked before the client has
/// connected, or between its retries, is sent as soon as it connects).
#[derive(Default)]
struct Stop {
    canceller: Option<pycell_protocol::client::Canceller>,
    wanted: bool,
}

type Canceller = Arc<std::sync::Mutex<Stop>>;

/// Ask for the stop; send it if the run's connection is there.
fn stop(canceller: &Canceller) {
    if let Ok(mut s) = canceller.lock() {
        s.wanted = true;
        if let Some(c) = s.canceller.as_mut() {
            let _ = c.cancel();
        }
    }
}

/// Pass ^C to the run's program, if its connection is there.
fn interrupt(canceller: &Canceller) {
    if let Ok(mut s) = canceller.lock() {
        if let Some(c) = s.canceller.as_mut() {
            let _ = c.interrupt();
        }
    }
}

/// The next ^C press (never, without a terminal's).
async fn pressed(ctrl_c: &mut Option<tokio::sync::watch::Receiver<u64>>) {
    if let Some(presses) = ctrl_c {
        if presses.changed().await.is_ok() {
            return;
        }
    }
    std::future::pending().await
}

/// A new connection of the run: its canceller kept, and a stop already
/// asked for sent on it.
fn connected(canceller: &Canceller, client: &DaemonClient) {
    if let Ok(mut s) = canceller.lock() {
        s.canceller = client.canceller().ok();
        if s.wanted {
            if let Some(c) = s.canceller.as_mut() {
                let _ = c.cancel();
            }
        }
    }
}

/// The blocking side of a daemon run (on a worker thread): its events to
/// `events`, its canceller to `canceller`, its tool calls to `calls`, a
/// server's socket to its `stdio`.
fn run_blocking(
    endpoint: &Endpoint,
    (req, serving): (RunRequest, Option<Serving>),
    events: &mpsc::UnboundedSender<DaemonEvent>,
    canceller: &Canceller,
    calls: Option<&DaemonToolCalls>,
) -> Result<RunResult, ClientError> {
    let (granted, mut stdio) = match serving {
        Some(s) => (s.granted, Some(s.stdio)),
        None => (Vec::new(), None),
    };
    let mut on_stdio = |sock| {
        if let Some(tx) = stdio.take() {
            let _ = tx.send(sock);
        }
    };
    let serves = req.serve_stdio;
    pycell_protocol::client::run_patiently(
        endpoint,
        req,
        &granted,
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
            connected(canceller, client);
            if let Some(calls) = calls {
                calls.connected(client);
            }
        },
        serves.then_some(&mut on_stdio as &mut dyn FnMut(std::os::fd::OwnedFd)),
    )
}

/// The asker's tool servers, answering on this runtime.
fn tool_calls(asker: &Asker) -> Option<DaemonToolCalls> {
    let servers = asker.tools.clone()?;
    Some(DaemonToolCalls::new(
        servers,
        tokio::runtime::Handle::current(),
    ))
}

/// A run through the pycelld at `endpoint`.
pub(super) async fn run(
    endpoint: Endpoint,
    asker: &Asker,
    (req, serving): (RunRequest, Option<Serving>),
    on_event: OnEvent<'_>,
    cancel: &CancellationToken,
    shutdown: &CancellationToken,
) -> Result<RunResult, RequestError> {
    let policy = req.policy_name().to_string();
    // Each connection the blocking client makes leaves its canceller here.
    let canceller: Canceller = Arc::default();
    let (tx, mut rx) = mpsc::unbounded_channel::<DaemonEvent>();
    let calls = tool_calls(asker);
    let slot = Arc::clone(&canceller);
    let mut handle = tokio::task::spawn_blocking(move || {
        run_blocking(&endpoint, (req, serving), &tx, &slot, calls.as_ref())
    });
    let mut cancel_sent = false;
    // Presses from now on.
    let mut ctrl_c = asker.ctrl_c.clone();
    if let Some(presses) = &mut ctrl_c {
        presses.borrow_and_update();
    }
    let outcome = loop {
        tokio::select! {
            Some(ev) = rx.recv() => ev.deliver(on_event),
            _ = stopped(cancel, shutdown), if !cancel_sent => {
                cancel_sent = true;
                stop(&canceller);
            }
            () = pressed(&mut ctrl_c) => interrupt(&canceller),
            done = &mut handle => break done,
        }
    };
    // Chunks still queued when the run ended.
    while let Ok(ev) = rx.try_recv() {
        ev.deliver(on_event);
    }
    match outcome {
        Ok(Ok(result)) => Ok(result),
        Ok(Err(ClientError::Refused {
            code: ErrorCode::InvalidRequest,
            message,
        })) => Err(RequestError::from_message(message)),
        Ok(Err(e)) => Ok(e.into_result(&policy)),
        Err(e) => {
            let f = JailFailure::new(FailureCode::Internal, Layer::Daemon, e.to_string());
            Ok(RunResult::refused("", &policy, f))
        }
    }
}

/// The policy `name` as the pycelld at `endpoint` lists it.
pub(super) async fn describe_policy(
    endpoint: Endpoint,
    name: &str,
) -> Result<PolicySummary, RequestError> {
    let policies = policies_of(endpoint).await.map_err(|f| RequestError {
        field: "policy",
        problem: f.message,
    })?;
    find_policy(policies, name)
}

/// The policies of the pycelld at `endpoint`.
pub(super) async fn policies_of(endpoint: Endpoint) -> Result<Vec<PolicySummary>, SessionFailure> {
    let info = via_daemon(endpoint, |c| c.info()).await?;
    Ok(info.host.policies)
}

/// The policy `name` among a pycelld's `policies`.
pub(super) fn find_policy(
    policies: Vec<PolicySummary>,
    name: &str,
) -> Result<PolicySummary, RequestError> {
    let names: Vec<String> = policies.iter().map(|p| p.name.clone()).collect();
    policies
        .into_iter()
        .find(|p| p.name == name)
        .ok_or_else(|| RequestError {
            field: "policy",
            problem: format!(
                "pycelld has no policy {name:?} (it has: {})",
                names.join(", ")
            ),
        })
}

/// A blocking daemon request on a worker thread.
pub(super) async fn via_daemon<T: Send + 'static>(
    endpoint: Endpoint,
    ask: impl FnOnce(&mut DaemonClient) -> Result<T, ClientError> + Send + 'static,
) -> Result<T, SessionFailure> {
    let done = tokio::task::spawn_blocking(move || {
        let mut c = endpoint.connect()?;
        ask(&mut c)
    })
    .await;
    match done {
        Ok(r) => r.map_err(SessionFailure::from_client),
        Err(e) => Err(SessionFailure::new(FailureCode::Internal, e.to_string())),
    }
}

/// A session call as asked.
pub(super) struct Asked<'a> {
    pub handle: &'a str,
    pub call: SessionCall,
    pub timeout_s: Option<f64>,
    /// Hears the call's output as it comes (`watch` in the message).
    pub watch: Option<OutputSink>,
}

/// A session call through the pycelld at `endpoint`; cancelling sends the
/// protocol's `cancel` (the cell is interrupted; its answer still comes).
pub(super) async fn session_call(
    endpoint: Endpoint,
    asker: &Asker,
    asked: Asked<'_>,
    cancel: CancellationToken,
) -> Result<SessionAnswer, SessionFailure> {
    let Asked {
        handle,
        call,
        timeout_s,
        watch,
    } = asked;
    let handle = handle.to_string();
    let (tx, rx) = tokio::sync::oneshot::channel();
    let calls = tool_calls(asker);
    let answered = via_daemon(endpoint, move |c| {
        let _ = tx.send(c.canceller());
        if let Some(calls) = &calls {
            calls.connected(c);
        }
        let mut heard = watch.map(|w| move |s: Stream, b: &[u8]| w(s, b));
        let on_output = heard.as_mut().map(|h| h as &mut dyn FnMut(Stream, &[u8]));
        let on_tool_call = |stage: Stage<'_>| DaemonToolCalls::take(calls.as_ref(), stage);
        c.session_call_watching(&handle, call, timeout_s, on_tool_call, on_output)
    });
    tokio::pin!(answered);
    tokio::select! {
        a = &mut answered => a,
        _ = cancel.cancelled() => {
            if let Ok(Ok(mut canceller)) = rx.await {
                let _ = canceller.cancel();
            }
            answered.await
        }
    }
}
