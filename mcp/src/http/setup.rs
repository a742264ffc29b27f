//! Everything `pycell mcp --http` settles before it serves, in order: who
//! may start it (not root, unless it is to become `--user`), the listening
//! socket, how callers authenticate and whether that is allowed on this
//! address, the public URL, TLS, the token and key files; then it drops
//! root, and checks that pycelld takes it as a front end. Each refusal says
//! what to change.

use std::net::{SocketAddr, TcpListener, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::callers::TokenTable;
use super::front::METADATA_PREFIX;
use super::gate::Gate;
use super::oauth::OAuth;
use super::public_url::PublicUrl;
use crate::args::McpArgs;
use crate::cluster::tunnel::{connector, TlsFiles};
use crate::cluster::{parse_node, NodeAddr};
use crate::start_error::StartError;

/// How callers authenticate, as the flags say.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AuthFlags {
    pub tokens: bool,
    pub oauth: bool,
    pub none: bool,
}

/// Whether this combination may listen on `addr`: authentication unless
/// loopback and said so; TLS unless loopback or a proxy terminates it; a
/// public URL for any address others reach.
pub fn listen_problem(
    addr: SocketAddr,
    auth: AuthFlags,
    tls: bool,
    behind_proxy: bool,
    public_url: bool,
) -> Option<String> {
    let loopback = addr.ip().is_loopback();
    if !auth.tokens && !auth.oauth && !auth.none {
        return Some("say how callers authenticate: --tokens FILE, --oauth FILE, or both (or --no-auth on a loopback address)".into());
    }
    if auth.none && !loopback {
        return Some(format!("--no-auth serves anyone who reaches {addr}: only a loopback address (127.0.0.1, ::1) may go without authentication"));
    }
    if !tls && !loopback && !behind_proxy {
        return Some(format!("plain HTTP on {addr} would carry bearer tokens in clear: give --tls-cert and --tls-key, or --behind-proxy if a proxy in front terminates TLS"));
    }
    if !loopback && !public_url {
        return Some(format!("{addr} is reached by other hosts: give --public-url (the URL they use; its host is the only Host header accepted, and it is the OAuth audience)"));
    }
    None
}

/// All that serving needs.
pub struct Setup {
    pub listener: TcpListener,
    pub tls: Option<tokio_rustls::TlsAcceptor>,
    pub gate: Arc<Gate>,
    pub public_url: PublicUrl,
    pub allowed_hosts: Vec<String>,
    pub backend: Backend,
    addr: SocketAddr,
}

/// Where runs go.
pub enum Backend {
    /// One pycelld, at this socket.
    Daemon(PathBuf),
    /// The nodes of a cluster; TLS to reach those behind a gateway.
    Cluster {
        nodes: Vec<(String, NodeAddr)>,
        /// `--nodes-dns HOST:PORT`.
        dns: Option<String>,
        tls: Option<tokio_rustls::TlsConnector>,
    },
}

impl Backend {
    fn describe(&self) -> String {
        match self {
            Backend::Daemon(socket) => format!("pycelld at {}", socket.display()),
            Backend::Cluster { nodes, dns, .. } => {
                let mut each: Vec<String> = nodes
                    .iter()
                    .map(|(name, addr)| match addr {
                        NodeAddr::Unix(p) => format!("{name} (unix:{})", p.display()),
                        NodeAddr::Tls(a) => format!("{name} ({a}, mutual TLS)"),
                    })
                    .collect();
                if let Some(name) = dns {
                    each.push(format!("every gateway {name} lists (mutual TLS)"));
                }
                format!("the nodes {}", each.join(", "))
            }
        }
    }
}

/// The `--node` flags, and the TLS they need (read while still root).
fn cluster(args: &McpArgs) -> Result<Option<Backend>, StartError> {
    if args.nodes.is_empty() && args.nodes_dns.is_none() {
        return Ok(None);
    }
    let mut nodes = Vec::new();
    for spec in &args.nodes {
        let (name, addr) = parse_node(spec)?;
        if nodes.iter().any(|(n, _)| n == &name) {
            let problem = format!("{spec:?}: another node has the name {name:?}");
            return Err(StartError::flag("--node", problem));
        }
        nodes.push((name, addr));
    }
    let remote =
        args.nodes_dns.is_some() || nodes.iter().any(|(_, a)| matches!(a, NodeAddr::Tls(_)));
    let tls = match (&args.node_tls_cert, &args.node_tls_key, &args.node_ca) {
        (Some(cert), Some(key), Some(ca)) => Some(connector(&TlsFiles {
            cert: cert.clone(),
            key: key.clone(),
            ca: ca.clone(),
        })?),
        _ if remote => return Err(StartError::Flags("nodes behind a gateway (--node NAME=HOST:PORT, --nodes-dns) need --node-tls-cert, --node-tls-key and --node-ca (mutual TLS with the cluster's CA)".into())),
        _ => None,
    };
    if let Some(name) = &args.nodes_dns {
        if !crate::cluster::is_host_port(name) {
            return Err(StartError::flag(
                "--nodes-dns",
                format!("{name:?}: write HOST:PORT"),
            ));
        }
    }
    Ok(Some(Backend::Cluster {
        nodes,
        dns: args.nodes_dns.clone(),
        tls,
    }))
}

impl std::fmt::Debug for Setup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Setup").field("addr", &self.addr).finish()
    }
}

impl Setup {
    pub fn prepare(args: &McpArgs, addr: &str) -> Result<Setup, StartError> {
        let user = crate::privileges::planned_user(
            args.user.as_deref(),
            "it parses HTTP from the network",
        )?;
        let wanted = resolve(addr)?;
        let auth = AuthFlags {
            tokens: args.tokens.is_some(),
            oauth: args.oauth.is_some(),
            none: args.no_auth,
        };
        let tls = args.tls_cert.is_some();
        if let Some(p) = listen_problem(
            wanted,
            auth,
            tls,
            args.behind_proxy,
            args.public_url.is_some(),
        ) {
            return Err(StartError::Flags(p));
        }
        crate::server::check_policy(&args.policy)?;
        let listening = format!("cannot listen on {wanted}");
        let listener = TcpListener::bind(wanted).map_err(|e| StartError::host(&listening, e))?;
        listener
            .set_nonblocking(true)
            .map_err(|e| StartError::host(&listening, e))?;
        let addr = listener
            .local_addr()
            .map_err(|e| StartError::host(listening, e))?;
        let scheme = if tls { "https" } else { "http" };
        let public_url = PublicUrl::parse(&match &args.public_url {
            Some(u) => u.clone(),
            None => format!("{scheme}://{addr}/mcp"),
        })?;
        let tls = match (&args.tls_cert, &args.tls_key) {
            (Some(cert), Some(key)) => Some(
                crate::tls::server(cert, key, None)
                    .map(tokio_rustls::TlsAcceptor::from)
                    .map_err(|e| StartError::flag("--tls-cert/--tls-key:", e.to_string()))?,
            ),
            _ => None,
        };
        let gate = Arc::new(gate(args, &public_url)?);
        let cluster = cluster(args)?;
        if let Some(user) = user {
            crate::privileges::become_user(&user)?;
        }
        let backend = match cluster {
            Some(c) => c,
            None => {
                let socket = pycell_engine::service::Backend::choose_now(false, args.socket.clone()).ok_or_else(||
                    StartError::Daemon("no pycelld socket: it sends runs to pycelld only (install the pycell package, or give --socket)".into()),
                )?;
                if !gate.open {
                    check_front_end(&socket)?;
                }
                Backend::Daemon(socket)
            }
        };
        let mut allowed_hosts = vec![public_url.host().to_string(), public_url.authority.clone()];
        if addr.ip().is_loopback() {
            allowed_hosts.extend(["localhost", "127.0.0.1", "::1"].map(String::from));
        }
        Ok(Setup {
            listener,
            tls,
            gate,
            public_url,
            allowed_hosts,
            backend,
            addr,
        })
    }

    /// The line it says when it serves (tests read the address from it).
    pub fn banner(&self) -> String {
        let g = &self.gate;
        let mut how = Vec::new();
        if let Some(t) = &g.tokens {
            how.push(format!("{} bearer tokens", t.len()));
        }
        if let Some(o) = &g.oauth {
            how.push(format!(
                "OAuth access tokens of {} for {}",
                o.issuer, o.audience
            ));
        }
        if g.open {
            how.push("no authentication".into());
        }
        format!(
            "pycell mcp: serving MCP at {} (listening on {}{}; {}); runs go to {}",
            self.public_url.url,
            self.addr,
            if self.tls.is_some() { ", TLS" } else { "" },
            how.join(" and "),
            self.backend.describe()
        )
    }
}

fn resolve(addr: &str) -> Result<SocketAddr, StartError> {
    let mut found = addr
        .to_socket_addrs()
        .map_err(|e| StartError::flag("--http", format!("{addr:?}: not HOST:PORT ({e})")))?;
    found
        .next()
        .ok_or_else(|| StartError::flag("--http", format!("{addr:?}: the name has no address")))
}

fn gate(args: &McpArgs, public_url: &PublicUrl) -> Result<Gate, StartError> {
    let tokens = args.tokens.as_deref().map(TokenTable::load).transpose()?;
    let oauth = args
        .oauth
        .as_deref()
        .map(|p| OAuth::load(p, &public_url.url))
        .transpose()?;
    Ok(Gate {
        open: args.no_auth,
        tokens,
        oauth,
        metadata_url: format!("{}{METADATA_PREFIX}{}", public_url.origin, public_url.path),
    })
}

/// pycelld takes identities from this uid (its `front_end_uids`), or
/// serving would fail on every call: say so now.
fn check_front_end(socket: &Path) -> Result<(), StartError> {
    use pycell_protocol::client::{ClientError, DaemonClient};
    match DaemonClient::connect_as(socket, Some("pycell-front-end-check")) {
        Ok(_) => Ok(()),
        Err(ClientError::Refused { message, .. }) => Err(StartError::Daemon(format!(
            "pycelld at {} refuses this front end: {message}",
            socket.display()
        ))),
        Err(e) => Err(StartError::Daemon(format!(
            "{e}: is pycelld running? (a front end sends every run to it)"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TOKENS: AuthFlags = AuthFlags {
        tokens: true,
        oauth: false,
        none: false,
    };
    const NONE: AuthFlags = AuthFlags {
        tokens: false,
        oauth: false,
        none: true,
    };

    #[test]
    fn a_public_listener_needs_authentication_tls_and_a_url() {
        let lo: SocketAddr = "127.0.0.1:8080".parse().unwrap();
        let any: SocketAddr = "0.0.0.0:8443".parse().unwrap();
        assert_eq!(listen_problem(lo, NONE, false, false, false), None);
        assert_eq!(listen_problem(lo, TOKENS, false, false, false), None);
        let neither = AuthFlags {
            tokens: false,
            ..TOKENS
        };
        assert!(listen_problem(lo, neither, false, false, false)
            .unwrap()
            .contains("say how callers authenticate"));
        assert!(listen_problem(any, NONE, true, false, true)
            .unwrap()
            .contains("only a loopback address"));
        assert!(listen_problem(any, TOKENS, false, false, true)
            .unwrap()
            .contains("in clear"));
        assert!(listen_problem(any, TOKENS, true, false, false)
            .unwrap()
            .contains("--public-url"));
        assert_eq!(listen_problem(any, TOKENS, true, false, true), None);
        assert_eq!(listen_problem(any, TOKENS, false, true, true), None);
        let v6: SocketAddr = "[::1]:80".parse().unwrap();
        assert_eq!(listen_problem(v6, NONE, false, false, false), None);
    }
}
