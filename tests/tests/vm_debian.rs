//! The Debian package on a fresh Debian 12 VM with systemd and pure cgroup v2.
//!
//! Runs `scripts/vm-test` (build the .deb, lintian it, build or reuse the
//! cached VM image, boot it under qemu TCG, run packaging/vm/guest/checks.py
//! inside) and fails on any `FAIL` line, on a missing check (the list is
//! packaging/vm/expected-checks) or on a non-zero exit. Needs root, network
//! access to Debian's archive the first time (the image is then cached in
//! /var/cache/pycell-vm), and takes minutes: about 5 warm, 15 cold.

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use pycell_tests::{repo_root, require_root};

/// Bound on the whole script, a guard against a hang: the sum of what it
/// bounds or measures itself, with room for a loaded host. The package is
/// a release build of the workspace from a fresh clone (515 s, and 854 s
/// on the same 2-core host when it was slower), then the OCI image and
/// its pods, then the VM, which the script bounds at 20 minutes. 25
/// minutes was less than the build and the VM's own bound together.
const GUARD: Duration = Duration::from_secs(40 * 60);

/// The checks `scripts/vm-test` must report for the groups it runs.
fn expected_checks(groups: &BTreeSet<String>) -> Vec<String> {
    let path = repo_root().join("packaging/vm/expected-checks");
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .filter_map(|l| {
            let (group, name) = l.split_once(' ')?;
            groups.contains(group).then(|| name.trim().to_string())
        })
        .collect()
}

/// Every group expected-checks names, in order: what runs by default.
fn all_groups() -> String {
    let path = repo_root().join("packaging/vm/expected-checks");
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    let mut groups: Vec<&str> = Vec::new();
    for group in text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .filter_map(|l| l.split_whitespace().next())
    {
        if !groups.contains(&group) {
            groups.push(group);
        }
    }
    groups.join(" ")
}

#[test]
fn debian_package_in_a_fresh_vm() {
    require_root();
    let groups_env = std::env::var("PYCELL_VM_GROUPS").unwrap_or_else(|_| all_groups());
    let groups: BTreeSet<String> = groups_env.split_whitespace().map(String::from).collect();
    let script = repo_root().join("scripts/vm-test");
    let start = Instant::now();
    let mut child = Command::new(&script)
        .env("PYCELL_VM_GROUPS", &groups_env)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        // Its own process group, so that a timeout kills exactly what we started.
        .process_group(0)
        .spawn()
        .unwrap_or_else(|e| panic!("spawning {}: {e}", script.display()));

    let (tx, rx) = mpsc::channel::<(bool, String)>();
    let out = child.stdout.take().expect("piped stdout");
    let err = child.stderr.take().expect("piped stderr");
    let tx2 = tx.clone();
    let readers = [
        thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                let _ = tx.send((true, line));
            }
        }),
        thread::spawn(move || {
            for line in BufReader::new(err).lines().map_while(Result::ok) {
                let _ = tx2.send((false, line));
            }
        }),
    ];

    let mut stdout_lines = Vec::new();
    let status = loop {
        while let Ok((is_stdout, line)) = rx.try_recv() {
            // Shown by the test harness if the test fails (or with --nocapture).
            eprintln!("{line}");
            if is_stdout {
                stdout_lines.push(line);
            }
        }
        if let Some(status) = child.try_wait().expect("try_wait") {
            break status;
        }
        if start.elapsed() > GUARD {
            let pgid = nix::unistd::Pid::from_raw(-(child.id() as i32));
            let _ = nix::sys::signal::kill(pgid, nix::sys::signal::Signal::SIGKILL);
            let _ = child.wait();
            panic!("scripts/vm-test did not finish within {GUARD:?}; killed its process group");
        }
        thread::sleep(Duration::from_millis(200));
    };
    for r in readers {
        let _ = r.join();
    }
    while let Ok((is_stdout, line)) = rx.try_recv() {
        eprintln!("{line}");
        if is_stdout {
            stdout_lines.push(line);
        }
    }

    // "PASS name: note" / "FAIL name: detail" -> name
    let name_of = |rest: &str| {
        rest.split([':', ' '])
            .next()
            .unwrap_or_default()
            .to_string()
    };
    let failed: Vec<&String> = stdout_lines
        .iter()
        .filter(|l| l.starts_with("FAIL "))
        .collect();
    let reported: BTreeSet<String> = stdout_lines
        .iter()
        .filter_map(|l| l.strip_prefix("PASS ").or_else(|| l.strip_prefix("FAIL ")))
        .map(name_of)
        .collect();
    let passed = stdout_lines
        .iter()
        .filter(|l| l.starts_with("PASS "))
        .count();
    let missing: Vec<String> = expected_checks(&groups)
        .into_iter()
        .filter(|c| !reported.contains(c))
        .collect();
    assert!(
        failed.is_empty() && missing.is_empty() && status.success(),
        "VM test: {} failed, missing {:?}, exit {:?} after {:?}\n{}",
        failed.len(),
        missing,
        status.code(),
        start.elapsed(),
        failed
            .iter()
            .map(|s| s.as_str())
            .collect::<Vec<_>>()
            .join("\n")
    );
    eprintln!("VM test: {} checks passed in {:?}", passed, start.elapsed());
}
