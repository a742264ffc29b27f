//! The embedded profiles and the structural rules every profile must follow.
//!
//! A profile is a JSON document in seccompiler's format: a map from filter
//! name to filter. pycell gives the names a meaning that seccompiler does not
//! have (seccompiler allows one match action per filter, so denials with
//! their own errno need filters of their own):
//!
//! - `main` is the allowlist: `match_action` is `allow`, `mismatch_action` an
//!   errno. Anything it does not list fails with that errno.
//! - every other filter is a *deny layer*: `mismatch_action` is `allow`
//!   ("not my business, ask the next layer") and `match_action` is the errno
//!   returned for the calls it lists.
//!
//! Deny layers run first (in name order), `main` last; see `generate.rs`.
//!
//! Shared with build.rs (`#[path]`), which validates every profile before
//! compiling it, so a profile that breaks these rules fails the build.

use std::collections::BTreeMap;

use seccompiler::{SeccompAction, SeccompCmpArgLen, SeccompCmpOp};
use serde::Deserialize;

use crate::SeccompError;

/// Name of the allowlist filter inside a profile.
pub(crate) const MAIN_FILTER: &str = "main";

/// The profiles shipped in the binary: name and JSON text. build.rs compiles
/// each of them (`profiles/NAME.json`) to a program per architecture.
pub(crate) const PROFILES: &[(&str, &str)] =
    &[("default", include_str!("../profiles/default.json"))];

/// Names of the profiles in [`PROFILES`], in the same order.
const PROFILE_NAMES: &[&str] = &["default"];

pub(crate) fn names() -> &'static [&'static str] {
    PROFILE_NAMES
}

pub(crate) fn source(name: &str) -> Option<&'static str> {
    PROFILES
        .iter()
        .find(|(profile, _)| *profile == name)
        .map(|(_, text)| *text)
}

/// Looks a profile up by name, or says which names exist.
pub(crate) fn lookup(name: &str) -> Result<(&'static str, &'static str), SeccompError> {
    PROFILES
        .iter()
        .find(|(profile, _)| *profile == name)
        .copied()
        .ok_or_else(|| SeccompError::UnknownProfile {
            name: name.to_owned(),
            known: PROFILE_NAMES,
        })
}

/// One filter of a profile, as written (field names as seccompiler reads them).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Filter<'a> {
    pub(crate) mismatch_action: SeccompAction,
    pub(crate) match_action: SeccompAction,
    #[serde(borrow, rename = "filter")]
    pub(crate) rules: Vec<Rule<'a>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Rule<'a> {
    #[serde(borrow)]
    pub(crate) syscall: &'a str,
    #[serde(default)]
    pub(crate) args: Option<Vec<Condition>>,
    #[serde(default)]
    pub(crate) comment: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Condition {
    pub(crate) index: u8,
    #[serde(rename = "type")]
    pub(crate) arg_len: SeccompCmpArgLen,
    pub(crate) op: SeccompCmpOp,
    pub(crate) val: u64,
    #[serde(default)]
    pub(crate) comment: Option<String>,
}

impl Condition {
    /// A dword comparison only sees the low 32 bits of the argument; a wider
    /// value or mask would be cut silently and compare against something else.
    fn dword_overflows(&self) -> bool {
        let wide = |v: u64| v > u64::from(u32::MAX);
        matches!(self.arg_len, SeccompCmpArgLen::Dword)
            && (wide(self.val) || matches!(self.op, SeccompCmpOp::MaskedEq(mask) if wide(mask)))
    }
}

/// A parsed and validated profile.
#[derive(Debug)]
pub(crate) struct Profile<'a> {
    pub(crate) filters: BTreeMap<&'a str, Filter<'a>>,
}

impl<'a> Profile<'a> {
    /// Parses `text` and checks the rules listed in the module docs, plus:
    /// every rule and condition has a non-empty comment, and no filter lists
    /// a syscall both with and without conditions (seccompiler would silently
    /// drop the unconditional rule).
    pub(crate) fn parse(name: &str, text: &'a str) -> Result<Self, SeccompError> {
        let filters: BTreeMap<&'a str, Filter<'a>> =
            serde_json::from_str(text).map_err(|source| SeccompError::Parse {
                profile: name.to_owned(),
                source,
            })?;
        let checked = check_main(&filters).and_then(|()| {
            filters
                .iter()
                .try_for_each(|(filter_name, filter)| check_filter(filter_name, filter))
        });
        checked.map_err(|reason| SeccompError::InvalidProfile {
            profile: name.to_owned(),
            reason,
        })?;
        Ok(Profile { filters })
    }

    /// The errno a filter returns when one of its rules matches (deny layers)
    /// or when none does (`main`).
    pub(crate) fn errno_of(filter_name: &str, filter: &Filter<'_>) -> Option<u32> {
        let action = if filter_name == MAIN_FILTER {
            &filter.mismatch_action
        } else {
            &filter.match_action
        };
        match action {
            SeccompAction::Errno(errno) => Some(*errno),
            _ => None,
        }
    }

    /// Deny layers in evaluation order, followed by `main`.
    // Used by build.rs (`generate.rs`) and the tests, not by the library.
    #[cfg_attr(not(test), allow(dead_code))]
    pub(crate) fn layer_names(&self) -> Vec<&'a str> {
        let mut names: Vec<&'a str> = self
            .filters
            .keys()
            .copied()
            .filter(|name| *name != MAIN_FILTER)
            .collect();
        names.push(MAIN_FILTER);
        names
    }
}

/// Which rule of this crate a profile breaks (see `docs/seccomp.md`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProfileProblem {
    #[error("it has no \"{MAIN_FILTER}\" filter (the allowlist)")]
    NoMain,
    #[error("filter \"{MAIN_FILTER}\" must have match_action \"allow\" (it is the allowlist)")]
    MainDoesNotAllow,
    #[error("filter \"{MAIN_FILTER}\" must have an errno as mismatch_action; unlisted syscalls are never allowed")]
    MainWithoutErrno,
    #[error(
        "deny filter \"{0}\" must have mismatch_action \"allow\" and an errno as match_action"
    )]
    DenyLayer(String),
    #[error("filter \"{filter}\", rule {position} ({syscall}) {problem}")]
    Rule {
        filter: String,
        position: usize,
        syscall: String,
        problem: RuleProblem,
    },
    #[error("syscall number {0} is listed both with and without \"args\" in one filter (under two names); seccompiler would drop the unconditional rule")]
    MixedByNumber(i64),
}

/// What is wrong with one rule.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RuleProblem {
    #[error("has no comment; every rule says why it is there")]
    NoComment,
    #[error("has an empty \"args\" list; omit \"args\" to match every call")]
    EmptyArgs,
    #[error(
        "has a condition on argument {0} without a comment; name the constant it compares with"
    )]
    UncommentedCondition(u8),
    #[error("compares argument {0} as a dword with a value or mask wider than 32 bits, which seccompiler would truncate")]
    WideDword(u8),
    #[error("mixes rules with and without \"args\" for the same syscall; seccompiler would drop the unconditional one")]
    MixedArgs,
}

/// `main` exists and is an allowlist: matches allow, the rest gets an errno.
fn check_main(filters: &BTreeMap<&str, Filter<'_>>) -> Result<(), ProfileProblem> {
    let main = filters.get(MAIN_FILTER).ok_or(ProfileProblem::NoMain)?;
    if main.match_action != SeccompAction::Allow {
        return Err(ProfileProblem::MainDoesNotAllow);
    }
    if !matches!(main.mismatch_action, SeccompAction::Errno(_)) {
        return Err(ProfileProblem::MainWithoutErrno);
    }
    Ok(())
}

/// A deny layer's actions, and every rule of any filter.
fn check_filter(filter_name: &str, filter: &Filter<'_>) -> Result<(), ProfileProblem> {
    let is_deny_layer = filter_name != MAIN_FILTER;
    if is_deny_layer
        && (filter.mismatch_action != SeccompAction::Allow
            || !matches!(filter.match_action, SeccompAction::Errno(_)))
    {
        return Err(ProfileProblem::DenyLayer(filter_name.to_string()));
    }
    let mut unconditional = BTreeMap::new();
    for (position, rule) in filter.rules.iter().enumerate() {
        let at = |problem| ProfileProblem::Rule {
            filter: filter_name.to_string(),
            position,
            syscall: rule.syscall.to_string(),
            problem,
        };
        check_rule(rule).map_err(at)?;
        let seen = unconditional
            .entry(rule.syscall)
            .or_insert(rule.args.is_none());
        if *seen != rule.args.is_none() {
            return Err(at(RuleProblem::MixedArgs));
        }
    }
    Ok(())
}

/// One rule: a comment, and commented conditions seccompiler can express.
fn check_rule(rule: &Rule<'_>) -> Result<(), RuleProblem> {
    if rule.comment.as_deref().is_none_or(|c| c.trim().is_empty()) {
        return Err(RuleProblem::NoComment);
    }
    let Some(args) = &rule.args else {
        return Ok(());
    };
    if args.is_empty() {
        return Err(RuleProblem::EmptyArgs);
    }
    if let Some(cond) = args
        .iter()
        .find(|c| c.comment.as_deref().is_none_or(|c| c.trim().is_empty()))
    {
        return Err(RuleProblem::UncommentedCondition(cond.index));
    }
    if let Some(cond) = args.iter().find(|c| c.dword_overflows()) {
        return Err(RuleProblem::WideDword(cond.index));
    }
    Ok(())
}
