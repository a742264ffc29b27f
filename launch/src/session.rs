//! Sessions, on the launcher's side: a started session jail (see
//! `pycell_runner::session`) driven by a task of its own, which owns both
//! halves of its jailer ([`JailerProcess`], [`RunStream`]) and its request
//! stream, and which callers reach through a [`Session`] handle.
//!
//! Requests are served one at a time, in order: a request made while
//! another runs waits in a queue of [`MAX_QUEUED`], beyond which it is
//! refused ([`SessionError::Busy`]). When the session ends (its caller ends
//! it, its jailer's clocks do, its memory runs out, ...) every waiting
//! caller, and every later one, gets [`SessionEnded`], which says why. The
//! runner's replies are parsed here, outside the jail's privilege: they are
//! the sandbox's bytes.

use std::sync::Arc;
use std::time::Duration;

use pycell_protocol::result::RunResult;
use pycell_runner::session::{RunnerReply, SessionOp, SessionRequest, MAX_REQUEST_FRAME};
use pycell_wire::codes::{FailureCode, Layer};
use pycell_wire::report::JailFailure;
use pycell_wire::report::{RunStatus, SessionEnd};
use pycell_wire::spec::MediaLimits;
use tokio::io::AsyncWriteExt;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::launcher::{append_capped, Collector, JailerEnd, LaunchedAsync};
use crate::supervisor::{
    read_stderr, JailerProcess, Patience, RunStream, Services, StoppedBy, StreamItem,
};

/// Requests that may wait behind the one running.
pub const MAX_QUEUED: usize = 8;

/// Hears a request's output as it comes (up to the request's cap on each
/// stream): a live view for progress; the answer's output is the record.
pub type OutputSink = Arc<dyn Fn(pycell_wire::events::Stream, &[u8]) + Send + Sync>;

/// A request's answer (the protocol's: the embedded server and pycelld's
/// broker answer alike).
pub use pycell_protocol::session::SessionAnswer as Answer;

/// Why a session is over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EndReason {
    /// Its caller ended it.
    Ended,
    /// Idle for its idle timeout.
    Idle,
    /// Its maximum lifetime passed.
    Lifetime,
    /// A cell overran its timeout and ignored KeyboardInterrupt.
    CellTimeout,
    /// Its memory limit was reached.
    Oom,
    /// Its python exited (a cell called `os._exit`, or crashed it).
    Exited,
    /// It was killed: the server shut down, or a limit (CPU time) killed it.
    Killed,
    /// It could not start, or its jailer failed.
    Failed,
}

impl EndReason {
    pub fn as_str(self) -> &'static str {
        match self {
            EndReason::Ended => "ended",
            EndReason::Idle => "idle_timeout",
            EndReason::Lifetime => "lifetime",
            EndReason::CellTimeout => "cell_timeout",
            EndReason::Oom => "oom",
            EndReason::Exited => "exited",
            EndReason::Killed => "killed",
            EndReason::Failed => "failed",
        }
    }
}

/// A session that is over, and why: the same for every caller.
#[derive(Debug, Clone)]
pub struct SessionEnded {
    pub reason: EndReason,
    pub message: String,
    /// The session jail's own result (its layers, its peak memory).
    pub result: Arc<RunResult>,
}

impl SessionEnded {
    /// The failure code of a session that ended before it could serve:
    /// its jail's own, else `jail_setup_failed`.
    pub fn code(&self) -> FailureCode {
        self.result
            .error
            .as_ref()
            .map_or(FailureCode::JailSetupFailed, |f| f.code)
    }

    /// Why the session whose jail ended with `result` is over.
    pub fn from_result(result: RunResult) -> SessionEnded {
        let (reason, message) = end_of(&result);
        SessionEnded {
            reason,
            message,
            result: Arc::new(result),
        }
    }
}

/// The reason and message for a session jail's result (pure).
fn end_of(r: &RunResult) -> (EndReason, String) {
    let said = r.error.as_ref().map(|e| e.message.clone());
    let with = |reason: EndReason, fallback: &str| {
        (reason, said.clone().unwrap_or_else(|| fallback.to_string()))
    };
    match (r.session_end, r.status) {
        (_, RunStatus::Refused) => with(EndReason::Failed, "the session could not start"),
        (_, RunStatus::Oom) => with(
            EndReason::Oom,
            "the session reached its memory limit and was killed",
        ),
        (Some(SessionEnd::Closed), _) => (EndReason::Ended, "the session was ended".into()),
        (Some(SessionEnd::Idle), _) => with(EndReason::Idle, "the session was idle too long"),
        (Some(SessionEnd::Lifetime), _) => {
            with(EndReason::Lifetime, "the session's lifetime ran out")
        }
        (Some(SessionEnd::CellTimeout), _) => with(
            EndReason::CellTimeout,
            "a cell ignored KeyboardInterrupt past its timeout",
        ),
        (Some(SessionEnd::Protocol), _) => with(EndReason::Failed, "the session's channel broke"),
        (None, RunStatus::Ok | RunStatus::Error) => (
            EndReason::Exited,
            match (r.exit_code, r.signal) {
                (Some(c), _) => format!("the session's python exited with status {c}"),
                (_, Some(s)) => format!("the session's python was killed by signal {s}"),
                _ => "the session's python exited".to_string(),
            },
        ),
        (None, RunStatus::Killed | RunStatus::Timeout) => {
            with(EndReason::Killed, "the session was killed")
        }
    }
}

/// A session's outer clocks, for its launcher's watchdog.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SessionTiming {
    /// How long its python may take to get ready (its imports).
    pub ready_within: Duration,
    /// Its lifetime once ready (the jailer ends it then).
    pub lifetime: Duration,
}

/// Why a request got no answer.
#[derive(Debug, Clone)]
pub enum SessionError {
    /// The session is over (before or during the request).
    Ended(SessionEnded),
    /// [`MAX_QUEUED`] requests already wait.
    Busy,
    /// This request was refused; the session lives on.
    Refused(FailureCode, String),
}

struct Call {
    op: SessionOp,
    answer: oneshot::Sender<Result<Answer, SessionError>>,
    watch: Option<OutputSink>,
}

/// A live session. Cheap to clone; clones share the session. Dropping
/// every clone ends it.
#[derive(Debug, Clone)]
pub struct Session {
    pub run_id: String,
    pub policy: String,
    pub sandbox_uid: u32,
    calls: mpsc::Sender<Call>,
    close: CancellationToken,
    interrupt: Arc<tokio::sync::Notify>,
    ended: watch::Receiver<Option<SessionEnded>>,
    /// Requests asked and not yet answered.
    pending: Arc<std::sync::atomic::AtomicUsize>,
    /// Held while the session's state is read out (a fork, a snapshot, a
    /// pause): one at a time, since its runner keeps one export.
    state_reads: Arc<tokio::sync::Mutex<()>>,
}

/// Counts a request as pending while it lives.
struct Pending(Arc<std::sync::atomic::AtomicUsize>);

impl Pending {
    fn new(count: &Arc<std::sync::atomic::AtomicUsize>) -> Pending {
        count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Pending(Arc::clone(count))
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        self.0.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    }
}

impl std::fmt::Debug for Call {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Call").finish_non_exhaustive()
    }
}

/// Whoever holds a session's jailer process: the embedded launcher owns
/// it ([`OwnedJailer`]); in pycelld the root monitor does, and the broker
/// asks it over its link.
pub trait JailerControl: Send + 'static {
    /// Stop the session (the jailer kills its jail and reports `killed`).
    fn stop(&mut self);
    /// Pass SIGINT to what runs (KeyboardInterrupt in a cell).
    fn interrupt(&mut self);
    /// When [`JailerControl::escalate`] is next due; `None` if the
    /// watchdog is elsewhere.
    fn next_due(&self) -> Option<Instant>;
    fn escalate(&mut self);
    /// The stream ended: how the jailer ended, once it has.
    fn finish(self) -> impl std::future::Future<Output = JailerEnd> + Send;
}

/// The embedded launcher's own jailer: its process half and its stderr.
#[derive(Debug)]
pub struct OwnedJailer {
    process: JailerProcess<tokio::process::Child>,
    stderr: tokio::task::JoinHandle<Vec<u8>>,
}

impl JailerControl for OwnedJailer {
    fn stop(&mut self) {
        self.process.stop(StoppedBy::Shutdown);
    }

    fn interrupt(&mut self) {
        // Not reaped before `finish`: the pid is still the jailer's.
        let pid = nix::unistd::Pid::from_raw(self.process.pid());
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGINT);
    }

    fn next_due(&self) -> Option<Instant> {
        Some(self.process.next_due())
    }

    fn escalate(&mut self) {
        self.process.escalate();
    }

    async fn finish(mut self) -> JailerEnd {
        let status = self.process.wait().await;
        let stderr = self.stderr.await.unwrap_or_default();
        JailerEnd::Exited { status, stderr }
    }
}

/// A session jail's jailer, started: what its session is driven with.
#[derive(Debug)]
pub struct SessionParts<C> {
    pub run_id: String,
    pub policy: String,
    pub sandbox_uid: u32,
    pub stream: RunStream,
    /// The jailer's stdin, on which requests go.
    pub requests: std::os::unix::net::UnixStream,
    pub control: C,
    /// Its runner is known to be ready already (a jail of a pool, whose
    /// ready event its pool read).
    pub ready: bool,
}

impl SessionParts<OwnedJailer> {
    /// The parts of a session jail the embedded launcher just spawned.
    pub fn embedded(
        mut launched: LaunchedAsync,
        services: Services,
        patience: Patience,
        timing: SessionTiming,
    ) -> Result<SessionParts<OwnedJailer>, Box<RunResult>> {
        let collector = Collector::new(&launched.run_id, &launched.policy, None);
        let requests = launched.take_work_stream();
        let stderr = read_stderr(launched.child.stderr.take());
        // The jailer keeps the session's clocks; this watchdog only
        // catches a jailer that stopped answering.
        let wall = timing.ready_within + timing.lifetime;
        let process = JailerProcess::new(launched.child, launched.lease, wall, patience);
        let stream = RunStream::start(launched.events, collector, launched.handouts, services);
        let sandbox_uid = process.uid().unwrap_or(0);
        let control = OwnedJailer { process, stderr };
        let Some(requests) = requests else {
            let f = JailFailure::new(
                FailureCode::Internal,
                Layer::Jailer,
                "a session jail without its request stream",
            );
            return Err(Box::new(RunResult::refused(
                &launched.run_id,
                &launched.policy,
                f,
            )));
        };
        Ok(SessionParts {
            run_id: launched.run_id,
            policy: launched.policy,
            sandbox_uid,
            stream,
            requests,
            control,
            ready: false,
        })
    }
}

/// The request that starts a session's clocks (its jailer keeps them from
/// its first request): a listing of nothing.
fn first_request() -> SessionOp {
    SessionOp {
        wall_timeout: Duration::from_secs(10),
        cpu_time: Duration::from_secs(1),
        max_output: pycell_wire::limits::Bytes(1),
        request: SessionRequest::List {
            path: String::new(),
            max_entries: 0,
        },
    }
}

impl Session {
    /// Drive a session jail's jailer as a session: wait until its runner
    /// is ready (at most `ready_within`), start its clocks, then serve
    /// requests. `stop` resolving kills it (a server shutting down). `Err`
    /// is why it never became ready, its jailer already gone.
    pub async fn start<C: JailerControl>(
        parts: SessionParts<C>,
        ready_within: Duration,
        stop: CancellationToken,
    ) -> Result<Session, SessionEnded> {
        let SessionParts {
            run_id,
            policy,
            sandbox_uid,
            mut stream,
            requests,
            mut control,
            ready: already,
        } = parts;
        let requests = requests
            .set_nonblocking(true)
            .and_then(|()| tokio::net::UnixStream::from_std(requests));
        let ready = match requests {
            Ok(r) if already => Some(r),
            Ok(r) => wait_ready(&mut stream, ready_within).await.then_some(r),
            Err(_) => None,
        };
        let Some(requests) = ready else {
            control.stop();
            let end = control.finish().await;
            let (result, _) = stream.finish(end).await;
            return Err(not_ready(result));
        };
        let (calls, calls_rx) = mpsc::channel(MAX_QUEUED);
        let (ended_tx, ended) = watch::channel(None);
        let close = CancellationToken::new();
        let interrupt = Arc::new(tokio::sync::Notify::new());
        let driver = Driver {
            run_id: run_id.clone(),
            policy: policy.clone(),
            interrupt: Arc::clone(&interrupt),
            control,
            stream,
            requests: Some(requests),
            calls: calls_rx,
            close: close.clone(),
            stop,
            in_flight: None,
            stray: [Vec::new(), Vec::new()],
        };
        tokio::spawn(driver.run(ended_tx));
        let session = Session {
            run_id,
            policy,
            sandbox_uid,
            calls,
            close,
            interrupt,
            ended,
            pending: Default::default(),
            state_reads: Default::default(),
        };
        match session.request(first_request()).await {
            Ok(_) => Ok(session),
            Err(SessionError::Ended(e)) => Err(e),
            Err(SessionError::Busy) => unreachable!("the first request waits behind none"),
            Err(SessionError::Refused(code, message)) => {
                // Our own first request, which is small: a bug if refused.
                let f = JailFailure::new(code, Layer::Session, message);
                session.close.cancel();
                Err(SessionEnded::from_result(RunResult::refused(
                    &session.run_id,
                    &session.policy,
                    f,
                )))
            }
        }
    }

    /// Interrupt what runs (KeyboardInterrupt in a cell), as ^C would.
    pub fn interrupt(&self) {
        self.interrupt.notify_waiters();
    }

    /// Serve `op` when the requests before it are done.
    pub async fn request(&self, op: SessionOp) -> Result<Answer, SessionError> {
        self.request_watched(op, None).await
    }

    /// [`Session::request`], its output heard by `watch` as it comes.
    pub async fn request_watched(
        &self,
        op: SessionOp,
        watch: Option<OutputSink>,
    ) -> Result<Answer, SessionError> {
        if let Some(e) = self.ended() {
            return Err(SessionError::Ended(e));
        }
        let _pending = Pending::new(&self.pending);
        let (answer, answered) = oneshot::channel();
        match self.calls.try_send(Call { op, answer, watch }) {
            Ok(()) => {}
            Err(mpsc::error::TrySendError::Full(_)) => return Err(SessionError::Busy),
            Err(mpsc::error::TrySendError::Closed(_)) => {
                return Err(SessionError::Ended(self.wait_ended().await))
            }
        }
        match answered.await {
            Ok(r) => r,
            Err(_) => Err(SessionError::Ended(self.wait_ended().await)),
        }
    }

    /// Wait until no other reads the session's state out, then hold it.
    pub async fn read_state(&self) -> tokio::sync::OwnedMutexGuard<()> {
        Arc::clone(&self.state_reads).lock_owned().await
    }

    /// Whether a request is asked and not yet answered.
    pub fn busy(&self) -> bool {
        self.pending.load(std::sync::atomic::Ordering::SeqCst) > 0
    }

    /// Why the session is over, if it is.
    pub fn ended(&self) -> Option<SessionEnded> {
        self.ended.borrow().clone()
    }

    /// End the session (what runs is killed) and wait until its jail is
    /// gone: its processes, cgroup and sandbox uid.
    pub async fn end(&self) -> SessionEnded {
        self.close.cancel();
        self.wait_ended().await
    }

    /// Wait until the session is over, and say why.
    pub async fn wait_ended(&self) -> SessionEnded {
        let mut ended = self.ended.clone();
        let got = match ended.wait_for(Option::is_some).await {
            Ok(e) => e.clone(),
            // The driver sends its end before it drops the sender.
            Err(_) => None,
        };
        got.unwrap_or_else(|| {
            let f = JailFailure::new(
                FailureCode::Internal,
                Layer::Jailer,
                "the session's driver is gone",
            );
            SessionEnded::from_result(RunResult::refused(&self.run_id, &self.policy, f))
        })
    }
}

/// Wait for the jail's ready event; false if the stream ended first or
/// it took longer than `within`.
async fn wait_ready(stream: &mut RunStream, within: Duration) -> bool {
    let ready = async {
        loop {
            match stream.next_item().await {
                Some(StreamItem::Ready) => return true,
                Some(_) => {}
                None => return false,
            }
        }
    };
    tokio::time::timeout(within, ready).await.unwrap_or(false)
}

fn not_ready(result: RunResult) -> SessionEnded {
    let mut ended = SessionEnded::from_result(result);
    if ended.reason != EndReason::Failed {
        ended.reason = EndReason::Failed;
        ended.message = "the session's python did not get ready in time".to_string();
    }
    ended
}

/// The request running, and the output it printed so far.
struct InFlight {
    answer: oneshot::Sender<Result<Answer, SessionError>>,
    /// What the reply's images and displays are held to (none: it may
    /// have none).
    media: Option<MediaLimits>,
    output: [Vec<u8>; 2],
    cap: usize,
    timeout_s: f64,
    watch: Option<OutputSink>,
}

/// The task that owns a session's jailer.
struct Driver<C> {
    run_id: String,
    policy: String,
    control: C,
    stream: RunStream,
    /// Until the session is being ended: dropping it is the jailer's cue.
    requests: Option<tokio::net::UnixStream>,
    calls: mpsc::Receiver<Call>,
    close: CancellationToken,
    stop: CancellationToken,
    interrupt: Arc<tokio::sync::Notify>,
    in_flight: Option<InFlight>,
    /// Output that came between requests: the next one gets it.
    stray: [Vec<u8>; 2],
}

impl<C: JailerControl> Driver<C> {
    async fn run(mut self, ended_tx: watch::Sender<Option<SessionEnded>>) {
        let mut stopping = false;
        loop {
            let accepting = self.in_flight.is_none() && self.requests.is_some();
            let due = self.control.next_due();
            tokio::select! {
                _ = self.stop.cancelled(), if !stopping => {
                    stopping = true;
                    self.control.stop();
                }
                _ = self.close.cancelled(), if self.requests.is_some() => {
                    self.requests = None;
                }
                _ = sleep_until_some(due), if due.is_some() => {
                    self.control.escalate();
                }
                _ = self.interrupt.notified(), if self.in_flight.is_some() => {
                    self.control.interrupt();
                }
                call = self.calls.recv(), if accepting => match call {
                    Some(call) => self.send(call).await,
                    // Every handle is gone: end the session.
                    None => self.requests = None,
                },
                item = self.stream.next_item() => match item {
                    Some(item) => self.take(item),
                    None => break,
                },
            }
        }
        if self.stream.broken() {
            self.control.stop();
        }
        let end = self.control.finish().await;
        let (result, _) = self.stream.finish(end).await;
        let ended = SessionEnded::from_result(result);
        let _ = ended_tx.send(Some(ended.clone()));
        if let Some(f) = self.in_flight.take() {
            let _ = f.answer.send(Err(SessionError::Ended(ended.clone())));
        }
        self.calls.close();
        while let Ok(call) = self.calls.try_recv() {
            let _ = call.answer.send(Err(SessionError::Ended(ended.clone())));
        }
    }

    /// Hand a request to the jailer; it is in flight until its reply.
    async fn send(&mut self, call: Call) {
        let frame = match pycell_wire::framing::encode_within(&call.op, MAX_REQUEST_FRAME) {
            Ok(f) => f,
            Err(e) => {
                // `session_table::op_for` bounds every call, so this is a
                // bug if it happens; either way only this call fails.
                let why = format!("encoding the call for the session: {e}");
                let _ = call
                    .answer
                    .send(Err(SessionError::Refused(FailureCode::InvalidRequest, why)));
                return;
            }
        };
        let Some(requests) = self.requests.as_mut() else {
            return;
        };
        if requests.write_all(&frame).await.is_err() {
            // The jailer is gone or going: its result says why.
            self.requests = None;
        }
        let cap = usize::try_from(call.op.max_output.get()).unwrap_or(usize::MAX);
        let mut output = std::mem::take(&mut self.stray);
        for o in &mut output {
            o.truncate(cap);
        }
        let media = match &call.op.request {
            SessionRequest::Cell { limits, .. } => Some(MediaLimits {
                images: limits.images,
                displays: limits.displays,
            }),
            _ => None,
        };
        self.in_flight = Some(InFlight {
            answer: call.answer,
            media,
            output,
            cap,
            timeout_s: call.op.wall_timeout.as_secs_f64(),
            watch: call.watch,
        });
    }

    fn take(&mut self, item: StreamItem) {
        match item {
            StreamItem::Output(stream, bytes) => {
                let i = stream as usize;
                match self.in_flight.as_mut() {
                    Some(f) => {
                        let had = f.output[i].len();
                        append_capped(&mut f.output[i], &bytes, f.cap);
                        if let (Some(watch), Some(kept)) = (&f.watch, f.output[i].get(had..)) {
                            if !kept.is_empty() {
                                watch(stream, kept);
                            }
                        }
                    }
                    None => {
                        append_capped(&mut self.stray[i], &bytes, STRAY_CAP);
                    }
                }
            }
            StreamItem::Reply(measure, body) => {
                let Some(f) = self.in_flight.take() else {
                    // A reply nobody asked for: the jail broke the
                    // protocol (its jailer ends such a session itself).
                    self.control.stop();
                    return;
                };
                let [stdout, stderr] = f.output.map(|o| String::from_utf8_lossy(&o).into_owned());
                let mut reply =
                    serde_json::from_slice::<RunnerReply>(&body).unwrap_or_else(|e| RunnerReply {
                        refused: Some(format!(
                            "the session's runner gave an unreadable reply: {e}"
                        )),
                        ..RunnerReply::default()
                    });
                keep_valid_media(&mut reply, f.media);
                let answer = Answer {
                    run_id: self.run_id.clone(),
                    policy: self.policy.clone(),
                    timeout_s: f.timeout_s,
                    reply: reply.into(),
                    stdout,
                    stderr,
                    measure: *measure,
                    refusals: Vec::new(),
                    termination: None,
                    resumed: false,
                }
                .explained(f.cap as u64);
                let _ = f.answer.send(Ok(answer));
            }
            StreamItem::Ready => {}
        }
    }
}

/// Hold what the runner sent (from the jail: untrusted) to `limits`: its
/// images, its displays, and its value's text (which the cell's displays
/// bound, as each of their text parts).
fn keep_valid_media(reply: &mut RunnerReply, limits: Option<MediaLimits>) {
    let images = limits.map(|l| l.images);
    crate::launcher::keep_valid_images(&mut reply.images, &mut reply.images_omitted, images);
    crate::displays::keep_valid_displays(&mut reply.displays, &mut reply.displays_omitted, limits);
    if let (Some(value), Some(l)) = (reply.value.as_mut(), limits) {
        reply.value_truncated |=
            pycell_protocol::bounds::cut_middle(value, l.displays.part_chars as usize);
    }
}

async fn sleep_until_some(due: Option<Instant>) {
    match due {
        Some(t) => tokio::time::sleep_until(t).await,
        None => std::future::pending().await,
    }
}

/// Output kept between requests, for the next one.
const STRAY_CAP: usize = 64 << 10;

#[cfg(test)]
mod tests {
    use super::*;

    fn result(status: RunStatus, end: Option<SessionEnd>) -> RunResult {
        let mut r = RunResult::refused(
            "r-1",
            "default",
            JailFailure::new(FailureCode::Internal, Layer::Jailer, ""),
        );
        r.status = status;
        r.error = None;
        r.session_end = end;
        r
    }

    #[test]
    fn a_session_says_why_it_ended() {
        let r = |s, e| end_of(&result(s, e)).0;
        assert_eq!(
            r(RunStatus::Killed, Some(SessionEnd::Closed)),
            EndReason::Ended
        );
        assert_eq!(
            r(RunStatus::Timeout, Some(SessionEnd::Idle)),
            EndReason::Idle
        );
        assert_eq!(
            r(RunStatus::Timeout, Some(SessionEnd::CellTimeout)),
            EndReason::CellTimeout
        );
        // Memory wins over the clocks: an OOM kill is what happened.
        assert_eq!(r(RunStatus::Oom, Some(SessionEnd::Closed)), EndReason::Oom);
        assert_eq!(r(RunStatus::Ok, None), EndReason::Exited);
        assert_eq!(r(RunStatus::Killed, None), EndReason::Killed);
        let mut refused = result(RunStatus::Refused, None);
        refused.error = Some(JailFailure::new(
            FailureCode::Internal,
            Layer::Jailer,
            "why",
        ));
        assert_eq!(end_of(&refused), (EndReason::Failed, "why".to_string()));
        let mut exited = result(RunStatus::Error, None);
        exited.exit_code = Some(3);
        assert!(end_of(&exited).1.contains("status 3"));
    }
}
