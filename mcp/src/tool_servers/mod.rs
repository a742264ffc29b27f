//! Code mode, the client's side: the MCP servers its `--tool-servers FILE`
//! names, started by this process (with its credentials and environment;
//! never by pycelld, never shared with another user), their tools listed
//! into the [`Catalog`] a run is offered, and the calls its code makes
//! (checked by whoever serves the jail's channel: this process when it is
//! the embedded daemon, pycelld otherwise) forwarded to them.
//!
//! A server is started when first needed and again after it crashed (the
//! call in flight then fails; later runs get a new one). Each child is
//! killed when this process exits, however it exits (its parent-death
//! signal), and its stdin closes with us, which ends stdio servers.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

mod transport;

use rmcp::model::{
    CallToolRequest, CallToolRequestParams, CallToolResult, ClientRequest, ContentBlock,
    ServerResult,
};
use rmcp::service::{PeerRequestOptions, RunningService, ServiceError};
use rmcp::{RoleClient, ServiceExt};
use serde_json::{json, Map, Value};
use tokio::sync::Mutex;

use pycell_engine::tool_source::{CallLimits, ToolSource};
use pycell_tools::allow::Pattern;
use pycell_tools::catalog::{Catalog, CatalogServer, CatalogTool};
use pycell_tools::config::{self, ServerConfig, Transport};
use pycell_tools::frames::{FailureKind, ToolFailure};
use pycell_tools::service::{timed_out, CallFuture, ToolLimits, Upstream, SERVER_START_ALLOWANCE};

type Client = RunningService<RoleClient, ()>;

/// The client's tool servers.
#[derive(Clone)]
pub struct ToolServers {
    servers: Arc<BTreeMap<String, Server>>,
    origin: String,
}

impl std::fmt::Debug for ToolServers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ToolServers")
            .field("origin", &self.origin)
            .field("servers", &self.servers.keys().collect::<Vec<_>>())
            .finish()
    }
}

struct Server {
    config: ServerConfig,
    state: Mutex<State>,
}

enum State {
    Stopped,
    Running {
        client: Arc<Client>,
        tools: Vec<CatalogTool>,
    },
}

/// Why a tool servers file cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("{}: {error}", path.display())]
    Read {
        path: std::path::PathBuf,
        error: std::io::Error,
    },
    #[error(transparent)]
    Config(#[from] config::ConfigError),
}

impl ToolServers {
    /// Read `path` (the mcpServers format); nothing is started yet.
    pub fn load(path: &Path) -> Result<ToolServers, LoadError> {
        let origin = path.display().to_string();
        let text = read_bounded(path).map_err(|error| LoadError::Read {
            path: path.to_path_buf(),
            error,
        })?;
        let parsed = config::parse(&text, &origin)?;
        let servers = parsed
            .servers
            .into_iter()
            .map(|(name, config)| {
                let state = Mutex::new(State::Stopped);
                (name, Server { config, state })
            })
            .collect();
        Ok(ToolServers {
            servers: Arc::new(servers),
            origin,
        })
    }

    /// Every server's tools (each started if it is not running, all at
    /// once); a server that cannot start is listed as unavailable, why
    /// included, and tried again next time.
    pub async fn catalog(&self) -> Catalog {
        let listings = self.servers.iter().map(|(name, server)| async move {
            match tokio::time::timeout(SERVER_START_ALLOWANCE, server.running(name)).await {
                Ok(Ok((_, tools))) => CatalogServer {
                    name: name.clone(),
                    tools,
                    unavailable: None,
                },
                Ok(Err(why)) => unavailable(name, why.to_string()),
                Err(_) => unavailable(
                    name,
                    format!(
                        "it did not start within {} s",
                        SERVER_START_ALLOWANCE.as_secs()
                    ),
                ),
            }
        });
        Catalog {
            servers: futures::future::join_all(listings).await,
        }
    }

    /// Stop every server (each is killed if it does not end by itself).
    pub async fn shutdown(&self) {
        for server in self.servers.values() {
            let client = match std::mem::replace(&mut *server.state.lock().await, State::Stopped) {
                State::Running { client, .. } => client,
                State::Stopped => continue,
            };
            if let Ok(client) = Arc::try_unwrap(client) {
                let _ = tokio::time::timeout(Duration::from_secs(5), client.cancel()).await;
            }
        }
    }

    /// Call `tool` of `server`, starting the server first if it is not
    /// running (within [`SERVER_START_ALLOWANCE`]); `call_timeout` counts
    /// from when it is up, so a server restarted after a crash does not
    /// cost its next call the time it took to start.
    async fn call_tool(
        &self,
        server: String,
        tool: String,
        arguments: Map<String, Value>,
        limits: CallLimits,
    ) -> Result<Value, ToolFailure> {
        let s = self
            .servers
            .get(&server)
            .ok_or_else(|| failure(FailureKind::Unknown, format!("no tool server {server:?}")))?;
        let unavailable = |why: String| {
            failure(
                FailureKind::UpstreamFailed,
                format!("{server} is unavailable: {why}"),
            )
        };
        let (client, _) = tokio::time::timeout(SERVER_START_ALLOWANCE, s.running(&server))
            .await
            .map_err(|_| {
                let secs = SERVER_START_ALLOWANCE.as_secs();
                unavailable(format!("it did not start within {secs} s"))
            })?
            .map_err(|why| unavailable(why.to_string()))?;
        let limit = limits.timeout.unwrap_or(SERVER_START_ALLOWANCE);
        match send_call(&client, tool.clone(), arguments, limit, limits.max_result).await {
            Ok(ServerResult::CallToolResult(result)) => tool_value(&server, &tool, result),
            Ok(_) => Err(failure(
                FailureKind::UpstreamFailed,
                format!("{server}/{tool}: the server answered with no tool result"),
            )),
            Err(ServiceError::Timeout { .. }) => Err(timed_out(&server, &tool, limit)),
            Err(ServiceError::McpError(e)) if transport::is_too_large(&e) => Err(failure(
                FailureKind::Limit,
                format!("{server}/{tool}: {}", e.message),
            )),
            Err(e) => {
                // Its connection is broken (it crashed, or sent what is
                // not MCP): the next call starts it again.
                s.forget(&client).await;
                Err(failure(
                    FailureKind::UpstreamFailed,
                    format!("{server}/{tool}: the server failed ({e}); it is restarted for the next call"),
                ))
            }
        }
    }
}

/// `tools/call` of `tool`, answered within `limit` (else cancelled, as
/// MCP says), its answer measured against `max_result` before it is
/// parsed (see [`transport`]).
async fn send_call(
    client: &Client,
    tool: String,
    arguments: Map<String, Value>,
    limit: Duration,
    max_result: Option<u64>,
) -> Result<ServerResult, ServiceError> {
    let params = CallToolRequestParams::new(tool).with_arguments(arguments);
    let mut request = CallToolRequest::new(params);
    if let Some(max) = max_result {
        request.extensions.insert(transport::ResultCap(max));
    }
    let mut options = PeerRequestOptions::no_options();
    options.timeout = Some(limit);
    client
        .send_request_with_option(ClientRequest::CallToolRequest(request), options)
        .await?
        .await_response()
        .await
}

impl ToolSource for ToolServers {
    fn catalog(&self) -> futures::future::BoxFuture<'_, Catalog> {
        Box::pin(ToolServers::catalog(self))
    }

    fn call_checked(
        &self,
        server: String,
        tool: String,
        arguments: Map<String, Value>,
        limits: CallLimits,
    ) -> CallFuture {
        let this = self.clone();
        Box::pin(async move { this.call_tool(server, tool, arguments, limits).await })
    }

    fn shutdown(&self) -> futures::future::BoxFuture<'_, ()> {
        Box::pin(ToolServers::shutdown(self))
    }
}

impl Upstream for ToolServers {
    fn call(
        &self,
        server: &str,
        tool: &str,
        arguments: Map<String, Value>,
        limits: ToolLimits,
    ) -> CallFuture {
        let this = self.clone();
        let (server, tool) = (server.to_string(), tool.to_string());
        Box::pin(async move {
            let limits = CallLimits {
                timeout: Some(limits.call_timeout),
                max_result: Some(limits.max_result),
            };
            this.call_tool(server, tool, arguments, limits).await
        })
    }
}

impl Server {
    /// The running client and its tools, starting it if need be.
    async fn running(&self, name: &str) -> Result<(Arc<Client>, Vec<CatalogTool>), Unavailable> {
        let mut state = self.state.lock().await;
        if let State::Running { client, tools } = &*state {
            if !client.is_closed() {
                return Ok((Arc::clone(client), tools.clone()));
            }
        }
        *state = State::Stopped;
        let client = Arc::new(start(name, &self.config.transport).await?);
        let listed = client
            .list_all_tools()
            .await
            .map_err(|e| Unavailable::Listing(e.to_string()))?;
        let allow = self.config.allow_tools.as_deref();
        let tools: Vec<CatalogTool> = listed.into_iter().map(|t| catalog_tool(t, allow)).collect();
        *state = State::Running {
            client: Arc::clone(&client),
            tools: tools.clone(),
        };
        Ok((client, tools))
    }

    /// Drop `client` if it is still the running one.
    async fn forget(&self, client: &Arc<Client>) {
        let mut state = self.state.lock().await;
        if matches!(&*state, State::Running { client: c, .. } if Arc::ptr_eq(c, client)) {
            *state = State::Stopped;
        }
    }
}

/// Why a tool server cannot be used now (said to the run that asked; the
/// server's command line is told only on our stderr).
#[derive(Debug, thiserror::Error)]
pub enum Unavailable {
    #[error("starting it failed: {0}")]
    Start(std::io::Error),
    #[error("{name}: the MCP handshake failed: {why}")]
    Handshake { name: String, why: String },
    #[error("{0}: streamable-HTTP tool servers are not supported by this pycell yet; run the server over stdio")]
    Http(String),
    #[error("listing its tools failed: {0}")]
    Listing(String),
}

/// Start a server and do MCP's handshake with it.
async fn start(name: &str, transport: &Transport) -> Result<Client, Unavailable> {
    match transport {
        Transport::Stdio {
            command,
            args,
            env,
            cwd,
        } => {
            let mut cmd = std::process::Command::new(command);
            cmd.args(args).envs(env);
            if let Some(dir) = cwd {
                cmd.current_dir(dir);
            }
            pycell_syscall::die_with_parent(&mut cmd);
            let child = tokio::process::Command::from(cmd)
                .stdin(std::process::Stdio::piped())
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::inherit())
                .kill_on_drop(true)
                .spawn()
                .and_then(transport::ChildTransport::new)
                .map_err(|e| {
                    // The command is the client's own business, told on its
                    // stderr; the jail (which sees the error) gets no host path.
                    eprintln!("pycell: tool server {name}: starting {command:?} failed: {e}");
                    Unavailable::Start(e)
                })?;
            ().serve(child).await.map_err(|e| Unavailable::Handshake {
                name: name.to_string(),
                why: e.to_string(),
            })
        }
        Transport::Http { url, .. } => Err(Unavailable::Http(url.to_string())),
    }
}

fn catalog_tool(t: rmcp::model::Tool, allow: Option<&[Pattern]>) -> CatalogTool {
    let client_allows = allow.is_none_or(|list| list.iter().any(|p| p.matches(&t.name)));
    CatalogTool {
        name: t.name.to_string(),
        description: t.description.map(|d| d.to_string()).unwrap_or_default(),
        input_schema: Value::Object((*t.input_schema).clone()),
        client_allows,
    }
}

fn unavailable(name: &str, why: String) -> CatalogServer {
    CatalogServer {
        name: name.to_string(),
        tools: Vec::new(),
        unavailable: Some(why),
    }
}

fn failure(code: FailureKind, message: String) -> ToolFailure {
    ToolFailure { code, message }
}

/// A tool's result as a Python value: its structured content if it gave
/// one; else its text, with its images when it sent any.
fn tool_value(server: &str, tool: &str, r: CallToolResult) -> Result<Value, ToolFailure> {
    let mut texts = Vec::new();
    let mut images = Vec::new();
    for block in &r.content {
        match block {
            ContentBlock::Text(t) => texts.push(t.text.clone()),
            ContentBlock::Image(i) => {
                images.push(json!({"mime_type": i.mime_type, "data": i.data}))
            }
            _ => {}
        }
    }
    let text = texts.join("\n");
    if r.is_error == Some(true) {
        let message = match text.is_empty() {
            true => format!("{server}/{tool} failed"),
            false => format!("{server}/{tool}: {text}"),
        };
        return Err(failure(FailureKind::ToolFailed, message));
    }
    if let Some(v) = r.structured_content {
        return Ok(v);
    }
    Ok(match images.is_empty() {
        true => Value::String(text),
        false => json!({"text": text, "images": images}),
    })
}

/// The file, refused past the size the format allows (read a byte
/// over it, which the parser refuses).
fn read_bounded(path: &Path) -> std::io::Result<String> {
    use std::io::Read;
    let mut text = String::new();
    std::fs::File::open(path)?
        .take(config::MAX_CONFIG_BYTES as u64 + 1)
        .read_to_string(&mut text)?;
    Ok(text)
}
