//! PEP 723 inline script metadata: the `# /// script` block of a script,
//! whose TOML names `dependencies` and `requires-python`.
//!
//! ```text
//! # /// script
//! # requires-python = ">=3.11"
//! # dependencies = ["six", "requests<3"]
//! # ///
//! ```
//!
//! A block is a `# /// script` line, then comment lines (`#` alone or
//! followed by a space), up to the last `# ///` line before the first line
//! that is not such a comment. Errors carry the line number in the script.

use pycell_policy::requirement::{Requirement, MAX_REQUIREMENTS};

/// What a script's metadata asks for.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ScriptMetadata {
    pub dependencies: Vec<Requirement>,
    pub requires_python: Option<String>,
}

/// A problem in the metadata block: the script's line (1-based) and what.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetadataError {
    pub line: usize,
    pub message: String,
}

impl std::fmt::Display for MetadataError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "line {}: {}", self.line, self.message)
    }
}

fn err(line: usize, message: impl Into<String>) -> MetadataError {
    MetadataError {
        line,
        message: message.into(),
    }
}

/// The block: the 1-based line of `# /// script` and its content lines
/// (the `# ` or `#` prefix removed).
struct Block<'a> {
    start: usize,
    lines: Vec<&'a str>,
}

fn is_comment(line: &str) -> bool {
    line == "#" || line.starts_with("# ")
}

fn find_block(code: &str) -> Result<Option<Block<'_>>, MetadataError> {
    let lines: Vec<&str> = code.lines().map(|l| l.trim_end_matches('\r')).collect();
    let mut found: Option<Block> = None;
    let mut i = 0;
    while i < lines.len() {
        let Some(kind) = lines[i].strip_prefix("# /// ") else {
            i += 1;
            continue;
        };
        let start = i + 1;
        let run = lines[i + 1..].iter().take_while(|l| is_comment(l)).count();
        let close = lines[i + 1..i + 1 + run]
            .iter()
            .rposition(|l| *l == "# ///");
        let Some(close) = close else {
            return Err(err(
                start,
                format!("the `# /// {kind}` block is not closed by a `# ///` line"),
            ));
        };
        if kind == "script" {
            if found.is_some() {
                return Err(err(
                    start,
                    "a second `# /// script` block (PEP 723 allows one)",
                ));
            }
            let content = lines[i + 1..i + 1 + close]
                .iter()
                .map(|l| l.strip_prefix("# ").unwrap_or(&l[1..]))
                .collect();
            found = Some(Block {
                start,
                lines: content,
            });
        }
        i += close + 2;
    }
    Ok(found)
}

impl Block<'_> {
    /// The script line of a byte offset into the joined content.
    fn line_at(&self, text: &str, offset: usize) -> usize {
        self.start + 1 + text[..offset.min(text.len())].matches('\n').count()
    }

    /// The script line that first mentions `needle`, else the block's.
    fn line_of(&self, needle: &str) -> usize {
        self.lines
            .iter()
            .position(|l| l.contains(needle))
            .map_or(self.start, |i| self.start + 1 + i)
    }
}

/// Most bytes of a `# /// script` block's content (TOML that names at
/// most 64 requirements of at most 256 bytes each fits many times over).
pub const MAX_BLOCK_BYTES: usize = 64 * 1024;

/// The metadata of `code`, if it has a `# /// script` block.
pub fn parse(code: &str) -> Result<Option<ScriptMetadata>, MetadataError> {
    let Some(block) = find_block(code)? else {
        return Ok(None);
    };
    let size: usize = block.lines.iter().map(|l| l.len() + 1).sum();
    if size > MAX_BLOCK_BYTES {
        return Err(err(
            block.start,
            format!("the `# /// script` block has {size} bytes; at most {MAX_BLOCK_BYTES} are read (it may name at most {MAX_REQUIREMENTS} requirements)"),
        ));
    }
    let text = block.lines.join("\n");
    let table: toml::Table = toml::from_str(&text).map_err(|e| {
        let line = e
            .span()
            .map_or(block.start, |s| block.line_at(&text, s.start));
        err(
            line,
            format!("script metadata is not valid TOML: {}", e.message()),
        )
    })?;
    let mut meta = ScriptMetadata::default();
    for (key, value) in &table {
        let line = block.line_of(key);
        match (key.as_str(), value) {
            ("dependencies", toml::Value::Array(items)) => {
                if items.len() > MAX_REQUIREMENTS {
                    return Err(err(
                        line,
                        format!(
                            "dependencies: {} entries; at most {MAX_REQUIREMENTS} are allowed",
                            items.len()
                        ),
                    ));
                }
                for item in items {
                    let toml::Value::String(s) = item else {
                        return Err(err(line, "dependencies: every entry must be a string"));
                    };
                    let r = Requirement::parse(s)
                        .map_err(|m| err(block.line_of(s), format!("dependencies: {m}")))?;
                    meta.dependencies.push(r);
                }
            }
            ("requires-python", toml::Value::String(s)) => {
                check_requires_python(s).map_err(|m| err(line, m.to_string()))?;
                meta.requires_python = Some(s.trim_matches(' ').to_string());
            }
            ("tool", toml::Value::Table(_)) => {}
            ("dependencies" | "requires-python" | "tool", _) => {
                return Err(err(
                    line,
                    format!("{key}: wrong type (dependencies is a list of strings, requires-python a string, tool a table)"),
                ))
            }
            _ => {
                return Err(err(
                    line,
                    format!("unknown key {key:?} (PEP 723 script metadata has dependencies, requires-python and [tool])"),
                ))
            }
        }
    }
    Ok(Some(meta))
}

/// A `requires-python` that is not a version specifier.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("requires-python = {0:?} is not a version specifier (e.g. \">=3.11\")")]
pub struct BadRequiresPython(pub String);

/// `requires-python`: comma-separated `OP VERSION` clauses (PEP 440),
/// spaces allowed around them and nothing else: no other whitespace, no
/// option, no marker.
pub fn check_requires_python(spec: &str) -> Result<(), BadRequiresPython> {
    let ok = spec.len() <= crate::MAX_REQUIRES_PYTHON_LEN
        && spec.split(',').all(|clause| {
            let clause = clause.trim_matches(' ');
            OPERATORS.iter().any(|op| {
                clause
                    .strip_prefix(op)
                    .is_some_and(|v| is_version(v.trim_start_matches(' '), op))
            })
        });
    match ok {
        true => Ok(()),
        false => Err(BadRequiresPython(spec.to_string())),
    }
}

/// Longest first: `<=` before `<`.
const OPERATORS: [&str; 8] = ["===", "~=", "==", "!=", "<=", ">=", "<", ">"];

/// A PEP 440 release version as `requires-python` names one: `N(.N)*`,
/// then optionally a pre-release (`a1`, `b2`, `rc1`), `.postN`, `.devN`,
/// or (after `==` and `!=` only) a trailing `.*`.
fn is_version(v: &str, op: &str) -> bool {
    let (v, wildcard) = match v.strip_suffix(".*") {
        Some(v) => (v, true),
        None => (v, false),
    };
    if wildcard && !matches!(op, "==" | "!=") {
        return false;
    }
    let mut release_end = v
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(v.len());
    if release_end < v.len() && v[..release_end].ends_with('.') {
        release_end -= 1; // the dot of `.post` or `.dev`
    }
    let (release, suffix) = v.split_at(release_end);
    let release_ok = !release.is_empty()
        && release
            .split('.')
            .all(|n| !n.is_empty() && n.len() <= 9 && n.bytes().all(|b| b.is_ascii_digit()));
    release_ok && (suffix.is_empty() || (!wildcard && is_version_suffix(suffix)))
}

/// A pre-release (`a1`, `b2`, `rc1`), then `.postN`, then `.devN`, each
/// optional.
fn is_version_suffix(mut s: &str) -> bool {
    for group in [&["a", "b", "rc"][..], &[".post"], &[".dev"]] {
        if let Some(rest) = group.iter().find_map(|t| s.strip_prefix(t)) {
            let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
            if !(1..=9).contains(&digits) {
                return false;
            }
            s = &rest[digits..];
        }
    }
    s.is_empty()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn deps(code: &str) -> Vec<String> {
        parse(code)
            .unwrap()
            .unwrap()
            .dependencies
            .iter()
            .map(|r| r.to_string())
            .collect()
    }

    #[test]
    fn a_block_over_its_size_is_refused_before_it_is_parsed() {
        let names: String = (0..100_000).map(|i| format!("#   \"pkg{i}\",\n")).collect();
        let code = format!("# /// script\n# dependencies = [\n{names}# ]\n# ///\n");
        let e = parse(&code).unwrap_err();
        assert_eq!(e.line, 1, "{e}");
        assert!(e.message.contains("at most 65536 are read"), "{e}");
    }

    #[test]
    fn a_script_block_gives_dependencies_and_requires_python() {
        let code = "#!/usr/bin/env python3\n# /// script\n# requires-python = \">=3.11\"\n# dependencies = [\n#   \"Six\",\n#   \"requests<3\",\n# ]\n# ///\nimport six\n";
        let m = parse(code).unwrap().unwrap();
        assert_eq!(m.requires_python.as_deref(), Some(">=3.11"));
        assert_eq!(deps(code), ["six", "requests<3"]);
    }

    #[test]
    fn no_block_or_another_kind_is_no_metadata() {
        assert_eq!(parse("print(1)\n# a comment\n").unwrap(), None);
        assert_eq!(parse("# /// other\n# x = 1\n# ///\n").unwrap(), None);
    }

    #[test]
    fn the_block_ends_at_its_last_closing_line() {
        let code = "# /// script\n# dependencies = [\"six\"]\n# ///\n# a comment\nprint(1)\n";
        assert_eq!(deps(code), ["six"]);
    }

    #[test]
    fn errors_name_the_script_line() {
        let e = parse("x = 1\n# /// script\n# dependencies = [\"six\"\n").unwrap_err();
        assert_eq!(e.line, 2, "{e}");
        assert!(e.message.contains("not closed"), "{e}");
        let e = parse("\n\n# /// script\n# dependencies = [\n#   \"six\",\n#   \"pandas >> 2\",\n# ]\n# ///\n")
            .unwrap_err();
        assert_eq!(e.line, 6, "{e}");
        assert!(e.message.contains("not a version"), "{e}");
        let e = parse("# /// script\n# dependencies = [\"six\"\n# ///\n").unwrap_err();
        assert!(e.message.contains("not valid TOML"), "{e}");
        assert!((2..=3).contains(&e.line), "{e}");
        let e = parse("# /// script\n# depndencies = []\n# ///\n").unwrap_err();
        assert_eq!(
            (e.line, e.message.contains("unknown key")),
            (2, true),
            "{e}"
        );
        for good in [
            ">=3.11",
            ">=3.8, <4",
            "==3.11.*",
            "~=3.11",
            " >= 3.11 ",
            ">=3.13.0rc1",
            "!=3.12.0.post1",
        ] {
            assert_eq!(check_requires_python(good), Ok(()), "{good}");
        }
        for bad in [
            ">=3 --index-url x",
            ">=3.11\n",
            ">=3.11\t",
            ">=3.11; python_version > '3'",
            ">=3.*",
            "3.11",
            ">=",
            ">=3..1",
            ">=3.11,",
            ">=3.11a1b2",
            ">=3.11 or 4",
            "python>=3.11",
        ] {
            assert!(check_requires_python(bad).is_err(), "{bad:?}");
        }
        let e =
            parse("# /// script\n# requires-python = \">=3 --index-url x\"\n# ///\n").unwrap_err();
        assert!(e.message.contains("requires-python"), "{e}");
        let e = parse("# /// script\n# requires-python = \"3.11\"\n# ///\n").unwrap_err();
        assert!(e.message.contains("requires-python"), "{e}");
        let e = parse("# /// script\n# ///\nx = 1\n# /// script\n# ///\n").unwrap_err();
        assert_eq!(e.line, 4, "{e}");
    }
}
