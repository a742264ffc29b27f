//! Sessions in pycelld: the broker holds each session (its stream half and
//! request stream, driven by `pycell_launch::session`), the root monitor
//! its jailer (as for a run). A session belongs to the uid that started
//! it: any connection of that uid may name its handle, any other uid gets
//! the answer an unknown handle gets. It holds an admission slot (its
//! memory limit counts in the budget, as a run's does) until it ends,
//! however it ends; a session's jailer keeps its clocks, so a session ends
//! on time even if the broker does not ask.

use std::sync::Arc;
use std::time::{Duration, Instant};

use pycell_launch::launcher::Collector;
use pycell_launch::launcher::JailerEnd;
use pycell_launch::session::{JailerControl, Session, SessionError, SessionParts};
use pycell_launch::session_table::{self, Entry, Lookup, SessionTable};
use pycell_launch::supervisor::RunStream;
use pycell_policy::Policy;
use pycell_protocol::messages::{ErrorCode, RunRequest};
use pycell_protocol::result::{EnvReport, LimitsReport};
use pycell_protocol::session::{
    SessionCall, SessionEndInfo, SessionInfo, SessionStartRequest, SessionSummary,
};
use pycell_runner::session::SessionOp;
use pycell_wire::codes::FailureCode;
use tokio::time::Instant as TokioInstant;

use super::link::MonitorLink;
use super::Broker;
use crate::admission::Slot;
use crate::link::ToMonitor;

/// How long a session's python may take to get ready.
const READY_WITHIN: Duration = crate::monitor::SESSION_READY_WITHIN;

impl session_table::HeldPolicy for Held {
    fn policy(&self) -> &Policy {
        &self.policy
    }
}

/// What the broker keeps of a session besides the session itself.
#[derive(Debug, Clone)]
pub(crate) struct Held {
    pub policy: Arc<Policy>,
    pub limits: LimitsReport,
    /// Its admission slot: its memory counts until it ends.
    _slot: Arc<Slot>,
}

pub(crate) type Sessions = std::sync::Mutex<SessionTable<Held>>;

/// A session's jailer, which the monitor holds: the broker asks it.
#[derive(Debug)]
pub(crate) struct MonitorJailer {
    link: Arc<MonitorLink>,
    run_id: String,
}

impl JailerControl for MonitorJailer {
    fn stop(&mut self) {
        let _ = self.link.send(&ToMonitor::Kill {
            run_id: self.run_id.clone(),
        });
    }

    fn interrupt(&mut self) {
        let _ = self.link.send(&ToMonitor::Interrupt {
            run_id: self.run_id.clone(),
        });
    }

    fn next_due(&self) -> Option<TokioInstant> {
        None
    }

    fn escalate(&mut self) {}

    async fn finish(self) -> JailerEnd {
        JailerEnd::Elsewhere
    }
}

/// Why a session message gets no answer it asked for: the wire's error.
pub(crate) type Refused = (ErrorCode, String);

fn refused(code: FailureCode, message: impl Into<String>) -> Refused {
    let code = match code {
        FailureCode::UnknownSession => ErrorCode::UnknownSession,
        FailureCode::SessionGone => ErrorCode::SessionGone,
        FailureCode::SessionKilled => ErrorCode::SessionKilled,
        FailureCode::SessionBusy => ErrorCode::SessionBusy,
        FailureCode::TooManySessions => ErrorCode::TooManySessions,
        FailureCode::SessionsUnavailable => ErrorCode::SessionsUnavailable,
        FailureCode::FileRefused => ErrorCode::FileRefused,
        FailureCode::InvalidRequest | FailureCode::InvalidPolicy => ErrorCode::InvalidRequest,
        FailureCode::Busy | FailureCode::UidUnavailable => ErrorCode::Busy,
        FailureCode::ShuttingDown => ErrorCode::ShuttingDown,
        _ => ErrorCode::Internal,
    };
    (code, message.into())
}

/// The run request a session start is ordered as (no code).
pub(crate) fn start_request(r: &SessionStartRequest) -> RunRequest {
    RunRequest {
        policy: r.policy.clone(),
        limits: r.limits.clone(),
        dependencies: r.dependencies.clone(),
        ..RunRequest::default()
    }
}

impl Broker {
    pub(crate) fn sessions_held(&self, uid: u32) -> usize {
        self.sessions.lock().map(|t| t.count(uid)).unwrap_or(0)
    }

    /// The policy a session start names, with its `[session]` settings.
    pub(crate) fn session_policy(&self, name: &str) -> Result<Policy, Refused> {
        pycell_launch::resolve::load_policy_by_name(name, &self.config.policy_dir).map_err(|e| {
            let (code, message) =
                crate::link::refusal(pycell_launch::launcher::LaunchError::from(e));
            (code, message)
        })
    }

    /// A session started by the monitor for `uid`: driven here until it
    /// ends, in the table until then.
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn open_session(
        self: &Arc<Self>,
        uid: u32,
        run_id: String,
        sandbox_uid: u32,
        policy: Policy,
        limits: LimitsReport,
        env: Option<EnvReport>,
        stream_parts: (
            tokio::net::unix::pipe::Receiver,
            std::os::fd::OwnedFd,
            pycell_launch::supervisor::Services,
            bool,
        ),
        slot: Slot,
    ) -> Result<SessionInfo, Refused> {
        let (events, requests, services, ready) = stream_parts;
        let kill = || {
            let _ = self.link.send(&ToMonitor::Kill {
                run_id: run_id.clone(),
            });
        };
        let requests = std::os::unix::net::UnixStream::from(requests);
        let handouts = match services.egress.is_some() {
            true => match requests.try_clone() {
                Ok(h) => Some(std::os::fd::OwnedFd::from(h)),
                Err(e) => {
                    kill();
                    return Err(refused(FailureCode::Internal, e.to_string()));
                }
            },
            false => None,
        };
        let collector = Collector::new(&run_id, &policy.name, None);
        let parts = SessionParts {
            run_id: run_id.clone(),
            policy: policy.name.clone(),
            sandbox_uid,
            stream: RunStream::start(events, collector, handouts, services),
            requests,
            control: MonitorJailer {
                link: Arc::clone(&self.link),
                run_id: run_id.clone(),
            },
            ready,
        };
        let stop = self.session_stop.child_token();
        let session = Session::start(parts, READY_WITHIN, stop)
            .await
            .map_err(|e| {
                refused(
                    e.result
                        .error
                        .as_ref()
                        .map_or(FailureCode::JailSetupFailed, |f| f.code),
                    e.message,
                )
            })?;
        let made = self.sessions.lock().ok().and_then(|t| t.new_handle().ok());
        let handle = match made {
            Some(h) => h,
            None => {
                session.end().await;
                return Err(refused(
                    FailureCode::Internal,
                    "no session handle could be made",
                ));
            }
        };
        let now = Instant::now();
        let policy = Arc::new(policy);
        let info = SessionInfo {
            session: handle.clone(),
            run_id: run_id.clone(),
            policy: policy.name.clone(),
            sandbox_uid,
            limits: limits.clone(),
            idle_timeout_s: policy.session.idle_timeout.as_secs_f64(),
            lifetime_s: policy.session.lifetime.as_secs_f64(),
            max_file_bytes: policy.session.max_file,
            env: env.clone(),
        };
        let entry = Entry {
            session: session.clone(),
            owner: uid,
            started: now,
            last_used: now,
            info: Held {
                policy,
                limits,
                _slot: Arc::new(slot),
            },
        };
        if let Ok(mut t) = self.sessions.lock() {
            t.insert(handle.clone(), entry);
        }
        // Out of the table (and its slot freed) as soon as it ends,
        // whoever asks.
        let broker = Arc::clone(self);
        tokio::spawn(async move {
            let ended = session.wait_ended().await;
            if let Ok(mut t) = broker.sessions.lock() {
                t.forget(&handle, ended);
            }
        });
        Ok(info)
    }

    fn session_of(&self, uid: u32, handle: &str) -> Result<Entry<Held>, Refused> {
        let looked = match self.sessions.lock() {
            Ok(mut t) => t.get(uid, handle),
            Err(_) => Err(Lookup::Unknown),
        };
        looked.map_err(|l| {
            let (code, message) = session_table::lookup_message(&l, handle);
            refused(code, message)
        })
    }

    /// The session `handle` of `uid` and the request `call` asks of it.
    pub(crate) fn session_op(
        &self,
        uid: u32,
        handle: &str,
        call: SessionCall,
        timeout_s: Option<f64>,
    ) -> Result<(Session, SessionOp), Refused> {
        let entry = self.session_of(uid, handle)?;
        let max_output = entry.info.limits.max_output_bytes;
        let op = session_table::op_for(&entry.info.policy, max_output, call, timeout_s)
            .map_err(|(code, message)| refused(code, message))?;
        Ok((entry.session, op))
    }

    /// The wire's error for a session call that got no answer.
    pub(crate) fn session_error(&self, handle: &str, e: SessionError) -> Refused {
        match e {
            SessionError::Busy => refused(
                FailureCode::SessionBusy,
                format!(
                    "session {handle} already has {} calls waiting; wait for them to finish",
                    pycell_launch::session::MAX_QUEUED
                ),
            ),
            SessionError::Ended(ended) => {
                if let Ok(mut t) = self.sessions.lock() {
                    t.forget(handle, ended.clone());
                }
                let (code, message) = session_table::lookup_message(&Lookup::Gone(ended), handle);
                refused(code, message)
            }
        }
    }

    /// End session `handle` of `uid`, once its jail is gone.
    pub(crate) async fn end_session(
        &self,
        uid: u32,
        handle: &str,
    ) -> Result<SessionEndInfo, Refused> {
        let entry = self.session_of(uid, handle)?;
        let ended = entry.session.end().await;
        if let Ok(mut t) = self.sessions.lock() {
            t.forget(handle, ended.clone());
        }
        Ok(session_table::end_info(handle, &ended))
    }

    pub(crate) fn list_sessions(&self, uid: u32) -> Vec<SessionSummary> {
        self.sessions
            .lock()
            .map(|mut t| t.summaries(uid))
            .unwrap_or_default()
    }

    /// End every session (pycelld stops), waiting at most `grace`.
    pub(crate) async fn end_all_sessions(&self, grace: Duration) {
        self.session_stop.cancel();
        let all = self.sessions.lock().map(|t| t.all()).unwrap_or_default();
        session_table::end_every(all, grace).await;
    }
}
