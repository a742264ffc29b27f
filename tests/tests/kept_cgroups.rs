//! Cgroups reused across runs (issue 50): on cgroup v1 pycelld's runs keep
//! their emptied cgroup for the next run, which takes it by renaming it,
//! and each run's accounting stays its own. A one-off `pycell run` keeps
//! nothing; pycelld removes what is kept when it stops.

#![forbid(unsafe_code)]

use std::collections::BTreeSet;
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use pycell_protocol::messages::{LimitOverrides, RunRequest};
use pycell_protocol::result::RunResult;
use pycell_tests::daemon::Daemon;
use pycell_tests::{find_cgroups, run_code};
use pycell_wire::report::{CgroupVersion, RunStatus};

fn run(d: &Daemon, code: &str, memory: Option<u64>) -> RunResult {
    let req = RunRequest {
        code: code.into(),
        limits: LimitOverrides {
            memory_bytes: memory,
            ..Default::default()
        },
        ..Default::default()
    };
    d.client().run(req, |_, _| {}).expect("a result")
}

/// The kept sets and run cgroups under `parent`, once no run's own is
/// left (a jailer keeps or removes its run's cgroup just after the result).
fn kept_once_settled(parent: &str) -> Vec<PathBuf> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let under = find_cgroups(|n| n.starts_with("pycell-"))
            .into_iter()
            .filter(|p| p.to_string_lossy().contains(parent))
            .collect::<Vec<_>>();
        let runs: Vec<_> = under
            .iter()
            .filter(|p| !p.to_string_lossy().contains("pycell-kept-"))
            .collect();
        if runs.is_empty() {
            return under;
        }
        assert!(Instant::now() < deadline, "run cgroups stay: {runs:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The kept sets' names (one per set, each present in every hierarchy).
fn set_names(dirs: &[PathBuf]) -> Vec<String> {
    let mut names: Vec<String> = dirs
        .iter()
        .filter_map(|d| d.file_name()?.to_str().map(str::to_string))
        .collect();
    names.sort();
    names.dedup();
    names
}

#[test]
fn pycellds_runs_reuse_one_kept_cgroup_each_with_its_own_accounting() {
    let mut d = Daemon::start("");
    let hog = "b = b'\\x01' * (150 << 20)\nimport time\nt = time.process_time()\nwhile time.process_time() - t < 0.3: pass\nprint('done')";
    let a = run(&d, hog, None);
    assert_eq!(a.status, RunStatus::Ok, "{a:?}\n{}", d.log());
    let v1 = a.layers.as_ref().unwrap().cgroup.version == CgroupVersion::V1;
    assert!(a.peak_memory_bytes >= 150 << 20, "{a:?}");
    assert!(a.cpu_ms >= 250.0, "{a:?}");
    let after_a = kept_once_settled(&d.cgroup_parent);
    if !v1 {
        // v2 cannot rename a cgroup: a run's is removed, as before.
        assert!(after_a.is_empty(), "kept on v2: {after_a:?}");
        return;
    }
    assert_eq!(set_names(&after_a), ["pycell-kept-0"], "{after_a:?}");
    assert!(
        after_a.len() >= 4,
        "a whole set, one per hierarchy: {after_a:?}"
    );

    // The next run takes it (a new cgroup would be kept beside it as
    // pycell-kept-1) and measures only itself.
    let b = run(&d, "print(1)", None);
    assert_eq!(b.status, RunStatus::Ok, "{b:?}");
    assert!(
        b.peak_memory_bytes < 100 << 20,
        "a's peak carried over: {b:?}"
    );
    assert!(b.cpu_ms < 250.0, "a's CPU time carried over: {b:?}");
    assert_eq!(
        set_names(&kept_once_settled(&d.cgroup_parent)),
        ["pycell-kept-0"]
    );

    // An OOM kill is counted for its own run, not for the next one.
    let oom = "chunks = []\nfor i in range(256):\n    chunks.append(b'\\x01' * (1 << 20))";
    let c = run(&d, oom, Some(64 << 20));
    assert_eq!(c.status, RunStatus::Oom, "{c:?}");
    let e = run(&d, "print('after')", None);
    assert_eq!(e.status, RunStatus::Ok, "{e:?}");
    assert!(e.refusals.is_empty(), "the oom carried over: {e:?}");
    assert_eq!(e.termination.as_ref().unwrap().reason_str(), "exited");
    assert_eq!(
        set_names(&kept_once_settled(&d.cgroup_parent)),
        ["pycell-kept-0"]
    );

    // Stopping pycelld removes what it kept.
    d.signal(Signal::SIGTERM);
    let status = d.wait(Duration::from_secs(15));
    assert!(status.success(), "{status:?}\n{}", d.log());
    assert!(d.daemon_cgroups().is_empty(), "{:?}", d.daemon_cgroups());
}

/// The inode numbers of the cgroups under `parent` in the memory
/// hierarchy: a kept cgroup renamed for another run keeps its inode; a new
/// one gets a new number (kernfs does not hand one out again soon).
fn memory_cgroup_inodes(parent: &str) -> BTreeSet<u64> {
    find_cgroups(|n| n.starts_with("pycell-"))
        .into_iter()
        .filter(|p| p.to_string_lossy().contains(parent))
        .filter(|p| p.to_string_lossy().contains("/memory/"))
        .filter_map(|p| std::fs::metadata(p).ok().map(|m| m.ino()))
        .collect()
}

#[test]
fn members_forked_from_a_zygote_keep_their_cgroups_and_refills_take_them() {
    let mut d = Daemon::start("warm_pools = { default = 1 }\nzygotes = true\n");
    // The pool full before the first run.
    d.pool_when_ready(1);
    let mut seen = memory_cgroup_inodes(&d.cgroup_parent);
    let mut v1 = false;
    let print = RunRequest {
        code: "print(1)".into(),
        ..Default::default()
    };
    for _ in 0..8 {
        // Now and then a run goes cold all the same (and takes a kept set
        // or makes one): warm_run tries again.
        let r = d.warm_run(&print);
        assert_eq!(r.status, RunStatus::Ok, "{r:?}");
        v1 = r.layers.as_ref().unwrap().cgroup.version == CgroupVersion::V1;
        d.pool_when_ready(1);
        seen.extend(memory_cgroup_inodes(&d.cgroup_parent));
    }
    // The zygote's, and the members' taking turns with kept sets (and a
    // cold run's now and then); a new cgroup per member would show at least
    // nine. (v2 keeps none: nothing to count.)
    if v1 {
        assert!(seen.len() <= 6, "a new cgroup per member: {seen:?}");
    }
    d.signal(Signal::SIGTERM);
    let status = d.wait(Duration::from_secs(15));
    assert!(status.success(), "{status:?}\n{}", d.log());
    assert!(d.daemon_cgroups().is_empty(), "{:?}", d.daemon_cgroups());
}

#[test]
fn a_one_off_pycell_run_keeps_no_cgroup() {
    let out = run_code("one.py", "print(1)", &[], &[]);
    let r = out.result();
    assert_eq!(r["status"], "ok", "{}", out.describe());
    let name = r["layers"]["cgroup"]["name"].as_str().unwrap().to_string();
    // Its parent is the embedded one (`pycell`): no set was kept there at
    // all (a pycelld's parent has another name).
    let embedded = |p: &PathBuf| p.parent().and_then(|d| d.file_name()) == Some("pycell".as_ref());
    let kept = find_cgroups(|n| n.starts_with("pycell-kept-"))
        .into_iter()
        .filter(embedded)
        .collect::<Vec<_>>();
    assert!(kept.is_empty(), "kept by {name}: {kept:?}");
}
