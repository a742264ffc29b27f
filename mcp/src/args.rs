//! The flags of `pycell mcp`, `pycell mcp-token` and `pycell gateway`
//! (the `pycell` command line flattens them in).

use std::path::PathBuf;

use clap::Args;

/// `pycell gateway`.
#[derive(Debug, Args, Clone)]
pub struct GatewayArgs {
    /// Address to listen on (HOST:PORT).
    #[arg(long, value_name = "ADDR")]
    pub listen: String,
    /// This node's pycelld socket (default: $PYCELL_SOCKET, else
    /// /run/pycell/pycell.sock).
    #[arg(long, value_name = "PATH")]
    pub socket: Option<PathBuf>,
    /// The gateway's certificate (PEM), for the name `pycell-gateway`.
    #[arg(long, value_name = "FILE")]
    pub tls_cert: PathBuf,
    /// Its private key (PEM).
    #[arg(long, value_name = "FILE")]
    pub tls_key: PathBuf,
    /// The CA whose certificates front ends present (PEM).
    #[arg(long, value_name = "FILE")]
    pub client_ca: PathBuf,
    /// Started as root: the user to serve as once the address is bound and
    /// the key read (the uid pycelld lists in front_end_uids).
    #[arg(long, value_name = "USER")]
    pub user: Option<String>,
}

/// `pycell mcp-token`.
#[derive(Debug, Args, Clone)]
pub struct McpTokenArgs {
    /// The caller's name: its identity in pycelld's queue and audit log.
    pub name: String,
    /// Scopes the token grants (pycell:run, pycell:tools); default pycell:run.
    #[arg(long = "scope", value_name = "SCOPE")]
    pub scopes: Vec<String>,
}

/// `pycell mcp`.
#[derive(Debug, Args, Clone)]
pub struct McpArgs {
    /// Policy for run_python calls that do not name one (an installed or built-in policy name).
    #[arg(long, default_value = "default", value_name = "NAME")]
    pub policy: String,
    /// Build sandboxes through pycell-jailer from this process (needs root)
    /// even if pycelld is running.
    #[arg(long)]
    pub embedded: bool,
    /// MCP servers whose tools run_python's code may call (`import
    /// pycell_tools`), in the mcpServers format MCP hosts use; this process
    /// starts them, and they never enter a sandbox.
    #[arg(long, value_name = "FILE")]
    pub tool_servers: Option<PathBuf>,
    /// A run_python call still going after SECONDS is handed off: to a
    /// client that declares MCP's tasks extension it becomes a task (the
    /// client polls it with tasks/get and stops it with tasks/cancel); for
    /// other clients a session cell goes on detached (the session's next
    /// call collects its result) and a one-shot run keeps the call waiting.
    #[arg(long, value_name = "SECONDS", default_value = "20", value_parser = hand_off_seconds)]
    pub hand_off_after: std::time::Duration,
    /// Serve the same tools over MCP's streamable HTTP transport at ADDR
    /// (host:port), for agents on other hosts, instead of stdio. Runs go
    /// through pycelld only (this process never jails, and never runs as
    /// root: see --user). Callers authenticate with --tokens and/or
    /// --oauth; --no-auth only on a loopback address. TLS with --tls-cert
    /// and --tls-key, or plain HTTP on loopback or --behind-proxy.
    #[arg(long, value_name = "ADDR", conflicts_with = "embedded")]
    pub http: Option<String>,
    /// Bearer tokens: a TOML file of [[token]] entries (name, sha256 of the
    /// token, scopes, quotas); `pycell mcp-token NAME` makes one.
    #[arg(long, value_name = "FILE", requires = "http")]
    pub tokens: Option<PathBuf>,
    /// OAuth 2.1 access tokens (JWTs) of an authorization server: a TOML
    /// file naming its issuer, its key set (JWKS file) and the audience.
    #[arg(long, value_name = "FILE", requires = "http")]
    pub oauth: Option<PathBuf>,
    /// Serve without authentication, as this process's own uid: only on a
    /// loopback address.
    #[arg(long, requires = "http", conflicts_with_all = ["tokens", "oauth"])]
    pub no_auth: bool,
    /// TLS certificate chain (PEM) for HTTPS.
    #[arg(long, value_name = "FILE", requires_all = ["http", "tls_key"])]
    pub tls_cert: Option<PathBuf>,
    /// TLS private key (PEM) for HTTPS.
    #[arg(long, value_name = "FILE", requires_all = ["http", "tls_cert"])]
    pub tls_key: Option<PathBuf>,
    /// Plain HTTP on a non-loopback address: a proxy in front of this
    /// server terminates TLS.
    #[arg(long, requires = "http", conflicts_with = "tls_cert")]
    pub behind_proxy: bool,
    /// The URL clients use (e.g. https://pycell.example.net/mcp): the
    /// OAuth audience, the protected resource metadata's `resource`, the
    /// Host header accepted and the endpoint's path. Default:
    /// http(s)://ADDR/mcp.
    #[arg(long, value_name = "URL", requires = "http")]
    pub public_url: Option<String>,
    /// Started as root: the user to serve as, once ADDR is bound and the
    /// key and token files are read.
    #[arg(long, value_name = "USER", requires = "http")]
    pub user: Option<String>,
    /// pycelld's socket (default: $PYCELL_SOCKET, else /run/pycell/pycell.sock).
    #[arg(long, value_name = "PATH", requires = "http", conflicts_with = "nodes")]
    pub socket: Option<PathBuf>,
    /// A cluster node, instead of one pycelld: NAME=unix:PATH (a socket on
    /// this host) or NAME=HOST:PORT (its `pycell gateway`, mutual TLS);
    /// repeat for each node. Runs go to the least-loaded node, sessions stay
    /// on theirs (the handle names it).
    #[arg(long = "node", value_name = "NAME=ADDR", requires = "http")]
    pub nodes: Vec<String>,
    /// Find the cluster's nodes by DNS: every address HOST has is a node's
    /// `pycell gateway` on PORT (on Kubernetes, the nodes' headless
    /// Service), asked again every second; a node no longer listed is gone
    /// (its sessions answer session_gone).
    #[arg(
        long,
        value_name = "HOST:PORT",
        requires = "http",
        conflicts_with = "socket"
    )]
    pub nodes_dns: Option<String>,
    /// This front end's certificate for gateways (PEM, of the cluster CA).
    #[arg(long, value_name = "FILE", requires_all = ["node_tls_key", "node_ca"])]
    pub node_tls_cert: Option<PathBuf>,
    /// Its private key (PEM).
    #[arg(long, value_name = "FILE", requires = "node_tls_cert")]
    pub node_tls_key: Option<PathBuf>,
    /// The CA that signs the gateways' certificates (PEM).
    #[arg(long, value_name = "FILE", requires = "node_tls_cert")]
    pub node_ca: Option<PathBuf>,
}

/// `--hand-off-after`: seconds, more than 0 and at most a day.
fn hand_off_seconds(arg: &str) -> Result<std::time::Duration, String> {
    let secs: f64 = arg
        .parse()
        .map_err(|_| format!("{arg:?} is not a number of seconds"))?;
    if !(secs > 0.0 && secs <= 86_400.0) {
        return Err(format!("{arg} s: must be more than 0 and at most 86400"));
    }
    Ok(std::time::Duration::from_secs_f64(secs))
}
