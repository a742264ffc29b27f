//! pycell's run service, as far as it is one library so far: what this
//! process runs itself ([`local`]: embedded mode, as root) and the
//! dependency envs it builds ([`envs`]). The CLI, the MCP server and
//! pycelld's env builders share it, so a bound written here holds for
//! each of them.
#![forbid(unsafe_code)]

pub mod envs;
pub mod local;
