//! Per-process resource limits of the jail (the cgroup holds the
//! sandbox-wide ones). Every rlimit is pinned, none inherited from whoever
//! started pycell: the jailer sets them on the jail's first process with
//! `prlimit` before it runs anything, so values above the caller's own hard
//! limits work too (the jail itself could not raise them).
//!
//! `RLIMIT_CORE` is 1 byte, not 0: the kernel makes no core file smaller than
//! a page, and it refuses to start a `core_pattern` pipe handler (a host
//! program running as root) for a process whose limit is exactly 1, where 0
//! would still start it. The seccomp filter stops the jail from changing it.

use nix::unistd::Pid;

use pycell_wire::limits::RunLimits;

use pycell_syscall as syscall;

/// One pinned limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Pinned {
    pub name: &'static str,
    pub resource: libc::__rlimit_resource_t,
    pub soft: u64,
    pub hard: u64,
}

const UNLIMITED: u64 = libc::RLIM_INFINITY;
/// The core-dump limit that stops pipe `core_pattern` handlers.
pub(crate) const CORE_LIMIT: u64 = 1;
const STACK: u64 = 8 << 20;
const MEMLOCK: u64 = 64 << 10;
const MSGQUEUE: u64 = 800 << 10;
const SIGPENDING: u64 = 1024;

fn pin(name: &'static str, resource: libc::__rlimit_resource_t, soft: u64, hard: u64) -> Pinned {
    Pinned {
        name,
        resource,
        soft,
        hard,
    }
}

/// CPU seconds a warm jail may spend before its work arrives (its
/// imports), on top of the run's own CPU time limit.
pub(crate) const WARM_UP_CPU_S: u64 = 120;

/// The CPU seconds a jail starts with: its limit, and for a warm jail
/// the allowance of its warm-up besides (its clock restarts when its work
/// comes: `crate::run::warm::restart_cpu_clock`).
fn cpu_seconds(l: &RunLimits, warm: bool) -> u64 {
    match warm {
        true => l.cpu_time_whole_secs().saturating_add(WARM_UP_CPU_S),
        false => l.cpu_time_whole_secs(),
    }
}

/// Every rlimit the kernel has, with the jail's value.
pub(crate) fn pinned(l: &RunLimits, warm: bool) -> Vec<Pinned> {
    use libc::*;
    let same = |name, res, v| pin(name, res, v, v);
    let cpu = cpu_seconds(l, warm);
    vec![
        same("RLIMIT_NOFILE", RLIMIT_NOFILE, l.open_files),
        same("RLIMIT_FSIZE", RLIMIT_FSIZE, l.file_size.get()),
        same("RLIMIT_CORE", RLIMIT_CORE, CORE_LIMIT),
        // SIGXCPU at the soft limit, SIGKILL one second later if ignored.
        pin("RLIMIT_CPU", RLIMIT_CPU, cpu, cpu.saturating_add(1)),
        // The sandbox uid is the run's own, so this counts only its processes
        // (one more for its init); the cgroup's pids.max is the real bound.
        same("RLIMIT_NPROC", RLIMIT_NPROC, u64::from(l.pids) + 1),
        // Real-time scheduling would escape cpu.max; raising priority is off.
        same("RLIMIT_RTPRIO", RLIMIT_RTPRIO, 0),
        same("RLIMIT_RTTIME", RLIMIT_RTTIME, 0),
        same("RLIMIT_NICE", RLIMIT_NICE, 0),
        same("RLIMIT_MEMLOCK", RLIMIT_MEMLOCK, MEMLOCK),
        same("RLIMIT_MSGQUEUE", RLIMIT_MSGQUEUE, MSGQUEUE),
        same("RLIMIT_SIGPENDING", RLIMIT_SIGPENDING, SIGPENDING),
        same("RLIMIT_STACK", RLIMIT_STACK, STACK),
        same("RLIMIT_LOCKS", RLIMIT_LOCKS, l.open_files),
        // Memory is the cgroup's to bound: an address-space limit only breaks
        // allocators and thread stacks that reserve more than they touch.
        same("RLIMIT_AS", RLIMIT_AS, UNLIMITED),
        same("RLIMIT_DATA", RLIMIT_DATA, UNLIMITED),
        same("RLIMIT_RSS", RLIMIT_RSS, UNLIMITED),
    ]
}

/// A limit the kernel would not set.
#[derive(Debug, thiserror::Error)]
#[error("prlimit({name}, {soft}/{hard}): {source}")]
pub(crate) struct PrlimitFailed {
    pub name: &'static str,
    pub soft: u64,
    pub hard: u64,
    pub source: std::io::Error,
}

/// Set every pinned limit on process `pid`.
pub(crate) fn apply(pid: Pid, limits: &RunLimits, warm: bool) -> Result<(), PrlimitFailed> {
    for p in pinned(limits, warm) {
        syscall::prlimit(pid, p.resource, p.soft, p.hard).map_err(|source| PrlimitFailed {
            name: p.name,
            soft: p.soft,
            hard: p.hard,
            source,
        })?;
    }
    Ok(())
}

/// The hard RLIMIT_CPU a warm jail started with.
pub(crate) fn cpu_seconds_hard(cpu_time_s: u64) -> u64 {
    cpu_time_s.saturating_add(WARM_UP_CPU_S).saturating_add(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Linux has had 16 rlimits since 2.6.25 (RLIMIT_RTTIME).
    const RLIMITS_ON_LINUX: u32 = 16;

    fn limits() -> RunLimits {
        RunLimits {
            disk: pycell_wire::limits::Bytes::mib(64),
            ..RunLimits::default()
        }
    }

    #[test]
    fn every_resource_the_kernel_has_is_pinned_once() {
        let p = pinned(&limits(), false);
        let mut seen: Vec<u32> = p.iter().map(|p| p.resource).collect();
        seen.sort_unstable();
        seen.dedup();
        assert_eq!(seen.len(), p.len(), "a resource pinned twice");
        assert_eq!(
            seen,
            (0..RLIMITS_ON_LINUX).collect::<Vec<_>>(),
            "every rlimit Linux has (RLIMIT_CPU = 0 to RLIMIT_RTTIME = 15)"
        );
    }

    #[test]
    fn real_time_priority_and_core_dumps_are_shut() {
        let p = pinned(&limits(), false);
        let get = |n: &str| *p.iter().find(|p| p.name == n).unwrap();
        assert_eq!(
            (get("RLIMIT_RTPRIO").soft, get("RLIMIT_RTPRIO").hard),
            (0, 0)
        );
        assert_eq!(get("RLIMIT_CORE").hard, 1);
        assert_eq!(get("RLIMIT_NOFILE").hard, 256);
        assert!(get("RLIMIT_CPU").hard > get("RLIMIT_CPU").soft);
    }

    #[test]
    fn a_warm_jail_starts_with_its_warm_up_allowance() {
        let cpu = |warm| {
            let p = pinned(&limits(), warm);
            let c = *p.iter().find(|p| p.name == "RLIMIT_CPU").unwrap();
            (c.soft, c.hard)
        };
        assert_eq!(cpu(false), (30, 31));
        let warm_hard = cpu_seconds_hard(30);
        assert_eq!(cpu(true), (warm_hard - 1, warm_hard));
    }
}
