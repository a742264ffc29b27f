//! The limits a request may set instead of its policy's, and a run's
//! limits and a policy's ceilings as the protocol carries them:
//! durations in seconds, sizes in bytes, with the unit in each field's
//! name so a reader never has to guess. These are the protocol's own
//! types (the Python client decodes them, `vectors.json` holds both codecs
//! to them); the policy's [`Limits`] and [`LimitCeilings`] become them
//! through `From`, so a change to a policy type cannot change the schema
//! without a change here.

use pycell_policy::{LimitCeilings, Limits};
use schemars::JsonSchema;
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

/// A policy's ceilings as reports show them (units in the field names).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LimitCeilingsReport {
    /// Largest wall-clock timeout a run may ask for (`timeout_s`).
    pub wall_timeout_s: f64,
    pub memory_bytes: u64,
    pub pids: u32,
    pub disk_bytes: u64,
    pub max_output_bytes: u64,
}

impl From<&LimitCeilings> for LimitCeilingsReport {
    fn from(c: &LimitCeilings) -> Self {
        LimitCeilingsReport {
            wall_timeout_s: c.wall_timeout.as_secs_f64(),
            memory_bytes: c.memory,
            pids: c.pids,
            disk_bytes: c.disk,
            max_output_bytes: c.max_output,
        }
    }
}

/// A run's limits as results and reports show them: durations in seconds,
/// sizes in bytes, with the unit in the field name so a reader never has
/// to guess.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LimitsReport {
    /// Wall-clock time after which the whole sandbox is killed (status `timeout`).
    pub wall_timeout_s: f64,
    /// CPU time after which the program is killed (status `killed`).
    pub cpu_time_s: f64,
    /// Memory of all processes together, no swap (status `oom` when exceeded).
    pub memory_bytes: u64,
    /// Processes and threads together.
    pub pids: u32,
    /// CPU bandwidth in cores.
    pub cpus: f64,
    /// Open file descriptors per process.
    pub open_files: u64,
    /// Largest file a process may write.
    pub file_size_bytes: u64,
    /// Bytes the run may store in /workspace, /tmp and /dev/shm together.
    pub disk_bytes: u64,
    /// Cap on each of stdout and stderr; the rest is dropped and the result says it was truncated.
    pub max_output_bytes: u64,
    /// inotify instances the run may hold at once (absent from a server
    /// older than these limits).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inotify_instances: Option<u32>,
    /// inotify watches the run may hold at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inotify_watches: Option<u64>,
}

impl From<&Limits> for LimitsReport {
    fn from(l: &Limits) -> Self {
        LimitsReport {
            wall_timeout_s: l.wall_timeout.as_secs_f64(),
            cpu_time_s: l.cpu_time.as_secs_f64(),
            memory_bytes: l.memory,
            pids: l.pids,
            cpus: l.cpus,
            open_files: l.open_files,
            file_size_bytes: l.file_size,
            disk_bytes: l.disk,
            max_output_bytes: l.max_output,
            inotify_instances: Some(l.inotify_instances),
            inotify_watches: Some(l.inotify_watches),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_serialize_with_units_in_field_names() {
        let v = serde_json::to_value(LimitsReport::from(&Limits::default())).unwrap();
        let want = serde_json::json!({
            "wall_timeout_s": 30.0,
            "cpu_time_s": 30.0,
            "memory_bytes": 536870912u64,
            "pids": 64,
            "cpus": 1.0,
            "open_files": 256,
            "file_size_bytes": 67108864u64,
            "disk_bytes": 134217728u64,
            "max_output_bytes": 1048576u64,
            "inotify_instances": 16,
            "inotify_watches": 8192,
        });
        assert_eq!(v, want);
    }
}
