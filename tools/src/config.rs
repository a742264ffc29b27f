//! The upstream MCP servers a client offers its runs, in the format MCP
//! hosts already use (`pycell mcp --tool-servers FILE`):
//!
//! ```json
//! {"mcpServers": {
//!   "time":  {"command": "uvx", "args": ["mcp-server-time"], "env": {}, "cwd": "/srv",
//!             "allowTools": ["get_*"]},
//!   "files": {"url": "https://files.example.net/mcp", "headers": {"Authorization": "Bearer ..."}}
//! }}
//! ```
//!
//! A stdio server has `command` (and maybe `args`, `env`, `cwd`); a
//! streamable-HTTP one has `url` (and maybe `headers`). `allowTools` narrows
//! what code may call on that server (globs; every tool it lists when
//! absent). Keys other MCP hosts write (`type`, `disabled`, ...) are
//! accepted where they agree with the rest; unknown keys are refused, so
//! that a misspelt `allowTools` never silently allows everything.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::Deserialize;

use crate::allow::Pattern;
use crate::names;

/// The most servers one file may name.
pub const MAX_SERVERS: usize = 64;

/// The largest configuration file read.
pub const MAX_CONFIG_BYTES: usize = 1 << 20;

/// What a client's file says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolServers {
    /// By name, as in the file.
    pub servers: BTreeMap<String, ServerConfig>,
}

/// One upstream server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerConfig {
    pub transport: Transport,
    /// The tools code may call on it (None: every tool it lists).
    pub allow_tools: Option<Vec<Pattern>>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Transport {
    /// A child process speaking MCP on its stdin and stdout.
    Stdio {
        command: String,
        args: Vec<String>,
        env: BTreeMap<String, String>,
        cwd: Option<PathBuf>,
    },
    /// A streamable-HTTP endpoint.
    Http {
        url: String,
        headers: BTreeMap<String, String>,
    },
}

/// Why a file was refused: where in it, what is wrong, what to do.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{origin}: {at}: {problem}")]
pub struct ConfigError {
    pub origin: String,
    /// `mcpServers.time.args`, or `(file)`.
    pub at: String,
    pub problem: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    #[serde(rename = "mcpServers")]
    mcp_servers: BTreeMap<String, RawServer>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawServer {
    #[serde(rename = "type")]
    kind: Option<String>,
    command: Option<String>,
    #[serde(default)]
    args: Vec<String>,
    #[serde(default)]
    env: BTreeMap<String, String>,
    cwd: Option<PathBuf>,
    url: Option<String>,
    #[serde(default)]
    headers: BTreeMap<String, String>,
    #[serde(rename = "allowTools")]
    allow_tools: Option<Vec<String>>,
    #[serde(default)]
    disabled: bool,
}

/// Read a client's file (`origin` names it in errors).
pub fn parse(text: &str, origin: &str) -> Result<ToolServers, ConfigError> {
    let err = |at: &str, problem: String| ConfigError {
        origin: origin.to_string(),
        at: at.to_string(),
        problem,
    };
    if text.len() > MAX_CONFIG_BYTES {
        return Err(err(
            "(file)",
            format!(
                "it is {} bytes, more than the {MAX_CONFIG_BYTES} read",
                text.len()
            ),
        ));
    }
    let raw: RawFile = serde_json::from_str(text).map_err(|e| {
        err(
            "(file)",
            format!("{e}; expected {{\"mcpServers\": {{NAME: {{\"command\": ...}} or {{\"url\": ...}}}}}}"),
        )
    })?;
    if raw.mcp_servers.len() > MAX_SERVERS {
        return Err(err(
            "mcpServers",
            format!(
                "{} servers, more than the {MAX_SERVERS} allowed",
                raw.mcp_servers.len()
            ),
        ));
    }
    let mut servers = BTreeMap::new();
    let mut python_names = BTreeMap::new();
    for (name, server) in raw.mcp_servers {
        let at = format!("mcpServers.{name}");
        if server.disabled {
            continue;
        }
        names::check_server_name(&name).map_err(|p| err(&at, p.to_string()))?;
        if let Some(other) = python_names.insert(names::python_name(&name), name.clone()) {
            return Err(err(
                &at,
                format!("its Python name is the same as {other:?}'s; rename one of them"),
            ));
        }
        let config = server_config(server).map_err(|(key, p)| err(&format!("{at}{key}"), p))?;
        servers.insert(name, config);
    }
    Ok(ToolServers { servers })
}

/// One entry, checked; on error, the key (`.url`) and the problem.
fn server_config(raw: RawServer) -> Result<ServerConfig, (String, String)> {
    let transport = match (raw.command, raw.url) {
        (Some(command), None) => {
            if !raw.headers.is_empty() {
                return Err((
                    ".headers".into(),
                    "headers are for an HTTP server (url), not a command".into(),
                ));
            }
            if command.is_empty() || command.contains('\0') {
                return Err((".command".into(), "must be a program name or path".into()));
            }
            Transport::Stdio {
                command,
                args: raw.args,
                env: raw.env,
                cwd: raw.cwd,
            }
        }
        (None, Some(url)) => {
            if !raw.args.is_empty() || !raw.env.is_empty() || raw.cwd.is_some() {
                return Err((
                    ".url".into(),
                    "args, env and cwd are for a command, not an HTTP server".into(),
                ));
            }
            if !(url.starts_with("https://") || url.starts_with("http://")) {
                return Err((
                    ".url".into(),
                    format!("{url:?} is not an http:// or https:// URL"),
                ));
            }
            Transport::Http {
                url,
                headers: raw.headers,
            }
        }
        (Some(_), Some(_)) => {
            return Err((
                String::new(),
                "give either command (a stdio server) or url (an HTTP server), not both".into(),
            ))
        }
        (None, None) => {
            return Err((
                String::new(),
                "give command (a stdio server) or url (an HTTP server)".into(),
            ))
        }
    };
    let kind_fits = matches!(
        (raw.kind.as_deref(), &transport),
        (None, _)
            | (Some("stdio"), Transport::Stdio { .. })
            | (
                Some("http" | "streamable-http" | "streamableHttp"),
                Transport::Http { .. }
            )
    );
    if !kind_fits {
        return Err((
            ".type".into(),
            format!(
                "{:?} does not match the entry (stdio has command, http has url)",
                raw.kind.unwrap_or_default()
            ),
        ));
    }
    let allow_tools = match raw.allow_tools {
        None => None,
        Some(list) => Some(
            list.iter()
                .map(|p| Pattern::new(p))
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| (".allowTools".to_string(), e.to_string()))?,
        ),
    };
    Ok(ServerConfig {
        transport,
        allow_tools,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stdio_and_http_servers_are_read_as_hosts_write_them() {
        let s = parse(
            r#"{"mcpServers": {
                "time": {"command": "uvx", "args": ["mcp-server-time"], "allowTools": ["get_*"]},
                "files": {"type": "http", "url": "https://files.example.net/mcp", "headers": {"A": "b"}},
                "off": {"command": "x", "disabled": true}
            }}"#,
            "servers.json",
        )
        .unwrap();
        assert_eq!(s.servers.len(), 2, "a disabled server is left out");
        let time = &s.servers["time"];
        assert!(
            matches!(&time.transport, Transport::Stdio { command, args, .. } if command == "uvx" && args == &["mcp-server-time"])
        );
        assert_eq!(time.allow_tools.as_ref().unwrap()[0].as_str(), "get_*");
        assert!(
            matches!(&s.servers["files"].transport, Transport::Http { url, .. } if url.ends_with("/mcp"))
        );
        assert_eq!(s.servers["files"].allow_tools, None);
    }

    #[test]
    fn bad_entries_say_where_and_what_to_do() {
        let e = |text: &str| parse(text, "f.json").unwrap_err().to_string();
        assert!(e("{}").contains("mcpServers"), "{}", e("{}"));
        let typo = e(r#"{"mcpServers": {"t": {"command": "x", "allowtools": []}}}"#);
        assert!(typo.contains("allowtools"), "{typo}");
        let both = e(r#"{"mcpServers": {"t": {"command": "x", "url": "https://a.example.net"}}}"#);
        assert!(
            both.starts_with("f.json: mcpServers.t: give either"),
            "{both}"
        );
        let neither = e(r#"{"mcpServers": {"t": {}}}"#);
        assert!(neither.contains("give command"), "{neither}");
        let url = e(r#"{"mcpServers": {"t": {"url": "file:///etc/passwd"}}}"#);
        assert!(url.contains("mcpServers.t.url"), "{url}");
        let kind = e(r#"{"mcpServers": {"t": {"type": "http", "command": "x"}}}"#);
        assert!(kind.contains("mcpServers.t.type"), "{kind}");
        let glob = e(r#"{"mcpServers": {"t": {"command": "x", "allowTools": [""]}}}"#);
        assert!(glob.contains("mcpServers.t.allowTools"), "{glob}");
        let clash = e(r#"{"mcpServers": {"a-b": {"command": "x"}, "a_b": {"command": "y"}}}"#);
        assert!(clash.contains("same as"), "{clash}");
        let name = e(r#"{"mcpServers": {"": {"command": "x"}}}"#);
        assert!(name.contains("mcpServers."), "{name}");
    }

    #[test]
    fn a_file_too_large_or_with_too_many_servers_is_refused_before_it_is_read() {
        let big = " ".repeat(MAX_CONFIG_BYTES + 1);
        assert!(parse(&big, "f").unwrap_err().problem.contains("bytes"));
        let many: Vec<String> = (0..=MAX_SERVERS)
            .map(|i| format!("\"s{i}\": {{\"command\": \"x\"}}"))
            .collect();
        let text = format!("{{\"mcpServers\": {{{}}}}}", many.join(","));
        assert!(parse(&text, "f").unwrap_err().problem.contains("servers"));
    }
}
