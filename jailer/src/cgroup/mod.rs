//! cgroups: where the hierarchies are ([`layout`]) and one run's cgroup
//! with its memory (no swap), pids and CPU limits, accounting and kill
//! ([`sandbox`]), on cgroup v2 and on the legacy/hybrid v1 layout.
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
pub(crate) mod layout;
pub(crate) mod sandbox;

use std::io;
use std::path::PathBuf;

pub use layout::{CgroupLayout, HostPaths};
pub(crate) use sandbox::{CgroupLimits, SandboxCgroup};

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
    #[error("cgroup: cannot read {what}: {detail}")]
    Read { what: String, detail: String },
    #[error("cgroup: {path} is not a subtree pycelld may manage: {detail}. On cgroup v2 pycelld needs a cgroup of its own: run it as its systemd service (Delegate=yes), or by hand with `systemd-run --scope -p Delegate=yes pycelld ...`")]
    NotDelegated { path: PathBuf, detail: String },
}
