//! What this host offers: pycell's version, the policies a run may name, and
//! the status of each isolation layer, measured by asking the kernel (not
//! assumed). `pycell info` prints it; the MCP `sandbox_info` tool returns the
//! same [`Info`] as structured content.

use std::path::Path;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use pycell_daemon::resolve::{self, POLICY_DIR};
use pycell_policy::{Limits, Policy};

/// One isolation layer and whether this host can enforce it.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct LayerStatus {
    /// `user_namespaces`, `landlock`, `seccomp`, `cgroups` or `root`.
    pub layer: String,
    /// Whether the layer is usable here right now.
    pub available: bool,
    /// What was measured (e.g. the Landlock ABI, the cgroup layout) or why it is unavailable.
    pub detail: String,
}

/// A policy's limits: durations in seconds, sizes in bytes (the JSON form of
/// `pycell_policy::Limits`, which `pycell run --json` prints too).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct LimitsInfo {
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
    /// Size of the writable /workspace (the working directory).
    pub workspace_size_bytes: u64,
    /// Size of the writable /tmp.
    pub tmp_size_bytes: u64,
    /// Cap on each of stdout and stderr; the rest is dropped and the result says it was truncated.
    pub max_output_bytes: u64,
}

impl From<&Limits> for LimitsInfo {
    fn from(l: &Limits) -> Self {
        LimitsInfo {
            wall_timeout_s: l.wall_timeout.as_secs_f64(),
            cpu_time_s: l.cpu_time.as_secs_f64(),
            memory_bytes: l.memory,
            pids: l.pids,
            cpus: l.cpus,
            open_files: l.open_files,
            file_size_bytes: l.file_size,
            workspace_size_bytes: l.workspace_size,
            tmp_size_bytes: l.tmp_size,
            max_output_bytes: l.max_output,
        }
    }
}

/// A policy that runs may name.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct PolicySummary {
    /// The name to pass as `policy`.
    pub name: String,
    pub description: String,
    /// Network access: `none` means a private network namespace with loopback only.
    pub network: String,
    /// `installed` (a file in /etc/pycell/policies) or `built-in`.
    pub source: String,
    pub limits: LimitsInfo,
}

/// An installed policy file that does not load (runs naming it are refused).
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct PolicyProblem {
    pub name: String,
    pub message: String,
}

/// Everything `pycell info` reports.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct Info {
    /// pycell's version.
    pub version: String,
    /// `daemon (SOCKET)`: runs go to pycelld at SOCKET; `embedded`: this
    /// process builds the sandboxes through pycell-jailer (needs root).
    pub mode: String,
    /// The policies a run may name.
    pub policies: Vec<PolicySummary>,
    /// Installed policy files that fail to load.
    pub policy_problems: Vec<PolicyProblem>,
    /// What this host can enforce, measured now.
    pub layers: Vec<LayerStatus>,
}

fn layer(name: &str, available: bool, detail: impl Into<String>) -> LayerStatus {
    LayerStatus {
        layer: name.to_string(),
        available,
        detail: detail.into(),
    }
}

/// The host's layers as pycelld measures them, plus what embedded mode needs.
fn layers() -> Vec<LayerStatus> {
    let mut v: Vec<LayerStatus> = pycell_daemon::hostinfo::layers()
        .into_iter()
        .map(|l| layer(l.layer, l.available, l.detail))
        .collect();
    v.push(layer(
        "root",
        nix::unistd::geteuid().is_root(),
        "embedded mode (no pycelld) needs root",
    ));
    v
}

fn summary(p: Policy, source: &str) -> PolicySummary {
    PolicySummary {
        limits: LimitsInfo::from(&p.limits),
        name: p.name,
        description: p.description,
        network: p.network.as_str().to_string(),
        source: source.to_string(),
    }
}

/// Names of the policy files installed in `dir` (`NAME.toml`), sorted.
fn installed_names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_str()?.strip_suffix(".toml")?.to_string();
            pycell_policy::is_valid_name(&name).then_some(name)
        })
        .collect();
    names.sort();
    names
}

/// Names of the policies a run may name (installed or built in), sorted.
pub fn collect_policy_names(dir: &Path) -> Vec<String> {
    let mut names = installed_names(dir);
    for b in pycell_policy::builtin::names() {
        if !names.iter().any(|n| n == b) {
            names.push((*b).to_string());
        }
    }
    names.sort();
    names
}

/// The policies a run may name, as the daemon and embedded mode look them up
/// (an installed file wins over the built-in copy of the same name).
fn policies(dir: &Path) -> (Vec<PolicySummary>, Vec<PolicyProblem>) {
    let names = collect_policy_names(dir);
    let mut ok = Vec::new();
    let mut problems = Vec::new();
    for name in names {
        let source = if dir.join(format!("{name}.toml")).exists() {
            "installed"
        } else {
            "built-in"
        };
        match resolve::load_policy_by_name(&name, dir) {
            Ok(p) => ok.push(summary(p, source)),
            Err(e) => problems.push(PolicyProblem {
                name,
                message: e.to_string(),
            }),
        }
    }
    (ok, problems)
}

/// How runs are executed, as `mode` reports it.
pub fn mode_name(daemon_socket: Option<&Path>) -> String {
    match daemon_socket {
        Some(socket) => format!("daemon ({})", socket.display()),
        None => "embedded".to_string(),
    }
}

/// Measure everything `pycell info` reports (`mode`: the daemon if its
/// socket exists, as `pycell run` decides).
pub fn collect() -> Info {
    collect_with_mode(mode_name(crate::backend::daemon_socket().as_deref()))
}

/// Measure everything, for a caller that knows where its runs go.
pub fn collect_with_mode(mode: String) -> Info {
    let (policies, policy_problems) = policies(Path::new(POLICY_DIR));
    Info {
        version: env!("CARGO_PKG_VERSION").to_string(),
        mode,
        policies,
        policy_problems,
        layers: layers(),
    }
}

/// With a daemon running, its own view: version, policies with their limits,
/// the layers it measured, and its quotas.
fn print_daemon_info(socket: &Path, json: bool) -> Result<(), String> {
    let v = pycell_daemon::client::DaemonClient::connect(socket)
        .and_then(|mut c| c.info())
        .map_err(|e| e.to_string())?;
    if json {
        println!("{}", serde_json::to_string_pretty(&v).unwrap_or_default());
        return Ok(());
    }
    let s = |x: &serde_json::Value| x.as_str().unwrap_or("?").to_string();
    println!(
        "pycelld {} (daemon mode, {})",
        s(&v["version"]),
        socket.display()
    );
    let d = &v["daemon"];
    println!(
        "  runs: {} going; at most {} at once, {} per user; sandbox uids {}",
        d["active_runs"],
        d["max_concurrent_runs"],
        d["max_runs_per_uid"],
        s(&d["uid_range"])
    );
    println!("\npolicies:");
    for p in v["policies"].as_array().into_iter().flatten() {
        let l = &p["limits"];
        println!(
            "  {:<14} {} [network: {}; timeout {}s, memory {} MiB, pids {}]",
            s(&p["name"]),
            s(&p["description"]),
            s(&p["network"]),
            l["wall_timeout_s"],
            l["memory_bytes"].as_u64().unwrap_or(0) >> 20,
            l["pids"]
        );
    }
    println!("\nisolation layers on this host:");
    for l in v["layers"].as_array().into_iter().flatten() {
        let ok = l["available"].as_bool().unwrap_or(false);
        println!(
            "  {:<16} {:<4} {}",
            s(&l["layer"]),
            if ok { "yes" } else { "NO" },
            s(&l["detail"])
        );
    }
    Ok(())
}

pub fn main(json: bool) -> i32 {
    if let Some(socket) = crate::backend::daemon_socket() {
        match print_daemon_info(&socket, json) {
            Ok(()) => return 0,
            Err(e) => eprintln!("pycell: cannot ask pycelld ({e}); showing what this process sees"),
        }
    }
    let info = collect();
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&info).unwrap_or_default()
        );
        return 0;
    }
    println!("pycell {} ({} mode)", info.version, info.mode);
    println!("\npolicies:");
    for p in &info.policies {
        println!(
            "  {:<14} {} [network: {}; {}]",
            p.name, p.description, p.network, p.source
        );
    }
    for p in &info.policy_problems {
        println!("  {:<14} DOES NOT LOAD: {}", p.name, p.message);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_info_matches_the_policy_crates_json_form() {
        let l = Limits::default();
        let ours = serde_json::to_value(LimitsInfo::from(&l)).unwrap();
        let theirs = serde_json::to_value(&l).unwrap();
        assert_eq!(ours, theirs);
    }

    #[test]
    fn installed_policies_win_and_broken_ones_are_reported() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("broken.toml"), "name = 1\n").unwrap();
        std::fs::write(dir.path().join("not a name.toml"), "").unwrap();
        let (ok, problems) = policies(dir.path());
        assert_eq!(
            ok.iter().map(|p| p.name.as_str()).collect::<Vec<_>>(),
            ["default"]
        );
        assert_eq!(ok[0].source, "built-in");
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert_eq!(problems[0].name, "broken");
    }
}
