//! The supervisor's loop while the jail runs: moves bytes between the jail's
//! pipes and the event stream (output capped), feeds its stdin, reads its
//! status messages, enforces the wall-clock deadline and acts on signals
//! sent to the jailer.

use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::time::{Duration, Instant};

use nix::fcntl::OFlag;
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::signal::{kill, Signal};
use nix::sys::signalfd::SignalFd;
use nix::sys::wait::{waitpid, WaitStatus};
use nix::unistd::Pid;
use pycell_wire::events::Stream;
use pycell_wire::spec::JailSpec;

use crate::run::outbox::{self, Outbox};
use crate::run::rest_file::RestFile;
use crate::run::run_images::BackChannel;
use crate::run::session::{ClockAction, SessionRelay, SessionStep};
use crate::run::tail::Tail;
use crate::run::warm::{Arrival, Phase, WarmState};
use crate::setup::status::ChildMessage;
use pycell_host::cgroup::{CgroupUsage, SandboxCgroup};
use pycell_runner::session::SessionRequest;
use pycell_seccomp::SyscallNames;
use pycell_wire::events::ReplyMeasure;
use pycell_wire::report::{LimitEvents, SeccompRefused, SessionEnd, StreamTail};

use crate::run::seccomp_watch::{self, SeccompWatch};

const CHUNK: usize = 64 * 1024;
/// How long output may still drain once the jail's init is gone.
const DRAIN: Duration = Duration::from_secs(2);
/// Chunks of each stream read at most before a session's reply.
const DRAIN_ROUNDS: usize = 64;

/// Our ends of the jail's pipes.
#[derive(Debug)]
pub(crate) struct ParentEnds {
    pub status_read: OwnedFd,
    pub stdin_write: OwnedFd,
    pub stdout_read: OwnedFd,
    pub stderr_read: OwnedFd,
    /// A warm jail's work stream (the jailer's stdin).
    pub work: Option<OwnedFd>,
    /// The jail sends a descriptor of its /workspace here once its root is
    /// built, for measuring its disk (see [`receive_workspace`]).
    pub disk_channel: OwnedFd,
}

/// What the relay saw, for [`crate::run::outcome::classify`].
#[derive(Debug)]
pub(crate) struct Relayed {
    pub timed_out: bool,
    pub cancelled: bool,
    pub init_status: Option<WaitStatus>,
    pub messages: Vec<ChildMessage>,
    pub truncated: [bool; 2],
    /// The ends of the streams that went over the cap.
    pub tails: [Option<StreamTail>; 2],
    /// Bytes used on the jail's writable tmpfs when it ended.
    pub disk_used_bytes: u64,
    /// The disk budget was full when the jail ended.
    pub disk_full: bool,
    /// The calls the seccomp filter refused during the run (a warm
    /// jail's: since its work came; a session's: its whole life).
    pub seccomp_refused: SeccompRefused,
    /// The jail's /workspace (`O_PATH`), if it got ready: its tmpfs
    /// outlives the jail while this is held.
    pub workspace: Option<OwnedFd>,
    /// Event frames the reader had not taken when the jail ended: they go
    /// out (blocking) before the result.
    pub unsent: Vec<u8>,
    /// A warm jail: how far it got, and what it was given.
    pub warm: Option<WarmEnd>,
    /// A session: when it became ready, and why it ended.
    pub session: Option<SessionEndState>,
}

/// How a session ended up.
#[derive(Debug)]
pub(crate) struct SessionEndState {
    /// Its runner got ready; its first request came then.
    pub ready: bool,
    pub started_at: Option<Instant>,
    pub end: Option<SessionEnd>,
    pub broken: Option<String>,
    pub warm_up_output: Vec<u8>,
}

/// How a warm jail ended up.
#[derive(Debug)]
pub(crate) struct WarmEnd {
    pub phase: Phase,
    pub work: Option<Box<pycell_runner::Work>>,
    /// What the jail's cgroup had counted when its work arrived.
    pub before: CgroupUsage,
    /// Why its work was refused, if it was.
    pub refused: Option<String>,
    pub warm_up_output: Vec<u8>,
}

/// Relay until the jail is gone and its output drained.
pub(crate) fn run(
    spec: &JailSpec,
    jail: JailRef<'_>,
    ends: ParentEnds,
    signals: &SignalFd,
    deadline: Instant,
    events: BorrowedFd<'static>,
    names: SyscallNames,
) -> io::Result<Relayed> {
    let outbox = Outbox::new(events, outbox::pending_limit(spec.limits.max_output.get()))?;
    let mut relay = Relay::new(spec, ends, outbox, names);
    let mut stopped = Stopped::default();
    let mut deadline = Some(deadline);
    let mut init_status = None;
    while relay.open() {
        let now = Instant::now();
        let due = relay.tend(spec, &jail, now, &mut deadline, &mut stopped)?;
        let wait = match (stopped.timed_out, due) {
            (true, _) => PollTimeout::from(100u16),
            (false, Some(d)) => PollTimeout::try_from(d - now).unwrap_or(PollTimeout::MAX),
            (false, None) => PollTimeout::NONE,
        };
        if relay.poll_once(signals.as_fd(), wait)? {
            match take_signals(signals) {
                SignalAction::None => {}
                // Interactive ^C: let the program see it.
                SignalAction::Interrupt => {
                    jail.signal(Signal::SIGINT);
                }
                SignalAction::Stop => stopped.cancel(&jail),
            }
        }
        if init_status.is_none() && relay.status.is_none() {
            // init closed its status pipe: it has exited (or is exiting).
            init_status = jail.wait_for_init();
            relay.start_drain();
        }
    }
    if init_status.is_none() {
        init_status = jail.wait_for_init();
    }
    Ok(relay.finish(init_status, stopped))
}

/// The jail, as the relay stops it.
pub(crate) struct JailRef<'a> {
    /// Its init (waited for, if it is our child).
    pub pid: Pid,
    /// Its init's pidfd, when it is not our child (from a zygote): its pid
    /// is not ours to reuse, so signals go through this.
    pub pidfd: Option<BorrowedFd<'a>>,
    pub cgroup: &'a SandboxCgroup,
}

/// How long a jail's init that is not our child may take to finish
/// exiting (its namespaces' teardown) before its cgroup is killed anyway.
const INIT_EXIT_WITHIN: Duration = Duration::from_secs(1);

impl JailRef<'_> {
    /// Wait for init to be gone: reaped if it is our child (its status);
    /// else until its pidfd says it exited, so that its cgroup is found
    /// empty instead of frozen and killed.
    fn wait_for_init(&self) -> Option<WaitStatus> {
        let Some(fd) = self.pidfd else {
            return waitpid(self.pid, None).ok();
        };
        let mut fds = [PollFd::new(fd, PollFlags::POLLIN)];
        let within = PollTimeout::try_from(INIT_EXIT_WITHIN).unwrap_or(PollTimeout::MAX);
        let _ = poll(&mut fds, within);
        None
    }

    fn kill(&self) {
        self.signal(Signal::SIGKILL);
        self.cgroup.kill_all();
    }

    fn signal(&self, sig: Signal) {
        match self.pidfd {
            Some(fd) => {
                let sig = rustix::process::Signal::from_named_raw(sig as i32);
                if let Some(sig) = sig {
                    let _ = rustix::process::pidfd_send_signal(fd, sig);
                }
            }
            None => {
                let _ = kill(self.pid, sig);
            }
        }
    }
}

/// Why the relay stopped the jail, if it did.
#[derive(Debug, Default)]
struct Stopped {
    timed_out: bool,
    cancelled: bool,
}

impl Stopped {
    fn cancel(&mut self, jail: &JailRef<'_>) {
        self.cancelled = true;
        jail.kill();
    }

    fn time_out(&mut self, jail: &JailRef<'_>) {
        self.timed_out = true;
        jail.kill();
    }
}

/// What became of a warm jail since the relay last asked.
enum WarmStep {
    /// Ready and waiting for its work: no clock runs.
    Ready,
    /// Its work is being fed to the runner; the wall clock runs for this.
    Started(Duration),
    /// Its launcher gave up on it (closed the work stream, or sent bad
    /// work): stop it.
    Abandoned,
}

/// A warm jail's part of the relay.
struct WarmRelay {
    state: WarmState,
    /// The jailer's stdin, on which the work comes, until it is whole.
    channel: Option<File>,
    /// The runner's stdin, held (not yet written) until the work comes.
    runner_stdin: Option<File>,
    steps: std::collections::VecDeque<WarmStep>,
    work: Option<Box<pycell_runner::Work>>,
    before: CgroupUsage,
    refused: Option<String>,
}

impl WarmRelay {
    fn new(channel: OwnedFd, runner_stdin: OwnedFd) -> WarmRelay {
        for fd in [&channel, &runner_stdin] {
            let _ = nix::fcntl::fcntl(fd, nix::fcntl::FcntlArg::F_SETFL(OFlag::O_NONBLOCK));
        }
        WarmRelay {
            state: WarmState::new(),
            channel: Some(File::from(channel)),
            runner_stdin: Some(File::from(runner_stdin)),
            steps: Default::default(),
            work: None,
            before: CgroupUsage::default(),
            refused: None,
        }
    }

    /// Read what the launcher sent on the work stream.
    fn read_channel(&mut self) {
        let mut buf = vec![0u8; CHUNK];
        let Some(f) = self.channel.as_mut() else {
            return;
        };
        let arrival = match f.read(&mut buf) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
            Ok(0) | Err(_) => Arrival::Bad(String::new()),
            Ok(n) => self.state.work_bytes(&buf[..n], Instant::now()),
        };
        match arrival {
            Arrival::Partial => {}
            Arrival::Whole(work) => {
                self.channel = None;
                self.work = Some(work);
                self.steps.push_back(WarmStep::Started(Duration::ZERO));
            }
            Arrival::Bad(why) => {
                self.channel = None;
                self.refused = (!why.is_empty()).then_some(why);
                self.steps.push_back(WarmStep::Abandoned);
            }
        }
    }

    fn end(self) -> WarmEnd {
        WarmEnd {
            phase: self.state.phase,
            work: self.work,
            before: self.before,
            refused: self.refused,
            warm_up_output: self.state.warm_up_output,
        }
    }
}

enum SignalAction {
    None,
    Interrupt,
    Stop,
}

/// Read every pending signal: SIGINT is passed on, SIGTERM/SIGHUP stop the
/// run (the strongest one seen wins); SIGCHLD only wakes us.
fn take_signals(signals: &SignalFd) -> SignalAction {
    let mut action = SignalAction::None;
    while let Ok(Some(info)) = signals.read_signal() {
        let sig = info.ssi_signo as i32;
        if sig == Signal::SIGINT as i32 {
            if matches!(action, SignalAction::None) {
                action = SignalAction::Interrupt;
            }
        } else if sig != Signal::SIGCHLD as i32 {
            action = SignalAction::Stop;
        }
    }
    action
}

/// Moves bytes between the jail's pipes and the event stream.
struct Relay {
    stdin: Option<File>,
    stdin_data: Vec<u8>,
    stdin_pos: usize,
    outs: [Option<File>; 2],
    status: Option<File>,
    status_buf: Vec<u8>,
    sent: [u64; 2],
    cap: u64,
    truncated: [bool; 2],
    tails: [Tail; 2],
    /// A session cell's streams past the cap, whole (see [`RestFile`]);
    /// whether making each was tried.
    rests: [Option<RestFile>; 2],
    rest_tried: [bool; 2],
    /// A session: the cells begun (the runner numbers them alike), and
    /// whether the request in flight is one.
    cells: u64,
    in_cell: bool,
    /// The sandbox's host uid and gid: its rest files are made as it.
    owner: (u32, u32),
    drain_deadline: Option<Instant>,
    /// Where the jail sends its /workspace (see [`receive_workspace`]).
    disk_channel: Option<OwnedFd>,
    /// The jail's /workspace, opened once the jail is ready (before any of
    /// its code runs): its tmpfs outlives the jail while we hold it, so its
    /// usage can be read at the end however the jail ended.
    disk: Option<OwnedFd>,
    outbox: Outbox,
    warm: Option<WarmRelay>,
    session: Option<SessionRelay>,
    /// A python run's way back (its images), on its stdin socket.
    back: Option<BackChannel>,
    /// The jail's seccomp listener, once the jail sent it (see
    /// [`SeccompWatch`]), and how to name the calls it hands over.
    seccomp: Option<SeccompWatch>,
    names: SyscallNames,
    /// The refused calls counted when the run's work came (warm), and
    /// when the request in flight began (a session's).
    seccomp_at_work: seccomp_watch::Counts,
    seccomp_at_request: seccomp_watch::Counts,
}

/// Which descriptor a poll slot stands for.
#[derive(Clone, Copy)]
enum Slot {
    Signals,
    Status,
    Output(usize),
    Stdin,
    Events,
    Work,
    Requests,
    Runner,
    Back,
    /// A call waits on the seccomp listener.
    Seccomp,
    /// No process uses the filter any more (or the listener broke): no
    /// call will come.
    SeccompGone,
    /// The jail's socket pair to the jailer: a descriptor it hands over.
    Handouts,
}

impl Relay {
    fn new(spec: &JailSpec, ends: ParentEnds, outbox: Outbox, names: SyscallNames) -> Relay {
        let (mut stdin, mut warm, mut session) = (None, None, None);
        let back = match (spec.media, spec.session) {
            (Some(_), None) => BackChannel::new(&ends.stdin_write).ok(),
            _ => None,
        };
        match (ends.work, spec.session) {
            (Some(channel), Some(clocks)) => {
                // Output is drained, not waited for, before each reply.
                for out in [&ends.stdout_read, &ends.stderr_read] {
                    let _ =
                        nix::fcntl::fcntl(out, nix::fcntl::FcntlArg::F_SETFL(OFlag::O_NONBLOCK));
                }
                session = Some(SessionRelay::new(clocks, channel, ends.stdin_write));
            }
            (Some(channel), None) => warm = Some(WarmRelay::new(channel, ends.stdin_write)),
            (None, _) => {
                stdin = (!spec.stdin.is_empty()).then(|| {
                    let _ = nix::fcntl::fcntl(
                        &ends.stdin_write,
                        nix::fcntl::FcntlArg::F_SETFL(OFlag::O_NONBLOCK),
                    );
                    File::from(ends.stdin_write)
                });
            }
        }
        let mut relay = Relay {
            stdin,
            stdin_data: spec.stdin.clone(),
            stdin_pos: 0,
            outs: [
                Some(File::from(ends.stdout_read)),
                Some(File::from(ends.stderr_read)),
            ],
            status: Some(File::from(ends.status_read)),
            status_buf: Vec::new(),
            sent: [0, 0],
            cap: spec.limits.max_output.get(),
            truncated: [false, false],
            tails: tails(spec.limits.max_output.get()),
            rests: [None, None],
            rest_tried: [false, false],
            cells: 0,
            in_cell: false,
            owner: (spec.sandbox_uid, spec.sandbox_gid),
            drain_deadline: None,
            disk_channel: Some(ends.disk_channel),
            disk: None,
            outbox,
            warm,
            session,
            back,
            seccomp: None,
            names,
            seccomp_at_work: Default::default(),
            seccomp_at_request: Default::default(),
        };
        // A run with no stdin to write sees its end at once.
        if relay.stdin.is_none() && relay.warm.is_none() && relay.session.is_none() {
            relay.end_stdin();
        }
        relay
    }

    /// The next change of a warm jail's phase, acted upon: once its work
    /// is whole, the runner's stdin gets it, the run's output cap applies
    /// and its CPU clock starts.
    fn warm_step(&mut self, spec: &JailSpec, pid: Pid, cgroup: &SandboxCgroup) -> Option<WarmStep> {
        let w = self.warm.as_mut()?;
        let step = w.steps.pop_front()?;
        let WarmStep::Started(_) = step else {
            return Some(step);
        };
        let work = w.work.as_ref().expect("work arrived");
        w.before = cgroup.usage();
        self.seccomp_at_work = self
            .seccomp
            .as_ref()
            .map(SeccompWatch::counts)
            .unwrap_or_default();
        if let Err(e) = crate::run::warm::restart_cpu_clock(
            spec,
            pid,
            cgroup,
            spec.limits.cpu_time_whole_secs(),
            spec.limits.cpu_time_whole_secs(),
            crate::run::warm::CpuBackstop::HardLimit,
        ) {
            w.refused = Some(format!("restarting the CPU clock: {e}"));
            return Some(WarmStep::Abandoned);
        }
        self.stdin_data = work.runner_input();
        self.stdin_pos = 0;
        self.stdin = w.runner_stdin.take();
        self.cap = work.max_output.get();
        self.tails = tails(self.cap);
        self.outbox
            .set_limit(outbox::pending_limit(work.max_output.get()));
        Some(WarmStep::Started(work.wall_timeout))
    }

    /// Act on what a session's channels brought: a request begins (its
    /// CPU clock restarts, its output cap applies), a reply goes out with
    /// what the request cost, after the output it printed. Returns why
    /// the session ended, when it has.
    fn session_steps(
        &mut self,
        spec: &JailSpec,
        pid: Pid,
        cgroup: &SandboxCgroup,
    ) -> io::Result<Option<SessionEnd>> {
        let mut ended = None;
        while let Some(step) = self.session.as_mut().and_then(|s| s.steps.pop_front()) {
            match step {
                SessionStep::Ready => self.outbox.offer_ready()?,
                SessionStep::Begin(op) => self.begin_request(spec, &op, pid, cgroup),
                SessionStep::Reply(body) => self.send_reply(&body, cgroup)?,
                SessionStep::End(why) => ended = Some(why),
            }
        }
        Ok(ended)
    }

    fn begin_request(
        &mut self,
        spec: &JailSpec,
        op: &pycell_runner::session::SessionOp,
        pid: Pid,
        cgroup: &SandboxCgroup,
    ) {
        let Some(s) = self.session.as_mut() else {
            return;
        };
        s.before = cgroup.usage();
        self.seccomp_at_request = self
            .seccomp
            .as_ref()
            .map(SeccompWatch::counts)
            .unwrap_or_default();
        // A program that is gone has no clock to restart: the jail ends.
        let _ = crate::run::warm::restart_cpu_clock(
            spec,
            pid,
            cgroup,
            pycell_wire::limits::whole_secs(op.cpu_time),
            spec.limits.cpu_time_whole_secs(),
            crate::run::warm::CpuBackstop::WallClock,
        );
        s.clocks.begin(Instant::now(), op.wall_timeout);
        self.sent = [0, 0];
        self.truncated = [false, false];
        self.cap = op.max_output.get();
        self.tails = tails(self.cap);
        self.in_cell = matches!(op.request, SessionRequest::Cell { .. });
        self.cells += u64::from(self.in_cell);
        self.rests = [None, None];
        self.rest_tried = [false, false];
        self.outbox
            .set_limit(outbox::pending_limit(op.max_output.get()));
    }

    /// The reply, after the output the request left in the pipes (the
    /// runner flushed its own before replying; a program that keeps
    /// printing is read for a bounded while, the rest follows later).
    fn send_reply(&mut self, body: &[u8], cgroup: &SandboxCgroup) -> io::Result<()> {
        for _ in 0..DRAIN_ROUNDS {
            let (out, err) = (self.read_output(0)?, self.read_output(1)?);
            if !out && !err {
                break;
            }
        }
        let disk_full = self.disk_full();
        let seccomp_refused = self.seccomp_refused_since(&self.seccomp_at_request);
        let [stdout_tail, stderr_tail] = [self.take_tail(0), self.take_tail(1)];
        let Some(s) = self.session.as_mut() else {
            return Ok(());
        };
        let (took, interrupted) = s.clocks.end_request(Instant::now());
        let usage = cgroup.usage();
        let measure = ReplyMeasure {
            wall_ms: took.as_secs_f64() * 1000.0,
            cpu_ms: usage.cpu_ns.saturating_sub(s.before.cpu_ns) as f64 / 1e6,
            memory_bytes: cgroup.memory_now(),
            peak_memory_bytes: usage.peak_memory_bytes,
            stdout_truncated: self.truncated[0],
            stderr_truncated: self.truncated[1],
            stdout_tail,
            stderr_tail,
            interrupted,
            limit_events: LimitEvents {
                disk_full,
                ..usage.limit_events().since(s.before.limit_events())
            },
            seccomp_refused,
        };
        self.in_cell = false;
        self.outbox.offer_reply(&measure, body)
    }

    /// Stream `i`'s tail for the reply, naming its rest file if it has one.
    fn take_tail(&mut self, i: usize) -> Option<StreamTail> {
        let tail = self.tails[i].take()?;
        Some(match self.rests[i].take() {
            Some(rest) => rest.name_in(tail),
            None => tail,
        })
    }

    /// Bytes of stream `i` past the cap: the tail keeps their end, a
    /// session cell's rest file all of them.
    fn past_cap(&mut self, i: usize, bytes: &[u8]) {
        if bytes.is_empty() {
            return;
        }
        self.tails[i].push(bytes);
        if !self.in_cell {
            return;
        }
        if !self.rest_tried[i] {
            self.rest_tried[i] = true;
            let stream = [Stream::Stdout, Stream::Stderr][i];
            let (cell, owner) = (self.cells, self.owner);
            self.rests[i] = self
                .disk
                .as_ref()
                .and_then(|ws| RestFile::create(ws.as_fd(), cell, stream, owner));
        }
        if let Some(rest) = self.rests[i].as_mut() {
            rest.write(bytes);
        }
    }

    /// A session's clocks: an overdue request is interrupted, an overdue
    /// session ended (at the next round). Returns when they are next due;
    /// once ready, the warm-up deadline no longer applies.
    fn session_clock(
        &mut self,
        now: Instant,
        pid: Pid,
        deadline: &mut Option<Instant>,
    ) -> Option<Instant> {
        let s = self.session.as_mut()?;
        if s.end.is_some() {
            return None;
        }
        // From its first request on, the session's own clocks bound it.
        if s.clocks.started_at().is_some() {
            *deadline = None;
        }
        match s.clocks.due(now) {
            Some(ClockAction::Interrupt) => {
                let _ = kill(pid, Signal::SIGINT);
            }
            Some(ClockAction::End(why)) => {
                s.ended(why, None);
                return Some(now);
            }
            None => {}
        }
        s.clocks.next_due()
    }

    /// Act on the clocks and on what the warm or session channels
    /// brought; returns when the next clock is due.
    fn tend(
        &mut self,
        spec: &JailSpec,
        jail: &JailRef<'_>,
        now: Instant,
        deadline: &mut Option<Instant>,
        stopped: &mut Stopped,
    ) -> io::Result<Option<Instant>> {
        while let Some(step) = self.warm_step(spec, jail.pid, jail.cgroup) {
            match step {
                WarmStep::Ready => *deadline = None,
                WarmStep::Started(wall) => *deadline = Some(now + wall),
                WarmStep::Abandoned => stopped.cancel(jail),
            }
        }
        let mut session_due = None;
        if self.session.is_some() {
            match self.session_steps(spec, jail.pid, jail.cgroup)? {
                Some(SessionEnd::Closed | SessionEnd::Protocol) => stopped.cancel(jail),
                Some(_) => stopped.time_out(jail),
                None => {}
            }
            session_due = self.session_clock(now, jail.pid, deadline);
        }
        if !stopped.timed_out && deadline.is_some_and(|d| now >= d) {
            stopped.time_out(jail);
        }
        let answer_due = self.seccomp.as_ref().and_then(SeccompWatch::resume_at);
        Ok(deadline
            .iter()
            .copied()
            .chain(session_due)
            .chain(answer_due)
            .min())
    }

    /// What the relay saw, once the jail is gone.
    fn finish(mut self, init_status: Option<WaitStatus>, stopped: Stopped) -> Relayed {
        let disk_used_bytes = self.disk_used();
        let disk_full = self.disk_full();
        let seccomp_refused = self.seccomp_refused_since(&self.seccomp_at_work);
        // The run's images go before its result.
        if let Some(body) = self.back.take().and_then(BackChannel::take_frame) {
            let _ = self
                .outbox
                .offer_reply(&pycell_wire::events::ReplyMeasure::default(), &body);
        }
        Relayed {
            timed_out: stopped.timed_out,
            cancelled: stopped.cancelled,
            init_status,
            messages: self.messages(),
            truncated: self.truncated,
            tails: self.tails.each_mut().map(Tail::take),
            disk_used_bytes,
            disk_full,
            seccomp_refused,
            workspace: self.disk.take(),
            warm: self.warm.map(WarmRelay::end),
            session: self.session.map(|s| SessionEndState {
                ready: s.clocks.is_ready(),
                started_at: s.clocks.started_at(),
                end: s.end,
                broken: s.broken,
                warm_up_output: s.warm.warm_up_output,
            }),
            unsent: self.outbox.into_unsent(),
        }
    }

    fn open(&self) -> bool {
        if self.drain_deadline.is_some_and(|d| Instant::now() >= d) {
            return false;
        }
        self.outs.iter().any(Option::is_some) || self.status.is_some()
    }

    /// After init is gone the namespace is being torn down; whatever still
    /// holds the output pipes dies with it, so EOF comes soon. Bound it anyway.
    fn start_drain(&mut self) {
        self.drain_deadline = Some(Instant::now() + DRAIN);
        self.end_stdin();
    }

    /// Nothing more goes to the program's stdin: it sees its end.
    fn end_stdin(&mut self) {
        self.stdin = None;
        if let Some(b) = &self.back {
            b.end_stdin();
        }
    }

    /// One poll round. Returns true if the signalfd is readable.
    fn poll_once(&mut self, signals: BorrowedFd<'_>, wait: PollTimeout) -> io::Result<bool> {
        let ready = self.poll_ready(signals, wait)?;
        let mut signal = false;
        for slot in ready {
            match slot {
                Slot::Signals => signal = true,
                Slot::Status => self.read_status(),
                Slot::Output(i) => {
                    self.read_output(i)?;
                }
                Slot::Stdin => self.write_stdin(),
                Slot::Events => self.outbox.flush_some()?,
                Slot::Work => {
                    if let Some(w) = self.warm.as_mut() {
                        w.read_channel();
                    }
                }
                Slot::Requests => {
                    if let Some(s) = self.session.as_mut() {
                        s.read_requests();
                    }
                }
                Slot::Runner => {
                    if let Some(s) = self.session.as_mut() {
                        s.write_runner();
                        s.read_runner();
                    }
                }
                Slot::Back => {
                    if let Some(b) = self.back.as_mut() {
                        b.read();
                    }
                }
                Slot::Seccomp => {
                    if let Some(w) = self.seccomp.as_mut() {
                        w.answer(Instant::now());
                    }
                }
                Slot::Handouts => self.read_handout(),
                Slot::SeccompGone => {
                    if let Some(w) = self.seccomp.as_mut() {
                        w.stop_listening();
                    }
                }
            }
        }
        Ok(signal)
    }

    /// The slots with something to do after waiting at most `wait`.
    fn poll_ready(&self, signals: BorrowedFd<'_>, wait: PollTimeout) -> io::Result<Vec<Slot>> {
        let mut fds = vec![PollFd::new(signals, PollFlags::POLLIN)];
        let mut slots = vec![Slot::Signals];
        if let Some(f) = &self.status {
            fds.push(PollFd::new(f.as_fd(), PollFlags::POLLIN));
            slots.push(Slot::Status);
        }
        for (i, o) in self.outs.iter().enumerate() {
            if let Some(f) = o {
                fds.push(PollFd::new(f.as_fd(), PollFlags::POLLIN));
                slots.push(Slot::Output(i));
            }
        }
        if let Some(f) = &self.stdin {
            fds.push(PollFd::new(f.as_fd(), PollFlags::POLLOUT));
            slots.push(Slot::Stdin);
        }
        if let Some(fd) = self.back.as_ref().and_then(BackChannel::fd) {
            fds.push(PollFd::new(fd, PollFlags::POLLIN));
            slots.push(Slot::Back);
        }
        let now = Instant::now();
        if let Some(fd) = self.seccomp.as_ref().and_then(|w| w.fd(now)) {
            fds.push(PollFd::new(fd, PollFlags::POLLIN));
            slots.push(Slot::Seccomp);
        }
        if let Some(c) = &self.disk_channel {
            fds.push(PollFd::new(c.as_fd(), PollFlags::POLLIN));
            slots.push(Slot::Handouts);
        }
        if self.outbox.waiting() > 0 {
            fds.push(PollFd::new(self.outbox.fd(), PollFlags::POLLOUT));
            slots.push(Slot::Events);
        }
        // Work that comes early waits, unread, until the jail is ready.
        let ready = |w: &&WarmRelay| matches!(w.state.phase, Phase::Ready { .. });
        let work = self
            .warm
            .as_ref()
            .filter(ready)
            .and_then(|w| w.channel.as_ref());
        if let Some(f) = work {
            fds.push(PollFd::new(f.as_fd(), PollFlags::POLLIN));
            slots.push(Slot::Work);
        }
        if let Some(s) = &self.session {
            if let Some(fd) = s.requests_fd() {
                fds.push(PollFd::new(fd, PollFlags::POLLIN));
                slots.push(Slot::Requests);
            }
            if let Some((fd, writing)) = s.runner_fd() {
                let mut want = PollFlags::POLLIN;
                want.set(PollFlags::POLLOUT, writing);
                fds.push(PollFd::new(fd, want));
                slots.push(Slot::Runner);
            }
        }
        let wait = match self.drain_deadline {
            Some(_) => PollTimeout::from(50u16),
            None => wait,
        };
        match poll(&mut fds, wait) {
            Ok(_) | Err(nix::errno::Errno::EINTR) => {}
            Err(e) => return Err(e.into()),
        }
        Ok(fds
            .iter()
            .zip(slots)
            .filter_map(|(f, s)| match (s, f.revents()) {
                (_, None) => None,
                (_, Some(r)) if r.is_empty() => None,
                // The listener's read blocks unless a call waits: only
                // POLLIN says one does; a hang-up alone says none will.
                (Slot::Seccomp, Some(r)) if !r.contains(PollFlags::POLLIN) => {
                    Some(Slot::SeccompGone)
                }
                (s, Some(_)) => Some(s),
            })
            .collect())
    }

    fn read_status(&mut self) {
        let mut buf = [0u8; 4096];
        let Some(f) = self.status.as_mut() else {
            return;
        };
        match f.read(&mut buf) {
            Ok(0) | Err(_) => self.status = None,
            Ok(n) => self.status_buf.extend_from_slice(&buf[..n]),
        }
    }

    /// Take one descriptor the jail handed the jailer: its /workspace
    /// (once its root is built) or its seccomp listener (as soon as the
    /// filter is in, so that a refused call of init's is answered too).
    /// The jail closes its end after the listener.
    fn read_handout(&mut self) {
        use pycell_wire::handout::{recv, Handout};
        let Some(channel) = self.disk_channel.as_ref() else {
            return;
        };
        match recv(channel.as_fd()) {
            Ok(Some((Handout::Workspace, fd))) if self.disk.is_none() => self.disk = Some(fd),
            Ok(Some((Handout::SeccompListener, fd))) if self.seccomp.is_none() => {
                self.seccomp = Some(SeccompWatch::new(fd, self.names));
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            // The end, a second copy, or garbage: nothing more is taken.
            _ => self.disk_channel = None,
        }
    }

    /// The calls the seccomp filter refused since `before`.
    fn seccomp_refused_since(&self, before: &seccomp_watch::Counts) -> SeccompRefused {
        self.seccomp
            .as_ref()
            .map(|w| w.refused_since(before))
            .unwrap_or_default()
    }

    /// Bytes in use on the jail's writable tmpfs (0 if it never got ready).
    fn disk_used(&self) -> u64 {
        let Some(fd) = self.disk.as_ref() else {
            return 0;
        };
        nix::sys::statvfs::fstatvfs(fd)
            .map(|s| (s.blocks() - s.blocks_free()) * s.fragment_size())
            .unwrap_or(0)
    }

    /// Whether the jail's writable tmpfs (its disk budget) is full: less
    /// than one block, or no inode, left.
    fn disk_full(&self) -> bool {
        let Some(fd) = self.disk.as_ref() else {
            return false;
        };
        nix::sys::statvfs::fstatvfs(fd)
            .map(|s| s.blocks_free() == 0 || s.files_free() == 0)
            .unwrap_or(false)
    }

    /// Read one chunk of stdout (0) or stderr (1); false if there was
    /// nothing to read (a session's pipes do not block).
    fn read_output(&mut self, i: usize) -> io::Result<bool> {
        let mut buf = vec![0u8; CHUNK];
        let Some(f) = self.outs[i].as_mut() else {
            return Ok(false);
        };
        let n = match f.read(&mut buf) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
            Ok(0) | Err(_) => {
                self.outs[i] = None;
                return Ok(false);
            }
            Ok(n) => n,
        };
        if let Some(w) = self.warm.as_mut().filter(|w| !w.state.running()) {
            if w.state.warm_up_output(i == 0, &buf[..n], Instant::now()) {
                w.steps.push_back(WarmStep::Ready);
                self.outbox.offer_ready()?;
            }
            return Ok(true);
        }
        if let Some(s) = self.session.as_mut().filter(|s| !s.clocks.is_ready()) {
            s.warm_up_output(i == 0, &buf[..n], Instant::now());
            return Ok(true);
        }
        let room = self.cap.saturating_sub(self.sent[i]) as usize;
        if n > room {
            self.truncated[i] = true;
        }
        let take = n.min(room);
        if take > 0 {
            let stream = [Stream::Stdout, Stream::Stderr][i];
            if self.outbox.offer(stream, &buf[..take])? {
                self.sent[i] += take as u64;
            } else {
                // The reader is too far behind: from here on this stream
                // is dropped, as past its cap, and the result says so.
                self.sent[i] = self.cap;
                self.truncated[i] = true;
                self.past_cap(i, &buf[..take]);
            }
        }
        // Past the cap we keep reading, so the program is not blocked on a
        // full pipe (the timeout bounds how long that goes on), and keep
        // only the stream's last bytes, for the result (and a session
        // cell's whole rest, in its workspace).
        self.past_cap(i, &buf[take..n]);
        Ok(true)
    }

    fn write_stdin(&mut self) {
        let Some(f) = self.stdin.as_mut() else { return };
        match f.write(&self.stdin_data[self.stdin_pos..]) {
            Ok(n) => {
                self.stdin_pos += n;
                if self.stdin_pos >= self.stdin_data.len() {
                    self.end_stdin();
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(_) => self.end_stdin(),
        }
    }

    fn messages(&self) -> Vec<ChildMessage> {
        self.status_buf
            .split(|b| *b == b'\n')
            .filter(|l| !l.is_empty())
            .filter_map(|l| serde_json::from_slice(l).ok())
            .collect()
    }
}

/// A fresh tail for each stream, under the cap `cap`.
fn tails(cap: u64) -> [Tail; 2] {
    [Tail::new(cap), Tail::new(cap)]
}
