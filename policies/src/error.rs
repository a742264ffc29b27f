//! Policy errors, and how they find their place in the file.
//!
//! Every error that concerns the content of a file is reported as
//! `FILE:LINE:COLUMN: FIELD.PATH: message`, where the message says what to
//! do. Syntax and type errors get their position from the TOML parser;
//! validation errors are located afterwards by looking their field path up
//! in the parsed document.

use std::fmt;
use std::ops::Range;
use std::path::PathBuf;

use toml::de::{DeTable, DeValue};
use toml::Spanned;

/// Why a policy could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    /// The file could not be read (missing, permissions, not UTF-8).
    /// The display already includes `error`; it is not chained as a source
    /// so that it is not printed twice.
    #[error("cannot read policy {}: {error}", path.display())]
    Read {
        path: PathBuf,
        error: std::io::Error,
    },

    /// The file is not valid TOML, does not fit the format, or holds a value
    /// out of range. `field` is the dotted path (`limits.memory`,
    /// `mounts[1].target`), empty for a syntax error.
    #[error("{}", display_invalid(file, *line, *column, field, message))]
    Invalid {
        file: PathBuf,
        line: usize,
        column: usize,
        field: String,
        message: String,
    },

    /// `builtin::load` was asked for a name that is not built in.
    #[error("no built-in policy named {name:?}; built-in policies: {}", available.join(", "))]
    UnknownBuiltin {
        name: String,
        available: &'static [&'static str],
    },
}

fn display_invalid(
    file: &std::path::Path,
    line: usize,
    column: usize,
    field: &str,
    message: &str,
) -> String {
    if field.is_empty() {
        format!("{}:{line}:{column}: {message}", file.display())
    } else {
        format!("{}:{line}:{column}: {field}: {message}", file.display())
    }
}

/// One step of a field path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Segment {
    Key(String),
    Index(usize),
}

/// Where a value sits in the document: `limits.memory`, `mounts[2].target`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct FieldPath(pub(crate) Vec<Segment>);

impl FieldPath {
    pub(crate) fn root() -> Self {
        FieldPath(Vec::new())
    }

    pub(crate) fn key(&self, key: &str) -> Self {
        let mut p = self.clone();
        p.0.push(Segment::Key(key.to_owned()));
        p
    }

    pub(crate) fn index(&self, index: usize) -> Self {
        let mut p = self.clone();
        p.0.push(Segment::Index(index));
        p
    }

    fn from_serde(path: &serde_path_to_error::Path) -> Self {
        use serde_path_to_error::Segment as S;
        FieldPath(
            path.iter()
                .map(|s| match s {
                    S::Seq { index } => Segment::Index(*index),
                    S::Map { key } => Segment::Key(key.clone()),
                    S::Enum { variant } => Segment::Key(variant.clone()),
                    S::Unknown => Segment::Key("?".to_owned()),
                })
                .collect(),
        )
    }
}

impl fmt::Display for FieldPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, segment) in self.0.iter().enumerate() {
            match segment {
                Segment::Key(k) if i == 0 => f.write_str(k)?,
                Segment::Key(k) => write!(f, ".{k}")?,
                Segment::Index(n) => write!(f, "[{n}]")?,
            }
        }
        Ok(())
    }
}

/// An error found in a document, before it is given a line and column.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Diagnostic {
    pub(crate) path: FieldPath,
    pub(crate) message: String,
    /// Byte range in the document, when the parser knew it.
    pub(crate) span: Option<Range<usize>>,
}

impl Diagnostic {
    pub(crate) fn at(path: FieldPath, message: impl fmt::Display) -> Self {
        Diagnostic {
            path,
            message: message.to_string(),
            span: None,
        }
    }

    /// A TOML syntax error: no field path, the parser's position.
    pub(crate) fn syntax(error: &toml::de::Error, text: &str) -> Self {
        let span = error.span();
        let mut message = error.message().to_owned();
        if message == "duplicate key" {
            if let Some(key) = span.clone().and_then(|r| text.get(r)) {
                message = format!("duplicate key {key:?}: each key may appear once per table");
            }
        }
        Diagnostic {
            path: FieldPath::root(),
            message: format!("invalid TOML: {message}"),
            span,
        }
    }

    /// An error from deserializing into the raw structs (unknown field, wrong
    /// type, missing field): the message is rewritten from serde's wording.
    pub(crate) fn from_serde(error: serde_path_to_error::Error<toml::de::Error>) -> Self {
        let mut path = FieldPath::from_serde(error.path());
        let inner = error.into_inner();
        let span = inner.span();
        let message = humanize(inner.message(), &mut path);
        Diagnostic {
            path,
            message,
            span,
        }
    }

    pub(crate) fn into_error(
        self,
        file: PathBuf,
        doc: Option<&Spanned<DeTable<'_>>>,
        text: &str,
    ) -> PolicyError {
        let span = match (self.span, doc) {
            (Some(span), _) => span,
            (None, Some(doc)) => locate(doc, &self.path),
            (None, None) => 0..0,
        };
        let (line, column) = line_column(text, span.start);
        PolicyError::Invalid {
            file,
            line,
            column,
            field: self.path.to_string(),
            message: self.message,
        }
    }
}

/// The span of the value at `path`, or of the deepest part of the path that
/// exists (a missing field is reported at its table).
pub(crate) fn locate(doc: &Spanned<DeTable<'_>>, path: &FieldPath) -> Range<usize> {
    let mut span = doc.span();
    let mut table: Option<&DeTable<'_>> = Some(doc.get_ref());
    let mut value: Option<&DeValue<'_>> = None;
    for segment in &path.0 {
        let next = match (segment, table, value) {
            (Segment::Key(k), Some(t), _) => t.get(k.as_str()),
            (Segment::Index(i), _, Some(DeValue::Array(a))) => a.get(*i),
            _ => None,
        };
        let Some(next) = next else { break };
        span = next.span();
        value = Some(next.get_ref());
        table = next.get_ref().as_table();
    }
    span
}

/// 1-based line and column (in characters) of a byte offset.
pub(crate) fn line_column(text: &str, offset: usize) -> (usize, usize) {
    let mut offset = offset.min(text.len());
    while !text.is_char_boundary(offset) {
        offset -= 1;
    }
    let before = &text[..offset];
    let line = before.matches('\n').count() + 1;
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    let column = before[line_start..].chars().count() + 1;
    (line, column)
}

/// Rewrites serde's messages (written for Rust programmers) into the policy
/// format's terms. A missing field moves into the path, so that the path
/// names the field to add.
fn humanize(message: &str, path: &mut FieldPath) -> String {
    if let Some(rest) = message.strip_prefix("unknown field ") {
        let (field, expected) = split_expected(rest);
        let mut out = format!("unknown field {field:?}; {}", expected_list(&expected));
        if field == "writable" && path.0.len() >= 2 && path.0[0] == Segment::Key("mounts".into()) {
            out.push_str(" (mounts are always read-only)");
        }
        return out;
    }
    if let Some(rest) = message.strip_prefix("unknown variant ") {
        let (value, expected) = split_expected(rest);
        return format!("unknown value {value:?}; {}", expected_list(&expected));
    }
    if let Some(rest) = message.strip_prefix("missing field ") {
        let field = rest.trim_matches('`');
        *path = path.key(field);
        return "missing required field".to_owned();
    }
    if let Some(rest) = message.strip_prefix("invalid type: ") {
        if let Some((found, expected)) = rest.split_once(", expected ") {
            return format!(
                "expected {}, found {}",
                toml_type(expected),
                toml_found(found)
            );
        }
    }
    if let Some(rest) = message.strip_prefix("invalid value: ") {
        if let Some((found, expected)) = rest.split_once(", expected ") {
            return format!(
                "expected {}, found {}",
                toml_type(expected),
                toml_found(found)
            );
        }
    }
    message.to_owned()
}

/// Splits "`x`, expected one of `a`, `b`" into ("x", ["a", "b"]).
fn split_expected(rest: &str) -> (String, Vec<String>) {
    let (head, tail) = rest.split_once(", ").unwrap_or((rest, ""));
    let name = head.trim_matches('`').to_owned();
    let expected = tail
        .split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_owned)
        .collect();
    (name, expected)
}

fn expected_list(expected: &[String]) -> String {
    if expected.is_empty() {
        "this table has no fields".to_owned()
    } else {
        format!("expected one of: {}", expected.join(", "))
    }
}

/// serde's name of an expected type → the TOML one.
fn toml_type(expected: &str) -> String {
    match expected {
        "u8" | "u16" | "u32" | "u64" | "i8" | "i16" | "i32" | "i64" | "usize" => {
            "an integer".to_owned()
        }
        "f32" | "f64" => "a number".to_owned(),
        "a sequence" => "an array".to_owned(),
        "a map" => "a table".to_owned(),
        "a boolean" => "true or false".to_owned(),
        e if e.starts_with("struct ") => "a table".to_owned(),
        e if e.starts_with("enum ") || e.starts_with("variant ") => "a string".to_owned(),
        e => e.to_owned(),
    }
}

/// serde's description of a found value → the TOML one.
fn toml_found(found: &str) -> String {
    let unquote = |s: &str| s.trim_matches('`').to_owned();
    if let Some(v) = found.strip_prefix("integer ") {
        return format!("integer {}", unquote(v));
    }
    if let Some(v) = found.strip_prefix("floating point ") {
        return format!("float {}", unquote(v));
    }
    if let Some(v) = found.strip_prefix("boolean ") {
        return format!("boolean {}", unquote(v));
    }
    match found {
        "map" => "a table".to_owned(),
        "sequence" => "an array".to_owned(),
        f => f.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn line_columns() {
        let text = "a = 1\nbé = \"x\"\n";
        assert_eq!(line_column(text, 0), (1, 1));
        assert_eq!(line_column(text, 4), (1, 5));
        assert_eq!(line_column(text, 6), (2, 1));
        // "é" is two bytes but one column.
        assert_eq!(line_column(text, 11), (2, 5));
        assert_eq!(line_column(text, 1000), (3, 1));
    }

    #[test]
    fn paths_display_like_toml_keys() {
        let p = FieldPath::root().key("mounts").index(2).key("target");
        assert_eq!(p.to_string(), "mounts[2].target");
        assert_eq!(FieldPath::root().to_string(), "");
    }

    #[test]
    fn serde_messages_are_rewritten() {
        let mut p = FieldPath::root().key("limits").key("memroy");
        assert_eq!(
            humanize(
                "unknown field `memroy`, expected `memory` or `pids`",
                &mut p
            ),
            "unknown field \"memroy\"; expected one of: memory, pids"
        );
        assert_eq!(
            humanize("unknown field `x`, expected one of `a`, `b`, `c`", &mut p),
            "unknown field \"x\"; expected one of: a, b, c"
        );
        assert_eq!(
            humanize("unknown field `x`, there are no fields", &mut p),
            "unknown field \"x\"; this table has no fields"
        );
        let mut p = FieldPath::root().key("limits");
        assert_eq!(
            humanize("missing field `memory`", &mut p),
            "missing required field"
        );
        assert_eq!(p.to_string(), "limits.memory");
        let mut p = FieldPath::root();
        assert_eq!(
            humanize("invalid type: string \"a\", expected u32", &mut p),
            "expected an integer, found string \"a\""
        );
        assert_eq!(
            humanize(
                "invalid type: integer `3`, expected struct RawLimits",
                &mut p
            ),
            "expected a table, found integer 3"
        );
        assert_eq!(
            humanize("invalid type: map, expected a sequence", &mut p),
            "expected an array, found a table"
        );
        assert_eq!(humanize("something else", &mut p), "something else");
    }
}
