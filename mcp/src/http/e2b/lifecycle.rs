//! A sandbox's life beyond create and kill, on pycell's session snapshots
//! and forks (docs/sessions.md): `pause` snapshots its session and ends
//! it (its contexts too), `connect` (or `resume`) of a paused sandbox
//! starts a session from that snapshot under the same id and token,
//! `fork` starts sandboxes that are forks of its session, and
//! `create_snapshot` keeps a snapshot that `Sandbox.create(snapshot_id)`
//! starts from. A snapshot keeps `__main__`'s names and /workspace, not
//! live memory, processes or open files (what a fork reports it drops).

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use http::{Response, StatusCode};
use serde::Deserialize;
use serde_json::{json, Value};

use super::api::{created, keep, set_timeout, DEFAULT_TIMEOUT};
use super::sandboxes::{NewSandbox, Sandbox};
use super::{empty, error, parse, E2b, Refusal};
use crate::http::front::Body;
use pycell_protocol::session::SessionStartRequest;

/// Forks one request may ask for (E2B's bound).
const MAX_FORKS: u32 = 20;

#[derive(Debug, Deserialize)]
struct ForkBody {
    #[serde(default)]
    timeout: Option<u64>,
    #[serde(default)]
    count: Option<u32>,
}

#[derive(Debug, Deserialize)]
struct SnapshotBody {
    #[serde(default)]
    name: Option<String>,
}

/// `POST /sandboxes/{id}/pause`: 409 if it is paused already.
pub(super) async fn pause(e2b: &E2b, s: &Sandbox) -> Response<Body> {
    let Some(session) = s.session() else {
        return error(StatusCode::CONFLICT, "the sandbox is paused already");
    };
    let service = e2b.service_of(s);
    let snap = match service.snapshot_session(&session).await {
        Ok(snap) => snap,
        Err(f) => return Refusal::failed("the sandbox was not paused", &f).answer(),
    };
    e2b.end(s).await;
    let until = SystemTime::UNIX_EPOCH + Duration::from_secs(snap.expires_at);
    s.pause(snap.snapshot, until);
    empty(StatusCode::NO_CONTENT)
}

/// `POST /sandboxes/{id}/connect` (and v1's `resume`): a paused sandbox
/// resumed from its snapshot; the sandbox with its token, its timeout
/// set.
pub(super) async fn connect(e2b: &E2b, s: &Sandbox, body: &[u8]) -> Response<Body> {
    if let Some(snapshot) = s.paused() {
        if let Err(r) = resume(e2b, s, snapshot).await {
            return r.answer();
        }
    }
    match set_timeout(s, body) {
        Ok(()) => super::json(StatusCode::OK, &created(s)),
        Err(r) => r.answer(),
    }
}

async fn resume(e2b: &E2b, s: &Sandbox, snapshot: String) -> Result<(), Refusal> {
    let req = SessionStartRequest {
        from_snapshot: Some(snapshot),
        ..SessionStartRequest::default()
    };
    let info = e2b
        .service_of(s)
        .start_session(req)
        .await
        .map_err(|f| Refusal::failed("the sandbox was not resumed", &f))?;
    let now = SystemTime::now();
    s.resume(info.session, now, Duration::from_secs_f64(info.lifetime_s));
    s.set_timeout(
        now,
        DEFAULT_TIMEOUT.min(Duration::from_secs_f64(info.lifetime_s)),
    )
    .map_err(|m| Refusal::new(StatusCode::BAD_REQUEST, m))
}

/// `POST /sandboxes/{id}/fork`: one result per fork asked for, each a
/// sandbox or its error.
pub(super) async fn fork(e2b: &E2b, s: &Sandbox, body: &[u8]) -> Response<Body> {
    let b: ForkBody = match parse(body) {
        Ok(b) => b,
        Err(r) => return r.answer(),
    };
    let count = b.count.unwrap_or(1);
    if !(1..=MAX_FORKS).contains(&count) {
        let m = format!("count {count}: a fork asks for 1 to {MAX_FORKS} sandboxes");
        return error(StatusCode::BAD_REQUEST, &m);
    }
    let Some(session) = s.session() else {
        return error(
            StatusCode::CONFLICT,
            "a paused sandbox cannot be forked: connect to resume it first",
        );
    };
    let timeout = b.timeout.map_or(DEFAULT_TIMEOUT, Duration::from_secs);
    let mut results = Vec::new();
    for _ in 0..count {
        let one = fork_one(e2b, s, &session, timeout).await;
        results.push(match one {
            Ok(forked) => json!({"sandbox": created(&forked)}),
            Err(r) => json!({"error": {"code": r.status.as_u16(), "message": r.message}}),
        });
    }
    super::json(StatusCode::CREATED, &Value::Array(results))
}

async fn fork_one(
    e2b: &E2b,
    s: &Sandbox,
    session: &str,
    timeout: Duration,
) -> Result<Arc<Sandbox>, Refusal> {
    let service = e2b.service_of(s);
    let forked = service
        .fork_session(session)
        .await
        .map_err(|f| Refusal::failed("no fork was made", &f))?;
    let new = NewSandbox {
        owner: s.owner.clone(),
        template: s.template.clone(),
        policy: s.policy.clone(),
        metadata: s.metadata.clone(),
        now: SystemTime::now(),
        timeout: Duration::ZERO,
        info: forked.session,
    };
    keep(e2b, &service, new, timeout).await
}

/// `POST /sandboxes/{id}/snapshots`: a snapshot of the sandbox's session
/// (which goes on), kept in pycell's store under its owner.
pub(super) async fn snapshot(e2b: &E2b, s: &Sandbox, body: &[u8]) -> Response<Body> {
    let b: SnapshotBody = match parse(body) {
        Ok(b) => b,
        Err(r) => return r.answer(),
    };
    if b.name.as_deref().is_some_and(|n| !n.is_empty()) {
        let m = "name: snapshots have no names in pycell: create from the snapshot's id";
        return error(StatusCode::BAD_REQUEST, m);
    }
    let Some(session) = s.session() else {
        return error(
            StatusCode::CONFLICT,
            "the sandbox is paused: connect to resume it first",
        );
    };
    match e2b.service_of(s).snapshot_session(&session).await {
        Ok(snap) => super::json(
            StatusCode::CREATED,
            &json!({"snapshotID": snap.snapshot, "names": [snap.snapshot]}),
        ),
        Err(f) => Refusal::failed("no snapshot was taken", &f).answer(),
    }
}
