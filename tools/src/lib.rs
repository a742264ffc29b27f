//! Code mode: sandboxed code calls MCP tools of servers its client
//! configured, through a channel handed into the jail, while the servers
//! and their credentials stay outside it. This crate holds the pure parts:
//! the client's file of servers ([`config`]), which calls are allowed
//! ([`allow`]), the tools' input schemas ([`schema`]), the Python names of
//! servers and tools ([`names`]) and the frames that carry the calls
//! ([`frames`]). Nothing here touches a process or a socket.
#![forbid(unsafe_code)]

pub mod allow;
pub mod config;
pub mod frames;
pub mod names;
pub mod schema;
