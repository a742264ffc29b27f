//! What a host offers, gathered: the policies a run may name (an installed
//! file wins over the built-in copy of the same name, exactly as runs look
//! them up) and each isolation layer measured now ([`crate::layers`]).

use std::path::Path;

use pycell_policy::Policy;
use pycell_protocol::info::{HostInfo, LayerStatus, PolicyProblem, PolicySummary};

use crate::resolve::{self, policy_names};

/// The report for runs in `mode`, with the policies of `policy_dir` and
/// the `layers` the caller measured.
pub fn host_info(mode: String, policy_dir: &Path, layers: Vec<LayerStatus>) -> HostInfo {
    let (policies, policy_problems) = policies(policy_dir);
    HostInfo {
        version: env!("CARGO_PKG_VERSION").to_string(),
        mode,
        policies,
        policy_problems,
        layers,
        tools: None,
    }
}

/// The policies a run may name, and the installed files that do not load.
pub fn policies(dir: &Path) -> (Vec<PolicySummary>, Vec<PolicyProblem>) {
    let mut ok = Vec::new();
    let mut problems = Vec::new();
    for name in policy_names(dir) {
        match resolve::load_policy_by_name(&name, dir) {
            Ok(p) => ok.push(summary(p, source_of(dir, &name))),
            Err(e) => problems.push(PolicyProblem {
                name,
                message: e.to_string(),
            }),
        }
    }
    (ok, problems)
}

/// Where the policy `name` comes from: `installed` (a file in `dir`) or
/// `built-in`.
pub fn source_of(dir: &Path, name: &str) -> &'static str {
    match dir.join(format!("{name}.toml")).exists() {
        true => "installed",
        false => "built-in",
    }
}

/// What `policy` is, as `info` lists it; `source` says where it came
/// from (see [`source_of`]; `file` for a file named by its path).
pub fn summary(p: Policy, source: &str) -> PolicySummary {
    PolicySummary {
        purpose: match p.install {
            Some(_) => "install".to_string(),
            None => p.purpose.as_str().to_string(),
        },
        limits: p.limits.clone(),
        max: p.ceilings.clone(),
        network: p.network.as_str().to_string(),
        network_allow: p.network.egress().map(|r| r.allowed()).unwrap_or_default(),
        network_deny: p.network.egress().map(|r| r.denied()).unwrap_or_default(),
        name: p.name,
        description: p.description,
        source: source.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn installed_policies_win_and_broken_ones_are_reported() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("broken.toml"), "name = 1\n").unwrap();
        std::fs::write(dir.path().join("not a name.toml"), "").unwrap();
        let (ok, problems) = policies(dir.path());
        assert_eq!(
            ok.iter().map(|p| p.name.as_str()).collect::<Vec<_>>(),
            [
                "data-science",
                "default",
                "install",
                "mcp-server",
                "network"
            ]
        );
        assert_eq!(ok[0].source, "built-in");
        let purposes: Vec<&str> = ok.iter().map(|p| p.purpose.as_str()).collect();
        assert_eq!(purposes, ["code", "code", "install", "server", "code"]);
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert_eq!(problems[0].name, "broken");
        assert_eq!(ok[4].network_label(), "allowlist (nothing allowed yet)");
    }

    #[test]
    fn an_allowlist_policy_lists_its_rules() {
        let dir = tempfile::tempdir().unwrap();
        let text = pycell_policy::builtin::source("network")
            .unwrap()
            .replace("name = \"network\"", "name = \"egress\"")
            .replace(
                "allow = []",
                "allow = [\"api.example.net\", \"http://*.example.org\"]",
            )
            .replace("deny = []", "deny = [\"bad.example.org\"]");
        std::fs::write(dir.path().join("egress.toml"), text).unwrap();
        let (ok, problems) = policies(dir.path());
        assert!(problems.is_empty(), "{problems:?}");
        let p = ok.iter().find(|p| p.name == "egress").unwrap();
        assert_eq!(p.network_allow, ["api.example.net", "http://*.example.org"]);
        assert_eq!(
            p.network_label(),
            "allowlist (allow api.example.net, http://*.example.org; deny bad.example.org)"
        );
        let json = serde_json::to_value(p).unwrap();
        assert_eq!(json["network_deny"][0], "bad.example.org");
        let default = ok.iter().find(|p| p.name == "default").unwrap();
        assert!(serde_json::to_value(default)
            .unwrap()
            .get("network_allow")
            .is_none());
    }
}
