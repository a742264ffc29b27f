//! Code mode: sandboxed code calls MCP tools of servers its client
//! configured, through a channel handed into the jail, while the servers
//! and their credentials stay outside it. This crate holds the pure parts:
//! the client's file of servers ([`config`]), which calls are allowed
//! ([`allow`]), the tools' input schemas ([`schema`]), the Python names of
//! servers and tools ([`names`]) and the frames that carry the calls
//! ([`frames`]), the catalog of a client's tools under a policy
//! ([`catalog`]), and the service that answers one jail's channel
//! ([`service`]), which calls an [`service::Upstream`] the caller gives
//! it.
#![forbid(unsafe_code)]

pub mod allow;
pub mod catalog;
pub mod config;
pub mod frames;
pub mod names;
pub mod schema;
pub mod service;
