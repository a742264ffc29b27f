//! pycelld and what its clients share with it: the wire protocol
//! ([`protocol`]), the resolution of a run request under a policy into a jail
//! spec ([`resolve`]), and the structured run result ([`result`]).
//!
//! Threat model: requests come from local users allowed on the socket and are
//! untrusted input: sizes are bounded, unknown fields rejected, policies are
//! chosen by name among the operator's (never by a client-supplied path), and
//! everything a request can influence is re-validated by the jailer.
#![forbid(unsafe_code)]

pub mod protocol;
pub mod resolve;
pub mod result;
