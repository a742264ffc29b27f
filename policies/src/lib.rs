//! pycell policies: parsing and validating the TOML files that say what a
//! sandbox may do.
//!
//! Threat model: policy files are written by the operator and trusted, but
//! they are hand-edited, so a typo must never weaken the jail silently.
//! Parsing rejects unknown fields and out-of-range values instead of
//! guessing, and every error names the file, line, column and field.
//! Loading a policy reads one file and has no other side effect: it does not
//! check that paths exist or that the kernel supports anything; the jailer
//! does that at run time and refuses the run if it cannot comply.
//!
//! Two layers: `raw` mirrors the file (serde, `deny_unknown_fields`), and
//! `validate` turns it into [`Policy`], whose parts cannot hold bad values.
//! The format is documented in `docs/policies.md`.

#![forbid(unsafe_code)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use toml::de::DeTable;

pub mod builtin;
mod error;
mod limits;
pub mod network;
mod raw;
pub mod requirement;
pub mod session;
pub mod tools;
mod types;
mod units;
mod validate;

pub use error::PolicyError;
pub use limits::{
    check as check_limits, timeout_from_secs, Bytes, Cores, LimitCeilings, RunLimits,
    TimeoutOutOfRange, CPUS_RANGE, MAX_MAX_OUTPUT, MAX_WALL_TIMEOUT, MIN_MAX_OUTPUT, MIN_MEMORY,
    MIN_TMPFS_SIZE, OPEN_FILES_RANGE, PIDS_RANGE,
};
pub use session::{ImageSettings, OutputSettings, SessionSettings};
pub use tools::ToolSettings;
pub use types::{
    namespaces, Dependencies, InstallSource, Interpreter, LandlockRules, Namespace, NetworkMode,
    Purpose, ReadOnlyMount,
};
pub use units::{format_duration, format_size, parse_duration, parse_size, UnitError};
pub use validate::is_valid_name;

use error::Diagnostic;
use validate::Completeness;

/// A validated policy: everything the jailer needs to build one sandbox.
///
/// Namespaces are not stored: every run gets all of them (see
/// [`namespaces`]). Its limits are `pycell_wire::limits::RunLimits`, the
/// one type every crate uses; what reports show of the rest is the
/// protocol's (`pycell_protocol::info`).
#[derive(Debug, Clone, PartialEq)]
pub struct Policy {
    /// `[a-z0-9][a-z0-9_-]{0,63}`; equals the file stem when loaded from NAME.toml.
    pub name: String,
    /// One line for humans and for `sandbox_info`.
    pub description: String,
    /// `purpose`: code runs and sessions, or servers over stdio only.
    pub purpose: Purpose,
    pub interpreter: Interpreter,
    pub limits: RunLimits,
    /// How far a request may raise `limits` (`[limits.max]`).
    pub ceilings: LimitCeilings,
    pub network: NetworkMode,
    /// Extra read-only bind mounts, in file order.
    pub mounts: Vec<ReadOnlyMount>,
    pub landlock: LandlockRules,
    /// Name of a seccomp profile; whether it exists is the seccomp crate's
    /// business, checked when the jail is built.
    pub seccomp_profile: String,
    /// The whole environment of the sandboxed process; nothing is inherited.
    pub env: BTreeMap<String, String>,
    /// `[dependencies]`: what runs of this policy may install.
    pub dependencies: Dependencies,
    /// `[install]`: set only in a policy whose jail builds envs.
    pub install: Option<InstallSource>,
    /// `[warm] imports`: modules a warm jail of this policy (pycelld's
    /// pool) imports before its run arrives.
    pub warm_imports: Vec<String>,
    /// `[session]`: sessions' clocks, count and transfers.
    pub session: SessionSettings,
    /// `[images]`: how large the images a result carries may be.
    pub images: ImageSettings,
    /// `[output]`: how large the displays a result carries may be.
    pub output: OutputSettings,
    /// `[tools]`: which MCP tools code may call, and how much.
    pub tools: ToolSettings,
}

impl Policy {
    /// Parses and validates policy text. `origin` is only used in error
    /// messages and, when it names a `NAME.toml` file, to check that the
    /// policy's `name` is `NAME`. Limits left out take [`RunLimits::default`].
    pub fn from_toml_str(text: &str, origin: &Path) -> Result<Policy, PolicyError> {
        parse(text, origin, Completeness::Partial)
    }

    /// Reads and parses a policy file.
    pub fn load(path: &Path) -> Result<Policy, PolicyError> {
        let text = std::fs::read_to_string(path).map_err(|error| PolicyError::Read {
            path: path.to_owned(),
            error,
        })?;
        Policy::from_toml_str(&text, path)
    }

    /// Why a run or session of this policy may not be what is asked for,
    /// if it may not: the jail that builds envs (`[install]`) takes no
    /// run of anyone's, and a server policy's jails only serve stdio
    /// (`pycell mcp-server`), so no code run or session gets its long
    /// clocks.
    pub fn purpose_problem(&self, serves_stdio: bool) -> Option<String> {
        let name = &self.name;
        if self.install.is_some() {
            return Some(format!(
                "policy {name:?} is the jail that builds dependency envs (it has an [install] section); no run or session may name it"
            ));
        }
        (self.purpose == Purpose::Server && !serves_stdio).then(|| format!(
            "policy {name:?} is for MCP servers over stdio (pycell mcp-server), not for code runs or sessions: name a policy whose purpose is code (`pycell info` lists them)"
        ))
    }

    /// The namespaces every run of this policy gets: all of them.
    pub fn namespaces(&self) -> &'static [Namespace] {
        namespaces()
    }
}

pub(crate) fn parse(
    text: &str,
    origin: &Path,
    completeness: Completeness,
) -> Result<Policy, PolicyError> {
    let file = PathBuf::from(origin);
    let doc = DeTable::parse(text)
        .map_err(|e| Diagnostic::syntax(&e, text).into_error(file.clone(), None, text))?;
    let deserializer = toml::de::Deserializer::from(doc.clone());
    let raw: raw::RawPolicy = serde_path_to_error::deserialize(deserializer)
        .map_err(|e| Diagnostic::from_serde(e).into_error(file.clone(), Some(&doc), text))?;
    validate::validate(raw, origin, completeness).map_err(|d| d.into_error(file, Some(&doc), text))
}

#[cfg(test)]
mod tests;
