//! `[tools]`: which MCP tools of its client's servers a run's code may
//! call through `pycell_tools` (code mode), and how much. The client's
//! own file (`allowTools`) can only narrow this further.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::error::{Diagnostic, FieldPath};
use crate::raw::RawTools;
use crate::session::{within_duration, within_int, within_size};

/// A policy's tool-call settings.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolSettings {
    /// `SERVER/TOOL` globs (`time/*`, `*/get_*`); empty: no tool calls.
    pub allow: Vec<String>,
    /// Calls one run (or one session) may make.
    pub max_calls: u32,
    /// Calls in flight at once.
    pub max_concurrent: u32,
    /// How long one call may take before it fails.
    pub call_timeout: Duration,
    /// The largest result one call may bring back, in bytes.
    pub max_result: u64,
}

impl Default for ToolSettings {
    fn default() -> ToolSettings {
        ToolSettings {
            allow: vec!["*/*".to_string()],
            max_calls: 1000,
            max_concurrent: 8,
            call_timeout: Duration::from_secs(30),
            max_result: 1 << 20,
        }
    }
}

const MAX_RULES: usize = 256;
const CALLS_RANGE: (i64, i64) = (1, 100_000);
const CONCURRENT_RANGE: (i64, i64) = (1, 64);
const TIMEOUT_RANGE: (Duration, Duration) = (Duration::from_secs(1), Duration::from_secs(600));
const RESULT_RANGE: (u64, u64) = (1 << 10, 8 << 20);

/// `[tools]`, each field left out taking its default.
pub(crate) fn check_tools(
    raw: Option<RawTools>,
    path: &FieldPath,
) -> Result<ToolSettings, Diagnostic> {
    let raw = raw.unwrap_or_default();
    let mut t = ToolSettings::default();
    if let Some(allow) = raw.allow {
        t.allow = check_rules(allow, &path.key("allow"))?;
    }
    if let Some(n) = raw.max_calls {
        t.max_calls = within_int(n, CALLS_RANGE, &path.key("max_calls"))?;
    }
    if let Some(n) = raw.max_concurrent {
        t.max_concurrent = within_int(n, CONCURRENT_RANGE, &path.key("max_concurrent"))?;
    }
    if let Some(q) = raw.call_timeout {
        t.call_timeout = within_duration(q, TIMEOUT_RANGE, &path.key("call_timeout"))?;
    }
    if let Some(q) = raw.max_result {
        t.max_result = within_size(q, RESULT_RANGE, &path.key("max_result"))?;
    }
    Ok(t)
}

fn check_rules(rules: Vec<String>, at: &FieldPath) -> Result<Vec<String>, Diagnostic> {
    if rules.len() > MAX_RULES {
        return Err(Diagnostic::at(
            at.clone(),
            format!("{} rules, more than the {MAX_RULES} allowed", rules.len()),
        ));
    }
    for (i, rule) in rules.iter().enumerate() {
        pycell_tools::allow::Rule::parse(rule).map_err(|e| Diagnostic::at(at.index(i), e))?;
    }
    Ok(rules)
}
