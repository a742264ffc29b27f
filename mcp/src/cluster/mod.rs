//! The cluster as the command line gives it (`pycell mcp --http --node
//! NAME=ADDR ...`) and how this process reaches nodes on other hosts: a
//! `pycell gateway` each, over mutual TLS ([`tunnel`]). Placement and
//! routing are the run service's (`pycell_engine::cluster`).

pub mod gateway;
pub mod tunnel;

use std::path::PathBuf;

pub use pycell_engine::cluster::Nodes;

/// Where a node is, as `--node NAME=ADDR` says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodeAddr {
    Unix(PathBuf),
    /// `HOST:PORT` of its gateway (TLS).
    Tls(String),
}

/// A `--node` that is not `NAME=unix:PATH` or `NAME=HOST:PORT`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("--node {spec:?}: {problem}")]
pub struct NodeSpecError {
    pub spec: String,
    pub problem: NodeSpecProblem,
}

/// What is wrong with a `--node`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum NodeSpecProblem {
    #[error("write NAME=unix:PATH or NAME=HOST:PORT")]
    NoName,
    #[error("a node name is 1 to 63 of a-z, 0-9, '-' and '.'")]
    BadName,
    #[error("the socket path must be absolute")]
    RelativeSocket,
    #[error("the address is not HOST:PORT")]
    NotHostPort,
}

/// `NAME=unix:PATH` or `NAME=HOST:PORT`.
pub fn parse_node(spec: &str) -> Result<(String, NodeAddr), NodeSpecError> {
    let bad = |problem| NodeSpecError {
        spec: spec.to_string(),
        problem,
    };
    let (name, addr) = spec
        .split_once('=')
        .ok_or_else(|| bad(NodeSpecProblem::NoName))?;
    if !is_node_name(name) {
        return Err(bad(NodeSpecProblem::BadName));
    }
    let addr = match addr.strip_prefix("unix:") {
        Some(path) if path.starts_with('/') => NodeAddr::Unix(PathBuf::from(path)),
        Some(_) => return Err(bad(NodeSpecProblem::RelativeSocket)),
        None if is_host_port(addr) => NodeAddr::Tls(addr.to_string()),
        None => return Err(bad(NodeSpecProblem::NotHostPort)),
    };
    Ok((name.to_string(), addr))
}

/// `HOST:PORT` (a name or an address, then a port number).
pub fn is_host_port(s: &str) -> bool {
    s.rsplit_once(':')
        .is_some_and(|(h, p)| !h.is_empty() && p.parse::<u16>().is_ok())
}

/// Whether `name` may name a node: it goes into session handles after `@`.
fn is_node_name(name: &str) -> bool {
    (1..=63).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
}

impl pycell_engine::cluster::Reach for tunnel::Tunnels {
    fn open(&self, name: &str, remote: String) -> std::io::Result<PathBuf> {
        tunnel::Tunnels::open(self, name, remote).map_err(std::io::Error::other)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_flags_are_checked() {
        assert_eq!(
            parse_node("a=unix:/run/pycell/pycell.sock").unwrap(),
            ("a".into(), NodeAddr::Unix("/run/pycell/pycell.sock".into()))
        );
        assert_eq!(
            parse_node("node-1.example=10.0.0.1:7433").unwrap().1,
            NodeAddr::Tls("10.0.0.1:7433".into())
        );
        assert_eq!(
            parse_node("b=[::1]:7433").unwrap().1,
            NodeAddr::Tls("[::1]:7433".into())
        );
        for bad in [
            "a",
            "A=unix:/x",
            "a=unix:x",
            "a=host",
            "a@b=unix:/x",
            "a=:80",
        ] {
            assert!(parse_node(bad).is_err(), "{bad}");
        }
    }
}
