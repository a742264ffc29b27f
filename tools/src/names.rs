//! Python names for servers and tools: `pycell_tools.<server>.<tool>`.

/// The longest server name.
pub const MAX_SERVER_NAME: usize = 64;

const KEYWORDS: &[&str] = &[
    "False", "None", "True", "and", "as", "assert", "async", "await", "break", "class", "continue",
    "def", "del", "elif", "else", "except", "finally", "for", "from", "global", "if", "import",
    "in", "is", "lambda", "nonlocal", "not", "or", "pass", "raise", "return", "try", "while",
    "with", "yield",
];

/// A valid Python identifier for `name`: each character that may not be
/// in one becomes `_`, a leading digit gets `_` before it, and a keyword
/// (or a name of the module's own) gets `_` after it.
pub fn python_name(name: &str) -> String {
    let mut out: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect();
    if out.is_empty() || out.starts_with(|c: char| c.is_ascii_digit()) {
        out.insert(0, '_');
    }
    if KEYWORDS.contains(&out.as_str()) || crate::frames::MODULE_NAMES.contains(&out.as_str()) {
        out.push('_');
    }
    out
}

/// Why a server's name is not one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ServerNameError {
    #[error("a server's name must have 1 to {MAX_SERVER_NAME} characters")]
    Length,
    #[error("{0:?}: a server's name may have letters, digits, '_', '-' and '.' only")]
    Characters(String),
}

/// A server name must be short, printable and without `/` (which
/// separates it from a tool in the policy's rules).
pub fn check_server_name(name: &str) -> Result<(), ServerNameError> {
    if name.is_empty() || name.len() > MAX_SERVER_NAME {
        return Err(ServerNameError::Length);
    }
    if !name
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
    {
        return Err(ServerNameError::Characters(name.to_string()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_become_identifiers() {
        assert_eq!(python_name("get_time"), "get_time");
        assert_eq!(python_name("get-time.v2"), "get_time_v2");
        assert_eq!(python_name("2fa"), "_2fa");
        assert_eq!(python_name("import"), "import_");
        assert_eq!(python_name("call"), "call_");
        assert_eq!(python_name(""), "_");
        assert_eq!(python_name("héllo"), "h_llo");
    }

    #[test]
    fn server_names_are_checked() {
        assert!(check_server_name("mcp-server-time").is_ok());
        assert_eq!(
            check_server_name("a/b"),
            Err(ServerNameError::Characters("a/b".into()))
        );
        assert_eq!(check_server_name(""), Err(ServerNameError::Length));
        assert_eq!(
            check_server_name(&"x".repeat(65)),
            Err(ServerNameError::Length)
        );
    }
}
