//! What a host offers: pycell's version, the policies a run may name (an
//! installed file wins over the built-in copy of the same name, exactly as
//! runs look them up), and the measured status of each isolation layer
//! (gathered by `pycell_launch::host_info`, which loads the policies and
//! measures the layers). `pycell info`, pycelld's `info` reply and the MCP
//! `sandbox_info` tool all report this one shape.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::result::RunLimits;

/// One isolation layer and whether this host can enforce it.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct LayerStatus {
    /// `user_namespaces`, `landlock`, `seccomp`, `cgroups`, `time_namespace`,
    /// `memfd_exec`, `socket_memory`, `cgroup_kill` or `root`.
    pub layer: String,
    /// Whether the layer is usable here right now.
    pub available: bool,
    /// What was measured (e.g. the Landlock ABI, the cgroup layout) or why it is unavailable.
    pub detail: String,
}

impl LayerStatus {
    pub fn new(layer: &str, available: bool, detail: impl Into<String>) -> LayerStatus {
        LayerStatus {
            layer: layer.to_string(),
            available,
            detail: detail.into(),
        }
    }
}

/// A policy that runs may name.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct PolicySummary {
    /// The name to pass as `policy`.
    pub name: String,
    pub description: String,
    /// What its jails are for: `code` (runs and sessions), `server` (MCP
    /// servers over stdio, `pycell mcp-server`, only) or `install` (the
    /// jail that builds envs; no run may name it).
    /// Left out for `code`.
    #[serde(default = "code_purpose", skip_serializing_if = "is_code")]
    pub purpose: String,
    /// Network access: `none` means a private network namespace with
    /// loopback only; `allowlist` adds HTTP(S) through pycell's egress
    /// proxy to the hosts in `network_allow` only.
    pub network: String,
    /// With `allowlist`: the hosts a run may reach (`[SCHEME://]HOST[:PORT]`;
    /// https and port 443 unless written; `*.example.org` is any name below
    /// example.org).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub network_allow: Vec<String>,
    /// With `allowlist`: rules that win over `network_allow`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub network_deny: Vec<String>,
    /// `installed` (a file in /etc/pycell/policies) or `built-in`.
    pub source: String,
    pub limits: RunLimits,
    /// How far a run may raise each limit (`[limits.max]`); lowering is always allowed.
    pub max: crate::limits::LimitCeilings,
}

fn code_purpose() -> String {
    "code".to_string()
}

fn is_code(purpose: &str) -> bool {
    purpose == "code"
}

impl PolicySummary {
    /// Whether runs and sessions may name it.
    pub fn for_code(&self) -> bool {
        self.purpose == "code"
    }

    /// The network mode in words: `none`, or the allowlist with its rules.
    pub fn network_label(&self) -> String {
        if self.network != "allowlist" {
            return self.network.clone();
        }
        let allow = match self.network_allow.is_empty() {
            true => "nothing allowed yet".to_string(),
            false => format!("allow {}", self.network_allow.join(", ")),
        };
        match self.network_deny.is_empty() {
            true => format!("allowlist ({allow})"),
            false => format!("allowlist ({allow}; deny {})", self.network_deny.join(", ")),
        }
    }
}

/// An installed policy file that does not load (runs naming it are refused).
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct PolicyProblem {
    pub name: String,
    pub message: String,
}

/// Everything `pycell info` reports.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct HostInfo {
    /// pycell's version.
    pub version: String,
    /// `daemon (SOCKET)`: runs go to pycelld at SOCKET; `embedded`: this
    /// process builds the sandboxes through pycell-jailer (needs root);
    /// `daemon`: pycelld describing itself.
    pub mode: String,
    /// The policies a run may name.
    pub policies: Vec<PolicySummary>,
    /// Installed policy files that fail to load.
    pub policy_problems: Vec<PolicyProblem>,
    /// What this host can enforce, measured now.
    pub layers: Vec<LayerStatus>,
    /// Code mode: the MCP tools run_python's code may call (`import
    /// pycell_tools`), when the client configured tool servers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tools: Option<ToolsInfo>,
}

/// The tools code may call, as the default policy lets it.
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
pub struct ToolsInfo {
    /// Each callable tool's Python signature, with the first line of its
    /// description: `pycell_tools.time.get_current_time(*, timezone: str)  # ...`.
    pub callable: Vec<String>,
    /// Servers that could not be reached: `NAME: why`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unavailable: Vec<String>,
}

/// pycelld's answer to `info`: the host as it sees it, and its own state.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DaemonInfo {
    #[serde(flatten)]
    pub host: HostInfo,
    pub daemon: DaemonStatus,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DaemonStatus {
    pub socket: std::path::PathBuf,
    pub max_concurrent_runs: usize,
    pub max_runs_per_uid: usize,
    pub active_runs: usize,
    /// Runs waiting for a slot now, and how many may wait.
    pub queued_runs: usize,
    pub max_queued_runs: usize,
    /// Longest a run waits before it is refused `busy`.
    pub queue_wait_s: f64,
    /// Sum of the memory limits of the runs going at once: its bound, and now.
    pub memory_budget_bytes: u64,
    pub memory_admitted_bytes: u64,
    pub max_connections: usize,
    pub max_connections_per_uid: usize,
    pub connections: usize,
    /// `START-END`.
    pub uid_range: String,
    /// The warm pools (`warm_pools` in the config), as the monitor last
    /// reported them.
    #[serde(default)]
    pub warm_pools: Vec<WarmPoolStatus>,
}

/// One warm pool: the jails pycelld keeps built ahead of runs of a policy.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct WarmPoolStatus {
    pub policy: String,
    /// True for a pool of session jails (`session_pools`), false for one
    /// of run jails (`warm_pools`).
    #[serde(default)]
    pub sessions: bool,
    /// Members the pool keeps.
    pub size: usize,
    /// Members waiting for a run.
    pub ready: usize,
    /// Members still being built.
    pub warming: usize,
    /// The pids of every member's jailer (ready, warming or stopping),
    /// each a child of pycelld's monitor: an idle member's processes are
    /// its jailer's descendants.
    pub jailer_pids: Vec<i32>,
    /// The jailer of the zygote its members are forked from, while it has
    /// one (its python started, the policy's warm imports done).
    #[serde(default)]
    pub zygote_jailer_pid: Option<i32>,
    /// Every member's sandbox uid, in no order: a member forked from the
    /// zygote runs below the zygote's jailer, not its own, and these tell
    /// its processes from those of runs the zygote forked before.
    #[serde(default)]
    pub member_sandbox_uids: Vec<u32>,
}
