//! The one launch path, shared by `pycell run`, `pycell mcp` and pycelld:
//!
//! ```text
//! Launcher::load_policy ─> Launcher::prepare ─> Prepared::spawn[_async] ─> Collector ─> RunResult
//!  (name or file)          (resolve, uid lease,   (pycell-jailer, spec as    (events decoded,
//!                           run id, spec,          a frame on its stdin, events output capped,
//!                           validated)             on its stdout)              result built)
//! ```
//!
//! Every mode builds jails the same way: by starting the single-threaded
//! `pycell-jailer` executable, never by forking itself. The uid lease goes
//! with the launched jailer and is released only when the caller drops it,
//! after the jailer has exited.

use std::io::{self, Write};
use std::ops::RangeInclusive;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use pycell_wire::outcome::{Outcome, MAX_OUTCOME_LINE};

use pycell_policy::network::EgressRules;
use pycell_policy::Policy;

use crate::fork_server::{ForkServer, ForkedJailer};
use crate::resolve::{self, ResolveError};
use pycell_host::uidalloc::{self, UidLease};
use pycell_protocol::messages::RunRequest;
use pycell_protocol::refusals;
use pycell_protocol::result::{NetworkReport, RunLimits, RunResult};
use pycell_wire::codes::{FailureCode, Layer};
use pycell_wire::events::{Event, EventError, Stream};
use pycell_wire::fork_server::ForkJailer;
use pycell_wire::report::{JailFailure, JailReport, RunMedia};
use pycell_wire::spec::{new_run_id, Grant, ImageLimits, JailSpec, MediaLimits, SpecFd};

/// Where sandbox uid leases are kept (by embedded runs and pycelld alike:
/// one directory, so the two can never hand out the same uid).
pub const UID_LOCK_DIR: &str = "/run/pycell/uids";
/// Where the Debian package installs the jailer.
pub const INSTALLED_JAILER: &str = "/usr/libexec/pycell/pycell-jailer";
/// How much of the jailer's own stderr (with [`JailerStderr::Capture`]) is
/// kept for an error message.
pub const JAILER_STDERR_CAP: usize = 16 * 1024;

/// Append as much of `bytes` to `buf` as fits under `cap`; true if some of
/// it did not fit.
pub fn append_capped(buf: &mut Vec<u8>, bytes: &[u8], cap: usize) -> bool {
    let room = cap.saturating_sub(buf.len());
    buf.extend_from_slice(&bytes[..bytes.len().min(room)]);
    bytes.len() > room
}

/// A request that cannot be run as asked: the caller can fix it (as opposed
/// to a refusal, which is the host's or the operator's problem).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {problem}")]
pub struct RequestError {
    /// The request field at fault: `policy`, `timeout`, `code`, `stdin`, `limits`, `args`.
    pub field: &'static str,
    pub problem: String,
}

impl RequestError {
    /// The fields a request is checked by, as their errors name them.
    pub const FIELDS: [&'static str; 12] = [
        "policy",
        "timeout",
        "limits",
        "stdin",
        "files",
        "tools",
        "code",
        "args",
        "serve_stdio",
        "env",
        "allow",
        "grants",
    ];

    /// The error a message `field: problem` (as pycelld refuses a request)
    /// tells, its field recovered if it is one of [`Self::FIELDS`], else
    /// `request`.
    pub fn from_message(message: String) -> RequestError {
        let named = message
            .split_once(": ")
            .and_then(|(f, problem)| Some((*Self::FIELDS.iter().find(|k| **k == f)?, problem)));
        match named {
            Some((field, problem)) => RequestError {
                field,
                problem: problem.to_string(),
            },
            None => RequestError {
                field: "request",
                problem: message,
            },
        }
    }

    /// The failure a result reports for it (an unknown or unusable policy is
    /// `invalid_policy`, anything else `invalid_request`).
    pub fn failure(&self) -> JailFailure {
        let (code, layer) = if self.field == "policy" {
            (FailureCode::InvalidPolicy, Layer::Policy)
        } else {
            (FailureCode::InvalidRequest, Layer::Request)
        };
        JailFailure::new(code, layer, self.to_string())
    }
}

/// Why a run did not start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LaunchError {
    /// The caller's request is wrong.
    Request(RequestError),
    /// The host or its configuration refuses the run.
    Refused(JailFailure),
}

impl LaunchError {
    pub fn failure(&self) -> JailFailure {
        match self {
            LaunchError::Request(e) => e.failure(),
            LaunchError::Refused(f) => f.clone(),
        }
    }
}

impl From<RequestError> for LaunchError {
    fn from(e: RequestError) -> Self {
        LaunchError::Request(e)
    }
}

impl From<ResolveError> for LaunchError {
    fn from(e: ResolveError) -> Self {
        match e {
            ResolveError::BadRequest { field, problem } => {
                LaunchError::Request(RequestError { field, problem })
            }
            ResolveError::UnknownPolicy { .. } => LaunchError::Request(RequestError {
                field: "policy",
                problem: e.to_string(),
            }),
            // An installed file that does not load, or an interpreter that is
            // not there, is the operator's problem.
            other => LaunchError::Refused(
                JailFailure::new(FailureCode::InvalidPolicy, Layer::Policy, other.to_string())
                    .with_hint("the operator must fix the policy (pycell policy check FILE)"),
            ),
        }
    }
}

/// How a run names its policy.
#[derive(Debug, Clone, Copy)]
pub enum PolicyChoice<'a> {
    /// An installed policy, else a built-in one (what clients may ask for).
    Name(&'a str),
    /// A file of the caller's own (embedded `pycell run --policy FILE` only).
    File(&'a Path),
}

impl<'a> PolicyChoice<'a> {
    /// `--policy NAME|PATH`: a path contains `/` or ends in `.toml`.
    pub fn from_arg(arg: &'a str) -> PolicyChoice<'a> {
        if arg.contains('/') || arg.ends_with(".toml") {
            PolicyChoice::File(Path::new(arg))
        } else {
            PolicyChoice::Name(arg)
        }
    }
}

/// Where launches find policies, sandbox uids, cgroups and the jailer.
#[derive(Debug, Clone)]
pub struct Launcher {
    pub policy_dir: PathBuf,
    pub uid_range: RangeInclusive<u32>,
    pub uid_lock_dir: PathBuf,
    /// Parent of the runs' cgroups, relative to the jailer's own cgroup.
    pub cgroup_parent: String,
    /// Whether runs keep their v1 cgroups for the next (pycelld, which
    /// removes them when it stops; see `CgroupSpec::keep`).
    pub keep_cgroups: bool,
    /// The jailer to start, or why there is none (a run is then refused
    /// once its request has been checked).
    pub jailer: Result<PathBuf, JailFailure>,
}

impl Launcher {
    /// Embedded mode's launcher: `PYCELL_UID_RANGE`, `PYCELL_JAILER`,
    /// `PYCELL_POLICY_DIR` (default /etc/pycell/policies) and
    /// `PYCELL_CGROUP_PARENT` from the environment. Fails only for a
    /// malformed `PYCELL_UID_RANGE` or `PYCELL_CGROUP_PARENT`.
    pub fn embedded_from_env() -> Result<Launcher, JailFailure> {
        let policy_dir = std::env::var_os("PYCELL_POLICY_DIR")
            .filter(|d| !d.is_empty())
            .map_or_else(|| PathBuf::from(resolve::POLICY_DIR), PathBuf::from);
        Ok(Launcher {
            policy_dir,
            uid_range: uid_range_from_env()?,
            uid_lock_dir: PathBuf::from(UID_LOCK_DIR),
            cgroup_parent: cgroup_parent_from_env()?,
            keep_cgroups: false,
            jailer: find_jailer(),
        })
    }

    pub fn load_policy(&self, choice: PolicyChoice<'_>) -> Result<Policy, LaunchError> {
        match choice {
            PolicyChoice::Name(name) => Ok(resolve::load_policy_by_name(name, &self.policy_dir)?),
            PolicyChoice::File(path) => Policy::load(path).map_err(|e| {
                LaunchError::Refused(JailFailure::new(
                    FailureCode::InvalidPolicy,
                    Layer::Policy,
                    e.to_string(),
                ))
            }),
        }
    }

    /// Resolve `request` under `policy`, lease a sandbox uid and give the
    /// run its id: a validated spec, ready for the jailer.
    pub fn prepare(&self, policy: &Policy, request: &RunRequest) -> Result<Prepared, LaunchError> {
        self.prepare_with(policy, request, &resolve::Extras::default())
    }

    /// [`Launcher::prepare`] with what the launch adds (an env, the install
    /// jail's mounts and files).
    pub fn prepare_with(
        &self,
        policy: &Policy,
        request: &RunRequest,
        extras: &resolve::Extras,
    ) -> Result<Prepared, LaunchError> {
        let resolved = resolve::resolve_with(policy, request, extras)?;
        if !nix::unistd::geteuid().is_root() {
            return Err(LaunchError::Refused(not_root()));
        }
        let jailer = self.jailer.clone().map_err(LaunchError::Refused)?;
        let mut lease = uidalloc::allocate(&self.uid_range, &self.uid_lock_dir).map_err(|e| {
            LaunchError::Refused(JailFailure::new(
                FailureCode::UidUnavailable,
                Layer::Uid,
                e.to_string(),
            ))
        })?;
        lease.release_after_cgroups(&self.cgroup_parent);
        let mut spec = resolved.spec;
        spec.run_id = new_run_id();
        spec.sandbox_uid = lease.uid;
        spec.sandbox_gid = lease.gid;
        spec.cgroup.parent = self.cgroup_parent.clone();
        spec.cgroup.keep = self.keep_cgroups;
        spec.descriptors = handed_names(false, 0);
        spec.validate().map_err(invalid_spec)?;
        Ok(Prepared {
            run_id: spec.run_id.clone(),
            policy: policy.name.clone(),
            egress: policy.network.egress().cloned(),
            limits: resolved.limits.clone(),
            spec,
            lease,
            jailer,
            zygote_channel: None,
            grant_sources: Vec::new(),
        })
    }
}

impl Launcher {
    /// A warm jail for `policy`'s runs (with `extras`' env): the jail an
    /// empty request would get, its python started on pycell's runner and
    /// importing `modules`, waiting for the work of one run (see
    /// [`crate::runner`]).
    pub fn prepare_warm(
        &self,
        policy: &Policy,
        extras: &resolve::Extras,
        modules: &[String],
    ) -> Result<Prepared, LaunchError> {
        let mut prepared = self.prepare_with(policy, &RunRequest::default(), extras)?;
        let spec = pycell_runner::warm_spec(&prepared.spec, modules);
        spec.validate().map_err(invalid_spec)?;
        prepared.spec = spec;
        Ok(prepared)
    }
}

impl Launcher {
    /// A session's jail for `policy` (with `request`'s limits and
    /// `extras`' env): the warm jail, its runner in session mode importing
    /// the policy's `[warm] imports`, its clocks from `[session]`. The
    /// result's limits are each cell's.
    pub fn prepare_session(
        &self,
        policy: &Policy,
        request: &RunRequest,
        extras: &resolve::Extras,
    ) -> Result<Prepared, LaunchError> {
        let mut prepared = self.prepare_with(policy, request, extras)?;
        let clocks = session_clocks(&policy.session);
        let spec =
            pycell_runner::session::session_spec(&prepared.spec, &policy.warm_imports, clocks);
        spec.validate().map_err(invalid_spec)?;
        prepared.spec = spec;
        Ok(prepared)
    }
}

/// How long a cell that was interrupted at its timeout may take to stop
/// before its session is killed.
pub const CELL_GRACE: std::time::Duration = std::time::Duration::from_secs(2);

/// How long past its idle timeout the jailer of a session that pauses
/// when idle ends it, if its server has not paused it by then (the
/// server is gone, or the pause failed).
pub const PAUSE_BACKSTOP: std::time::Duration = std::time::Duration::from_secs(30);

/// A policy's session settings as the jailer's clocks.
pub fn session_clocks(s: &pycell_policy::SessionSettings) -> pycell_wire::spec::SessionSpec {
    let ms = |d: std::time::Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
    let idle = match s.pause_when_idle {
        true => (s.idle_timeout + PAUSE_BACKSTOP).min(s.lifetime),
        false => s.idle_timeout,
    };
    pycell_wire::spec::SessionSpec {
        idle_timeout_ms: ms(idle),
        lifetime_ms: ms(s.lifetime),
        cell_grace_ms: ms(CELL_GRACE),
    }
}

/// A spec that fails its own validation: pycell's bug, not the caller's.
fn invalid_spec(e: pycell_wire::spec::SpecError) -> LaunchError {
    LaunchError::Refused(JailFailure::new(
        FailureCode::InvalidSpec,
        Layer::Jailer,
        e.to_string(),
    ))
}

fn not_root() -> JailFailure {
    JailFailure::new(
        FailureCode::NotRoot,
        Layer::Jailer,
        "building a sandbox without pycelld needs root (it creates cgroups and maps a sandbox uid)",
    )
    .with_hint(
        "run pycell as root, or install and start the pycelld service (its socket needs no root)",
    )
}

/// `PYCELL_CGROUP_PARENT` (plain names separated by `/`, relative to the
/// cgroup root: pycelld sets it for the env builders it starts, so their
/// install jails live in its subtree), else [`resolve::CGROUP_PARENT`].
fn cgroup_parent_from_env() -> Result<String, JailFailure> {
    match std::env::var("PYCELL_CGROUP_PARENT") {
        Ok(p) if pycell_wire::spec::is_plain_relative_path(&p) => Ok(p),
        Ok(p) => Err(JailFailure::new(
            FailureCode::InvalidConfig,
            Layer::Cgroup,
            format!("PYCELL_CGROUP_PARENT={p:?}: expected plain names separated by /"),
        )),
        Err(_) => Ok(resolve::CGROUP_PARENT.to_string()),
    }
}

/// `PYCELL_UID_RANGE` (`START-END`), else [`uidalloc::DEFAULT_RANGE`].
pub fn uid_range_from_env() -> Result<RangeInclusive<u32>, JailFailure> {
    match std::env::var("PYCELL_UID_RANGE") {
        Ok(s) => uidalloc::parse_range(&s).ok_or_else(|| {
            JailFailure::new(
                FailureCode::InvalidConfig,
                Layer::Uid,
                format!("PYCELL_UID_RANGE={s:?}: expected START-END"),
            )
        }),
        Err(_) => Ok(uidalloc::DEFAULT_RANGE),
    }
}

/// The jailer to start: `$PYCELL_JAILER`, else `pycell-jailer` next to this
/// executable (a build tree, or pycelld's own directory), else the installed
/// one. Whichever is chosen must exist.
pub fn find_jailer() -> Result<PathBuf, JailFailure> {
    let unavailable = |m: String| {
        JailFailure::new(FailureCode::JailerUnavailable, Layer::Jailer, m)
            .with_hint("set PYCELL_JAILER to the path of pycell-jailer")
    };
    if let Some(p) = std::env::var_os("PYCELL_JAILER").filter(|p| !p.is_empty()) {
        let p = PathBuf::from(p);
        return if p.is_file() {
            Ok(p)
        } else {
            Err(unavailable(format!(
                "PYCELL_JAILER={} does not exist",
                p.display()
            )))
        };
    }
    let beside = std::env::current_exe()
        .map_err(|e| unavailable(format!("locating this executable: {e}")))?
        .with_file_name("pycell-jailer");
    [beside.clone(), PathBuf::from(INSTALLED_JAILER)]
        .into_iter()
        .find(|p| p.is_file())
        .ok_or_else(|| {
            unavailable(format!(
                "pycell-jailer is neither at {} nor at {INSTALLED_JAILER}",
                beside.display()
            ))
        })
}

/// A run resolved and holding its sandbox uid, ready to start.
#[derive(Debug)]
pub struct Prepared {
    pub run_id: String,
    pub policy: String,
    /// The policy's egress rules, when it has network mode `allowlist`.
    pub egress: Option<EgressRules>,
    pub limits: RunLimits,
    spec: JailSpec,
    lease: UidLease,
    jailer: PathBuf,
    /// A run from a zygote: the zygote's channel, which goes to the
    /// jailer with the spec (`pycell_wire::spec::SpecFd::Zygote`).
    zygote_channel: Option<OwnedFd>,
    /// The host paths granted to the jail, as their caller opened them
    /// (`JailSpec::grants`), which go to the jailer with the spec.
    grant_sources: Vec<OwnedFd>,
}

/// What becomes of the jailer's own stderr (never the sandbox's output,
/// which comes as events).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JailerStderr {
    /// Ours (pycelld's: the journal).
    Inherit,
    /// A pipe, for the caller to read (into an error message).
    Capture,
}

/// A started jailer. Dropping it releases the uid: the caller does so only
/// after the jailer has exited.
#[derive(Debug)]
pub struct Started<Child, Events> {
    pub run_id: String,
    pub policy: String,
    pub limits: RunLimits,
    /// The images and displays it sends back are held to these (none: it
    /// sends none).
    pub media: Option<MediaLimits>,
    pub child: Child,
    /// The jailer's event stream.
    pub events: Events,
    /// With network mode `allowlist`: the policy's rules.
    pub egress: Option<EgressRules>,
    /// For a jail that hands descriptors out (the egress proxy's listener,
    /// an exported workspace): our end of the jailer's stdin, on which
    /// they come, each named (`pycell_wire::handout`).
    pub handouts: Option<OwnedFd>,
    /// A warm jail's stream for its work (see [`Started::send_work`]).
    work: Option<UnixStream>,
    /// The read end of the jailer's outcome pipe (see [`read_outcome`]).
    pub outcome: OwnedFd,
    pub lease: UidLease,
}

/// The outcome line a jailer wrote when its run ended, read without
/// waiting once it has exited (none if it was killed first).
pub fn read_outcome(pipe: &OwnedFd) -> Option<Outcome> {
    use nix::fcntl::{fcntl, FcntlArg, OFlag};
    let flags = OFlag::from_bits_truncate(fcntl(pipe, FcntlArg::F_GETFL).ok()?);
    fcntl(pipe, FcntlArg::F_SETFL(flags | OFlag::O_NONBLOCK)).ok()?;
    let mut buf = [0u8; MAX_OUTCOME_LINE + 1];
    let mut len = 0;
    while len < buf.len() {
        match nix::unistd::read(pipe, &mut buf[len..]) {
            Ok(n @ 1..) => len += n,
            _ => break,
        }
    }
    Outcome::parse(&buf[..len])
}

impl<C, E> Started<C, E> {
    /// A session's request stream (the jailer's stdin, after its spec),
    /// for its driver to own.
    pub fn take_work_stream(&mut self) -> Option<UnixStream> {
        self.work.take()
    }

    /// Hand a warm jail its run (once: the stream is closed after it).
    /// The jailer must have reported itself ready first.
    pub fn send_work(&mut self, work: &pycell_runner::Work) -> io::Result<()> {
        let mut stream = self.work.take().ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                "not a warm jail waiting for work",
            )
        })?;
        let frame = pycell_wire::framing::encode_within(work, pycell_runner::MAX_WORK_FRAME)
            .map_err(io::Error::other)?;
        stream.write_all(&frame)?;
        stream.shutdown(std::net::Shutdown::Write)
    }
}

/// A started jailer, for a blocking caller.
pub type Launched = Started<std::process::Child, std::process::ChildStdout>;
/// A started jailer, for a tokio caller.
pub type LaunchedAsync = Started<tokio::process::Child, tokio::process::ChildStdout>;
/// A started jailer that pycelld's monitor's fork server forked.
pub type ForkedLaunch = Started<ForkedJailer, std::fs::File>;

impl Prepared {
    /// A run of `spec` (validated here) holding `lease`, for `jailer`;
    /// with `zygote_channel`, forked from that zygote. No egress.
    pub(crate) fn new(
        spec: JailSpec,
        policy: &str,
        limits: RunLimits,
        lease: UidLease,
        jailer: PathBuf,
        zygote_channel: Option<OwnedFd>,
    ) -> Result<Prepared, JailFailure> {
        let mut spec = spec;
        spec.descriptors = handed_names(zygote_channel.is_some(), spec.grants.len());
        spec.validate().map_err(|e| invalid_spec(e).failure())?;
        Ok(Prepared {
            run_id: spec.run_id.clone(),
            policy: policy.to_string(),
            egress: None,
            limits,
            spec,
            lease,
            jailer,
            zygote_channel,
            grant_sources: Vec::new(),
        })
    }

    pub fn spec(&self) -> &JailSpec {
        &self.spec
    }

    /// Replace the spec (validated, its descriptors named for what this
    /// run hands its jailer) keeping everything else.
    pub(crate) fn set_spec(&mut self, mut spec: JailSpec) -> Result<(), JailFailure> {
        spec.descriptors = handed_names(self.zygote_channel.is_some(), spec.grants.len());
        spec.validate().map_err(|e| invalid_spec(e).failure())?;
        self.spec = spec;
        Ok(())
    }

    /// Bind `granted` into the jail: each a grant and the descriptor its
    /// caller opened the host path on (see `JailSpec::grants`).
    pub fn grant(&mut self, granted: Vec<(Grant, OwnedFd)>) -> Result<(), JailFailure> {
        let (grants, sources): (Vec<Grant>, Vec<OwnedFd>) = granted.into_iter().unzip();
        let mut spec = self.spec.clone();
        spec.grants = grants;
        self.set_spec(spec)?;
        self.grant_sources = sources;
        Ok(())
    }

    pub(crate) fn jailer_path(&self) -> &Path {
        &self.jailer
    }

    /// Have the jailer and the jail mark their steps in the result
    /// (`pycell_wire::timings`).
    pub fn mark_timings(&mut self) {
        self.spec.timings = true;
    }

    /// A result for this run that never started.
    pub fn refused(&self, f: JailFailure) -> RunResult {
        RunResult::refused(&self.run_id, &self.policy, f)
    }

    /// The jailer command: nothing from our environment, the spec on stdin
    /// (a unix socket, returned: the jailer sends the egress proxy's
    /// listener back on it), events on stdout. No step of ours runs in the
    /// child before its exec (std then spawns it as `posix_spawn` does,
    /// without copying this process): the descriptors it needs come with
    /// the spec ([`Prepared::handed`]).
    fn command(&self, stderr: JailerStderr) -> io::Result<(Command, UnixStream)> {
        let (ours, theirs) = UnixStream::pair()?;
        let mut cmd = Command::new(&self.jailer);
        if self.spec.session.is_some() {
            // A session's cells are interrupted by its launcher, never by
            // a terminal's ^C (which would reach its jailer too).
            std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
        }
        cmd.env_clear()
            .stdin(Stdio::from(OwnedFd::from(theirs)))
            .stdout(Stdio::piped())
            .stderr(match stderr {
                JailerStderr::Inherit => Stdio::inherit(),
                JailerStderr::Capture => Stdio::piped(),
            });
        Ok((cmd, ours))
    }

    /// The descriptors that go with the spec, in the order of its
    /// `descriptors` ([`handed_names`]): the write end of the outcome
    /// pipe (whose read end is returned too), the zygote's channel, the
    /// grants' sources.
    fn handed(&self) -> io::Result<(Vec<OwnedFd>, OwnedFd)> {
        let (outcome, outcome_w) = io::pipe()?;
        let mut fds = vec![OwnedFd::from(outcome_w)];
        for fd in self.zygote_channel.iter().chain(&self.grant_sources) {
            fds.push(fd.try_clone()?);
        }
        Ok((fds, outcome.into()))
    }

    /// The spec as the jailer reads it, one frame: a cold python run's on
    /// the runner, and python on the runner compiled for its interpreter
    /// where it can be (`crate::runner_pyc`).
    fn spec_frame(&self) -> Result<Vec<u8>, Box<RunResult>> {
        let on_runner = pycell_runner::cold_on_runner(&self.spec);
        let spec = on_runner.as_ref().unwrap_or(&self.spec);
        let compiled = crate::runner_pyc::compiled(spec);
        let spec = compiled.as_ref().unwrap_or(spec);
        pycell_wire::framing::encode_within(spec, pycell_wire::spec::MAX_SPEC_FRAME).map_err(|e| {
            self.refused_boxed(JailFailure::new(
                FailureCode::Internal,
                Layer::Jailer,
                format!("encoding the spec: {e}"),
            ))
        })
    }

    fn refused_boxed(&self, f: JailFailure) -> Box<RunResult> {
        Box::new(self.refused(f))
    }

    fn cannot_start(&self, e: io::Error) -> Box<RunResult> {
        self.refused_boxed(
            JailFailure::new(
                FailureCode::JailerUnavailable,
                Layer::Jailer,
                format!("cannot start {}: {e}", self.jailer.display()),
            )
            .with_hint("set PYCELL_JAILER to the path of pycell-jailer"),
        )
    }

    fn cannot_fork(&self, e: io::Error) -> Box<RunResult> {
        self.refused_boxed(JailFailure::new(
            FailureCode::JailerUnavailable,
            Layer::Jailer,
            format!(
                "the jailer fork server ({} --fork-server) could not fork a jailer: {e}",
                self.jailer.display()
            ),
        ))
    }

    fn spec_not_taken(&self, e: io::Error) -> Box<RunResult> {
        self.refused_boxed(JailFailure::new(
            FailureCode::JailerFailed,
            Layer::Jailer,
            format!("pycell-jailer did not take its spec: {e}"),
        ))
    }

    /// Start the jailer and hand it the spec. On failure the jailer has been
    /// killed and reaped, and the result says why.
    pub fn spawn(self, stderr: JailerStderr) -> Result<Launched, Box<RunResult>> {
        let frame = self.spec_frame()?;
        let (mut cmd, spec_in) = self.command(stderr).map_err(|e| self.cannot_start(e))?;
        let (handed, outcome) = self.handed().map_err(|e| self.cannot_start(e))?;
        let work = self.work_stream(&spec_in)?;
        let mut child = cmd.spawn().map_err(|e| self.cannot_start(e))?;
        drop(cmd); // our copy of the jailer's end of the socket
        let Some(events) = child.stdout.take() else {
            unreachable!("stdout was configured as a pipe");
        };
        if let Err(e) = hand_spec(&spec_in, &frame, handed, work.is_some()) {
            let _ = child.kill();
            let _ = child.wait();
            return Err(self.spec_not_taken(e));
        }
        Ok(self.started(child, events, spec_in, work, outcome))
    }

    /// [`Prepared::spawn`] by `server`, pycelld's monitor's: the jailer is
    /// forked by the fork server, not executed, and is our child all the
    /// same (our reaper reaps it); its stderr is the server's, ours.
    pub fn spawn_forked(self, server: &mut ForkServer) -> Result<ForkedLaunch, Box<RunResult>> {
        let frame = self.spec_frame()?;
        let (spec_in, theirs) = UnixStream::pair().map_err(|e| self.cannot_start(e))?;
        let (events, events_w) = io::pipe().map_err(|e| self.cannot_start(e))?;
        let (handed, outcome) = self.handed().map_err(|e| self.cannot_start(e))?;
        let work = self.work_stream(&spec_in)?;
        let request = ForkJailer {
            new_process_group: self.spec.session.is_some(),
        };
        let child = server
            .fork(&self.jailer, theirs.as_fd(), events_w.as_fd(), request)
            .map_err(|e| self.cannot_fork(e))?;
        drop((theirs, events_w));
        if let Err(e) = hand_spec(&spec_in, &frame, handed, work.is_some()) {
            child.kill_and_reap();
            return Err(self.spec_not_taken(e));
        }
        let events = std::fs::File::from(OwnedFd::from(events));
        Ok(self.started(child, events, spec_in, work, outcome))
    }

    /// A warm jail's stream for its work, which follows its spec on the
    /// same socket.
    fn work_stream(&self, spec_in: &UnixStream) -> Result<Option<UnixStream>, Box<RunResult>> {
        match self.spec.warm {
            true => Ok(Some(spec_in.try_clone().map_err(|e| self.cannot_start(e))?)),
            false => Ok(None),
        }
    }

    fn started<C, E>(
        self,
        child: C,
        events: E,
        spec_in: UnixStream,
        work: Option<UnixStream>,
        outcome: OwnedFd,
    ) -> Started<C, E> {
        let hands_out = self.egress.is_some()
            || self.spec.export_workspace
            || self.spec.tools
            || self.spec.stdio_socket
            || self.spec.zygote.is_some();
        Started {
            run_id: self.run_id,
            policy: self.policy,
            limits: self.limits,
            media: self.spec.media,
            child,
            events,
            egress: self.egress,
            handouts: hands_out.then(|| OwnedFd::from(spec_in)),
            work,
            outcome,
            lease: self.lease,
        }
    }

    /// [`Prepared::spawn`] for a tokio caller. Call it from a thread that
    /// outlives the run: a runtime worker, or a thread that drives the run
    /// with `block_on` to its end, never from an async task that an idle
    /// blocking-pool thread runs after it returns: the jailer's parent-death
    /// signal follows the thread that started it, and idle pool threads exit.
    pub async fn spawn_async(self, stderr: JailerStderr) -> Result<LaunchedAsync, Box<RunResult>> {
        use tokio::io::AsyncWriteExt;
        let frame = self.spec_frame()?;
        let (cmd, spec_in) = self.command(stderr).map_err(|e| self.cannot_start(e))?;
        let (handed, outcome) = self.handed().map_err(|e| self.cannot_start(e))?;
        let mut cmd = tokio::process::Command::from(cmd);
        let mut child = cmd.spawn().map_err(|e| self.cannot_start(e))?;
        drop(cmd);
        let Some(events) = child.stdout.take() else {
            unreachable!("stdout was configured as a pipe");
        };
        let warm = self.spec.warm;
        let sent = async {
            spec_in.set_nonblocking(true)?;
            let mut tx = tokio::net::UnixStream::from_std(spec_in)?;
            // The descriptors go with the frame's first bytes.
            let first = tx
                .async_io(tokio::io::Interest::WRITABLE, || {
                    pycell_wire::fdpass::send_some_with_fds(tx.as_fd(), &frame, &borrowed(&handed))
                })
                .await?;
            drop(handed);
            tx.write_all(&frame[first..]).await?;
            // A warm jail's work (a session's requests) follows its spec.
            if !warm {
                tx.shutdown().await?;
            }
            let spec_in = tx.into_std()?;
            spec_in.set_nonblocking(false)?;
            let work = match warm {
                true => Some(spec_in.try_clone()?),
                false => None,
            };
            Ok::<_, io::Error>((spec_in, work))
        };
        match sent.await {
            Ok((spec_in, work)) => Ok(self.started(child, events, spec_in, work, outcome)),
            Err(e) => {
                let _ = child.kill().await;
                Err(self.spec_not_taken(e))
            }
        }
    }
}

/// The names of the descriptors that go with a spec
/// (`JailSpec::descriptors`), in the order [`Prepared::handed`] sends them.
fn handed_names(zygote: bool, grants: usize) -> Vec<SpecFd> {
    let mut names = vec![SpecFd::Outcome];
    if zygote {
        names.push(SpecFd::Zygote);
    }
    names.extend(std::iter::repeat_n(SpecFd::Grant, grants));
    names
}

/// Send the spec's frame on the jailer's stdin, `handed` attached to its
/// first bytes (ours closed after), and end the stream there unless work
/// follows (`more`).
fn hand_spec(
    spec_in: &UnixStream,
    frame: &[u8],
    handed: Vec<OwnedFd>,
    more: bool,
) -> io::Result<()> {
    pycell_wire::fdpass::send_with_fds(spec_in.as_fd(), frame, &borrowed(&handed))?;
    drop(handed);
    match more {
        true => Ok(()),
        false => spec_in.shutdown(std::net::Shutdown::Write),
    }
}

fn borrowed(fds: &[OwnedFd]) -> Vec<std::os::fd::BorrowedFd<'_>> {
    fds.iter().map(AsFd::as_fd).collect()
}

/// How the jailer process ended, as far as the reader of its events knows.
#[derive(Debug)]
pub enum JailerEnd {
    /// It exited with this status; `stderr` is what it printed (if captured).
    Exited {
        status: io::Result<std::process::ExitStatus>,
        stderr: Vec<u8>,
    },
    /// Someone else waits for it (pycelld's monitor).
    Elsewhere,
}

/// Builds a run's result from the jailer's events: output kept up to the
/// run's cap (again: the jailer caps it too), the report, or why there is
/// none.
#[derive(Debug)]
pub struct Collector {
    run_id: String,
    policy: String,
    limits: Option<RunLimits>,
    cap: usize,
    output: [Vec<u8>; 2],
    truncated: [bool; 2],
    report: Option<JailReport>,
    broken: Option<EventError>,
    network: Option<NetworkReport>,
    media: RunMedia,
    media_limits: Option<MediaLimits>,
    tool_calls: Option<pycell_tools::service::ToolCalls>,
}

impl Collector {
    pub fn new(run_id: &str, policy: &str, limits: Option<RunLimits>) -> Collector {
        let cap = limits.as_ref().map_or(usize::MAX, |l| {
            usize::try_from(l.max_output.get()).unwrap_or(usize::MAX)
        });
        Collector {
            run_id: run_id.to_string(),
            policy: policy.to_string(),
            limits,
            cap,
            output: [Vec::new(), Vec::new()],
            truncated: [false, false],
            report: None,
            broken: None,
            network: None,
            media: RunMedia::default(),
            media_limits: None,
            tool_calls: None,
        }
    }

    /// Take one event. For output, returns the part that was kept (to show
    /// or forward as it arrives); past the cap that is nothing.
    pub fn record(&mut self, event: Event) -> Option<(Stream, &[u8])> {
        let (stream, bytes) = match event {
            Event::Result(r) => {
                self.report = Some(*r);
                return None;
            }
            Event::Ready | Event::Reply(..) => return None,
            Event::Output(s, b) => (s, b),
        };
        let i = stream as usize;
        let start = self.output[i].len();
        self.truncated[i] |= append_capped(&mut self.output[i], &bytes, self.cap);
        (self.output[i].len() > start).then(|| (stream, &self.output[i][start..]))
    }

    /// The stream could not be read further: the result will say so (and
    /// the caller stops the jailer).
    pub fn broken(&mut self, e: EventError) {
        self.broken.get_or_insert(e);
    }

    /// The output of `stream` kept so far (capped).
    pub fn output(&self, stream: Stream) -> &[u8] {
        &self.output[stream as usize]
    }

    /// The images and displays the run's runner sent back (untrusted
    /// bytes from the jail: only what the run's limits allow is kept).
    pub fn media(&mut self, body: &[u8]) {
        self.media = checked_media(body, self.media_limits);
    }

    /// The run's `[images]` and `[output]` bounds (none: it captures no
    /// images or displays).
    pub fn with_media_limits(mut self, limits: Option<MediaLimits>) -> Collector {
        self.media_limits = limits;
        self
    }

    /// What the run did through its egress proxy (after the proxy ended).
    pub fn network(&mut self, report: NetworkReport) {
        self.network = Some(report);
    }

    /// What the run's tool calls came to (after its channel ended).
    pub fn tool_calls(&mut self, calls: pycell_tools::service::ToolCalls) {
        self.tool_calls = Some(calls);
    }

    /// Whether the result has arrived.
    pub fn has_report(&self) -> bool {
        self.report.is_some()
    }

    /// Whether the event stream broke off.
    pub fn is_broken(&self) -> bool {
        self.broken.is_some()
    }

    pub fn finish(self, end: JailerEnd) -> RunResult {
        let Some(mut report) = self.report else {
            let f = JailFailure::new(
                FailureCode::JailerFailed,
                Layer::Jailer,
                no_result_message(self.broken.as_ref(), &end),
            );
            return RunResult::refused(&self.run_id, &self.policy, f);
        };
        report.stdout_truncated |= self.truncated[0];
        report.stderr_truncated |= self.truncated[1];
        let mut result = RunResult::new(
            &self.run_id,
            &self.policy,
            self.limits,
            report,
            &self.output[0],
            &self.output[1],
        );
        result.network = self.network;
        result.images = self.media.images;
        result.images_omitted = self.media.images_omitted;
        result.displays = self.media.displays;
        result.displays_omitted = self.media.displays_omitted;
        result.tool_calls = self.tool_calls.map(Into::into);
        let network = result.network.as_ref().map(refusals::of_network);
        let tools = result.tool_calls.as_ref().map(refusals::of_tools);
        result.add_refusals(network.into_iter().chain(tools).flatten().collect());
        result
    }
}

/// A run's images and displays as its runner sent them, checked against
/// `limits`.
fn checked_media(body: &[u8], limits: Option<MediaLimits>) -> RunMedia {
    let mut sent = serde_json::from_slice::<RunMedia>(body).unwrap_or_default();
    let images = limits.map(|l| l.images);
    keep_valid_images(&mut sent.images, &mut sent.images_omitted, images);
    crate::displays::keep_valid_displays(&mut sent.displays, &mut sent.displays_omitted, limits);
    sent
}

/// Keep the images the runner sent (from the jail: untrusted, whatever
/// the runner checked) only while they are what `limits` allow: a PNG
/// whose header has the size it claims, neither side over `max_edge`,
/// all kept together within `max_bytes`, at a plain path in /workspace.
/// The others count as omitted. Without limits the run captured no
/// images, so none it sent is kept.
pub fn keep_valid_images(
    images: &mut Vec<pycell_wire::report::Image>,
    omitted: &mut u32,
    limits: Option<ImageLimits>,
) {
    let sent = std::mem::take(images);
    let count = sent.len();
    let mut budget = limits.map_or(0, |l| l.max_bytes);
    for image in sent {
        if limits.is_some_and(|l| image_fits(&image, l.max_edge, &mut budget)) {
            images.push(image);
        }
    }
    *omitted = omitted.saturating_add((count - images.len()) as u32);
}

/// Whether `image` is within `max_edge` and what is left of the byte
/// `budget` (taken from it if so). Its size is looked at before it is
/// decoded.
fn image_fits(image: &pycell_wire::report::Image, max_edge: u32, budget: &mut u64) -> bool {
    use base64::Engine;
    if !plain_workspace_path(&image.path) {
        return false;
    }
    match pycell_protocol::bounds::base64_decoded_len(&image.png) {
        Some(n) if n <= *budget => {}
        _ => return false,
    }
    let Ok(png) = base64::engine::general_purpose::STANDARD.decode(&image.png) else {
        return false;
    };
    let fits = png_size(&png).is_some_and(|(w, h)| {
        (w, h) == (image.width, image.height)
            && (1..=max_edge).contains(&w)
            && (1..=max_edge).contains(&h)
    });
    if fits {
        *budget -= png.len() as u64;
    }
    fits
}

/// The (width, height) of a PNG's header (its IHDR chunk, first).
pub fn png_size(png: &[u8]) -> Option<(u32, u32)> {
    let be = |at: usize| Some(u32::from_be_bytes(png.get(at..at + 4)?.try_into().ok()?));
    let header_ok = png.starts_with(b"\x89PNG\r\n\x1a\n") && png.get(12..16) == Some(b"IHDR");
    header_ok.then_some(())?;
    Some((be(16)?, be(20)?))
}

/// A path under /workspace with no `.`, `..` or empty component.
fn plain_workspace_path(path: &str) -> bool {
    let Some(rest) = path.strip_prefix("/workspace/") else {
        return false;
    };
    path.len() <= pycell_protocol::bounds::MAX_PATH_BYTES
        && !path.contains('\0')
        && rest.split('/').all(|part| !matches!(part, "" | "." | ".."))
}

/// What to tell about a jailer that gave no result.
fn no_result_message(broken: Option<&EventError>, end: &JailerEnd) -> String {
    let why = match (broken, end) {
        (Some(e), _) => format!("its event stream is corrupt ({e})"),
        (None, JailerEnd::Exited { status: Ok(s), .. }) => {
            format!("it exited ({s}) without reporting a result")
        }
        (None, JailerEnd::Exited { status: Err(e), .. }) => format!("waiting for it failed ({e})"),
        (None, JailerEnd::Elsewhere) => "it ended without reporting a result".to_string(),
    };
    let tail = match end {
        JailerEnd::Exited { stderr, .. } => String::from_utf8_lossy(stderr).trim().to_string(),
        JailerEnd::Elsewhere => String::new(),
    };
    if tail.is_empty() {
        format!("pycell-jailer failed: {why}")
    } else {
        format!("pycell-jailer failed: {why}; its stderr: {tail}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pycell_wire::report::{Image, RunStatus};
    use std::os::unix::process::ExitStatusExt;

    fn limits(cap: u64) -> RunLimits {
        RunLimits {
            max_output: pycell_policy::Bytes(cap),
            ..RunLimits::default()
        }
    }

    fn ok_report() -> Box<JailReport> {
        let mut r = JailReport::refused(JailFailure::new(FailureCode::Internal, Layer::Jailer, ""));
        r.status = RunStatus::Ok;
        r.error = None;
        r.exit_code = Some(0);
        Box::new(r)
    }

    #[test]
    fn output_is_capped_per_stream_and_marked_truncated() {
        let mut c = Collector::new("r-1", "default", Some(limits(4)));
        let kept = c.record(Event::Output(Stream::Stdout, b"abc".to_vec()));
        assert_eq!(kept, Some((Stream::Stdout, &b"abc"[..])));
        let kept = c.record(Event::Output(Stream::Stdout, b"defg".to_vec()));
        assert_eq!(kept, Some((Stream::Stdout, &b"d"[..])));
        assert_eq!(c.record(Event::Output(Stream::Stdout, b"h".to_vec())), None);
        c.record(Event::Output(Stream::Stderr, b"err".to_vec()));
        c.record(Event::Result(ok_report()));
        let r = c.finish(JailerEnd::Elsewhere);
        assert_eq!((r.stdout.as_str(), r.stderr.as_str()), ("abcd", "err"));
        assert!(r.stdout_truncated && !r.stderr_truncated);
        assert_eq!(r.status, RunStatus::Ok);
        assert_eq!(r.limits.unwrap().max_output.get(), 4);
    }

    #[test]
    fn a_corrupt_stream_is_reported_as_corrupt() {
        let mut c = Collector::new("r-1", "default", None);
        c.broken(EventError::UnknownKind(9));
        let r = c.finish(JailerEnd::Elsewhere);
        let e = r.error.unwrap();
        assert_eq!(
            (r.status, e.code),
            (RunStatus::Refused, FailureCode::JailerFailed)
        );
        assert!(
            e.message
                .contains("event stream is corrupt (unknown event kind 9)"),
            "{e:?}"
        );
    }

    #[test]
    fn a_jailer_without_a_result_says_how_it_ended() {
        let c = Collector::new("r-1", "default", None);
        let end = JailerEnd::Exited {
            status: Ok(std::process::ExitStatus::from_raw(3 << 8)),
            stderr: b"no cgroup here\n".to_vec(),
        };
        let m = c.finish(end).error.unwrap().message;
        assert!(
            m.contains("exit status: 3") && m.contains("its stderr: no cgroup here"),
            "{m}"
        );
        let m = Collector::new("r-1", "p", None).finish(JailerEnd::Elsewhere);
        assert!(m
            .error
            .unwrap()
            .message
            .contains("ended without reporting a result"));
    }

    #[test]
    fn request_errors_name_their_failure() {
        let e = RequestError {
            field: "policy",
            problem: "no policy named \"x\"".into(),
        };
        assert_eq!(e.failure().code, FailureCode::InvalidPolicy);
        let e = RequestError {
            field: "timeout",
            problem: "too long".into(),
        };
        assert_eq!(
            (e.failure().code, e.failure().layer),
            (FailureCode::InvalidRequest, Layer::Request)
        );
        assert_eq!(e.failure().message, "timeout: too long");
    }

    #[test]
    fn a_refusal_message_gives_back_the_field_it_names() {
        let e = RequestError::from_message("policy: no policy named \"x\"".into());
        assert_eq!(
            (e.field, e.problem.as_str()),
            ("policy", "no policy named \"x\"")
        );
        assert_eq!(e.failure().code, FailureCode::InvalidPolicy);
        let e = RequestError::from_message("limits: memory 9 GiB is above...".into());
        assert_eq!(e.field, "limits");
        // Not a field: the whole message is the request's problem.
        let e = RequestError::from_message("frobnicate: no".into());
        assert_eq!((e.field, e.problem.as_str()), ("request", "frobnicate: no"));
    }

    #[test]
    fn policy_arguments_with_a_slash_or_toml_suffix_are_files() {
        assert!(matches!(
            PolicyChoice::from_arg("default"),
            PolicyChoice::Name("default")
        ));
        assert!(matches!(
            PolicyChoice::from_arg("./p.toml"),
            PolicyChoice::File(_)
        ));
        assert!(matches!(
            PolicyChoice::from_arg("p.toml"),
            PolicyChoice::File(_)
        ));
    }

    #[test]
    fn unknown_policies_are_the_callers_mistake_broken_ones_the_operators() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("broken.toml"), "name = 1\n").unwrap();
        let l = Launcher {
            policy_dir: dir.path().to_path_buf(),
            uid_range: uidalloc::DEFAULT_RANGE,
            uid_lock_dir: dir.path().join("uids"),
            cgroup_parent: "pycell".into(),
            keep_cgroups: false,
            jailer: Ok(PathBuf::from("/nonexistent")),
        };
        match l.load_policy(PolicyChoice::Name("nope")) {
            Err(LaunchError::Request(e)) => assert_eq!(e.field, "policy"),
            other => panic!("{other:?}"),
        }
        match l.load_policy(PolicyChoice::Name("broken")) {
            Err(LaunchError::Refused(f)) => assert_eq!(f.code, FailureCode::InvalidPolicy),
            other => panic!("{other:?}"),
        }
    }

    fn image(path: &str, (w, h): (u32, u32), claimed: (u32, u32), pad: usize) -> Image {
        use base64::Engine;
        let mut png = b"\x89PNG\r\n\x1a\n\0\0\0\x0dIHDR".to_vec();
        png.extend_from_slice(&w.to_be_bytes());
        png.extend_from_slice(&h.to_be_bytes());
        png.resize(png.len() + 5 + pad, 0);
        Image {
            path: path.into(),
            png: base64::engine::general_purpose::STANDARD.encode(&png),
            width: claimed.0,
            height: claimed.1,
        }
    }

    #[test]
    fn images_are_kept_only_within_the_limits_at_plain_workspace_paths() {
        let limits = ImageLimits {
            max_edge: 100,
            max_bytes: 100,
        };
        let mut images = vec![
            image("/workspace/a.png", (20, 10), (20, 10), 0),
            image("/workspace/../etc/shadow", (20, 10), (20, 10), 0),
            image("/workspace/./b.png", (20, 10), (20, 10), 0),
            image("/workspace/big.png", (101, 10), (101, 10), 0),
            image("/workspace/liar.png", (20, 10), (10, 10), 0),
            image("/workspace/c.png", (1, 1), (1, 1), 40),
            // Over what is left of the 100 bytes (29 + 69 kept).
            image("/workspace/d.png", (1, 1), (1, 1), 10),
        ];
        let mut omitted = 1;
        keep_valid_images(&mut images, &mut omitted, Some(limits));
        let kept: Vec<&str> = images.iter().map(|i| i.path.as_str()).collect();
        assert_eq!(kept, ["/workspace/a.png", "/workspace/c.png"]);
        assert_eq!(omitted, 6);
        let mut none = vec![image("/workspace/a.png", (2, 2), (2, 2), 0)];
        keep_valid_images(&mut none, &mut omitted, None);
        assert!(none.is_empty(), "a run without image limits sends none");
        assert_eq!(png_size(b"\x89PNG\r\n\x1a\n\0\0\0\x0dIHDR\0\0"), None);
    }
}
