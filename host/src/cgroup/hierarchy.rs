//! The cgroups-rs view of pycell's cgroups: a [`Hierarchy`] whose
//! controllers are rooted at the directories [`CgroupLayout`] found, so that
//! a run's cgroup is a `cgroups_rs::Cgroup` loaded at `<parent>/<name>`.
//!
//! Why not cgroups-rs's own `hierarchies::auto()`: on v1 it takes every
//! mounted controller (a run would be written into blkio, devices, net_cls
//! and the rest too) and addresses each from its mount point, which is wrong
//! where a hierarchy is mounted from a subtree (a container's cgroup
//! namespace: the mount's root is not `/`); its v2 root is fixed at
//! `/sys/fs/cgroup`, so nothing could be tested on a temporary tree.

use std::path::{Path, PathBuf};

use cgroups_rs::cpu::CpuController;
use cgroups_rs::cpuacct::CpuAcctController;
use cgroups_rs::freezer::FreezerController;
use cgroups_rs::memory::MemController;
use cgroups_rs::pid::PidController;
use cgroups_rs::{Cgroup, Hierarchy, Subsystem};

use super::layout::CgroupLayout;

/// The controllers a run uses, each at this process's own cgroup in its
/// hierarchy (v1) or at the unified root (v2).
#[derive(Debug, Clone)]
pub(crate) struct RunHierarchy(CgroupLayout);

impl RunHierarchy {
    pub(crate) fn new(layout: &CgroupLayout) -> RunHierarchy {
        RunHierarchy(layout.clone())
    }

    /// The cgroup `<parent>/<name>` (which need not exist yet).
    pub(crate) fn load(&self, parent: &str, name: &str) -> Cgroup {
        Cgroup::load(Box::new(self.clone()), relative(parent, name))
    }
}

/// `parent/name` as a relative path: a leading `/` would make cgroups-rs
/// push it over the hierarchy's root.
fn relative(parent: &str, name: &str) -> PathBuf {
    parent
        .split('/')
        .chain(name.split('/'))
        .filter(|s| !s.is_empty())
        .collect()
}

impl Hierarchy for RunHierarchy {
    fn v2(&self) -> bool {
        matches!(self.0, CgroupLayout::V2 { .. })
    }

    fn subsystems(&self) -> Vec<Subsystem> {
        match &self.0 {
            CgroupLayout::V2 { root, .. } => vec![
                Subsystem::Mem(MemController::new(root.clone(), true)),
                Subsystem::Pid(PidController::new(root.clone(), true)),
                Subsystem::Cpu(CpuController::new(root.clone(), true)),
            ],
            CgroupLayout::V1 {
                memory,
                pids,
                cpu,
                cpuacct,
                freezer,
            } => vec![
                Subsystem::Mem(MemController::new(memory.clone(), false)),
                Subsystem::Pid(PidController::new(pids.clone(), false)),
                Subsystem::Cpu(CpuController::new(cpu.clone(), false)),
                Subsystem::CpuAcct(CpuAcctController::new(cpuacct.clone())),
                Subsystem::Freezer(FreezerController::new(freezer.clone(), false)),
            ],
        }
    }

    fn root(&self) -> PathBuf {
        match &self.0 {
            CgroupLayout::V2 { root, .. } => root.clone(),
            CgroupLayout::V1 { memory, .. } => memory.clone(),
        }
    }

    fn root_control_group(&self) -> Cgroup {
        Cgroup::load(Box::new(self.clone()), "")
    }

    fn parent_control_group(&self, path: &str) -> Cgroup {
        let parent = Path::new(path).parent().unwrap_or(Path::new(""));
        Cgroup::load(Box::new(self.clone()), parent)
    }
}

/// The distinct directories of `cg`'s controllers: co-mounted v1
/// hierarchies (cpu,cpuacct) share one, and each `cgroup.procs` write takes
/// a global lock, so a process joins each directory once.
pub(crate) fn member_dirs(cg: &Cgroup) -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = Vec::new();
    for s in cg.subsystems() {
        let p = s.to_controller().path().to_path_buf();
        if !dirs.contains(&p) {
            dirs.push(p);
        }
    }
    dirs
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_cgroup_is_addressed_below_each_of_our_own_cgroups() {
        let layout = CgroupLayout::V1 {
            memory: "/cg/memory/m".into(),
            pids: "/cg/pids".into(),
            cpu: "/cg/cpu,cpuacct/c".into(),
            cpuacct: "/cg/cpu,cpuacct/c".into(),
            freezer: "/cg/freezer".into(),
        };
        let cg = RunHierarchy::new(&layout).load("/pycelld/runs/", "pycell-5-r");
        let dirs: Vec<String> = member_dirs(&cg)
            .iter()
            .map(|d| d.display().to_string())
            .collect();
        assert_eq!(
            dirs,
            [
                "/cg/memory/m/pycelld/runs/pycell-5-r",
                "/cg/pids/pycelld/runs/pycell-5-r",
                "/cg/cpu,cpuacct/c/pycelld/runs/pycell-5-r",
                "/cg/freezer/pycelld/runs/pycell-5-r",
            ],
            "one directory per hierarchy, the co-mounted one once"
        );
        assert!(!cg.v2());
    }

    /// The parts of cgroups-rs pycell does not use, shown on a temporary
    /// tree: if one of these starts to fail, cgroups-rs changed and the
    /// pycell code that stands in for it (named in each case) can go.
    #[test]
    fn what_cgroups_rs_does_not_do_the_way_pycell_needs() {
        use cgroups_rs::Controller;
        let tmp = tempfile::tempdir().unwrap();
        let v1 = CgroupLayout::V1 {
            memory: tmp.path().join("memory"),
            pids: tmp.path().join("pids"),
            cpu: tmp.path().join("cpu"),
            cpuacct: tmp.path().join("cpu"),
            freezer: tmp.path().join("freezer"),
        };
        // No kill on v1 (kill.rs freezes and kills through pidfds).
        assert!(RunHierarchy::new(&v1).load("runs", "r").kill().is_err());
        // A directory that cannot be made is logged, not refused
        // (sandbox.rs makes the directories itself).
        std::fs::write(tmp.path().join("memory"), "in the way").unwrap();
        let memory = MemController::new(tmp.path().join("memory/run"), false);
        memory.create();
        assert!(!memory.exists(), "create() returned without an error");
        // v2 memory statistics panic where memory.high is unreadable, and
        // count no OOM kills (sandbox.rs reads memory.peak and
        // memory.events itself).
        let v2 = tmp.path().join("v2");
        std::fs::create_dir(&v2).unwrap();
        std::fs::write(v2.join("memory.peak"), "1\n").unwrap();
        let v2_memory = MemController::new(v2, true);
        let stat = std::panic::catch_unwind(|| v2_memory.memory_stat());
        assert!(stat.is_err(), "memory_stat() panicked");
    }
}
