//! Per-run cgroup: memory (no swap), pids and CPU limits, accounting, kill and
//! removal, on cgroup v2 and on the legacy/hybrid v1 layout.
//!
//! v1: one directory per controller hierarchy (memory, pids, cpu, cpuacct),
//! each created under the jailer's own cgroup in that hierarchy, so we never
//! touch cgroups that belong to others. v2: one directory under
//! `<unified root>/<parent>`, a subtree pycell owns (a systemd-delegated
//! subtree under the service, or a top-level `pycell` cgroup in embedded mode).
//!
//! Fail closed: a limit that cannot be written refuses the run.

use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use cgroups_rs::fs::cpu::CpuController;
use cgroups_rs::fs::cpuacct::CpuAcctController;
use cgroups_rs::fs::hierarchies::{self, V1};
use cgroups_rs::fs::memory::MemController;
use cgroups_rs::fs::pid::PidController;
use cgroups_rs::fs::{Controller, Controllers, MaxValue};
use cgroups_rs::CgroupPid;
use nix::unistd::Pid;
use serde::{Deserialize, Serialize};

const UNIFIED_ROOT: &str = "/sys/fs/cgroup";
const CPU_PERIOD_US: u64 = 100_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CgroupVersion {
    V1,
    V2,
}

#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    #[error("cgroup: cannot find the {controller} controller: {detail}. pycell needs the memory, pids and cpu controllers (cgroup v2 with them enabled, or v1 hierarchies mounted under /sys/fs/cgroup)")]
    ControllerMissing {
        controller: &'static str,
        detail: String,
    },
    #[error("cgroup: cannot create {path}: {source}")]
    Create { path: PathBuf, source: io::Error },
    #[error("cgroup: cannot set {what} in {path}: {detail}")]
    SetLimit {
        what: &'static str,
        path: PathBuf,
        detail: String,
    },
    #[error("cgroup: swap is enabled on this host but the memory controller cannot limit it (no memory.memsw.limit_in_bytes: boot with swapaccount=1, or turn swap off)")]
    SwapNotLimitable,
    #[error("cgroup: cannot attach pid {pid} to {path}: {detail}")]
    Attach {
        pid: i32,
        path: PathBuf,
        detail: String,
    },
    #[error("cgroup: cannot read {what}: {detail}")]
    Read { what: &'static str, detail: String },
    #[error("cgroup: {path} is not a subtree pycelld may manage: {detail}. On cgroup v2 pycelld needs a cgroup of its own: run it as its systemd service (Delegate=yes), or by hand with `systemd-run --scope -p Delegate=yes pycelld ...`")]
    NotDelegated { path: PathBuf, detail: String },
}

/// Where cgroup hierarchies live; from /proc/self/cgroup and mountinfo.
#[derive(Debug, Clone)]
pub enum CgroupLayout {
    V2 {
        root: PathBuf,
    },
    V1 {
        memory: PathBuf,
        pids: PathBuf,
        cpu: PathBuf,
        cpuacct: PathBuf,
    },
}

/// Limits applied to one sandbox cgroup.
#[derive(Debug, Clone, Copy)]
pub struct CgroupLimits {
    pub memory_bytes: u64,
    pub pids: u32,
    pub cpu_millicores: u32,
}

/// What the cgroup measured over a run.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct CgroupUsage {
    pub cpu_ns: u64,
    pub peak_memory_bytes: u64,
    pub oom_kills: u64,
}

fn missing(controller: &'static str, detail: impl Into<String>) -> CgroupError {
    CgroupError::ControllerMissing {
        controller,
        detail: detail.into(),
    }
}

/// This process's cgroup path in the hierarchy whose /proc/self/cgroup line
/// lists `controller` (v1), or the `0::` line (v2).
fn own_path(proc_self_cgroup: &str, controller: &str) -> Option<String> {
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

fn read_self_cgroup() -> Result<String, CgroupError> {
    fs::read_to_string("/proc/self/cgroup").map_err(|e| CgroupError::Read {
        what: "/proc/self/cgroup",
        detail: e.to_string(),
    })
}

fn join_rel(base: &Path, rel: &str) -> PathBuf {
    let mut p = base.to_path_buf();
    for seg in rel.split('/').filter(|s| !s.is_empty()) {
        p.push(seg);
    }
    p
}

impl CgroupLayout {
    /// Detect the layout of this host, as seen by this process.
    pub fn detect() -> Result<CgroupLayout, CgroupError> {
        let self_cgroup = read_self_cgroup()?;
        if hierarchies::is_cgroup2_unified_mode() {
            return Ok(CgroupLayout::V2 {
                root: PathBuf::from(UNIFIED_ROOT),
            });
        }
        let v1 = V1::new();
        let dir = |ctrl: Controllers, name: &'static str| -> Result<PathBuf, CgroupError> {
            let (mount_point, mount_root) = v1
                .get_mount_point(ctrl)
                .ok_or_else(|| missing(name, "no cgroup v1 hierarchy is mounted for it"))?;
            let own = own_path(&self_cgroup, name)
                .ok_or_else(|| missing(name, "it is not listed in /proc/self/cgroup"))?;
            // The mount may expose only a subtree (mount_root); our path is
            // relative to the hierarchy's real root.
            let root = mount_root.to_string_lossy();
            let rel = if root == "/" {
                own.as_str()
            } else {
                own.strip_prefix(root.as_ref()).unwrap_or(own.as_str())
            };
            Ok(join_rel(&mount_point, rel))
        };
        Ok(CgroupLayout::V1 {
            memory: dir(Controllers::Mem, "memory")?,
            pids: dir(Controllers::Pids, "pids")?,
            cpu: dir(Controllers::Cpu, "cpu")?,
            cpuacct: dir(Controllers::CpuAcct, "cpuacct")?,
        })
    }

    pub fn version(&self) -> CgroupVersion {
        match self {
            CgroupLayout::V2 { .. } => CgroupVersion::V2,
            CgroupLayout::V1 { .. } => CgroupVersion::V1,
        }
    }

    fn bases(&self) -> Vec<&Path> {
        match self {
            CgroupLayout::V2 { root } => vec![root.as_path()],
            CgroupLayout::V1 {
                memory,
                pids,
                cpu,
                cpuacct,
            } => {
                vec![
                    memory.as_path(),
                    pids.as_path(),
                    cpu.as_path(),
                    cpuacct.as_path(),
                ]
            }
        }
    }

    /// Make this process's own cgroup the home of its runs, and return the
    /// `parent` to give [`SandboxCgroup::create`] for runs in `<own>/<runs>`.
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
        let CgroupLayout::V2 { root } = self else {
            return Ok(runs.to_string());
        };
        let self_cgroup = read_self_cgroup()?;
        let own = own_path(&self_cgroup, "").ok_or(CgroupError::Read {
            what: "/proc/self/cgroup",
            detail: "no cgroup v2 (0::) line".into(),
        })?;
        let own_rel = own.trim_matches('/');
        let parent = if own_rel.is_empty() {
            runs.to_string()
        } else {
            format!("{own_rel}/{runs}")
        };
        // The root cgroup may hold processes and children at once.
        if own_rel.is_empty() {
            return Ok(parent);
        }
        let own_dir = join_rel(root, own_rel);
        let procs = fs::read_to_string(own_dir.join("cgroup.procs")).map_err(|e| {
            CgroupError::NotDelegated {
                path: own_dir.clone(),
                detail: format!("cannot read cgroup.procs: {e}"),
            }
        })?;
        let me = std::process::id().to_string();
        let others: Vec<&str> = procs
            .lines()
            .map(str::trim)
            .filter(|p| !p.is_empty() && *p != me)
            .collect();
        if !others.is_empty() {
            return Err(CgroupError::NotDelegated {
                path: own_dir,
                detail: format!("it holds other processes too (pids {})", others.join(", ")),
            });
        }
        let leaf = own_dir.join(supervisor);
        mkdir(&leaf)?;
        write_file(&leaf.join("cgroup.procs"), &me).map_err(|e| CgroupError::Attach {
            pid: std::process::id() as i32,
            path: leaf.clone(),
            detail: e.to_string(),
        })?;
        enable_v2_controllers(&own_dir)?;
        Ok(parent)
    }

    /// Remove cgroups under `parent` whose names start with `prefix`, killing
    /// anything still in them. Only call this for a prefix nobody else can be
    /// using (pycell uses the sandbox uid, whose lease the caller holds): they
    /// are leftovers of a supervisor that was killed before cleaning up.
    pub fn remove_stale(&self, parent: &str, prefix: &str) {
        for base in self.bases() {
            let dir = join_rel(base, parent);
            let Ok(entries) = fs::read_dir(&dir) else {
                continue;
            };
            for e in entries.flatten() {
                let name = e.file_name();
                if !name.to_string_lossy().starts_with(prefix) {
                    continue;
                }
                let path = e.path();
                if self.version() == CgroupVersion::V2 {
                    let _ = write_file(&path.join("cgroup.kill"), "1");
                } else if let Ok(procs) = fs::read_to_string(path.join("cgroup.procs")) {
                    for pid in procs.lines().filter_map(|l| l.trim().parse::<i32>().ok()) {
                        let _ = nix::sys::signal::kill(
                            Pid::from_raw(pid),
                            nix::sys::signal::Signal::SIGKILL,
                        );
                    }
                }
                remove_dirs(&[path]);
            }
        }
    }
}

/// The cgroup(s) of one run. Removed by [`SandboxCgroup::remove`].
#[derive(Debug)]
pub struct SandboxCgroup {
    version: CgroupVersion,
    name: String,
    memory: MemController,
    pids: PidController,
    cpu: CpuController,
    cpuacct: Option<CpuAcctController>,
    /// Every directory created for this run, in creation order.
    dirs: Vec<PathBuf>,
}

fn mkdir(path: &Path) -> Result<(), CgroupError> {
    match fs::create_dir(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(CgroupError::Create {
            path: path.to_path_buf(),
            source: e,
        }),
    }
}

fn write_file(path: &Path, value: &str) -> io::Result<()> {
    fs::OpenOptions::new()
        .write(true)
        .open(path)?
        .write_all(value.as_bytes())
}

/// v2: make sure `dir`'s children get the memory, pids and cpu controllers.
fn enable_v2_controllers(dir: &Path) -> Result<(), CgroupError> {
    let available = fs::read_to_string(dir.join("cgroup.controllers")).unwrap_or_default();
    let enabled = fs::read_to_string(dir.join("cgroup.subtree_control")).unwrap_or_default();
    for ctrl in ["memory", "pids", "cpu"] {
        if enabled.split_whitespace().any(|c| c == ctrl) {
            continue;
        }
        if !available.split_whitespace().any(|c| c == ctrl) {
            return Err(missing(
                if ctrl == "memory" { "memory" } else if ctrl == "pids" { "pids" } else { "cpu" },
                format!("{} does not offer it (cgroup.controllers: {:?}); enable it in the parent's cgroup.subtree_control or delegate it to pycelld", dir.display(), available.trim()),
            ));
        }
        write_file(&dir.join("cgroup.subtree_control"), &format!("+{ctrl}")).map_err(|e| {
            CgroupError::SetLimit {
                what: "cgroup.subtree_control",
                path: dir.to_path_buf(),
                detail: format!("{e} (a v2 cgroup with processes of its own cannot delegate controllers; give pycell a delegated subtree)"),
            }
        })?;
    }
    Ok(())
}

fn swap_total_is_zero() -> bool {
    fs::read_to_string("/proc/swaps")
        .map(|s| s.lines().skip(1).all(|l| l.trim().is_empty()))
        .unwrap_or(false)
}

impl SandboxCgroup {
    /// Create the run's cgroup(s) named `name` under `parent` and apply `limits`.
    /// On error, whatever was created is removed again.
    pub fn create(
        layout: &CgroupLayout,
        parent: &str,
        name: &str,
        limits: CgroupLimits,
    ) -> Result<SandboxCgroup, CgroupError> {
        let mut dirs = Vec::new();
        let cg = match layout {
            CgroupLayout::V2 { root } => {
                enable_v2_controllers(root)?;
                let mut p = root.clone();
                for seg in parent.split('/').filter(|s| !s.is_empty()) {
                    p.push(seg);
                    mkdir(&p)?;
                    enable_v2_controllers(&p)?;
                }
                let dir = p.join(name);
                fs::create_dir(&dir).map_err(|e| CgroupError::Create {
                    path: dir.clone(),
                    source: e,
                })?;
                dirs.push(dir.clone());
                SandboxCgroup {
                    version: CgroupVersion::V2,
                    name: name.to_string(),
                    memory: MemController::new(dir.clone(), root.clone(), true),
                    pids: PidController::new(dir.clone(), root.clone(), true),
                    cpu: CpuController::new(dir, root.clone(), true),
                    cpuacct: None,
                    dirs,
                }
            }
            CgroupLayout::V1 {
                memory,
                pids,
                cpu,
                cpuacct,
            } => {
                let mut make = |base: &Path| -> Result<PathBuf, CgroupError> {
                    let parent_dir = join_rel(base, parent);
                    fs::create_dir_all(&parent_dir).map_err(|e| CgroupError::Create {
                        path: parent_dir.clone(),
                        source: e,
                    })?;
                    let dir = parent_dir.join(name);
                    fs::create_dir(&dir).map_err(|e| CgroupError::Create {
                        path: dir.clone(),
                        source: e,
                    })?;
                    dirs.push(dir.clone());
                    Ok(dir)
                };
                let made = (|| {
                    Ok::<_, CgroupError>((make(memory)?, make(pids)?, make(cpu)?, make(cpuacct)?))
                })();
                let (m, p, c, a) = match made {
                    Ok(t) => t,
                    Err(e) => {
                        remove_dirs(&dirs);
                        return Err(e);
                    }
                };
                SandboxCgroup {
                    version: CgroupVersion::V1,
                    name: name.to_string(),
                    memory: MemController::new(m, memory.clone(), false),
                    pids: PidController::new(p, pids.clone(), false),
                    cpu: CpuController::new(c, cpu.clone(), false),
                    cpuacct: Some(CpuAcctController::new(a, cpuacct.clone())),
                    dirs,
                }
            }
        };
        if let Err(e) = cg.apply(limits) {
            cg.remove();
            return Err(e);
        }
        Ok(cg)
    }

    fn apply(&self, limits: CgroupLimits) -> Result<(), CgroupError> {
        let set = |what: &'static str, path: &Path, r: cgroups_rs::fs::error::Result<()>| {
            r.map_err(|e| CgroupError::SetLimit {
                what,
                path: path.to_path_buf(),
                detail: e.to_string(),
            })
        };
        let mem = i64::try_from(limits.memory_bytes).unwrap_or(i64::MAX);
        set(
            "memory limit",
            self.memory.path(),
            self.memory.set_limit(mem),
        )?;
        // No swap: the memory limit is the whole budget.
        match self.version {
            CgroupVersion::V2 => set(
                "memory.swap.max",
                self.memory.path(),
                self.memory.set_memswap_limit(0),
            )?,
            CgroupVersion::V1 => {
                if self
                    .memory
                    .path()
                    .join("memory.memsw.limit_in_bytes")
                    .exists()
                {
                    set(
                        "memory.memsw.limit_in_bytes",
                        self.memory.path(),
                        self.memory.set_memswap_limit(mem),
                    )?;
                } else if !swap_total_is_zero() {
                    return Err(CgroupError::SwapNotLimitable);
                }
            }
        }
        set(
            "pids.max",
            self.pids.path(),
            self.pids
                .set_pid_max(MaxValue::Value(i64::from(limits.pids))),
        )?;
        let quota = u64::from(limits.cpu_millicores) * CPU_PERIOD_US / 1000;
        set(
            "cpu quota",
            self.cpu.path(),
            self.cpu
                .set_cfs_quota_and_period(Some(quota.max(1000) as i64), Some(CPU_PERIOD_US)),
        )?;
        Ok(())
    }

    pub fn version(&self) -> CgroupVersion {
        self.version
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// Move process `pid` into every hierarchy of this cgroup.
    pub fn attach(&self, pid: Pid) -> Result<(), CgroupError> {
        let cpid = CgroupPid::from(pid.as_raw() as u64);
        let mut ctrls: Vec<&dyn Controller> = vec![&self.memory];
        if self.version == CgroupVersion::V1 {
            ctrls.push(&self.pids);
            ctrls.push(&self.cpu);
            if let Some(a) = &self.cpuacct {
                ctrls.push(a);
            }
        }
        for c in ctrls {
            c.add_task_by_tgid(&cpid).map_err(|e| CgroupError::Attach {
                pid: pid.as_raw(),
                path: c.path().to_path_buf(),
                detail: e.to_string(),
            })?;
        }
        Ok(())
    }

    /// SIGKILL every process in the cgroup (v2: cgroup.kill; v1: repeatedly
    /// kill what cgroup.procs lists until it is empty or we give up).
    pub fn kill_all(&self) {
        if self.version == CgroupVersion::V2 {
            let _ = write_file(&self.memory.path().join("cgroup.kill"), "1");
            return;
        }
        for _ in 0..50 {
            let procs = self.memory.procs();
            if procs.is_empty() {
                return;
            }
            for p in procs {
                let _ = nix::sys::signal::kill(
                    Pid::from_raw(p.pid as i32),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
    }

    /// The run's cgroup directory on v2, opened for `clone3(CLONE_INTO_CGROUP)`.
    pub fn open_v2_dir(&self) -> Option<std::fs::File> {
        if self.version != CgroupVersion::V2 {
            return None;
        }
        std::fs::File::open(self.memory.path()).ok()
    }

    pub fn is_empty(&self) -> bool {
        self.memory.procs().is_empty()
    }

    pub fn usage(&self) -> CgroupUsage {
        let peak = match self.version {
            CgroupVersion::V2 => read_u64(&self.memory.path().join("memory.peak")),
            CgroupVersion::V1 => read_u64(&self.memory.path().join("memory.max_usage_in_bytes")),
        };
        let oom_kills = match self.version {
            CgroupVersion::V2 => keyed(&self.memory.path().join("memory.events"), "oom_kill"),
            CgroupVersion::V1 => keyed(&self.memory.path().join("memory.oom_control"), "oom_kill"),
        };
        let cpu_ns = match &self.cpuacct {
            Some(a) => read_u64(&a.path().join("cpuacct.usage")),
            None => keyed(&self.cpu.path().join("cpu.stat"), "usage_usec") * 1000,
        };
        CgroupUsage {
            cpu_ns,
            peak_memory_bytes: peak,
            oom_kills,
        }
    }

    /// Remove the run's directories (after everything in them has exited).
    pub fn remove(&self) {
        remove_dirs(&self.dirs);
    }
}

fn read_u64(path: &Path) -> u64 {
    fs::read_to_string(path)
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0)
}

fn keyed(path: &Path, key: &str) -> u64 {
    fs::read_to_string(path)
        .ok()
        .and_then(|s| {
            s.lines().find_map(|l| {
                let mut it = l.split_whitespace();
                (it.next() == Some(key)).then(|| it.next().and_then(|v| v.parse().ok()))?
            })
        })
        .unwrap_or(0)
}

/// rmdir with a few short retries: a cgroup stays busy for a moment after its
/// last process is reaped.
fn remove_dirs(dirs: &[PathBuf]) {
    for d in dirs.iter().rev() {
        let mut delay = std::time::Duration::from_micros(200);
        for _ in 0..12 {
            match fs::remove_dir(d) {
                Ok(()) => break,
                Err(e) if e.kind() == io::ErrorKind::NotFound => break,
                Err(_) => {
                    std::thread::sleep(delay);
                    delay = (delay * 2).min(std::time::Duration::from_millis(100));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn join_rel_ignores_empty_segments() {
        assert_eq!(
            join_rel(Path::new("/sys/fs/cgroup/memory"), "/a//b/"),
            PathBuf::from("/sys/fs/cgroup/memory/a/b")
        );
        assert_eq!(join_rel(Path::new("/x"), "/"), PathBuf::from("/x"));
    }

    #[test]
    fn keyed_reads_flat_files() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("memory.events");
        fs::write(&f, "low 0\nhigh 0\nmax 3\noom 1\noom_kill 2\n").unwrap();
        assert_eq!(keyed(&f, "oom_kill"), 2);
        assert_eq!(keyed(&f, "oom"), 1);
        assert_eq!(keyed(&f, "absent"), 0);
    }
}
