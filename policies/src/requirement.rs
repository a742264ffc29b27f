//! Package requirements as runs and policies name them: a PEP 508 subset
//! that is checked here, before anything reaches uv. A name, optional
//! extras, optional version specifiers and an optional environment marker:
//! `pandas>=2.2`, `requests[socks]==2.32.3`, `tomli; python_version < "3.11"`.
//!
//! Refused outright: direct references (`name @ https://...`: pycell
//! installs from its configured index only) and anything that starts with
//! `-` (pip options such as `--extra-index-url` or `-e`).

use std::fmt;

/// Longest requirement accepted, in bytes.
pub const MAX_REQUIREMENT_LEN: usize = 256;
/// Most requirements one run may name.
pub const MAX_REQUIREMENTS: usize = 64;

/// A checked requirement.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Requirement {
    /// PEP 503 normalized: lowercase, runs of `-_.` as one `-`.
    pub name: String,
    /// The text after the name and extras (specifiers and marker), with
    /// whitespace removed outside the marker.
    pub rest: String,
    /// Sorted, normalized extras.
    pub extras: Vec<String>,
}

impl fmt::Display for Requirement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name)?;
        if !self.extras.is_empty() {
            write!(f, "[{}]", self.extras.join(","))?;
        }
        f.write_str(&self.rest)
    }
}

impl serde::Serialize for Requirement {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// PEP 503 normalization of a project name.
pub fn normalize_name(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    let mut sep = false;
    for c in name.chars() {
        if matches!(c, '-' | '_' | '.') {
            sep = true;
            continue;
        }
        if sep && !out.is_empty() {
            out.push('-');
        }
        sep = false;
        out.push(c.to_ascii_lowercase());
    }
    out
}

fn is_name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')
}

/// Why a requirement was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RequirementError {
    #[error("an empty requirement")]
    Empty,
    /// Holds the requirement's first 40 characters.
    #[error("longer than {MAX_REQUIREMENT_LEN} bytes: {0:?}...")]
    TooLong(String),
    #[error("{0:?}: options are not requirements; pycell installs from its configured package index only")]
    Option(String),
    #[error("{0:?} does not start with a package name (letters, digits, -, _ or .)")]
    NoName(String),
    #[error("{0:?}: direct references (name @ URL) are not allowed; pycell installs wheels from its configured package index only")]
    DirectReference(String),
    /// A part of the requirement (its extras, a specifier, its marker).
    #[error("{requirement:?}: {problem}")]
    Part {
        requirement: String,
        problem: PartError,
    },
    #[error("{0} requirements; at most {MAX_REQUIREMENTS} are allowed")]
    TooMany(usize),
}

/// What is wrong with a part of a requirement.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PartError {
    #[error(
        "{0:?} is not a version specifier (use ==, !=, >=, <=, >, <, ~= or ===, e.g. \">=2.2\")"
    )]
    NotASpecifier(String),
    #[error("{clause:?}: {version:?} is not a version")]
    NotAVersion { clause: String, version: String },
    #[error("{0:?}: a wildcard is allowed only as a trailing .* after == or !=")]
    Wildcard(String),
    #[error("{0:?} is not an environment marker (e.g. python_version < \"3.12\")")]
    NotAMarker(String),
    #[error("an extras list `[` is not closed by `]`")]
    UnclosedExtras,
    #[error("{0:?} is not an extra's name")]
    NotAnExtra(String),
}

const OPERATORS: [&str; 8] = ["===", "~=", "==", "!=", "<=", ">=", "<", ">"];

/// One `OP VERSION` clause, whitespace already removed.
fn check_clause(clause: &str) -> Result<(), PartError> {
    let op = OPERATORS
        .iter()
        .find(|op| clause.starts_with(**op))
        .ok_or_else(|| PartError::NotASpecifier(clause.to_string()))?;
    let version = &clause[op.len()..];
    let ok_chars = version
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '*' | '+' | '!' | '-' | '_'));
    if version.is_empty() || !ok_chars {
        return Err(PartError::NotAVersion {
            clause: clause.to_string(),
            version: version.to_string(),
        });
    }
    if version.contains('*') && !(matches!(*op, "==" | "!=") && version.ends_with(".*")) {
        return Err(PartError::Wildcard(clause.to_string()));
    }
    Ok(())
}

fn check_specifiers(spec: &str) -> Result<String, PartError> {
    let compact: String = spec.chars().filter(|c| !c.is_whitespace()).collect();
    let inner = compact
        .strip_prefix('(')
        .and_then(|s| s.strip_suffix(')'))
        .unwrap_or(&compact);
    if inner.is_empty() {
        return Ok(String::new());
    }
    for clause in inner.split(',') {
        check_clause(clause)?;
    }
    Ok(inner.to_string())
}

fn check_marker(marker: &str) -> Result<String, PartError> {
    let marker = marker.trim();
    let ok = !marker.is_empty()
        && marker.chars().all(|c| c.is_ascii_graphic() || c == ' ')
        && marker.chars().filter(|c| *c == '(').count()
            == marker.chars().filter(|c| *c == ')').count();
    if !ok {
        return Err(PartError::NotAMarker(marker.to_string()));
    }
    Ok(marker.to_string())
}

fn split_extras(rest: &str) -> Result<(Vec<String>, &str), PartError> {
    let Some(inner) = rest.strip_prefix('[') else {
        return Ok((Vec::new(), rest));
    };
    let end = inner.find(']').ok_or(PartError::UnclosedExtras)?;
    let mut extras = Vec::new();
    for extra in inner[..end].split(',').map(str::trim) {
        if extra.is_empty() || !extra.chars().all(is_name_char) {
            return Err(PartError::NotAnExtra(extra.to_string()));
        }
        extras.push(normalize_name(extra));
    }
    extras.sort();
    extras.dedup();
    Ok((extras, inner[end + 1..].trim_start()))
}

impl Requirement {
    /// Parse and check one requirement.
    pub fn parse(text: &str) -> Result<Requirement, RequirementError> {
        let text = text.trim();
        if text.is_empty() {
            return Err(RequirementError::Empty);
        }
        if text.len() > MAX_REQUIREMENT_LEN {
            let start = text.chars().take(40).collect();
            return Err(RequirementError::TooLong(start));
        }
        if text.starts_with('-') {
            return Err(RequirementError::Option(text.to_string()));
        }
        let name_end = text.find(|c: char| !is_name_char(c)).unwrap_or(text.len());
        let name = &text[..name_end];
        let valid_name = name
            .chars()
            .next()
            .zip(name.chars().last())
            .is_some_and(|(a, z)| a.is_ascii_alphanumeric() && z.is_ascii_alphanumeric());
        if !valid_name {
            return Err(RequirementError::NoName(text.to_string()));
        }
        let part = |problem| RequirementError::Part {
            requirement: text.to_string(),
            problem,
        };
        let (extras, rest) = split_extras(text[name_end..].trim_start()).map_err(part)?;
        let (spec, marker) = match rest.split_once(';') {
            Some((s, m)) => (s, Some(m)),
            None => (rest, None),
        };
        if spec.trim_start().starts_with('@') {
            return Err(RequirementError::DirectReference(text.to_string()));
        }
        let mut rest = check_specifiers(spec).map_err(part)?;
        if let Some(m) = marker {
            let m = check_marker(m).map_err(part)?;
            rest.push_str("; ");
            rest.push_str(&m);
        }
        Ok(Requirement {
            name: normalize_name(name),
            rest,
            extras,
        })
    }
}

/// Check a list (at most [`MAX_REQUIREMENTS`]), keeping order; errors name
/// the entry's index.
pub fn parse_list(items: &[String]) -> Result<Vec<Requirement>, (usize, RequirementError)> {
    if items.len() > MAX_REQUIREMENTS {
        return Err((MAX_REQUIREMENTS, RequirementError::TooMany(items.len())));
    }
    items
        .iter()
        .enumerate()
        .map(|(i, t)| Requirement::parse(t).map_err(|m| (i, m)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(t: &str) -> String {
        Requirement::parse(t)
            .unwrap_or_else(|e| panic!("{t}: {e}"))
            .to_string()
    }

    #[test]
    fn requirements_are_normalized() {
        assert_eq!(ok("Pandas >= 2.2, <3"), "pandas>=2.2,<3");
        assert_eq!(ok("zope.Interface"), "zope-interface");
        assert_eq!(
            ok("requests[socks, Security]==2.32.3"),
            "requests[security,socks]==2.32.3"
        );
        assert_eq!(ok("numpy (>=1.26)"), "numpy>=1.26");
        assert_eq!(
            ok("tomli; python_version < \"3.11\""),
            "tomli; python_version < \"3.11\""
        );
        assert_eq!(ok("six==1.*"), "six==1.*");
    }

    #[test]
    fn bad_requirements_say_why() {
        for (text, needle) in [
            ("", "empty"),
            (
                "--extra-index-url https://example.net",
                "options are not requirements",
            ),
            ("-e .", "options"),
            ("pkg @ https://example.net/pkg.whl", "direct references"),
            ("pandas >> 2", "not a version"),
            ("pandas ^2", "not a version specifier"),
            ("pandas>=", "not a version"),
            ("pandas>=2.*", "wildcard"),
            ("_bad", "package name"),
            ("x[a", "not closed"),
            ("x; ", "environment marker"),
        ] {
            let e = Requirement::parse(text).unwrap_err().to_string();
            assert!(e.contains(needle), "{text:?}: {e}");
        }
        let long = "a".repeat(MAX_REQUIREMENT_LEN + 1);
        assert!(Requirement::parse(&long)
            .unwrap_err()
            .to_string()
            .contains("longer than"));
    }

    #[test]
    fn lists_name_the_bad_entry_and_are_bounded() {
        let list = vec!["six".to_string(), "six >> 1".to_string()];
        assert_eq!(parse_list(&list).unwrap_err().0, 1);
        let many = vec!["six".to_string(); MAX_REQUIREMENTS + 1];
        let (index, e) = parse_list(&many).unwrap_err();
        assert_eq!(
            (index, e),
            (MAX_REQUIREMENTS, RequirementError::TooMany(65))
        );
        assert!(RequirementError::TooMany(65)
            .to_string()
            .contains("at most"));
    }
}
