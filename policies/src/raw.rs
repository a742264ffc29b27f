//! The first layer: the file's shape, exactly as written. Unknown fields are
//! rejected here; values are checked in `validate`.
//!
//! Integers are read as i64 (TOML's integer) so that an out-of-range number
//! gets the range message from validation rather than a type error.

use std::collections::BTreeMap;
use std::fmt;

use serde::de::{self, Deserializer, Visitor};
use serde::Deserialize;

use crate::types::{Namespace, Purpose};
use crate::units::{parse_duration, parse_size, UnitError};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawPolicy {
    pub(crate) name: String,
    pub(crate) description: String,
    pub(crate) purpose: Option<Purpose>,
    pub(crate) namespaces: Vec<Namespace>,
    pub(crate) interpreter: RawInterpreter,
    pub(crate) limits: Option<RawLimits>,
    pub(crate) network: Option<RawNetwork>,
    pub(crate) mounts: Option<Vec<RawMount>>,
    pub(crate) landlock: Option<RawLandlock>,
    pub(crate) seccomp: Option<RawSeccomp>,
    pub(crate) env: Option<BTreeMap<String, String>>,
    pub(crate) dependencies: Option<RawDependencies>,
    pub(crate) install: Option<RawInstall>,
    pub(crate) warm: Option<RawWarm>,
    pub(crate) session: Option<RawSession>,
    pub(crate) images: Option<RawImages>,
    pub(crate) output: Option<RawOutput>,
    pub(crate) tools: Option<RawTools>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawSession {
    pub(crate) idle_timeout: Option<Quantity>,
    pub(crate) lifetime: Option<Quantity>,
    pub(crate) per_uid: Option<i64>,
    pub(crate) max_file: Option<Quantity>,
    pub(crate) pause_when_idle: Option<bool>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawTools {
    pub(crate) allow: Option<Vec<String>>,
    pub(crate) max_calls: Option<i64>,
    pub(crate) max_concurrent: Option<i64>,
    pub(crate) call_timeout: Option<Quantity>,
    pub(crate) max_result: Option<Quantity>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawImages {
    pub(crate) max_edge: Option<i64>,
    pub(crate) max_bytes: Option<Quantity>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawOutput {
    pub(crate) part_chars: Option<i64>,
    pub(crate) display_bytes: Option<Quantity>,
    pub(crate) displays: Option<i64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawWarm {
    pub(crate) imports: Option<Vec<String>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawDependencies {
    pub(crate) allow: Option<bool>,
    pub(crate) packages: Option<Vec<String>>,
    pub(crate) install_policy: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawInstall {
    pub(crate) index_url: Option<String>,
    pub(crate) find_links: Option<Vec<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawInterpreter {
    pub(crate) python: Option<String>,
    pub(crate) venv: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawLimits {
    pub(crate) wall_timeout: Option<Quantity>,
    pub(crate) cpu_time: Option<Quantity>,
    pub(crate) memory: Option<Quantity>,
    pub(crate) pids: Option<i64>,
    pub(crate) cpus: Option<f64>,
    pub(crate) open_files: Option<i64>,
    pub(crate) file_size: Option<Quantity>,
    pub(crate) disk: Option<Quantity>,
    /// Replaced by `disk`; kept only to say so.
    pub(crate) workspace_size: Option<Quantity>,
    /// Replaced by `disk`; kept only to say so.
    pub(crate) tmp_size: Option<Quantity>,
    pub(crate) max_output: Option<Quantity>,
    pub(crate) inotify_instances: Option<i64>,
    pub(crate) inotify_watches: Option<i64>,
    /// `[limits.max]`: how far a request may raise each limit.
    pub(crate) max: Option<RawCeilings>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawCeilings {
    pub(crate) wall_timeout: Option<Quantity>,
    pub(crate) memory: Option<Quantity>,
    pub(crate) pids: Option<i64>,
    pub(crate) disk: Option<Quantity>,
    pub(crate) max_output: Option<Quantity>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawNetwork {
    pub(crate) mode: RawNetworkMode,
    pub(crate) allow: Option<Vec<String>>,
    pub(crate) deny: Option<Vec<String>>,
    pub(crate) max_connections: Option<i64>,
    pub(crate) max_bytes: Option<Quantity>,
    pub(crate) connect_timeout: Option<Quantity>,
}

/// A hand-written Deserialize so that an unknown mode gets a message that
/// lists the known ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RawNetworkMode {
    None,
    Allowlist,
}

impl<'de> Deserialize<'de> for RawNetworkMode {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct ModeVisitor;
        impl Visitor<'_> for ModeVisitor {
            type Value = RawNetworkMode;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<RawNetworkMode, E> {
                match v {
                    "none" => Ok(RawNetworkMode::None),
                    "allowlist" => Ok(RawNetworkMode::Allowlist),
                    other => Err(E::custom(format!(
                        "unknown network mode {other:?}: use \"none\" (no network) or \"allowlist\" (egress to the hosts in `allow`, through pycell's proxy)"
                    ))),
                }
            }
        }
        deserializer.deserialize_str(ModeVisitor)
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawMount {
    pub(crate) source: String,
    pub(crate) target: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawLandlock {
    pub(crate) min_abi: Option<i64>,
    pub(crate) read_exec: Option<Vec<String>>,
    pub(crate) read_only: Option<Vec<String>>,
    pub(crate) read_write: Option<Vec<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawSeccomp {
    pub(crate) profile: String,
}

/// A size or a duration as written: an integer (bytes or seconds) or a
/// string with a unit. Parsed in `validate`, where the field is known.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Quantity {
    Integer(i64),
    Text(String),
}

impl<'de> Deserialize<'de> for Quantity {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct QuantityVisitor;
        impl Visitor<'_> for QuantityVisitor {
            type Value = Quantity;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an integer or a string with a unit, such as \"30s\" or \"64MiB\"")
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Quantity, E> {
                Ok(Quantity::Integer(v))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Quantity, E> {
                i64::try_from(v)
                    .map(Quantity::Integer)
                    .map_err(|_| E::custom(format!("{v} is too large")))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Quantity, E> {
                Ok(Quantity::Text(v.to_owned()))
            }
        }
        deserializer.deserialize_any(QuantityVisitor)
    }
}

/// A duration as written: whole seconds, or text with a unit.
pub(crate) fn duration(q: Quantity) -> Result<std::time::Duration, UnitError> {
    match q {
        Quantity::Integer(n) => u64::try_from(n)
            .map(std::time::Duration::from_secs)
            .map_err(|_| UnitError::NegativeDuration(n)),
        Quantity::Text(s) => parse_duration(&s),
    }
}

/// A size in [`crate::Bytes`].
pub(crate) fn bytes(q: Quantity) -> Result<crate::Bytes, UnitError> {
    size(q).map(crate::Bytes)
}

pub(crate) fn size(q: Quantity) -> Result<u64, UnitError> {
    match q {
        Quantity::Integer(n) => u64::try_from(n).map_err(|_| UnitError::NegativeSize(n)),
        Quantity::Text(s) => parse_size(&s),
    }
}
