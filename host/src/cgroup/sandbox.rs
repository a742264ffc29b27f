//! One run's cgroup: created with its limits (on v1, a kept one taken
//! where there is one: [`super::kept`]), joined by the jail, measured, and
//! killed and removed (or kept) when dropped.

use std::fs;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};

use cgroups_rs::cpu::CpuController;
use cgroups_rs::cpuacct::CpuAcctController;
use cgroups_rs::memory::MemController;
use cgroups_rs::pid::PidController;
use cgroups_rs::{Cgroup, CgroupPid, Controller, MaxValue};
use nix::unistd::Pid;
use pycell_wire::report::CgroupVersion;

use super::files::{self, join_rel};
use super::hierarchy::{member_dirs, RunHierarchy};
use super::layout::CgroupLayout;
use super::CgroupError;

const CPU_PERIOD_US: u64 = 100_000;

/// Move the calling thread (the jail's single-threaded first process, its
/// children not yet born) into the run's v1 cgroup, through the `tasks`
/// files [`SandboxCgroup::open_v1_tasks`] opened: "0" in `tasks` moves the
/// writer itself, one thread. The kernel takes its global
/// `cgroup_threadgroup_rwsem` for every migration but exactly this one, and
/// that lock's first writer waits for an RCU grace period: 4 to 23 ms when
/// the jailer attached the jail from outside, 0.05 ms this way. The files
/// were opened by root; the kernel lets a writer move a task whose uid is
/// its own euid, which the jail's is by then.
pub fn join_v1(tasks: &[OwnedFd]) -> std::io::Result<()> {
    for fd in tasks {
        let n = nix::unistd::write(fd.as_fd(), b"0")?;
        if n != 1 {
            return Err(std::io::Error::other(
                "short write to a cgroup's tasks file",
            ));
        }
    }
    Ok(())
}

/// The cgroup's view of a run's limits: what is written to one sandbox
/// cgroup.
#[derive(Debug, Clone, Copy)]
pub struct CgroupLimits {
    pub memory_bytes: u64,
    pub pids: u32,
    pub cpu_millicores: u32,
}

impl CgroupLimits {
    /// The cgroup's part of `l`.
    pub fn of(l: &pycell_wire::limits::RunLimits) -> CgroupLimits {
        CgroupLimits {
            memory_bytes: l.memory.get(),
            pids: l.pids,
            cpu_millicores: l.cpus.millicores(),
        }
    }
}

/// What the cgroup measured over a run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CgroupUsage {
    pub cpu_ns: u64,
    pub peak_memory_bytes: u64,
    pub oom_kills: u64,
    /// New processes or threads the pids limit refused (`pids.events`'s
    /// `max`, on v1 and v2: the kernel counts each fork or clone it failed).
    pub pids_refused: u64,
}

/// One limit, as pycell means it; [`Limit::apply`] hands it to cgroups-rs,
/// which names the file for the cgroup version.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Limit {
    /// Pages, page cache and kernel objects (v1), or all memory (v2).
    Memory(u64),
    /// v1: memory+swap, set to the memory limit; v2: swap alone, set to 0.
    Swap(u64),
    /// v1's separate counter for socket buffers (see [`v1_memory_split`]).
    SocketBuffers(u64),
    Pids(u32),
    Cpu {
        quota_us: u64,
        period_us: u64,
    },
}

/// The limits that apply `l`, in the order they must be written. `memsw`:
/// v1's memory controller can limit swap (without it the host must have no
/// swap: checked by the caller).
fn limit_plan(version: CgroupVersion, l: CgroupLimits, memsw: bool) -> Vec<Limit> {
    let cpu = Limit::Cpu {
        quota_us: (u64::from(l.cpu_millicores) * CPU_PERIOD_US / 1000).max(1000),
        period_us: CPU_PERIOD_US,
    };
    match version {
        // No swap: the memory limit is the whole budget.
        CgroupVersion::V2 => vec![
            Limit::Memory(l.memory_bytes),
            Limit::Swap(0),
            Limit::Pids(l.pids),
            cpu,
        ],
        CgroupVersion::V1 => {
            let (pages, sockets) = v1_memory_split(l.memory_bytes);
            let mut v = vec![Limit::Memory(pages)];
            if memsw {
                // memory+swap = memory: no swap (must come after the limit).
                v.push(Limit::Swap(pages));
            }
            v.extend([Limit::SocketBuffers(sockets), Limit::Pids(l.pids), cpu]);
            v
        }
    }
}

impl Limit {
    /// The control file this limit is written to, for messages.
    fn file(self, version: CgroupVersion) -> &'static str {
        let v2 = version == CgroupVersion::V2;
        match self {
            Limit::Memory(_) if v2 => "memory.max",
            Limit::Memory(_) => "memory.limit_in_bytes",
            Limit::Swap(_) if v2 => "memory.swap.max",
            Limit::Swap(_) => "memory.memsw.limit_in_bytes",
            Limit::SocketBuffers(_) => "memory.kmem.tcp.limit_in_bytes",
            Limit::Pids(_) => "pids.max",
            Limit::Cpu { .. } if v2 => "cpu.max",
            Limit::Cpu { .. } => "cpu.cfs_quota_us",
        }
    }

    fn apply(self, cg: &Cgroup) -> std::io::Result<()> {
        let missing = || std::io::Error::other("the cgroup has no such controller");
        let memory = || cg.controller_of::<MemController>().ok_or_else(missing);
        let bytes = |b: u64| i64::try_from(b).unwrap_or(i64::MAX);
        let set = match self {
            Limit::Memory(b) => memory()?.set_limit(bytes(b)),
            Limit::Swap(b) => memory()?.set_memswap_limit(bytes(b)),
            Limit::SocketBuffers(b) => memory()?.set_tcp_limit(bytes(b)),
            Limit::Pids(n) => cg
                .controller_of::<PidController>()
                .ok_or_else(missing)?
                .set_pid_max(MaxValue::Value(i64::from(n))),
            Limit::Cpu {
                quota_us,
                period_us,
            } => cg
                .controller_of::<CpuController>()
                .ok_or_else(missing)?
                .set_cfs_quota_and_period(Some(bytes(quota_us)), Some(period_us)),
        };
        set.map_err(io_cause)
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
    let _ = MemController::new(parent_dir.to_path_buf(), false).set_tcp_limit(-1);
}

fn swap_total_is_zero() -> bool {
    fs::read_to_string("/proc/swaps")
        .map(|s| s.lines().skip(1).all(|l| l.trim().is_empty()))
        .unwrap_or(false)
}

/// The cgroup(s) of one run, a cgroups-rs [`Cgroup`] on pycell's
/// [`RunHierarchy`]. Dropping it kills what is left in it and removes its
/// directories.
#[derive(Debug)]
pub struct SandboxCgroup {
    version: CgroupVersion,
    name: String,
    cgroup: Cgroup,
    /// Every directory of this run, in creation order.
    dirs: Vec<PathBuf>,
    /// The counters as the run found them: zero in a new cgroup; in a
    /// kept one, what earlier runs left (`peak_memory_bytes`: the memory
    /// still charged to it, their page cache), subtracted from what this
    /// run reads, so that its accounting is its own.
    baseline: CgroupUsage,
    /// Whether the directories are kept for the next run when dropped
    /// (v1, once its limits are set).
    keep: bool,
}

impl SandboxCgroup {
    /// Create the run's cgroup(s) named `name` under `parent` and apply
    /// `limits`. On error, whatever was created is removed again. `keep`
    /// (v1 only): take a kept set if there is one, and keep this one for
    /// the next run when dropped ([`super::kept`]).
    pub fn create(
        layout: &CgroupLayout,
        parent: &str,
        name: &str,
        limits: CgroupLimits,
        keep: bool,
    ) -> Result<SandboxCgroup, CgroupError> {
        let v1 = keep && layout.version() == CgroupVersion::V1;
        if v1 {
            if let Some(cg) = SandboxCgroup::take_kept(layout, parent, name, limits) {
                return Ok(cg);
            }
        }
        let mut cg = SandboxCgroup::unmade(layout, parent, name);
        make_dirs(layout, parent, name, &mut cg.dirs)?;
        cg.apply(limits)?;
        cg.keep = v1;
        Ok(cg)
    }

    /// The cgroup named `name` under `parent`, its directories not yet
    /// made or taken.
    fn unmade(layout: &CgroupLayout, parent: &str, name: &str) -> SandboxCgroup {
        SandboxCgroup {
            version: layout.version(),
            name: name.to_string(),
            cgroup: RunHierarchy::new(layout).load(parent, name),
            dirs: Vec::new(),
            baseline: CgroupUsage::default(),
            keep: false,
        }
    }

    /// A kept set taken as the run's cgroup, checked empty and thawed, its
    /// accounting restarted and `limits` set; None (whatever was taken
    /// removed again) when there is none or it will not do.
    fn take_kept(
        layout: &CgroupLayout,
        parent: &str,
        name: &str,
        limits: CgroupLimits,
    ) -> Option<SandboxCgroup> {
        let mut parents: Vec<PathBuf> = Vec::new();
        for base in layout.bases() {
            let p = join_rel(base, parent);
            if !parents.contains(&p) {
                parents.push(p);
            }
        }
        let mut cg = SandboxCgroup::unmade(layout, parent, name);
        cg.dirs = super::kept::take(&parents, name)?;
        if !cg.is_empty_and_thawed() {
            return None;
        }
        cg.baseline = cg.restart_accounting().ok()?;
        cg.apply(limits).ok()?;
        cg.keep = true;
        Some(cg)
    }

    /// Remove the run's directories when dropped, whatever `create` was
    /// told: its owner is gone and will not remove a kept set.
    pub fn do_not_keep(&mut self) {
        self.keep = false;
    }

    /// Whether no process is in any of the run's directories and none is
    /// frozen: what a cgroup must be to be kept, or used again.
    fn is_empty_and_thawed(&self) -> bool {
        self.dirs.iter().all(|d| {
            let procs = fs::read_to_string(d.join("cgroup.procs"));
            let empty = procs.is_ok_and(|p| p.trim().is_empty());
            let state = d.join("freezer.state");
            empty && (!state.exists() || files::read_text(&state).trim() == "THAWED")
        })
    }

    /// v1: the peak memory restarted from what is in use now (what earlier
    /// runs left charged), and every counter read as this run's baseline.
    fn restart_accounting(&self) -> std::io::Result<CgroupUsage> {
        files::write(&self.memory_dir().join("memory.max_usage_in_bytes"), "0")?;
        let mut at_start = self.read_usage();
        at_start.peak_memory_bytes =
            files::read_u64(&self.memory_dir().join("memory.usage_in_bytes"));
        Ok(at_start)
    }

    /// v1: memory and memory+swap unlimited again (in that order of
    /// files: memory+swap may never be below memory), so that the next
    /// run's limits can be written in the usual order.
    fn unlimit_memory(&self) -> bool {
        let dir = self.memory_dir();
        let memsw = dir.join("memory.memsw.limit_in_bytes");
        (!memsw.exists() || files::write(&memsw, "-1").is_ok())
            && files::write(&dir.join("memory.limit_in_bytes"), "-1").is_ok()
    }

    fn apply(&self, limits: CgroupLimits) -> Result<(), CgroupError> {
        let dir = self.memory_dir();
        let memsw = dir.join("memory.memsw.limit_in_bytes").exists();
        if self.version == CgroupVersion::V1 && !memsw && !swap_total_is_zero() {
            return Err(CgroupError::SwapNotLimitable);
        }
        for limit in limit_plan(self.version, limits, memsw) {
            limit
                .apply(&self.cgroup)
                .map_err(|e| CgroupError::SetLimit {
                    what: limit.file(self.version),
                    path: dir.clone(),
                    source: e,
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

    /// The run's directory in the memory hierarchy (v2: its only one).
    fn memory_dir(&self) -> PathBuf {
        self.cgroup
            .controller_of::<MemController>()
            .map(|m| m.path().to_path_buf())
            .unwrap_or_default()
    }

    /// The run's directory in the pids hierarchy (v2: its only one).
    fn pids_dir(&self) -> PathBuf {
        self.cgroup
            .controller_of::<PidController>()
            .map(|m| m.path().to_path_buf())
            .unwrap_or_default()
    }

    /// Move process `pid` into every hierarchy of this cgroup.
    pub fn attach(&self, pid: Pid) -> Result<(), CgroupError> {
        let task = CgroupPid::from(pid.as_raw() as u64);
        for dir in member_dirs(&self.cgroup) {
            let joined = self.cgroup.subsystems().iter().find_map(|s| {
                let c = s.to_controller();
                (c.path() == dir).then(|| c.add_task_by_tgid(&task))
            });
            if let Some(Err(e)) = joined {
                return Err(CgroupError::Attach {
                    pid: pid.as_raw(),
                    path: dir,
                    source: io_cause(e),
                });
            }
        }
        Ok(())
    }

    /// The processes in the cgroup (host pids; on v1, the memory
    /// hierarchy's: a process joins every hierarchy or the run is refused).
    pub fn processes(&self) -> Vec<Pid> {
        self.cgroup
            .controller_of::<MemController>()
            .map(|m| m.procs())
            .unwrap_or_default()
            .into_iter()
            .map(|p| Pid::from_raw(p.pid as i32))
            .collect()
    }

    /// SIGKILL every process in the cgroup.
    pub fn kill_all(&self) {
        super::kill::kill_all_in(&self.cgroup);
    }

    /// The files through which a process moves itself in (see
    /// [`join_v1`]: the same "0" works for both): on v1 each hierarchy's
    /// `tasks` (one thread, no global lock); on v2 `cgroup.procs` (the
    /// kernel checks permission with the credentials and cgroup namespace
    /// of whoever opened it: root, here). For a process that is not our
    /// child (a zygote's).
    pub fn open_join_files(&self) -> Result<Vec<OwnedFd>, CgroupError> {
        if self.version == CgroupVersion::V1 {
            return self.open_v1_tasks();
        }
        let path = self.memory_dir().join("cgroup.procs");
        fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .map(|f| vec![OwnedFd::from(f)])
            .map_err(|e| CgroupError::OpenTasks { path, source: e })
    }

    /// The one process in this cgroup (host pid), if exactly one is.
    pub fn only_member(&self) -> Option<Pid> {
        let procs = fs::read_to_string(self.memory_dir().join("cgroup.procs")).ok()?;
        let mut pids = procs.split_whitespace().map(str::parse::<i32>);
        match (pids.next(), pids.next()) {
            (Some(Ok(pid)), None) if pid > 0 => Some(Pid::from_raw(pid)),
            _ => None,
        }
    }

    /// On v1, each hierarchy's `tasks` file of the run's cgroup, opened for
    /// writing, for the jail to move itself in with (see
    /// [`join_v1`]); none on v2.
    pub fn open_v1_tasks(&self) -> Result<Vec<OwnedFd>, CgroupError> {
        if self.version != CgroupVersion::V1 {
            return Ok(Vec::new());
        }
        member_dirs(&self.cgroup)
            .into_iter()
            .map(|dir| {
                let path = dir.join("tasks");
                fs::OpenOptions::new()
                    .write(true)
                    .open(&path)
                    .map(OwnedFd::from)
                    .map_err(|e| CgroupError::OpenTasks { path, source: e })
            })
            .collect()
    }

    /// The run's cgroup directory on v2, opened for `clone3(CLONE_INTO_CGROUP)`:
    /// cgroups-rs has no use for a cgroup's descriptor, so it gives none.
    pub fn open_v2_dir(&self) -> Option<fs::File> {
        (self.version == CgroupVersion::V2)
            .then(|| fs::File::open(self.memory_dir()).ok())
            .flatten()
    }

    /// What the run used. pycell reads these files itself: cgroups-rs's
    /// statistics read 19 files on v1 for these three numbers (memory.stat
    /// and memory.numa_stat among them, cgroupfs's costliest reads), which
    /// cost the jailer 7% more CPU per run; on v2 they count no OOM kills
    /// and panic on an unreadable file.
    pub fn usage(&self) -> CgroupUsage {
        let now = self.read_usage();
        let base = &self.baseline;
        CgroupUsage {
            cpu_ns: now.cpu_ns.saturating_sub(base.cpu_ns),
            peak_memory_bytes: now.peak_memory_bytes.saturating_sub(base.peak_memory_bytes),
            oom_kills: now.oom_kills.saturating_sub(base.oom_kills),
            pids_refused: now.pids_refused.saturating_sub(base.pids_refused),
        }
    }

    /// The counters as the kernel has them.
    fn read_usage(&self) -> CgroupUsage {
        let dir = self.memory_dir();
        let (peak, events) = match self.version {
            CgroupVersion::V1 => ("memory.max_usage_in_bytes", "memory.oom_control"),
            CgroupVersion::V2 => ("memory.peak", "memory.events"),
        };
        let cpu_ns = match self.cgroup.controller_of::<CpuAcctController>() {
            Some(acct) => files::read_u64(&acct.path().join("cpuacct.usage")),
            None => files::read_keyed(&dir.join("cpu.stat"), "usage_usec") * 1000,
        };
        CgroupUsage {
            cpu_ns,
            peak_memory_bytes: files::read_u64(&dir.join(peak)),
            oom_kills: files::read_keyed(&dir.join(events), "oom_kill"),
            pids_refused: files::read_keyed(&self.pids_dir().join("pids.events"), "max"),
        }
    }
}

impl CgroupUsage {
    /// The limit events among these counts (the disk is not the cgroup's).
    pub fn limit_events(&self) -> pycell_wire::report::LimitEvents {
        pycell_wire::report::LimitEvents {
            oom_kills: self.oom_kills,
            pids_refused: self.pids_refused,
            disk_full: false,
        }
    }
}

impl SandboxCgroup {
    /// The memory the run's processes use now (a session's, between
    /// requests): one file read.
    pub fn memory_now(&self) -> u64 {
        let file = match self.version {
            CgroupVersion::V1 => "memory.usage_in_bytes",
            CgroupVersion::V2 => "memory.current",
        };
        let now = files::read_u64(&self.memory_dir().join(file));
        now.saturating_sub(self.baseline.peak_memory_bytes)
    }
}

impl Drop for SandboxCgroup {
    fn drop(&mut self) {
        self.kill_all();
        if self.keep && self.is_empty_and_thawed() && self.unlimit_memory() {
            super::kept::keep_or_remove(&self.dirs);
        } else {
            files::remove_dirs(&self.dirs);
        }
    }
}

/// The operating system's error under a cgroups-rs error, or its text.
fn io_cause(e: cgroups_rs::error::Error) -> std::io::Error {
    let os = std::error::Error::source(&e)
        .and_then(|c| c.downcast_ref::<std::io::Error>())
        .and_then(std::io::Error::raw_os_error);
    match os {
        Some(code) => std::io::Error::from_raw_os_error(code),
        None => std::io::Error::other(e.to_string()),
    }
}

/// Create the run's directories, one per hierarchy on v1, adding each to
/// `made` (so that a failure part way leaves them to be removed). pycell's own, not cgroups-rs's `Cgroup::create`: that
/// one logs and carries on where a v1 directory cannot be made, and on v2
/// enables every controller the host has along the path, ignoring refusals.
fn make_dirs(
    layout: &CgroupLayout,
    parent: &str,
    name: &str,
    made: &mut Vec<PathBuf>,
) -> Result<(), CgroupError> {
    match layout {
        CgroupLayout::V2 { root, .. } => {
            make_v2_dir(root, parent, name, made)?;
        }
        CgroupLayout::V1 { memory, .. } => {
            for base in layout.bases() {
                make_v1_dir(base, parent, name, made)?;
            }
            keep_socket_accounting_on(&join_rel(memory, parent));
        }
    }
    Ok(())
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
) -> Result<(), CgroupError> {
    super::layout::enable_v2_controllers(root)?;
    let mut p = root.to_path_buf();
    for seg in parent.split('/').filter(|s| !s.is_empty()) {
        p.push(seg);
        files::mkdir(&p).map_err(create_err(&p))?;
        super::layout::enable_v2_controllers(&p)?;
    }
    let dir = p.join(name);
    files::mkdir(&dir).map_err(create_err(&dir))?;
    made.push(dir);
    Ok(())
}

/// v1: `<base>/<parent>/<name>` in one hierarchy.
fn make_v1_dir(
    base: &Path,
    parent: &str,
    name: &str,
    made: &mut Vec<PathBuf>,
) -> Result<(), CgroupError> {
    let parent_dir = join_rel(base, parent);
    fs::create_dir_all(&parent_dir).map_err(create_err(&parent_dir))?;
    let dir = parent_dir.join(name);
    files::mkdir(&dir).map_err(create_err(&dir))?;
    // A hierarchy mounted twice (cpu,cpuacct) gives the same directory.
    if !made.contains(&dir) {
        made.push(dir);
    }
    Ok(())
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
        let plan = limit_plan(CgroupVersion::V2, LIMITS, false);
        let cpu = Limit::Cpu {
            quota_us: 50_000,
            period_us: 100_000,
        };
        assert_eq!(
            plan,
            [
                Limit::Memory(64 << 20),
                Limit::Swap(0),
                Limit::Pids(16),
                cpu
            ]
        );
        let files: Vec<&str> = plan.iter().map(|l| l.file(CgroupVersion::V2)).collect();
        assert_eq!(
            files,
            ["memory.max", "memory.swap.max", "pids.max", "cpu.max"]
        );
    }

    #[test]
    fn v1_limits_swap_only_when_the_kernel_can_and_after_the_memory_limit() {
        let with = limit_plan(CgroupVersion::V1, LIMITS, true);
        assert_eq!(
            with[..3],
            [
                Limit::Memory(60 << 20),
                Limit::Swap(60 << 20),
                Limit::SocketBuffers(4 << 20)
            ]
        );
        assert_eq!(
            with[1].file(CgroupVersion::V1),
            "memory.memsw.limit_in_bytes"
        );
        let without = limit_plan(CgroupVersion::V1, LIMITS, false);
        assert!(!without.iter().any(|l| matches!(l, Limit::Swap(_))));
        assert!(without.contains(&Limit::Cpu {
            quota_us: 50_000,
            period_us: 100_000
        }));
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
        let w = limit_plan(CgroupVersion::V2, l, false);
        assert_eq!(
            w[3],
            Limit::Cpu {
                quota_us: 1000,
                period_us: 100_000
            }
        );
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
            "cgroup.procs",
            "cgroup.kill",
        ] {
            fs::write(leaf.join(f), "").unwrap();
        }
        fs::write(leaf.join("cpu.max"), "max 100000\n").unwrap();
        fs::write(leaf.join("memory.peak"), "12345\n").unwrap();
        fs::write(leaf.join("memory.events"), "oom 1\noom_kill 1\n").unwrap();
        fs::write(leaf.join("pids.events"), "max 3\n").unwrap();
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
        let cg = SandboxCgroup::create(&layout, "runs", "pycell-7-r-1", LIMITS, false).unwrap();
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
                oom_kills: 1,
                pids_refused: 3,
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
        // cgroupfs refuses to create a control file it does not offer
        // (EACCES on open); a directory in its place refuses the write here.
        let swap = root.join("runs/r/memory.swap.max");
        fs::remove_file(&swap).unwrap();
        fs::create_dir(&swap).unwrap();
        let layout = CgroupLayout::V2 {
            root: root.clone(),
            proc_self: "/proc/self".into(),
        };
        let e = SandboxCgroup::create(&layout, "runs", "r", LIMITS, false)
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
        let e = SandboxCgroup::create(&layout, "runs", "r", LIMITS, false)
            .unwrap_err()
            .to_string();
        assert!(e.contains("memory controller"), "{e}");
    }
}
