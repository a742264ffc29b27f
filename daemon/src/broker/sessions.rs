//! Sessions in pycelld: the broker holds each session (its stream half and
//! request stream, driven by `pycell_launch::session`), the root monitor
//! its jailer (as for a run). A session belongs to the principal that
//! started it (a uid, or an identity a trusted front end speaks for): any
//! connection of that principal may name its handle, any other gets the
//! answer an unknown handle gets. It holds an admission slot (its
//! memory limit counts in the budget, as a run's does) until it ends,
//! however it ends; a session's jailer keeps its clocks, so a session ends
//! on time even if the broker does not ask.

use std::sync::Arc;
use std::time::Duration;

use pycell_launch::launcher::Collector;
use pycell_launch::launcher::JailerEnd;
use pycell_launch::session::{JailerControl, Session, SessionError, SessionParts};
use pycell_launch::session_fork;
use pycell_launch::session_table::{self, Entry, Lookup, SessionTable};
use pycell_launch::snapshots::{SnapshotStore, Stored};
use pycell_launch::supervisor::RunStream;
use pycell_policy::Policy;
use pycell_protocol::messages::{ErrorCode, RunRequest};
use pycell_protocol::result::RunLimits;
use pycell_protocol::session::{
    SessionCall, SessionEndInfo, SessionInfo, SessionStartRequest, SessionSummary, SnapshotInfo,
};
use pycell_runner::session::SessionOp;
use pycell_wire::codes::FailureCode;
use tokio::time::Instant as TokioInstant;

use super::link::MonitorLink;
use super::tool_relay::RelaySwitch;
use super::{Broker, SpawnedRun};
use crate::broker::admission::Slot;
use crate::broker::principal::Principal;
use crate::link::ToMonitor;

/// How long a session's python may take to get ready.
const READY_WITHIN: Duration = crate::monitor::SESSION_READY_WITHIN;

impl session_table::HeldPolicy for Held {
    fn policy(&self) -> &Policy {
        &self.policy
    }

    fn limits(&self) -> &RunLimits {
        &self.limits
    }

    fn start(&self) -> &SessionStartRequest {
        &self.start
    }
}

/// What the broker keeps of a session besides the session itself.
#[derive(Debug, Clone)]
pub(crate) struct Held {
    pub policy: Arc<Policy>,
    pub limits: RunLimits,
    /// Its admission slot: its memory counts until it ends.
    _slot: Arc<Slot>,
    /// Code mode: where its tool calls go (the connection of the call
    /// being served).
    tools: Option<Arc<RelaySwitch>>,
    /// What started it: what starts its forks.
    pub start: Arc<SessionStartRequest>,
}

pub(crate) type Sessions = std::sync::Mutex<SessionTable<Held, Principal>>;

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

/// `who`'s key in the snapshot store: of its paused sessions' when
/// resuming one.
fn store_key(who: &Principal, resume: Option<&str>) -> String {
    match resume {
        Some(_) => session_fork::paused_key(&who.store_key()),
        None => who.store_key(),
    }
}

/// A snapshot to load into a session once it has started.
pub(crate) type Restoring = (Stored, std::fs::File);

/// Why a session message gets no answer it asked for: the wire's error.
pub(crate) type Refused = (ErrorCode, String);

fn refused(code: FailureCode, message: impl Into<String>) -> Refused {
    (ErrorCode::for_failure(code), message.into())
}

/// The run request a session start is ordered as (no code).
pub(crate) fn start_request(r: &SessionStartRequest) -> RunRequest {
    RunRequest {
        policy: r.policy.clone(),
        limits: r.limits.clone(),
        dependencies: r.dependencies.clone(),
        tools: r.tools.clone(),
        ..RunRequest::default()
    }
}

impl Broker {
    pub(crate) fn sessions_held(&self, who: &Principal) -> usize {
        self.sessions.lock().map(|t| t.count(who)).unwrap_or(0)
    }

    /// The policy a session start names, with its `[session]` settings.
    pub(crate) fn session_policy(&self, name: &str) -> Result<Policy, Refused> {
        let policy = pycell_launch::resolve::load_policy_by_name(name, &self.config.policy_dir)
            .map_err(|e| crate::link::refusal(pycell_launch::launcher::LaunchError::from(e)))?;
        match policy.purpose_problem(false) {
            Some(m) => Err((ErrorCode::InvalidRequest, m)),
            None => Ok(policy),
        }
    }

    /// A session the monitor started for `who`: driven here, and in the
    /// table (holding its admission slot) until it ends.
    pub(super) async fn open_session(
        self: &Arc<Self>,
        who: Principal,
        spawned: SpawnedRun,
        (policy, start): (Policy, SessionStartRequest),
        slot: Slot,
        tools: Option<Arc<RelaySwitch>>,
        resume: Option<&str>,
    ) -> Result<SessionInfo, Refused> {
        let (limits, env) = (spawned.limits.clone(), spawned.env.clone());
        let parts = self.session_parts(spawned)?;
        let session = Session::start(parts, READY_WITHIN, self.session_stop.child_token())
            .await
            .map_err(|e| refused(e.code(), e.message))?;
        let policy = Arc::new(policy);
        let held = Held {
            policy: Arc::clone(&policy),
            limits: limits.clone(),
            _slot: Arc::new(slot),
            tools,
            start: Arc::new(start),
        };
        let admitted = self
            .sessions
            .lock()
            .ok()
            .and_then(|mut t| t.admit_as(resume, who.clone(), session.clone(), held));
        let Some(handle) = admitted else {
            session.end().await;
            let m = session_table::too_many(&who, &policy);
            return Err(refused(FailureCode::TooManySessions, m));
        };
        let (broker, h) = (Arc::clone(self), handle.clone());
        session_table::when_ended(session.clone(), move |ended| {
            if let Ok(mut t) = broker.sessions.lock() {
                t.forget(&h, ended);
            }
        });
        Ok(session_table::session_info(
            handle, &session, &policy, limits, env,
        ))
    }

    /// What a session's driver takes: the jailer's events and stdin (the
    /// request stream, and with egress the handout channel too), its
    /// services, and the monitor as its jailer's keeper.
    fn session_parts(&self, spawned: SpawnedRun) -> Result<SessionParts<MonitorJailer>, Refused> {
        let control = MonitorJailer {
            link: Arc::clone(&self.link),
            run_id: spawned.run_id.clone(),
        };
        let fail = |mut control: MonitorJailer, m: String| {
            control.stop();
            refused(FailureCode::Internal, m)
        };
        let Some(requests) = spawned.handouts else {
            return Err(fail(
                control,
                "the monitor sent no request stream for the session".into(),
            ));
        };
        let requests = std::os::unix::net::UnixStream::from(requests);
        let hands_out = spawned.services.egress.is_some() || spawned.services.tools.is_some();
        let handouts = match hands_out {
            true => match requests.try_clone() {
                Ok(h) => Some(std::os::fd::OwnedFd::from(h)),
                Err(e) => return Err(fail(control, e.to_string())),
            },
            false => None,
        };
        let collector = Collector::new(&spawned.run_id, &spawned.policy, None);
        Ok(SessionParts {
            run_id: spawned.run_id,
            policy: spawned.policy,
            sandbox_uid: spawned.sandbox_uid,
            stream: RunStream::start(spawned.events, collector, handouts, spawned.services),
            requests,
            control,
            ready: spawned.ready,
        })
    }

    pub(crate) fn session_of(
        &self,
        who: &Principal,
        handle: &str,
    ) -> Result<Entry<Held, Principal>, Refused> {
        let looked = match self.sessions.lock() {
            Ok(mut t) => t.get(who, handle),
            Err(_) => Err(Lookup::Unknown),
        };
        looked.map_err(|l| {
            let (code, message) = session_table::lookup_message(&l, handle);
            refused(code, message)
        })
    }

    /// The session `handle` of `who` and the request `call` asks of it.
    pub(crate) fn session_op(
        &self,
        who: &Principal,
        handle: &str,
        call: SessionCall,
        timeout_s: Option<f64>,
    ) -> Result<(Session, SessionOp, Option<Arc<RelaySwitch>>), Refused> {
        let entry = self.session_of(who, handle)?;
        let max_output = entry.info.limits.max_output;
        let op = session_table::op_for(&entry.info.policy, max_output, call, timeout_s)
            .map_err(|(code, message)| refused(code, message))?;
        Ok((entry.session, op, entry.info.tools))
    }

    /// The wire's error for a session call that got no answer.
    pub(crate) fn session_error(&self, handle: &str, e: SessionError) -> Refused {
        let (code, message) = match self.sessions.lock() {
            Ok(mut t) => t.call_failed(handle, e),
            Err(_) => (
                FailureCode::Internal,
                "the session table is poisoned".into(),
            ),
        };
        refused(code, message)
    }

    /// End session `handle` of `who`, once its jail is gone.
    pub(crate) async fn end_session(
        &self,
        who: &Principal,
        handle: &str,
    ) -> Result<SessionEndInfo, Refused> {
        if let Some(ended) = self.end_paused(who, handle) {
            return Ok(ended);
        }
        let entry = self.session_of(who, handle)?;
        let ended = entry.session.end().await;
        if let Ok(mut t) = self.sessions.lock() {
            t.forget(handle, ended.clone());
        }
        Ok(session_table::end_info(handle, &ended))
    }

    fn snapshot_store(&self) -> Result<&SnapshotStore, Refused> {
        self.snapshots.as_ref().map_err(|why| {
            let m = format!("this pycelld keeps no snapshots: {why}");
            refused(FailureCode::Internal, m)
        })
    }

    /// Keep session `handle`'s state in the snapshot store, under `who`.
    pub(crate) async fn snapshot_session(
        &self,
        who: &Principal,
        handle: &str,
    ) -> Result<SnapshotInfo, Refused> {
        let store = self.snapshot_store()?;
        let entry = self.session_of(who, handle)?;
        let held = (&*entry.info.policy, &entry.info.limits, &*entry.info.start);
        let key = who.store_key();
        session_fork::snapshot(&entry.session, handle, held, store, &key)
            .await
            .map_err(|(code, m)| refused(code, m))
    }

    /// The snapshot a session start names, if it names one (of `who`'s;
    /// of `who`'s paused sessions when `resume` names one), and the
    /// request that starts its session.
    pub(crate) fn snapshot_to_start(
        &self,
        who: &Principal,
        request: SessionStartRequest,
        resume: Option<&str>,
    ) -> Result<(SessionStartRequest, Option<Restoring>), Refused> {
        if request.from_snapshot.is_none() {
            return Ok((request, None));
        }
        let store = self.snapshot_store()?;
        let key = store_key(who, resume);
        let found = session_fork::snapshot_to_start(store, &key, &request)
            .map_err(|(code, m)| refused(code, m))?;
        let Some((kept, bundle)) = found else {
            return Ok((request, None));
        };
        let start = SessionStartRequest {
            tools: request.tools.or_else(|| kept.start.tools.clone()),
            ..kept.start.clone()
        };
        Ok((start, Some((kept, bundle))))
    }

    /// Load a snapshot into the session just started from it (`info`);
    /// the session is ended if it cannot be.
    pub(crate) async fn restore_into(
        &self,
        who: &Principal,
        mut info: SessionInfo,
        snapshot: Restoring,
        resume: Option<&str>,
    ) -> Result<SessionInfo, Refused> {
        let entry = match resume {
            // Calls wait for a session being resumed: only this finds it.
            Some(h) => self.sessions.lock().ok().and_then(|t| t.resuming(h)),
            None => self.session_of(who, &info.session).ok(),
        };
        let Some(entry) = entry else {
            let m = format!("session {} ended as it started", info.session);
            return Err(refused(FailureCode::SessionGone, m));
        };
        let held = &entry.info;
        let id = snapshot.0.info.snapshot.clone();
        let restored =
            session_fork::restore(&entry.session, snapshot, &held.policy, &held.limits).await;
        if let (Some(h), Ok(mut t)) = (resume, self.sessions.lock()) {
            t.resumed(h);
        }
        if let (Some(_), Ok(store)) = (resume, &self.snapshots) {
            store.remove(&store_key(who, resume), &id);
        }
        info.restored = Some(restored.map_err(|(code, m)| refused(code, m))?);
        Ok(info)
    }

    /// Where session `handle` of `who` stands: live (Ok), paused, being
    /// paused, or gone.
    pub(crate) fn lookup(&self, who: &Principal, handle: &str) -> Result<(), Lookup> {
        match self.sessions.lock() {
            Ok(mut t) => t.get(who, handle).map(|_| ()),
            Err(_) => Err(Lookup::Unknown),
        }
    }

    /// Whether paused session `handle`'s snapshot is still kept; if not,
    /// the session is forgotten.
    pub(crate) fn paused_state_kept(&self, who: &Principal, handle: &str, snapshot: &str) -> bool {
        let key = store_key(who, Some(handle));
        let kept = self
            .snapshots
            .as_ref()
            .is_ok_and(|s| s.get(&key, snapshot).is_ok());
        if !kept {
            let _ = self.end_paused(who, handle);
        }
        kept
    }

    /// A call to session `handle` is done: its idle time counts from now.
    pub(crate) fn touch_session(&self, handle: &str) {
        if let Ok(mut t) = self.sessions.lock() {
            t.touch(handle);
        }
    }

    /// End paused session `handle` of `who`, if it is one.
    pub(crate) fn end_paused(&self, who: &Principal, handle: &str) -> Option<SessionEndInfo> {
        let snapshot = self.sessions.lock().ok()?.forget_paused(who, handle)?;
        if let Ok(store) = &self.snapshots {
            store.remove(&store_key(who, Some(handle)), &snapshot);
        }
        Some(session_table::paused_end_info(handle))
    }

    /// Pause idle sessions whose policy says so, every second, for as
    /// long as the broker lives.
    pub(crate) fn keep_pausing(self: &Arc<Self>) {
        let broker = Arc::clone(self);
        tokio::spawn(async move {
            let Ok(store) = broker.snapshots.clone() else {
                return;
            };
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            loop {
                tokio::select! {
                    _ = tick.tick() => {}
                    _ = broker.session_stop.cancelled() => return,
                }
                session_fork::pause_idle(&broker.sessions, &store, Principal::store_key).await;
            }
        });
    }

    pub(crate) fn list_sessions(&self, who: &Principal) -> Vec<SessionSummary> {
        self.sessions
            .lock()
            .map(|mut t| t.summaries(who))
            .unwrap_or_default()
    }

    /// End every session (pycelld stops), waiting at most `grace`.
    pub(crate) async fn end_all_sessions(&self, grace: Duration) {
        self.session_stop.cancel();
        let all = self.sessions.lock().map(|t| t.all()).unwrap_or_default();
        session_table::end_every(all, grace).await;
    }
}
