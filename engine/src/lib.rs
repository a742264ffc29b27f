//! pycell's run service: what every front end (the CLI's commands, the MCP
//! server over stdio or HTTP, the cluster front end) runs code through,
//! so that a bound written here holds for each of them.
//!
//! - [`service`]: [`service::RunService`] over the [`service::Sandboxes`]
//!   of one backend: embedded (this process jails, as root), a pycelld,
//!   or a cluster of them;
//! - [`local`]: the embedded machinery (launcher, env installs, a run's
//!   stop request) that the embedded backend and one-shot commands share;
//! - [`envs`]: the dependency envs this process builds (pycelld's env
//!   builder uses it too);
//! - [`cluster`]: where a cluster's runs and sessions go;
//! - [`tool_source`]: the client's own tool servers, as runs are offered
//!   them.
#![forbid(unsafe_code)]

pub mod cluster;
pub mod envs;
pub mod local;
pub mod service;
pub mod tool_source;
