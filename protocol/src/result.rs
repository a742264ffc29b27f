//! The structured result of a run, as `pycell run --json` prints it, the
//! daemon sends it, and the MCP `run_python` tool returns it.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::refusals::{self, EndFacts, LimitFacts, Refusal, Termination};
use pycell_wire::report::{
    exit_code_for, ChangedFile, Display, GrantCleanup, Image, JailFailure, JailReport, Layers,
    RunStatus, SessionEnd, StreamTail,
};

pub use crate::limits::RunLimits;

/// A package in an env.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Package {
    pub name: String,
    pub version: String,
}

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
    /// The end of a stream that went over the output cap: its last bytes
    /// (at most 16 KiB), and how many between them and `stdout` were
    /// dropped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stdout_tail: Option<StreamTail>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stderr_tail: Option<StreamTail>,
    pub wall_ms: f64,
    pub cpu_ms: f64,
    pub peak_memory_bytes: u64,
    /// Bytes the run stored in /workspace, /tmp and /dev/shm together, as
    /// counted against its `disk` limit when it ended.
    #[serde(default)]
    pub disk_used_bytes: u64,
    /// The run was handed to a warm jail (pycelld's pool: python already
    /// started, the policy's modules imported); its clocks started then.
    #[serde(default)]
    pub warm: bool,
    /// How long that warm jail had been ready, waiting for a run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub warm_waited_ms: Option<f64>,
    /// A session's jail: why it ended, if its jailer or launcher ended it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_end: Option<SessionEnd>,
    /// The files the run created or changed in /workspace (its input
    /// files, as given, are not listed), at most 100.
    #[serde(default)]
    pub files: Vec<ChangedFile>,
    /// More files changed than are listed.
    #[serde(default)]
    pub files_truncated: bool,
    /// What a writable grant held when the jail ended that a grant may not
    /// leave on the host (set-id bits, FIFOs, sockets, links out of the
    /// grant, modes writable by others), and what pycell did about it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub grant_cleanups: Vec<GrantCleanup>,
    /// Figures the run left open (matplotlib; saved under
    /// /workspace/figures) and PNG or JPEG files it wrote, as PNG scaled
    /// to the policy's `[images]` bounds.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub images: Vec<Image>,
    /// Images not sent because the result's image budget was used up
    /// (their files are listed).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub images_omitted: u32,
    /// What the run showed with `display()`: each a bundle of MIME parts
    /// (text always; markdown, HTML, JSON, SVG, PNG when the object has
    /// them), within the policy's `[output]` bounds.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub displays: Vec<Display>,
    /// Displays not sent: past `[output] displays`, or too large for what
    /// was left of `display_bytes`.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub displays_omitted: u32,
    pub policy: String,
    /// The effective limits; null when the run was refused before they were known.
    pub limits: Option<RunLimits>,
    pub layers: Option<Layers>,
    pub error: Option<JailFailure>,
    /// What the run did through the egress proxy (policies with network
    /// mode `allowlist` only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<NetworkReport>,
    /// The env of installed dependencies the run had (runs that named
    /// any, or whose policy has `[dependencies] packages`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub env: Option<EnvReport>,
    /// The tool calls the run's code made (code mode only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<crate::tools::ToolCallsReport>,
    /// Where the run's start and end spent their time (`pycell run
    /// --timings`): each step and when it ended, on the host's monotonic
    /// clock.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub timings: Vec<pycell_wire::timings::Mark>,
    /// What the sandbox refused the run, layer by layer (empty when it
    /// refused nothing): docs/refusals.md.
    #[serde(default)]
    pub refusals: Vec<Refusal>,
    /// Why the run ended (absent only from a server older than it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub termination: Option<Termination>,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// Whether a run's env was already built.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum CacheOutcome {
    /// Built before; mounted as it was.
    Hit,
    /// Built for this run (resolved and installed in the install jail).
    Miss,
}

/// The env of installed packages a run got (read-only, at /venv).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct EnvReport {
    /// The env's key in the store (`pycell env list` shows it).
    pub key: String,
    /// Every package in the env, with its version.
    pub packages: Vec<crate::result::Package>,
    pub cache: CacheOutcome,
    /// Time spent resolving and installing (0 on a hit).
    pub install_ms: f64,
}

/// A run's egress through the proxy: where it went, what was refused, how
/// much was relayed.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct NetworkReport {
    /// Hosts the run reached, with how many connections each.
    pub allowed: Vec<HostCount>,
    /// Requests refused, by host, port and reason.
    pub denied: Vec<Denied>,
    /// Allowed requests that still failed (the name did not resolve, the
    /// host did not answer).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub failed: Vec<Denied>,
    /// Bytes from the hosts to the run, and from the run to the hosts.
    pub bytes_in: u64,
    pub bytes_out: u64,
    /// A per-run limit of the policy that was reached (`max_connections`,
    /// `max_bytes`), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit_reached: Option<String>,
}

impl NetworkReport {
    /// One line per allowed host that still failed, other than names
    /// that did not resolve (those, like the refused hosts, are in the
    /// result's `refusals`).
    pub fn failure_notes(&self) -> Vec<String> {
        self.failed
            .iter()
            .filter(|d| d.reason != "dns_failed")
            .map(|d| {
                format!(
                    "network: failed {}:{} ({}) x{}",
                    d.host, d.port, d.reason, d.count
                )
            })
            .collect()
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct HostCount {
    pub host: String,
    pub port: u16,
    pub count: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Denied {
    pub host: String,
    pub port: u16,
    /// A stable word (docs/errors.md): `not_allowlisted`, `denied_by_rule`,
    /// `port_not_allowed`, `plain_http_not_allowed`, `scheme_not_allowed`,
    /// `private_address`, `sni_mismatch`, `not_tls`, `connection_limit`,
    /// `bad_request`, `incomplete_request`, `client_gone`; for `failed`:
    /// `dns_failed`, `connect_failed`, `connect_timeout`, `upstream_refused`,
    /// `upstream_unusable`.
    pub reason: String,
    pub count: u64,
}

impl RunResult {
    /// Combine the jailer's report with the output collected from it.
    pub fn new(
        run_id: &str,
        policy: &str,
        limits: Option<RunLimits>,
        report: JailReport,
        stdout: &[u8],
        stderr: &[u8],
    ) -> RunResult {
        let refusals = refusals::of_limits(&LimitFacts {
            limits: limits.as_ref(),
            events: report.limit_events,
            timed_out: report.status == RunStatus::Timeout,
            wall_timeout_s: limits.as_ref().map(|l| l.wall_timeout.as_secs_f64()),
            failure: report.error.as_ref().map(|e| e.code),
            signal: report.signal,
            truncated: [report.stdout_truncated, report.stderr_truncated],
            max_output: limits.as_ref().map(|l| l.max_output.get()),
            cell: false,
            seccomp: Some(&report.seccomp_refused),
        });
        let termination = refusals::termination(&EndFacts {
            status: report.status,
            exit_code: report.exit_code,
            signal: report.signal,
            error: report.error.as_ref(),
            session_end: report.session_end,
            peak_memory_bytes: report.peak_memory_bytes,
            limits: limits.as_ref(),
            pids_refused: report.limit_events.pids_refused > 0,
        });
        RunResult {
            refusals,
            termination: Some(termination),
            run_id: run_id.to_string(),
            status: report.status,
            exit_code: report.exit_code,
            signal: report.signal,
            stdout: String::from_utf8_lossy(stdout).into_owned(),
            stderr: String::from_utf8_lossy(stderr).into_owned(),
            stdout_truncated: report.stdout_truncated,
            stderr_truncated: report.stderr_truncated,
            stdout_tail: report.stdout_tail,
            stderr_tail: report.stderr_tail,
            wall_ms: report.wall_ms,
            cpu_ms: report.cpu_ms,
            peak_memory_bytes: report.peak_memory_bytes,
            disk_used_bytes: report.disk_used_bytes,
            warm: report.warm_waited_ms.is_some(),
            warm_waited_ms: report.warm_waited_ms,
            session_end: report.session_end,
            files: report.files,
            files_truncated: report.files_truncated,
            grant_cleanups: report.grant_cleanups,
            images: Vec::new(),
            images_omitted: 0,
            displays: Vec::new(),
            displays_omitted: 0,
            policy: policy.to_string(),
            limits,
            layers: report.layers,
            error: report.error,
            network: None,
            env: None,
            tool_calls: None,
            timings: report.timings,
        }
    }

    /// A run refused before a jail existed.
    pub fn refused(run_id: &str, policy: &str, failure: JailFailure) -> RunResult {
        RunResult::new(run_id, policy, None, JailReport::refused(failure), b"", b"")
    }

    /// Add what the run's services refused (its egress proxy, its tool
    /// broker) to its refusals.
    pub fn add_refusals(&mut self, more: Vec<Refusal>) {
        for r in more {
            refusals::add(&mut self.refusals, r);
        }
    }

    /// Process exit code for this outcome (see [`exit_code_for`]).
    pub fn process_exit_code(&self) -> i32 {
        exit_code_for(self.status, self.exit_code, self.signal)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_report_in_the_documented_units() {
        let v = serde_json::to_value(RunLimits::default()).unwrap();
        assert_eq!(v["wall_timeout_s"], 30.0);
        assert_eq!(v["memory_bytes"], 512u64 << 20);
        let back: RunLimits = serde_json::from_value(v).unwrap();
        assert_eq!(back, RunLimits::default());
    }
}
