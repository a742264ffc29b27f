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

/// `NAME=unix:PATH` or `NAME=HOST:PORT`.
pub fn parse_node(spec: &str) -> Result<(String, NodeAddr), String> {
    let (name, addr) = spec
        .split_once('=')
        .ok_or_else(|| format!("--node {spec:?}: write NAME=unix:PATH or NAME=HOST:PORT"))?;
    if let Some(p) = name_problem(name) {
        return Err(format!("--node {spec:?}: {p}"));
    }
    let addr = match addr.strip_prefix("unix:") {
        Some(path) if path.starts_with('/') => NodeAddr::Unix(PathBuf::from(path)),
        Some(_) => return Err(format!("--node {spec:?}: the socket path must be absolute")),
        None if is_host_port(addr) => NodeAddr::Tls(addr.to_string()),
        None => return Err(format!("--node {spec:?}: the address is not HOST:PORT")),
    };
    Ok((name.to_string(), addr))
}

/// `HOST:PORT` (a name or an address, then a port number).
pub fn is_host_port(s: &str) -> bool {
    s.rsplit_once(':')
        .is_some_and(|(h, p)| !h.is_empty() && p.parse::<u16>().is_ok())
}

/// A node's name: it goes into session handles after `@`.
fn name_problem(name: &str) -> Option<&'static str> {
    let ok = (1..=63).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.');
    (!ok).then_some("a node name is 1 to 63 of a-z, 0-9, '-' and '.'")
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
