//! What a run's code may call: the client's [`Catalog`] (its servers and
//! their tools, as the servers listed them, each marked with the verdict
//! of the client's `allowTools`), and the [`Toolbox`] made of it under a
//! policy's rules, which answers the jail's listings and checks each call
//! before it goes out: the tool exists, both the policy and the client
//! allow it, its arguments fit its input schema.

use std::sync::OnceLock;

use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};

use crate::allow::{decide, Denied, Rule};
use crate::frames::{FailureKind, ToolFailure};
use crate::names::{check_server_name, python_name, ServerNameError};
use crate::schema::{InputSchema, UnusableSchema};

/// The most tools one catalog may list, over all its servers.
pub const MAX_TOOLS: usize = 2048;
/// The longest tool name.
pub const MAX_TOOL_NAME: usize = 128;
/// The most servers one catalog may list.
pub const MAX_SERVERS: usize = 64;

/// The client's servers and their tools.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Catalog {
    pub servers: Vec<CatalogServer>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CatalogServer {
    pub name: String,
    pub tools: Vec<CatalogTool>,
    /// Why its tools could not be listed (it did not start, say).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unavailable: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CatalogTool {
    pub name: String,
    #[serde(default)]
    pub description: String,
    pub input_schema: Value,
    /// Whether the client's `allowTools` lets code call it.
    pub client_allows: bool,
}

/// What is wrong with a client's catalog.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CatalogError {
    #[error("{0} servers, more than the {MAX_SERVERS} a catalog may list")]
    TooManyServers(usize),
    #[error("{0} tools, more than the {MAX_TOOLS} a catalog may list")]
    TooManyTools(usize),
    #[error(transparent)]
    ServerName(#[from] ServerNameError),
    #[error("two servers have the Python name {0:?}")]
    SamePythonName(String),
    #[error("{0}: a tool's name must have 1 to {MAX_TOOL_NAME} characters")]
    ToolName(String),
}

/// Whether a catalog of `servers` servers with these numbers of tools is
/// within a catalog's bounds (checked before anything is made of it).
pub fn check_counts(
    servers: usize,
    tools: impl Iterator<Item = usize>,
) -> Result<(), CatalogError> {
    if servers > MAX_SERVERS {
        return Err(CatalogError::TooManyServers(servers));
    }
    let tools: usize = tools.sum();
    if tools > MAX_TOOLS {
        return Err(CatalogError::TooManyTools(tools));
    }
    Ok(())
}

impl Catalog {
    /// Whether a catalog from a client is well formed: names, counts.
    pub fn check(&self) -> Result<(), CatalogError> {
        check_counts(
            self.servers.len(),
            self.servers.iter().map(|s| s.tools.len()),
        )?;
        let mut names = std::collections::BTreeSet::new();
        for s in &self.servers {
            check_server_name(&s.name)?;
            if !names.insert(python_name(&s.name)) {
                return Err(CatalogError::SamePythonName(python_name(&s.name)));
            }
            for t in &s.tools {
                if t.name.is_empty() || t.name.len() > MAX_TOOL_NAME {
                    return Err(CatalogError::ToolName(s.name.clone()));
                }
            }
        }
        Ok(())
    }
}

/// A tool as a run sees it.
#[derive(Debug)]
struct Tool {
    name: String,
    python_name: String,
    description: String,
    input_schema: Value,
    verdict: Result<(), Denied>,
    /// Compiled at its first call.
    schema: OnceLock<Result<InputSchema, UnusableSchema>>,
}

#[derive(Debug)]
struct Server {
    name: String,
    python_name: String,
    tools: Vec<Tool>,
    unavailable: Option<String>,
}

/// A catalog under a policy's rules.
#[derive(Debug)]
pub struct Toolbox {
    servers: Vec<Server>,
}

impl Toolbox {
    pub fn new(catalog: &Catalog, policy: &[Rule]) -> Toolbox {
        let servers = catalog
            .servers
            .iter()
            .map(|s| Server {
                name: s.name.clone(),
                python_name: python_name(&s.name),
                unavailable: s.unavailable.clone(),
                tools: unique_names(&s.tools)
                    .into_iter()
                    .map(|(t, python_name)| Tool {
                        verdict: verdict(policy, &s.name, t),
                        name: t.name.clone(),
                        python_name,
                        description: t.description.clone(),
                        input_schema: t.input_schema.clone(),
                        schema: OnceLock::new(),
                    })
                    .collect(),
            })
            .collect();
        Toolbox { servers }
    }

    /// Whether any tool may be called at all.
    pub fn any_callable(&self) -> bool {
        self.callable().next().is_some()
    }

    fn callable(&self) -> impl Iterator<Item = (&Server, &Tool)> {
        self.servers.iter().flat_map(|s| {
            s.tools
                .iter()
                .filter(|t| t.verdict.is_ok())
                .map(move |t| (s, t))
        })
    }

    /// `list_servers`: each server with its callable tools.
    pub fn listing(&self) -> Value {
        let servers: Vec<Value> = self
            .servers
            .iter()
            .map(|s| {
                json!({
                    "name": s.name,
                    "python_name": s.python_name,
                    "tools": s.tools.iter().filter(|t| t.verdict.is_ok()).map(tool_json).collect::<Vec<_>>(),
                })
            })
            .collect();
        Value::Array(servers)
    }

    /// `list_tools`: one server's callable tools.
    pub fn tools_of(&self, server: &str) -> Result<Value, ToolFailure> {
        let s = self.server(server)?;
        let tools = s.tools.iter().filter(|t| t.verdict.is_ok());
        Ok(Value::Array(tools.map(tool_json).collect()))
    }

    /// The Python signature of each callable tool, for the model:
    /// `pycell_tools.time.get_current_time(*, timezone: str)  # Get ...`.
    pub fn signatures(&self) -> Vec<String> {
        self.callable().map(|(s, t)| signature(s, t)).collect()
    }

    /// Check a call before it goes out.
    pub fn check_call(
        &self,
        server: &str,
        tool: &str,
        arguments: &Map<String, Value>,
    ) -> Result<(), ToolFailure> {
        let s = self.server(server)?;
        if let Some(why) = &s.unavailable {
            return Err(fail(
                FailureKind::UpstreamFailed,
                format!("server {server:?} is unavailable: {why}"),
            ));
        }
        let t = s.tools.iter().find(|t| t.name == tool).ok_or_else(|| {
            let known: Vec<&str> = s
                .tools
                .iter()
                .filter(|t| t.verdict.is_ok())
                .map(|t| t.name.as_str())
                .collect();
            fail(
                FailureKind::Unknown,
                format!(
                    "server {server:?} has no tool {tool:?}; its callable tools: {}",
                    known.join(", ")
                ),
            )
        })?;
        t.verdict
            .clone()
            .map_err(|d| fail(FailureKind::Denied, d.to_string()))?;
        let schema = t.schema.get_or_init(|| InputSchema::new(&t.input_schema));
        let schema = schema
            .as_ref()
            .map_err(|e| fail(FailureKind::UpstreamFailed, format!("{server}/{tool}: {e}")))?;
        schema
            .check(&Value::Object(arguments.clone()))
            .map_err(|e| fail(FailureKind::BadArguments, format!("{server}/{tool}: {e}")))
    }

    fn server(&self, name: &str) -> Result<&Server, ToolFailure> {
        self.servers.iter().find(|s| s.name == name).ok_or_else(|| {
            let known: Vec<&str> = self.servers.iter().map(|s| s.name.as_str()).collect();
            fail(
                FailureKind::Unknown,
                format!("no tool server {name:?}; the servers: {}", known.join(", ")),
            )
        })
    }
}

fn fail(code: FailureKind, message: String) -> ToolFailure {
    ToolFailure { code, message }
}

fn verdict(policy: &[Rule], server: &str, tool: &CatalogTool) -> Result<(), Denied> {
    decide(policy, None, server, &tool.name)?;
    if !tool.client_allows {
        return Err(Denied::Client {
            server: server.to_string(),
            tool: tool.name.clone(),
        });
    }
    Ok(())
}

/// Each tool with a Python name no other tool of its server has.
fn unique_names(tools: &[CatalogTool]) -> Vec<(&CatalogTool, String)> {
    let mut taken = std::collections::BTreeSet::new();
    tools
        .iter()
        .map(|t| {
            let mut name = python_name(&t.name);
            while !taken.insert(name.clone()) {
                name.push('_');
            }
            (t, name)
        })
        .collect()
}

fn tool_json(t: &Tool) -> Value {
    json!({
        "name": t.name,
        "python_name": t.python_name,
        "description": t.description,
        "input_schema": t.input_schema,
    })
}

/// `pycell_tools.S.T(*, a: str, b: int = None)  # first line of its description`.
fn signature(s: &Server, t: &Tool) -> String {
    let props = t.input_schema.get("properties").and_then(Value::as_object);
    let required: Vec<&str> = t
        .input_schema
        .get("required")
        .and_then(Value::as_array)
        .map(|r| r.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let mut params: Vec<(bool, String)> = props
        .into_iter()
        .flatten()
        .map(|(name, p)| {
            let kind = match p.get("type").and_then(Value::as_str) {
                Some("string") => ": str",
                Some("integer") => ": int",
                Some("number") => ": float",
                Some("boolean") => ": bool",
                Some("array") => ": list",
                Some("object") => ": dict",
                _ => "",
            };
            let needed = required.contains(&name.as_str());
            let default = if needed { "" } else { " = None" };
            (!needed, format!("{}{kind}{default}", python_name(name)))
        })
        .collect();
    params.sort_by_key(|(optional, _)| *optional);
    let params: Vec<String> = params.into_iter().map(|(_, p)| p).collect();
    let args = match params.is_empty() {
        true => String::new(),
        false => format!("*, {}", params.join(", ")),
    };
    let first = t.description.lines().next().unwrap_or("").trim();
    let mut line = format!("pycell_tools.{}.{}({args})", s.python_name, t.python_name);
    if !first.is_empty() {
        let cut: String = first.chars().take(120).collect();
        line.push_str(&format!("  # {cut}"));
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    fn catalog() -> Catalog {
        let schema = json!({"type": "object", "properties": {"timezone": {"type": "string", "description": "IANA name"}, "as-utc": {"type": "boolean"}}, "required": ["timezone"]});
        Catalog {
            servers: vec![CatalogServer {
                name: "time".into(),
                unavailable: None,
                tools: vec![
                    CatalogTool {
                        name: "get_current_time".into(),
                        description: "Get the time.\nMore.".into(),
                        input_schema: schema,
                        client_allows: true,
                    },
                    CatalogTool {
                        name: "set-time".into(),
                        description: String::new(),
                        input_schema: json!({"type": "object"}),
                        client_allows: false,
                    },
                ],
            }],
        }
    }

    fn args(v: Value) -> Map<String, Value> {
        v.as_object().unwrap().clone()
    }

    #[test]
    fn a_call_must_exist_be_allowed_twice_and_fit_its_schema() {
        let b = Toolbox::new(&catalog(), &[Rule::parse("*/*").unwrap()]);
        let ok = args(json!({"timezone": "UTC"}));
        b.check_call("time", "get_current_time", &ok).unwrap();
        let e = b
            .check_call("time", "get_current_time", &args(json!({"timezone": 3})))
            .unwrap_err();
        assert_eq!(e.code, FailureKind::BadArguments, "{e:?}");
        let e = b.check_call("time", "set-time", &Map::new()).unwrap_err();
        assert_eq!(e.code, FailureKind::Denied);
        assert!(e.message.contains("allowTools"), "{}", e.message);
        let e = b.check_call("time", "nope", &Map::new()).unwrap_err();
        assert_eq!(e.code, FailureKind::Unknown);
        assert!(e.message.contains("get_current_time"), "{}", e.message);
        let e = b.check_call("clock", "x", &Map::new()).unwrap_err();
        assert_eq!(e.code, FailureKind::Unknown);
        // The policy wins over the client.
        let none = Toolbox::new(&catalog(), &[]);
        let e = none
            .check_call("time", "get_current_time", &ok)
            .unwrap_err();
        assert_eq!(e.code, FailureKind::Denied);
        assert!(!none.any_callable());
        assert_eq!(none.listing()[0]["tools"], json!([]));
    }

    #[test]
    fn listings_and_signatures_show_only_callable_tools() {
        let b = Toolbox::new(&catalog(), &[Rule::parse("time/*").unwrap()]);
        let tools = b.tools_of("time").unwrap();
        assert_eq!(tools.as_array().unwrap().len(), 1);
        assert_eq!(tools[0]["python_name"], "get_current_time");
        assert_eq!(
            b.signatures(),
            vec!["pycell_tools.time.get_current_time(*, timezone: str, as_utc: bool = None)  # Get the time."]
        );
    }

    #[test]
    fn hostile_catalogs_are_refused() {
        let mut c = catalog();
        c.servers[0].name = "a/b".into();
        assert!(matches!(c.check(), Err(CatalogError::ServerName(_))));
        let mut c = catalog();
        c.servers.push(c.servers[0].clone());
        assert!(matches!(c.check(), Err(CatalogError::SamePythonName(_))));
        let mut c = catalog();
        c.servers[0].tools[0].name = "x".repeat(200);
        assert!(matches!(c.check(), Err(CatalogError::ToolName(_))));
    }
}
