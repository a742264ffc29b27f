//! What this host can enforce, measured by asking the kernel (not assumed):
//! user namespaces, Landlock's ABI, seccomp and its compiled profiles, the
//! cgroup layout, and the hardening that depends on the kernel (time
//! namespaces, memfd sealing, socket-buffer accounting, how runs are killed). Reported by `pycell info`, pycelld's `info` and the MCP
//! `sandbox_info` tool.

use pycell_protocol::info::LayerStatus;
use pycell_wire::report::CgroupVersion;

use pycell_host::cgroup::CgroupLayout;

fn read_trim(path: &str) -> Option<String> {
    std::fs::read_to_string(path)
        .ok()
        .map(|s| s.trim().to_string())
}

/// Each layer of the jail and whether this host offers it now.
pub fn layers() -> Vec<LayerStatus> {
    let layout = CgroupLayout::detect();
    vec![
        user_namespaces(),
        landlock(),
        seccomp(),
        cgroups(&layout),
        time_namespace(),
        memfd_exec(),
        socket_memory(&layout),
        cgroup_kill(&layout),
    ]
}

/// Every run gets its own time namespace; without one, runs are refused.
fn time_namespace() -> LayerStatus {
    let there = std::path::Path::new("/proc/self/ns/time").exists();
    LayerStatus::new(
        "time_namespace",
        there,
        if there {
            "each run's clocks start near zero (the host's uptime and boot time stay hidden)"
        } else {
            "this kernel has no time namespaces (Linux 5.6+, CONFIG_TIME_NS): runs are refused"
        },
    )
}

/// How a run is kept from executing a memfd it wrote.
fn memfd_exec() -> LayerStatus {
    LayerStatus::new(
        "memfd_exec",
        true,
        "memfd_create is refused by seccomp in every run (ENOSYS): no jail can set vm.memfd_noexec, which only host root may",
    )
}

/// Whether socket buffers count against a run's memory limit.
fn socket_memory(layout: &Result<CgroupLayout, pycell_host::cgroup::CgroupError>) -> LayerStatus {
    match layout {
        Ok(CgroupLayout::V2 { .. }) => LayerStatus::new(
            "socket_memory",
            true,
            "cgroup v2 charges socket buffers to memory.max",
        ),
        Ok(CgroupLayout::V1 { memory, .. }) => {
            let there = memory.join("memory.kmem.tcp.limit_in_bytes").exists();
            LayerStatus::new(
                "socket_memory",
                there,
                if there {
                    "cgroup v1: a sixteenth of each run's memory limit is its socket-buffer limit (memory.kmem.tcp.limit_in_bytes)"
                } else {
                    "cgroup v1 without memory.kmem.tcp.limit_in_bytes (kernel built without kmem accounting, or booted with cgroup.memory=nokmem): runs are refused"
                },
            )
        }
        Err(e) => LayerStatus::new("socket_memory", false, e.to_string()),
    }
}

/// How a run's processes are killed.
fn cgroup_kill(layout: &Result<CgroupLayout, pycell_host::cgroup::CgroupError>) -> LayerStatus {
    match layout {
        Ok(CgroupLayout::V2 { .. }) => {
            LayerStatus::new("cgroup_kill", true, "cgroup.kill, one write for the whole run")
        }
        Ok(CgroupLayout::V1 { .. }) => LayerStatus::new(
            "cgroup_kill",
            true,
            "cgroup v1: the run is frozen (freezer hierarchy), each process killed through a pidfd, then thawed",
        ),
        Err(e) => LayerStatus::new("cgroup_kill", false, e.to_string()),
    }
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
    match pycell_syscall::landlock_abi() {
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

fn cgroups(layout: &Result<CgroupLayout, pycell_host::cgroup::CgroupError>) -> LayerStatus {
    match layout {
        Ok(layout) => LayerStatus::new(
            "cgroups",
            true,
            match layout.version() {
                CgroupVersion::V2 => "cgroup v2 (memory, pids, cpu)",
                CgroupVersion::V1 => {
                    "cgroup v1/hybrid (memory, pids, cpu, cpuacct, freezer hierarchies)"
                }
            },
        ),
        Err(e) => LayerStatus::new("cgroups", false, e.to_string()),
    }
}
