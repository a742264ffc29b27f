//! pycelld and what its clients share with it: the wire protocol
//! ([`protocol`], [`framing`]), the resolution of a run request under a
//! policy into a jail spec ([`resolve`]), the structured run result
//! ([`result`]), host information ([`hostinfo`]), the daemon's two halves
//! ([`monitor`], root and tiny; [`broker`], unprivileged) and a client.
//!
//! Threat model: requests come from local users allowed on the socket and are
//! untrusted input: sizes are bounded, unknown fields rejected, policies are
//! chosen by name among the operator's (never by a client-supplied path).
//! The broker, which parses them, runs unprivileged; the root monitor accepts
//! only a closed set of typed messages from it and re-resolves every run
//! itself, and the jailer re-validates the resulting spec.
#![forbid(unsafe_code)]

pub mod broker;
pub mod client;
pub mod config;
pub mod framing;
pub mod hostinfo;
pub mod monitor;
pub mod protocol;
pub mod resolve;
pub mod result;
