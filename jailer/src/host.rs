//! What this host can enforce, measured by asking the kernel (not assumed):
//! user namespaces, Landlock's ABI, seccomp and its compiled profiles, the
//! cgroup layout. Reported by `pycell info`, pycelld's `info` and the MCP
//! `sandbox_info` tool.

use pycell_core::info::LayerStatus;
use pycell_core::report::CgroupVersion;

use pycell_core::cgroup::CgroupLayout;

fn read_trim(path: &str) -> Option<String> {
    std::fs::read_to_string(path)
        .ok()
        .map(|s| s.trim().to_string())
}

/// Each layer of the jail and whether this host offers it now.
pub fn layers() -> Vec<LayerStatus> {
    vec![user_namespaces(), landlock(), seccomp(), cgroups()]
}

fn user_namespaces() -> LayerStatus {
    let n = read_trim("/proc/sys/user/max_user_namespaces").and_then(|s| s.parse::<u64>().ok());
    LayerStatus::new(
        "user_namespaces",
        n.unwrap_or(0) > 0,
        format!(
            "user.max_user_namespaces = {}",
            n.map_or("unknown".into(), |n| n.to_string())
        ),
    )
}

fn landlock() -> LayerStatus {
    match crate::syscall::landlock_abi() {
        Ok(abi) => LayerStatus::new("landlock", true, format!("ABI {abi}")),
        Err(e) => LayerStatus::new("landlock", false, e.to_string()),
    }
}

fn seccomp() -> LayerStatus {
    let actions = read_trim("/proc/sys/kernel/seccomp/actions_avail");
    let profiles: Vec<String> = pycell_seccomp::profile_names()
        .iter()
        .map(|p| match pycell_seccomp::compile(p) {
            Ok(f) => format!("{p} ({} instructions)", f.instruction_count()),
            Err(e) => format!("{p} (does not compile: {e})"),
        })
        .collect();
    LayerStatus::new(
        "seccomp",
        actions.is_some(),
        format!(
            "kernel actions: {}; profiles: {}",
            actions.unwrap_or_else(|| "none".into()),
            profiles.join(", ")
        ),
    )
}

fn cgroups() -> LayerStatus {
    match CgroupLayout::detect() {
        Ok(layout) => LayerStatus::new(
            "cgroups",
            true,
            match layout.version() {
                CgroupVersion::V2 => "cgroup v2 (memory, pids, cpu)",
                CgroupVersion::V1 => "cgroup v1/hybrid (memory, pids, cpu, cpuacct hierarchies)",
            },
        ),
        Err(e) => LayerStatus::new("cgroups", false, e.to_string()),
    }
}
