//! The jail's hardening (issue 11): a sandbox never outlives its jailer,
//! and the kernel doors a run could use against the host or its co-tenants
//! stay shut. Each test runs hostile code only inside a jail with limits,
//! bounded in count and time.

#![forbid(unsafe_code)]

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use pycell_tests::{
    children_of, find_cgroups, processes_with_uid, pycell_bin, require_root, run_code, status_of,
    Script,
};
use serde_json::Value;

/// An embedded `pycell run` of `code`, started; returns once the code
/// printed its first line.
fn start_embedded(code: &str, opts: &[&str]) -> (Child, Script) {
    require_root();
    let script = Script::new("long.py", code);
    let mut child = Command::new(pycell_bin())
        .arg("run")
        .args(opts)
        .arg(&script.path)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn pycell run");
    let mut first = String::new();
    BufReader::new(child.stdout.as_mut().expect("piped stdout"))
        .read_line(&mut first)
        .expect("read the run's first line");
    assert!(!first.is_empty(), "the run printed nothing");
    (child, script)
}

/// The only child of `pid` called `name`.
fn only_child(pid: u32, name: &str) -> u32 {
    let kids: Vec<u32> = children_of(pid)
        .into_iter()
        .filter(|p| p.name == name)
        .map(|p| p.pid)
        .collect();
    assert_eq!(kids.len(), 1, "children of {pid} named {name}: {kids:?}");
    kids[0]
}

/// The sandbox uid of a running jail: the uid of its init.
fn sandbox_uid_under(jailer: u32) -> u32 {
    let init = only_child(jailer, "pycell-init");
    let procs = pycell_tests::host_processes();
    let p = procs.iter().find(|p| p.pid == init).expect("init listed");
    p.uids[0]
}

fn wait_until_gone(uid: u32, within: Duration) {
    let deadline = Instant::now() + within;
    let prefix = format!("pycell-{uid}-");
    loop {
        let procs = processes_with_uid(uid);
        let cgroups = find_cgroups(|n| n.starts_with(&prefix));
        if procs.is_empty() && cgroups.is_empty() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "left behind {within:?} after the jailer died: processes {procs:?}, cgroups {cgroups:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_sigkilled_jailer_takes_its_sandbox_and_cgroup_along() {
    let code = "import time\nprint('ready', flush=True)\ntime.sleep(60)\n";
    let (mut child, _script) = start_embedded(code, &["--timeout", "60"]);
    let jailer = only_child(child.id(), "pycell-jailer");
    let uid = sandbox_uid_under(jailer);
    assert!(!processes_with_uid(uid).is_empty(), "the sandbox runs");
    kill(Pid::from_raw(jailer as i32), Signal::SIGKILL).expect("kill -9 the jailer");
    wait_until_gone(uid, Duration::from_secs(5));
    let status = child.wait().expect("pycell run ends");
    assert!(
        !status.success(),
        "pycell run reports the dead jailer: {status}"
    );
}
