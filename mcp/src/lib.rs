//! pycell's MCP front ends, over the run service (`pycell_engine`):
//!
//! - [`server`]: the MCP server (`run_python`, sessions, files,
//!   `sandbox_info`), over stdio (`pycell mcp`);
//! - [`http`]: the same server over MCP's streamable HTTP transport
//!   (`pycell mcp --http`), with authentication and per-caller quotas as
//!   a layer in front that hands the server its caller;
//! - [`tool_servers`]: code mode's client side, the MCP servers a caller
//!   configures (`--tool-servers`), offered to runs;
//! - [`cluster`]: `--node` flags, and the TLS gateway (`pycell gateway`)
//!   and tunnels that reach nodes on other hosts.
//!
//! Threat model: requests come from MCP clients (an LLM's choices) and
//! are untrusted; they are parsed by rmcp and hyper, bounded here, and
//! checked again by the run service and the jail.
#![forbid(unsafe_code)]

pub mod args;
pub mod cluster;
pub mod http;
mod lines;
mod privileges;
pub mod server;
mod serving;
mod start_error;
mod tls;
pub mod tool_servers;
