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
    /// say): that cgroup is not ours to split.
    ///
    /// In a container (a cgroup namespace whose root is the container's
    /// cgroup, not the host's root) the runtime gave the container that
    /// whole cgroup: every process in it is the container's own (its init,
    /// tini), so they all move into the leaf, as container engines do for
    /// nested containers. Call it while single-threaded, before starting
    /// any child.
    pub fn adopt_own_subtree(&self, supervisor: &str, runs: &str) -> Result<String, CgroupError> {
        let CgroupLayout::V2 { root, proc_self } = self else {
            return Ok(runs.to_string());
        };
        let own = own_path(&read(&proc_self.join("cgroup"))?, "").ok_or(CgroupError::Read {
            what: "/proc/self/cgroup".into(),
            detail: "no cgroup v2 (0::) line".into(),
        })?;
        let own_rel = own.trim_matches('/');
        if own_rel.is_empty() {
            // The host's root cgroup may hold processes and children at once;
            // a container's, seen as the root of its cgroup namespace, not.
            if is_host_root(root) {
                return Ok(runs.to_string());
            }
            claim_own_cgroup(root, supervisor, Others::MoveAlong)?;
            return Ok(runs.to_string());
        }
        let own_dir = join_rel(root, own_rel);
        claim_own_cgroup(&own_dir, supervisor, Others::Refuse)?;
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

/// The memory limit on this process's cgroup v2 and on the ancestors it can
/// see (a container's limit, a unit's `MemoryMax`): the smallest, or `None`
/// where none is set or there is no v2 memory controller.
pub fn own_memory_limit() -> Option<u64> {
    memory_limit_in(&HostPaths::default())
}

pub(super) fn memory_limit_in(host: &HostPaths) -> Option<u64> {
    let own = fs::read_to_string(host.proc_self.join("cgroup")).ok()?;
    let mut dir = join_rel(&host.cgroup_root, own_path(&own, "")?.trim_matches('/'));
    let mut limit: Option<u64> = None;
    loop {
        let here = fs::read_to_string(dir.join("memory.max")).ok();
        if let Some(bytes) = here.and_then(|s| s.trim().parse::<u64>().ok()) {
            limit = Some(limit.map_or(bytes, |l| l.min(bytes)));
        }
        if dir == host.cgroup_root || !dir.pop() {
            return limit;
        }
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

/// Is the v2 hierarchy mounted at `root` the host's whole tree? Only the
/// host's root cgroup has no `cgroup.type`; the root of a cgroup namespace
/// is an ordinary cgroup, under the no-internal-processes rule.
fn is_host_root(root: &Path) -> bool {
    !root.join("cgroup.type").exists()
}

/// What [`claim_own_cgroup`] does with other processes in the cgroup.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Others {
    /// Refuse: the cgroup is shared (a login session's, say).
    Refuse,
    /// Move them into the leaf too: the cgroup is a container's, whole.
    MoveAlong,
}

/// Rounds of moving a container's processes before giving up.
const MOVE_ROUNDS: usize = 8;

/// v2: move this process (and, with [`Others::MoveAlong`], every other one)
/// into `<own_dir>/<supervisor>` and enable the controllers for `own_dir`'s
/// children.
fn claim_own_cgroup(own_dir: &Path, supervisor: &str, others: Others) -> Result<(), CgroupError> {
    let not_ours = |detail: String| CgroupError::NotDelegated {
        path: own_dir.to_path_buf(),
        detail,
    };
    let procs_of = |dir: &Path| {
        fs::read_to_string(dir.join("cgroup.procs"))
            .map(|s| s.split_whitespace().map(str::to_string).collect::<Vec<_>>())
            .map_err(|e| not_ours(format!("cannot read cgroup.procs: {e}")))
    };
    let me = std::process::id().to_string();
    let strangers: Vec<String> = procs_of(own_dir)?
        .into_iter()
        .filter(|p| *p != me)
        .collect();
    if others == Others::Refuse && !strangers.is_empty() {
        return Err(not_ours(format!(
            "it holds other processes too (pids {})",
            strangers.join(", ")
        )));
    }
    let leaf = own_dir.join(supervisor);
    files::mkdir(&leaf).map_err(|source| CgroupError::Create {
        path: leaf.clone(),
        source,
    })?;
    let attach = |pid: &str| {
        files::write(&leaf.join("cgroup.procs"), pid).map_err(|source| CgroupError::Attach {
            pid: pid.parse().unwrap_or(0),
            path: leaf.clone(),
            source,
        })
    };
    attach(&me)?;
    if others == Others::MoveAlong {
        move_along(own_dir, &procs_of, &attach)?;
    }
    enable_v2_controllers(own_dir)
}

/// Move every process still in `own_dir` with `attach`, in rounds, until
/// none is left (one that forks meanwhile shows up in the next round).
fn move_along(
    own_dir: &Path,
    procs_of: &dyn Fn(&Path) -> Result<Vec<String>, CgroupError>,
    attach: &dyn Fn(&str) -> Result<(), CgroupError>,
) -> Result<(), CgroupError> {
    for _ in 0..MOVE_ROUNDS {
        let left = procs_of(own_dir)?;
        if left.is_empty() {
            return Ok(());
        }
        // A process that exited meanwhile cannot move, and need not.
        for pid in &left {
            match attach(pid) {
                Err(CgroupError::Attach { source, .. })
                    if source.raw_os_error() == Some(nix::libc::ESRCH) => {}
                other => other?,
            }
        }
    }
    let left = procs_of(own_dir)?;
    if !left.is_empty() {
        return Err(CgroupError::NotDelegated {
            path: own_dir.to_path_buf(),
            detail: format!(
                "processes kept appearing in it while they were moved out (pids {})",
                left.join(", ")
            ),
        });
    }
    Ok(())
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
    fn a_containers_cgroup_namespace_root_is_claimed_whole() {
        let dir = tempfile::tempdir().unwrap();
        let h = host(dir.path(), "0::/\n");
        let root = h.cgroup_root.clone();
        fs::write(root.join("cgroup.controllers"), "cpu memory pids\n").unwrap();
        fs::write(root.join("cgroup.subtree_control"), "").unwrap();
        fs::write(root.join("cgroup.procs"), "1\n").unwrap();
        let l = CgroupLayout::detect_in(&h).unwrap();
        // The host's root (no cgroup.type): runs go right below it.
        assert_eq!(l.adopt_own_subtree("supervisor", "runs").unwrap(), "runs");
        assert!(!root.join("supervisor").exists());
        // A container's cgroup seen as the namespace's root: its processes
        // are moved (here a plain file cannot take them, so they "keep
        // appearing" and the claim is refused rather than half done).
        fs::write(root.join("cgroup.type"), "domain\n").unwrap();
        fs::create_dir(root.join("supervisor")).unwrap();
        fs::write(root.join("supervisor/cgroup.procs"), "").unwrap();
        let e = l
            .adopt_own_subtree("supervisor", "runs")
            .unwrap_err()
            .to_string();
        assert!(e.contains("kept appearing") && e.contains("pids 1"), "{e}");
        assert_eq!(
            fs::read_to_string(root.join("cgroup.subtree_control")).unwrap(),
            ""
        );
    }

    #[test]
    fn the_memory_limit_is_the_smallest_on_the_way_up() {
        let dir = tempfile::tempdir().unwrap();
        let h = host(dir.path(), "0::/pod/ctr\n");
        assert_eq!(memory_limit_in(&h), None);
        let ctr = h.cgroup_root.join("pod/ctr");
        fs::create_dir_all(&ctr).unwrap();
        fs::write(ctr.join("memory.max"), "max\n").unwrap();
        assert_eq!(memory_limit_in(&h), None);
        fs::write(h.cgroup_root.join("pod/memory.max"), "4294967296\n").unwrap();
        assert_eq!(memory_limit_in(&h), Some(4 << 30));
        fs::write(ctr.join("memory.max"), "1073741824\n").unwrap();
        assert_eq!(memory_limit_in(&h), Some(1 << 30));
    }

    #[test]
    fn moving_along_takes_rounds_and_skips_the_dead() {
        use std::cell::RefCell;
        let rounds = RefCell::new(vec![vec![], vec!["9"], vec!["1", "7"]]);
        let moved = RefCell::new(Vec::new());
        let procs_of = |_: &Path| {
            Ok(rounds
                .borrow_mut()
                .pop()
                .unwrap_or_default()
                .into_iter()
                .map(String::from)
                .collect())
        };
        let attach = |pid: &str| {
            if pid == "7" {
                // Exited before it could move.
                return Err(CgroupError::Attach {
                    pid: 7,
                    path: PathBuf::from("leaf"),
                    source: std::io::Error::from_raw_os_error(nix::libc::ESRCH),
                });
            }
            moved.borrow_mut().push(pid.to_string());
            Ok(())
        };
        move_along(Path::new("c"), &procs_of, &attach).unwrap();
        assert_eq!(*moved.borrow(), ["1", "9"]);
        // Any other failure to move stops the claim.
        let procs_of = |_: &Path| Ok(vec!["3".to_string()]);
        let refuse = |_: &str| {
            Err(CgroupError::Attach {
                pid: 3,
                path: PathBuf::from("leaf"),
                source: std::io::Error::from_raw_os_error(nix::libc::EACCES),
            })
        };
        let e = move_along(Path::new("c"), &procs_of, &refuse).unwrap_err();
        assert!(e.to_string().contains("attach pid 3"), "{e}");
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
