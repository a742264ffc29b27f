//! What every pycell mode shares: the resolved jail spec ([`spec`]), the
//! jailer's report ([`report`]) with its failure [`codes`], the jailer's
//! event stream ([`events`]), the client/daemon protocol ([`protocol`],
//! [`framing`], [`client`]), the structured result ([`result`]), the
//! resolution of a request under a policy ([`resolve`]), sandbox uid leases
//! ([`uidalloc`]), run cgroups ([`cgroup`]), what a host offers ([`info`]), and the one launch path
//! every mode takes ([`launch`]): prepare → spawn `pycell-jailer` → decode
//! its events → build the result.
//!
//! Threat model: this crate runs in `pycell` (the user's own process), in
//! pycelld's unprivileged broker and in its root monitor. Requests are
//! untrusted input: sizes are bounded, unknown fields rejected, policies
//! chosen by name among the operator's, and every spec is validated before
//! a jailer sees it (which validates it again). The jailer's event stream is
//! length-checked before anything is allocated for it and output is capped
//! again here. No `unsafe`: the one module with raw syscalls is the jailer's.
//! The run cgroups live here, not in the jailer, so that whoever holds a
//! sandbox uid's lease can kill and remove what a dead jailer left behind.
#![forbid(unsafe_code)]

pub mod cgroup;
pub mod client;
pub mod codes;
pub mod deps;
pub mod events;
pub mod fdpass;
pub mod framing;
pub mod info;
pub mod launch;
pub mod protocol;
pub mod report;
pub mod resolve;
pub mod result;
pub mod runner;
pub mod spec;
pub mod uidalloc;
