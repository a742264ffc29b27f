//! pycelld: the daemon that serves sandbox runs on a Unix socket. Two
//! processes: the root [`monitor`] (single-threaded, tiny: it loads the
//! policy, prepares and starts `pycell-jailer` through the one launch path
//! of `pycell_launch::launcher`, kills runs, enforces its own hard deadline and
//! writes the [`audit`] log) and the unprivileged [`broker`] (the socket,
//! the protocol, peer checks, the [`admission`] queue; it decodes each
//! run's events and builds its result). [`config`] is
//! `/etc/pycell/pycelld.toml`; [`listen`] gets the listening socket (from
//! systemd, or bound by hand); [`sockets`] passes descriptors between them.
//!
//! Threat model: requests come from local users allowed on the socket and are
//! untrusted input: sizes are bounded, unknown fields rejected, policies are
//! chosen by name among the operator's (never by a client-supplied path).
//! The broker, which parses them, runs unprivileged; the root monitor accepts
//! only a closed set of typed messages from it ([`link`]), re-checks every
//! field of a run's order without parsing client input, resolves every run
//! itself, and the jailer re-validates the resulting spec.
#![forbid(unsafe_code)]

pub mod admission;
pub mod audit;
pub mod broker;
pub mod config;
pub mod envs;
pub mod link;
pub mod listen;
pub mod logging;
pub mod monitor;
pub mod policy_access;
pub mod pool;
pub mod principal;
pub mod sockets;
