//! The limits a request may set instead of its policy's (a partial of
//! [`RunLimits`]); a run's limits and a policy's ceilings, which the
//! protocol carries as they serialize themselves: durations in seconds,
//! sizes in bytes, with the unit in each field's name so a reader never
//! has to guess (the Python client decodes them, `vectors.json` holds
//! both codecs to them).

pub use pycell_wire::limits::{Bytes, Cores, LimitCeilings, RunLimits};
use serde::{Deserialize, Serialize};

/// Limits a caller may ask for instead of the policy's. Each is checked
/// against the same ranges as policy files.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimitOverrides {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_s: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pids: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    /// Bytes the run may store in /workspace, /tmp and /dev/shm together
    /// (`workspace_bytes` is its old name, still accepted).
    #[serde(alias = "workspace_bytes")]
    pub disk_bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_output_bytes: Option<u64>,
}
