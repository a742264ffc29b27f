//! `pycell batch`: many programs, each in a jail of its own, results as
//! JSONL in input order (or as they end); bad lines refused, the rest run;
//! a SIGKILL of pycell mid-batch leaves no sandbox and no cgroup behind.

#![forbid(unsafe_code)]

use pycell_tests::{sigkill_batch_leaves_nothing, via, Pycell, Via};
use serde_json::{json, Value};

/// `pycell batch` in the tests' mode, on `lines` as its stdin.
fn batch(extra: &[&str], lines: &[Value]) -> (Vec<Value>, pycell_tests::Outcome) {
    let mut args = vec!["batch"];
    if via() == Via::Embedded {
        args.push("--embedded");
    }
    args.extend_from_slice(extra);
    args.push("-");
    let input: String = lines.iter().map(|l| format!("{l}\n")).collect();
    let out = Pycell::new(args).stdin(input).run();
    let results = out
        .stdout_str()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    (results, out)
}

/// What a run sees of itself: its workspace, host uid and namespaces, and
/// when it ran (the real-time clock, which a time namespace leaves alone).
const SELF_REPORT: &str = r#"
import json, os, sys, time
began = time.time()
mine = sys.argv[1]
open(f"/workspace/{mine}", "w").write(mine)
time.sleep(0.3)
ns = {n: os.stat(f"/proc/self/ns/{n}").st_ino for n in ("pid", "mnt", "net", "user", "ipc", "uts")}
uid_map = open("/proc/self/uid_map").read().split()
files = sorted(os.listdir("/workspace"))
print(json.dumps({"files": files, "host_uid": uid_map[1], "ns": ns, "span": [began, time.time()]}))
"#;

#[test]
fn every_line_runs_in_a_jail_of_its_own_and_results_come_in_input_order() {
    let lines: Vec<Value> = (0..6)
        .map(|i| json!({"id": format!("task-{i}"), "code": SELF_REPORT, "args": [format!("mine-{i}")]}))
        .collect();
    let (results, out) = batch(&["--jobs", "3"], &lines);
    assert_eq!(out.exit_code, Some(0), "{}", out.describe());
    assert_eq!(results.len(), 6, "{}", out.describe());
    let mut seen_by = Vec::new();
    for (i, r) in results.iter().enumerate() {
        assert_eq!(r["line"], i + 1, "{r}");
        assert_eq!(r["id"], format!("task-{i}"), "{r}");
        assert_eq!(r["result"]["status"], "ok", "{r}");
        let seen: Value = serde_json::from_str(r["result"]["stdout"].as_str().unwrap()).unwrap();
        // Only its own files: the script and what it wrote.
        assert_eq!(
            seen["files"],
            json!(["main.py", format!("mine-{i}")]),
            "{r}"
        );
        seen_by.push(seen);
    }
    // Runs that overlapped in time never shared a host uid or a namespace
    // (the kernel may reuse either once a run is gone); some did overlap.
    let span = |v: &Value| {
        (
            v["span"][0].as_f64().unwrap(),
            v["span"][1].as_f64().unwrap(),
        )
    };
    let mut overlapping = 0;
    for (i, a) in seen_by.iter().enumerate() {
        for b in &seen_by[i + 1..] {
            let ((a0, a1), (b0, b1)) = (span(a), span(b));
            if a0 > b1 || b0 > a1 {
                continue;
            }
            overlapping += 1;
            assert_ne!(a["host_uid"], b["host_uid"], "{a} {b}");
            for (name, ino) in a["ns"].as_object().unwrap() {
                assert_ne!(&b["ns"][name], ino, "{name} shared: {a} {b}");
            }
        }
    }
    assert!(
        overlapping >= 2,
        "--jobs 3 ran nothing at once: {seen_by:?}"
    );
}

#[test]
fn unordered_results_come_as_runs_end() {
    let lines = [
        json!({"id": "slow", "code": "import time; time.sleep(1.5)"}),
        json!({"id": "fast-1", "code": "print(1)"}),
        json!({"id": "fast-2", "code": "print(2)"}),
    ];
    let (results, out) = batch(&["--jobs", "3", "--unordered"], &lines);
    assert_eq!(results.len(), 3, "{}", out.describe());
    assert_eq!(results[2]["id"], "slow", "{}", out.describe());
    let (ordered, out) = batch(&["--jobs", "3"], &lines);
    assert_eq!(ordered[0]["id"], "slow", "{}", out.describe());
}

#[test]
fn a_bad_line_gets_a_refusal_that_names_it_and_the_others_still_run() {
    let too_many_args: Vec<String> = (0..2000).map(|i| i.to_string()).collect();
    let lines = [
        json!({"code": "print('first')"}),
        json!("not an object"),
        json!({"cod": "print(1)"}),
        json!({"code": "", "args": too_many_args}),
        json!({"code": "print(1)", "policy": "/etc/shadow"}),
        json!({"id": 5, "code": "import sys; sys.exit(3)"}),
    ];
    let (results, out) = batch(&[], &lines);
    assert_eq!(out.exit_code, Some(0), "{}", out.describe());
    let status: Vec<&str> = results
        .iter()
        .map(|r| r["result"]["status"].as_str().unwrap())
        .collect();
    assert_eq!(
        status,
        ["ok", "refused", "refused", "refused", "refused", "error"],
        "{}",
        out.describe()
    );
    // A line never makes pycell read a file as root: a policy file is the
    // command line's to name (its content would show in the refusal).
    for (r, says) in results[1..5].iter().zip([
        "not a JSON object",
        "unknown field `cod`",
        "args",
        "\"/etc/shadow\" is a file path",
    ]) {
        let message = r["result"]["error"]["message"].as_str().unwrap();
        assert!(
            message.starts_with(&format!("line {}", r["line"])),
            "{message}"
        );
        assert!(message.contains(says), "{message}");
        assert_eq!(r["result"]["error"]["code"], "invalid_request", "{r}");
    }
    assert_eq!(results[5]["result"]["exit_code"], 3);
}

#[test]
fn a_sigkill_of_pycell_mid_batch_leaves_no_sandbox_and_no_cgroup() {
    let parent = format!("pycell-test-batch-kill-{}", std::process::id());
    // Three sandboxes at once, no more: three python programs below pycell.
    sigkill_batch_leaves_nothing(&["--jobs", "3"], &parent, 8, 3);
}

/// Through pycelld: each line on a connection of its own, its admission
/// deciding what runs at once; the results as embedded.
#[test]
fn a_batch_through_pycelld_runs_every_line_and_refuses_bad_ones() {
    let d = pycell_tests::daemon::Daemon::start("");
    let socket = d.socket();
    let lines = [
        json!({"id": "a", "code": "print(6 * 7)"}),
        json!({"id": "b", "code": "print(1)", "limits": {"timeout_s": 100000}}),
        json!({"id": "c", "code": "import os; print(sorted(os.listdir('/workspace')))", "files": [{"name": "in.txt", "data_base64": "aGk="}]}),
    ];
    let input: String = lines.iter().map(|l| format!("{l}\n")).collect();
    let out = Pycell::new([
        "batch",
        "--jobs",
        "2",
        "--socket",
        socket.to_str().unwrap(),
        "-",
    ])
    .stdin(input)
    .run();
    assert_eq!(out.exit_code, Some(0), "{}", out.describe());
    let results: Vec<Value> = out
        .stdout_str()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(results.len(), 3, "{}", out.describe());
    assert_eq!(results[0]["result"]["stdout"], "42\n", "{}", out.describe());
    // Over the policy's ceiling: pycelld's own refusal, for that line only.
    assert_eq!(
        results[1]["result"]["status"],
        "refused",
        "{}",
        out.describe()
    );
    assert_eq!(results[1]["result"]["error"]["code"], "invalid_request");
    assert_eq!(
        results[2]["result"]["stdout"],
        "['in.txt', 'main.py']\n",
        "{}",
        out.describe()
    );
    // Each ran under the daemon's sandbox uids.
    let uid = results[0]["result"]["layers"]["sandbox_uid"]
        .as_u64()
        .unwrap() as u32;
    assert!(uid >= d.uid_base && uid < d.uid_base + 64, "{uid}");
    // `--policy` is the policy of lines that name none, through pycelld
    // as embedded; a line's own policy wins; a line's policy file is
    // refused before any mode is asked, saying why.
    let input = [
        json!({"code": "print(1)"}),
        json!({"code": "print(2)", "policy": "default"}),
        json!({"code": "print(3)", "policy": "./mine.toml"}),
    ]
    .map(|l| format!("{l}\n"))
    .concat();
    let socket = socket.to_str().unwrap();
    let args = [
        "batch",
        "--socket",
        socket,
        "--policy",
        "no-such-policy",
        "-",
    ];
    let out = Pycell::new(args).stdin(input).run();
    let results: Vec<Value> = out
        .stdout_str()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(results.len(), 3, "{}", out.describe());
    let r = |i: usize| &results[i]["result"];
    assert_eq!(
        r(0)["error"]["code"],
        "invalid_policy",
        "{}",
        out.describe()
    );
    assert_eq!(r(1)["stdout"], "2\n", "{}", out.describe());
    assert_eq!(
        r(2)["error"]["code"],
        "invalid_request",
        "{}",
        out.describe()
    );
    let why = r(2)["error"]["message"].as_str().unwrap_or_default();
    assert!(why.contains("--policy FILE"), "{why}");
}
