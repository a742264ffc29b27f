//! `pycell mcp --http ADDR`: pycell's MCP tools over MCP's streamable HTTP
//! transport (rmcp's, stateless: no protocol sessions, so clients of the
//! 2025 revisions and of 2026-07-28 alike; pycell's sessions are explicit
//! handles), for agents on other hosts.
//!
//! A front end: it authenticates each request ([`gate`]: hashed bearer
//! tokens, OAuth access tokens), counts each caller's quotas ([`limiter`])
//! and sends runs to pycelld as the caller's identity (pycelld trusts it
//! only from a uid in its `front_end_uids`; admission, sessions and the
//! audit log then go by identity). It never builds a jail itself and never
//! runs as root: HTTP and TLS from the network are parsed by hyper and
//! rustls in this unprivileged process. Started as root (to bind a low
//! port, read a key only root reads), it binds and reads first, then
//! becomes `--user` before it parses a byte.

pub(crate) mod callers;
mod conns;
mod e2b;
mod front;
mod gate;
pub(crate) mod limiter;
pub(crate) mod oauth;
pub(crate) mod public_url;
pub(crate) mod setup;
pub mod token_cmd;

use std::sync::Arc;
use std::time::Duration;

use hyper_util::server::graceful::GracefulShutdown;
use rmcp::transport::streamable_http_server::session::never::NeverSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use tokio_util::sync::CancellationToken;

use crate::args::McpArgs;
use crate::cluster::tunnel::Tunnels;
use crate::cluster::{NodeAddr, Nodes};
use crate::server::PycellServer;
use crate::start_error::StartError;
use front::Front;
use pycell_engine::service::{self, RunService};
use pycell_engine::tool_source::ToolSource;
use setup::{Backend, Setup};

/// Largest request body: the largest message any MCP front end reads.
const MAX_BODY: usize = crate::server::jsonrpc::MAX_MESSAGE;
/// How long a TLS handshake may take.
const HANDSHAKE_WITHIN: Duration = Duration::from_secs(10);
/// After SIGTERM: how long requests in flight get to finish (under
/// Kubernetes' default 30 s grace period).
const DRAIN_GRACE: Duration = Duration::from_secs(20);

/// `pycell mcp --http ADDR`.
pub fn main(args: &McpArgs, addr: &str) -> i32 {
    let setup = match Setup::prepare(args, addr) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("pycell mcp --http: {e}");
            return 2;
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("pycell-http")
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("pycell mcp --http: cannot start the async runtime: {e}");
            return 1;
        }
    };
    runtime.block_on(serve(args, setup))
}

/// The MCP server behind the front end, and the calls in flight its
/// `notifications/cancelled` reach; its callers' quotas are counted unless
/// the front is `open` (no authentication).
fn mcp_server(
    args: &McpArgs,
    sandboxes: &RunService,
    code_mode: Option<&pycell_protocol::info::ToolsInfo>,
    quotas: Option<Arc<limiter::Limiter>>,
) -> (PycellServer, Arc<crate::server::cancels::Cancels>) {
    let cancels = Arc::<crate::server::cancels::Cancels>::default();
    let mut server = PycellServer::new(sandboxes.clone(), args.policy.clone(), code_mode)
        .with_cancels(Arc::clone(&cancels))
        .with_hand_off_after(args.hand_off_after);
    if let Some(quotas) = quotas {
        server = server.with_gate(Arc::new(limiter::QuotaGate::new(quotas)));
    }
    (server, cancels)
}

async fn serve(args: &McpArgs, setup: Setup) -> i32 {
    let servers = match crate::server::load_tool_servers(args) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("pycell mcp --http: {e}");
            return 2;
        }
    };
    let code_mode = match &servers {
        Some(s) => Some(crate::server::code_mode(s, &args.policy).await),
        None => None,
    };
    let stop = CancellationToken::new();
    // Said first: what becomes of the nodes follows (tests read this line).
    eprintln!("{}", setup.banner());
    let mode = match where_runs_go(setup.backend, &stop) {
        Ok(m) => m,
        Err(e) => {
            eprintln!("pycell mcp --http: {e}");
            return 1;
        }
    };
    let tools = servers.clone().map(|s| Arc::new(s) as Arc<dyn ToolSource>);
    let sandboxes = RunService::new(mode, tools);
    let quotas = Arc::new(limiter::Limiter::default());
    let counted = (!setup.gate.open).then(|| Arc::clone(&quotas));
    let (server, cancels) = mcp_server(args, &sandboxes, code_mode.as_ref(), counted);
    let e2b = e2b_endpoint(args, &setup.gate, &sandboxes, quotas);
    let reaper = tokio::spawn(Arc::clone(&e2b).reap(stop.child_token()));
    let mut config =
        StreamableHttpServerConfig::default().with_allowed_hosts(setup.allowed_hosts.clone());
    config.legacy_session_mode = false;
    config.json_response = true;
    config.max_request_body_bytes = MAX_BODY;
    config.cancellation_token = stop.child_token();
    let mcp = StreamableHttpService::new(
        move || Ok(server.clone()),
        Arc::new(NeverSessionManager::default()),
        config,
    );
    let issuer = setup.gate.oauth.as_ref().map(|o| o.issuer.as_str());
    let front = Front {
        metadata: front::metadata(&setup.public_url.url, issuer),
        gate: Arc::clone(&setup.gate),
        mcp,
        path: Arc::from(setup.public_url.path.as_str()),
        max_body: MAX_BODY,
        allowed_hosts: Arc::from(setup.allowed_hosts.clone()),
        admission: conns::Admission::new(conns::MAX_AUTHENTICATED, conns::MAX_UNAUTHENTICATED),
        cancels,
        e2b,
    };
    let listener = match tokio::net::TcpListener::from_std(setup.listener) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("pycell mcp --http: cannot listen: {e}");
            return 1;
        }
    };
    let graceful = GracefulShutdown::new();
    accept_until_stopped(&listener, &front, setup.tls, &graceful).await;
    // Draining: no new connection; requests in flight may finish, idle
    // connections close.
    drop(listener);
    if tokio::time::timeout(DRAIN_GRACE, graceful.shutdown())
        .await
        .is_err()
    {
        eprintln!(
            "pycell mcp --http: requests still running after {} s are cut off",
            DRAIN_GRACE.as_secs()
        );
    }
    stop.cancel();
    // The E2B sandboxes end with the front end that holds their tokens.
    let _ = reaper.await;
    sandboxes.shutdown(Duration::from_secs(5)).await;
    if let Some(servers) = servers {
        servers.shutdown().await;
    }
    0
}

/// The E2B endpoint over `sandboxes`, counting in `quotas` as the MCP
/// endpoint does (the callers' quotas are one, whichever endpoint they
/// call).
fn e2b_endpoint(
    args: &McpArgs,
    gate: &Arc<gate::Gate>,
    sandboxes: &RunService,
    quotas: Arc<limiter::Limiter>,
) -> Arc<e2b::E2b> {
    Arc::new(e2b::E2b {
        service: sandboxes.clone(),
        sandboxes: e2b::sandboxes::Sandboxes::default(),
        gate: Arc::clone(gate),
        limiter: quotas,
        default_policy: args.policy.clone(),
    })
}

/// The mode of the sandboxes: one pycelld, or a cluster's nodes (those
/// behind a gateway reached through tunnels), watched until `stop`.
fn where_runs_go(
    backend: Backend,
    stop: &CancellationToken,
) -> Result<service::Backend, StartError> {
    let (nodes, dns, tls) = match backend {
        Backend::Daemon(socket) => return Ok(service::Backend::Daemon(socket)),
        Backend::Cluster { nodes, dns, tls } => (nodes, dns, tls),
    };
    let tunnels = tls.map(Tunnels::new).transpose()?;
    let mut sockets = Vec::new();
    for (name, addr) in nodes {
        let socket = match (addr, &tunnels) {
            (NodeAddr::Unix(path), _) => path,
            (NodeAddr::Tls(remote), Some(t)) => t.open(&name, remote)?,
            (NodeAddr::Tls(_), None) => {
                let problem = format!("{name}: no TLS to reach it");
                return Err(StartError::flag("--node", problem));
            }
        };
        sockets.push((name, socket));
    }
    if dns.is_some() && tunnels.is_none() {
        let needs = "--nodes-dns needs the node TLS flags";
        return Err(StartError::Flags(needs.into()));
    }
    let reach = tunnels.map(|t| Arc::new(t) as Arc<dyn pycell_engine::cluster::Reach>);
    let nodes = Nodes::new(sockets, dns, reach);
    tokio::spawn(Arc::clone(&nodes).watch(stop.clone()));
    Ok(service::Backend::Cluster(nodes))
}

/// Accept connections until SIGTERM or SIGINT; which are kept, and how
/// long, is `conns`'s.
async fn accept_until_stopped(
    listener: &tokio::net::TcpListener,
    front: &Front,
    tls: Option<tokio_rustls::TlsAcceptor>,
    graceful: &GracefulShutdown,
) {
    let Ok(mut until) = crate::serving::UntilStopped::new() else {
        eprintln!("pycell mcp --http: cannot handle signals");
        return;
    };
    loop {
        let Some(stream) = until.accept(listener).await else {
            return;
        };
        let conn = front.admission.admit();
        let (front, tls, watcher) = (front.clone(), tls.clone(), graceful.watcher());
        tokio::spawn(async move {
            match tls {
                None => front.serve_connection(stream, watcher, conn).await,
                Some(acceptor) => {
                    let handshake = tokio::time::timeout(HANDSHAKE_WITHIN, acceptor.accept(stream));
                    let shaken = tokio::select! {
                        s = handshake => s,
                        _ = conn.until_expired() => return,
                    };
                    if let Ok(Ok(s)) = shaken {
                        front.serve_connection(s, watcher, conn).await;
                    }
                }
            }
        });
    }
}
