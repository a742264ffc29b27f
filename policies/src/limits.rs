//! Resource limits of one run, and the ranges they must stay in.
//!
//! The limits themselves are `pycell_wire::limits::RunLimits`, one type
//! for every crate; their ranges are the same whether a value comes from a
//! policy file or from a request's override, so they live here, in
//! [`check`].

use std::time::Duration;

pub use pycell_wire::limits::{Bytes, Cores, LimitCeilings, RunLimits};

use crate::units::{format_duration, format_size};

const KIB: u64 = 1024;
const MIB: u64 = 1024 * KIB;

/// Longest wall-clock timeout a policy may set.
pub const MAX_WALL_TIMEOUT: Duration = Duration::from_secs(24 * 60 * 60);
/// A timeout a request gives in seconds, as a duration: more than 0 and
/// at most `max` (at most [`MAX_WALL_TIMEOUT`]); else what is wrong. The
/// one check of a timeout in seconds, whoever asks (a run's `timeout_s`,
/// a session call's, the CLI's `--timeout`).
pub fn timeout_from_secs(secs: f64, max: Duration) -> Result<Duration, TimeoutOutOfRange> {
    let max = max.min(MAX_WALL_TIMEOUT);
    match Duration::try_from_secs_f64(secs) {
        Ok(d) if !d.is_zero() && d <= max => Ok(d),
        _ => Err(TimeoutOutOfRange { secs, max }),
    }
}

/// A timeout in seconds out of its range ([`timeout_from_secs`]).
#[derive(Debug, Clone, Copy, PartialEq, thiserror::Error)]
#[error("must be more than 0 and at most {} seconds (got {secs})", .max.as_secs_f64())]
pub struct TimeoutOutOfRange {
    pub secs: f64,
    pub max: Duration,
}

/// Smallest memory limit: below this CPython cannot start reliably.
pub const MIN_MEMORY: u64 = 16 * MIB;
/// Range of `pids` (tasks, i.e. processes and threads, in the run's cgroup).
pub const PIDS_RANGE: (u32, u32) = (1, 65536);
/// Range of `cpus` (CPU bandwidth in cores).
pub const CPUS_RANGE: (f64, f64) = (0.01, 1024.0);
/// Range of `open_files` (RLIMIT_NOFILE). Python itself needs a few.
pub const OPEN_FILES_RANGE: (u64, u64) = (16, 1_048_576);
/// Range of `inotify_instances`: the run's own ceiling on inotify
/// instances (a sandbox uid's are also bounded by the host's
/// `fs.inotify.max_user_instances`).
pub const INOTIFY_INSTANCES_RANGE: (u32, u32) = (0, 1024);
/// Range of `inotify_watches` (also bounded by the host's
/// `fs.inotify.max_user_watches`).
pub const INOTIFY_WATCHES_RANGE: (u64, u64) = (0, 1_048_576);
/// Smallest tmpfs for `/workspace` and `/tmp`.
pub const MIN_TMPFS_SIZE: u64 = MIB;
/// Smallest cap on each of stdout and stderr.
pub const MIN_MAX_OUTPUT: u64 = KIB;
/// Largest cap on each of stdout and stderr: a result carries both streams
/// in one protocol frame (base64), which must stay under its 48 MiB bound,
/// and whoever relays a run buffers them.
pub const MAX_MAX_OUTPUT: u64 = 16 * MIB;

/// A limit out of its range: the field and what to do.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct LimitError {
    pub field: &'static str,
    pub message: String,
}

/// Checks every limit against its range, the same whether a value comes
/// from a policy file or a request's override.
///
/// The error names the field, e.g. `memory: must be at least 16MiB (got 1MiB)`.
pub fn check(l: &RunLimits) -> Result<(), LimitError> {
    let fail = |field, message| Err(LimitError { field, message });
    if l.wall_timeout.is_zero() {
        return fail("wall_timeout", "must be greater than 0".to_owned());
    }
    if l.wall_timeout > MAX_WALL_TIMEOUT {
        return fail(
            "wall_timeout",
            format!(
                "must be at most 24h (got {})",
                format_duration(l.wall_timeout)
            ),
        );
    }
    if l.cpu_time.is_zero() {
        return fail("cpu_time", "must be greater than 0".to_owned());
    }
    if l.memory.get() < MIN_MEMORY {
        return fail("memory", at_least(MIN_MEMORY, l.memory.get()));
    }
    if !(PIDS_RANGE.0..=PIDS_RANGE.1).contains(&l.pids) {
        return fail("pids", between(PIDS_RANGE, l.pids));
    }
    // `contains` is false for NaN, so NaN is rejected too.
    if !(CPUS_RANGE.0..=CPUS_RANGE.1).contains(&l.cpus.get()) {
        return fail("cpus", between(CPUS_RANGE, l.cpus.get()));
    }
    if !(OPEN_FILES_RANGE.0..=OPEN_FILES_RANGE.1).contains(&l.open_files) {
        return fail("open_files", between(OPEN_FILES_RANGE, l.open_files));
    }
    if !(INOTIFY_INSTANCES_RANGE.0..=INOTIFY_INSTANCES_RANGE.1).contains(&l.inotify_instances) {
        return fail(
            "inotify_instances",
            between(INOTIFY_INSTANCES_RANGE, l.inotify_instances),
        );
    }
    if !(INOTIFY_WATCHES_RANGE.0..=INOTIFY_WATCHES_RANGE.1).contains(&l.inotify_watches) {
        return fail(
            "inotify_watches",
            between(INOTIFY_WATCHES_RANGE, l.inotify_watches),
        );
    }
    if l.file_size.get() < 1 {
        return fail("file_size", at_least(1, l.file_size.get()));
    }
    if l.disk.get() < MIN_TMPFS_SIZE {
        return fail("disk", at_least(MIN_TMPFS_SIZE, l.disk.get()));
    }
    if !(MIN_MAX_OUTPUT..=MAX_MAX_OUTPUT).contains(&l.max_output.get()) {
        return fail(
            "max_output",
            format!(
                "must be between {} and {} (got {})",
                format_size(MIN_MAX_OUTPUT),
                format_size(MAX_MAX_OUTPUT),
                format_size(l.max_output.get())
            ),
        );
    }
    Ok(())
}

/// The first of `c`'s ceilings below the limit it caps in `l`, as
/// (field, ceiling, limit).
pub(crate) fn ceiling_below(
    c: &LimitCeilings,
    l: &RunLimits,
) -> Option<(&'static str, String, String)> {
    let d = format_duration;
    let s = |b: Bytes| format_size(b.get());
    [
        (
            "wall_timeout",
            c.wall_timeout < l.wall_timeout,
            d(c.wall_timeout),
            d(l.wall_timeout),
        ),
        ("memory", c.memory < l.memory, s(c.memory), s(l.memory)),
        (
            "pids",
            c.pids < l.pids,
            c.pids.to_string(),
            l.pids.to_string(),
        ),
        ("disk", c.disk < l.disk, s(c.disk), s(l.disk)),
        (
            "max_output",
            c.max_output < l.max_output,
            s(c.max_output),
            s(l.max_output),
        ),
    ]
    .into_iter()
    .find(|c| c.1)
    .map(|(f, _, c, l)| (f, c, l))
}

fn at_least(min: u64, got: u64) -> String {
    format!(
        "must be at least {} (got {})",
        format_size(min),
        format_size(got)
    )
}

pub(crate) fn between<T: std::fmt::Display>(range: (T, T), got: impl std::fmt::Display) -> String {
    format!("must be between {} and {} (got {got})", range.0, range.1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_timeout_in_seconds_is_more_than_0_and_at_most_its_bound() {
        let max = Duration::from_secs(600);
        assert_eq!(timeout_from_secs(2.5, max), Ok(Duration::from_millis(2500)));
        assert_eq!(timeout_from_secs(600.0, max), Ok(max));
        for bad in [0.0, -1.0, 600.5, f64::NAN, f64::INFINITY, 1e-12] {
            let e = timeout_from_secs(bad, max).unwrap_err();
            assert_eq!(e.max, max);
            assert_eq!(
                e.to_string(),
                format!("must be more than 0 and at most 600 seconds (got {bad})")
            );
        }
        // No bound above a day, whatever is asked.
        let e = timeout_from_secs(90_000.0, Duration::MAX)
            .unwrap_err()
            .to_string();
        assert!(e.contains("at most 86400 seconds"), "{e}");
    }

    #[test]
    fn defaults_are_valid() {
        assert_eq!(check(&RunLimits::default()), Ok(()));
    }

    #[test]
    fn each_range_names_its_field() {
        type Case = (fn(&mut RunLimits), &'static str);
        let cases: Vec<Case> = vec![
            (
                |l| l.wall_timeout = Duration::ZERO,
                "wall_timeout: must be greater than 0",
            ),
            (
                |l| l.wall_timeout = Duration::from_secs(25 * 3600),
                "wall_timeout: must be at most 24h (got 25h)",
            ),
            (
                |l| l.cpu_time = Duration::ZERO,
                "cpu_time: must be greater than 0",
            ),
            (
                |l| l.memory = Bytes(MIB),
                "memory: must be at least 16MiB (got 1MiB)",
            ),
            (|l| l.pids = 0, "pids: must be between 1 and 65536 (got 0)"),
            (
                |l| l.pids = 65537,
                "pids: must be between 1 and 65536 (got 65537)",
            ),
            (
                |l| l.cpus = Cores(0.0),
                "cpus: must be between 0.01 and 1024 (got 0)",
            ),
            (
                |l| l.cpus = Cores(f64::NAN),
                "cpus: must be between 0.01 and 1024 (got NaN)",
            ),
            (
                |l| l.cpus = Cores(2000.0),
                "cpus: must be between 0.01 and 1024 (got 2000)",
            ),
            (
                |l| l.open_files = 3,
                "open_files: must be between 16 and 1048576 (got 3)",
            ),
            (
                |l| l.file_size = Bytes(0),
                "file_size: must be at least 1 byte (got 0 bytes)",
            ),
            (
                |l| l.disk = Bytes(512 * KIB),
                "disk: must be at least 1MiB (got 512KiB)",
            ),
            (
                |l| l.max_output = Bytes(1023),
                "max_output: must be between 1KiB and 16MiB (got 1023 bytes)",
            ),
            (
                |l| l.max_output = Bytes(8 << 30),
                "max_output: must be between 1KiB and 16MiB (got 8GiB)",
            ),
        ];
        for (set, expected) in cases {
            let mut limits = RunLimits::default();
            set(&mut limits);
            assert_eq!(check(&limits).unwrap_err().to_string(), expected);
        }
    }

    #[test]
    fn edges_are_inclusive() {
        let limits = RunLimits {
            wall_timeout: MAX_WALL_TIMEOUT,
            cpu_time: Duration::from_millis(1),
            memory: Bytes(MIN_MEMORY),
            pids: 65536,
            cpus: Cores(0.01),
            open_files: 16,
            file_size: Bytes(1),
            disk: Bytes(MIB),
            max_output: Bytes(KIB),
            inotify_instances: 0,
            inotify_watches: 1_048_576,
        };
        assert_eq!(check(&limits), Ok(()));
    }
}
