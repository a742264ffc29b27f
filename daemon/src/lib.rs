//! pycelld: the daemon that serves sandbox runs on a Unix socket. Two
//! processes, each with its own module tree, so that a reviewer of root's
//! code reads one folder: the root [`monitor`] (single-threaded, tiny: it
//! gets the listening socket, loads the policy, prepares and starts
//! `pycell-jailer` through the one launch path of `pycell_launch::launcher`,
//! keeps the warm pools and zygotes, has children of its own build envs,
//! kills runs, enforces its own hard deadline and writes the audit log) and
//! the unprivileged [`broker`] (the socket, the protocol, peer checks, which
//! policies a uid may name, the admission queue; it decodes each run's
//! events and builds its result). What both read: [`config`]
//! (`/etc/pycell/pycelld.toml`), the [`link`] between them, [`sockets`]
//! (passing descriptors) and [`logging`].
//!
//! Threat model: requests come from local users allowed on the socket and are
//! untrusted input: sizes are bounded, unknown fields rejected, policies are
//! chosen by name among the operator's (never by a client-supplied path).
//! The broker, which parses them, runs unprivileged; the root monitor accepts
//! only a closed set of typed messages from it ([`link`]), re-checks every
//! field of a run's order without parsing client input, resolves every run
//! itself, and the jailer re-validates the resulting spec.
#![forbid(unsafe_code)]

pub mod broker;
pub mod config;
pub mod link;
pub mod logging;
pub mod monitor;
pub mod sockets;
