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
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::graceful::Watcher;
use rmcp::transport::streamable_http_server::session::never::NeverSessionManager;
use rmcp::transport::streamable_http_server::StreamableHttpService;
use tokio::io::{AsyncRead, AsyncWrite};

use super::gate::{scope_needed, Denial, Gate};
use crate::mcp_server::PycellServer;

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
}

impl std::fmt::Debug for Front {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Front").field("path", &self.path).finish()
    }
}

impl Front {
    /// Serve one accepted connection (HTTP/1.1 or HTTP/2) until it ends,
    /// or until the drain `watcher` belongs to begins (then requests in
    /// flight finish and the connection closes).
    pub async fn serve_connection<S>(self, stream: S, watcher: Watcher)
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let service = hyper::service::service_fn(move |req| {
            let front = self.clone();
            async move { Ok::<_, Infallible>(front.answer(req).await) }
        });
        let builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
        // A connection that breaks mid-request is the client's business.
        let connection = builder.serve_connection(TokioIo::new(stream), service);
        let _ = watcher.watch(connection).await;
    }

    async fn answer(&self, req: Request<Incoming>) -> Response<Body> {
        let path = req.uri().path();
        if path == &*self.path {
            return self.mcp_request(req).await;
        }
        if path == "/healthz" {
            return plain(StatusCode::OK, "ok\n");
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

    /// Authenticate, check the scope the message needs, and hand it to
    /// rmcp with the caller in its extensions.
    async fn mcp_request(&self, req: Request<Incoming>) -> Response<Body> {
        let authorization = req
            .headers()
            .get(header::AUTHORIZATION)
            .map(|v| v.as_bytes());
        let caller = match self.gate.authenticate(authorization) {
            Ok(c) => c,
            Err(d) => return self.denied(&d),
        };
        let (mut parts, body) = req.into_parts();
        // Bounded before it is read whole: rmcp's own limit, applied here.
        let bytes = match Limited::new(body, self.max_body).collect().await {
            Ok(b) => b.to_bytes(),
            Err(e) if e.is::<http_body_util::LengthLimitError>() => {
                let m = format!("the request is over {} bytes\n", self.max_body);
                return plain(StatusCode::PAYLOAD_TOO_LARGE, &m);
            }
            Err(_) => return plain(StatusCode::BAD_REQUEST, "the request body broke off\n"),
        };
        if let (Some(c), Some(needed)) = (&caller, scope_needed(&bytes)) {
            if !c.scopes.run {
                return self.denied(&Denial::Scope(needed));
            }
        }
        if let Some(c) = caller {
            parts.extensions.insert(c);
        }
        self.mcp
            .handle(Request::from_parts(parts, Full::new(bytes)))
            .await
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
