//! Runs forked from a zygote (`pycell batch --embedded --zygote`): each is
//! jailed exactly as a cold run is (the probe's whole report compared),
//! overlapping runs share no uid, namespace, file or random state, limits
//! hold, and a SIGKILL of pycell or of the zygote leaves nothing behind.

#![forbid(unsafe_code)]

use std::time::Duration;

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use pycell_tests::{
    assert_no_cgroups_under, batch_of_sleepers, probe_path, sigkill_batch_leaves_nothing,
    still_alive_after, Pycell,
};
use serde_json::{json, Value};

/// `pycell batch --embedded --zygote` on `lines`; each line's result.
fn forked(extra: &[&str], lines: &[Value]) -> Vec<Value> {
    let mut args = vec!["batch", "--embedded", "--zygote"];
    args.extend_from_slice(extra);
    args.push("-");
    let input: String = lines.iter().map(|l| format!("{l}\n")).collect();
    let out = Pycell::new(args).stdin(input).run();
    assert_eq!(out.exit_code, Some(0), "{}", out.describe());
    let results: Vec<Value> = out
        .stdout_str()
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap()["result"].clone())
        .collect();
    assert_eq!(results.len(), lines.len(), "{}", out.describe());
    results
}

/// The probe's report with what differs between any two runs taken out:
/// descriptor inode numbers, the loopback port it bound, the length of its
/// /proc/self/status, and init's
/// command line (a cloned jail's init hides the jailer's; one forked from
/// a zygote shows the zygote's python's, like its program's).
fn comparable(report: &Value) -> Value {
    let mut r = report.clone();
    let kinds: serde_json::Map<_, _> = report["fds"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(k, v)| (k.clone(), json!(v.as_str().unwrap().split(':').next())))
        .collect();
    r["fds"] = kinds.into();
    r["loopback_inside"]["value"]["port"] = json!(0);
    // Its own status file's length (memory figures) varies from run to run.
    r["read_allowed"]["/proc/self/status"]["value"]["bytes"] = json!(0);
    for key in ["pids", "pids_after"] {
        r[key]["cmdlines"] = json!(null);
    }
    r
}

const PROBE_ARGS: [&str; 4] = [
    "--host-port",
    "9",
    "--abstract-socket",
    "pycell-zygote-test",
];

#[test]
fn a_run_forked_from_a_zygote_is_jailed_exactly_as_a_cold_run() {
    let probe = std::fs::read_to_string(probe_path()).unwrap();
    let line = json!({"code": probe, "filename": "probe.py", "args": PROBE_ARGS});
    let zygote = &forked(&[], &[line])[0];
    assert_eq!(zygote["status"], "ok", "{zygote}");
    assert_eq!(zygote["warm"], true, "not forked from the zygote: {zygote}");
    let mut args = vec!["run".to_string(), "--embedded".into(), "--json".into()];
    args.push(probe_path().display().to_string());
    args.push("--".into());
    args.extend(PROBE_ARGS.iter().map(|s| s.to_string()));
    let cold = Pycell::new(args).run().result();
    assert_eq!(cold["status"], "ok", "{cold}");
    let report =
        |r: &Value| -> Value { serde_json::from_str(r["stdout"].as_str().unwrap()).unwrap() };
    let (z, c) = (comparable(&report(zygote)), comparable(&report(&cold)));
    assert_eq!(z["check_errors"], json!({}), "{z}");
    for (key, cold_value) in c.as_object().unwrap() {
        assert_eq!(&z[key], cold_value, "{key} differs from a cold run's");
    }
    assert_eq!(z.as_object().unwrap().len(), c.as_object().unwrap().len());
    // The same layers, but for the sandbox uid (its own, a slot's) and
    // the cgroup's name (which has the uid and the run id).
    let mut layers = zygote["layers"].clone();
    layers["sandbox_uid"] = cold["layers"]["sandbox_uid"].clone();
    layers["cgroup"]["name"] = cold["layers"]["cgroup"]["name"].clone();
    assert_eq!(layers, cold["layers"]);
    assert_ne!(
        zygote["layers"]["sandbox_uid"],
        cold["layers"]["sandbox_uid"]
    );
}

/// What a run sees of itself: its files, ids, namespaces, random draws,
/// and when it ran.
const SELF_REPORT: &str = r#"
import json, os, random, sys, time
began = time.time()
mine = sys.argv[1]
open(f"/workspace/{mine}", "w").write(mine)
time.sleep(0.3)
ns = {n: os.stat(f"/proc/self/ns/{n}").st_ino for n in ("pid", "mnt", "net", "user", "ipc", "uts", "cgroup", "time")}
print(json.dumps({
    "files": sorted(os.listdir("/workspace")),
    "uid_map": open("/proc/self/uid_map").read().split(),
    "ns": ns,
    "random": random.random(),
    "urandom": os.urandom(8).hex(),
    "span": [began, time.time()],
}))
"#;

#[test]
fn overlapping_runs_of_one_zygote_share_no_uid_namespace_file_or_random_state() {
    let lines: Vec<Value> = (0..6)
        .map(|i| json!({"code": SELF_REPORT, "args": [format!("mine-{i}")]}))
        .collect();
    let results = forked(&["--jobs", "3"], &lines);
    let mut seen = Vec::new();
    for (i, r) in results.iter().enumerate() {
        assert_eq!(r["status"], "ok", "{r}");
        assert_eq!(r["warm"], true, "not forked from the zygote: {r}");
        let s: Value = serde_json::from_str(r["stdout"].as_str().unwrap()).unwrap();
        assert_eq!(s["files"], json!(["main.py", format!("mine-{i}")]), "{r}");
        assert_eq!(s["uid_map"][0], "1000", "{s}");
        seen.push((s, r["layers"]["sandbox_uid"].clone()));
    }
    let span = |v: &Value| {
        (
            v["span"][0].as_f64().unwrap(),
            v["span"][1].as_f64().unwrap(),
        )
    };
    let mut overlapping = 0;
    for (i, (a, a_uid)) in seen.iter().enumerate() {
        for (b, b_uid) in &seen[i + 1..] {
            // Never the zygote's random state, whenever they ran.
            assert_ne!(a["random"], b["random"], "{a} {b}");
            assert_ne!(a["urandom"], b["urandom"], "{a} {b}");
            let ((a0, a1), (b0, b1)) = (span(a), span(b));
            if a0 > b1 || b0 > a1 {
                continue;
            }
            overlapping += 1;
            assert_ne!(a_uid, b_uid, "one host uid at once: {a} {b}");
            assert_ne!(a["uid_map"], b["uid_map"], "{a} {b}");
            for (name, ino) in a["ns"].as_object().unwrap() {
                assert_ne!(&b["ns"][name], ino, "{name} shared: {a} {b}");
            }
        }
    }
    assert!(overlapping >= 2, "--jobs 3 ran nothing at once: {seen:?}");
}

#[test]
fn numpy_imported_by_the_zygote_draws_new_numbers_in_every_run() {
    let code = "import sys, numpy\nprint('numpy' in sys.modules, numpy.random.rand())";
    let lines: Vec<Value> = (0..3).map(|_| json!({"code": code})).collect();
    let results = forked(&["--policy", "data-science"], &lines);
    let mut draws = Vec::new();
    for r in &results {
        assert_eq!(r["status"], "ok", "{r}");
        assert_eq!(r["warm"], true, "not forked from the zygote: {r}");
        let out = r["stdout"].as_str().unwrap();
        assert!(out.starts_with("True "), "{out}");
        draws.push(out.to_string());
    }
    draws.sort();
    draws.dedup();
    assert_eq!(draws.len(), 3, "the same numpy draws: {results:?}");
}

#[test]
fn limits_hold_for_runs_from_a_zygote() {
    let lines = [
        // Past the default policy's 512 MiB.
        json!({"code": "b = bytearray(1 << 30)\nb[::4096] = b'x' * (len(b) // 4096)"}),
        // Past its 64 pids: forks that wait, bounded.
        json!({"code": "import os, time\nn = 0\ntry:\n    for _ in range(200):\n        if os.fork() == 0:\n            time.sleep(5); os._exit(0)\n        n += 1\nexcept OSError as e:\n    print('stopped at', n, e.errno)\n"}),
        json!({"code": "import time; time.sleep(30)", "limits": {"timeout_s": 1.0}}),
        json!({"code": "print('fine')"}),
    ];
    let results = forked(&["--jobs", "2"], &lines);
    for r in &results {
        assert_eq!(r["warm"], true, "not forked from the zygote: {r}");
    }
    assert_eq!(results[0]["status"], "oom", "{}", results[0]);
    let out = results[1]["stdout"].as_str().unwrap();
    assert!(out.starts_with("stopped at "), "{}", results[1]);
    let forks: u32 = out.split_whitespace().nth(2).unwrap().parse().unwrap();
    assert!(forks < 64, "{forks} forks under a pids limit of 64");
    assert_eq!(results[2]["status"], "timeout", "{}", results[2]);
    assert!(
        results[2]["wall_ms"].as_f64().unwrap() < 5000.0,
        "{}",
        results[2]
    );
    assert_eq!(results[3]["stdout"], "fine\n");
}

#[test]
fn a_sigkill_of_pycell_leaves_no_zygote_no_run_and_no_cgroup() {
    let parent = format!("pycell-test-zygote-kill-{}", std::process::id());
    // Three runs and the zygote.
    sigkill_batch_leaves_nothing(&["--zygote", "--jobs", "3"], &parent, 6, 4);
}

#[test]
fn when_the_zygote_dies_its_runs_end_as_zygote_died_and_the_batch_goes_on_cold() {
    let parent = format!("pycell-test-zygote-dies-{}", std::process::id());
    let (child, below) = batch_of_sleepers(&["--zygote", "--jobs", "3"], &parent, 3, 4);
    // The zygote: the python whose parent is a jail's init that is the
    // child of a jailer right below pycell.
    let jailers: Vec<u32> = below
        .iter()
        .filter(|p| p.ppid == child.id() && p.name == "pycell-jailer")
        .map(|p| p.pid)
        .collect();
    let zygote = below
        .iter()
        .find(|p| {
            p.name.starts_with("python")
                && below
                    .iter()
                    .any(|i| i.pid == p.ppid && jailers.contains(&i.ppid))
        })
        .unwrap_or_else(|| panic!("no zygote in {below:?}"));
    kill(Pid::from_raw(zygote.pid as i32), Signal::SIGKILL).expect("SIGKILL to the zygote");
    let out = pycell_tests::output_guarded(child, Duration::from_secs(60));
    let results: Vec<Value> = out
        .stdout
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap()["result"].clone())
        .collect();
    assert_eq!(results.len(), 4, "{results:?}");
    // The runs it had forked died with its pid namespace, and say so.
    for r in &results[..3] {
        assert_eq!(r["status"], "killed", "{r}");
        assert_eq!(r["error"]["code"], "zygote_died", "{r}");
    }
    // The next line ran all the same, cold (as isolated, python started).
    assert_eq!(results[3]["status"], "ok", "{}", results[3]);
    assert_eq!(results[3]["stdout"], "after\n");
    assert_eq!(results[3]["warm"], false, "{}", results[3]);
    let left = still_alive_after(&below, Duration::from_secs(10));
    assert!(left.is_empty(), "left running: {left:?}");
    assert_no_cgroups_under(&parent);
}

/// A run that holds 61 sleeping children for 12 s (with its init and
/// itself, 63 of its 64 pids), printing how many it got, when it held
/// them and when it let go (wall clock).
const HOLDS_CHILDREN: &str = r#"
import os, time
kids = []
try:
    for _ in range(61):
        pid = os.fork()
        if pid == 0:
            time.sleep(12)
            os._exit(0)
        kids.append(pid)
except OSError:
    pass
held = time.time()
for pid in kids:
    os.waitpid(pid, 0)
print(len(kids), held, time.time())
"#;

/// A run that waits 5 s, then forks 10 children that sleep 1 s, all held
/// at once, printing how many it got, the errno that stopped it, when,
/// and multiprocessing's authkey.
const FORKS_LATER: &str = r#"
import multiprocessing, os, time
time.sleep(5)
start = time.time()
kids, errno = [], None
for _ in range(10):
    try:
        pid = os.fork()
    except OSError as e:
        errno = e.errno
        break
    if pid == 0:
        time.sleep(1)
        os._exit(0)
    kids.append(pid)
end = time.time()
for pid in kids:
    os.waitpid(pid, 0)
print(len(kids), errno, start, end, multiprocessing.current_process().authkey.hex())
"#;

#[test]
fn runs_of_one_zygote_have_their_own_process_budgets_and_secrets() {
    // A zygote that imported multiprocessing (its authkey is drawn then).
    let default = std::fs::read_to_string(pycell_tests::repo_root().join("policies/default.toml"))
        .expect("default policy");
    let policy = default
        .replace("name = \"default\"", "name = \"mp-warm\"")
        .replace("imports = []", "imports = [\"multiprocessing\"]");
    assert!(
        policy.contains("\"multiprocessing\""),
        "no [warm] imports line"
    );
    let dir = tempfile::tempdir().expect("policy dir");
    let file = dir.path().join("mp-warm.toml");
    std::fs::write(&file, policy).unwrap();
    let file = file.to_string_lossy().into_owned();
    let lines = [
        json!({"code": HOLDS_CHILDREN}),
        json!({"code": FORKS_LATER}),
        json!({"code": "import multiprocessing\nprint(multiprocessing.current_process().authkey.hex())"}),
    ];
    let results = forked(&["--jobs", "2", "--policy", &file], &lines);
    for r in &results {
        assert_eq!(r["status"], "ok", "{r}");
        assert_eq!(r["warm"], true, "not forked from the zygote: {r}");
    }
    let words = |r: &Value| -> Vec<String> {
        let out = r["stdout"].as_str().unwrap_or_default();
        out.split_whitespace().map(str::to_string).collect()
    };
    let (held, later) = (words(&results[0]), words(&results[1]));
    let time = |w: &[String], i: usize| w[i].parse::<f64>().unwrap();
    // Before runs had namespaces of their own slot's, every run of a
    // zygote counted against one RLIMIT_NPROC budget: this one stopped at
    // 59, the other could not fork at all.
    assert_eq!(held[0], "61", "{}", results[0]);
    // The second run forked while the first held its children.
    assert!(
        time(&held, 1) < time(&later, 2) && time(&later, 3) < time(&held, 2),
        "the runs did not overlap: {} {}",
        results[0],
        results[1]
    );
    assert_eq!(
        (later[0].as_str(), later[1].as_str()),
        ("10", "None"),
        "one run's children took another's process budget: {}",
        results[1]
    );
    let zygote_key = words(&results[2]);
    assert_ne!(
        later[4], zygote_key[0],
        "two runs share multiprocessing's authkey"
    );
}
