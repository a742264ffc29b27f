//! Per-process resource limits set inside the jail (the cgroup holds the
//! sandbox-wide ones): open files, file size, core dumps off, CPU time.

use nix::sys::resource::{setrlimit, Resource};

use pycell_core::spec::JailLimits;

pub fn apply(limits: &JailLimits) -> Result<(), String> {
    let set = |res: Resource, name: &str, soft: u64, hard: u64| {
        setrlimit(res, soft, hard).map_err(|e| format!("setrlimit({name}, {soft}): {e}"))
    };
    set(
        Resource::RLIMIT_NOFILE,
        "RLIMIT_NOFILE",
        limits.open_files,
        limits.open_files,
    )?;
    set(
        Resource::RLIMIT_FSIZE,
        "RLIMIT_FSIZE",
        limits.file_size_bytes,
        limits.file_size_bytes,
    )?;
    set(Resource::RLIMIT_CORE, "RLIMIT_CORE", 0, 0)?;
    // SIGXCPU at the soft limit, SIGKILL one second later if it is ignored.
    set(
        Resource::RLIMIT_CPU,
        "RLIMIT_CPU",
        limits.cpu_time_s,
        limits.cpu_time_s.saturating_add(1),
    )?;
    Ok(())
}
