//! The one run supervisor. A started jailer is owned as two halves:
//!
//! - the process side ([`JailerProcess`]): the child and its sandbox uid
//!   lease, the supervisor's own deadline (the run's wall timeout and
//!   [`Patience::slack`]), and the stop escalation, `crate::stopper`'s as
//!   for every process pycell stops: SIGTERM (the jailer kills its
//!   sandbox, cleans up and reports `killed`), then SIGKILL after
//!   [`Patience::grace`]. Whoever holds root holds it: pycelld's monitor,
//!   or the embedded launcher (`pycell run`, `pycell mcp`).
//! - the stream side ([`RunStream`]): the jailer's events read on a task of
//!   their own, the result collector, and the run's services (its egress
//!   proxy). The broker holds it in daemon mode, the embedded launcher
//!   otherwise.
//!
//! [`supervise`] drives both halves for the embedded launcher; pycelld's
//! monitor drives the process side from its loop ([`JailerProcess::escalate`])
//! and its broker the stream side. Every mode therefore has the same
//! watchdog and the same stop path.

use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::process::ExitStatus;
use std::time::Duration;

use pycell_egress::{AuditHook, Egress, EgressConfig};
use pycell_host::uidalloc::UidLease;
use pycell_protocol::result::RunResult;
use pycell_tools::service::{ToolCalls, ToolService};
use pycell_wire::events::{Event, EventError, ReplyMeasure, Stream};
use pycell_wire::fdpass::recv_with_fds;
use pycell_wire::handout::{self, Handout};
use tokio::io::{AsyncRead, AsyncReadExt, Interest};
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::events::read_event_async;
use crate::launcher::{append_capped, Collector, JailerEnd, LaunchedAsync, JAILER_STDERR_CAP};
use crate::stopper::Stopper;

/// How long a jailer is given beyond its run's wall timeout, and after a
/// SIGTERM.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Patience {
    /// Past the run's wall timeout (the jailer enforces that itself; this
    /// catches a jailer that stopped answering), it is told to stop.
    pub slack: Duration,
    /// Told to stop and still there this long later, it is killed.
    pub grace: Duration,
}

/// Every mode's patience with its jailers.
pub const PATIENCE: Patience = Patience {
    slack: Duration::from_secs(20),
    grace: Duration::from_secs(5),
};

/// Who ended a run's jailer early, if anyone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoppedBy {
    /// Nobody: it ended by itself (the run's own deadline included).
    Nobody,
    /// Its client cancelled or went away (or `pycell run` got SIGTERM).
    Request,
    /// The supervisor's own deadline.
    Deadline,
    /// The daemon or the MCP server stopped.
    Shutdown,
}

pub use crate::stopper::Escalation;

/// A jailer's child handle: one the fork server forked (pycelld's
/// monitor, which reaps with `waitpid`: `crate::fork_server::ForkedJailer`)
/// or tokio's (the embedded launcher).
pub trait JailerChild: Send + 'static {
    fn pid(&self) -> Option<u32>;
    /// The jailer is abandoned, not yet reaped: wait for it elsewhere, and
    /// release `lease` only then.
    fn reap_later(self, lease: Option<UidLease>);
    /// It was reaped by someone else (pycelld's monitor reaps every child
    /// with `waitpid`).
    fn reaped_elsewhere(self);
}

impl JailerChild for tokio::process::Child {
    fn pid(&self) -> Option<u32> {
        self.id()
    }

    fn reap_later(mut self, lease: Option<UidLease>) {
        match tokio::runtime::Handle::try_current() {
            Ok(h) => {
                h.spawn(async move {
                    let _ = self.wait().await;
                    drop(lease);
                });
            }
            // No runtime left: the jailer still got SIGTERM (and gets it
            // again from its parent-death signal when we exit).
            Err(_) => drop(lease),
        }
    }

    fn reaped_elsewhere(self) {}
}

/// The process side of a started jailer.
#[derive(Debug)]
pub struct JailerProcess<C: JailerChild> {
    pid: i32,
    /// Until it is reaped.
    child: Option<C>,
    /// Released after the jailer is reaped (then its cgroups are gone).
    lease: Option<UidLease>,
    /// Its stop: at the run's deadline plus the slack, or when asked.
    stopper: Stopper,
    stopped_by: StoppedBy,
}

impl<C: JailerChild> JailerProcess<C> {
    /// Supervise `child` (under `lease`) whose run may last `wall`.
    pub fn new(child: C, lease: UidLease, wall: Duration, patience: Patience) -> JailerProcess<C> {
        let pid = child.pid().unwrap_or(0);
        let deadline = Instant::now() + wall + patience.slack;
        JailerProcess {
            pid: i32::try_from(pid).unwrap_or(0),
            child: Some(child),
            lease: Some(lease),
            stopper: Stopper::new(pid, Some(deadline), patience.grace),
            stopped_by: StoppedBy::Nobody,
        }
    }

    pub fn pid(&self) -> i32 {
        self.pid
    }

    /// The sandbox uid it runs under.
    pub fn uid(&self) -> Option<u32> {
        self.lease.as_ref().map(|l| l.uid)
    }

    pub fn stopped_by(&self) -> StoppedBy {
        self.stopped_by
    }

    /// Mark who stops it, without signalling (pycelld's shutdown: the
    /// jailers go with the monitor's own SIGTERM sweep).
    pub fn blame(&mut self, by: StoppedBy) {
        if self.stopped_by == StoppedBy::Nobody {
            self.stopped_by = by;
        }
    }

    /// Ask the jailer to stop (once): it kills the sandbox, cleans up and
    /// reports the run as killed.
    pub fn stop(&mut self, by: StoppedBy) {
        self.blame(by);
        self.stopper.stop();
    }

    /// Stop it at its deadline, kill it after its grace; what was done.
    pub fn escalate(&mut self) -> Option<Escalation> {
        let step = self.stopper.escalate();
        if step == Some(Escalation::Stopped) {
            self.blame(StoppedBy::Deadline);
        }
        step
    }

    /// When [`JailerProcess::escalate`] has something to do next.
    pub fn next_due(&self) -> Instant {
        self.stopper.next_due()
    }
}

impl<C: JailerChild> JailerProcess<C> {
    /// The jailer was reaped by someone else (pycelld's monitor reaps every
    /// child with `waitpid`): release the uid.
    pub fn reaped_elsewhere(&mut self) {
        self.stopper.reaped();
        if let Some(child) = self.child.take() {
            child.reaped_elsewhere();
        }
        self.lease = None;
    }
}

impl JailerProcess<tokio::process::Child> {
    /// Wait for the jailer to exit, escalating meanwhile; then release the
    /// uid (and the run's cgroups with it).
    pub async fn wait(&mut self) -> io::Result<ExitStatus> {
        let Some(mut child) = self.child.take() else {
            return Err(io::Error::other("the jailer was already reaped"));
        };
        let status = loop {
            tokio::select! {
                status = child.wait() => break status,
                // Still ours to signal: not reaped while `child` waits.
                _ = tokio::time::sleep_until(self.next_due()) => {
                    self.escalate();
                }
            }
        };
        self.stopper.reaped();
        self.lease = None;
        status
    }
}

impl<C: JailerChild> Drop for JailerProcess<C> {
    /// Abandoned before it was reaped (its caller's future dropped): the
    /// jailer is told to stop, and a thread waits for it before releasing
    /// the uid, so no later run gets the uid while a process of this one
    /// may still hold it.
    fn drop(&mut self) {
        let Some(child) = self.child.take() else {
            return;
        };
        self.stopper.stop();
        child.reap_later(self.lease.take());
    }
}

/// What a run's handed-out descriptors serve (see
/// `pycell_wire::handout`): each kind has its service here.
#[derive(Default)]
pub struct Services {
    /// The egress proxy, started on the listener the jail hands out.
    pub egress: Option<(EgressConfig, Option<AuditHook>)>,
    /// Code mode: what serves the jail's tool channel.
    pub tools: Option<ToolService>,
    /// A server over stdio: who relays its stdin and stdout (gets the
    /// socket the jail hands out).
    pub stdio: Option<tokio::sync::oneshot::Sender<OwnedFd>>,
}

impl Services {
    /// The services a run's launcher gives it itself (the egress proxy is
    /// the run's own, from its policy).
    pub fn local(tools: Option<ToolService>) -> Services {
        Services {
            tools,
            ..Services::default()
        }
    }
}

impl std::fmt::Debug for Services {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Services")
            .field("egress", &self.egress.as_ref().map(|(c, _)| &c.policy))
            .field("tools", &self.tools)
            .field("stdio", &self.stdio.is_some())
            .finish()
    }
}

/// The jailer's stdin socket, on which the jail hands descriptors out.
#[derive(Debug)]
struct Handouts {
    channel: tokio::net::UnixStream,
    ended: bool,
}

impl Handouts {
    fn new(channel: OwnedFd) -> io::Result<Handouts> {
        let channel = std::os::unix::net::UnixStream::from(channel);
        channel.set_nonblocking(true)?;
        Ok(Handouts {
            channel: tokio::net::UnixStream::from_std(channel)?,
            ended: false,
        })
    }

    /// The next handout; `None` once the channel has ended (the jail's
    /// setup is over) or broke. A frame is written with one `sendmsg` of
    /// a few dozen bytes, so once the socket is readable it is there whole.
    async fn next(&mut self) -> Option<(Handout, OwnedFd)> {
        if self.ended {
            return None;
        }
        loop {
            if self.channel.readable().await.is_err() {
                break;
            }
            let sock = &self.channel;
            let got = sock.try_io(Interest::READABLE, || {
                handout::read_frame(|buf| recv_with_fds(sock.as_fd(), buf))
            });
            match got {
                Ok(Some(h)) => return Some(h),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Ok(None) | Err(_) => break,
            }
        }
        self.ended = true;
        None
    }
}

/// What a jailer's stream brings besides its result.
#[derive(Debug)]
pub enum StreamItem {
    /// Output kept for the run (already capped).
    Output(Stream, Vec<u8>),
    /// A warm jail (a session's) is ready.
    Ready,
    /// A session's reply: what the jailer measured, and the runner's
    /// bytes (untrusted).
    Reply(Box<ReplyMeasure>, Vec<u8>),
}

/// The stream side of a started jailer: its events, decoded on a task of
/// their own (so a `select!` never drops a half-read frame), the result
/// collector, and its services, started as the jail hands out what they
/// serve.
#[derive(Debug)]
pub struct RunStream {
    events: mpsc::Receiver<Result<Event, EventError>>,
    pub collector: Collector,
    handouts: Option<Handouts>,
    services: Services,
    egress: Option<Egress>,
    tools: Option<tokio::task::JoinHandle<ToolCalls>>,
    workspace: Option<OwnedFd>,
    /// The stdio socket went to its relay.
    stdio_served: bool,
    ended: bool,
}

impl RunStream {
    /// Read `events` (the jailer's event stream) into a collector for the
    /// run, and the jail's handouts from `handouts` (the jailer's stdin
    /// socket, when it hands anything out) into `services`.
    pub fn start(
        events: impl AsyncRead + Unpin + Send + 'static,
        collector: Collector,
        handouts: Option<OwnedFd>,
        services: Services,
    ) -> RunStream {
        let handouts = handouts.and_then(|c| Handouts::new(c).ok());
        RunStream {
            events: read_events(events),
            collector,
            handouts,
            services,
            egress: None,
            tools: None,
            workspace: None,
            stdio_served: false,
            ended: false,
        }
    }

    /// The next piece of output kept for the run (already capped), until
    /// the stream ends (`None`): at the result, at its end, or broken (the
    /// caller then stops the jailer: see [`RunStream::broken`]).
    pub async fn next_output(&mut self) -> Option<(Stream, Vec<u8>)> {
        loop {
            match self.next_item().await? {
                StreamItem::Output(s, bytes) => return Some((s, bytes)),
                // A run's one reply: the images its runner sent back.
                StreamItem::Reply(_, body) => self.collector.media(&body),
                StreamItem::Ready => {}
            }
        }
    }

    /// The next item for the run or session, until the stream ends
    /// (`None`), as [`RunStream::next_output`].
    pub async fn next_item(&mut self) -> Option<StreamItem> {
        while !self.ended {
            let handing_out = self.handouts.as_ref().is_some_and(|h| !h.ended);
            tokio::select! {
                ev = self.events.recv() => {
                    if let Some(item) = self.record(ev) {
                        return Some(item);
                    }
                }
                handed = next_handout(&mut self.handouts), if handing_out => {
                    if let Some((what, fd)) = handed {
                        self.serve(what, fd);
                        self.release_handouts();
                    }
                }
            }
        }
        None
    }

    fn record(&mut self, ev: Option<Result<Event, EventError>>) -> Option<StreamItem> {
        match ev {
            Some(Ok(Event::Reply(measure, body))) => {
                return Some(StreamItem::Reply(measure, body));
            }
            Some(Ok(Event::Ready)) => return Some(StreamItem::Ready),
            Some(Ok(ev)) => {
                if let Some((s, bytes)) = self.collector.record(ev) {
                    return Some(StreamItem::Output(s, bytes.to_vec()));
                }
                // The result is the last frame: the run is over, though
                // its jailer may still be removing its cgroup.
                self.ended = self.collector.has_report();
            }
            Some(Err(e)) => {
                self.collector.broken(e);
                self.ended = true;
            }
            None => self.ended = true,
        }
        None
    }

    /// Start what a handed-out descriptor serves; one the run has no
    /// service for is closed.
    fn serve(&mut self, what: Handout, fd: OwnedFd) {
        match what {
            Handout::Workspace => self.workspace = Some(fd),
            Handout::EgressListener => {
                if let Some((config, audit)) = self.services.egress.take() {
                    self.egress = Some(Egress::start(fd, config, audit));
                }
            }
            Handout::ToolChannel => {
                let channel = std::os::unix::net::UnixStream::from(fd);
                let channel = channel
                    .set_nonblocking(true)
                    .and_then(|()| tokio::net::UnixStream::from_std(channel));
                if let (Some(service), Ok(channel)) = (self.services.tools.take(), channel) {
                    self.tools = Some(tokio::spawn(service.serve(channel)));
                }
            }
            Handout::Stdio => {
                if let Some(relay) = self.services.stdio.take() {
                    self.stdio_served = relay.send(fd).is_ok();
                }
            }
            // A zygote's is taken by `Launcher::start_zygote`, never here.
            Handout::ZygoteChannel => drop(fd),
            // The jailer's alone; a jail that sends one here is ignored.
            Handout::SeccompListener => drop(fd),
        }
    }

    /// Once every service has its descriptor, let go of the channel: a
    /// session's is its request stream too, which must close when the
    /// session ends.
    fn release_handouts(&mut self) {
        let started = self.egress.is_some() || self.tools.is_some() || self.stdio_served;
        let s = &self.services;
        if started && s.egress.is_none() && s.tools.is_none() && s.stdio.is_none() {
            self.handouts = None;
        }
    }

    /// Whether the stream broke (the jailer must then be stopped).
    pub fn broken(&self) -> bool {
        self.collector.is_broken()
    }

    /// The run's result, once its services have ended (the jail is gone,
    /// and so are its connections), and the jail's /workspace if it
    /// handed it out (the install jail).
    pub async fn finish(mut self, end: JailerEnd) -> (RunResult, Option<OwnedFd>) {
        if let Some(egress) = self.egress.take() {
            self.collector.network(egress.finish().await);
        }
        if let Some(tools) = self.tools.take() {
            self.collector.tool_calls(ended_tools(tools).await);
        }
        (self.collector.finish(end), self.workspace)
    }
}

/// What a run's tool calls came to, once its channel has ended (the jail
/// is gone, so it has; the wait is bounded all the same).
async fn ended_tools(mut tools: tokio::task::JoinHandle<ToolCalls>) -> ToolCalls {
    match tokio::time::timeout(Duration::from_secs(5), &mut tools).await {
        Ok(Ok(calls)) => calls,
        _ => {
            tools.abort();
            ToolCalls::default()
        }
    }
}

async fn next_handout(handouts: &mut Option<Handouts>) -> Option<(Handout, OwnedFd)> {
    match handouts {
        Some(h) => h.next().await,
        None => None,
    }
}

/// Decode events from `pipe` on a task of their own.
fn read_events(
    mut pipe: impl AsyncRead + Unpin + Send + 'static,
) -> mpsc::Receiver<Result<Event, EventError>> {
    let (tx, rx) = mpsc::channel(16);
    tokio::spawn(async move {
        loop {
            let ev = match read_event_async(&mut pipe).await {
                Ok(Some(ev)) => Ok(ev),
                Ok(None) => return,
                Err(e) => Err(e),
            };
            let last = ev.is_err();
            if tx.send(ev).await.is_err() || last {
                return;
            }
        }
    });
    rx
}

/// The first [`JAILER_STDERR_CAP`] bytes of the jailer's stderr, read to
/// its end on a task of its own (so it never blocks the jailer).
pub(crate) fn read_stderr(
    stderr: Option<tokio::process::ChildStderr>,
) -> tokio::task::JoinHandle<Vec<u8>> {
    tokio::spawn(async move {
        let mut kept = Vec::new();
        let Some(mut pipe) = stderr else {
            return kept;
        };
        let mut chunk = [0u8; 4096];
        while let Ok(n @ 1..) = pipe.read(&mut chunk).await {
            append_capped(&mut kept, &chunk[..n], JAILER_STDERR_CAP);
        }
        kept
    })
}

/// Run a launched jailer to its end for the embedded launcher: its output
/// to `on_output` as it arrives; `stop` resolving (a cancel, ^C's
/// SIGTERM, a shutdown) stops the run; `services` serve its tool calls
/// and stdio, if it has them (its egress proxy is started here, from its
/// policy). Returns the result, and the jail's /workspace if its spec
/// exports it (the install jail).
pub async fn supervise(
    mut l: LaunchedAsync,
    patience: Patience,
    stop: impl std::future::Future<Output = StoppedBy>,
    mut services: Services,
    mut on_output: impl FnMut(Stream, &[u8]),
) -> (RunResult, Option<OwnedFd>) {
    let collector =
        Collector::new(&l.run_id, &l.policy, Some(l.limits.clone())).with_media_limits(l.media);
    services.egress = l
        .egress
        .take()
        .map(|rules| (EgressConfig::from_env(&l.policy, rules), None));
    let stderr = read_stderr(l.child.stderr.take());
    let wall = l.limits.wall_timeout;
    let mut process = JailerProcess::new(l.child, l.lease, wall, patience);
    let mut stream = RunStream::start(l.events, collector, l.handouts, services);
    tokio::pin!(stop);
    let mut stopping = false;
    loop {
        tokio::select! {
            by = &mut stop, if !stopping => {
                stopping = true;
                process.stop(by);
            }
            _ = tokio::time::sleep_until(process.next_due()) => {
                process.escalate();
            }
            out = stream.next_output() => match out {
                Some((s, bytes)) => on_output(s, &bytes),
                None => break,
            },
        }
    }
    if stream.broken() {
        process.stop(StoppedBy::Nobody);
    }
    let status = process.wait().await;
    let stderr = stderr.await.unwrap_or_default();
    stream.finish(JailerEnd::Exited { status, stderr }).await
}
