//! Where this process's cgroup hierarchies are: read from `/proc/self/cgroup`
//! and `/proc/self/mountinfo` (under [`HostPaths`], so tests can point them
//! at a temporary directory).

use std::fs;
use std::path::{Path, PathBuf};

use pycell_wire::report::CgroupVersion;

use super::files::{self, join_rel};
use super::CgroupError;

/// The host paths cgroup code reads: the cgroup mount root and this
/// process's `/proc/self`.
#[derive(Debug, Clone)]
pub struct HostPaths {
    pub cgroup_root: PathBuf,
    pub proc_self: PathBuf,
}

impl Default for HostPaths {
    fn default() -> Self {
        HostPaths {
            cgroup_root: PathBuf::from("/sys/fs/cgroup"),
            proc_self: PathBuf::from("/proc/self"),
        }
    }
}

/// The directories this process's cgroups are in, per hierarchy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CgroupLayout {
    /// The unified hierarchy; `root` is its mount point.
    V2 { root: PathBuf, proc_self: PathBuf },
    /// Our own cgroup in each v1 controller hierarchy.
    V1 {
        memory: PathBuf,
        pids: PathBuf,
        cpu: PathBuf,
        cpuacct: PathBuf,
        /// Runs are frozen before they are killed, so that none can fork or
        /// exit (and free its pid for reuse) while the kill goes on.
        freezer: PathBuf,
    },
}

fn missing(controller: &'static str, detail: impl Into<String>) -> CgroupError {
    CgroupError::ControllerMissing {
        controller,
        detail: detail.into(),
    }
}

fn read(path: &Path) -> Result<String, CgroupError> {
    fs::read_to_string(path).map_err(|e| CgroupError::Read {
        what: path.display().to_string(),
        detail: e.to_string(),
    })
}

/// This process's cgroup path in the hierarchy whose /proc/self/cgroup line
/// lists `controller` (v1), or the `0::` line (v2, `controller` empty).
pub(super) fn own_path(proc_self_cgroup: &str, controller: &str) -> Option<String> {
    proc_self_cgroup.lines().find_map(|line| {
        let mut parts = line.splitn(3, ':');
        let _id = parts.next()?;
        let ctrls = parts.next()?;
        let path = parts.next()?;
        let matches = if controller.is_empty() {
            ctrls.is_empty()
        } else {
            ctrls.split(',').any(|c| c == controller)
        };
        matches.then(|| path.to_string())
    })
}

/// The mount point and mounted root of the v1 hierarchy of `controller`,
/// from mountinfo (`... ROOT MOUNTPOINT ... - cgroup SOURCE rw,CTRL,...`).
pub(super) fn v1_mount(mountinfo: &str, controller: &str) -> Option<(PathBuf, String)> {
    mountinfo.lines().find_map(|line| {
        let (left, right) = line.split_once(" - ")?;
        let mut r = right.split_whitespace();
        let (fstype, _source, opts) = (r.next()?, r.next()?, r.next()?);
        let has = opts.split(',').any(|o| o == controller);
        if fstype != "cgroup" || !has {
            return None;
        }
        let l: Vec<&str> = left.split_whitespace().collect();
        Some((PathBuf::from(*l.get(4)?), (*l.get(3)?).to_string()))
    })
}

impl CgroupLayout {
    /// The layout of this host, as this process sees it.
    pub fn detect() -> Result<CgroupLayout, CgroupError> {
        CgroupLayout::detect_in(&HostPaths::default())
    }

    /// [`CgroupLayout::detect`] with the host paths given: v2 when the
    /// cgroup root is the unified hierarchy (it has `cgroup.controllers`),
    /// else the v1 hierarchies listed in mountinfo.
    pub fn detect_in(host: &HostPaths) -> Result<CgroupLayout, CgroupError> {
        let self_cgroup = read(&host.proc_self.join("cgroup"))?;
        if host.cgroup_root.join("cgroup.controllers").exists() {
            return Ok(CgroupLayout::V2 {
                root: host.cgroup_root.clone(),
                proc_self: host.proc_self.clone(),
            });
        }
        let mountinfo = read(&host.proc_self.join("mountinfo"))?;
        let dir = |name: &'static str| -> Result<PathBuf, CgroupError> {
            let (mount_point, mount_root) = v1_mount(&mountinfo, name)
                .ok_or_else(|| missing(name, "no cgroup v1 hierarchy is mounted for it"))?;
            let own = own_path(&self_cgroup, name)
                .ok_or_else(|| missing(name, "it is not listed in /proc/self/cgroup"))?;
            // The mount may expose only a subtree (mount_root); our path is
            // relative to the hierarchy's real root.
            let rel = match mount_root.as_str() {
                "/" => own.as_str(),
                root => own.strip_prefix(root).unwrap_or(own.as_str()),
            };
            Ok(join_rel(&mount_point, rel))
        };
        Ok(CgroupLayout::V1 {
            memory: dir("memory")?,
            pids: dir("pids")?,
            cpu: dir("cpu")?,
            cpuacct: dir("cpuacct")?,
            freezer: dir("freezer")?,
        })
    }

    pub fn version(&self) -> CgroupVersion {
        match self {
            CgroupLayout::V2 { .. } => CgroupVersion::V2,
            CgroupLayout::V1 { .. } => CgroupVersion::V1,
        }
    }

    pub(super) fn bases(&self) -> Vec<&Path> {
        match self {
            CgroupLayout::V2 { root, .. } => vec![root],
            CgroupLayout::V1 {
                memory,
                pids,
                cpu,
                cpuacct,
                freezer,
            } => vec![memory, pids, cpu, cpuacct, freezer],
        }
    }

    /// Make this process's own cgroup the home of its runs, and return the
    /// `parent` to give [`super::SandboxCgroup::create`] for runs in
    /// `<own>/<runs>`.
    ///
    /// v1 already creates runs relative to the caller's cgroup in each
    /// hierarchy, so `runs` comes back as it is. On v2 the own cgroup is the
    /// subtree systemd delegates to a service with `Delegate=yes`; a v2
    /// cgroup that hands controllers to children may hold no processes
    /// itself, so this process moves into the leaf `<own>/<supervisor>` and
    /// the memory, pids and cpu controllers are enabled for the children.
    /// Refused when the own cgroup holds other processes (a login session,
    /// say): that cgroup is not ours to split. Call it while single-threaded,
    /// before starting any child.
    pub fn adopt_own_subtree(&self, supervisor: &str, runs: &str) -> Result<String, CgroupError> {
        let CgroupLayout::V2 { root, proc_self } = self else {
            return Ok(runs.to_string());
        };
        let own = own_path(&read(&proc_self.join("cgroup"))?, "").ok_or(CgroupError::Read {
            what: "/proc/self/cgroup".into(),
            detail: "no cgroup v2 (0::) line".into(),
        })?;
        let own_rel = own.trim_matches('/');
        // The root cgroup may hold processes and children at once.
        if own_rel.is_empty() {
            return Ok(runs.to_string());
        }
        let own_dir = join_rel(root, own_rel);
        claim_own_cgroup(&own_dir, supervisor)?;
        Ok(format!("{own_rel}/{runs}"))
    }

    /// The directories of `parent`, and of its ancestors, that do not exist
    /// yet in any hierarchy, outermost first: the ones runs under `parent`
    /// will create. Give them to [`Self::remove_created`] when done, so that
    /// what was there before (a parent an operator set limits on) stays.
    pub fn missing_dirs(&self, parent: &str) -> Vec<PathBuf> {
        let mut missing = Vec::new();
        for base in self.bases() {
            let mut dir = base.to_path_buf();
            for seg in parent.split('/').filter(|s| !s.is_empty()) {
                dir.push(seg);
                if !dir.exists() {
                    missing.push(dir.clone());
                }
            }
        }
        missing
    }

    /// Remove the directories [`Self::missing_dirs`] listed, deepest first,
    /// where they are empty (cgroups still in use stay).
    pub fn remove_created(&self, dirs: &[PathBuf]) {
        let mut dirs = dirs.to_vec();
        dirs.sort_by_key(|d| d.components().count());
        files::remove_dirs(&dirs);
    }

    /// The names of the cgroups under `parent`, in any hierarchy, that start
    /// with `prefix`.
    pub(super) fn names_under(&self, parent: &str, prefix: &str) -> Vec<String> {
        let mut names = Vec::new();
        for base in self.bases() {
            let Ok(entries) = fs::read_dir(join_rel(base, parent)) else {
                continue;
            };
            for e in entries.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                if name.starts_with(prefix) && !names.contains(&name) {
                    names.push(name);
                }
            }
        }
        names
    }
}

/// The controllers every run's cgroup needs.
const V2_CONTROLLERS: [&str; 3] = ["memory", "pids", "cpu"];

/// v2: make sure `dir`'s children get the memory, pids and cpu controllers.
pub(super) fn enable_v2_controllers(dir: &Path) -> Result<(), CgroupError> {
    let available = fs::read_to_string(dir.join("cgroup.controllers")).unwrap_or_default();
    let enabled = fs::read_to_string(dir.join("cgroup.subtree_control")).unwrap_or_default();
    let has = |list: &str, c: &str| list.split_whitespace().any(|x| x == c);
    for ctrl in V2_CONTROLLERS {
        if has(&enabled, ctrl) {
            continue;
        }
        if !has(&available, ctrl) {
            return Err(CgroupError::ControllerMissing {
                controller: ctrl,
                detail: format!("{} does not offer it (cgroup.controllers: {:?}); enable it in the parent's cgroup.subtree_control or delegate it to pycelld", dir.display(), available.trim()),
            });
        }
        files::write(&dir.join("cgroup.subtree_control"), &format!("+{ctrl}")).map_err(
            |source| CgroupError::SetLimit {
                what: "cgroup.subtree_control (a v2 cgroup with processes of its own cannot delegate controllers; give pycell a delegated subtree)",
                path: dir.to_path_buf(),
                source,
            },
        )?;
    }
    Ok(())
}

/// v2: move this process into `<own_dir>/<supervisor>` and enable the
/// controllers for `own_dir`'s children; refused if others live in `own_dir`.
fn claim_own_cgroup(own_dir: &Path, supervisor: &str) -> Result<(), CgroupError> {
    let not_ours = |detail: String| CgroupError::NotDelegated {
        path: own_dir.to_path_buf(),
        detail,
    };
    let procs = fs::read_to_string(own_dir.join("cgroup.procs"))
        .map_err(|e| not_ours(format!("cannot read cgroup.procs: {e}")))?;
    let me = std::process::id().to_string();
    let others: Vec<&str> = procs
        .lines()
        .map(str::trim)
        .filter(|p| !p.is_empty() && *p != me)
        .collect();
    if !others.is_empty() {
        return Err(not_ours(format!(
            "it holds other processes too (pids {})",
            others.join(", ")
        )));
    }
    let leaf = own_dir.join(supervisor);
    files::mkdir(&leaf).map_err(|source| CgroupError::Create {
        path: leaf.clone(),
        source,
    })?;
    files::write(&leaf.join("cgroup.procs"), &me).map_err(|source| CgroupError::Attach {
        pid: std::process::id() as i32,
        path: leaf.clone(),
        source,
    })?;
    enable_v2_controllers(own_dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MOUNTINFO: &str = "\
25 30 0:23 / /sys rw,nosuid - sysfs sysfs rw
33 25 0:28 / /sys/fs/cgroup ro,nosuid - tmpfs tmpfs ro,mode=755
34 33 0:29 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw,nsdelegate
40 33 0:35 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory
41 33 0:36 / /sys/fs/cgroup/pids rw - cgroup cgroup rw,pids
42 33 0:37 /box /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct
43 33 0:38 / /sys/fs/cgroup/freezer rw - cgroup cgroup rw,freezer
";

    #[test]
    fn own_path_finds_v1_and_v2_lines() {
        let s = "9:name=systemd:/\n8:pids:/a\n4:memory:/process_api/x\n1:cpu,cpuacct:/c\n0::/u\n";
        assert_eq!(own_path(s, "memory").as_deref(), Some("/process_api/x"));
        assert_eq!(own_path(s, "pids").as_deref(), Some("/a"));
        assert_eq!(own_path(s, "cpuacct").as_deref(), Some("/c"));
        assert_eq!(own_path(s, "").as_deref(), Some("/u"));
        assert_eq!(own_path(s, "freezer"), None);
    }

    #[test]
    fn v1_mounts_come_from_mountinfo() {
        let (p, root) = v1_mount(MOUNTINFO, "cpuacct").unwrap();
        assert_eq!(
            (p.to_str().unwrap(), root.as_str()),
            ("/sys/fs/cgroup/cpu,cpuacct", "/box")
        );
        assert_eq!(
            v1_mount(MOUNTINFO, "memory").unwrap().0,
            PathBuf::from("/sys/fs/cgroup/memory")
        );
        // The unified (cgroup2) line is not a v1 hierarchy.
        assert!(v1_mount(MOUNTINFO, "nsdelegate").is_none());
        assert!(v1_mount(MOUNTINFO, "blkio").is_none());
    }

    fn host(dir: &Path, cgroup: &str) -> HostPaths {
        let proc_self = dir.join("proc-self");
        fs::create_dir_all(&proc_self).unwrap();
        fs::write(proc_self.join("cgroup"), cgroup).unwrap();
        fs::write(proc_self.join("mountinfo"), MOUNTINFO).unwrap();
        let cgroup_root = dir.join("cgroup");
        fs::create_dir_all(&cgroup_root).unwrap();
        HostPaths {
            cgroup_root,
            proc_self,
        }
    }

    #[test]
    fn a_hybrid_host_is_v1_relative_to_our_own_cgroups() {
        let dir = tempfile::tempdir().unwrap();
        let h = host(
            dir.path(),
            "8:pids:/a\n4:memory:/m/x\n1:cpu,cpuacct:/box/c\n3:freezer:/\n0::/u\n",
        );
        let l = CgroupLayout::detect_in(&h).unwrap();
        assert_eq!(
            l,
            CgroupLayout::V1 {
                memory: "/sys/fs/cgroup/memory/m/x".into(),
                pids: "/sys/fs/cgroup/pids/a".into(),
                cpu: "/sys/fs/cgroup/cpu,cpuacct/c".into(),
                cpuacct: "/sys/fs/cgroup/cpu,cpuacct/c".into(),
                freezer: "/sys/fs/cgroup/freezer".into(),
            }
        );
        // No memory line in /proc/self/cgroup: refused, naming the controller.
        let h = host(dir.path(), "8:pids:/a\n1:cpu,cpuacct:/c\n");
        let e = CgroupLayout::detect_in(&h).unwrap_err().to_string();
        assert!(e.contains("memory controller"), "{e}");
    }

    #[test]
    fn a_unified_root_is_v2_and_runs_go_below_our_delegated_cgroup() {
        let dir = tempfile::tempdir().unwrap();
        let h = host(dir.path(), "0::/system.slice/pycelld.service\n");
        fs::write(
            h.cgroup_root.join("cgroup.controllers"),
            "cpu memory pids\n",
        )
        .unwrap();
        let l = CgroupLayout::detect_in(&h).unwrap();
        assert_eq!(l.version(), CgroupVersion::V2);
        let svc = h.cgroup_root.join("system.slice/pycelld.service");
        fs::create_dir_all(&svc).unwrap();
        fs::write(
            svc.join("cgroup.procs"),
            format!("{}\n", std::process::id()),
        )
        .unwrap();
        fs::write(svc.join("cgroup.controllers"), "cpu memory pids\n").unwrap();
        fs::write(svc.join("cgroup.subtree_control"), "").unwrap();
        // A real cgroupfs makes these files in a new directory; here we do.
        fs::create_dir(svc.join("supervisor")).unwrap();
        fs::write(svc.join("supervisor/cgroup.procs"), "").unwrap();
        let parent = l.adopt_own_subtree("supervisor", "runs").unwrap();
        assert_eq!(parent, "system.slice/pycelld.service/runs");
        let moved = fs::read_to_string(svc.join("supervisor/cgroup.procs")).unwrap();
        assert_eq!(moved, std::process::id().to_string());
        // Someone else in the service's cgroup: not ours to split.
        fs::write(svc.join("cgroup.procs"), "1\n").unwrap();
        let e = l
            .adopt_own_subtree("supervisor", "runs")
            .unwrap_err()
            .to_string();
        assert!(e.contains("other processes too (pids 1)"), "{e}");
    }

    #[test]
    fn only_the_parent_dirs_a_daemon_created_are_removed() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (dir.path().join("a"), dir.path().join("b"));
        fs::create_dir_all(b.join("pycelld")).unwrap();
        let l = CgroupLayout::V1 {
            memory: a.clone(),
            pids: b.clone(),
            cpu: a.clone(),
            cpuacct: a.clone(),
            freezer: b.clone(),
        };
        // pycelld/runs: both new under a, only runs under b (an operator
        // made b/pycelld, with limits of its own, say).
        let missing = l.missing_dirs("pycelld/runs");
        assert!(missing.contains(&a.join("pycelld")) && missing.contains(&a.join("pycelld/runs")));
        assert!(!missing.contains(&b.join("pycelld")), "{missing:?}");
        assert!(missing.contains(&b.join("pycelld/runs")));
        for d in &missing {
            fs::create_dir_all(d).unwrap();
        }
        fs::create_dir(b.join("pycelld/runs/busy")).unwrap();
        l.remove_created(&missing);
        assert!(!a.join("pycelld").exists());
        assert!(
            b.join("pycelld/runs/busy").exists(),
            "a directory in use stays"
        );
    }
}
