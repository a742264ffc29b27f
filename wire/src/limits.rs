//! One run's limits, in one vocabulary for every crate: durations as
//! [`Duration`], sizes in [`Bytes`], CPU bandwidth in [`Cores`].
//! [`RunLimits`] is what a policy sets (`pycell-policy` checks its
//! ranges), what a request's overrides are applied to, what results and
//! reports show (serialized once, with the unit in each field's name:
//! `wall_timeout_s`, `memory_bytes`, ...), and what the jail spec carries
//! to the jailer, which reads its kernel's units off it
//! ([`RunLimits::cpu_time_whole_secs`], [`Cores::millicores`]; the
//! cgroup's limits are `pycell_host`'s view of it).

use std::time::Duration;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

const MIB: u64 = 1024 * 1024;

/// The longest clock any message between pycell's processes may carry (a
/// run's wall timeout, a session's lifetime, its CPU time): far above any
/// policy's, and far below what an `Instant` can add without overflow.
pub const MAX_CLOCK: Duration = Duration::from_secs(30 * 24 * 60 * 60);

/// A size in bytes.
#[derive(
    Debug,
    Clone,
    Copy,
    Default,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    Serialize,
    Deserialize,
    JsonSchema,
)]
#[serde(transparent)]
#[schemars(inline)]
pub struct Bytes(pub u64);

impl Bytes {
    /// `n` mebibytes.
    pub const fn mib(n: u64) -> Bytes {
        Bytes(n * MIB)
    }

    pub const fn get(self) -> u64 {
        self.0
    }
}

/// CPU bandwidth in cores (1.0 is one core; the cgroup's quota is this
/// times its period).
#[derive(Debug, Clone, Copy, PartialEq, PartialOrd, Serialize, Deserialize, JsonSchema)]
#[serde(transparent)]
#[schemars(inline)]
pub struct Cores(pub f64);

impl Cores {
    pub const fn get(self) -> f64 {
        self.0
    }

    /// In thousandths of a core, at least 1 (cpu.max's quota per period).
    pub fn millicores(self) -> u32 {
        // `max` first: NaN.max(1.0) is 1.0.
        (self.0 * 1000.0).round().max(1.0).min(f64::from(u32::MAX)) as u32
    }
}

/// Resource limits of one run. `Default` gives the built-in defaults,
/// which are also what a policy file gets for any limit it leaves out.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RunLimits {
    /// Wall-clock time after which the whole sandbox is killed (status `timeout`).
    #[serde(rename = "wall_timeout_s", with = "seconds")]
    #[schemars(with = "f64")]
    pub wall_timeout: Duration,
    /// CPU time after which the program is killed (status `killed`;
    /// RLIMIT_CPU, which the kernel counts in whole seconds).
    #[serde(rename = "cpu_time_s", with = "seconds")]
    #[schemars(with = "f64")]
    pub cpu_time: Duration,
    /// Memory of all processes together, no swap (status `oom` when exceeded).
    #[serde(rename = "memory_bytes")]
    pub memory: Bytes,
    /// Processes and threads together (cgroup pids.max).
    pub pids: u32,
    /// CPU bandwidth in cores.
    pub cpus: Cores,
    /// Open file descriptors per process (RLIMIT_NOFILE).
    pub open_files: u64,
    /// Largest file a process may write (RLIMIT_FSIZE).
    #[serde(rename = "file_size_bytes")]
    pub file_size: Bytes,
    /// Bytes the run may store in /workspace, /tmp and /dev/shm together
    /// (directories of one tmpfs).
    #[serde(rename = "disk_bytes")]
    pub disk: Bytes,
    /// Cap on each of stdout and stderr; the rest is dropped and the
    /// result says it was truncated.
    #[serde(rename = "max_output_bytes")]
    pub max_output: Bytes,
    /// inotify instances the run may hold at once (`max_inotify_instances`
    /// of its user namespace; absent from a server older than these
    /// limits, which then had the default).
    #[serde(default = "default_inotify_instances")]
    pub inotify_instances: u32,
    /// inotify watches the run may hold at once (`max_inotify_watches`).
    #[serde(default = "default_inotify_watches")]
    pub inotify_watches: u64,
}

fn default_inotify_instances() -> u32 {
    RunLimits::default().inotify_instances
}

fn default_inotify_watches() -> u64 {
    RunLimits::default().inotify_watches
}

impl Default for RunLimits {
    fn default() -> Self {
        RunLimits {
            wall_timeout: Duration::from_secs(30),
            cpu_time: Duration::from_secs(30),
            memory: Bytes::mib(512),
            pids: 64,
            cpus: Cores(1.0),
            open_files: 256,
            file_size: Bytes::mib(64),
            disk: Bytes::mib(128),
            max_output: Bytes::mib(1),
            inotify_instances: 16,
            inotify_watches: 8192,
        }
    }
}

impl RunLimits {
    /// RLIMIT_CPU: the CPU time in whole seconds (see [`whole_secs`]).
    pub fn cpu_time_whole_secs(&self) -> u64 {
        whole_secs(self.cpu_time)
    }
}

/// How far a request may raise each limit a caller can set (a policy's
/// `[limits.max]`): a partial of [`RunLimits`], serialized as it is (the
/// unit in each field's name). Lowering a limit is always allowed; a
/// ceiling the policy leaves out is the limit itself (no raising).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LimitCeilings {
    /// Largest wall-clock timeout a run may ask for (`timeout_s`).
    #[serde(rename = "wall_timeout_s", with = "seconds")]
    #[schemars(with = "f64")]
    pub wall_timeout: Duration,
    #[serde(rename = "memory_bytes")]
    pub memory: Bytes,
    pub pids: u32,
    #[serde(rename = "disk_bytes")]
    pub disk: Bytes,
    #[serde(rename = "max_output_bytes")]
    pub max_output: Bytes,
}

impl LimitCeilings {
    /// Ceilings that allow no raising at all.
    pub fn at(l: &RunLimits) -> LimitCeilings {
        LimitCeilings {
            wall_timeout: l.wall_timeout,
            memory: l.memory,
            pids: l.pids,
            disk: l.disk,
            max_output: l.max_output,
        }
    }

    /// `base` raised to every ceiling.
    pub fn raised(&self, base: &RunLimits) -> RunLimits {
        RunLimits {
            wall_timeout: self.wall_timeout,
            memory: self.memory,
            pids: self.pids,
            disk: self.disk,
            max_output: self.max_output,
            ..base.clone()
        }
    }
}

/// `d` in whole seconds, rounded up, at least 1: RLIMIT_CPU's unit.
pub fn whole_secs(d: Duration) -> u64 {
    d.as_secs_f64().ceil().max(1.0) as u64
}

/// A duration as seconds (a float), the one way limits are serialized.
pub mod seconds {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_f64(d.as_secs_f64())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        let secs = f64::deserialize(d)?;
        Duration::try_from_secs_f64(secs)
            .map_err(|_| serde::de::Error::custom(format!("{secs} is not a duration in seconds")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_serialize_once_with_units_in_field_names() {
        let v = serde_json::to_value(RunLimits::default()).unwrap();
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
        let back: RunLimits = serde_json::from_value(v).unwrap();
        assert_eq!(back, RunLimits::default());
    }

    #[test]
    fn an_older_servers_limits_decode_and_a_negative_duration_does_not() {
        let mut v = serde_json::to_value(RunLimits::default()).unwrap();
        let m = v.as_object_mut().unwrap();
        m.remove("inotify_instances");
        m.remove("inotify_watches");
        let back: RunLimits = serde_json::from_value(v.clone()).unwrap();
        assert_eq!(back, RunLimits::default());
        v["wall_timeout_s"] = serde_json::json!(-1.0);
        let e = serde_json::from_value::<RunLimits>(v).unwrap_err();
        assert!(e.to_string().contains("not a duration"), "{e}");
    }

    #[test]
    fn the_kernels_units_are_read_off_the_limits() {
        let l = RunLimits {
            cpu_time: Duration::from_millis(1500),
            cpus: Cores(0.0004),
            ..RunLimits::default()
        };
        assert_eq!(l.cpu_time_whole_secs(), 2);
        assert_eq!(l.cpus.millicores(), 1);
        assert_eq!(Cores(2.5).millicores(), 2500);
        assert_eq!(Cores(f64::NAN).millicores(), 1);
    }
}
