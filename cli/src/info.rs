//! `pycell info`: pycell's version, the policies a run may name, and the
//! measured status of each isolation layer. With pycelld running it shows
//! the daemon's own view; otherwise what this process sees (embedded mode).
//! The MCP `sandbox_info` tool returns the same `HostInfo`.

use std::path::Path;

use crate::say::say;
use pycell_protocol::client::DaemonClient;
use pycell_protocol::info::{DaemonInfo, LayerStatus, PolicySummary, WarmPoolStatus};

fn print_policies(policies: &[PolicySummary], with_limits: bool) {
    say!("\npolicies:");
    for p in policies {
        let (l, m) = (&p.limits, &p.max);
        let detail = match with_limits {
            true => format!(
                "timeout {}s (max {}s), memory {} MiB (max {} MiB), pids {} (max {})",
                l.wall_timeout.as_secs_f64(),
                m.wall_timeout.as_secs_f64(),
                l.memory.get() >> 20,
                m.memory.get() >> 20,
                l.pids,
                m.pids
            ),
            false => p.source.clone(),
        };
        let purpose = match p.for_code() {
            true => String::new(),
            false => format!("purpose {}, not for code runs; ", p.purpose),
        };
        say!(
            "  {:<14} {} [{purpose}network: {}; {detail}]",
            p.name,
            p.description,
            p.network_label()
        );
    }
}

fn print_warm_pools(pools: &[WarmPoolStatus]) {
    if pools.is_empty() {
        say!("  warm pools: none");
    }
    for p in pools {
        let kind = if p.sessions {
            "session pool"
        } else {
            "warm pool"
        };
        let zygote = p.zygote_jailer_pid.map_or_else(String::new, |pid| {
            format!("; forked from a zygote (jailer {pid})")
        });
        say!(
            "  {kind} {:?}: {} ready, {} warming up, of {}; jailers {:?}{zygote}",
            p.policy,
            p.ready,
            p.warming,
            p.size,
            p.jailer_pids
        );
    }
}

fn print_layers(layers: &[LayerStatus]) {
    say!("\nisolation layers on this host:");
    for l in layers {
        let ok = if l.available { "yes" } else { "NO" };
        say!("  {:<16} {:<4} {}", l.layer, ok, l.detail);
    }
}

/// With a daemon running, its own view: version, policies with their limits,
/// the layers it measured, and its quotas.
fn print_daemon_info(socket: &Path, json: bool) -> Result<(), String> {
    let info: DaemonInfo = DaemonClient::connect(socket)
        .and_then(|mut c| c.info())
        .map_err(|e| e.to_string())?;
    if json {
        say!(
            "{}",
            serde_json::to_string_pretty(&info).unwrap_or_default()
        );
        return Ok(());
    }
    let d = &info.daemon;
    say!(
        "pycelld {} (daemon mode, {})",
        info.host.version,
        socket.display()
    );
    say!(
        "  runs: {} going, {} waiting; at most {} at once, {} per user; sandbox uids {}",
        d.active_runs,
        d.queued_runs,
        d.max_concurrent_runs,
        d.max_runs_per_uid,
        d.uid_range
    );
    say!(
        "  queue: at most {} waiting, each for at most {} s; memory budget {} MiB ({} MiB admitted)",
        d.max_queued_runs,
        d.queue_wait_s,
        d.memory_budget_bytes >> 20,
        d.memory_admitted_bytes >> 20
    );
    say!(
        "  connections: {} open; at most {}, {} per user",
        d.connections,
        d.max_connections,
        d.max_connections_per_uid
    );
    print_warm_pools(&d.warm_pools);
    print_policies(&info.host.policies, true);
    print_layers(&info.host.layers);
    Ok(())
}

pub fn main(json: bool) -> i32 {
    let socket = pycell_engine::service::Backend::choose_now(false, None);
    if let Some(socket) = &socket {
        match print_daemon_info(socket, json) {
            Ok(()) => return 0,
            Err(e) => eprintln!("pycell: cannot ask pycelld ({e}); showing what this process sees"),
        }
    }
    let info =
        pycell_engine::local::host_info(pycell_engine::service::mode_name(socket.as_deref()));
    if json {
        say!(
            "{}",
            serde_json::to_string_pretty(&info).unwrap_or_default()
        );
        return 0;
    }
    say!("pycell {} ({} mode)", info.version, info.mode);
    print_policies(&info.policies, false);
    for p in &info.policy_problems {
        say!("  {:<14} DOES NOT LOAD: {}", p.name, p.message);
    }
    print_layers(&info.layers);
    0
}
