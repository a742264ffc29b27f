//! Killing everything in a cgroup: v2 with cgroups-rs's `Cgroup::kill`
//! (`cgroup.kill`); v1 has no such file and cgroups-rs refuses to kill
//! there, so this is pycell's own: the processes are frozen (cgroups-rs's
//! freezer controller), signalled one by one through pidfds after checking
//! that each pid is still a member, and thawed.

use std::fs;
use std::time::Duration;

use cgroups_rs::freezer::{FreezerController, FreezerState};
use cgroups_rs::memory::MemController;
use cgroups_rs::{Cgroup, Controller};

/// SIGKILL everything in `cg`: v2 with `cgroup.kill`; v1 frozen first, so
/// that nothing in it can fork or exit while it is being killed, each
/// process signalled through a pidfd after checking that the pid is still
/// one of ours, then thawed so the kills take effect; again until empty.
pub(crate) fn kill_all_in(cg: &Cgroup) {
    if cg.v2() {
        let _ = cg.kill();
        return;
    }
    let name = cg.path().rsplit('/').next().unwrap_or_default();
    let freezer: Option<&FreezerController> = cg.controller_of();
    // The memory hierarchy's list (see `SandboxCgroup::processes`):
    // `Cgroup::procs` would read all five.
    let memory: Option<&MemController> = cg.controller_of();
    for _ in 0..50 {
        let procs = memory.map(|m| m.procs()).unwrap_or_default();
        if procs.is_empty() {
            return;
        }
        let frozen = freezer.is_some_and(freeze);
        for p in procs {
            kill_if_member(p.pid as i32, name);
        }
        if frozen {
            let _ = freezer.map(FreezerController::thaw);
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Freeze a v1 freezer cgroup; true once it reports FROZEN.
fn freeze(freezer: &FreezerController) -> bool {
    if freezer.freeze().is_err() {
        return false;
    }
    for _ in 0..100 {
        if matches!(freezer.state(), Ok(FreezerState::Frozen)) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    false
}

/// SIGKILL process `pid` through a pidfd, if it is still in the cgroup
/// called `name`: a pid read from `cgroup.procs` may have been reused.
fn kill_if_member(pid: i32, name: &str) {
    let Some(pid) = rustix::process::Pid::from_raw(pid) else {
        return;
    };
    let Ok(fd) = rustix::process::pidfd_open(pid, rustix::process::PidfdFlags::empty()) else {
        return;
    };
    // Read after the pidfd exists: if the pid was reused before, the new
    // process is not ours; if after, the pidfd's process is gone and the
    // signal below goes nowhere.
    let proc_cgroup = format!("/proc/{}/cgroup", pid.as_raw_nonzero());
    let ours = fs::read_to_string(proc_cgroup).is_ok_and(|text| in_cgroup_named(&text, name));
    if ours {
        let _ = rustix::process::pidfd_send_signal(&fd, rustix::process::Signal::KILL);
    }
}

/// Whether a /proc/<pid>/cgroup text puts the process in a cgroup named `name`.
pub(super) fn in_cgroup_named(proc_cgroup: &str, name: &str) -> bool {
    !name.is_empty()
        && proc_cgroup.lines().any(|l| {
            l.rsplit_once(':')
                .is_some_and(|(_, path)| path.rsplit('/').next() == Some(name))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn membership_is_read_from_the_last_path_segment() {
        let text = "7:memory:/a/pycell/pycell-5-r-1\n0::/x\n";
        assert!(in_cgroup_named(text, "pycell-5-r-1"));
        assert!(!in_cgroup_named(text, "pycell-5-r"));
        assert!(!in_cgroup_named(text, ""));
    }
}
