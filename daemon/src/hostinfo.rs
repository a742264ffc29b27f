//! What this host can enforce, measured by asking the kernel (not assumed),
//! and the policies on offer. Shared by `pycell info`, the daemon's `info`
//! reply and the MCP `sandbox_info` tool.

use std::path::Path;

use serde::Serialize;

use pycell_jailer::cgroup::CgroupLayout;

#[derive(Debug, Clone, Serialize)]
pub struct LayerStatus {
    pub layer: &'static str,
    pub available: bool,
    pub detail: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct PolicySummary {
    pub name: String,
    pub description: String,
    pub network: String,
    pub limits: serde_json::Value,
}

#[derive(Debug, Clone, Serialize)]
pub struct HostInfo {
    pub version: &'static str,
    /// "embedded" or "daemon".
    pub mode: &'static str,
    pub policies: Vec<PolicySummary>,
    pub layers: Vec<LayerStatus>,
}

fn read_trim(path: &str) -> Option<String> {
    std::fs::read_to_string(path)
        .ok()
        .map(|s| s.trim().to_string())
}

pub fn layers() -> Vec<LayerStatus> {
    let mut v = Vec::new();
    let userns =
        read_trim("/proc/sys/user/max_user_namespaces").and_then(|s| s.parse::<u64>().ok());
    v.push(LayerStatus {
        layer: "user_namespaces",
        available: userns.unwrap_or(0) > 0,
        detail: format!(
            "user.max_user_namespaces = {}",
            userns.map_or("unknown".into(), |n| n.to_string())
        ),
    });
    match pycell_jailer::syscall::landlock_abi() {
        Ok(abi) => v.push(LayerStatus {
            layer: "landlock",
            available: true,
            detail: format!("ABI {abi}"),
        }),
        Err(e) => v.push(LayerStatus {
            layer: "landlock",
            available: false,
            detail: e.to_string(),
        }),
    }
    let seccomp = read_trim("/proc/sys/kernel/seccomp/actions_avail");
    let profiles: Vec<String> = pycell_seccomp::profile_names()
        .iter()
        .map(|p| match pycell_seccomp::compile(p) {
            Ok(f) => format!("{p} ({} instructions)", f.instruction_count()),
            Err(e) => format!("{p} (does not compile: {e})"),
        })
        .collect();
    v.push(LayerStatus {
        layer: "seccomp",
        available: seccomp.is_some(),
        detail: format!(
            "kernel actions: {}; profiles: {}",
            seccomp.unwrap_or_else(|| "none".into()),
            profiles.join(", ")
        ),
    });
    match CgroupLayout::detect() {
        Ok(layout) => v.push(LayerStatus {
            layer: "cgroups",
            available: true,
            detail: match layout.version() {
                pycell_jailer::cgroup::CgroupVersion::V2 => {
                    "cgroup v2 (memory, pids, cpu)".to_string()
                }
                pycell_jailer::cgroup::CgroupVersion::V1 => {
                    "cgroup v1/hybrid (memory, pids, cpu, cpuacct hierarchies)".to_string()
                }
            },
        }),
        Err(e) => v.push(LayerStatus {
            layer: "cgroups",
            available: false,
            detail: e.to_string(),
        }),
    }
    v
}

/// Built-in policies, overridden by the operator's copies in `policy_dir`.
pub fn policies(policy_dir: &Path) -> Vec<PolicySummary> {
    let mut names: Vec<String> = pycell_policy::builtin::names()
        .iter()
        .map(|s| s.to_string())
        .collect();
    if let Ok(entries) = std::fs::read_dir(policy_dir) {
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if let Some(stem) = name.strip_suffix(".toml") {
                if pycell_policy::is_valid_name(stem) && !names.iter().any(|n| n == stem) {
                    names.push(stem.to_string());
                }
            }
        }
    }
    names.sort();
    names
        .iter()
        .filter_map(|n| crate::resolve::load_policy_by_name(n, policy_dir).ok())
        .map(|p| PolicySummary {
            name: p.name.clone(),
            description: p.description.clone(),
            network: p.network.as_str().to_string(),
            limits: serde_json::to_value(&p.limits).unwrap_or_default(),
        })
        .collect()
}

pub fn collect(mode: &'static str, policy_dir: &Path) -> HostInfo {
    HostInfo {
        version: env!("CARGO_PKG_VERSION"),
        mode,
        policies: policies(policy_dir),
        layers: layers(),
    }
}
