//! The root-only side of a run on the host: its cgroups ([`cgroup`]: made,
//! limited, measured, killed and removed) and its sandbox uid lease
//! ([`uidalloc`]).
//!
//! Threat model: only root processes use this crate to change anything
//! (the jailer, and the holders of sandbox uid leases: embedded `pycell
//! run`/`pycell mcp` and pycelld's monitor). Host paths come in as values so
//! the logic is tested on temporary trees; a limit that cannot be written
//! refuses the run. The cgroups live here, not in the jailer, so that
//! whoever holds a uid's lease can kill and remove what a dead jailer left.
//! No tokio, no `unsafe`.
#![forbid(unsafe_code)]

pub mod cgroup;
pub mod uidalloc;
