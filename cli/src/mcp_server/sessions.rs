//! Where `pycell mcp`'s sessions live. With a pycelld socket, pycelld holds
//! them (they outlive this process; each call is a request over the
//! socket). Without one (embedded mode, as root), this process does: jails
//! whose python stays alive between calls (`pycell_launch::session`), in a
//! table by handle for as long as this process lives, at most the policy's
//! `[session] per_uid` of them at once. Both answer in the protocol's
//! terms (`pycell_protocol::session`), so the tools do not know which.

use std::sync::Arc;
use std::time::Duration;

use pycell_deps::build::Ensured;
use pycell_launch::launcher::{JailerStderr, LaunchError, PolicyChoice, Prepared};
use pycell_launch::resolve::Extras;
use pycell_launch::session::{Session, SessionParts, SessionTiming};
use pycell_launch::session_table::{self, Entry, Lookup};
use pycell_launch::supervisor::Services;
use pycell_launch::tool_grant::ToolGrant;
use pycell_policy::Policy;
use pycell_protocol::client::{ClientError, DaemonClient, Endpoint};
use pycell_protocol::messages::RunRequest;
use pycell_protocol::result::LimitsReport;
use pycell_protocol::session::{
    SessionAnswer, SessionCall, SessionEndInfo, SessionInfo, SessionStartRequest, SessionSummary,
};
use pycell_wire::codes::FailureCode;
use pycell_wire::report::JailFailure;
use tokio_util::sync::CancellationToken;

use super::sandboxes::{RequestError, Sandboxes, SessionHeld};
use crate::tool_servers::DaemonToolCalls;
use pycell_engine::local::Installer;

/// How long a session's python may take to import its policy's modules
/// and get ready.
const READY_WITHIN: Duration = Duration::from_secs(60);

impl session_table::HeldPolicy for SessionHeld {
    fn policy(&self) -> &Policy {
        &self.policy
    }
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

    fn refused(f: &JailFailure) -> SessionFailure {
        let mut message = f.message.clone();
        if let Some(h) = &f.hint {
            message.push_str(&format!(" ({h})"));
        }
        SessionFailure::new(f.code, message)
    }

    fn from_client(e: ClientError) -> SessionFailure {
        match e {
            ClientError::Refused { code, message } => SessionFailure::new(code.into(), message),
            ClientError::Failed(f) => SessionFailure::refused(&f),
            e @ ClientError::Connect { .. } => {
                SessionFailure::new(FailureCode::DaemonUnavailable, e.to_string())
            }
            e => SessionFailure::new(FailureCode::DaemonFailed, e.to_string()),
        }
    }
}

/// The uid that owns embedded sessions: this process's.
fn owner() -> u32 {
    nix::unistd::getuid().as_raw()
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

impl Sandboxes {
    /// Start a session for `req` (its policy, dependencies and limits).
    pub async fn start_session(
        &self,
        mut req: SessionStartRequest,
    ) -> Result<SessionInfo, SessionFailure> {
        if let Some(servers) = self.tool_servers() {
            req.tools = Some(servers.catalog().await);
        }
        if let Some(nodes) = self.cluster() {
            return self.start_in_cluster(nodes, req).await;
        }
        if let Some(endpoint) = self.daemon() {
            return via_daemon(endpoint, move |c| c.session_start(req, |_| {})).await;
        }
        let run_req = RunRequest {
            policy: req.policy,
            limits: req.limits,
            dependencies: req.dependencies,
            tools: req.tools,
            ..RunRequest::default()
        };
        let (prepared, policy, ensured, grant) = self.prepare_session(run_req).await?;
        let per_uid = policy.session.per_uid as usize;
        if self.sessions().map(|t| t.count(&owner())).unwrap_or(0) >= per_uid {
            return Err(too_many(&policy));
        }
        let session = self.launch_session(prepared, &policy, grant).await?;
        self.admit(session, policy, ensured).await
    }

    async fn launch_session(
        &self,
        prepared: Prepared,
        policy: &Policy,
        grant: Option<ToolGrant>,
    ) -> Result<(Session, LimitsReport), SessionFailure> {
        let limits = prepared.limits.clone();
        let egress = prepared.egress.clone();
        let launched = prepared
            .spawn_async(JailerStderr::Capture)
            .await
            .map_err(|r| {
                SessionFailure::new(
                    r.error.as_ref().map_or(FailureCode::Internal, |e| e.code),
                    r.error.map(|e| e.message).unwrap_or_default(),
                )
            })?;
        let services = Services {
            egress: egress.map(|rules| {
                (
                    pycell_egress::EgressConfig::from_env(&policy.name, rules),
                    None,
                )
            }),
            tools: grant
                .zip(self.tool_servers().cloned())
                .map(|(grant, servers)| {
                    let upstream: Arc<dyn pycell_tools::service::Upstream> = Arc::new(servers);
                    grant.service(upstream, None)
                }),
            stdio: None,
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
            .map_err(|e| SessionFailure::new(e.code(), e.message))?;
        Ok((session, limits))
    }

    /// Into the table (counted again as it goes in: another start may
    /// have finished meanwhile), out of it once it ends.
    async fn admit(
        &self,
        (session, limits): (Session, LimitsReport),
        policy: Policy,
        ensured: Option<Ensured>,
    ) -> Result<SessionInfo, SessionFailure> {
        let policy = Arc::new(policy);
        let env = ensured.as_ref().map(|e| e.report.clone());
        let held = SessionHeld {
            policy: Arc::clone(&policy),
            limits: limits.clone(),
            _env: ensured.map(Arc::new),
        };
        let admitted = self
            .sessions()
            .ok()
            .and_then(|mut t| t.admit(owner(), session.clone(), held));
        let Some(handle) = admitted else {
            session.end().await;
            return Err(too_many(&policy));
        };
        let (sandboxes, h) = (self.clone(), handle.clone());
        session_table::when_ended(session.clone(), move |ended| {
            if let Ok(mut t) = sandboxes.sessions() {
                t.forget(&h, ended);
            }
        });
        Ok(session_table::session_info(
            handle, &session, &policy, limits, env,
        ))
    }

    /// Policy, env and spec for a session: blocking work, on a thread of
    /// its own (an install waits for the install jail).
    async fn prepare_session(
        &self,
        req: RunRequest,
    ) -> Result<(Prepared, Policy, Option<Ensured>, Option<ToolGrant>), SessionFailure> {
        let launcher = self
            .launcher()
            .map_err(|f| SessionFailure::refused(&f))?
            .clone();
        let stop = tokio::sync::watch::channel(None).1;
        let prepared = tokio::task::spawn_blocking(move || {
            let policy = launcher.load_policy(PolicyChoice::Name(req.policy_name()))?;
            if policy.session.per_uid == 0 {
                return Ok(Err(SessionFailure::new(
                    FailureCode::SessionsUnavailable,
                    format!(
                        "policy {:?} has no sessions ([session] per_uid = 0)",
                        policy.name
                    ),
                )));
            }
            let mut installer = Installer {
                handle: tokio::runtime::Handle::current(),
                stop,
            };
            let ensured = pycell_engine::local::env_for(
                &launcher,
                &policy,
                &req,
                &mut installer,
                &mut |_| {},
            )
            .map_err(LaunchError::Refused)?;
            let extras = Extras {
                env: ensured.as_ref().map(|e| e.env.dir.clone()),
                ..Extras::default()
            };
            let grant = ToolGrant::for_request(&policy, req.tools.as_ref())?;
            let prepared = launcher.prepare_session(&policy, &req, &extras)?;
            Ok::<_, LaunchError>(Ok((prepared, policy, ensured, grant)))
        })
        .await;
        match prepared {
            Ok(Ok(p)) => p,
            Ok(Err(LaunchError::Request(e))) => Err(request_failure(&e)),
            Ok(Err(LaunchError::Refused(f))) => Err(SessionFailure::refused(&f)),
            Err(e) => Err(SessionFailure::new(
                FailureCode::Internal,
                format!("preparing the session: {e}"),
            )),
        }
    }

    /// The live embedded session `handle` of this process.
    fn session(&self, handle: &str) -> Result<Entry<SessionHeld>, SessionFailure> {
        let looked = match self.sessions() {
            Ok(mut t) => t.get(&owner(), handle),
            Err(_) => Err(Lookup::Unknown),
        };
        looked.map_err(|l| gone(&l, handle))
    }

    /// `call` in session `handle`, with the policy's clocks (the wall
    /// timeout `timeout_s`, if given). A cancelled call is interrupted
    /// (KeyboardInterrupt in a cell); its answer still comes.
    pub async fn session_call(
        &self,
        handle: &str,
        call: SessionCall,
        timeout_s: Option<f64>,
        cancel: CancellationToken,
    ) -> Result<SessionAnswer, SessionFailure> {
        if let Some(nodes) = self.cluster() {
            return self
                .call_in_cluster(nodes, handle, call, timeout_s, cancel)
                .await;
        }
        if let Some(endpoint) = self.daemon() {
            return self
                .daemon_call(endpoint, handle, call, timeout_s, cancel)
                .await;
        }
        let entry = self.session(handle)?;
        let op = session_table::op_for(
            &entry.info.policy,
            entry.info.limits.max_output_bytes,
            call,
            timeout_s,
        )
        .map_err(|(code, m)| SessionFailure::new(code, m))?;
        let session = entry.session;
        let asked = session.request(op);
        tokio::pin!(asked);
        let answered = tokio::select! {
            a = &mut asked => a,
            _ = cancel.cancelled() => {
                session.interrupt();
                asked.await
            }
        };
        answered.map_err(|e| {
            let (code, message) = match self.sessions() {
                Ok(mut t) => t.call_failed(handle, e),
                Err(_) => (
                    FailureCode::Internal,
                    "the session table is poisoned".into(),
                ),
            };
            SessionFailure::new(code, message)
        })
    }

    pub(super) async fn daemon_call(
        &self,
        endpoint: Endpoint,
        handle: &str,
        call: SessionCall,
        timeout_s: Option<f64>,
        cancel: CancellationToken,
    ) -> Result<SessionAnswer, SessionFailure> {
        let handle = handle.to_string();
        let (tx, rx) = tokio::sync::oneshot::channel();
        let calls = self
            .tool_servers()
            .cloned()
            .map(|servers| DaemonToolCalls::new(servers, tokio::runtime::Handle::current()));
        let asked = via_daemon(endpoint, move |c| {
            let _ = tx.send(c.canceller());
            if let Some(calls) = &calls {
                calls.connected(c);
            }
            c.session_call_offering(&handle, call, timeout_s, |stage| {
                DaemonToolCalls::take(calls.as_ref(), stage);
            })
        });
        tokio::pin!(asked);
        tokio::select! {
            a = &mut asked => a,
            _ = cancel.cancelled() => {
                if let Ok(Ok(mut canceller)) = rx.await {
                    let _ = canceller.cancel();
                }
                asked.await
            }
        }
    }

    /// End session `handle` and wait until its jail is gone.
    pub async fn end_session(&self, handle: &str) -> Result<SessionEndInfo, SessionFailure> {
        if let Some(nodes) = self.cluster() {
            return self.end_in_cluster(nodes, handle).await;
        }
        if let Some(endpoint) = self.daemon() {
            let h = handle.to_string();
            return via_daemon(endpoint, move |c| c.session_end(&h)).await;
        }
        let entry = self.session(handle)?;
        let ended = entry.session.end().await;
        if let Ok(mut t) = self.sessions() {
            t.forget(handle, ended.clone());
        }
        Ok(session_table::end_info(handle, &ended))
    }

    /// The open sessions (this process's, or this uid's in pycelld).
    pub async fn list_sessions(&self) -> Result<Vec<SessionSummary>, SessionFailure> {
        if let Some(nodes) = self.cluster() {
            return self.list_in_cluster(nodes).await;
        }
        if let Some(endpoint) = self.daemon() {
            return via_daemon(endpoint, |c| c.session_list()).await;
        }
        Ok(self
            .sessions()
            .map(|mut t| t.summaries(&owner()))
            .unwrap_or_default())
    }

    /// End every embedded session (the server is stopping), waiting at
    /// most `grace`. Sessions in pycelld outlive this process.
    pub(super) async fn end_all_sessions(&self, grace: Duration) {
        let all = self.sessions().map(|t| t.all()).unwrap_or_default();
        session_table::end_every(all, grace).await;
    }
}

fn too_many(policy: &Policy) -> SessionFailure {
    SessionFailure::new(
        FailureCode::TooManySessions,
        format!(
            "the most sessions policy {:?} allows ([session] per_uid = {}) are open; end one with session_end (session_list shows them)",
            policy.name, policy.session.per_uid
        ),
    )
}

fn gone(l: &Lookup, handle: &str) -> SessionFailure {
    let (code, message) = session_table::lookup_message(l, handle);
    SessionFailure::new(code, message)
}

fn request_failure(e: &RequestError) -> SessionFailure {
    SessionFailure::new(
        FailureCode::InvalidRequest,
        super::tools::request_error_message(e),
    )
}
