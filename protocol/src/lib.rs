//! pycell's client/daemon protocol: its messages ([`messages`]: the run
//! request, its limit overrides, stable error codes), length-delimited
//! frames with the protocol's bound ([`framing`]), the structured run
//! result every mode returns ([`result`]) with what the sandbox refused
//! and why the run ended ([`refusals`]), sessions ([`session`]), code
//! mode's tools ([`tools`]), limits ([`limits`]), what a host offers
//! ([`info`]), and a blocking client with daemon socket discovery
//! ([`client`]).
//!
//! The schema is this crate's own: every type a client encodes or decodes
//! is defined here (or in `pycell_wire`, the jailer's frames, which the
//! results embed); the policy's, runner's and tools' types become them
//! through `From` impls that name each field, so a change in those crates
//! cannot change what the Python client decodes unnoticed.
//! `vectors.json` holds the Rust and Python codecs to the same frames.
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
pub mod refusals;
pub mod result;
pub mod session;
pub mod tools;
