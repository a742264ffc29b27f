//! The HTTP side of `pycell mcp --http`: each connection (plain, or TLS by
//! rustls) served by hyper; each request routed: the MCP endpoint (after
//! the [`Gate`]) to rmcp's streamable HTTP service, the RFC 9728 protected
//! resource metadata, and `/healthz`. The caller a request proves goes to
//! the tool handlers in the request's extensions.

use std::convert::Infallible;
use std::sync::Arc;

use bytes::Bytes;
use http::{header, Method, Request, Response, StatusCode};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::graceful::Watcher;
use rmcp::transport::streamable_http_server::session::never::NeverSessionManager;
use rmcp::transport::streamable_http_server::StreamableHttpService;
use tokio::io::{AsyncRead, AsyncWrite};

use super::conns::{Activity, Admission, Watched};
use super::gate::{origin_allowed, scope_needed, Denial, Gate};
use crate::server::PycellServer;

/// How long a request's body may take to arrive, once its head has.
const BODY_WITHIN: std::time::Duration = std::time::Duration::from_secs(30);
/// How long a request's head may take (hyper's, for every request after
/// a connection's first; [`super::conns`] bounds the first).
const HEAD_WITHIN: std::time::Duration = std::time::Duration::from_secs(10);

/// Where RFC 9728 puts a resource's metadata.
pub const METADATA_PREFIX: &str = "/.well-known/oauth-protected-resource";

pub type Body = BoxBody<Bytes, Infallible>;

/// What answers every request; cheap to clone (one per connection).
#[derive(Clone)]
pub struct Front {
    pub gate: Arc<Gate>,
    pub mcp: StreamableHttpService<PycellServer, NeverSessionManager>,
    /// The MCP endpoint's path (`/mcp` unless --public-url says another).
    pub path: Arc<str>,
    /// The metadata document, JSON.
    pub metadata: Bytes,
    pub max_body: usize,
    /// The hosts a request's `Host` and `Origin` may name.
    pub allowed_hosts: Arc<[String]>,
    pub admission: Arc<Admission>,
    /// The calls in flight, by caller and request id.
    pub cancels: Arc<crate::server::cancels::Cancels>,
    /// The E2B-compatible endpoint (under [`super::e2b::PREFIX`]).
    pub e2b: Arc<super::e2b::E2b>,
}

impl std::fmt::Debug for Front {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Front").field("path", &self.path).finish()
    }
}

impl Front {
    /// Serve one accepted connection (HTTP/1.1 or HTTP/2) until it ends,
    /// expires (`super::conns`), or the drain `watcher` belongs to begins
    /// (then requests in flight finish and the connection closes).
    pub async fn serve_connection<S>(self, stream: S, watcher: Watcher, conn: Arc<Activity>)
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let this = Arc::clone(&conn);
        let service = hyper::service::service_fn(move |req| {
            let (front, conn) = (self.clone(), Arc::clone(&this));
            async move {
                let _in_flight = conn.request();
                Ok::<_, Infallible>(front.answer(req, &conn).await)
            }
        });
        let mut builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
        builder
            .http1()
            .timer(TokioTimer::new())
            .header_read_timeout(HEAD_WITHIN);
        builder
            .http2()
            .timer(TokioTimer::new())
            .keep_alive_interval(Some(std::time::Duration::from_secs(20)));
        let io = TokioIo::new(Watched::new(stream, Arc::clone(&conn)));
        // A connection that breaks mid-request is the client's business.
        let connection = builder.serve_connection(io, service);
        tokio::select! {
            _ = watcher.watch(connection) => {}
            _ = conn.until_expired() => {}
        }
    }

    async fn answer(&self, req: Request<Incoming>, conn: &Activity) -> Response<Body> {
        let path = req.uri().path();
        if path == &*self.path {
            return self.mcp_request(req, conn).await;
        }
        if path == "/healthz" {
            return plain(StatusCode::OK, "ok\n");
        }
        if let Some(rest) = path.strip_prefix(super::e2b::PREFIX) {
            if rest.starts_with('/') {
                let rest = rest.to_string();
                return self.e2b_request(req, &rest, conn).await;
            }
        }
        let metadata_here =
            path == METADATA_PREFIX || path.strip_prefix(METADATA_PREFIX) == Some(&*self.path);
        match (metadata_here, req.method()) {
            (true, &Method::GET) => Response::builder()
                .header(header::CONTENT_TYPE, "application/json")
                .body(Full::new(self.metadata.clone()).boxed())
                .unwrap_or_else(|_| plain(StatusCode::INTERNAL_SERVER_ERROR, "")),
            (true, _) => plain(StatusCode::METHOD_NOT_ALLOWED, "GET only\n"),
            (false, _) => plain(
                StatusCode::NOT_FOUND,
                &format!("nothing here; the MCP endpoint is {}\n", self.path),
            ),
        }
    }

    /// Check the origin, authenticate, read the body (bounded in size and
    /// time), check the scope the message needs, and hand it to rmcp
    /// with the caller in its extensions.
    async fn mcp_request(&self, req: Request<Incoming>, conn: &Activity) -> Response<Body> {
        if let Some(origin) = req.headers().get(header::ORIGIN) {
            if !origin_allowed(origin.as_bytes(), &self.allowed_hosts) {
                let m = "the Origin header names a site this server does not serve (MCP servers refuse other origins against DNS rebinding)\n";
                return plain(StatusCode::FORBIDDEN, m);
            }
        }
        let authorization = req
            .headers()
            .get(header::AUTHORIZATION)
            .map(|v| v.as_bytes());
        let caller = match self.gate.authenticate(authorization) {
            Ok(c) => c,
            Err(d) => return self.denied(&d),
        };
        if !self.admission.authenticated(conn) {
            let m = "every connection slot is taken by authenticated callers; try again shortly\n";
            return plain(StatusCode::SERVICE_UNAVAILABLE, m);
        }
        let (mut parts, body) = req.into_parts();
        let bytes = match self.read_body(body).await {
            Ok(b) => b,
            Err(answer) => return answer,
        };
        let needed = match scope_needed(&bytes) {
            Ok(n) => n,
            Err(why) => return plain(StatusCode::BAD_REQUEST, &format!("{why}\n")),
        };
        if let (Some(c), Some(needed)) = (&caller, needed) {
            if !c.scopes.run {
                return self.denied(&Denial::Scope(needed));
            }
        }
        if let Some(id) = crate::server::cancels::cancelled_request_id(&bytes) {
            // Stateless: rmcp would accept it and cancel nothing.
            self.cancels
                .cancel(caller.map(|c| c.identity().clone()), &id);
            return plain(StatusCode::ACCEPTED, "");
        }
        if let Some(c) = caller {
            parts.extensions.insert(c);
        }
        let json_body = is_json(&parts.headers);
        let answer = self
            .mcp
            .handle(Request::from_parts(parts, Full::new(bytes.clone())))
            .await;
        // rmcp answers a JSON body it cannot read as a message with 415
        // and text; JSON-RPC wants an error object (MCP: with status 400).
        if answer.status() == StatusCode::UNSUPPORTED_MEDIA_TYPE && json_body {
            return unreadable_message(&bytes).unwrap_or(answer);
        }
        answer
    }

    /// A request to the E2B endpoint: the origin checked, the caller or
    /// sandbox authenticated, the body read (bounded in size and time).
    async fn e2b_request(
        &self,
        req: Request<Incoming>,
        path: &str,
        conn: &Activity,
    ) -> Response<Body> {
        if let Some(origin) = req.headers().get(header::ORIGIN) {
            if !origin_allowed(origin.as_bytes(), &self.allowed_hosts) {
                let m = "the Origin header names a site this server does not serve\n";
                return plain(StatusCode::FORBIDDEN, m);
            }
        }
        let asker = match self.e2b.authenticate(req.headers()) {
            Ok(a) => a,
            Err(refusal) => return refusal.answer(),
        };
        if !self.admission.authenticated(conn) {
            let m = "every connection slot is taken by authenticated callers; try again shortly\n";
            return plain(StatusCode::SERVICE_UNAVAILABLE, m);
        }
        let (parts, body) = req.into_parts();
        let bytes = match self.read_body(body).await {
            Ok(b) => b,
            Err(answer) => return answer,
        };
        self.e2b.serve(asker, parts, path, bytes).await
    }

    /// The whole body: at most `max_body` bytes (rmcp's own limit,
    /// applied before anything is kept), within [`BODY_WITHIN`].
    async fn read_body(&self, body: Incoming) -> Result<Bytes, Response<Body>> {
        let collect = Limited::new(body, self.max_body).collect();
        match tokio::time::timeout(BODY_WITHIN, collect).await {
            Ok(Ok(b)) => Ok(b.to_bytes()),
            Ok(Err(e)) if e.is::<http_body_util::LengthLimitError>() => {
                let m = format!("the request is over {} bytes\n", self.max_body);
                Err(plain(StatusCode::PAYLOAD_TOO_LARGE, &m))
            }
            Ok(Err(_)) => Err(plain(
                StatusCode::BAD_REQUEST,
                "the request body broke off\n",
            )),
            Err(_) => {
                let m = format!("the request body took over {} s\n", BODY_WITHIN.as_secs());
                Err(plain(StatusCode::REQUEST_TIMEOUT, &m))
            }
        }
    }

    fn denied(&self, d: &Denial) -> Response<Body> {
        let (status, challenge) = self.gate.challenge(d);
        let text = match d {
            Denial::Missing => {
                "authentication required: send `Authorization: Bearer TOKEN`\n".to_string()
            }
            Denial::Invalid(why) => format!("{why}\n"),
            Denial::Scope(s) => format!("this call needs the {s} scope\n"),
        };
        Response::builder()
            .status(status)
            .header(header::WWW_AUTHENTICATE, challenge)
            .header(header::CONTENT_TYPE, "text/plain")
            .body(Full::new(Bytes::from(text)).boxed())
            .unwrap_or_else(|_| plain(status, ""))
    }
}

/// Whether the request says its body is JSON (`application/json`, any
/// parameters).
fn is_json(headers: &http::HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|essence| essence.trim().eq_ignore_ascii_case("application/json"))
}

/// The JSON-RPC error for a body that is no client message, with status
/// 400 (None if it is one after all, or a notification).
fn unreadable_message(body: &[u8]) -> Option<Response<Body>> {
    use crate::server::jsonrpc::answer_unparsed;
    let error = serde_json::from_slice::<rmcp::model::ClientJsonRpcMessage>(body).err()?;
    let answer = answer_unparsed(body, &error).unwrap_or_else(|| {
        let m = format!("Invalid Request: not a notification of MCP ({error})");
        crate::server::jsonrpc::error_response(None, -32600, m)
    });
    Response::builder()
        .status(StatusCode::BAD_REQUEST)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from(answer.to_string())).boxed())
        .ok()
}

fn plain(status: StatusCode, text: &str) -> Response<Body> {
    let mut r = Response::new(Full::new(Bytes::from(text.to_string())).boxed());
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        http::HeaderValue::from_static("text/plain"),
    );
    r
}

/// The protected resource metadata (RFC 9728) of `resource`.
pub fn metadata(resource: &str, issuer: Option<&str>) -> Bytes {
    let mut m = serde_json::json!({
        "resource": resource,
        "resource_name": "pycell",
        "scopes_supported": super::callers::SCOPES,
        "bearer_methods_supported": ["header"],
    });
    if let Some(issuer) = issuer {
        m["authorization_servers"] = serde_json::json!([issuer]);
    }
    Bytes::from(m.to_string())
}
