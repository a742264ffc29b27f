//! Code mode on the wire: the tools a client offers a run
//! ([`ToolCatalog`]) and what its calls came to ([`ToolCallsReport`]).
//! The protocol's own types: `pycell_tools`' catalog and counts become
//! them (and back) field by field, so a change there cannot change what
//! clients send or decode without a change here.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use pycell_tools::catalog::{Catalog, CatalogServer, CatalogTool};
use pycell_tools::service::ToolCalls;

/// The client's tool servers and their tools.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolCatalog {
    pub servers: Vec<ToolServer>,
}

/// One of the client's servers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolServer {
    pub name: String,
    pub tools: Vec<Tool>,
    /// Why its tools could not be listed (it did not start, say).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unavailable: Option<String>,
}

/// One tool of a server, as the server listed it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Tool {
    pub name: String,
    #[serde(default)]
    pub description: String,
    pub input_schema: Value,
    /// Whether the client's `allowTools` lets code call it.
    pub client_allows: bool,
}

/// What a run's tool calls came to (its result's `tool_calls`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ToolCallsReport {
    /// Calls made (listings not counted).
    pub calls: u32,
    /// Of which failed or refused.
    pub failed: u32,
    /// Failures by reason (`denied`, `bad_arguments`, `upstream_failed`, ...).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub failures: BTreeMap<String, u32>,
    /// Calls the broker refused (not allowed, unknown, past the run's
    /// bound on calls), by `server.tool (reason)`: at most 16 entries.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub refused: BTreeMap<String, u32>,
    /// Bytes of arguments sent and of results received.
    pub bytes_out: u64,
    pub bytes_in: u64,
}

impl ToolCatalog {
    /// Whether its numbers of servers and tools are within a catalog's
    /// bounds: checked before it is turned into anything.
    pub fn check_counts(&self) -> Result<(), pycell_tools::catalog::CatalogError> {
        let tools = self.servers.iter().map(|s| s.tools.len());
        pycell_tools::catalog::check_counts(self.servers.len(), tools)
    }
}

impl From<ToolCalls> for ToolCallsReport {
    fn from(c: ToolCalls) -> ToolCallsReport {
        let ToolCalls {
            calls,
            failed,
            failures,
            refused,
            bytes_out,
            bytes_in,
        } = c;
        ToolCallsReport {
            calls,
            failed,
            failures,
            refused,
            bytes_out,
            bytes_in,
        }
    }
}

impl From<Catalog> for ToolCatalog {
    fn from(c: Catalog) -> ToolCatalog {
        let servers = c.servers.into_iter().map(|s| {
            let CatalogServer {
                name,
                tools,
                unavailable,
            } = s;
            let tools = tools.into_iter().map(|t| {
                let CatalogTool {
                    name,
                    description,
                    input_schema,
                    client_allows,
                } = t;
                Tool {
                    name,
                    description,
                    input_schema,
                    client_allows,
                }
            });
            ToolServer {
                name,
                tools: tools.collect(),
                unavailable,
            }
        });
        ToolCatalog {
            servers: servers.collect(),
        }
    }
}

impl From<&ToolCatalog> for Catalog {
    fn from(c: &ToolCatalog) -> Catalog {
        let servers = c.servers.iter().map(|s| CatalogServer {
            name: s.name.clone(),
            tools: s
                .tools
                .iter()
                .map(|t| CatalogTool {
                    name: t.name.clone(),
                    description: t.description.clone(),
                    input_schema: t.input_schema.clone(),
                    client_allows: t.client_allows,
                })
                .collect(),
            unavailable: s.unavailable.clone(),
        });
        Catalog {
            servers: servers.collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_catalog_goes_to_the_wire_and_back_unchanged() {
        let text = r#"{"servers":[{"name":"time","tools":[{"name":"now","description":"d",
            "input_schema":{"type":"object"},"client_allows":true}]},
            {"name":"gone","tools":[],"unavailable":"did not start"}]}"#;
        let ours: Catalog = serde_json::from_str(text).unwrap();
        let wire = ToolCatalog::from(ours.clone());
        assert_eq!(Catalog::from(&wire), ours);
        assert_eq!(
            serde_json::to_value(&wire).unwrap(),
            serde_json::to_value(&ours).unwrap()
        );
    }
}
