//! The E2B sandboxes this front end holds: each is a pycell session (its
//! default context) and the sessions of the contexts made in it, owned by
//! the identity that made it, reached by the SDKs' sandbox requests with
//! the access token it was given (given again only to its owner, by a
//! connect), and ended
//! when its timeout passes.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use sha2::{Digest, Sha256};

use crate::http::callers::Caller;

/// Sandboxes one identity may hold at once here (pycelld bounds their
/// sessions too; this bounds the table).
pub const MAX_PER_OWNER: usize = 64;
/// Contexts a sandbox may have besides its default one.
pub const MAX_CONTEXTS: usize = 16;

/// A code context: a session of the sandbox's policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Context {
    pub id: String,
    pub session: String,
}

/// One sandbox.
#[derive(Debug)]
pub struct Sandbox {
    pub id: String,
    /// Who made it (None: a front end without authentication).
    pub owner: Option<Arc<Caller>>,
    token: String,
    pub template: String,
    pub policy: String,
    pub info: pycell_protocol::session::SessionInfo,
    pub metadata: BTreeMap<String, String>,
    pub started: SystemTime,
    end_at: Mutex<SystemTime>,
    contexts: Mutex<Vec<Context>>,
    /// Its default context's session, and when that session's lifetime
    /// ends; or, paused, the snapshot it resumes from.
    run: Mutex<Run>,
}

/// Whether a sandbox runs, and in what.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Run {
    Running {
        session: String,
        life_ends: SystemTime,
    },
    Paused {
        snapshot: String,
    },
}

impl Sandbox {
    /// When it ends unless its timeout is set again.
    pub fn end_at(&self) -> SystemTime {
        *self.end_at.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn run(&self) -> std::sync::MutexGuard<'_, Run> {
        self.run.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Its default context's session (None: paused).
    pub fn session(&self) -> Option<String> {
        match &*self.run() {
            Run::Running { session, .. } => Some(session.clone()),
            Run::Paused { .. } => None,
        }
    }

    /// The snapshot it resumes from, if paused.
    pub fn paused(&self) -> Option<String> {
        match &*self.run() {
            Run::Paused { snapshot } => Some(snapshot.clone()),
            Run::Running { .. } => None,
        }
    }

    /// Paused into `snapshot` (its sessions ended), kept until `until`
    /// (when the snapshot expires); its contexts are gone.
    pub fn pause(&self, snapshot: String, until: SystemTime) {
        *self.run() = Run::Paused { snapshot };
        self.contexts
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clear();
        *self.end_at.lock().unwrap_or_else(|p| p.into_inner()) = until;
    }

    /// Running again in `session` (started at `now`, for `lifetime`).
    pub fn resume(&self, session: String, now: SystemTime, lifetime: Duration) {
        let life_ends = now + lifetime;
        *self.run() = Run::Running { session, life_ends };
    }

    /// It ends `timeout` from `now`; refused past its session's lifetime.
    pub fn set_timeout(&self, now: SystemTime, timeout: Duration) -> Result<(), String> {
        let end = now + timeout;
        let last = match &*self.run() {
            Run::Running { life_ends, .. } => *life_ends,
            Run::Paused { .. } => return Err("the sandbox is paused: connect to resume it".into()),
        };
        if end > last + Duration::from_secs(1) {
            let left = last.duration_since(now).unwrap_or_default().as_secs();
            return Err(format!(
                "timeout {} s is past this sandbox's life: its policy {:?} ends a session {} s after it starts ({left} s from now); ask for at most that",
                timeout.as_secs(),
                self.policy,
                self.info.lifetime_s as u64
            ));
        }
        *self.end_at.lock().unwrap_or_else(|p| p.into_inner()) = end;
        Ok(())
    }

    /// Its access token (for its owner alone).
    pub fn token(&self) -> &str {
        &self.token
    }

    /// Whether `token` is its access token.
    pub fn token_is(&self, token: &str) -> bool {
        let given: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        let mine: [u8; 32] = Sha256::digest(self.token.as_bytes()).into();
        // Hashes compared whole: their time tells nothing of the token.
        given
            .iter()
            .zip(mine.iter())
            .fold(0u8, |d, (a, b)| d | (a ^ b))
            == 0
    }

    /// Whether `identity` owns it (None: no authentication).
    pub fn owned_by(&self, identity: Option<&str>) -> bool {
        self.owner.as_ref().map(|c| &**c.identity()) == identity
    }

    /// The session of context `id` (None or `""`: the default one).
    pub fn context_session(&self, id: Option<&str>) -> Option<String> {
        match id {
            None | Some("") => self.session(),
            Some(id) if id == self.id => self.session(),
            Some(id) => self
                .contexts()
                .into_iter()
                .find(|c| c.id == id)
                .map(|c| c.session),
        }
    }

    pub fn contexts(&self) -> Vec<Context> {
        self.contexts
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Add a context, unless it has [`MAX_CONTEXTS`].
    pub fn add_context(&self, c: Context) -> Result<(), Context> {
        let mut all = self.contexts.lock().unwrap_or_else(|p| p.into_inner());
        if all.len() >= MAX_CONTEXTS {
            return Err(c);
        }
        all.push(c);
        Ok(())
    }

    /// Remove context `id`, or replace its session (a restart).
    pub fn remove_context(&self, id: &str) -> Option<Context> {
        let mut all = self.contexts.lock().unwrap_or_else(|p| p.into_inner());
        let at = all.iter().position(|c| c.id == id)?;
        Some(all.remove(at))
    }
}

/// What a new sandbox is made of.
#[derive(Debug)]
pub struct NewSandbox {
    pub owner: Option<Arc<Caller>>,
    pub template: String,
    pub policy: String,
    pub info: pycell_protocol::session::SessionInfo,
    pub metadata: BTreeMap<String, String>,
    pub now: SystemTime,
    pub timeout: Duration,
}

/// Every sandbox, by id.
#[derive(Debug, Default)]
pub struct Sandboxes {
    by_id: Mutex<HashMap<String, Arc<Sandbox>>>,
}

impl Sandboxes {
    /// Keep `new` under a fresh id: the sandbox and its access token, or
    /// why not.
    pub fn add(&self, new: NewSandbox) -> Result<(Arc<Sandbox>, String), String> {
        let token = format!("pycell_sbx_{}", random_hex(32)?);
        let id = random_id()?;
        let mut all = self.by_id.lock().unwrap_or_else(|p| p.into_inner());
        let identity = new.owner.as_ref().map(|c| c.identity().to_string());
        let held = all
            .values()
            .filter(|s| s.owned_by(identity.as_deref()))
            .count();
        if held >= MAX_PER_OWNER {
            return Err(format!(
                "this caller holds {held} sandboxes here, its most at once: kill one first"
            ));
        }
        let sandbox = Arc::new(Sandbox {
            id,
            token: token.clone(),
            run: Mutex::new(Run::Running {
                session: new.info.session.clone(),
                life_ends: new.now + Duration::from_secs_f64(new.info.lifetime_s),
            }),
            owner: new.owner,
            template: new.template,
            policy: new.policy,
            info: new.info,
            metadata: new.metadata,
            started: new.now,
            end_at: Mutex::new(new.now + new.timeout),
            contexts: Mutex::default(),
        });
        all.insert(sandbox.id.clone(), Arc::clone(&sandbox));
        Ok((sandbox, token))
    }

    /// Sandbox `id` if `identity` owns it: another's is as unknown as one
    /// never made.
    pub fn owned(&self, id: &str, identity: Option<&str>) -> Option<Arc<Sandbox>> {
        self.get(id).filter(|s| s.owned_by(identity))
    }

    /// Sandbox `id` if `token` is its access token.
    pub fn reached(&self, id: &str, token: &str) -> Option<Arc<Sandbox>> {
        self.get(id).filter(|s| s.token_is(token))
    }

    fn get(&self, id: &str) -> Option<Arc<Sandbox>> {
        let all = self.by_id.lock().unwrap_or_else(|p| p.into_inner());
        all.get(id).cloned()
    }

    /// `identity`'s sandboxes, oldest first.
    pub fn of(&self, identity: Option<&str>) -> Vec<Arc<Sandbox>> {
        let all = self.by_id.lock().unwrap_or_else(|p| p.into_inner());
        let mut mine: Vec<_> = all
            .values()
            .filter(|s| s.owned_by(identity))
            .cloned()
            .collect();
        mine.sort_by_key(|s| s.started);
        mine
    }

    /// Take sandbox `id` out (it is being ended).
    pub fn remove(&self, id: &str) -> Option<Arc<Sandbox>> {
        let mut all = self.by_id.lock().unwrap_or_else(|p| p.into_inner());
        all.remove(id)
    }

    /// Take out every sandbox whose timeout has passed at `now` (all of
    /// them with `everything`).
    pub fn take_expired(&self, now: SystemTime, everything: bool) -> Vec<Arc<Sandbox>> {
        let mut all = self.by_id.lock().unwrap_or_else(|p| p.into_inner());
        let due: Vec<String> = all
            .values()
            .filter(|s| everything || s.end_at() <= now)
            .map(|s| s.id.clone())
            .collect();
        due.iter().filter_map(|id| all.remove(id)).collect()
    }
}

/// A sandbox id as E2B's look: 20 lowercase letters and digits.
fn random_id() -> Result<String, String> {
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    let mut bytes = [0u8; 20];
    fill_random(&mut bytes)?;
    Ok(bytes
        .iter()
        .map(|b| ALPHABET[usize::from(*b) % ALPHABET.len()] as char)
        .collect())
}

/// `n` random bytes in hexadecimal.
pub fn random_hex(n: usize) -> Result<String, String> {
    let mut bytes = vec![0u8; n];
    fill_random(&mut bytes)?;
    Ok(crate::http::callers::hex(&bytes))
}

fn fill_random(bytes: &mut [u8]) -> Result<(), String> {
    getrandom::fill(bytes).map_err(|e| format!("the kernel's random generator failed: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::callers::{Quotas, Scopes};

    fn info(lifetime_s: f64) -> pycell_protocol::session::SessionInfo {
        serde_json::from_value(serde_json::json!({
            "session": "s-1", "run_id": "r", "policy": "default", "sandbox_uid": 1,
            "limits": serde_json::to_value(pycell_wire::limits::RunLimits::default()).unwrap(),
            "idle_timeout_s": 600.0, "lifetime_s": lifetime_s, "max_file_bytes": 1024,
        }))
        .unwrap()
    }

    fn caller(name: &str) -> Arc<Caller> {
        let policies: Arc<[String]> = Arc::from(vec!["default".to_string()]);
        Arc::new(Caller::new(
            name,
            Scopes::from_names(["pycell:run"]),
            Quotas::default(),
            policies,
        ))
    }

    fn new(owner: Option<Arc<Caller>>, now: SystemTime) -> NewSandbox {
        NewSandbox {
            owner,
            template: "base".into(),
            policy: "default".into(),
            info: info(3600.0),
            metadata: BTreeMap::new(),
            now,
            timeout: Duration::from_secs(300),
        }
    }

    #[test]
    fn a_sandbox_is_reached_by_its_token_and_owned_by_its_maker_alone() {
        let t = Sandboxes::default();
        let now = SystemTime::now();
        let (a, token) = t.add(new(Some(caller("alice")), now)).unwrap();
        assert_eq!(a.id.len(), 20);
        assert!(t.reached(&a.id, &token).is_some());
        assert!(t.reached(&a.id, "pycell_sbx_wrong").is_none());
        assert!(t.owned(&a.id, Some("alice")).is_some());
        assert!(t.owned(&a.id, Some("bob")).is_none());
        assert!(t.owned(&a.id, None).is_none());
        assert_eq!(t.of(Some("bob")).len(), 0);
        assert_eq!(t.of(Some("alice")).len(), 1);
    }

    #[test]
    fn timeouts_end_sandboxes_and_stop_at_the_sessions_lifetime() {
        let t = Sandboxes::default();
        let now = SystemTime::now();
        let (a, _) = t.add(new(None, now)).unwrap();
        assert!(t.take_expired(now, false).is_empty());
        assert!(a.set_timeout(now, Duration::from_secs(3600)).is_ok());
        let e = a.set_timeout(now, Duration::from_secs(7200)).unwrap_err();
        assert!(e.contains("3600 s after it starts"), "{e}");
        let later = now + Duration::from_secs(3601);
        assert_eq!(t.take_expired(later, false).len(), 1);
        assert!(t.owned(&a.id, None).is_none());
    }

    #[test]
    fn a_paused_sandbox_has_no_session_until_resumed_and_keeps_its_token() {
        let t = Sandboxes::default();
        let now = SystemTime::now();
        let (a, token) = t.add(new(None, now)).unwrap();
        let c = Context {
            id: "c".into(),
            session: "s-c".into(),
        };
        a.add_context(c).unwrap();
        let until = now + Duration::from_secs(7 * 24 * 3600);
        a.pause("snap-1".into(), until);
        assert_eq!((a.session(), a.paused().as_deref()), (None, Some("snap-1")));
        assert!(a.contexts().is_empty());
        assert!(a
            .set_timeout(now, Duration::from_secs(60))
            .unwrap_err()
            .contains("paused"));
        // Kept until its snapshot expires, not its old timeout.
        assert!(t
            .take_expired(now + Duration::from_secs(3600), false)
            .is_empty());
        let later = now + Duration::from_secs(5000);
        a.resume("s-2".into(), later, Duration::from_secs(3600));
        assert_eq!((a.session().as_deref(), a.paused()), (Some("s-2"), None));
        assert!(t.reached(&a.id, &token).is_some());
        // Its lifetime counts from the resume.
        assert!(a.set_timeout(later, Duration::from_secs(3000)).is_ok());
        assert!(a.set_timeout(later, Duration::from_secs(4000)).is_err());
    }

    #[test]
    fn contexts_are_bounded_and_found_by_id() {
        let t = Sandboxes::default();
        let (a, _) = t.add(new(None, SystemTime::now())).unwrap();
        for i in 0..MAX_CONTEXTS {
            let c = Context {
                id: format!("c{i}"),
                session: format!("s{i}"),
            };
            assert!(a.add_context(c).is_ok());
        }
        let extra = Context {
            id: "x".into(),
            session: "sx".into(),
        };
        assert!(a.add_context(extra).is_err());
        assert_eq!(a.context_session(Some("c3")).as_deref(), Some("s3"));
        assert_eq!(a.context_session(None).as_deref(), Some("s-1"));
        assert_eq!(a.context_session(Some("nope")), None);
        assert!(a.remove_context("c3").is_some());
        assert_eq!(a.context_session(Some("c3")), None);
    }
}
