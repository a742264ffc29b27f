//! The structured outcome of one sandbox run, as the jailer reports it.

use serde::{Deserialize, Serialize};

use crate::cgroup::CgroupVersion;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RunStatus {
    /// Exited with code 0.
    Ok,
    /// Exited non-zero, or was killed by a signal it did not get from us.
    Error,
    /// The wall-clock timeout expired; the whole sandbox was killed.
    Timeout,
    /// The memory limit was hit and the kernel's OOM killer ended the run.
    Oom,
    /// Killed on request (cancel, signal to the jailer), or by the CPU-time limit.
    Killed,
    /// A jail layer could not be applied; the code never ran.
    Refused,
}

/// Why a run was refused or failed before the code could start.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JailFailure {
    /// Stable machine-readable code, e.g. `landlock_unavailable`.
    pub code: String,
    /// The layer or step that failed, e.g. `landlock`, `mounts`, `cgroup`.
    pub layer: String,
    pub message: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hint: Option<String>,
}

impl JailFailure {
    pub fn new(code: &str, layer: &str, message: impl Into<String>, hint: Option<&str>) -> Self {
        JailFailure {
            code: code.to_string(),
            layer: layer.to_string(),
            message: message.into(),
            hint: hint.map(str::to_string),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LandlockReport {
    pub abi: u8,
    /// `fully_enforced` or `partially_enforced` (never `not_enforced`: that refuses the run).
    pub status: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SeccompReport {
    pub profile: String,
    pub instructions: usize,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CgroupReport {
    pub version: CgroupVersion,
    pub name: String,
}

/// Which isolation layers were enforced for the run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Layers {
    pub namespaces: Vec<String>,
    pub sandbox_uid: u32,
    pub landlock: LandlockReport,
    pub seccomp: SeccompReport,
    pub cgroup: CgroupReport,
    pub no_new_privs: bool,
    pub capabilities: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct JailReport {
    pub status: RunStatus,
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub stdout_truncated: bool,
    pub stderr_truncated: bool,
    pub wall_ms: f64,
    pub cpu_ms: f64,
    pub peak_memory_bytes: u64,
    pub layers: Option<Layers>,
    pub error: Option<JailFailure>,
}

impl JailReport {
    /// A run refused before any code ran.
    pub fn refused(failure: JailFailure) -> JailReport {
        JailReport {
            status: RunStatus::Refused,
            exit_code: None,
            signal: None,
            stdout_truncated: false,
            stderr_truncated: false,
            wall_ms: 0.0,
            cpu_ms: 0.0,
            peak_memory_bytes: 0,
            layers: None,
            error: Some(failure),
        }
    }

    /// The conventional process exit code for this outcome (see [`exit_code_for`]).
    pub fn process_exit_code(&self) -> i32 {
        exit_code_for(self.status, self.exit_code, self.signal)
    }
}

/// The process exit code that stands for a run's outcome: the script's own
/// code, 128+signal, 124 for a timeout, 137 for OOM, 125 when refused.
pub fn exit_code_for(status: RunStatus, exit_code: Option<i32>, signal: Option<i32>) -> i32 {
    match status {
        RunStatus::Timeout => 124,
        RunStatus::Oom => 137,
        RunStatus::Refused => 125,
        _ => match (exit_code, signal) {
            (Some(c), _) => c,
            (None, Some(s)) => 128 + s,
            (None, None) => 125,
        },
    }
}
