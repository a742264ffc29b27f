//! The one launch path every mode takes ([`launcher`]): a request resolved
//! under its policy into a jail spec ([`resolve`]), a sandbox uid leased,
//! `pycell-jailer` started with the spec on its stdin, its events read
//! ([`events`]) and collected into the run's result; and what this host
//! offers ([`host_info`], with each isolation layer measured by
//! [`layers`]).
//!
//! Threat model: this crate runs in `pycell` (the user's own process), in
//! pycelld's unprivileged broker and in its root monitor. Requests are
//! untrusted: policies are chosen by name among the operator's, limits are
//! checked against the policy's ceilings, and every spec is validated
//! before a jailer sees it (which validates it again). The jailer's event
//! stream carries the sandbox's output: frames are length-checked before
//! allocation and output is capped again here. Nothing here builds a jail:
//! every mode starts the separate, single-threaded `pycell-jailer`
//! (pycelld's monitor has it forked by one that stays, [`fork_server`]).
#![forbid(unsafe_code)]

pub mod displays;
pub mod events;
pub mod fork_server;
pub mod host_info;
pub mod launcher;
pub mod layers;
pub mod resolve;
pub mod runner_pyc;
pub mod serving;
pub mod session;
pub mod session_fork;
pub mod session_table;
pub mod snapshots;
pub mod stopper;
pub mod supervisor;
pub mod tool_grant;
pub mod zygote;
