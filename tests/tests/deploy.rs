//! The Kubernetes deployment (deploy/kubernetes), checked offline: every
//! manifest validates strictly against the API schemas of the two newest
//! Kubernetes minor versions the kubernetes-validate package ships, the
//! manifests agree with each other and with pycell (deploy/kubernetes/check.py
//! lists what), and the nodes' pycelld.toml is one pycelld itself accepts,
//! with the gateway as a front end.
//!
//! Needs the tools venv's python (PYCELL_TEST_TOOLS_PYTHON), which has
//! kubernetes-validate.

#![forbid(unsafe_code)]

use std::path::Path;
use std::process::Command;

use pycell_tests::repo_root;
use pycell_tests::sdk::tools_python;
use serde_json::Value;

#[test]
fn the_manifests_validate_and_agree_with_pycell() {
    let out = Command::new(tools_python())
        .arg(repo_root().join("deploy/kubernetes/check.py"))
        .output()
        .expect("the tools venv's python runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r: Value = serde_json::from_slice(&out.stdout).expect("one JSON report");
    let versions: Vec<&str> = r["versions"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert_eq!(versions.len(), 2, "{r}");
    assert!(versions.iter().all(|v| v.starts_with("1.")), "{versions:?}");
    let problems = r["problems"].as_array().unwrap();
    assert!(
        problems.is_empty(),
        "{}",
        serde_json::to_string_pretty(problems).unwrap()
    );
    let text = r["pycelld_toml"].as_str().unwrap();
    let config = pycell_daemon::config::Config::parse(text, Path::new("nodes/config.yaml"))
        .unwrap_or_else(|e| panic!("pycelld refuses the nodes' config: {e}"));
    assert_eq!(config.front_end_uids, vec![65000]);
    assert_eq!(config.socket, Path::new("/run/pycell/pycell.sock"));
}
