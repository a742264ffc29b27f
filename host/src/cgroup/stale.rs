//! Leftover run cgroups: what a jailer killed before it cleaned up left
//! behind, found by name, killed and removed.

use super::files;
use super::hierarchy::{member_dirs, RunHierarchy};
use super::kill::kill_all_in;
use super::layout::CgroupLayout;

impl CgroupLayout {
    /// Remove cgroups under `parent` whose names start with `prefix`, killing
    /// anything still in them. Only call this for a prefix nobody else can be
    /// using (pycell uses the sandbox uid, whose lease the caller holds): they
    /// are leftovers of a supervisor that was killed before cleaning up.
    pub fn remove_stale(&self, parent: &str, prefix: &str) {
        let hierarchy = RunHierarchy::new(self);
        for name in self.names_under(parent, prefix) {
            let cg = hierarchy.load(parent, &name);
            kill_all_in(&cg);
            files::remove_dirs(&member_dirs(&cg));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    #[test]
    fn leftovers_of_one_uid_go_in_every_hierarchy_and_nothing_else_does() {
        let tmp = tempfile::tempdir().unwrap();
        let base = |h: &str| tmp.path().join(h);
        let layout = CgroupLayout::V1 {
            memory: base("memory"),
            pids: base("pids"),
            cpu: base("cpu"),
            cpuacct: base("cpu"),
            freezer: base("freezer"),
        };
        // A jailer died after making its memory and pids directories.
        for dir in ["memory/runs/pycell-5-a", "pids/runs/pycell-5-a"] {
            fs::create_dir_all(tmp.path().join(dir)).unwrap();
        }
        fs::create_dir_all(base("memory/runs/pycell-6-b")).unwrap();
        layout.remove_stale("runs", "pycell-5-");
        assert!(!base("memory/runs/pycell-5-a").exists());
        assert!(!base("pids/runs/pycell-5-a").exists());
        assert!(base("memory/runs/pycell-6-b").exists(), "another uid's run");
    }
}
