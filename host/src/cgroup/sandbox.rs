//! One run's cgroup: created with its limits, joined by the jail, measured,
//! and killed and removed when dropped.

use std::fs;
use std::path::{Path, PathBuf};

use nix::unistd::Pid;
use pycell_wire::report::CgroupVersion;

use super::files::{self, join_rel};
use super::layout::CgroupLayout;
use super::CgroupError;

const CPU_PERIOD_US: u64 = 100_000;

/// Limits applied to one sandbox cgroup.
#[derive(Debug, Clone, Copy)]
pub struct CgroupLimits {
    pub memory_bytes: u64,
    pub pids: u32,
    pub cpu_millicores: u32,
}

/// What the cgroup measured over a run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CgroupUsage {
    pub cpu_ns: u64,
    pub peak_memory_bytes: u64,
    pub oom_kills: u64,
}

/// Which hierarchy a control file lives in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Hierarchy {
    Memory,
    Pids,
    Cpu,
}

/// One control-file write: the limits as the kernel takes them, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Write {
    hierarchy: Hierarchy,
    file: &'static str,
    value: String,
}

fn w(hierarchy: Hierarchy, file: &'static str, value: impl ToString) -> Write {
    Write {
        hierarchy,
        file,
        value: value.to_string(),
    }
}

/// The writes that apply `l`. `memsw`: v1's memory controller can limit
/// swap (without it the host must have no swap: checked by the caller).
fn limit_writes(version: CgroupVersion, l: CgroupLimits, memsw: bool) -> Vec<Write> {
    use Hierarchy::*;
    let quota = (u64::from(l.cpu_millicores) * CPU_PERIOD_US / 1000).max(1000);
    match version {
        CgroupVersion::V2 => vec![
            w(Memory, "memory.max", l.memory_bytes),
            // No swap: the memory limit is the whole budget.
            w(Memory, "memory.swap.max", 0),
            w(Pids, "pids.max", l.pids),
            w(Cpu, "cpu.max", format!("{quota} {CPU_PERIOD_US}")),
        ],
        CgroupVersion::V1 => {
            let (pages, sockets) = v1_memory_split(l.memory_bytes);
            let mut v = vec![w(Memory, "memory.limit_in_bytes", pages)];
            if memsw {
                // memory+swap = memory: no swap (must come after the limit).
                v.push(w(Memory, "memory.memsw.limit_in_bytes", pages));
            }
            v.push(w(Memory, "memory.kmem.tcp.limit_in_bytes", sockets));
            v.push(w(Pids, "pids.max", l.pids));
            v.push(w(Cpu, "cpu.cfs_period_us", CPU_PERIOD_US));
            v.push(w(Cpu, "cpu.cfs_quota_us", quota));
            v
        }
    }
}

/// v1 charges socket buffers (TCP and UDP) to a counter of their own, and
/// only once its limit is set; left unset, a run's loopback connections
/// can queue more kernel memory than its whole memory limit. Split the
/// run's budget: a sixteenth (at least 1 MiB) for socket buffers, the rest
/// for everything else (pages, page cache, kernel objects), so that the two
/// together never exceed it. v2 charges sockets to `memory.max` itself.
pub fn v1_memory_split(memory_bytes: u64) -> (u64, u64) {
    let sockets = (memory_bytes / 16).max(1 << 20).min(memory_bytes / 2);
    (memory_bytes - sockets, sockets)
}

/// v1 turns socket accounting on for the whole kernel (a static key, patched
/// into the code with all CPUs stopped) when the first cgroup gets a socket
/// limit, and off when the last such cgroup goes. An unlimited limit on the
/// long-lived parent of the runs keeps it on, so that runs do not pay for
/// the patching twice each. Best effort: the run's own limit is what counts.
fn keep_socket_accounting_on(parent_dir: &Path) {
    let _ = files::write(&parent_dir.join("memory.kmem.tcp.limit_in_bytes"), "-1");
}

fn swap_total_is_zero() -> bool {
    fs::read_to_string("/proc/swaps")
        .map(|s| s.lines().skip(1).all(|l| l.trim().is_empty()))
        .unwrap_or(false)
}

/// The cgroup(s) of one run. Dropping it kills what is left in it and
/// removes its directories.
#[derive(Debug)]
pub struct SandboxCgroup {
    version: CgroupVersion,
    name: String,
    memory: PathBuf,
    pids: PathBuf,
    cpu: PathBuf,
    /// v1's cpuacct hierarchy (v2 accounts CPU in `cpu`).
    cpuacct: Option<PathBuf>,
    /// v1's freezer hierarchy (v2 kills with `cgroup.kill`).
    freezer: Option<PathBuf>,
    /// Every directory created for this run, in creation order.
    dirs: Vec<PathBuf>,
}

impl SandboxCgroup {
    /// Create the run's cgroup(s) named `name` under `parent` and apply
    /// `limits`. On error, whatever was created is removed again.
    pub fn create(
        layout: &CgroupLayout,
        parent: &str,
        name: &str,
        limits: CgroupLimits,
    ) -> Result<SandboxCgroup, CgroupError> {
        let cg = SandboxCgroup::make_dirs(layout, parent, name)?;
        cg.apply(limits)?;
        Ok(cg)
    }

    fn make_dirs(
        layout: &CgroupLayout,
        parent: &str,
        name: &str,
    ) -> Result<SandboxCgroup, CgroupError> {
        let mut cg = SandboxCgroup {
            version: layout.version(),
            name: name.to_string(),
            memory: PathBuf::new(),
            pids: PathBuf::new(),
            cpu: PathBuf::new(),
            cpuacct: None,
            freezer: None,
            dirs: Vec::new(),
        };
        match layout {
            CgroupLayout::V2 { root, .. } => {
                let dir = make_v2_dir(root, parent, name, &mut cg.dirs)?;
                (cg.memory, cg.pids, cg.cpu) = (dir.clone(), dir.clone(), dir);
            }
            CgroupLayout::V1 {
                memory,
                pids,
                cpu,
                cpuacct,
                freezer,
            } => {
                cg.memory = make_v1_dir(memory, parent, name, &mut cg.dirs)?;
                keep_socket_accounting_on(&join_rel(memory, parent));
                cg.pids = make_v1_dir(pids, parent, name, &mut cg.dirs)?;
                cg.cpu = make_v1_dir(cpu, parent, name, &mut cg.dirs)?;
                cg.cpuacct = Some(make_v1_dir(cpuacct, parent, name, &mut cg.dirs)?);
                cg.freezer = Some(make_v1_dir(freezer, parent, name, &mut cg.dirs)?);
            }
        }
        Ok(cg)
    }

    fn dir_of(&self, h: Hierarchy) -> &Path {
        match h {
            Hierarchy::Memory => &self.memory,
            Hierarchy::Pids => &self.pids,
            Hierarchy::Cpu => &self.cpu,
        }
    }

    fn apply(&self, limits: CgroupLimits) -> Result<(), CgroupError> {
        let memsw = self.memory.join("memory.memsw.limit_in_bytes").exists();
        if self.version == CgroupVersion::V1 && !memsw && !swap_total_is_zero() {
            return Err(CgroupError::SwapNotLimitable);
        }
        for write in limit_writes(self.version, limits, memsw) {
            let dir = self.dir_of(write.hierarchy);
            files::write(&dir.join(write.file), &write.value).map_err(|source| {
                CgroupError::SetLimit {
                    what: write.file,
                    path: dir.to_path_buf(),
                    source,
                }
            })?;
        }
        Ok(())
    }

    pub fn version(&self) -> CgroupVersion {
        self.version
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// The directories a process joins: one on v2, one per hierarchy on v1.
    fn member_dirs(&self) -> Vec<&Path> {
        let mut dirs: Vec<&Path> = match (&self.cpuacct, &self.freezer) {
            (Some(acct), Some(freezer)) => vec![&self.memory, &self.pids, &self.cpu, acct, freezer],
            _ => vec![&self.memory],
        };
        // Co-mounted hierarchies (cpu,cpuacct) share a directory: one write
        // each, as every cgroup.procs write takes a global lock.
        dirs.dedup();
        dirs
    }

    /// Move process `pid` into every hierarchy of this cgroup.
    pub fn attach(&self, pid: Pid) -> Result<(), CgroupError> {
        for dir in self.member_dirs() {
            files::write(&dir.join("cgroup.procs"), &pid.to_string()).map_err(|source| {
                CgroupError::Attach {
                    pid: pid.as_raw(),
                    path: dir.to_path_buf(),
                    source,
                }
            })?;
        }
        Ok(())
    }

    /// The processes in the cgroup (host pids; on v1, the memory hierarchy's).
    pub fn processes(&self) -> Vec<Pid> {
        files::pids(&self.memory.join("cgroup.procs"))
            .into_iter()
            .map(Pid::from_raw)
            .collect()
    }

    /// SIGKILL every process in the cgroup.
    pub fn kill_all(&self) {
        super::kill::kill_all_in(self.version, &self.memory, self.freezer.as_deref());
    }

    /// The run's cgroup directory on v2, opened for `clone3(CLONE_INTO_CGROUP)`.
    pub fn open_v2_dir(&self) -> Option<fs::File> {
        (self.version == CgroupVersion::V2)
            .then(|| fs::File::open(&self.memory).ok())
            .flatten()
    }

    pub fn usage(&self) -> CgroupUsage {
        let (peak, events, oom_key) = match self.version {
            CgroupVersion::V2 => ("memory.peak", "memory.events", "oom_kill"),
            CgroupVersion::V1 => (
                "memory.max_usage_in_bytes",
                "memory.oom_control",
                "oom_kill",
            ),
        };
        let cpu_ns = match &self.cpuacct {
            Some(a) => files::read_u64(&a.join("cpuacct.usage")),
            None => files::read_keyed(&self.cpu.join("cpu.stat"), "usage_usec") * 1000,
        };
        CgroupUsage {
            cpu_ns,
            peak_memory_bytes: files::read_u64(&self.memory.join(peak)),
            oom_kills: files::read_keyed(&self.memory.join(events), oom_key),
        }
    }
}

impl Drop for SandboxCgroup {
    fn drop(&mut self) {
        self.kill_all();
        files::remove_dirs(&self.dirs);
    }
}

fn create_err(path: &Path) -> impl FnOnce(std::io::Error) -> CgroupError + '_ {
    move |source| CgroupError::Create {
        path: path.to_path_buf(),
        source,
    }
}

/// v2: `<root>/<parent>/<name>`, with the controllers enabled on the way.
fn make_v2_dir(
    root: &Path,
    parent: &str,
    name: &str,
    made: &mut Vec<PathBuf>,
) -> Result<PathBuf, CgroupError> {
    super::layout::enable_v2_controllers(root)?;
    let mut p = root.to_path_buf();
    for seg in parent.split('/').filter(|s| !s.is_empty()) {
        p.push(seg);
        files::mkdir(&p).map_err(create_err(&p))?;
        super::layout::enable_v2_controllers(&p)?;
    }
    let dir = p.join(name);
    files::mkdir(&dir).map_err(create_err(&dir))?;
    made.push(dir.clone());
    Ok(dir)
}

/// v1: `<base>/<parent>/<name>` in one hierarchy.
fn make_v1_dir(
    base: &Path,
    parent: &str,
    name: &str,
    made: &mut Vec<PathBuf>,
) -> Result<PathBuf, CgroupError> {
    let parent_dir = join_rel(base, parent);
    fs::create_dir_all(&parent_dir).map_err(create_err(&parent_dir))?;
    let dir = parent_dir.join(name);
    files::mkdir(&dir).map_err(create_err(&dir))?;
    // A hierarchy mounted twice (cpu,cpuacct) gives the same directory.
    if !made.contains(&dir) {
        made.push(dir.clone());
    }
    Ok(dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: CgroupLimits = CgroupLimits {
        memory_bytes: 64 << 20,
        pids: 16,
        cpu_millicores: 500,
    };

    #[test]
    fn v2_limits_are_memory_without_swap_pids_and_a_cpu_quota() {
        let writes = limit_writes(CgroupVersion::V2, LIMITS, false);
        let text: Vec<String> = writes
            .iter()
            .map(|w| format!("{}={}", w.file, w.value))
            .collect();
        assert_eq!(
            text,
            [
                "memory.max=67108864",
                "memory.swap.max=0",
                "pids.max=16",
                "cpu.max=50000 100000"
            ]
        );
    }

    #[test]
    fn v1_limits_swap_only_when_the_kernel_can_and_after_the_memory_limit() {
        let with = limit_writes(CgroupVersion::V1, LIMITS, true);
        assert_eq!(with[0].file, "memory.limit_in_bytes");
        assert_eq!(with[0].value, (60 << 20).to_string());
        assert_eq!(with[1].file, "memory.memsw.limit_in_bytes");
        assert_eq!(with[1].value, (60 << 20).to_string());
        assert_eq!(with[2].file, "memory.kmem.tcp.limit_in_bytes");
        assert_eq!(with[2].value, (4 << 20).to_string());
        let without = limit_writes(CgroupVersion::V1, LIMITS, false);
        assert!(without
            .iter()
            .all(|w| w.file != "memory.memsw.limit_in_bytes"));
        let quota = without
            .iter()
            .find(|w| w.file == "cpu.cfs_quota_us")
            .unwrap();
        assert_eq!(quota.value, "50000");
    }

    #[test]
    fn v1_socket_buffers_and_pages_share_the_memory_budget() {
        for m in [16 << 20, 64 << 20, 512 << 20, 1 << 40] {
            let (pages, sockets) = v1_memory_split(m);
            assert_eq!(pages + sockets, m);
            assert!(sockets >= 1 << 20 && pages >= m / 2);
        }
    }

    #[test]
    fn tiny_cpu_shares_still_get_a_quota_the_kernel_accepts() {
        let l = CgroupLimits {
            cpu_millicores: 1,
            ..LIMITS
        };
        let w = limit_writes(CgroupVersion::V2, l, false);
        assert_eq!(w[3].value, "1000 100000");
    }

    /// A fake v2 cgroupfs: the files the kernel would make, in a temp dir.
    fn fake_v2(root: &Path, run: &str) {
        for d in [
            root.to_path_buf(),
            root.join("runs"),
            root.join("runs").join(run),
        ] {
            fs::create_dir_all(&d).unwrap();
            fs::write(d.join("cgroup.controllers"), "cpu memory pids").unwrap();
            fs::write(d.join("cgroup.subtree_control"), "").unwrap();
        }
        let leaf = root.join("runs").join(run);
        for f in [
            "memory.max",
            "memory.swap.max",
            "pids.max",
            "cpu.max",
            "cgroup.procs",
            "cgroup.kill",
        ] {
            fs::write(leaf.join(f), "").unwrap();
        }
        fs::write(leaf.join("memory.peak"), "12345\n").unwrap();
        fs::write(leaf.join("memory.events"), "oom 1\noom_kill 1\n").unwrap();
        fs::write(leaf.join("cpu.stat"), "usage_usec 250\nuser_usec 200\n").unwrap();
    }

    #[test]
    fn a_run_cgroup_on_a_fake_v2_tree_is_limited_attached_measured_and_removed() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("cg");
        fake_v2(&root, "pycell-7-r-1");
        let layout = CgroupLayout::V2 {
            root: root.clone(),
            proc_self: "/proc/self".into(),
        };
        let cg = SandboxCgroup::create(&layout, "runs", "pycell-7-r-1", LIMITS).unwrap();
        let leaf = root.join("runs/pycell-7-r-1");
        let read = |f: &str| fs::read_to_string(leaf.join(f)).unwrap();
        assert_eq!(read("memory.max"), "67108864");
        assert_eq!(read("cpu.max"), "50000 100000");
        cg.attach(Pid::from_raw(4242)).unwrap();
        assert_eq!(read("cgroup.procs"), "4242");
        let u = cg.usage();
        assert_eq!(
            u,
            CgroupUsage {
                cpu_ns: 250_000,
                peak_memory_bytes: 12345,
                oom_kills: 1
            }
        );
        // What the kernel would do on rmdir; then Drop kills and removes.
        for e in fs::read_dir(&leaf).unwrap() {
            fs::remove_file(e.unwrap().path()).unwrap();
        }
        drop(cg);
        assert!(!leaf.exists(), "Drop removes the run's directory");
        assert!(root.join("runs").exists(), "but not its parent");
    }

    #[test]
    fn a_limit_the_kernel_does_not_offer_refuses_the_run() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("cg");
        fake_v2(&root, "r");
        fs::remove_file(root.join("runs/r/memory.swap.max")).unwrap();
        let layout = CgroupLayout::V2 {
            root: root.clone(),
            proc_self: "/proc/self".into(),
        };
        let e = SandboxCgroup::create(&layout, "runs", "r", LIMITS)
            .unwrap_err()
            .to_string();
        assert!(e.contains("cannot set memory.swap.max"), "{e}");
    }

    #[test]
    fn a_parent_without_the_controllers_is_refused_by_name() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("cg");
        fake_v2(&root, "r");
        fs::write(root.join("cgroup.controllers"), "cpu pids").unwrap();
        let layout = CgroupLayout::V2 {
            root,
            proc_self: "/proc/self".into(),
        };
        let e = SandboxCgroup::create(&layout, "runs", "r", LIMITS)
            .unwrap_err()
            .to_string();
        assert!(e.contains("memory controller"), "{e}");
    }
}
