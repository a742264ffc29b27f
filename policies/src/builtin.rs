//! The policies shipped with pycell, compiled in, so that `--policy default`
//! works before anything is installed under /etc/pycell/policies. The same
//! files are installed there for operators to read and edit; an installed
//! file takes precedence over the built-in copy (the CLI/daemon decide that).
//!
//! Built-in policies are parsed in "complete" mode: every section and every
//! limit must be written out, so the shipped files document every knob.

use std::path::PathBuf;

use crate::validate::Completeness;
use crate::{Policy, PolicyError};

/// (name, file contents). The file is `policies/NAME.toml`.
const BUILTINS: &[(&str, &str)] = &[
    ("default", include_str!("../default.toml")),
    ("network", include_str!("../network.toml")),
    ("install", include_str!("../install.toml")),
    ("data-science", include_str!("../data-science.toml")),
    ("mcp-server", include_str!("../mcp-server.toml")),
];

const NAMES: &[&str] = &[
    "default",
    "network",
    "install",
    "data-science",
    "mcp-server",
];

/// Names of the built-in policies, in a stable order.
pub fn names() -> &'static [&'static str] {
    NAMES
}

/// The TOML text of a built-in policy.
pub fn source(name: &str) -> Option<&'static str> {
    BUILTINS
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, text)| *text)
}

/// Parses a built-in policy. Errors show the origin as `<builtin>/NAME.toml`.
pub fn load(name: &str) -> Result<Policy, PolicyError> {
    let text = source(name).ok_or_else(|| PolicyError::UnknownBuiltin {
        name: name.to_owned(),
        available: names(),
    })?;
    crate::parse(text, &origin(name), Completeness::Complete)
}

fn origin(name: &str) -> PathBuf {
    PathBuf::from(format!("<builtin>/{name}.toml"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_sources_agree() {
        let from_table: Vec<&str> = BUILTINS.iter().map(|(n, _)| *n).collect();
        assert_eq!(from_table, NAMES);
    }

    #[test]
    fn every_shipped_file_is_built_in_and_loads_completely() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        let mut shipped: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|e| e == "toml") && !p.ends_with("Cargo.toml"))
            .map(|p| p.file_stem().unwrap().to_string_lossy().into_owned())
            .collect();
        shipped.sort();
        let mut builtin: Vec<String> = names().iter().map(|s| s.to_string()).collect();
        builtin.sort();
        assert_eq!(
            shipped, builtin,
            "every policies/*.toml must be listed in BUILTINS"
        );
        for name in names() {
            let policy = load(name).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(policy.name, *name);
            // The installed copy is parsed as a user file: it must load too.
            let path = dir.join(format!("{name}.toml"));
            assert_eq!(Policy::load(&path).unwrap(), policy);
        }
    }

    #[test]
    fn unknown_builtin() {
        assert_eq!(
            load("nope").unwrap_err().to_string(),
            "no built-in policy named \"nope\"; built-in policies: default, network, install, data-science, mcp-server"
        );
    }
}
