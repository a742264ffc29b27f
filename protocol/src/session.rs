//! Sessions on the wire (protocol version 4): what a client asks of a
//! session, and what pycelld answers. A session outlives the connection
//! that started it: any connection of the same uid may name its handle.

use serde::{Deserialize, Serialize};

use pycell_runner::session::RunnerReply;
use pycell_wire::events::ReplyMeasure;

use crate::messages::LimitOverrides;
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

/// A started session, as `session_started` reports it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SessionInfo {
    /// The handle to name in later messages.
    pub session: String,
    /// The session jail's run id (in the audit log).
    pub run_id: String,
    pub policy: String,
    pub sandbox_uid: u32,
    /// Each cell's limits (memory, pids and disk hold for the session).
    pub limits: LimitsReport,
    pub idle_timeout_s: f64,
    pub lifetime_s: f64,
    pub max_file_bytes: u64,
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
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SessionEndInfo {
    pub session: String,
    /// `ended` when this call ended it; else why it had ended.
    pub reason: String,
    pub message: String,
    pub peak_memory_bytes: u64,
}

/// One session of `sessions`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SessionSummary {
    pub session: String,
    pub policy: String,
    pub age_s: f64,
    pub idle_s: f64,
    /// Seconds left before the idle timeout ends it.
    pub expires_in_s: f64,
}
