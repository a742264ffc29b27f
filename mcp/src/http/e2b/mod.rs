//! An E2B-compatible endpoint (docs/e2b.md): the published E2B SDKs,
//! pointed here by their API URL and sandbox URL settings with a pycell
//! token as their API key, create, use and kill pycell sessions.
//!
//! Under [`PREFIX`], beside the MCP endpoint of `pycell mcp --http`, in
//! the same unprivileged process, behind the same authentication, quotas
//! and run service:
//! - E2B's REST control plane ([`api`]), authenticated by `X-API-Key`
//!   (a pycell token or OAuth access token, as `Authorization: Bearer`
//!   is on the MCP endpoint);
//! - the sandbox requests, told apart by their `E2b-Sandbox-Id` header
//!   and authenticated by the sandbox's own access token (which only its
//!   maker was given): the code interpreter's `/execute` and `/contexts`
//!   ([`interpreter`]), envd's `/files` and its filesystem and process
//!   services over Connect ([`envd`]).
//!
//! A sandbox is a pycell session, and each code context another session
//! of the same policy ([`sandboxes`]). What E2B has and pycell does not
//! is answered with E2B's error shape, saying so.

mod api;
mod connect;
mod envd;
mod interpreter;
mod lifecycle;
pub(crate) mod sandboxes;

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http::{header, HeaderMap, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use tokio_util::sync::CancellationToken;

use super::callers::Caller;
use super::front::Body;
use super::gate::{Denial, Gate};
use super::limiter::{Limiter, Permit};
use pycell_engine::service::RunService;
use sandboxes::{Sandbox, Sandboxes};

/// Where the endpoint is: `E2B_API_URL` and `E2B_SANDBOX_URL` are the
/// front end's origin and this.
pub const PREFIX: &str = "/e2b";

/// The envd version the sandboxes claim: the SDKs' features up to it
/// (octet-stream uploads, default users) are served.
pub const ENVD_VERSION: &str = "0.5.7";

/// The E2B endpoint's state, shared by every connection.
#[derive(Debug)]
pub struct E2b {
    /// The run service, speaking for no one (each request's caller is
    /// spoken for).
    pub service: RunService,
    pub sandboxes: Sandboxes,
    pub gate: Arc<Gate>,
    /// The callers' quotas, shared with the MCP endpoint.
    pub limiter: Arc<Limiter>,
    /// The policy of E2B's default templates (the front end's `--policy`).
    pub default_policy: String,
}

/// Who a request is from.
#[derive(Debug)]
pub enum Asker {
    /// A control-plane request, by this caller (None: no authentication).
    Api(Option<Arc<Caller>>),
    /// A request to this sandbox, which its access token reached.
    Sandbox(Arc<Sandbox>),
}

impl E2b {
    /// Who `headers` say the request is from, or the answer refusing it.
    pub fn authenticate(&self, headers: &HeaderMap) -> Result<Asker, Refusal> {
        let text = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
        if let Some(id) = text("e2b-sandbox-id") {
            let token = text("x-access-token").or_else(|| text("e2b-traffic-access-token"));
            let Some(token) = token else {
                let m = "a sandbox request needs its access token (X-Access-Token), as the SDK sends it";
                return Err(Refusal::new(StatusCode::UNAUTHORIZED, m));
            };
            return match self.sandboxes.reached(id, token) {
                Some(s) => Ok(Asker::Sandbox(s)),
                None => Err(Refusal::new(StatusCode::BAD_GATEWAY, not_found(id))),
            };
        }
        if self.gate.open {
            return Ok(Asker::Api(None));
        }
        let Some(key) = text("x-api-key") else {
            let m = "authentication required: send your pycell token as the API key (E2B_API_KEY)";
            return Err(Refusal::new(StatusCode::UNAUTHORIZED, m));
        };
        let bearer = format!("Bearer {key}");
        match self.gate.authenticate(Some(bearer.as_bytes())) {
            Ok(caller) => Ok(Asker::Api(caller)),
            Err(Denial::Invalid(why)) => Err(Refusal::new(
                StatusCode::UNAUTHORIZED,
                format!("Invalid API key: {why}"),
            )),
            Err(_) => Err(Refusal::new(StatusCode::UNAUTHORIZED, "Invalid API key")),
        }
    }

    /// Answer a request to `path` (below [`PREFIX`]).
    pub async fn serve(
        self: &Arc<Self>,
        asker: Asker,
        parts: http::request::Parts,
        path: &str,
        body: Bytes,
    ) -> Response<Body> {
        match asker {
            Asker::Api(caller) => api::serve(self, caller, &parts, path, &body).await,
            Asker::Sandbox(s) if s.paused().is_some() => {
                let m = format!(
                    "The sandbox {} is paused: Sandbox.connect() resumes it",
                    s.id
                );
                error(StatusCode::BAD_GATEWAY, &m)
            }
            Asker::Sandbox(s) => match path {
                "/execute" | "/contexts" => interpreter::serve(self, &s, &parts, path, &body).await,
                p if p.starts_with("/contexts/") => {
                    interpreter::serve(self, &s, &parts, path, &body).await
                }
                _ => envd::serve(self, &s, &parts, path, body).await,
            },
        }
    }

    /// The run service speaking for `sandbox`'s owner.
    fn service_of(&self, sandbox: &Sandbox) -> RunService {
        match &sandbox.owner {
            Some(c) => self.service.speaking_for(Arc::clone(&c.speaks_as)),
            None => self.service.clone(),
        }
    }

    /// A place in `sandbox`'s owner's quotas for a call that runs code.
    fn permit(&self, sandbox: &Sandbox) -> Result<Option<Permit>, String> {
        let Some(caller) = &sandbox.owner else {
            return Ok(None);
        };
        let now = std::time::Instant::now();
        self.limiter
            .begin(caller, now)
            .map(Some)
            .map_err(|e| e.to_string())
    }

    /// End `sandbox`: its contexts' sessions and its own.
    async fn end(&self, sandbox: &Sandbox) {
        let service = self.service_of(sandbox);
        for c in sandbox.contexts() {
            let _ = service.end_session(&c.session).await;
        }
        if let Some(session) = sandbox.session() {
            let _ = service.end_session(&session).await;
        }
    }

    /// Sandbox `id` is over (its session ended under it): forget it.
    async fn gone(&self, sandbox: &Sandbox) {
        if self.sandboxes.remove(&sandbox.id).is_some() {
            self.end(sandbox).await;
        }
    }

    /// End sandboxes as their timeouts pass, until `stop`; then end them
    /// all.
    pub async fn reap(self: Arc<Self>, stop: CancellationToken) {
        loop {
            tokio::select! {
                _ = stop.cancelled() => break,
                _ = tokio::time::sleep(Duration::from_secs(1)) => {}
            }
            for s in self.sandboxes.take_expired(SystemTime::now(), false) {
                self.end(&s).await;
            }
        }
        let all = self.sandboxes.take_expired(SystemTime::now(), true);
        futures::future::join_all(all.iter().map(|s| self.end(s))).await;
    }
}

/// E2B's error shape: `{"code": STATUS, "message": ...}`.
fn error(status: StatusCode, message: &str) -> Response<Body> {
    let body = serde_json::json!({"code": status.as_u16(), "message": message});
    json(status, &body)
}

/// What E2B's proxy says (with 502) of a sandbox that is not there (the
/// SDKs read it as the sandbox not running): also of one not the caller's.
fn not_found(id: &str) -> String {
    format!("The sandbox {id} was not found (killed, past its timeout, or not this caller's)")
}

/// A request refused: its status, and what E2B's error shape says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub status: StatusCode,
    pub message: String,
}

impl Refusal {
    pub fn new(status: StatusCode, message: impl Into<String>) -> Refusal {
        Refusal {
            status,
            message: message.into(),
        }
    }

    /// A session call that failed: `what` did not happen, and why.
    pub fn failed(what: &str, f: &pycell_engine::service::SessionFailure) -> Refusal {
        let m = format!("{what}: {} ({})", f.message, f.code.as_str());
        Refusal::new(failure_status(f.code), m)
    }

    pub fn answer(&self) -> Response<Body> {
        error(self.status, &self.message)
    }
}

/// The HTTP status of a session call's failure.
fn failure_status(code: pycell_wire::codes::FailureCode) -> StatusCode {
    use pycell_wire::codes::FailureCode as F;
    match code {
        F::InvalidPolicy | F::InvalidRequest | F::StateRefused => StatusCode::BAD_REQUEST,
        F::UnknownSnapshot => StatusCode::NOT_FOUND,
        F::TooManySessions | F::SessionBusy | F::Busy => StatusCode::TOO_MANY_REQUESTS,
        F::DaemonUnavailable => StatusCode::SERVICE_UNAVAILABLE,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

/// A JSON request body as `T`, or a 400 saying why not.
fn parse<'a, T: serde::Deserialize<'a>>(body: &'a [u8]) -> Result<T, Refusal> {
    serde_json::from_slice(body).map_err(|e| {
        let m = format!("the request body is not what this call takes: {e}");
        Refusal::new(StatusCode::BAD_REQUEST, m)
    })
}

/// What pycell does not do, said so.
fn unsupported(what: &str) -> Response<Body> {
    let m = format!("{what} is not supported by pycell (see docs/e2b.md)");
    error(StatusCode::NOT_IMPLEMENTED, &m)
}

fn json(status: StatusCode, body: &serde_json::Value) -> Response<Body> {
    respond(status, "application/json", Bytes::from(body.to_string()))
}

fn respond(status: StatusCode, content_type: &'static str, body: Bytes) -> Response<Body> {
    let mut r = Response::new(Full::new(body).boxed());
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        http::HeaderValue::from_static(content_type),
    );
    r
}

fn empty(status: StatusCode) -> Response<Body> {
    let mut r = Response::new(Full::new(Bytes::new()).boxed());
    *r.status_mut() = status;
    r
}

/// A time as RFC 3339, in UTC.
fn rfc3339(t: SystemTime) -> String {
    humantime::format_rfc3339_millis(t).to_string()
}

/// A request's query parameter `name`, decoded.
fn query_param(parts: &http::request::Parts, name: &str) -> Option<String> {
    let q = parts.uri.query()?;
    form_urlencoded::parse(q.as_bytes())
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.into_owned())
}

/// A response whose body is what `rx` receives, until its sender is
/// dropped; dropping the body (the client went away) cancels `cancel`.
fn streamed(
    status: StatusCode,
    content_type: &'static str,
    rx: tokio::sync::mpsc::UnboundedReceiver<Bytes>,
    cancel: CancellationToken,
) -> Response<Body> {
    let body = Streamed {
        rx,
        _stop: cancel.drop_guard(),
    };
    let mut r = Response::new(body.boxed());
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        http::HeaderValue::from_static(content_type),
    );
    r
}

/// A body sent as it is made.
#[derive(Debug)]
struct Streamed {
    rx: tokio::sync::mpsc::UnboundedReceiver<Bytes>,
    _stop: tokio_util::sync::DropGuard,
}

impl http_body::Body for Streamed {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
        self.rx
            .poll_recv(cx)
            .map(|b| b.map(|b| Ok(http_body::Frame::data(b))))
    }
}

/// A call's output on its way to the caller, by stream: sent a line at a
/// time (a line written in pieces goes as one, as a notebook shows it),
/// the rest of a line when the call ends. A watch may miss the last
/// chunks (pycelld drops chunks rather than hold up a busy connection;
/// the answer has the whole output): [`Lines::finish`] sends what the
/// caller was not sent.
#[derive(Debug, Default)]
struct Lines(std::sync::Mutex<[Heard; 2]>);

#[derive(Debug, Default)]
struct Heard {
    /// Everything the watch passed on.
    all: Vec<u8>,
    /// Of it, what is not sent yet (no newline after it yet).
    unsent: usize,
}

impl Lines {
    /// `bytes` heard: the complete lines now ready to send, if any.
    fn take(&self, stream: pycell_wire::events::Stream, bytes: &[u8]) -> Option<Vec<u8>> {
        let mut all = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let h = &mut all[stream as usize];
        h.all.extend_from_slice(bytes);
        h.unsent += bytes.len();
        let pending = &h.all[h.all.len() - h.unsent..];
        let cut = pending.iter().rposition(|b| *b == b'\n')? + 1;
        let ready = pending[..cut].to_vec();
        h.unsent -= cut;
        Some(ready)
    }

    /// The call is over and its stream was `whole`: what is left to send
    /// (the unsent end of a line, and what the watch missed if what it
    /// heard is the start of `whole`).
    fn finish(&self, stream: pycell_wire::events::Stream, whole: &str) -> Option<Vec<u8>> {
        let mut all = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let h = &mut all[stream as usize];
        let mut left = h.all[h.all.len() - h.unsent..].to_vec();
        if let Some(missed) = whole.as_bytes().strip_prefix(h.all.as_slice()) {
            left.extend_from_slice(missed);
        }
        h.unsent = 0;
        (!left.is_empty()).then_some(left)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pycell_wire::events::Stream;

    #[test]
    fn output_goes_by_lines_and_what_a_watch_missed_goes_at_the_end() {
        let lines = Lines::default();
        assert_eq!(lines.take(Stream::Stdout, b"one"), None);
        assert_eq!(lines.take(Stream::Stdout, b"\ntw"), Some(b"one\n".to_vec()));
        assert_eq!(
            lines.take(Stream::Stdout, b"o\nthr"),
            Some(b"two\n".to_vec())
        );
        // "three\n" was heard only in part; "four\n" not at all.
        let end = lines.finish(Stream::Stdout, "one\ntwo\nthree\nfour\n");
        assert_eq!(end, Some(b"three\nfour\n".to_vec()));
        assert_eq!(
            lines.finish(Stream::Stderr, "oops\n"),
            Some(b"oops\n".to_vec())
        );
        // Heard out of step with the answer: only what is unsent.
        let other = Lines::default();
        assert_eq!(other.take(Stream::Stdout, b"uno"), None);
        assert_eq!(other.finish(Stream::Stdout, "one\n"), Some(b"uno".to_vec()));
    }
}
