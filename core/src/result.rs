//! The structured result of a run, as `pycell run --json` prints it, the
//! daemon sends it, and the MCP `run_python` tool returns it.

use serde::{Deserialize, Serialize};

use crate::report::{exit_code_for, JailFailure, JailReport, Layers, RunStatus};

pub use pycell_policy::LimitsReport;

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RunResult {
    pub run_id: String,
    pub status: RunStatus,
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub stdout: String,
    pub stderr: String,
    pub stdout_truncated: bool,
    pub stderr_truncated: bool,
    pub wall_ms: f64,
    pub cpu_ms: f64,
    pub peak_memory_bytes: u64,
    /// Bytes the run stored in /workspace, /tmp and /dev/shm together, as
    /// counted against its `disk` limit when it ended.
    #[serde(default)]
    pub disk_used_bytes: u64,
    pub policy: String,
    /// The effective limits; null when the run was refused before they were known.
    pub limits: Option<LimitsReport>,
    pub layers: Option<Layers>,
    pub error: Option<JailFailure>,
}

impl RunResult {
    /// Combine the jailer's report with the output collected from it.
    pub fn new(
        run_id: &str,
        policy: &str,
        limits: Option<LimitsReport>,
        report: JailReport,
        stdout: &[u8],
        stderr: &[u8],
    ) -> RunResult {
        RunResult {
            run_id: run_id.to_string(),
            status: report.status,
            exit_code: report.exit_code,
            signal: report.signal,
            stdout: String::from_utf8_lossy(stdout).into_owned(),
            stderr: String::from_utf8_lossy(stderr).into_owned(),
            stdout_truncated: report.stdout_truncated,
            stderr_truncated: report.stderr_truncated,
            wall_ms: report.wall_ms,
            cpu_ms: report.cpu_ms,
            peak_memory_bytes: report.peak_memory_bytes,
            disk_used_bytes: report.disk_used_bytes,
            policy: policy.to_string(),
            limits,
            layers: report.layers,
            error: report.error,
        }
    }

    /// A run refused before a jail existed.
    pub fn refused(run_id: &str, policy: &str, failure: JailFailure) -> RunResult {
        RunResult::new(run_id, policy, None, JailReport::refused(failure), b"", b"")
    }

    /// Process exit code for this outcome (see [`exit_code_for`]).
    pub fn process_exit_code(&self) -> i32 {
        exit_code_for(self.status, self.exit_code, self.signal)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pycell_policy::Limits;

    #[test]
    fn limits_report_in_the_documented_units() {
        let v = serde_json::to_value(LimitsReport::from(&Limits::default())).unwrap();
        assert_eq!(v["wall_timeout_s"], 30.0);
        assert_eq!(v["memory_bytes"], 512u64 << 20);
        let back: LimitsReport = serde_json::from_value(v).unwrap();
        assert_eq!(back, LimitsReport::from(&Limits::default()));
    }
}
