//! A timeout kills the whole sandbox, including a double-forked, setsid()'d
//! daemon, and leaves nothing behind on the host: no process running as the
//! sandbox uid, no cgroup.

#![forbid(unsafe_code)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use pycell_tests::{
    find_cgroups, find_cgroups_named, host_processes, processes_with_uid, Pycell, Script,
};

const DAEMON: &str = r#"
import os, time
pid = os.fork()
if pid == 0:
    if os.fork() == 0:
        os.setsid()
        while True:
            time.sleep(1)
    os._exit(0)
os.waitpid(pid, 0)
print("daemon started", flush=True)
while True:
    time.sleep(1)
"#;

#[test]
fn timeout_kills_a_double_forked_daemon_and_cleans_up() {
    let script = Script::new("daemon.py", DAEMON);
    // Watch the host while the run goes: which uids run processes and which
    // pycell cgroups exist. Afterwards this proves the scans below can see
    // the sandbox's processes and cgroup at all.
    let mut uids_seen: BTreeMap<u32, BTreeSet<String>> = BTreeMap::new();
    let mut cgroups_seen: BTreeSet<PathBuf> = BTreeSet::new();
    let mut last_scan = Instant::now() - Duration::from_secs(1);
    let out = Pycell::new(pycell_tests::run_args(
        &script.path,
        &["--timeout", "2"],
        &[],
    ))
    .guard(Duration::from_secs(60))
    .run_watching(|| {
        if last_scan.elapsed() < Duration::from_millis(200) {
            return;
        }
        last_scan = Instant::now();
        for p in host_processes() {
            for &u in &p.uids {
                uids_seen.entry(u).or_default().insert(p.name.clone());
            }
        }
        cgroups_seen.extend(find_cgroups(|n| n.starts_with("pycell")));
    });
    let r = out.result();
    assert_eq!(r["status"], "timeout", "{}", out.describe());
    assert_eq!(out.exit_code, Some(124), "{}", out.describe());
    assert!(
        out.wall < Duration::from_secs(15),
        "a 2 s timeout took {:?}",
        out.wall
    );
    assert!(
        r["stdout"]
            .as_str()
            .unwrap_or_default()
            .contains("daemon started"),
        "the script never got to start its daemon\n{}",
        out.describe()
    );

    let uid = r["layers"]["sandbox_uid"]
        .as_u64()
        .and_then(|u| u32::try_from(u).ok())
        .unwrap_or_else(|| panic!("result has no layers.sandbox_uid\n{}", out.describe()));
    assert!(
        uids_seen.contains_key(&uid),
        "no host process ran as sandbox uid {uid} during the run, so the scan proves nothing (uids seen: {:?})",
        uids_seen.keys().collect::<Vec<_>>()
    );
    let left = processes_with_uid(uid);
    assert!(
        left.is_empty(),
        "processes still run as sandbox uid {uid} after pycell returned: {left:?}"
    );

    let name = r["layers"]["cgroup"]["name"]
        .as_str()
        .unwrap_or_else(|| panic!("result has no layers.cgroup.name\n{}", out.describe()))
        .to_string();
    assert!(
        cgroups_seen.iter().any(|p| p.ends_with(&name)),
        "cgroup {name} was never seen under /sys/fs/cgroup during the run, so its absence proves nothing (seen: {cgroups_seen:?})"
    );
    let still = find_cgroups_named(&name);
    assert!(
        still.is_empty(),
        "cgroup {name} still exists after pycell returned: {still:?}"
    );
}
