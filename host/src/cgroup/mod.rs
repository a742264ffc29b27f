//! cgroups: where the hierarchies are ([`layout`]) and one run's cgroup
//! with its memory (no swap), pids and CPU limits, accounting and kill
//! ([`sandbox`]), on cgroup v2 and on the legacy/hybrid v1 layout. A run's
//! cgroup is a cgroups-rs `Cgroup` on pycell's own hierarchy
//! ([`hierarchy`]): cgroups-rs sets the limits, attaches, lists, freezes,
//! kills (v2); what it lacks or does in a way
//! pycell cannot use is pycell's own, each piece saying why where it is.
//!
//! v1: one directory per controller hierarchy (memory, pids, cpu, cpuacct),
//! each created under the jailer's own cgroup in that hierarchy, so we never
//! touch cgroups that belong to others. v2: one directory under
//! `<unified root>/<parent>`, a subtree pycell owns (pycelld's delegated
//! subtree, or a top-level `pycell` cgroup in embedded mode).
//!
//! Fail closed: a limit that cannot be written refuses the run. Host paths
//! (`/sys/fs/cgroup`, `/proc/self`) come in through [`HostPaths`], and what
//! to write and how to read usage are pure functions, so the logic is unit
//! tested on a temporary directory without root.

mod files;
mod hierarchy;
pub mod kept;
mod kill;
pub mod layout;
pub mod sandbox;
mod stale;

use std::io;
use std::path::PathBuf;

pub use layout::{CgroupLayout, HostPaths};
pub use sandbox::{CgroupLimits, CgroupUsage, SandboxCgroup};

#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    #[error("cgroup: cannot find the {controller} controller: {detail}. pycell needs the memory, pids and cpu controllers (cgroup v2 with them enabled, or v1 hierarchies mounted under /sys/fs/cgroup)")]
    ControllerMissing {
        controller: &'static str,
        detail: String,
    },
    #[error("cgroup: cannot create {path}: {source}")]
    Create { path: PathBuf, source: io::Error },
    #[error("cgroup: cannot set {what} in {path}: {source}")]
    SetLimit {
        what: &'static str,
        path: PathBuf,
        source: io::Error,
    },
    #[error("cgroup: swap is enabled on this host but the memory controller cannot limit it (no memory.memsw.limit_in_bytes: boot with swapaccount=1, or turn swap off)")]
    SwapNotLimitable,
    #[error("cgroup: cannot attach pid {pid} to {path}: {source}")]
    Attach {
        pid: i32,
        path: PathBuf,
        source: io::Error,
    },
    #[error("cgroup: cannot open {path} for the jail to join its cgroup: {source}")]
    OpenTasks { path: PathBuf, source: io::Error },
    #[error("cgroup: cannot read {what}: {detail}")]
    Read { what: String, detail: String },
    #[error("cgroup: {path} is not a subtree pycelld may manage: {detail}. On cgroup v2 pycelld needs a cgroup of its own: run it as its systemd service (Delegate=yes), or by hand with `systemd-run --scope -p Delegate=yes pycelld ...`")]
    NotDelegated { path: PathBuf, detail: String },
}

impl CgroupError {
    /// Whether the cgroup hierarchy refused a write because it is mounted
    /// read-only (a container not given a writable cgroup).
    pub fn is_read_only(&self) -> bool {
        match self {
            CgroupError::Create { source, .. }
            | CgroupError::SetLimit { source, .. }
            | CgroupError::Attach { source, .. } => source.raw_os_error() == Some(nix::libc::EROFS),
            _ => false,
        }
    }
}

/// The prefix of every cgroup name of runs under sandbox uid `uid`: the
/// holder of that uid's lease owns every cgroup that starts with it.
pub fn run_prefix(uid: u32) -> String {
    format!("pycell-{uid}-")
}

/// The cgroup name of run `run_id` under sandbox uid `uid`.
pub fn run_name(uid: u32, run_id: &str) -> String {
    format!("{}{run_id}", run_prefix(uid))
}

/// Kill and remove every cgroup of sandbox uid `uid` under `parent`: what a
/// jailer that died before cleaning up left behind. Called by whoever holds
/// the uid's lease, when a jailer starts and when its lease is released.
/// Without a usable cgroup layout there is nothing of ours to reclaim.
pub fn reclaim_uid(parent: &str, uid: u32) {
    if let Ok(layout) = CgroupLayout::detect() {
        layout.remove_stale(parent, &run_prefix(uid));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_read_only_hierarchy_is_told_apart() {
        let create = |errno| CgroupError::Create {
            path: PathBuf::from("/sys/fs/cgroup/supervisor"),
            source: io::Error::from_raw_os_error(errno),
        };
        assert!(create(nix::libc::EROFS).is_read_only());
        assert!(!create(nix::libc::EACCES).is_read_only());
        assert!(!CgroupError::SwapNotLimitable.is_read_only());
    }
}
