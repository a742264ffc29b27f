//! pycell's client/daemon protocol: its messages ([`messages`]: the run
//! request, its limit overrides, stable error codes), length-delimited
//! frames with the protocol's bound ([`framing`]), the structured run
//! result every mode returns ([`result`]), sessions ([`session`]), what a
//! host offers ([`info`]), and a blocking client with daemon socket discovery
//! ([`client`]).
//!
//! Threat model: requests are untrusted input from any local user the
//! daemon lets in: sizes are bounded before allocation, unknown fields are
//! rejected, and nothing here acts on a request; that is the broker's and
//! the launcher's work. No `unsafe`.
#![forbid(unsafe_code)]

pub mod bounds;
pub mod client;
pub mod framing;
pub mod info;
pub mod limits;
pub mod messages;
pub mod result;
pub mod session;
