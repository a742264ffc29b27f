//! The pycell jail: everything between a resolved [`spec::JailSpec`] and the
//! sandboxed program's `exec`.
//!
//! Threat model: the code that runs in the jail is hostile. It gets a new
//! user, pid, mount, network, IPC, UTS and cgroup namespace; runs as a host
//! uid that is neither root nor any account; sees a minimal read-only root;
//! has no capabilities, `no_new_privs`, Landlock and a seccomp allowlist; and
//! is held by cgroup limits. The jailer itself runs as root and trusts only
//! its spec (which it re-validates) and the host's kernel. It is
//! single-threaded so that `clone` without a new stack is sound; `unsafe` is
//! confined to [`syscall`]. Any layer that cannot be applied refuses the run.
#![deny(unsafe_code)]

pub mod capabilities;
pub mod cgroup;
pub mod child;
pub mod events;
pub mod landlock_rules;
pub mod mounts;
pub mod pipeline;
pub mod report;
pub mod rlimits;
pub mod spec;
pub mod supervisor;
pub mod syscall;
pub mod uidalloc;
