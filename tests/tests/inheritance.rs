//! Nothing of the caller leaks into the jail: not its open file descriptors,
//! not its environment.

#![forbid(unsafe_code)]

use std::collections::BTreeMap;
use std::os::fd::AsRawFd;

use nix::fcntl::{fcntl, FcntlArg, FdFlag, OFlag};
use pycell_tests::{at, compact, probe_path, probe_report, repo_root, run_args, Pycell};
use serde_json::Value;

/// The `[env]` table of the shipped default policy: the jail's whole
/// environment.
fn default_policy_env() -> BTreeMap<String, String> {
    let path = repo_root().join("policies/default.toml");
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    let mut env = BTreeMap::new();
    let mut in_env = false;
    for line in text.lines() {
        let line = line.trim();
        if line.starts_with('[') {
            in_env = line == "[env]";
            continue;
        }
        if !in_env || line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (k, v) = line
            .split_once('=')
            .unwrap_or_else(|| panic!("unexpected line in [env] of {}: {line}", path.display()));
        let v = v.trim();
        let v = v
            .strip_prefix('"')
            .and_then(|v| v.strip_suffix('"'))
            .unwrap_or_else(|| panic!("[env] value is not a plain string: {line}"));
        env.insert(k.trim().to_string(), v.to_string());
    }
    assert!(
        env.contains_key("PATH"),
        "no [env] PATH found in {}",
        path.display()
    );
    env
}

#[test]
fn inherited_fds_and_host_env_do_not_reach_the_jail() {
    let secret = "xyz-pycell-test-secret-value";
    // A pipe whose write end is deliberately inheritable (no FD_CLOEXEC):
    // pycell gets it as an extra open fd and must not pass it on.
    let (_read_end, write_end) = nix::unistd::pipe2(OFlag::O_CLOEXEC).expect("pipe2");
    fcntl(&write_end, FcntlArg::F_SETFD(FdFlag::empty())).expect("clear FD_CLOEXEC");
    let leaked_fd = write_end.as_raw_fd().to_string();

    let out = Pycell::new(run_args(
        &probe_path(),
        &[],
        &["--inherited-fd", &leaked_fd, "--skip-functional"],
    ))
    .env("PYCELL_TEST_SECRET", secret)
    .env("PYTHONPATH", "/work")
    .env("LD_PRELOAD", "/nonexistent/pycell-test.so")
    .run();
    drop(write_end);
    let report = probe_report(&out);

    let fds = at(&report, "/fds");
    let fd_numbers: Vec<&str> = fds
        .as_object()
        .expect("fds object")
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(
        fd_numbers,
        ["0", "1", "2"],
        "open fds in the jail (pycell was given fd {leaked_fd}): {}",
        compact(fds, 2000)
    );
    let probe_fd = at(&report, &format!("/inherited_fds/{leaked_fd}"));
    assert_eq!(
        probe_fd["ok"],
        false,
        "fd {leaked_fd} is usable in the jail: {}",
        compact(probe_fd, 300)
    );

    let env = at(&report, "/environ");
    let env: BTreeMap<String, String> = env
        .as_object()
        .expect("environ object")
        .iter()
        .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_string()))
        .collect();
    let want = default_policy_env();
    assert_eq!(
        env, want,
        "the jail's environment must be exactly the default policy's [env]"
    );
    assert!(
        !out.stdout_str().contains(secret),
        "the host env secret appears in the run's output:\n{}",
        out.describe()
    );
    assert_eq!(
        out.result()["status"],
        Value::from("ok"),
        "{}",
        out.describe()
    );
}
