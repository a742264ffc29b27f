//! `pycell info`: version, built-in policies, and the status of each
//! isolation layer on this host, measured by asking the kernel (not assumed).

use serde::Serialize;

use pycell_jailer::cgroup::CgroupLayout;

#[derive(Debug, Serialize)]
struct LayerStatus {
    layer: &'static str,
    available: bool,
    detail: String,
}

#[derive(Debug, Serialize)]
struct PolicySummary {
    name: String,
    description: String,
    network: String,
    limits: pycell_policy::Limits,
}

#[derive(Debug, Serialize)]
struct Info {
    version: &'static str,
    mode: &'static str,
    policies: Vec<PolicySummary>,
    layers: Vec<LayerStatus>,
}

fn read_trim(path: &str) -> Option<String> {
    std::fs::read_to_string(path)
        .ok()
        .map(|s| s.trim().to_string())
}

fn layers() -> Vec<LayerStatus> {
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
            detail: format!("{:?}: {layout:?}", layout.version()),
        }),
        Err(e) => v.push(LayerStatus {
            layer: "cgroups",
            available: false,
            detail: e.to_string(),
        }),
    }
    v.push(LayerStatus {
        layer: "root",
        available: nix::unistd::geteuid().is_root(),
        detail: "embedded mode (no pycelld) needs root".into(),
    });
    v
}

pub fn main(json: bool) -> i32 {
    let policies = pycell_policy::builtin::names()
        .iter()
        .filter_map(|n| pycell_policy::builtin::load(n).ok())
        .map(|p| PolicySummary {
            name: p.name,
            description: p.description,
            network: p.network.as_str().to_string(),
            limits: p.limits,
        })
        .collect();
    let info = Info {
        version: env!("CARGO_PKG_VERSION"),
        mode: "embedded",
        policies,
        layers: layers(),
    };
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&info).unwrap_or_default()
        );
        return 0;
    }
    println!("pycell {} ({} mode)", info.version, info.mode);
    println!("\npolicies (built in):");
    for p in &info.policies {
        println!(
            "  {:<14} {} [network: {}]",
            p.name, p.description, p.network
        );
    }
    println!("\nisolation layers on this host:");
    for l in &info.layers {
        println!(
            "  {:<16} {:<4} {}",
            l.layer,
            if l.available { "yes" } else { "NO" },
            l.detail
        );
    }
    0
}
