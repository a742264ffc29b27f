//! Resource limits: memory, pids, output, workspace disk.

#![forbid(unsafe_code)]

use pycell_tests::{refusal, refused_layers, run_code, status_of, termination_of};
use serde_json::Value;

#[test]
fn memory_hog_is_killed_as_oom() {
    // Touch every page: `bytes * n` writes the memory, unlike bytearray(n).
    let code = r#"
chunks = []
for i in range(512):
    chunks.append(b"\x01" * (1 << 20))
print("allocated", len(chunks), "MiB")
"#;
    let out = run_code("hog.py", code, &["--memory", "64M"], &[]);
    assert_eq!(status_of(&out), "oom", "{}", out.describe());
    assert_eq!(out.exit_code, Some(137), "{}", out.describe());
    assert!(
        !out.result()["stdout"]
            .as_str()
            .unwrap_or_default()
            .contains("allocated"),
        "the hog finished its 512 MiB under a 64 MiB limit:\n{}",
        out.describe()
    );
    let r = out.result();
    let memory = refusal(&r, "memory", "limits.memory");
    assert!(
        memory["object"].as_str().unwrap().contains("64 MiB"),
        "{memory}"
    );
    assert_eq!(termination_of(&r), "oom_kill");
    let at_kill = r["termination"]["memory_bytes"].as_u64().unwrap_or(0);
    assert!(
        at_kill > 32 << 20,
        "memory at the kill: {at_kill}\n{}",
        out.describe()
    );
}

#[test]
fn a_run_refused_nothing_has_no_refusal_and_says_it_exited() {
    let out = run_code("fine.py", "print(sum(range(10)))", &[], &[]);
    let r = out.result();
    assert_eq!(status_of(&out), "ok", "{}", out.describe());
    assert_eq!(r["refusals"], serde_json::json!([]), "{}", out.describe());
    assert_eq!(termination_of(&r), "exited");
}

#[test]
fn fork_bomb_is_bounded_by_pids() {
    // Bounded on purpose: at most 200 attempts, children sleep and are
    // killed and reaped by the parent before it exits.
    let code = r#"
import json, os, signal, time
kids, failures = [], 0
for _ in range(200):
    try:
        pid = os.fork()
    except OSError:
        failures += 1
        continue
    if pid == 0:
        time.sleep(30)
        os._exit(0)
    kids.append(pid)
for pid in kids:
    os.kill(pid, signal.SIGKILL)
for pid in kids:
    os.waitpid(pid, 0)
print(json.dumps({"forked": len(kids), "failures": failures}))
"#;
    let out = run_code("forks.py", code, &["--pids", "16", "--timeout", "20"], &[]);
    let status = status_of(&out);
    assert!(
        status == "ok" || status == "error",
        "status {status:?}, want ok or error\n{}",
        out.describe()
    );
    let stdout = out.result()["stdout"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let counts: Value = serde_json::from_str(stdout.trim()).unwrap_or_else(|e| {
        panic!(
            "script output is not its JSON count ({e})\n{}",
            out.describe()
        )
    });
    let forked = counts["forked"].as_u64().expect("forked count");
    assert!(
        forked > 0 && forked < 16,
        "forked {forked} children under --pids 16 (want 1..15)\n{}",
        out.describe()
    );
    assert!(
        counts["failures"].as_u64().unwrap_or(0) > 0,
        "no fork failed under --pids 16\n{}",
        out.describe()
    );
    // The kernel counted each refused fork (pids.events).
    let result = out.result();
    let pids = refusal(&result, "pids", "limits.pids");
    assert!(
        pids["object"].as_str().unwrap().contains("limit 16"),
        "{pids}"
    );
    assert!(
        pids["count"].as_u64().unwrap() >= counts["failures"].as_u64().unwrap(),
        "{pids}"
    );
}

#[test]
fn output_flood_is_truncated() {
    let code = r#"
import sys
line = "x" * 1023 + "\n"
for _ in range(10 * 1024):
    sys.stdout.write(line)
"#;
    let out = run_code("flood.py", code, &["--max-output", "64K"], &[]);
    let r = out.result();
    assert_eq!(r["status"], "ok", "{}", out.describe());
    assert_eq!(r["stdout_truncated"], true, "{}", out.describe());
    let len = r["stdout"].as_str().map(str::len).unwrap_or(usize::MAX);
    assert!(
        len <= 64 * 1024,
        "stdout has {len} bytes under --max-output 64K"
    );
    assert!(len > 0, "stdout is empty: the first 64 KiB should be kept");
    let output = refusal(&r, "output", "limits.max_output");
    assert!(
        output["object"]
            .as_str()
            .unwrap()
            .starts_with("stdout past 64 KiB"),
        "{output}"
    );
    assert_eq!(refused_layers(&r), ["output"]);
}

#[test]
fn workspace_fills_to_enospc() {
    let code = r#"
import errno, json, os
total, err = 0, None
chunk = b"\xab" * (1 << 20)
with open("/workspace/fill", "wb", buffering=0) as f:
    for _ in range(100):
        try:
            total += f.write(chunk)
        except OSError as e:
            err = errno.errorcode.get(e.errno, str(e.errno))
            break
print(json.dumps({"errno": err, "total": total}))
"#;
    let out = run_code("fill.py", code, &["--disk", "8M"], &[]);
    let stdout = out.result()["stdout"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let v: Value = serde_json::from_str(stdout.trim())
        .unwrap_or_else(|e| panic!("script output is not JSON ({e})\n{}", out.describe()));
    assert_eq!(v["errno"], "ENOSPC", "{}", out.describe());
    let total = v["total"].as_u64().expect("total");
    assert!(
        (6 << 20..=8 << 20).contains(&total),
        "wrote {total} bytes into an 8 MiB workspace (want 6..=8 MiB)\n{}",
        out.describe()
    );
    let result = out.result();
    let disk = refusal(&result, "disk", "limits.disk");
    assert!(disk["object"].as_str().unwrap().contains("8 MiB"), "{disk}");
}

/// Every process of a run is in the run's cgroup in every hierarchy its
/// limits and its kill use (v1: memory, pids, cpu, cpuacct, freezer, which
/// the jail joins by itself; v2: the one), as the host sees it.
#[test]
fn every_process_of_a_run_is_in_its_cgroup_in_every_hierarchy() {
    use pycell_tests::{descendants_of, pycell_bin};
    use std::process::{Command, Stdio};
    use std::time::{Duration, Instant};
    let mut child = Command::new(pycell_bin())
        .args(["run", "--embedded", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("starting pycell");
    use std::io::Write;
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(b"import time\ntime.sleep(20)\n").unwrap();
    drop(stdin);
    let deadline = Instant::now() + Duration::from_secs(20);
    let jail = loop {
        let below = descendants_of(child.id());
        let ready = below.iter().any(|p| p.name.starts_with("python"));
        if ready || Instant::now() > deadline {
            break below;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let v2 = std::path::Path::new("/sys/fs/cgroup/cgroup.controllers").exists();
    let mut checked = Vec::new();
    for p in jail
        .iter()
        .filter(|p| p.name == "pycell-init" || p.name.starts_with("python"))
    {
        let cgroups = std::fs::read_to_string(format!("/proc/{}/cgroup", p.pid)).unwrap();
        let wanted: &[&str] = match v2 {
            true => &[""],
            false => &["memory", "pids", "cpu", "cpuacct", "freezer"],
        };
        for controller in wanted {
            let line = cgroups
                .lines()
                .find(|l| {
                    let ctrls = l.split(':').nth(1).unwrap_or("");
                    ctrls.split(',').any(|c| c == *controller)
                })
                .unwrap_or_else(|| panic!("no {controller:?} line: {cgroups}"));
            let leaf = line.rsplit('/').next().unwrap();
            assert!(
                leaf.starts_with("pycell-") && leaf.contains("-r-"),
                "{} ({}) is not in its run's {controller} cgroup: {cgroups}",
                p.name,
                p.pid
            );
            checked.push(controller.to_string());
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    let _ = pycell_tests::still_alive_after(&jail, Duration::from_secs(10));
    assert!(checked.len() >= 2 * if v2 { 1 } else { 5 }, "{jail:?}");
}
