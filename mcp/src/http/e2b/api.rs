//! E2B's REST control plane: create, connect, list, describe, time and
//! kill sandboxes (pause, resume, fork and snapshots: [`lifecycle`]). A
//! template names a pycell policy ([`policy_of`]) or a snapshot; what
//! pycell does not do (metrics, logs, templates, volumes, secrets) is
//! answered 501 saying so.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use http::{Method, Response, StatusCode};
use serde::Deserialize;
use serde_json::{json, Value};

use super::lifecycle;
use super::sandboxes::{NewSandbox, Sandbox};
use super::{empty, error, parse, rfc3339, unsupported, E2b, Refusal, ENVD_VERSION};
use crate::http::callers::Caller;
use crate::http::front::Body;
use pycell_engine::service::RunService;
use pycell_protocol::session::SessionStartRequest;

/// E2B's default templates: the code interpreter's and the base image.
/// Both are the front end's default policy; any other template is a
/// policy's name.
const DEFAULT_TEMPLATES: [&str; 2] = ["code-interpreter-v1", "base"];
/// A sandbox's timeout when the request names none (E2B's).
pub(super) const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);
/// How pycell's snapshot ids start: such a template is a snapshot.
const SNAPSHOT_PREFIX: &str = "snap-";

/// `POST /sandboxes` (v1 and v2).
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct NewSandboxBody {
    #[serde(rename = "templateID")]
    template_id: String,
    #[serde(default)]
    timeout: Option<u64>,
    #[serde(default)]
    metadata: Option<BTreeMap<String, String>>,
    #[serde(default)]
    env_vars: Option<BTreeMap<String, String>>,
    /// Spelt so by the v2 API, camelCase by v1.
    #[serde(default, alias = "allow_internet_access")]
    allow_internet_access: Option<bool>,
    #[serde(default)]
    auto_pause: Option<bool>,
    #[serde(default)]
    mcp: Option<Value>,
    #[serde(default)]
    network: Option<Value>,
    #[serde(default)]
    volume_mounts: Option<Vec<Value>>,
    #[serde(default)]
    iam: Option<Value>,
    #[serde(default)]
    secure: Option<bool>,
}

/// `POST /sandboxes/{id}/timeout` and `/connect`.
#[derive(Debug, Deserialize)]
struct TimeoutBody {
    #[serde(default)]
    timeout: Option<u64>,
}

pub(super) async fn serve(
    e2b: &Arc<E2b>,
    caller: Option<Arc<Caller>>,
    parts: &http::request::Parts,
    path: &str,
    body: &[u8],
) -> Response<Body> {
    let identity = caller.as_ref().map(|c| c.identity().to_string());
    let path = path.strip_prefix("/v2").unwrap_or(path);
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    match (&parts.method, segments.as_slice()) {
        (&Method::POST, ["sandboxes"]) => create(e2b, caller, body).await,
        (&Method::GET, ["sandboxes"]) => list(e2b, identity.as_deref(), parts),
        (method, ["sandboxes", id, rest @ ..]) => {
            let Some(s) = e2b.sandboxes.owned(id, identity.as_deref()) else {
                let m = format!("sandbox {id} not found");
                return error(StatusCode::NOT_FOUND, &m);
            };
            on_sandbox(e2b, &s, method, rest, body).await
        }
        (method, _) => unsupported(&format!("{method} {path}")),
    }
}

/// A request about one sandbox, the caller's.
async fn on_sandbox(
    e2b: &Arc<E2b>,
    s: &Arc<Sandbox>,
    method: &Method,
    rest: &[&str],
    body: &[u8],
) -> Response<Body> {
    match (method, rest) {
        (&Method::GET, []) => super::json(StatusCode::OK, &detail(s)),
        (&Method::DELETE, []) => {
            if e2b.sandboxes.remove(&s.id).is_some() {
                e2b.end(s).await;
            }
            empty(StatusCode::NO_CONTENT)
        }
        (&Method::POST, ["timeout"]) => match set_timeout(s, body) {
            Ok(()) => empty(StatusCode::NO_CONTENT),
            Err(r) => r.answer(),
        },
        (&Method::POST, ["refreshes"]) => empty(StatusCode::NO_CONTENT),
        (&Method::POST, ["connect" | "resume"]) => lifecycle::connect(e2b, s, body).await,
        (&Method::POST, ["pause"]) => lifecycle::pause(e2b, s).await,
        (&Method::POST, ["fork"]) => lifecycle::fork(e2b, s, body).await,
        (&Method::POST, ["snapshots"]) => lifecycle::snapshot(e2b, s, body).await,
        (m, r) => unsupported(&format!("{m} /sandboxes/{{id}}/{}", r.join("/"))),
    }
}

/// Set a sandbox's timeout from a `{"timeout": SECONDS}` body (absent:
/// unchanged).
pub(super) fn set_timeout(s: &Sandbox, body: &[u8]) -> Result<(), Refusal> {
    let t: TimeoutBody = parse(body)?;
    let Some(secs) = t.timeout else {
        return Ok(());
    };
    s.set_timeout(SystemTime::now(), Duration::from_secs(secs))
        .map_err(|m| Refusal::new(StatusCode::BAD_REQUEST, m))
}

/// The policy a template names, or why it names none here.
pub(super) fn policy_of(template: &str, default_policy: &str) -> String {
    match DEFAULT_TEMPLATES.contains(&template) {
        true => default_policy.to_string(),
        false => template.to_string(),
    }
}

/// What of a new sandbox's request pycell cannot honour.
fn refused_options(b: &NewSandboxBody) -> Option<&'static str> {
    let some_map = |m: &Option<BTreeMap<String, String>>| m.as_ref().is_some_and(|m| !m.is_empty());
    if some_map(&b.env_vars) {
        return Some("envVars: a sandbox's environment is its policy's (pycell sets no variables a request names)");
    }
    if b.allow_internet_access == Some(true) {
        return Some("allowInternetAccess: a sandbox's network is its policy's egress allowlist; choose a template (policy) that has the network it needs, and leave this unset");
    }
    if b.auto_pause == Some(true) {
        return Some(
            "autoPause: pycell pauses idle sessions by the policy's [session] pause_when_idle",
        );
    }
    if b.mcp.as_ref().is_some_and(|m| !m.is_null()) {
        return Some("mcp: jailed MCP servers are pycell's `pycell mcp-server`");
    }
    if b.network.as_ref().is_some_and(|n| !n.is_null()) {
        return Some("network: a sandbox's network is its policy's egress allowlist");
    }
    if b.iam.as_ref().is_some_and(|i| !i.is_null()) {
        return Some("iam: a sandbox holds no cloud identity (pycell's egress proxy injects no credentials yet)");
    }
    if b.volume_mounts.as_ref().is_some_and(|v| !v.is_empty()) {
        return Some("volumeMounts: a sandbox has only its own /workspace");
    }
    None
}

async fn create(e2b: &Arc<E2b>, caller: Option<Arc<Caller>>, body: &[u8]) -> Response<Body> {
    let b: NewSandboxBody = match parse(body) {
        Ok(b) => b,
        Err(r) => return r.answer(),
    };
    if let Some(why) = refused_options(&b) {
        return error(
            StatusCode::BAD_REQUEST,
            &format!("not supported by pycell: {why}"),
        );
    }
    let _ = b.secure;
    let service = match &caller {
        Some(c) => e2b.service.speaking_for(Arc::clone(&c.speaks_as)),
        None => e2b.service.clone(),
    };
    // A snapshot (`Sandbox.create(snapshot_id)`) names its policy, which
    // the run service checks once the session says it.
    let from_snapshot = b.template_id.starts_with(SNAPSHOT_PREFIX);
    let policy = policy_of(&b.template_id, &e2b.default_policy);
    if let (false, Err(e)) = (from_snapshot, service.may_use(&policy)) {
        let m = format!(
            "template {:?} (pycell policy {policy:?}): {e}",
            b.template_id
        );
        return error(StatusCode::BAD_REQUEST, &m);
    }
    let start = match from_snapshot {
        true => SessionStartRequest {
            from_snapshot: Some(b.template_id.clone()),
            ..SessionStartRequest::default()
        },
        false => SessionStartRequest {
            policy: Some(policy),
            ..SessionStartRequest::default()
        },
    };
    let info = match service.start_session(start).await {
        Ok(i) => i,
        Err(f) => return start_failed(&b.template_id, &f),
    };
    let new = NewSandbox {
        owner: caller,
        template: b.template_id,
        policy: info.policy.clone(),
        metadata: b.metadata.unwrap_or_default(),
        now: SystemTime::now(),
        timeout: Duration::ZERO,
        info,
    };
    let timeout = b.timeout.map_or(DEFAULT_TIMEOUT, Duration::from_secs);
    match keep(e2b, &service, new, timeout).await {
        Ok(s) => super::json(StatusCode::CREATED, &created(&s)),
        Err(r) => r.answer(),
    }
}

/// Keep a sandbox of a started session, its timeout set as a later
/// set_timeout would set it (refused past its session's lifetime); if it
/// cannot be kept, its session is ended.
pub(super) async fn keep(
    e2b: &E2b,
    service: &RunService,
    new: NewSandbox,
    timeout: Duration,
) -> Result<Arc<Sandbox>, Refusal> {
    let (session, now) = (new.info.session.clone(), new.now);
    let made = e2b
        .sandboxes
        .add(new)
        .map_err(|why| Refusal::new(StatusCode::TOO_MANY_REQUESTS, why));
    let timed = made.and_then(|(s, _)| match s.set_timeout(now, timeout) {
        Ok(()) => Ok(s),
        Err(why) => {
            e2b.sandboxes.remove(&s.id);
            Err(Refusal::new(StatusCode::BAD_REQUEST, why))
        }
    });
    if timed.is_err() {
        let _ = service.end_session(&session).await;
    }
    timed
}

/// A session that could not start, in E2B's terms: an unknown policy is
/// an unknown template.
fn start_failed(template: &str, f: &pycell_engine::service::SessionFailure) -> Response<Body> {
    let what = format!(
        "template {template:?}: no sandbox was made (a template is the name of a pycell policy, or code-interpreter-v1 or base for the server's default)"
    );
    Refusal::failed(&what, f).answer()
}

/// The `Sandbox` answer of a create or connect.
pub(super) fn created(s: &Sandbox) -> Value {
    json!({
        "templateID": s.template,
        "sandboxID": s.id,
        "clientID": "pycell",
        "envdVersion": ENVD_VERSION,
        "alias": s.template,
        "envdAccessToken": s.token(),
        "trafficAccessToken": s.token(),
    })
}

/// A sandbox as `GET /sandboxes/{id}` and the listing describe it.
fn detail(s: &Sandbox) -> Value {
    let l = &s.info.limits;
    json!({
        "templateID": s.template,
        "sandboxID": s.id,
        "clientID": "pycell",
        "alias": s.template,
        "startedAt": rfc3339(s.started),
        "endAt": rfc3339(s.end_at()),
        "envdVersion": ENVD_VERSION,
        "cpuCount": l.cpus.get().ceil().max(1.0) as u64,
        "memoryMB": l.memory.get() >> 20,
        "diskSizeMB": l.disk.get() >> 20,
        "state": state(s),
        "metadata": s.metadata,
    })
}

fn state(s: &Sandbox) -> &'static str {
    match s.paused() {
        Some(_) => "paused",
        None => "running",
    }
}

/// `GET /sandboxes` and `/v2/sandboxes`: the caller's, filtered by the
/// `metadata` query (`k=v&...`, URL-encoded) and `state`.
fn list(e2b: &E2b, identity: Option<&str>, parts: &http::request::Parts) -> Response<Body> {
    let wanted: Vec<(String, String)> = super::query_param(parts, "metadata")
        .map(|q| form_urlencoded::parse(q.as_bytes()).into_owned().collect())
        .unwrap_or_default();
    let states = super::query_param(parts, "state");
    let all: Vec<Value> = e2b
        .sandboxes
        .of(identity)
        .iter()
        .filter(|s| {
            states
                .as_deref()
                .is_none_or(|w| w.split(',').any(|w| w == state(s)))
        })
        .filter(|s| wanted.iter().all(|(k, v)| s.metadata.get(k) == Some(v)))
        .map(|s| detail(s))
        .collect();
    super::json(StatusCode::OK, &Value::Array(all))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(v: Value) -> NewSandboxBody {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn templates_name_policies_and_the_defaults_the_servers() {
        assert_eq!(policy_of("code-interpreter-v1", "default"), "default");
        assert_eq!(policy_of("base", "data-science"), "data-science");
        assert_eq!(policy_of("data-science", "default"), "data-science");
    }

    #[test]
    fn what_pycell_cannot_honour_is_refused_not_ignored() {
        let ok = body(
            json!({"templateID": "base", "envVars": {}, "metadata": {"a": "b"}, "allowInternetAccess": false}),
        );
        assert_eq!(refused_options(&ok), None);
        for (field, v) in [
            ("envVars", json!({"K": "v"})),
            ("allowInternetAccess", json!(true)),
            ("autoPause", json!(true)),
            ("volumeMounts", json!([{"name": "v", "path": "/data"}])),
            ("network", json!({"allowOut": ["example.net"]})),
        ] {
            let mut b = json!({"templateID": "base"});
            b[field] = v;
            let why = refused_options(&body(b)).unwrap_or_else(|| panic!("{field} passed"));
            assert!(why.starts_with(field), "{why}");
        }
    }
}
