//! The size and count bounds of a run's input, checked before any work
//! that grows with it: by pycelld's broker as soon as a request is
//! decoded, by the root monitor again on the order it is sent (these
//! checks are linear and allocate nothing), and by the launch path of
//! embedded runs. Each check looks at lengths only; what the fields mean
//! is checked later, on input known to be small.

use crate::messages::{InputFile, RunRequest, MAX_CODE_BYTES, MAX_INPUT_FILES};

/// Most arguments a program may get.
pub const MAX_ARGS: usize = 1024;
/// Longest argument (the kernel's own limit, MAX_ARG_STRLEN).
pub const MAX_ARG_BYTES: usize = 128 * 1024;
/// Most bytes of all arguments together (half of the kernel's usual
/// ARG_MAX, leaving room for the environment).
pub const MAX_ARGS_BYTES: usize = 1024 * 1024;
/// Longest script file name, policy name and input file name.
pub const MAX_NAME_BYTES: usize = 255;
/// Longest granted path (the kernel's PATH_MAX).
pub const MAX_PATH_BYTES: usize = 4096;
/// Most variables a request adds, and their bytes together.
pub const MAX_VARIABLES: usize = 64;
pub const MAX_VARIABLES_BYTES: usize = 256 * 1024;
/// Most egress rules a request names, and the longest.
pub const MAX_ALLOW_RULES: usize = 64;
pub const MAX_RULE_BYTES: usize = 512;

/// Longest identity a front end may name (a token's name, an OAuth
/// issuer and subject).
pub const MAX_IDENTITY_BYTES: usize = 256;

/// A field over its bound: which, and by how much.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {problem}")]
pub struct OutOfBounds {
    pub field: &'static str,
    pub problem: String,
}

fn out(field: &'static str, problem: String) -> OutOfBounds {
    OutOfBounds { field, problem }
}

/// Base64 characters that encode at most `bytes` bytes.
const fn base64_len(bytes: usize) -> usize {
    bytes.div_ceil(3) * 4
}

/// The program's text.
pub fn check_code(code: &str) -> Result<(), OutOfBounds> {
    match code.len() > MAX_CODE_BYTES {
        true => Err(out(
            "code",
            format!(
                "{} bytes is more than the {} MiB allowed",
                code.len(),
                MAX_CODE_BYTES >> 20
            ),
        )),
        false => Ok(()),
    }
}

/// The script's file name, if it has one.
pub fn check_filename(name: Option<&str>) -> Result<(), OutOfBounds> {
    match name {
        Some(n) if n.len() > MAX_NAME_BYTES => Err(out(
            "filename",
            format!(
                "{} bytes; a file name has at most {MAX_NAME_BYTES}",
                n.len()
            ),
        )),
        _ => Ok(()),
    }
}

/// The program's arguments: how many, how long, no NUL.
pub fn check_args(args: &[String]) -> Result<(), OutOfBounds> {
    if args.len() > MAX_ARGS {
        return Err(out(
            "args",
            format!("{} arguments; at most {MAX_ARGS}", args.len()),
        ));
    }
    let mut total = 0;
    for (i, a) in args.iter().enumerate() {
        if a.len() > MAX_ARG_BYTES {
            return Err(out(
                "args",
                format!("argument {i} is {} bytes; at most {MAX_ARG_BYTES}", a.len()),
            ));
        }
        if a.contains('\0') {
            return Err(out("args", format!("argument {i} contains a NUL byte")));
        }
        total += a.len();
    }
    match total > MAX_ARGS_BYTES {
        true => Err(out(
            "args",
            format!("{total} bytes together; at most {MAX_ARGS_BYTES}"),
        )),
        false => Ok(()),
    }
}

/// A path a session call names: at most [`MAX_PATH_BYTES`], no NUL.
pub fn check_session_path(path: &str) -> Result<(), OutOfBounds> {
    if path.len() > MAX_PATH_BYTES {
        let n = path.len();
        return Err(out(
            "path",
            format!("{n} bytes; a path has at most {MAX_PATH_BYTES}"),
        ));
    }
    match path.contains('\0') {
        true => Err(out("path", "contains a NUL byte".into())),
        false => Ok(()),
    }
}

/// How many bytes padded base64 `text` decodes to (None: its length is
/// not a multiple of 4, so it is not padded base64), from its length alone.
pub fn base64_decoded_len(text: &str) -> Option<u64> {
    let len = text.len() as u64;
    if !len.is_multiple_of(4) {
        return None;
    }
    let padding = text.bytes().rev().take(2).filter(|b| *b == b'=').count() as u64;
    Some(len / 4 * 3 - padding.min(len / 4 * 3))
}

/// The program's stdin, as base64.
pub fn check_stdin(stdin_base64: Option<&str>) -> Result<(), OutOfBounds> {
    match stdin_base64 {
        Some(s) if s.len() > base64_len(MAX_CODE_BYTES) => Err(out(
            "stdin",
            format!("more than the {} MiB allowed", MAX_CODE_BYTES >> 20),
        )),
        _ => Ok(()),
    }
}

/// A request's variables: how many, how many bytes.
pub fn check_variables<'a>(
    vars: impl ExactSizeIterator<Item = (&'a String, &'a String)>,
) -> Result<(), OutOfBounds> {
    if vars.len() > MAX_VARIABLES {
        let n = vars.len();
        return Err(out(
            "env",
            format!("{n} variables; at most {MAX_VARIABLES}"),
        ));
    }
    let total: usize = vars.map(|(k, v)| k.len() + v.len()).sum();
    match total > MAX_VARIABLES_BYTES {
        true => Err(out(
            "env",
            format!("{total} bytes together; at most {MAX_VARIABLES_BYTES}"),
        )),
        false => Ok(()),
    }
}

/// An identity a front end names in its `hello`: 1 to
/// [`MAX_IDENTITY_BYTES`] printable ASCII characters without spaces (it
/// goes into log lines and error messages as it is).
pub fn check_identity(identity: &str) -> Result<(), OutOfBounds> {
    if identity.is_empty() || identity.len() > MAX_IDENTITY_BYTES {
        let n = identity.len();
        return Err(out(
            "identity",
            format!("{n} bytes; 1 to {MAX_IDENTITY_BYTES}"),
        ));
    }
    match identity.bytes().all(|b| b.is_ascii_graphic()) {
        true => Ok(()),
        false => Err(out(
            "identity",
            "printable ASCII without spaces only".to_string(),
        )),
    }
}

/// A request's egress rules: how many, how long.
pub fn check_allow(rules: &[String]) -> Result<(), OutOfBounds> {
    if rules.len() > MAX_ALLOW_RULES {
        let n = rules.len();
        return Err(out(
            "allow",
            format!("{n} rules; at most {MAX_ALLOW_RULES}"),
        ));
    }
    match rules.iter().find(|r| r.len() > MAX_RULE_BYTES) {
        Some(r) => Err(out(
            "allow",
            format!("a rule of {} bytes; at most {MAX_RULE_BYTES}", r.len()),
        )),
        None => Ok(()),
    }
}

/// A request's grants: how many, how long their paths.
pub fn check_grants(grants: &[crate::messages::PathGrant]) -> Result<(), OutOfBounds> {
    let most = pycell_wire::spec::MAX_GRANTS;
    if grants.len() > most {
        let n = grants.len();
        return Err(out("grants", format!("{n} paths; at most {most}")));
    }
    match grants
        .iter()
        .find(|g| g.target.as_os_str().len() > MAX_PATH_BYTES)
    {
        Some(_) => Err(out("grants", format!("a path over {MAX_PATH_BYTES} bytes"))),
        None => Ok(()),
    }
}

/// Input files: how many, their names' and contents' sizes.
pub fn check_files(files: &[InputFile]) -> Result<(), OutOfBounds> {
    if files.len() > MAX_INPUT_FILES {
        return Err(out(
            "files",
            format!("{} files; at most {MAX_INPUT_FILES}", files.len()),
        ));
    }
    if let Some(f) = files.iter().find(|f| f.name.len() > MAX_NAME_BYTES) {
        return Err(out(
            "files",
            format!("a name of {} bytes; at most {MAX_NAME_BYTES}", f.name.len()),
        ));
    }
    let encoded: usize = files.iter().map(|f| f.data_base64.len()).sum();
    match encoded > base64_len(MAX_CODE_BYTES) {
        true => Err(out(
            "files",
            format!(
                "more than the {} MiB allowed together",
                MAX_CODE_BYTES >> 20
            ),
        )),
        false => Ok(()),
    }
}

impl RunRequest {
    /// Every size and count bound of the request, in time linear in its
    /// number of fields (the tool catalog's are `Catalog::check`'s, the
    /// dependencies' `requirement::parse_list`'s, each checked first).
    pub fn check_bounds(&self) -> Result<(), OutOfBounds> {
        check_code(&self.code)?;
        check_filename(self.filename.as_deref())?;
        check_args(&self.args)?;
        check_stdin(self.stdin_base64.as_deref())?;
        check_files(&self.files)?;
        check_variables(self.env.iter())?;
        check_allow(&self.allow)?;
        check_grants(&self.grants)?;
        match &self.policy {
            Some(p) if p.len() > MAX_NAME_BYTES => Err(out(
                "policy",
                format!(
                    "{} bytes; a policy name has at most {MAX_NAME_BYTES}",
                    p.len()
                ),
            )),
            _ => Ok(()),
        }
    }
}

/// Cut `text` to at most `chars` characters, its head and tail kept
/// around a line that says how many were cut (as the runner cuts);
/// whether it was cut.
pub fn cut_middle(text: &mut String, chars: usize) -> bool {
    let total = text.chars().count();
    if total <= chars {
        return false;
    }
    let mark = format!("\n[... {} characters cut ...]\n", total - chars);
    let half = chars.saturating_sub(mark.chars().count()) / 2;
    let head: String = text.chars().take(half).collect();
    let tail: String = text.chars().skip(total - half).collect();
    *text = format!("{head}{mark}{tail}");
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_part_keeps_its_head_and_tail_within_the_characters() {
        let mut s = format!("{}{}", "a".repeat(500), "é".repeat(500));
        assert!(cut_middle(&mut s, 300));
        assert!(s.chars().count() <= 300, "{}", s.chars().count());
        assert!(s.starts_with("aaa") && s.ends_with("ééé"), "{s}");
        assert!(s.contains("[... 700 characters cut ...]"), "{s}");
        let mut short = "abc".to_string();
        assert!(!cut_middle(&mut short, 3));
        assert_eq!(short, "abc");
    }

    fn req() -> RunRequest {
        RunRequest {
            code: "print(1)".into(),
            ..Default::default()
        }
    }

    #[test]
    fn each_field_over_its_bound_is_named() {
        let mut cases: Vec<(RunRequest, &str)> = Vec::new();
        let mut r = req();
        r.code = "x".repeat(MAX_CODE_BYTES + 1);
        cases.push((r, "code"));
        let mut r = req();
        r.filename = Some("a".repeat(256));
        cases.push((r, "filename"));
        let mut r = req();
        r.args = vec!["a".into(); MAX_ARGS + 1];
        cases.push((r, "args"));
        let mut r = req();
        r.args = vec!["a".repeat(MAX_ARG_BYTES + 1)];
        cases.push((r, "args"));
        let mut r = req();
        r.args = vec!["a".repeat(MAX_ARG_BYTES); 9];
        cases.push((r, "args"));
        let mut r = req();
        r.args = vec!["a\0b".into()];
        cases.push((r, "args"));
        let mut r = req();
        r.stdin_base64 = Some("A".repeat(base64_len(MAX_CODE_BYTES) + 4));
        cases.push((r, "stdin"));
        let file = |name: &str, data: usize| InputFile {
            name: name.into(),
            data_base64: "A".repeat(data),
        };
        let mut r = req();
        r.files = vec![file("a", 0); MAX_INPUT_FILES + 1];
        cases.push((r, "files"));
        let mut r = req();
        r.files = vec![file(&"a".repeat(256), 0)];
        cases.push((r, "files"));
        let mut r = req();
        r.files = vec![file("a", base64_len(MAX_CODE_BYTES)), file("b", 4)];
        cases.push((r, "files"));
        let mut r = req();
        r.policy = Some("p".repeat(256));
        cases.push((r, "policy"));
        for (r, field) in cases {
            assert_eq!(r.check_bounds().unwrap_err().field, field);
        }
        let mut at_bounds = req();
        at_bounds.args = vec!["a".repeat(MAX_ARG_BYTES); 8];
        at_bounds.files = vec![file("a", base64_len(MAX_CODE_BYTES))];
        at_bounds.stdin_base64 = Some("A".repeat(base64_len(MAX_CODE_BYTES)));
        assert_eq!(at_bounds.check_bounds(), Ok(()));
    }

    #[test]
    fn padded_base64_is_measured_from_its_length_and_session_paths_are_bounded() {
        assert_eq!(base64_decoded_len(""), Some(0));
        assert_eq!(base64_decoded_len("QUFB"), Some(3));
        assert_eq!(base64_decoded_len("QUE="), Some(2));
        assert_eq!(base64_decoded_len("QQ=="), Some(1));
        assert_eq!(base64_decoded_len("QUFBQ"), None);
        assert!(check_session_path(&"a".repeat(MAX_PATH_BYTES)).is_ok());
        assert!(check_session_path(&"a".repeat(MAX_PATH_BYTES + 1)).is_err());
        assert!(check_session_path("a\0b").is_err());
    }
}
