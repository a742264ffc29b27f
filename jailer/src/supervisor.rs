//! The jailer's outer half (host root, single-threaded): checks the spec and
//! the host, clones the jail into new namespaces, writes its uid/gid maps,
//! builds and joins its cgroup ([`spawn`]), relays its output as event
//! frames until it ends ([`crate::run::relay`]), decides how it ended
//! ([`crate::run::outcome::classify`]) and reports. The cgroup is killed before
//! the report is written, and removed (by its `Drop`) after.

use std::fs::File;
use std::io::{self, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::time::{Duration, Instant, SystemTime};

use nix::fcntl::OFlag;
use nix::sys::signal::{kill, sigprocmask, SigSet, SigmaskHow, Signal};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use nix::sys::wait::waitpid;
use nix::unistd::{pipe2, setgroups, Pid};
use pycell_seccomp::KernelGap;
use pycell_wire::codes::{FailureCode, Layer};
use pycell_wire::events;
use pycell_wire::report::{
    CgroupReport, JailFailure, JailReport, Layers, LimitEvents, SeccompReport,
};
use pycell_wire::spec::{JailSpec, NetworkSpec, SlotIds, WorkspaceFile};

use crate::run::outcome::{classify, Observed};
use crate::run::relay::{self, ParentEnds};
use crate::setup::child::{child_main, ChildFds};
use crate::setup::ns_owner::{AsOwner, MapFiles};
use crate::setup::preflight::{cgroup_failure, preflight, Checked};
use crate::setup::status::{GO_CGROUP, GO_MAPS};
use crate::timings::mark;
use pycell_host::cgroup::{self, CgroupLayout, CgroupLimits, CgroupUsage, SandboxCgroup};
use pycell_syscall::{self as syscall, CloneResult};
use pycell_wire::outcome::Outcome;

/// The namespaces every jail gets (the cgroup one is entered by the child
/// once it has been moved into its cgroup).
const NAMESPACES: &[&str] = &["user", "pid", "mount", "net", "ipc", "uts", "cgroup"];
const CLONE_FLAGS: libc::c_int = libc::CLONE_NEWUSER
    | libc::CLONE_NEWPID
    | libc::CLONE_NEWNS
    | libc::CLONE_NEWNET
    | libc::CLONE_NEWIPC
    | libc::CLONE_NEWUTS;

/// Run the jail described by `spec`, writing its output to `events` as
/// frames, then the report. The caller must be single-threaded (the
/// jail is cloned from it). Blocks SIGINT/SIGTERM/SIGHUP/SIGCHLD while it
/// runs (SIGINT is passed on to the program; SIGTERM/SIGHUP kill the jail).
pub(crate) fn run(spec: &JailSpec, handed: &mut crate::Handed, events: &mut dyn Write) -> Outcome {
    let starter = nix::unistd::getppid();
    let (report, mut left) = match run_checked(spec, handed, events) {
        Ok((report, left)) => (report, Some(left)),
        Err(f) => (JailReport::refused(f), None),
    };
    let _ = events::write_result(events, &report);
    let _ = events.flush();
    // The jail's (empty) cgroup is removed, and its mounts torn down, after
    // the result is out: a client waits for the one, not the other. A
    // starter gone by now (pycelld SIGKILLed) removes no kept cgroup: none
    // is kept.
    if nix::unistd::getppid() != starter {
        if let Some(l) = left.as_mut() {
            l.cgroup.do_not_keep();
        }
    }
    drop(left);
    Outcome::of(&report)
}

/// What is left of a jail whose program ended: its mount namespace (no
/// process in it) and its empty cgroup, both gone when this is dropped, in
/// that order (the jail's tmpfs pages, charged to the cgroup, are freed
/// before a v1 cgroup is kept for the next run).
struct Remains {
    _mounts: Option<File>,
    cgroup: SandboxCgroup,
}

fn run_checked(
    spec: &JailSpec,
    handed: &mut crate::Handed,
    events: &mut dyn Write,
) -> Result<(JailReport, Remains), JailFailure> {
    let checked = preflight(spec)?;
    mark("jailer: preflight (spec, host, seccomp filter)");
    // The jail inherits our supplementary groups and could never drop them
    // (setgroups is denied inside); clear them here.
    setgroups(&[]).map_err(|e| {
        JailFailure::new(
            FailureCode::SetgroupsFailed,
            Layer::UserNamespace,
            format!("setgroups([]): {e}"),
        )
    })?;
    let signals = block_signals()?;
    let grants = std::mem::take(&mut handed.grants);
    let jail = match (&spec.from_zygote, handed.zygote.take()) {
        (Some(_), Some(channel)) => spawn_from_zygote(spec, &checked, channel)?,
        (Some(_), None) => return Err(crate::zygote::no_channel()),
        (None, _) => spawn(spec, &checked, grants)?,
    };
    // Held until the result is out: the last process of the jail to exit
    // (its init) then leaves the namespace's teardown (every mount of
    // the jail, and a grace period of the kernel's) to us, later.
    let mounts = File::open(format!("/proc/{}/ns/mnt", jail.pid)).ok();
    let deadline = jail.start + spec.limits.wall_timeout;
    let relayed = relay::run(
        spec,
        relay::JailRef {
            pid: jail.pid,
            pidfd: jail.pidfd.as_ref().map(AsFd::as_fd),
            cgroup: &jail.cgroup,
        },
        jail.ends,
        &signals,
        deadline,
        events_fd(),
        checked.filter.syscall_names(),
    )
    .map_err(io_failure("relaying output"))?;
    let end = jail.start.elapsed();
    mark("jailer: program ended, output relayed");
    jail.cgroup.kill_all();
    // Only now, with the sandbox gone, wait for a slow reader to take the rest.
    events
        .write_all(&relayed.unsent)
        .map_err(io_failure("writing output"))?;
    let usage = jail.cgroup.usage();
    mark("jailer: cgroup emptied, usage read");
    let cleanups = crate::run::grant_sweep::sweep(&jail.grants.roots, jail.grants.started_at);
    let zygote = jail.zygote.as_ref().map(AsFd::as_fd);
    let mut report = assemble_report(spec, &checked, relayed, &usage, end, &jail.cgroup, zygote)?;
    report.grant_cleanups = cleanups;
    let remains = Remains {
        _mounts: mounts,
        cgroup: jail.cgroup,
    };
    Ok((report, remains))
}

/// The report of a jail whose program ended after `end`, from what the
/// relay saw and the cgroup's `usage`.
fn assemble_report(
    spec: &JailSpec,
    checked: &Checked,
    relayed: relay::Relayed,
    usage: &cgroup::sandbox::CgroupUsage,
    end: Duration,
    cgroup: &SandboxCgroup,
    zygote: Option<BorrowedFd<'_>>,
) -> Result<JailReport, JailFailure> {
    let changes = run_changes(spec, &relayed);
    let run = match &relayed.session {
        Some(session) => session_run(spec, session, end)?,
        None => warm_run(spec, relayed.warm.as_ref(), relayed.cancelled, end)?,
    };
    let session_end = relayed.session.as_ref().and_then(|s| s.end);
    let mut seen = Observed {
        timed_out: relayed.timed_out,
        cancelled: relayed.cancelled,
        oom_kills: usage.oom_kills,
        messages: relayed.messages,
        init_status: crate::run::outcome::describe_end(relayed.init_status),
        zygote_died: false,
    };
    if let Some(channel) = zygote.filter(|_| crate::run::outcome::ended_unexplained(&seen)) {
        seen.zygote_died = crate::zygote::gone(channel, crate::zygote::DEATH_GRACE);
    }
    let mut outcome = classify(&seen, &run.limits)?;
    if let (Some(why), Some(clocks)) = (session_end, spec.session) {
        outcome.error = crate::run::session::end_failure(why, &clocks).or(outcome.error);
    }
    let report = JailReport {
        status: outcome.status,
        exit_code: outcome.exit_code,
        signal: outcome.signal,
        stdout_truncated: relayed.truncated[0],
        stderr_truncated: relayed.truncated[1],
        stdout_tail: relayed.tails[0].clone(),
        stderr_tail: relayed.tails[1].clone(),
        wall_ms: run.wall.as_secs_f64() * 1000.0,
        cpu_ms: usage.cpu_ns.saturating_sub(run.before.cpu_ns) as f64 / 1e6,
        peak_memory_bytes: usage.peak_memory_bytes,
        disk_used_bytes: relayed.disk_used_bytes,
        warm_waited_ms: run.waited_ms,
        session_end,
        files: changes.files,
        files_truncated: changes.truncated,
        grant_cleanups: Vec::new(),
        layers: layers(spec, checked, &outcome, cgroup),
        error: outcome.error,
        timings: jail_timings(&seen.messages),
        limit_events: LimitEvents {
            disk_full: relayed.disk_full,
            ..usage.limit_events().since(run.before.limit_events())
        },
        seccomp_refused: relayed.seccomp_refused,
    };
    Ok(report)
}

/// The jail's marks and ours, when the spec asked for them.
fn jail_timings(
    messages: &[crate::setup::status::ChildMessage],
) -> Vec<pycell_wire::timings::Mark> {
    mark("jailer: report assembled");
    let jail = messages.iter().find_map(|m| match m {
        crate::setup::status::ChildMessage::Ready { timings, .. } => Some(timings.clone()),
        _ => None,
    });
    let mut marks = crate::timings::take();
    marks.extend(jail.unwrap_or_default());
    marks
}

/// The layers the jail had, as the report says them.
fn layers(
    spec: &JailSpec,
    checked: &Checked,
    outcome: &crate::run::outcome::Outcome,
    cgroup: &SandboxCgroup,
) -> Option<Layers> {
    // A zygote, which applies no Landlock, has none to report.
    Some(Layers {
        namespaces: NAMESPACES.iter().map(|s| s.to_string()).collect(),
        sandbox_uid: spec.sandbox_uid,
        landlock: outcome.landlock.clone()?,
        seccomp: seccomp_report(spec, checked, outcome.xattr_writes_refused),
        cgroup: CgroupReport {
            version: cgroup.version(),
            name: cgroup.name().to_string(),
        },
        no_new_privs: true,
        capabilities: "none".to_string(),
    })
}

/// What a run (not a session: its cells report theirs) left changed in
/// /workspace, looked at once the jail is gone; the install jail's
/// workspace is its env, not a run's output.
fn run_changes(spec: &JailSpec, relayed: &relay::Relayed) -> crate::run::changed::Changes {
    match (&relayed.workspace, &relayed.session) {
        (Some(ws), None) if !spec.export_workspace => {
            crate::run::changed::changed_files(ws.as_fd(), &run_inputs(spec, relayed.warm.as_ref()))
        }
        _ => crate::run::changed::Changes::default(),
    }
}

/// The files a run was given in /workspace: its spec's, or a warm jail's
/// script, which came with its work.
fn run_inputs(spec: &JailSpec, warm: Option<&relay::WarmEnd>) -> Vec<WorkspaceFile> {
    match warm.and_then(|w| w.work.as_ref()) {
        Some(work) => vec![WorkspaceFile::text(
            work.filename.clone(),
            work.code.clone(),
        )],
        None => spec.files.clone(),
    }
}

/// What the report counts from, and against: for a cold jail, its start
/// and its spec's limits; for a warm one, its work's arrival and the
/// limits the work brought.
struct RunClock {
    limits: pycell_wire::limits::RunLimits,
    wall: Duration,
    before: CgroupUsage,
    waited_ms: Option<f64>,
}

/// The run's clock. A warm jail that never got its work did not run: a
/// failed warm-up is refused (its output goes to our stderr, the
/// operator's, unless it was stopped, `cancelled`, before it was ready:
/// a pool or a server that stops), as is work it could not take.
fn warm_run(
    spec: &JailSpec,
    warm: Option<&relay::WarmEnd>,
    cancelled: bool,
    since_start: Duration,
) -> Result<RunClock, JailFailure> {
    let mut clock = RunClock {
        limits: spec.limits.clone(),
        wall: since_start,
        before: CgroupUsage::default(),
        waited_ms: None,
    };
    let Some(w) = warm else {
        return Ok(clock);
    };
    let not_run = |m: String| JailFailure::new(FailureCode::JailSetupFailed, Layer::Jailer, m);
    if let Some(why) = &w.refused {
        return Err(not_run(format!(
            "the warm jail could not take its work: {why}"
        )));
    }
    match (w.phase, &w.work) {
        (crate::run::warm::Phase::Running { since, waited_ms }, Some(work)) => {
            clock.limits.wall_timeout = work.wall_timeout;
            clock.limits.max_output = work.max_output;
            clock.wall = since.elapsed().min(since_start);
            clock.before = w.before;
            clock.waited_ms = Some(waited_ms);
            Ok(clock)
        }
        (crate::run::warm::Phase::WarmingUp, _) if cancelled => Err(not_run(
            "the warm jail was stopped before it was ready".into(),
        )),
        (crate::run::warm::Phase::WarmingUp, _) => {
            let output = String::from_utf8_lossy(&w.warm_up_output);
            eprintln!(
                "pycell-jailer: warm jail {} ended while warming up; its output:\n{}",
                spec.run_id,
                output.trim_end()
            );
            Err(not_run("the warm jail ended before it was ready (its warm-up output is in the jailer's stderr)".into()))
        }
        _ => Err(not_run(
            "the warm jail was stopped before it got work".into(),
        )),
    }
}

/// A session's clock, from its first request. One that never got ready
/// did not run: refused, its warm-up output on our stderr.
fn session_run(
    spec: &JailSpec,
    session: &relay::SessionEndState,
    since_start: Duration,
) -> Result<RunClock, JailFailure> {
    if let Some(why) = &session.broken {
        eprintln!("pycell-jailer: session {}: {why}", spec.run_id);
    }
    if !session.ready {
        let output = String::from_utf8_lossy(&session.warm_up_output);
        eprintln!(
            "pycell-jailer: session {} ended while warming up; its output:\n{}",
            spec.run_id,
            output.trim_end()
        );
        return Err(JailFailure::new(
            FailureCode::JailSetupFailed,
            Layer::Jailer,
            "the session's jail ended before it was ready (its warm-up output is in the jailer's stderr)",
        ));
    }
    Ok(RunClock {
        limits: spec.limits.clone(),
        wall: session
            .started_at
            .map_or(Duration::ZERO, |t| t.elapsed().min(since_start)),
        before: CgroupUsage::default(),
        waited_ms: None,
    })
}

/// The event stream: our stdout (`events` buffers in front of it; nothing
/// has been written to it before the relay starts).
fn events_fd() -> std::os::fd::BorrowedFd<'static> {
    static STDOUT: std::sync::LazyLock<io::Stdout> = std::sync::LazyLock::new(io::stdout);
    STDOUT.as_fd()
}

fn io_failure(what: &'static str) -> impl Fn(io::Error) -> JailFailure {
    move |e| JailFailure::new(FailureCode::JailerIo, Layer::Jailer, format!("{what}: {e}"))
}

/// The filter as the jail applied it: the jail's init adds the xattr
/// refusal when its kernel let it set a `security.*` attribute.
fn seccomp_report(spec: &JailSpec, checked: &Checked, xattr_writes_refused: bool) -> SeccompReport {
    let mut gaps = checked.gaps.clone();
    let mut applied = checked.filter.clone();
    if xattr_writes_refused {
        gaps.push(KernelGap::SecurityXattrs);
        applied = applied.with_refused(KernelGap::SecurityXattrs);
    }
    SeccompReport {
        profile: spec.seccomp_profile.clone(),
        instructions: applied.instruction_count(),
        refused_on_this_kernel: gaps
            .iter()
            .flat_map(|g| g.calls().iter().map(|(name, _)| name.to_string()))
            .collect(),
    }
}

/// The signals the jailer handles itself, through a signalfd in the relay loop.
pub(crate) fn jailer_signals() -> SigSet {
    let mut sigs = SigSet::empty();
    for s in [
        Signal::SIGINT,
        Signal::SIGTERM,
        Signal::SIGHUP,
        Signal::SIGCHLD,
    ] {
        sigs.add(s);
    }
    sigs
}

fn block_signals() -> Result<SignalFd, JailFailure> {
    let sigs = jailer_signals();
    let fail = |what: &str, e: nix::Error| {
        JailFailure::new(FailureCode::JailerIo, Layer::Jailer, format!("{what}: {e}"))
    };
    sigprocmask(SigmaskHow::SIG_BLOCK, Some(&sigs), None).map_err(|e| fail("sigprocmask", e))?;
    SignalFd::with_flags(&sigs, SfdFlags::SFD_CLOEXEC | SfdFlags::SFD_NONBLOCK)
        .map_err(|e| fail("signalfd", e))
}

fn create_cgroup(spec: &JailSpec, layout: &CgroupLayout) -> Result<SandboxCgroup, JailFailure> {
    layout.remove_stale(&spec.cgroup.parent, &cgroup::run_prefix(spec.sandbox_uid));
    let limits = CgroupLimits::of(&spec.limits);
    SandboxCgroup::create(
        layout,
        &spec.cgroup.parent,
        &cgroup::run_name(spec.sandbox_uid, &spec.run_id),
        limits,
        spec.cgroup.keep,
    )
    .map_err(cgroup_failure)
}

/// A jail that has started: its init, its cgroup, our ends of its pipes.
struct Jail {
    pid: Pid,
    /// A jail from a zygote is not our child: we signal its init this way.
    pidfd: Option<OwnedFd>,
    /// A jail from a zygote: the go pipe, held open while we live (its
    /// init ends the jail at EOF).
    _go: Option<File>,
    /// A jail from a zygote: our end of the zygote's channel, which hangs
    /// up when the zygote dies.
    zygote: Option<OwnedFd>,
    cgroup: SandboxCgroup,
    ends: ParentEnds,
    start: Instant,
    grants: Grants,
}

/// The writable grants of a jail, swept once it has ended.
struct Grants {
    roots: Vec<crate::setup::grants::GrantRoot>,
    started_at: SystemTime,
}

/// Clone the jail and set it up from outside: id maps, then the cgroup.
/// The cgroup is made first. On v2 the jail is born inside it with
/// CLONE_INTO_CGROUP; on v1 it moves itself in, through the `tasks` files
/// opened here (`pycell_host::cgroup::sandbox::join_v1`). Either way no
/// cgroup.procs write, and none of the global lock it takes (an RCU grace
/// period: 4 to 23 ms on v1), is made for the jail, unless clone3 is
/// missing on v2. On failure the child is killed and reaped and the cgroup
/// removed.
fn spawn(spec: &JailSpec, checked: &Checked, grants: Vec<OwnedFd>) -> Result<Jail, JailFailure> {
    let layout = &checked.layout;
    let (mut child_fds, go, ends) = pipes(spec.session.is_some() || spec.media.is_some())
        .map_err(io_failure("creating pipes"))?;
    let grant_roots = give_extras(spec, checked, grants, &mut child_fds)?;
    let cgroup = create_cgroup(spec, layout)?;
    child_fds.cgroup_tasks = cgroup.open_v1_tasks().map_err(cgroup_failure)?;
    let joins_itself = !child_fds.cgroup_tasks.is_empty();
    mark("jailer: pipes and the cgroup made");
    let start = Instant::now();
    let started_at = SystemTime::now();
    let owner =
        crate::setup::ns_owner::AsOwner::enter(spec.sandbox_uid, Some(spec.sandbox_gid), true)
            .map_err(owner_failure)?;
    let (pid, born_inside) = match clone_jail(&cgroup) {
        Ok((CloneResult::Child, _)) => {
            owner.stay();
            drop((go, ends));
            // The jail handles its own signals (see `child`).
            let _ = sigprocmask(SigmaskHow::SIG_UNBLOCK, Some(&jailer_signals()), None);
            child_main(spec, checked, child_fds)
        }
        Ok((CloneResult::Parent(pid), inside)) => (pid, inside),
        Err(e) => {
            owner.leave().map_err(owner_failure)?;
            return Err(e);
        }
    };
    // Still the namespace's owner: its maps' files and its rlimits.
    let owned = as_the_owner(spec, pid, &owner);
    owner.leave().map_err(owner_failure)?;
    mark("jailer: jail cloned");
    drop(child_fds);
    let mut ends = ends;
    ends.work = match spec.warm {
        true => io::stdin().as_fd().try_clone_to_owned().ok(),
        false => None,
    };
    release_stdin();
    let attached = match (spec.warm, &ends.work) {
        (true, None) => Err(io_failure("keeping stdin for the work")(
            io::Error::last_os_error(),
        )),
        _ => {
            owned.and_then(|maps| attach(spec, pid, maps, go, cgroup, born_inside || joins_itself))
        }
    };
    match attached {
        Ok(cgroup) => Ok(Jail {
            pid,
            pidfd: None,
            _go: None,
            zygote: None,
            cgroup,
            ends,
            start,
            grants: Grants {
                roots: grant_roots,
                started_at,
            },
        }),
        Err(f) => {
            let _ = kill(pid, Signal::SIGKILL);
            let _ = waitpid(pid, None);
            Err(f)
        }
    }
}

/// What a cloned jail gets besides its pipes: the handout channel, the
/// caller's grants (from `sources`, the descriptors that came for them;
/// their roots are returned, to sweep at the end), a zygote's library and
/// the compiled runner.
fn give_extras(
    spec: &JailSpec,
    checked: &Checked,
    sources: Vec<OwnedFd>,
    child_fds: &mut ChildFds,
) -> Result<Vec<crate::setup::grants::GrantRoot>, JailFailure> {
    child_fds.handout_channel = handout_channel(spec)?;
    let (trees, grant_roots) = crate::setup::grants::prepare(spec, sources)?;
    child_fds.grants = trees;
    if let Some(z) = &spec.zygote {
        let lib = crate::zygote::library_memfd(&z.lib).map_err(|e| {
            crate::zygote::failure("the zygote's library")(io::Error::other(format!(
                "{}: {e}",
                z.lib.display()
            )))
        })?;
        child_fds.zygote_lib = Some(lib);
    }
    child_fds.runner_pyc = match &checked.runner_pyc {
        Some(fd) => Some(fd.try_clone().map_err(io_failure("the compiled runner"))?),
        None => None,
    };
    Ok(grant_roots)
}

/// A warm jail forked from the zygote whose `channel` came with the spec: the
/// same pipes and cgroup as [`spawn`]'s, sent to the zygote instead of
/// cloned with. The jail writes its own id maps and moves itself into the
/// cgroup (through files we opened), then says so; we find its pid there
/// (the only member), pin its rlimits and say go.
fn spawn_from_zygote(
    spec: &JailSpec,
    checked: &Checked,
    channel: OwnedFd,
) -> Result<Jail, JailFailure> {
    let (mut child_fds, go, mut ends) =
        pipes(spec.media.is_some()).map_err(io_failure("creating pipes"))?;
    let cgroup = create_cgroup(spec, &checked.layout)?;
    child_fds.cgroup_tasks = cgroup.open_join_files().map_err(cgroup_failure)?;
    mark("jailer: pipes and the cgroup made");
    let start = Instant::now();
    crate::zygote::ForkRequest::new(spec.clone(), &child_fds)
        .and_then(|(request, fds)| crate::zygote::send_request(channel.as_fd(), &request, &fds))
        .map_err(crate::zygote::failure("sending the run to its zygote"))?;
    drop(child_fds);
    ends.work = io::stdin().as_fd().try_clone_to_owned().ok();
    release_stdin();
    if ends.work.is_none() {
        return Err(io_failure("keeping stdin for the work")(
            io::Error::last_os_error(),
        ));
    }
    let mut go = File::from(go);
    go.write_all(&[GO_MAPS])
        .map_err(crate::zygote::failure("starting the jail"))?;
    let pid =
        crate::zygote::joined(&ends.status_read, &cgroup).map_err(
            |e| match crate::zygote::gone(channel.as_fd(), crate::zygote::DEATH_GRACE) {
                true => crate::run::outcome::zygote_died("before the run's jail joined its cgroup"),
                false => e,
            },
        )?;
    mark("jailer: jail forked from the zygote, in its cgroup");
    let pidfd = rustix::process::pidfd_open(
        rustix::process::Pid::from_raw(pid.as_raw()).expect("a positive pid"),
        rustix::process::PidfdFlags::empty(),
    )
    .map_err(|e| crate::zygote::failure("opening the jail's pidfd")(e.into()))?;
    // As the zygote's uid, the owner of the namespace the run's is in.
    crate::setup::ns_owner::as_jail_owner(spec, || {
        crate::setup::rlimits::apply(pid, &spec.limits, spec.warm)
    })
    .map_err(|e| e.to_string())
    .and_then(|r| r.map_err(|e| e.to_string()))
    .map_err(|e| JailFailure::new(FailureCode::RlimitsFailed, Layer::Rlimits, e))?;
    go.write_all(&[GO_CGROUP])
        .map_err(crate::zygote::failure("starting the jail"))?;
    Ok(Jail {
        pid,
        pidfd: Some(pidfd),
        _go: Some(go),
        zygote: Some(channel),
        cgroup,
        ends,
        start,
        grants: Grants {
            roots: Vec::new(),
            started_at: SystemTime::now(),
        },
    })
}

/// The jail hands descriptors out on our stdin (a unix socket whose other
/// end is the launcher's: the proxy's listener, an exported workspace,
/// the tool channel): a
/// copy for the child. After the clone the child's copy is the only one
/// (see [`release_stdin`]).
fn handout_channel(spec: &JailSpec) -> Result<Option<OwnedFd>, JailFailure> {
    let hands_out =
        spec.export_workspace || spec.tools || spec.stdio_socket || spec.zygote.is_some();
    if spec.network == NetworkSpec::Loopback && !hands_out {
        return Ok(None);
    }
    io::stdin()
        .as_fd()
        .try_clone_to_owned()
        .map(Some)
        .map_err(io_failure("duplicating stdin for the handout channel"))
}

/// Point our stdin at /dev/null: with egress, the jail's copy of it is then
/// the only one, so its other end sees EOF if the jail ends without
/// sending a listener.
fn release_stdin() {
    if let Ok(null) = File::open("/dev/null") {
        let _ = nix::unistd::dup2_stdin(&null);
    }
}

/// Clone into new namespaces, on v2 inside `cgroup`. clone3 may be
/// missing (old kernels) or filtered to ENOSYS (container seccomp
/// profiles): then the jailer attaches the child after the clone. Returns
/// whether the child was born inside the cgroup.
fn clone_jail(cgroup: &SandboxCgroup) -> Result<(CloneResult, bool), JailFailure> {
    let dir = cgroup.open_v2_dir();
    let cloned = match &dir {
        Some(d) => match syscall::clone_into_cgroup(CLONE_FLAGS, d.as_fd()) {
            Err(e) if e.raw_os_error() == Some(libc::ENOSYS) => {
                syscall::clone_fork(CLONE_FLAGS).map(|r| (r, false))
            }
            other => other.map(|r| (r, true)),
        },
        None => syscall::clone_fork(CLONE_FLAGS).map(|r| (r, false)),
    };
    cloned.map_err(|e| {
        JailFailure::new(
            FailureCode::NamespacesUnavailable,
            Layer::Namespaces,
            format!("clone(CLONE_NEWUSER|NEWPID|NEWNS|NEWNET|NEWIPC|NEWUTS): {e}"),
        )
        .with_hint("pycell needs unprivileged-capable user namespaces (kernel.unprivileged_userns_clone / user.max_user_namespaces > 0) and pid/net/mount namespaces")
    })
}

/// From outside the new child: its uid/gid maps, then its cgroup (unless
/// it is `inside` or goes in by itself), each followed by the go byte the
/// child waits for.
fn attach(
    spec: &JailSpec,
    pid: Pid,
    maps: MapFiles,
    go: OwnedFd,
    cgroup: SandboxCgroup,
    inside: bool,
) -> Result<SandboxCgroup, JailFailure> {
    let mut go = File::from(go);
    let start_failed = io_failure("starting the jail");
    maps.write(&id_maps(spec)).map_err(|e| {
        JailFailure::new(
            FailureCode::UserNamespaceFailed,
            Layer::UserNamespace,
            format!("writing uid/gid maps: {e}"),
        )
    })?;
    go.write_all(&[GO_MAPS]).map_err(&start_failed)?;
    mark("jailer: rlimits set, id maps written");
    if !inside {
        cgroup.attach(pid).map_err(cgroup_failure)?;
        mark("jailer: jail attached to its cgroup");
    }
    go.write_all(&[GO_CGROUP]).map_err(&start_failed)?;
    Ok(cgroup)
}

/// What only the owner of the jail's new user namespace may do from the
/// host without CAP_SYS_ADMIN and CAP_SYS_RESOURCE there (pycelld's
/// jailer): open its id maps' files and pin its rlimits.
fn as_the_owner(spec: &JailSpec, pid: Pid, owner: &AsOwner) -> Result<MapFiles, JailFailure> {
    crate::setup::rlimits::apply(pid, &spec.limits, spec.warm)
        .map_err(|e| JailFailure::new(FailureCode::RlimitsFailed, Layer::Rlimits, e.to_string()))?;
    owner.open_maps(pid).map_err(|e| {
        JailFailure::new(
            FailureCode::UserNamespaceFailed,
            Layer::UserNamespace,
            format!("opening the uid/gid maps: {e}"),
        )
    })
}

fn owner_failure(e: io::Error) -> JailFailure {
    JailFailure::new(
        FailureCode::UserNamespaceFailed,
        Layer::UserNamespace,
        format!("switching to the sandbox's ids to create its user namespace: {e}"),
    )
}

fn id_maps(spec: &JailSpec) -> (String, String) {
    match &spec.zygote {
        Some(z) => {
            let own = SlotIds {
                uid: spec.sandbox_uid,
                gid: spec.sandbox_gid,
            };
            crate::zygote::id_maps(own, &z.slots)
        }
        None => crate::setup::ns_owner::jail_id_maps(spec.sandbox_uid, spec.sandbox_gid),
    }
}

/// The jail's pipes: the child's ends, our go-pipe end, our other ends.
/// Each side drops the other's after the clone. The stdin of a session or
/// a python run is a socket: a session's runner reads requests and writes
/// replies on it, a run's sends back its images.
fn pipes(stdin_socket: bool) -> io::Result<(ChildFds, OwnedFd, ParentEnds)> {
    let p = || pipe2(OFlag::O_CLOEXEC).map_err(io::Error::from);
    let (go, status, stdout, stderr) = (p()?, p()?, p()?, p()?);
    let stdin: (OwnedFd, OwnedFd) = match stdin_socket {
        true => {
            let (ours, theirs) = std::os::unix::net::UnixStream::pair()?;
            (theirs.into(), ours.into())
        }
        false => p()?,
    };
    // Close-on-exec on both ends (std's socketpair sets it); ours never
    // blocks: the descriptor is there before the jail says it is ready.
    let (disk_ours, disk_child) = std::os::unix::net::UnixStream::pair()?;
    disk_ours.set_nonblocking(true)?;
    let child = ChildFds {
        go_read: go.0,
        status_write: status.1,
        stdin_read: stdin.0,
        handout_channel: None,
        disk_channel: Some(disk_child.into()),
        stdout_write: stdout.1,
        stderr_write: stderr.1,
        cgroup_tasks: Vec::new(),
        zygote_lib: None,
        runner_pyc: None,
        grants: Vec::new(),
    };
    let ours = ParentEnds {
        status_read: status.0,
        stdin_write: stdin.1,
        stdout_read: stdout.0,
        stderr_read: stderr.0,
        work: None,
        disk_channel: disk_ours.into(),
    };
    Ok((child, go.1, ours))
}
