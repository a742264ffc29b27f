//! The sessions a server holds, by handle: who owns each, how many each
//! owner has, and why recently ended ones ended (so that a call with the
//! handle of a session that was killed says so, rather than "unknown").
//!
//! A handle is `s-` and 32 hex digits: 128 bits from the kernel's random
//! source, unguessable. A handle its caller does not own gets the very
//! answer an unknown handle gets, so that handles cannot be probed across
//! owners.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use pycell_protocol::bounds;
use pycell_protocol::result::{EnvReport, RunLimits};
use pycell_protocol::session::{SessionCall, SessionEndInfo, SessionInfo, SessionSummary};
use pycell_runner::session::{CellLimits, SessionOp, SessionRequest, MAX_REQUEST_FRAME};

use pycell_wire::codes::FailureCode;

use crate::session::{EndReason, Session, SessionEnded, SessionError};

/// Ended sessions remembered, for their handles' next calls.
const REMEMBERED_ENDS: usize = 1024;

/// Bytes of a handle that name the server instance that made it.
const INSTANCE_BYTES: usize = 4;

fn random<const N: usize>() -> std::io::Result<[u8; N]> {
    let mut bytes = [0u8; N];
    getrandom::fill(&mut bytes).map_err(|e| std::io::Error::other(e.to_string()))?;
    Ok(bytes)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A handle of server instance `instance`: `s-`, the instance in 8 hex
/// digits, then 128 random bits in 32. The instance part is not secret;
/// it tells a handle of a server that has since restarted (whose sessions
/// ended with it) from one that never was.
fn handle_from(instance: &str, bytes: [u8; 16]) -> String {
    format!("s-{instance}{}", hex(&bytes))
}

/// Whether `s` has a handle's shape (checked before any lookup).
pub fn is_handle(s: &str) -> bool {
    s.len() == 2 + 2 * (INSTANCE_BYTES + 16)
        && s.starts_with("s-")
        && s[2..]
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// One live session and what the server keeps about it.
#[derive(Debug, Clone)]
pub struct Entry<T, O = u32> {
    pub session: Session,
    /// Who may name its handle: a uid, or whatever the server calls a caller.
    pub owner: O,
    pub started: Instant,
    pub last_used: Instant,
    /// The caller's own record (policy, limits, env).
    pub info: T,
}

/// Why a handle names no live session of the caller's.
#[derive(Debug, Clone)]
pub enum Lookup {
    /// Never a session of this caller's (or not a handle at all).
    Unknown,
    /// It was, and it ended.
    Gone(SessionEnded),
    /// It was a handle of an earlier instance of this server, which ended
    /// its sessions when it stopped.
    Restarted,
    /// It is paused (idle, its policy's `pause_when_idle`): the snapshot
    /// its next call resumes it from.
    Paused(String),
    /// It is being paused now: its next call waits until it is.
    Pausing,
}

/// A session paused to a snapshot: whose it is, and the snapshot's id.
#[derive(Debug, Clone)]
pub struct Paused<O> {
    pub owner: O,
    pub snapshot: String,
    /// When its session first started: its lifetime counts from then,
    /// across pauses.
    pub started: Instant,
    pub paused_at: Instant,
    pub lifetime: Duration,
    pub policy: String,
}

/// The table.
#[derive(Debug)]
pub struct SessionTable<T, O = u32> {
    /// This server instance, in hex (see [`handle_from`]).
    instance: String,
    live: HashMap<String, Entry<T, O>>,
    ended: HashMap<String, (O, SessionEnded)>,
    ended_order: VecDeque<String>,
    /// Live sessions being paused: no call gets them meanwhile.
    pausing: std::collections::HashSet<String>,
    /// Live sessions whose pause failed: not tried again (their jailer
    /// ends them past the idle timeout).
    unpausable: std::collections::HashSet<String>,
    paused: HashMap<String, Paused<O>>,
}

impl<T, O> Default for SessionTable<T, O> {
    fn default() -> Self {
        // Without randomness, handles cannot be made anyway.
        let instance = random::<INSTANCE_BYTES>()
            .map(|b| hex(&b))
            .unwrap_or_default();
        SessionTable {
            instance,
            live: HashMap::new(),
            ended: HashMap::new(),
            ended_order: VecDeque::new(),
            pausing: Default::default(),
            unpausable: Default::default(),
            paused: HashMap::new(),
        }
    }
}

impl<T: Clone, O: Clone + Eq> SessionTable<T, O> {
    /// A new, unguessable handle of this server instance.
    pub fn new_handle(&self) -> std::io::Result<String> {
        if self.instance.is_empty() {
            return Err(std::io::Error::other(
                "no randomness for this server's instance",
            ));
        }
        Ok(handle_from(&self.instance, random::<16>()?))
    }

    /// Whether `handle` is of an earlier instance of this server (which
    /// ended its sessions when it stopped).
    fn of_an_earlier_instance(&self, handle: &str) -> bool {
        is_handle(handle) && !handle[2..].starts_with(&self.instance)
    }

    /// Live sessions of `owner` (ended ones not yet forgotten do not count).
    pub fn count(&self, owner: &O) -> usize {
        self.live
            .values()
            .filter(|e| &e.owner == owner && e.session.ended().is_none())
            .count()
    }

    pub fn insert(&mut self, handle: String, entry: Entry<T, O>) {
        self.live.insert(handle, entry);
    }

    /// The live session `handle` of `owner`, marked used; a session found
    /// ended is moved to the ended ones.
    pub fn get(&mut self, owner: &O, handle: &str) -> Result<Entry<T, O>, Lookup> {
        if let Some(p) = self.paused.get(handle).filter(|p| &p.owner == owner) {
            return Err(Lookup::Paused(p.snapshot.clone()));
        }
        let pausing = self.pausing.contains(handle);
        if let Some(e) = self.live.get_mut(handle).filter(|e| &e.owner == owner) {
            if pausing {
                return Err(Lookup::Pausing);
            }
            if let Some(ended) = e.session.ended() {
                self.forget(handle, ended.clone());
                return Err(Lookup::Gone(ended));
            }
            e.last_used = Instant::now();
            return Ok(e.clone());
        }
        match self.ended.get(handle) {
            Some((o, ended)) if o == owner => Err(Lookup::Gone(ended.clone())),
            _ if self.of_an_earlier_instance(handle) => Err(Lookup::Restarted),
            _ => Err(Lookup::Unknown),
        }
    }

    /// `handle`'s session is over: remember why.
    pub fn forget(&mut self, handle: &str, ended: SessionEnded) {
        // Only a session that is over: a handle resumed since names a
        // new one, which its predecessor's end must not take away.
        if self
            .live
            .get(handle)
            .is_some_and(|e| e.session.ended().is_none())
        {
            return;
        }
        self.unpausable.remove(handle);
        self.pausing.remove(handle);
        let Some(e) = self.live.remove(handle) else {
            return;
        };
        self.remember_end(handle, e.owner, ended);
    }

    fn remember_end(&mut self, handle: &str, owner: O, ended: SessionEnded) {
        if self.ended_order.len() >= REMEMBERED_ENDS {
            if let Some(old) = self.ended_order.pop_front() {
                self.ended.remove(&old);
            }
        }
        self.ended.insert(handle.to_string(), (owner, ended));
        self.ended_order.push_back(handle.to_string());
    }

    /// The live entry `handle`, whoever owns it and whatever it is doing
    /// (for the server that is resuming it).
    pub fn resuming(&self, handle: &str) -> Option<Entry<T, O>> {
        self.live.get(handle).cloned()
    }

    /// Session `handle` is resumed (its state loaded): calls get it.
    pub fn resumed(&mut self, handle: &str) {
        self.pausing.remove(handle);
    }

    /// A call to `handle` is done: its idle time counts from now.
    pub fn touch(&mut self, handle: &str) {
        if let Some(e) = self.live.get_mut(handle) {
            e.last_used = Instant::now();
        }
    }

    /// The refusal of a call to `handle` that got no answer. A session
    /// that ended is forgotten (its next call says why); after any other
    /// failure it lives on, still in the table and still admitted.
    pub fn call_failed(&mut self, handle: &str, e: SessionError) -> (FailureCode, String) {
        match e {
            SessionError::Busy => (
                FailureCode::SessionBusy,
                format!(
                    "session {handle} already has {} calls waiting; wait for them to finish",
                    crate::session::MAX_QUEUED
                ),
            ),
            SessionError::Refused(code, message) => (code, message),
            SessionError::Ended(ended) => {
                self.forget(handle, ended.clone());
                lookup_message(&Lookup::Gone(ended), handle)
            }
        }
    }

    /// Live sessions of `owner` (ended ones found on the way are moved).
    pub fn list(&mut self, owner: &O) -> Vec<(String, Entry<T, O>)> {
        let over: Vec<(String, SessionEnded)> = self
            .live
            .iter()
            .filter_map(|(h, e)| e.session.ended().map(|x| (h.clone(), x)))
            .collect();
        for (h, x) in over {
            self.forget(&h, x);
        }
        let mut out: Vec<_> = self
            .live
            .iter()
            .filter(|(_, e)| &e.owner == owner)
            .map(|(h, e)| (h.clone(), e.clone()))
            .collect();
        out.sort_by_key(|(_, e)| e.started);
        out
    }

    /// Every live session (to end them all).
    pub fn all(&self) -> Vec<Session> {
        self.live.values().map(|e| e.session.clone()).collect()
    }

    /// Session `handle`, being paused, is: its snapshot is `snapshot`.
    /// False if it ended meanwhile (the snapshot is then no one's).
    pub fn paused(
        &mut self,
        handle: &str,
        snapshot: String,
        policy: &pycell_policy::Policy,
    ) -> bool {
        self.pausing.remove(handle);
        let Some(e) = self.live.remove(handle) else {
            return false;
        };
        let paused = Paused {
            owner: e.owner,
            snapshot,
            started: e.started,
            paused_at: Instant::now(),
            lifetime: policy.session.lifetime,
            policy: policy.name.clone(),
        };
        self.paused.insert(handle.to_string(), paused);
        true
    }

    /// The snapshots of the paused sessions.
    pub fn paused_snapshots(&self) -> Vec<String> {
        self.paused.values().map(|p| p.snapshot.clone()).collect()
    }

    /// Session `handle` could not be paused: calls get it again, and it
    /// is not tried again.
    pub fn pause_failed(&mut self, handle: &str) {
        self.pausing.remove(handle);
        self.unpausable.insert(handle.to_string());
    }

    /// Forget paused session `handle` of `owner` (ended by its caller):
    /// its snapshot's id, if it was one.
    pub fn forget_paused(&mut self, owner: &O, handle: &str) -> Option<String> {
        match self.paused.get(handle) {
            Some(p) if &p.owner == owner => self.paused.remove(handle).map(|p| p.snapshot),
            _ => None,
        }
    }
}

/// What a server keeps of a session that says its policy.
pub trait HeldPolicy {
    fn policy(&self) -> &pycell_policy::Policy;
    /// The session's limits, as it started.
    fn limits(&self) -> &RunLimits;
    /// What started it (what starts it again from a snapshot).
    fn start(&self) -> &pycell_protocol::session::SessionStartRequest;
}

impl<T: Clone + HeldPolicy, O: Clone + Eq> SessionTable<T, O> {
    /// A session just started for `owner`, in the table under a new handle
    /// if `owner` holds fewer than its policy's `[session] per_uid` (counted
    /// as it goes in: another start may have finished meanwhile); `None`
    /// if not, or if no handle could be made.
    pub fn admit(&mut self, owner: O, session: Session, info: T) -> Option<String> {
        self.admit_as(None, owner, session, info)
    }

    /// [`SessionTable::admit`], under `handle` if given: a paused session
    /// of `owner`'s resumed, with its first start (its lifetime counts
    /// from then), which calls wait for until [`SessionTable::resumed`].
    pub fn admit_as(
        &mut self,
        handle: Option<&str>,
        owner: O,
        session: Session,
        info: T,
    ) -> Option<String> {
        if self.count(&owner) >= info.policy().session.per_uid as usize {
            return None;
        }
        let (handle, started) = match handle {
            Some(h) => {
                let p = self.paused.get(h).filter(|p| p.owner == owner)?;
                let started = p.started;
                self.paused.remove(h);
                self.pausing.insert(h.to_string());
                (h.to_string(), started)
            }
            None => (self.new_handle().ok()?, Instant::now()),
        };
        let entry = Entry {
            session,
            owner,
            started,
            last_used: Instant::now(),
            info,
        };
        self.insert(handle.clone(), entry);
        Some(handle)
    }

    /// Sessions past their lifetime counted from their first start (a
    /// resumed session's jail counts only its own): the live ones to end,
    /// and the snapshots of the paused ones, which are forgotten (their
    /// next call hears `lifetime`).
    pub fn past_lifetime(&mut self) -> (Vec<Session>, Vec<(O, String)>) {
        let now = Instant::now();
        let live = self
            .live
            .values()
            .filter(|e| now - e.started >= e.info.policy().session.lifetime)
            .map(|e| e.session.clone())
            .collect();
        let over: Vec<String> = self
            .paused
            .iter()
            .filter(|(_, p)| now - p.started >= p.lifetime)
            .map(|(h, _)| h.clone())
            .collect();
        let mut snapshots = Vec::new();
        for h in over {
            if let Some(p) = self.paused.remove(&h) {
                snapshots.push((p.owner.clone(), p.snapshot));
                self.remember_end(&h, p.owner, lifetime_over());
            }
        }
        (live, snapshots)
    }

    /// Live sessions idle for their policy's idle timeout, with nothing
    /// asked of them, whose policy pauses them then: marked as being
    /// paused (calls wait for it) and given to the caller to pause.
    pub fn due_for_pause(&mut self) -> Vec<(String, Entry<T, O>)> {
        let now = Instant::now();
        let due: Vec<(String, Entry<T, O>)> = self
            .live
            .iter()
            .filter(|(h, e)| {
                let s = &e.info.policy().session;
                s.pause_when_idle
                    && now - e.last_used >= s.idle_timeout
                    && !e.session.busy()
                    && e.session.ended().is_none()
                    && !self.pausing.contains(*h)
                    && !self.unpausable.contains(*h)
            })
            .map(|(h, e)| (h.clone(), e.clone()))
            .collect();
        for (h, _) in &due {
            self.pausing.insert(h.clone());
        }
        due
    }

    /// `owner`'s live sessions as `session_list` shows them.
    pub fn summaries(&mut self, owner: &O) -> Vec<SessionSummary> {
        let now = Instant::now();
        self.list(owner)
            .into_iter()
            .map(|(handle, e)| {
                let idle = now - e.last_used;
                let idle_timeout = e.info.policy().session.idle_timeout;
                SessionSummary {
                    session: handle,
                    policy: e.info.policy().name.clone(),
                    age_s: (now - e.started).as_secs_f64(),
                    idle_s: idle.as_secs_f64(),
                    expires_in_s: idle_timeout.saturating_sub(idle).as_secs_f64(),
                    paused: false,
                }
            })
            .chain(self.paused_summaries(owner, now))
            .collect()
    }

    fn paused_summaries(&self, owner: &O, now: Instant) -> Vec<SessionSummary> {
        let mut out: Vec<SessionSummary> = self
            .paused
            .iter()
            .filter(|(_, p)| &p.owner == owner)
            .map(|(h, p)| SessionSummary {
                session: h.clone(),
                policy: p.policy.clone(),
                age_s: (now - p.started).as_secs_f64(),
                idle_s: (now - p.paused_at).as_secs_f64(),
                expires_in_s: p.lifetime.saturating_sub(now - p.started).as_secs_f64(),
                paused: true,
            })
            .collect();
        out.sort_by(|a, b| b.age_s.total_cmp(&a.age_s));
        out
    }
}

/// A started session as `session_start` reports it.
pub fn session_info(
    handle: String,
    session: &Session,
    policy: &pycell_policy::Policy,
    limits: RunLimits,
    env: Option<EnvReport>,
) -> SessionInfo {
    SessionInfo {
        session: handle,
        run_id: session.run_id.clone(),
        policy: policy.name.clone(),
        sandbox_uid: session.sandbox_uid,
        limits,
        idle_timeout_s: policy.session.idle_timeout.as_secs_f64(),
        lifetime_s: policy.session.lifetime.as_secs_f64(),
        max_file_bytes: policy.session.max_file,
        env,
        restored: None,
    }
}

/// Call `forget` with why `session` ended, once it has (on a task of its
/// own): what keeps a table from holding ended sessions, and what they
/// hold (an admission slot, an env), until someone asks.
pub fn when_ended(session: Session, forget: impl FnOnce(SessionEnded) + Send + 'static) {
    tokio::spawn(async move { forget(session.wait_ended().await) });
}

/// A session that ended, as `session_end` reports it.
pub fn end_info(handle: &str, ended: &SessionEnded) -> SessionEndInfo {
    SessionEndInfo {
        session: handle.to_string(),
        reason: ended.reason.as_str().to_string(),
        message: ended.message.clone(),
        peak_memory_bytes: ended.result.peak_memory_bytes,
    }
}

/// The end of a paused session whose lifetime ran out.
fn lifetime_over() -> SessionEnded {
    let f = pycell_wire::report::JailFailure::new(
        FailureCode::SessionGone,
        pycell_wire::codes::Layer::Sessions,
        "the session's lifetime ran out while it was paused",
    );
    let result = pycell_protocol::result::RunResult::refused("", "", f);
    SessionEnded {
        reason: crate::session::EndReason::Lifetime,
        message: "the session's lifetime ran out while it was paused".into(),
        result: std::sync::Arc::new(result),
    }
}

/// A paused session ended by its caller, as `session_end` reports it.
pub fn paused_end_info(handle: &str) -> SessionEndInfo {
    SessionEndInfo {
        session: handle.to_string(),
        reason: "ended".into(),
        message: "the session was ended while paused (its snapshot is removed)".into(),
        peak_memory_bytes: 0,
    }
}

/// End `sessions` (their server is stopping), waiting at most `grace`.
pub async fn end_every(sessions: Vec<Session>, grace: Duration) {
    let _ = tokio::time::timeout(grace, async {
        for s in sessions {
            s.end().await;
        }
    })
    .await;
}

/// Why a session is refused under `policy`, which allows none.
pub fn no_sessions(policy: &pycell_policy::Policy) -> String {
    format!(
        "policy {:?} has no sessions ([session] per_uid = 0)",
        policy.name
    )
}

/// Why a session `who` starts is refused: it holds as many as `policy`
/// allows.
pub fn too_many(who: &dyn std::fmt::Display, policy: &pycell_policy::Policy) -> String {
    let most = policy.session.per_uid;
    format!("{who} holds {most} sessions, the most policy {:?} allows ([session] per_uid = {most}); end one with session_end (session_list shows them)", policy.name)
}

/// What a call with a handle that names no live session is told.
pub fn lookup_message(l: &Lookup, handle: &str) -> (FailureCode, String) {
    match l {
        Lookup::Unknown => (
            FailureCode::UnknownSession,
            format!("there is no session {handle:?}: start one with session_start (session_list shows yours)"),
        ),
        Lookup::Paused(_) => (
            FailureCode::SessionBusy,
            format!("session {handle} is paused (it was idle): a call with it (run a cell, list its files) resumes it; then ask again"),
        ),
        Lookup::Pausing => (
            FailureCode::SessionBusy,
            format!("session {handle} is being paused (it was idle): call it again in a moment, which resumes it"),
        ),
        Lookup::Restarted => (
            FailureCode::SessionGone,
            format!("session {handle} is over (restarted): the server that held it (pycelld, or the pycell mcp process) was restarted, which ends its sessions; start a new one with session_start"),
        ),
        Lookup::Gone(e)
            if matches!(
                e.reason,
                EndReason::Ended | EndReason::Idle | EndReason::Lifetime
            ) =>
        {
            (
                FailureCode::SessionGone,
                format!(
                    "session {handle} is over ({}): {}; start a new one with session_start",
                    e.reason.as_str(),
                    e.message
                ),
            )
        }
        Lookup::Gone(e) => (
            FailureCode::SessionKilled,
            format!(
                "session {handle} is over ({}): {}; start a new one with session_start",
                e.reason.as_str(),
                e.message
            ),
        ),
    }
}

/// The operation `call` asks of a session of `policy`: a cell's clocks
/// (its `timeout_s`, if given, within the policy's ceiling) and reply
/// limits, and every bound checked here, where the call arrives (not
/// only by the runner in the jail): its code, paths and data, and the
/// frame it makes for the session's runner. `max_output` is the
/// session's output cap. A call out of bounds is refused with
/// `invalid_request` (a file too large, `file_refused`); the session
/// lives on.
pub fn op_for(
    policy: &pycell_policy::Policy,
    max_output: pycell_wire::limits::Bytes,
    call: SessionCall,
    timeout_s: Option<f64>,
) -> Result<SessionOp, (FailureCode, String)> {
    let wall = match timeout_s {
        None => policy.limits.wall_timeout,
        Some(t) => pycell_policy::timeout_from_secs(t, policy.ceilings.wall_timeout)
            .map_err(|p| invalid(format!("timeout_s {p}, the policy's ceiling")))?,
    };
    let op = SessionOp {
        wall_timeout: wall,
        cpu_time: policy.limits.cpu_time,
        max_output,
        request: session_request(policy, call)?,
    };
    let encoded = pycell_wire::framing::encoded_len(&op) as u64;
    if encoded > MAX_REQUEST_FRAME {
        return Err(invalid(format!(
            "the call is {encoded} bytes once encoded, more than the {} MiB a session takes at once (characters JSON escapes, such as control characters, count up to 6 times): send it in parts",
            MAX_REQUEST_FRAME >> 20
        )));
    }
    Ok(op)
}

fn invalid(message: String) -> (FailureCode, String) {
    (FailureCode::InvalidRequest, message)
}

/// The runner's request for `call`, its code, paths and data in bounds.
fn session_request(
    policy: &pycell_policy::Policy,
    call: SessionCall,
) -> Result<SessionRequest, (FailureCode, String)> {
    let s = &policy.session;
    let bounded = |r: Result<(), bounds::OutOfBounds>| r.map_err(|e| invalid(e.to_string()));
    Ok(match call {
        SessionCall::Cell { code } => {
            bounded(bounds::check_code(&code))?;
            SessionRequest::Cell {
                code,
                limits: CellLimits {
                    images: crate::resolve::image_limits(&policy.images),
                    displays: crate::resolve::display_limits(&policy.output),
                    ..CellLimits::default()
                },
            }
        }
        SessionCall::Write { path, data_base64 } => {
            bounded(bounds::check_session_path(&path))?;
            let size = bounds::base64_decoded_len(&data_base64).ok_or_else(|| {
                invalid("data_base64: not padded base64 (its length is not a multiple of 4)".into())
            })?;
            if size > s.max_file {
                return Err((
                    FailureCode::FileRefused,
                    format!("the file is {size} bytes, more than the {} the policy's [session] max_file allows at once", s.max_file),
                ));
            }
            SessionRequest::Write {
                path,
                data: data_base64,
            }
        }
        SessionCall::Read { path } => {
            bounded(bounds::check_session_path(&path))?;
            SessionRequest::Read {
                path,
                max_bytes: s.max_file,
            }
        }
        SessionCall::List { path } => {
            bounded(bounds::check_session_path(&path))?;
            SessionRequest::List {
                path,
                max_entries: MAX_LISTED,
            }
        }
        SessionCall::MakeDir { path } => {
            bounded(bounds::check_session_path(&path))?;
            SessionRequest::MakeDir { path }
        }
        SessionCall::Remove { path } => {
            bounded(bounds::check_session_path(&path))?;
            SessionRequest::Remove { path }
        }
        SessionCall::Command { command } => {
            bounded(bounds::check_code(&command))?;
            SessionRequest::Command { command }
        }
    })
}

/// Entries a listing returns at most.
pub const MAX_LISTED: u32 = 1000;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_are_128_random_bits_after_the_instance() {
        let t: SessionTable<()> = SessionTable::default();
        let a = t.new_handle().unwrap();
        let b = t.new_handle().unwrap();
        assert!(is_handle(&a) && is_handle(&b), "{a} {b}");
        assert_ne!(a, b);
        assert_eq!(a[..10], b[..10], "the same instance");
        assert_eq!(
            handle_from("0011aabb", [0xab; 16]),
            format!("s-0011aabb{}", "ab".repeat(16))
        );
        for bad in [
            "",
            "s-",
            &a[..41],
            &a.to_uppercase(),
            &format!("x{}", &a[1..]),
        ] {
            assert!(!is_handle(bad), "{bad}");
        }
    }

    #[test]
    fn a_handle_of_an_earlier_instance_is_gone_and_a_made_up_one_unknown() {
        let mut t: SessionTable<()> = SessionTable::default();
        let ours = t.new_handle().unwrap();
        let earlier = SessionTable::<()>::default().new_handle().unwrap();
        assert!(matches!(t.get(&0, &earlier), Err(Lookup::Restarted)));
        assert!(matches!(t.get(&0, &ours), Err(Lookup::Unknown)));
        assert!(matches!(t.get(&0, "s-nonsense"), Err(Lookup::Unknown)));
        let (code, message) = lookup_message(&Lookup::Restarted, &earlier);
        assert_eq!(code, FailureCode::SessionGone);
        assert!(message.contains("restarted"), "{message}");
    }
}
