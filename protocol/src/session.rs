//! Sessions on the wire (protocol version 4): what a client asks of a
//! session, and what pycelld answers. A session outlives the connection
//! that started it: any connection of the same uid may name its handle.

use serde::{Deserialize, Serialize};

use pycell_runner::session::RunnerReply;
use pycell_wire::events::ReplyMeasure;

use crate::limits::LimitOverrides;
use crate::result::{EnvReport, LimitsReport};

/// `session_start`: the session's policy, limits and dependencies (fixed
/// for its life).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SessionStartRequest {
    /// Policy name (default `default`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy: Option<String>,
    /// The session's limits (memory, pids, disk for the whole session;
    /// `timeout_s` and `max_output_bytes` each cell's default).
    #[serde(default)]
    pub limits: LimitOverrides,
    /// Packages the session has (PEP 508).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub dependencies: Vec<String>,
    /// Code mode: the MCP tools the client offers the session's cells.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tools: Option<pycell_tools::catalog::Catalog>,
}

impl SessionStartRequest {
    pub fn policy_name(&self) -> &str {
        self.policy.as_deref().unwrap_or("default")
    }
}

/// What a `session` message asks of a session.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum SessionCall {
    /// Run `code` as the session's next cell.
    Cell { code: String },
    /// Write a file into /workspace (missing directories are created).
    Write { path: String, data_base64: String },
    /// Read a file of /workspace.
    Read { path: String },
    /// List a directory of /workspace (`""`: /workspace itself).
    List { path: String },
}

/// A started session, as `session_started` reports it (and MCP's
/// `session_start`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SessionInfo {
    /// The handle: name it in later calls (MCP: pass it as `session` to run_python, write_file, read_file, list_files and session_end).
    pub session: String,
    /// The session jail's run id (in the audit log).
    pub run_id: String,
    pub policy: String,
    /// Host uid the session's code runs as (unique to it, no account has it).
    pub sandbox_uid: u32,
    /// Each cell's limits (wall_timeout_s is a cell's default timeout); memory, processes and disk hold for the whole session.
    pub limits: LimitsReport,
    /// A session with no call for this long is ended.
    pub idle_timeout_s: f64,
    /// The session is ended this long after it started.
    pub lifetime_s: f64,
    /// The largest file moved in or out at once, in bytes.
    pub max_file_bytes: u64,
    /// The session's packages (when it has dependencies).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub env: Option<EnvReport>,
}

/// A session call's answer: the runner's reply (a cell's value, exception,
/// files and images; a file's bytes; a listing; or why it was refused),
/// the output the call printed (capped), and what the jailer measured.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SessionAnswer {
    /// The session jail's run id, and its policy.
    pub run_id: String,
    pub policy: String,
    /// The call's wall timeout, in seconds.
    pub timeout_s: f64,
    pub reply: RunnerReply,
    pub stdout: String,
    pub stderr: String,
    pub measure: ReplyMeasure,
}

/// A session that ended, as `session_ended` reports it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SessionEndInfo {
    pub session: String,
    /// `ended` when this call ended it; else why it had ended.
    pub reason: String,
    pub message: String,
    /// The session's peak memory, in bytes.
    pub peak_memory_bytes: u64,
}

/// One session of `sessions`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SessionSummary {
    pub session: String,
    pub policy: String,
    /// Seconds since it started.
    pub age_s: f64,
    /// Seconds since its last call.
    pub idle_s: f64,
    /// Seconds left before the idle timeout ends it.
    pub expires_in_s: f64,
}
