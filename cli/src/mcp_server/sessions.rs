//! Sessions in embedded `pycell mcp`: jails whose python stays alive
//! between calls (`pycell_launch::session`), held in a table by handle for
//! as long as this process lives, at most the policy's `[session] per_uid`
//! of them at once. Each call names its session; a cell is the next request
//! in that session's queue. Through pycelld, the daemon holds them instead.

use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::Engine;
use pycell_deps::build::Ensured;
use pycell_launch::launcher::{JailerStderr, LaunchError, PolicyChoice};
use pycell_launch::resolve::Extras;
use pycell_launch::session::{Answer, Session, SessionError, SessionParts, SessionTiming};
use pycell_launch::session_table::{self, Entry, Lookup};
use pycell_launch::supervisor::Services;
use pycell_policy::Policy;
use pycell_protocol::messages::RunRequest;
use pycell_protocol::result::{EnvReport, LimitsReport};
use pycell_runner::session::{CellLimits, SessionOp, SessionRequest};
use pycell_wire::codes::FailureCode;
use pycell_wire::report::JailFailure;

use super::sandboxes::{RequestError, Sandboxes};
use crate::embedded::Installer;

/// How long a session's python may take to import its policy's modules
/// and get ready.
const READY_WITHIN: Duration = Duration::from_secs(60);

/// What the server keeps of a session besides the session itself.
#[derive(Debug, Clone)]
pub struct SessionInfo {
    pub policy: Arc<Policy>,
    pub limits: LimitsReport,
    /// Its env, held in use (safe from removal) while the session lives.
    pub env: Option<Arc<Ensured>>,
}

impl SessionInfo {
    pub fn env_report(&self) -> Option<EnvReport> {
        self.env.as_ref().map(|e| e.report.clone())
    }
}

/// A session call that could not be served; `code` is stable.
#[derive(Debug, Clone)]
pub struct SessionFailure {
    pub code: FailureCode,
    pub message: String,
}

impl SessionFailure {
    fn new(code: FailureCode, message: impl Into<String>) -> SessionFailure {
        SessionFailure {
            code,
            message: message.into(),
        }
    }

    fn refused(f: &JailFailure) -> SessionFailure {
        let mut message = f.message.clone();
        if let Some(h) = &f.hint {
            message.push_str(&format!(" ({h})"));
        }
        SessionFailure::new(f.code, message)
    }
}

/// A started session, as `session_start` reports it.
#[derive(Debug, Clone)]
pub struct Started {
    pub handle: String,
    pub entry: Entry<SessionInfo>,
}

/// The uid that owns embedded sessions: this process's.
fn owner() -> u32 {
    nix::unistd::getuid().as_raw()
}

impl Sandboxes {
    /// Start a session for `req` (its policy, dependencies and limits;
    /// its code is ignored).
    pub async fn start_session(&self, req: RunRequest) -> Result<Started, SessionFailure> {
        if self.daemon().is_some() {
            return Err(SessionFailure::new(
                FailureCode::SessionsUnavailable,
                "sessions through pycelld are not available in this version; run `pycell mcp --embedded` as root for sessions",
            ));
        }
        let (prepared, policy, ensured) = self.prepare_session(req).await?;
        let held = self.sessions().map(|t| t.count(owner())).unwrap_or(0);
        if held >= policy.session.per_uid as usize {
            return Err(SessionFailure::new(
                FailureCode::TooManySessions,
                format!(
                    "{held} sessions are open, the most policy {:?} allows ([session] per_uid = {}); end one with session_end (session_list shows them)",
                    policy.name, policy.session.per_uid
                ),
            ));
        }
        let limits = prepared.limits.clone();
        let egress = prepared.egress.clone();
        let launched = prepared
            .spawn_async(JailerStderr::Capture)
            .await
            .map_err(|r| {
                let f = r.error.clone().unwrap_or_else(|| {
                    JailFailure::new(
                        FailureCode::Internal,
                        pycell_wire::codes::Layer::Jailer,
                        "the session's jail did not start",
                    )
                });
                SessionFailure::refused(&f)
            })?;
        let services = Services {
            egress: egress.map(|rules| {
                (
                    pycell_egress::EgressConfig::from_env(&policy.name, rules),
                    None,
                )
            }),
        };
        let timing = SessionTiming {
            ready_within: READY_WITHIN,
            lifetime: policy.session.lifetime,
        };
        let parts =
            SessionParts::embedded(launched, services, self.patience(), timing).map_err(|r| {
                SessionFailure::new(
                    FailureCode::Internal,
                    r.error.map(|e| e.message).unwrap_or_default(),
                )
            })?;
        let session = Session::start(parts, READY_WITHIN, self.shutdown_token().child_token())
            .await
            .map_err(|e| {
                let code = e
                    .result
                    .error
                    .as_ref()
                    .map_or(FailureCode::JailSetupFailed, |f| f.code);
                SessionFailure::new(code, e.message)
            })?;
        let handle = self
            .sessions()
            .map_err(|()| "the session table is poisoned".to_string())
            .and_then(|t| t.new_handle().map_err(|e| e.to_string()))
            .map_err(|e| {
                SessionFailure::new(FailureCode::Internal, format!("a session handle: {e}"))
            })?;
        let now = Instant::now();
        let entry = Entry {
            session,
            owner: owner(),
            started: now,
            last_used: now,
            info: SessionInfo {
                policy: Arc::new(policy),
                limits,
                env: ensured.map(Arc::new),
            },
        };
        // Counted again as it goes in: another start may have finished
        // meanwhile.
        let admitted = match self.sessions() {
            Ok(mut t) if t.count(owner()) < entry.info.policy.session.per_uid as usize => {
                t.insert(handle.clone(), entry.clone());
                true
            }
            _ => false,
        };
        if !admitted {
            entry.session.end().await;
            return Err(SessionFailure::new(
                FailureCode::TooManySessions,
                "another session started meanwhile and took the last one the policy allows; end one with session_end",
            ));
        }
        Ok(Started { handle, entry })
    }

    /// Policy, env and spec for a session: blocking work, on a thread of
    /// its own (an install waits for the install jail).
    async fn prepare_session(
        &self,
        req: RunRequest,
    ) -> Result<(pycell_launch::launcher::Prepared, Policy, Option<Ensured>), SessionFailure> {
        let launcher = self
            .launcher()
            .map_err(|f| SessionFailure::refused(&f))?
            .clone();
        let stop = tokio::sync::watch::channel(None).1;
        let prepared = tokio::task::spawn_blocking(move || {
            let policy = launcher.load_policy(PolicyChoice::Name(req.policy_name()))?;
            let mut installer = Installer {
                handle: tokio::runtime::Handle::current(),
                stop,
            };
            let ensured =
                crate::embedded::env_for(&launcher, &policy, &req, &mut installer, &mut |_| {})
                    .map_err(LaunchError::Refused)?;
            let extras = Extras {
                env: ensured.as_ref().map(|e| e.env.dir.clone()),
                ..Extras::default()
            };
            let prepared = launcher.prepare_session(&policy, &req, &extras)?;
            Ok::<_, LaunchError>((prepared, policy, ensured))
        })
        .await;
        match prepared {
            Ok(Ok(p)) => Ok(p),
            Ok(Err(LaunchError::Request(e))) => Err(request_failure(&e)),
            Ok(Err(LaunchError::Refused(f))) => Err(SessionFailure::refused(&f)),
            Err(e) => Err(SessionFailure::new(
                FailureCode::Internal,
                format!("preparing the session: {e}"),
            )),
        }
    }

    /// The live session `handle` of this process.
    pub fn session(&self, handle: &str) -> Result<Entry<SessionInfo>, SessionFailure> {
        let looked = match self.sessions() {
            Ok(mut t) => t.get(owner(), handle),
            Err(_) => Err(Lookup::Unknown),
        };
        looked.map_err(|l| {
            let (code, message) = session_table::lookup_message(&l, handle);
            SessionFailure::new(code, message)
        })
    }

    /// Serve `request` in session `handle`, with the policy's clocks (the
    /// wall timeout `timeout`, if given). A cancelled call interrupts it.
    pub async fn session_request(
        &self,
        handle: &str,
        request: SessionRequest,
        timeout: Option<Duration>,
        cancel: tokio_util::sync::CancellationToken,
    ) -> Result<(Entry<SessionInfo>, Answer), SessionFailure> {
        let entry = self.session(handle)?;
        let limits = &entry.info.policy.limits;
        let op = SessionOp {
            wall_timeout_ms: millis(timeout.unwrap_or(limits.wall_timeout)),
            cpu_time_s: limits.cpu_time.as_secs().max(1),
            max_output_bytes: limits.max_output,
            request,
        };
        let session = entry.session.clone();
        let asked = session.request(op);
        tokio::pin!(asked);
        let answered = tokio::select! {
            a = &mut asked => a,
            _ = cancel.cancelled() => {
                session.interrupt();
                asked.await
            }
        };
        match answered {
            Ok(a) => Ok((entry, a)),
            Err(SessionError::Busy) => Err(SessionFailure::new(
                FailureCode::SessionBusy,
                format!(
                    "session {handle} already has {} calls waiting; wait for them to finish",
                    pycell_launch::session::MAX_QUEUED
                ),
            )),
            Err(SessionError::Ended(ended)) => {
                if let Ok(mut t) = self.sessions() {
                    t.forget(handle, ended.clone());
                }
                let (code, message) = session_table::lookup_message(&Lookup::Gone(ended), handle);
                Err(SessionFailure::new(code, message))
            }
        }
    }

    /// End session `handle` and wait until its jail is gone.
    pub async fn end_session(
        &self,
        handle: &str,
    ) -> Result<(Entry<SessionInfo>, pycell_launch::session::SessionEnded), SessionFailure> {
        let entry = self.session(handle)?;
        let ended = entry.session.end().await;
        if let Ok(mut t) = self.sessions() {
            t.forget(handle, ended.clone());
        }
        Ok((entry, ended))
    }

    /// This process's live sessions.
    pub fn list_sessions(&self) -> Vec<(String, Entry<SessionInfo>)> {
        self.sessions()
            .map(|mut t| t.list(owner()))
            .unwrap_or_default()
    }

    /// End every session (the server is stopping), waiting at most `grace`.
    pub(super) async fn end_all_sessions(&self, grace: Duration) {
        let all = self.sessions().map(|t| t.all()).unwrap_or_default();
        let ends = all.iter().map(|s| s.end());
        let _ = tokio::time::timeout(grace, futures_join_all(ends)).await;
    }
}

/// Wait for every future (a handful: the open sessions).
async fn futures_join_all<F: std::future::Future>(futures: impl Iterator<Item = F>) {
    for f in futures {
        f.await;
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1)
}

fn request_failure(e: &RequestError) -> SessionFailure {
    SessionFailure::new(
        FailureCode::InvalidRequest,
        super::tools::request_error_message(e),
    )
}

/// What a cell's reply may hold, under `policy`.
pub fn cell_limits(policy: &Policy) -> CellLimits {
    CellLimits {
        image_edge: policy.session.image_edge,
        image_bytes: policy.session.image_bytes,
        ..CellLimits::default()
    }
}

/// A file's bytes for `write_file`: `text`, or `base64` decoded.
pub fn file_bytes(text: Option<String>, b64: Option<String>) -> Result<Vec<u8>, String> {
    match (text, b64) {
        (Some(t), None) => Ok(t.into_bytes()),
        (None, Some(b)) => base64::engine::general_purpose::STANDARD
            .decode(b.trim())
            .map_err(|e| format!("`content_base64` is not base64: {e}")),
        _ => Err("give exactly one of `content` (text) and `content_base64` (bytes)".into()),
    }
}
