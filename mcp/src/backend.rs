//! Where `pycell mcp`'s runs execute.
//!
//! Embedded mode (no daemon): this process is a multi-threaded tokio program,
//! and forking one is unsafe, so it never builds a jail itself. For each run
//! it resolves the request under its policy, leases a sandbox uid, and spawns
//! the single-threaded `pycell-jailer` executable with the resolved spec as
//! JSON on its stdin (and an empty environment); the jailer answers with
//! event frames on its stdout (output chunks, then the result). Cancelling a
//! run sends the jailer SIGTERM, which its supervisor turns into "kill the
//! sandbox, clean up, report status killed". The uid lease is held until the
//! jailer has exited, so no later run can get the uid while a process of
//! this one might still hold it.
//!
//! Threat model: the request comes from an MCP client (an LLM's choices) and
//! is untrusted: policies are chosen by name only, sizes are bounded, and the
//! jailer re-validates the spec. The event stream comes from our own jailer
//! (root) but carries the sandbox's output, so frames are size-checked and
//! output is capped again here.

use std::io;
use std::ops::RangeInclusive;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::{mpsc, Semaphore};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use pycell_daemon::client::{ClientError, DaemonClient, DEFAULT_SOCKET};
use pycell_daemon::protocol::{ErrorCode, RunRequest, Stream};
use pycell_daemon::resolve::{self, ResolveError, POLICY_DIR};
use pycell_daemon::result::RunResult;
use pycell_jailer::events::{self, Event as Frame, MAX_FRAME};
use pycell_jailer::report::JailFailure;
use pycell_jailer::supervisor::OutputStream;
use pycell_jailer::uidalloc::{self, UidLease};

/// Where embedded runs keep their uid leases (shared with `pycell run`).
pub const UID_LOCK_DIR: &str = "/run/pycell/uids";
/// How much of the jailer's own stderr is kept for an error message.
const JAILER_STDERR_CAP: usize = 16 * 1024;
/// Sandboxes one server runs at once; further calls wait for a slot. Each
/// sandbox is bounded by its policy, but a client firing calls in parallel
/// must not multiply that without limit (the daemon has its own quotas).
pub const MAX_CONCURRENT_RUNS: usize = 8;
/// How long past a run's wall timeout a silent jailer is given before it is
/// told to stop.
const JAILER_MARGIN: Duration = Duration::from_secs(30);
/// How long a jailer told to stop (SIGTERM) has before it is killed.
const KILL_AFTER: Duration = Duration::from_secs(10);

/// Something the caller asked for that cannot be run as asked: the caller
/// can fix it (as opposed to a refusal, which is the host's problem).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {problem}")]
pub struct RequestError {
    /// The request field at fault: `policy`, `timeout`, `code`, `stdin`, `limits`, `args`.
    pub field: &'static str,
    pub problem: String,
}

/// What happens during a run, as it happens.
#[derive(Debug)]
pub enum RunEvent<'a> {
    /// The jailer was started for this run, as this sandbox uid.
    Started { run_id: &'a str, sandbox_uid: u32 },
    /// A chunk of the program's output (already capped by the jailer).
    Output {
        stream: OutputStream,
        bytes: &'a [u8],
    },
}

/// Runs requests in sandboxes. Cheap to clone; clones share one set of
/// in-flight runs, which [`Backend::shutdown`] cancels and waits for.
#[derive(Debug, Clone)]
pub struct Backend {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    /// The jailer executable, or why there is none.
    jailer: Result<PathBuf, String>,
    uid_range: Result<RangeInclusive<u32>, String>,
    policy_dir: PathBuf,
    tracker: TaskTracker,
    shutdown: CancellationToken,
    slots: Semaphore,
    /// Never use a daemon (`pycell mcp --embedded`).
    embedded_only: bool,
    /// JAILER_MARGIN and KILL_AFTER (shorter in tests).
    margin: Duration,
    kill_after: Duration,
}

/// `$PYCELL_JAILER`, else `pycell-jailer` next to this executable.
fn find_jailer() -> Result<PathBuf, String> {
    if let Some(p) = std::env::var_os("PYCELL_JAILER") {
        return Ok(PathBuf::from(p));
    }
    let exe = std::env::current_exe().map_err(|e| format!("locating pycell itself: {e}"))?;
    let beside = exe.with_file_name("pycell-jailer");
    // Next to pycell in a build tree; where the Debian package puts it.
    let installed = PathBuf::from(INSTALLED_JAILER);
    [beside.clone(), installed]
        .into_iter()
        .find(|p| p.is_file())
        .ok_or_else(|| {
            format!(
                "pycell-jailer not found at {} or {INSTALLED_JAILER} (set PYCELL_JAILER to its path)",
                beside.display()
            )
        })
}

/// Where the Debian package installs the jailer.
const INSTALLED_JAILER: &str = "/usr/libexec/pycell/pycell-jailer";

/// The pycelld socket to use: `PYCELL_SOCKET` if set (and not empty), else
/// the default path if a daemon is listening there.
pub fn daemon_socket() -> Option<PathBuf> {
    match std::env::var_os("PYCELL_SOCKET") {
        Some(p) if !p.is_empty() => Some(PathBuf::from(p)),
        _ => {
            let d = Path::new(DEFAULT_SOCKET);
            d.exists().then(|| d.to_path_buf())
        }
    }
}

fn uid_range_from_env() -> Result<RangeInclusive<u32>, String> {
    match std::env::var("PYCELL_UID_RANGE") {
        Ok(s) => uidalloc::parse_range(&s)
            .ok_or_else(|| format!("PYCELL_UID_RANGE={s:?}: expected START-END")),
        Err(_) => Ok(uidalloc::DEFAULT_RANGE),
    }
}

/// Why a run cannot start: the caller's mistake, or the host's refusal.
enum Early {
    Request(RequestError),
    Refused(JailFailure),
}

impl From<RequestError> for Early {
    fn from(e: RequestError) -> Self {
        Early::Request(e)
    }
}

/// A resolved run with its uid lease, ready for the jailer.
struct Prepared {
    policy: String,
    resolved: resolve::Resolved,
    lease: UidLease,
}

impl Backend {
    /// Configuration from the environment (`PYCELL_JAILER`,
    /// `PYCELL_UID_RANGE`). Problems are reported by each run, as a refusal,
    /// so that the MCP server still starts and `sandbox_info` can explain.
    /// With `embedded_only`, runs never go to a daemon, even if one is
    /// listening.
    pub fn from_env(embedded_only: bool) -> Backend {
        Backend::new(find_jailer(), embedded_only, JAILER_MARGIN, KILL_AFTER)
    }

    /// Where runs go: the daemon's socket, if they go to one.
    pub fn daemon(&self) -> Option<PathBuf> {
        if self.inner.embedded_only {
            None
        } else {
            daemon_socket()
        }
    }

    /// `daemon (SOCKET)` or `embedded`, as `sandbox_info` reports it.
    pub fn mode(&self) -> String {
        crate::info::mode_name(self.daemon().as_deref())
    }

    fn new(
        jailer: Result<PathBuf, String>,
        embedded_only: bool,
        margin: Duration,
        kill_after: Duration,
    ) -> Backend {
        Backend {
            inner: Arc::new(Inner {
                embedded_only,
                jailer,
                uid_range: uid_range_from_env(),
                policy_dir: PathBuf::from(POLICY_DIR),
                tracker: TaskTracker::new(),
                shutdown: CancellationToken::new(),
                slots: Semaphore::new(MAX_CONCURRENT_RUNS),
                margin,
                kill_after,
            }),
        }
    }

    /// Run `req` in a sandbox. `on_event` sees the run start and its output
    /// as it arrives; cancelling `cancel` kills the sandbox (the result then
    /// says `killed`). A refused run is an `Ok` result with status
    /// `refused`; `Err` means the request itself is wrong.
    pub async fn run(
        &self,
        req: RunRequest,
        on_event: impl FnMut(RunEvent<'_>) + Send,
        cancel: CancellationToken,
    ) -> Result<RunResult, RequestError> {
        // With a pycelld socket the daemon runs it (no root needed here);
        // otherwise this process is the embedded daemon.
        if let Some(socket) = self.daemon() {
            return self
                .inner
                .tracker
                .track_future(self.run_via_daemon(socket, req, on_event, cancel))
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
    async fn run_via_daemon(
        &self,
        socket: PathBuf,
        req: RunRequest,
        mut on_event: impl FnMut(RunEvent<'_>) + Send,
        cancel: CancellationToken,
    ) -> Result<RunResult, RequestError> {
        let policy = req.policy_name().to_string();
        let refused = |code: &str, message: String| {
            Ok(RunResult::refused(
                "",
                &policy,
                JailFailure::new(code, "daemon", message, None),
            ))
        };
        let connected = tokio::task::spawn_blocking(move || DaemonClient::connect(&socket)).await;
        let mut client = match connected {
            Ok(Ok(c)) => c,
            Ok(Err(ClientError::Refused { code, message })) => {
                return refused(code.as_str(), message)
            }
            Ok(Err(e)) => return refused("daemon_unavailable", e.to_string()),
            Err(e) => return refused("internal", e.to_string()),
        };
        let mut canceller = match client.canceller() {
            Ok(c) => c,
            Err(e) => return refused("daemon_unavailable", e.to_string()),
        };
        let (tx, mut rx) = mpsc::unbounded_channel::<(Stream, Vec<u8>)>();
        let mut handle = tokio::task::spawn_blocking(move || {
            client.run(req, |stream, bytes| {
                let _ = tx.send((stream, bytes.to_vec()));
            })
        });
        let mut cancel_sent = false;
        let outcome = loop {
            tokio::select! {
                Some((stream, bytes)) = rx.recv() => {
                    let stream = match stream {
                        Stream::Stdout => OutputStream::Stdout,
                        Stream::Stderr => OutputStream::Stderr,
                    };
                    on_event(RunEvent::Output { stream, bytes: &bytes });
                }
                _ = cancel.cancelled(), if !cancel_sent => {
                    cancel_sent = true;
                    let _ = canceller.cancel();
                }
                _ = self.inner.shutdown.cancelled(), if !cancel_sent => {
                    cancel_sent = true;
                    let _ = canceller.cancel();
                }
                done = &mut handle => break done,
            }
        };
        // Chunks still queued when the run ended.
        while let Ok((stream, bytes)) = rx.try_recv() {
            let stream = match stream {
                Stream::Stdout => OutputStream::Stdout,
                Stream::Stderr => OutputStream::Stderr,
            };
            on_event(RunEvent::Output {
                stream,
                bytes: &bytes,
            });
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
            Ok(Err(ClientError::Refused { code, message })) => refused(code.as_str(), message),
            Ok(Err(e)) => refused("daemon_failed", e.to_string()),
            Err(e) => refused("internal", e.to_string()),
        }
    }

    /// Cancel every run in flight (their results say `killed`) and refuse
    /// new ones.
    pub fn cancel_all(&self) {
        self.inner.shutdown.cancel();
    }

    /// Cancel every run in flight and wait (at most `grace`) for their
    /// jailers to clean up and exit. New runs are refused afterwards.
    pub async fn shutdown(&self, grace: Duration) {
        self.inner.shutdown.cancel();
        self.inner.tracker.close();
        let _ = tokio::time::timeout(grace, self.inner.tracker.wait()).await;
    }

    fn prepare(&self, req: &RunRequest) -> Result<Prepared, Early> {
        let name = req.policy_name();
        let policy = resolve::load_policy_by_name(name, &self.inner.policy_dir).map_err(|e| {
            match e {
                ResolveError::UnknownPolicy { .. } => Early::Request(RequestError {
                    field: "policy",
                    problem: format!(
                        "no policy named {name:?}; available: {}",
                        crate::info::collect_policy_names(&self.inner.policy_dir).join(", ")
                    ),
                }),
                ResolveError::BadRequest { field, problem } => {
                    Early::Request(RequestError { field, problem })
                }
                // An installed file that does not load is the operator's problem.
                other => Early::Refused(JailFailure::new(
                    "invalid_policy",
                    "policy",
                    other.to_string(),
                    Some("the operator must fix the policy file (pycell policy check)"),
                )),
            }
        })?;
        let resolved = resolve::resolve(&policy, req).map_err(|e| match e {
            ResolveError::BadRequest { field, problem } => {
                Early::Request(RequestError { field, problem })
            }
            other => Early::Refused(JailFailure::new(
                "invalid_policy",
                "policy",
                other.to_string(),
                None,
            )),
        })?;
        if !nix::unistd::geteuid().is_root() {
            return Err(Early::Refused(JailFailure::new(
                "not_root",
                "jailer",
                "embedded mode needs root (it creates cgroups and maps a sandbox uid), and no pycelld daemon is running",
                Some("start pycell mcp as root, or install and start the pycelld service"),
            )));
        }
        let range = self
            .inner
            .uid_range
            .clone()
            .map_err(|m| Early::Refused(JailFailure::new("invalid_config", "uid", m, None)))?;
        let lease = uidalloc::allocate(&range, Path::new(UID_LOCK_DIR)).map_err(|e| {
            Early::Refused(JailFailure::new(
                "uid_unavailable",
                "uid",
                e.to_string(),
                None,
            ))
        })?;
        Ok(Prepared {
            policy: policy.name,
            resolved,
            lease,
        })
    }

    async fn run_embedded(
        &self,
        req: RunRequest,
        mut on_event: impl FnMut(RunEvent<'_>) + Send,
        cancel: CancellationToken,
    ) -> Result<RunResult, RequestError> {
        let policy_name = req.policy_name().to_string();
        let refused = |f: JailFailure| Ok(RunResult::refused("", &policy_name, f));
        let shutting_down = || {
            JailFailure::new(
                "shutting_down",
                "jailer",
                "pycell mcp is shutting down",
                None,
            )
        };
        // Wait for a slot; a run cancelled while it waits never starts.
        let _slot = tokio::select! {
            biased;
            _ = self.inner.shutdown.cancelled() => return refused(shutting_down()),
            _ = cancel.cancelled() => {
                return refused(JailFailure::new(
                    "cancelled",
                    "jailer",
                    "the call was cancelled before its sandbox started",
                    None,
                ))
            }
            slot = self.inner.slots.acquire() => match slot {
                Ok(s) => s,
                Err(_) => return refused(shutting_down()),
            },
        };
        // Policy files, interpreter paths, the uid database and lock files:
        // blocking work, off the async workers.
        let this = self.clone();
        let prepared = tokio::task::spawn_blocking(move || this.prepare(&req)).await;
        let Prepared {
            policy,
            resolved,
            lease,
        } = match prepared {
            Ok(Ok(p)) => p,
            Ok(Err(Early::Request(e))) => return Err(e),
            Ok(Err(Early::Refused(f))) => return refused(f),
            Err(e) => {
                return refused(JailFailure::new(
                    "internal",
                    "jailer",
                    format!("preparing the run: {e}"),
                    None,
                ))
            }
        };
        let jailer = match &self.inner.jailer {
            Ok(p) => p.clone(),
            Err(m) => {
                return refused(JailFailure::new(
                    "jailer_unavailable",
                    "jailer",
                    m.clone(),
                    None,
                ))
            }
        };
        let resolve::Resolved { mut spec, limits } = resolved;
        let run_id = pycell_jailer::spec::new_run_id();
        spec.run_id = run_id.clone();
        spec.sandbox_uid = lease.uid;
        spec.sandbox_gid = lease.gid;
        let spec_json = match serde_json::to_vec(&spec) {
            Ok(j) => j,
            Err(e) => {
                return Ok(RunResult::refused(
                    &run_id,
                    &policy,
                    JailFailure::new(
                        "internal",
                        "jailer",
                        format!("encoding the spec: {e}"),
                        None,
                    ),
                ))
            }
        };

        // Spawned from this async task, i.e. from a runtime worker thread,
        // never from a blocking-pool thread: the jailer's parent-death signal
        // follows the thread that forked it, and idle blocking threads exit.
        let child = Command::new(&jailer)
            .env_clear()
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn();
        let child = match child {
            Ok(c) => c,
            Err(e) => {
                return Ok(RunResult::refused(
                    &run_id,
                    &policy,
                    JailFailure::new(
                        "jailer_unavailable",
                        "jailer",
                        format!("cannot start {}: {e}", jailer.display()),
                        Some("pycell-jailer is installed next to pycell; or set PYCELL_JAILER"),
                    ),
                ))
            }
        };
        let mut guard = JailerGuard {
            running: Some((child, lease)),
            tracker: self.inner.tracker.clone(),
        };
        on_event(RunEvent::Started {
            run_id: &run_id,
            sandbox_uid: spec.sandbox_uid,
        });

        let (mut stdin, stdout, stderr) = {
            let (child, _) = guard.running.as_mut().expect("just set");
            (child.stdin.take(), child.stdout.take(), child.stderr.take())
        };
        // The jailer reads the whole spec before it starts the jail, so
        // writing it all first cannot deadlock against its output.
        if let Some(mut w) = stdin.take() {
            // A jailer that died early shows up below as a missing result.
            let _ = w.write_all(&spec_json).await;
            drop(w);
        }
        drop(spec_json);
        let stderr_task = stderr.map(|e| tokio::spawn(read_capped(e, JAILER_STDERR_CAP)));
        // Frames are read in their own task: a read cut short by a select!
        // would lose part of a frame.
        let (tx, mut rx) = mpsc::channel::<io::Result<Frame>>(16);
        if let Some(out) = stdout {
            tokio::spawn(async move {
                let mut r = BufReader::with_capacity(128 * 1024, out);
                loop {
                    match read_frame(&mut r).await {
                        Ok(Some(f)) => {
                            if tx.send(Ok(f)).await.is_err() {
                                break;
                            }
                        }
                        Ok(None) => break,
                        Err(e) => {
                            let _ = tx.send(Err(e)).await;
                            break;
                        }
                    }
                }
            });
        }

        let cap = usize::try_from(limits.max_output).unwrap_or(usize::MAX);
        let mut out = Vec::new();
        let mut err = Vec::new();
        let mut report = None;
        let mut stream_error = None;
        // The jailer enforces the run's limits itself. These deadlines only
        // catch a jailer that stops responding (a bug): past the wall timeout
        // and a margin it is told to stop, and a little later it is killed.
        let far = Instant::now() + Duration::from_secs(365 * 24 * 3600);
        let watchdog = Instant::now() + limits.wall_timeout + self.inner.margin;
        let mut kill_at: Option<Instant> = None;
        loop {
            let stopping = kill_at.is_some();
            let next = tokio::select! {
                biased;
                _ = cancel.cancelled(), if !stopping => {
                    guard.terminate();
                    kill_at = Some(Instant::now() + self.inner.kill_after);
                    continue;
                }
                _ = self.inner.shutdown.cancelled(), if !stopping => {
                    guard.terminate();
                    kill_at = Some(Instant::now() + self.inner.kill_after);
                    continue;
                }
                _ = tokio::time::sleep_until(watchdog), if !stopping => {
                    guard.terminate();
                    kill_at = Some(Instant::now() + self.inner.kill_after);
                    continue;
                }
                _ = tokio::time::sleep_until(kill_at.unwrap_or(far)), if stopping => {
                    guard.kill();
                    kill_at = Some(far);
                    continue;
                }
                next = rx.recv() => next,
            };
            match next {
                None => break,
                Some(Ok(Frame::Stdout(b))) => {
                    append_capped(&mut out, &b, cap);
                    on_event(RunEvent::Output {
                        stream: OutputStream::Stdout,
                        bytes: &b,
                    });
                }
                Some(Ok(Frame::Stderr(b))) => {
                    append_capped(&mut err, &b, cap);
                    on_event(RunEvent::Output {
                        stream: OutputStream::Stderr,
                        bytes: &b,
                    });
                }
                Some(Ok(Frame::Result(r))) => report = Some(r),
                Some(Err(e)) => {
                    stream_error = Some(e);
                    guard.terminate();
                    kill_at.get_or_insert(Instant::now() + self.inner.kill_after);
                }
            }
        }
        let status = guard.wait(self.inner.kill_after).await;
        let jailer_stderr = match stderr_task {
            Some(t) => t.await.unwrap_or_default(),
            None => Vec::new(),
        };
        match report {
            Some(report) => Ok(RunResult::new(
                &run_id,
                &policy,
                Some(&limits),
                *report,
                &out,
                &err,
            )),
            None => {
                let why = match (&stream_error, status) {
                    (Some(e), _) => format!("its event stream is corrupt ({e})"),
                    (None, Ok(s)) => format!("it exited ({s}) without reporting a result"),
                    (None, Err(e)) => format!("waiting for it failed ({e})"),
                };
                let tail = String::from_utf8_lossy(&jailer_stderr);
                let tail = tail.trim();
                Ok(RunResult::refused(
                    &run_id,
                    &policy,
                    JailFailure::new(
                        "jailer_failed",
                        "jailer",
                        if tail.is_empty() {
                            format!("pycell-jailer failed: {why}")
                        } else {
                            format!("pycell-jailer failed: {why}; its stderr: {tail}")
                        },
                        None,
                    ),
                ))
            }
        }
    }
}

/// The running jailer and the uid lease it runs under. If the run is
/// abandoned (its future dropped), the jailer is told to stop and a detached
/// task waits for it before releasing the lease.
struct JailerGuard {
    running: Option<(Child, UidLease)>,
    tracker: TaskTracker,
}

impl JailerGuard {
    /// Ask the jailer to kill the sandbox and clean up (SIGTERM; its
    /// supervisor reports the run as killed).
    fn terminate(&self) {
        if let Some(pid) = self
            .running
            .as_ref()
            .and_then(|(c, _)| c.id())
            .and_then(|id| i32::try_from(id).ok())
        {
            let _ = kill(Pid::from_raw(pid), Signal::SIGTERM);
        }
    }

    /// Kill the jailer outright (its sandbox dies with it: the jail's init
    /// has a parent-death signal).
    fn kill(&mut self) {
        if let Some((child, _)) = self.running.as_mut() {
            let _ = child.start_kill();
        }
    }

    /// Wait for the jailer to exit (killing it if it takes longer than
    /// `patience`), then release the uid.
    async fn wait(&mut self, patience: Duration) -> io::Result<std::process::ExitStatus> {
        let Some((mut child, lease)) = self.running.take() else {
            return Err(io::Error::other("no jailer"));
        };
        let status = match tokio::time::timeout(patience, child.wait()).await {
            Ok(status) => status,
            Err(_) => {
                let _ = child.start_kill();
                child.wait().await
            }
        };
        drop(lease);
        status
    }
}

impl Drop for JailerGuard {
    fn drop(&mut self) {
        let Some((mut child, lease)) = self.running.take() else {
            return;
        };
        if let Some(pid) = child.id().and_then(|id| i32::try_from(id).ok()) {
            let _ = kill(Pid::from_raw(pid), Signal::SIGTERM);
        }
        match tokio::runtime::Handle::try_current() {
            Ok(h) => {
                let waiter = self.tracker.track_future(async move {
                    let _ = child.wait().await;
                    drop(lease);
                });
                h.spawn(waiter);
            }
            // No runtime left: the jailer still got SIGTERM (and gets it
            // again from its parent-death signal when we exit).
            Err(_) => drop(lease),
        }
    }
}

fn append_capped(buf: &mut Vec<u8>, bytes: &[u8], cap: usize) {
    let room = cap.saturating_sub(buf.len());
    buf.extend_from_slice(&bytes[..bytes.len().min(room)]);
}

async fn read_capped(mut r: impl AsyncRead + Unpin, cap: usize) -> Vec<u8> {
    let mut kept = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        match r.read(&mut chunk).await {
            Ok(0) | Err(_) => return kept,
            Ok(n) => append_capped(&mut kept, &chunk[..n], cap),
        }
    }
}

/// One event frame (see `pycell_jailer::events`); `Ok(None)` at a clean end.
async fn read_frame(r: &mut (impl AsyncRead + Unpin)) -> io::Result<Option<Frame>> {
    let mut head = [0u8; 5];
    match r.read_exact(&mut head[..1]).await {
        Ok(_) => {}
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    r.read_exact(&mut head[1..]).await?;
    let len = u32::from_le_bytes([head[1], head[2], head[3], head[4]]);
    if len > MAX_FRAME {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("event frame of {len} bytes exceeds {MAX_FRAME}"),
        ));
    }
    let mut frame = vec![0u8; 5 + len as usize];
    frame[..5].copy_from_slice(&head);
    r.read_exact(&mut frame[5..]).await?;
    // The jailer crate owns the format; decode with its reader.
    events::read_event(&mut frame.as_slice())?
        .map(Some)
        .ok_or_else(|| io::Error::new(io::ErrorKind::UnexpectedEof, "empty frame"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use pycell_jailer::events::{write_frame, write_result, KIND_STDERR, KIND_STDOUT};
    use pycell_jailer::report::JailReport;

    #[test]
    fn run_ids_are_what_the_jailer_accepts_and_distinct() {
        let a = pycell_jailer::spec::new_run_id();
        let b = pycell_jailer::spec::new_run_id();
        assert_ne!(a, b);
        for id in [a, b] {
            assert_eq!(id.len(), 18, "{id}");
            assert!(id.starts_with("r-"));
            assert!(id[2..]
                .bytes()
                .all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(&c)));
        }
    }

    #[test]
    fn output_is_capped() {
        let mut b = Vec::new();
        append_capped(&mut b, b"hello", 3);
        append_capped(&mut b, b"world", 3);
        assert_eq!(b, b"hel");
    }

    #[tokio::test]
    async fn frames_are_read_as_the_jailer_writes_them() {
        let mut buf = Vec::new();
        write_frame(&mut buf, KIND_STDOUT, b"out").unwrap();
        write_frame(&mut buf, KIND_STDERR, b"err").unwrap();
        write_result(
            &mut buf,
            &JailReport::refused(JailFailure::new("x", "y", "z", None)),
        )
        .unwrap();
        let mut r = buf.as_slice();
        assert!(matches!(read_frame(&mut r).await.unwrap(), Some(Frame::Stdout(v)) if v == b"out"));
        assert!(matches!(read_frame(&mut r).await.unwrap(), Some(Frame::Stderr(v)) if v == b"err"));
        assert!(matches!(
            read_frame(&mut r).await.unwrap(),
            Some(Frame::Result(_))
        ));
        assert!(read_frame(&mut r).await.unwrap().is_none());
        let mut huge: &[u8] = &[1, 0xff, 0xff, 0xff, 0xff];
        assert!(read_frame(&mut huge).await.is_err());
        let mut cut: &[u8] = &[1, 9, 0, 0, 0, b'a'];
        assert!(read_frame(&mut cut).await.is_err());
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

    #[tokio::test]
    async fn a_jailer_that_dies_without_a_result_is_a_refusal_that_says_why() {
        require_root();
        let dir = tempfile::tempdir().unwrap();
        let jailer = fake_jailer(
            dir.path(),
            "cat >/dev/null; echo 'no cgroup here' >&2; exit 3",
        );
        let b = Backend::new(Ok(jailer), true, JAILER_MARGIN, KILL_AFTER);
        let r = b
            .run(print1(), |_| {}, CancellationToken::new())
            .await
            .unwrap();
        let e = r.error.expect("an error");
        assert_eq!(e.code, "jailer_failed", "{e:?}");
        assert!(e.message.contains("exit status: 3"), "{e:?}");
        assert!(e.message.contains("no cgroup here"), "{e:?}");
    }

    #[tokio::test]
    async fn a_corrupt_event_stream_is_a_refusal() {
        require_root();
        let dir = tempfile::tempdir().unwrap();
        let jailer = fake_jailer(dir.path(), "cat >/dev/null; printf 'garbage'");
        let b = Backend::new(Ok(jailer), true, JAILER_MARGIN, KILL_AFTER);
        let r = b
            .run(print1(), |_| {}, CancellationToken::new())
            .await
            .unwrap();
        let e = r.error.expect("an error");
        assert_eq!(e.code, "jailer_failed", "{e:?}");
        assert!(e.message.contains("event stream is corrupt"), "{e:?}");
    }

    #[tokio::test]
    async fn a_jailer_that_hangs_is_stopped_then_killed() {
        require_root();
        let dir = tempfile::tempdir().unwrap();
        // Ignores SIGTERM and never answers: only SIGKILL ends it.
        let jailer = fake_jailer(dir.path(), "trap '' TERM; cat >/dev/null; exec sleep 600");
        let margin = Duration::from_millis(300);
        let b = Backend::new(Ok(jailer), true, margin, Duration::from_millis(300));
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
        assert_eq!(e.code, "jailer_failed", "{e:?}");
        assert!(e.message.contains("signal: 9"), "{e:?}");
    }

    #[tokio::test]
    async fn a_missing_jailer_is_a_refusal() {
        require_root();
        let b = Backend::new(
            Ok(PathBuf::from("/nonexistent/pycell-jailer")),
            true,
            JAILER_MARGIN,
            KILL_AFTER,
        );
        let r = b
            .run(print1(), |_| {}, CancellationToken::new())
            .await
            .unwrap();
        let e = r.error.expect("an error");
        assert_eq!(e.code, "jailer_unavailable", "{e:?}");
        assert!(e.message.contains("/nonexistent/pycell-jailer"), "{e:?}");
    }

    #[tokio::test]
    async fn an_unknown_policy_is_the_callers_mistake() {
        let b = Backend::from_env(true);
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
