//! Which tools code may call: the client's `allowTools` per server and
//! the policy's `[tools] allow` (`SERVER/TOOL` globs), both of which must
//! let a call through. A glob has `*` (any run of characters) and `?` (any
//! one character); anything else matches itself.

use std::fmt;

/// The longest glob.
pub const MAX_PATTERN: usize = 256;

/// One glob.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pattern(String);

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PatternError {
    #[error("an empty pattern matches nothing; leave it out, or use \"*\" for everything")]
    Empty,
    #[error("{0:?} is longer than {MAX_PATTERN} characters")]
    TooLong(String),
    #[error("{0:?} has a control character")]
    Control(String),
}

impl Pattern {
    pub fn new(text: &str) -> Result<Pattern, PatternError> {
        if text.is_empty() {
            return Err(PatternError::Empty);
        }
        if text.len() > MAX_PATTERN {
            return Err(PatternError::TooLong(text.chars().take(40).collect()));
        }
        if text.chars().any(char::is_control) {
            return Err(PatternError::Control(text.to_string()));
        }
        Ok(Pattern(text.to_string()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Whether `name` matches (at most the product of the two lengths in
    /// steps, with one backtrack point; patterns are at most 256 bytes).
    pub fn matches(&self, name: &str) -> bool {
        glob_match(self.0.as_bytes(), name.as_bytes())
    }
}

impl fmt::Display for Pattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Glob matching with one backtrack point (the last `*`).
fn glob_match(p: &[u8], s: &[u8]) -> bool {
    let (mut pi, mut si) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while si < s.len() {
        match p.get(pi) {
            Some(b'*') => {
                star = Some((pi, si));
                pi += 1;
            }
            Some(&c) if c == b'?' || c == s[si] => {
                pi += 1;
                si += 1;
            }
            _ => match star {
                Some((sp, ss)) => {
                    pi = sp + 1;
                    si = ss + 1;
                    star = Some((sp, ss + 1));
                }
                None => return false,
            },
        }
    }
    p[pi..].iter().all(|&c| c == b'*')
}

/// A policy's `SERVER/TOOL` rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    pub server: Pattern,
    pub tool: Pattern,
}

impl Rule {
    /// `SERVER/TOOL`, each side a glob (`time/*`, `*/get_*`).
    pub fn parse(text: &str) -> Result<Rule, RuleError> {
        let (server, tool) = text
            .split_once('/')
            .ok_or_else(|| RuleError::NotServerTool(text.to_string()))?;
        Ok(Rule {
            server: Pattern::new(server)?,
            tool: Pattern::new(tool)?,
        })
    }

    fn allows(&self, server: &str, tool: &str) -> bool {
        self.server.matches(server) && self.tool.matches(tool)
    }
}

/// Why a `[tools] allow` rule is not one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RuleError {
    #[error("{0:?} is not SERVER/TOOL (globs, such as \"time/*\")")]
    NotServerTool(String),
    #[error(transparent)]
    Pattern(#[from] PatternError),
}

/// Why a call may not be made.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Denied {
    #[error("the policy allows no tool calls ([tools] allow = [])")]
    NoneAllowed,
    #[error("the policy's [tools] allow lets no rule match {server}/{tool}")]
    Policy { server: String, tool: String },
    #[error("the tool servers file's allowTools for {server} does not list {tool}")]
    Client { server: String, tool: String },
}

/// Decide a call: the policy's rules first (an operator's policy wins),
/// then the client's `allowTools` for that server (None: all).
pub fn decide(
    policy: &[Rule],
    client: Option<&[Pattern]>,
    server: &str,
    tool: &str,
) -> Result<(), Denied> {
    if policy.is_empty() {
        return Err(Denied::NoneAllowed);
    }
    if !policy.iter().any(|r| r.allows(server, tool)) {
        return Err(Denied::Policy {
            server: server.to_string(),
            tool: tool.to_string(),
        });
    }
    match client {
        Some(list) if !list.iter().any(|p| p.matches(tool)) => Err(Denied::Client {
            server: server.to_string(),
            tool: tool.to_string(),
        }),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> Pattern {
        Pattern::new(s).unwrap()
    }

    #[test]
    fn globs_match_as_shells_do_for_one_name() {
        for (pat, name, want) in [
            ("*", "anything", true),
            ("*", "", true),
            ("get_*", "get_time", true),
            ("get_*", "set_time", false),
            ("*_time", "convert_time", true),
            ("g?t", "get", true),
            ("g?t", "gt", false),
            ("a*b*c", "axxbyyc", true),
            ("a*b*c", "axxbyy", false),
            ("exact", "exact", true),
            ("exact", "exactly", false),
        ] {
            assert_eq!(p(pat).matches(name), want, "{pat} ~ {name}");
        }
    }

    #[test]
    fn a_hostile_glob_takes_little_time() {
        let pat = p(&"a*".repeat(100));
        let name = "a".repeat(10_000) + "b";
        let t = std::time::Instant::now();
        assert!(!Pattern::new(&(pat.as_str().to_string() + "c"))
            .unwrap()
            .matches(&name));
        assert!(t.elapsed() < std::time::Duration::from_secs(1));
    }

    #[test]
    fn bad_patterns_are_refused() {
        assert_eq!(Pattern::new(""), Err(PatternError::Empty));
        assert!(matches!(
            Pattern::new(&"x".repeat(300)),
            Err(PatternError::TooLong(_))
        ));
        assert!(matches!(
            Pattern::new("a\nb"),
            Err(PatternError::Control(_))
        ));
        let e = Rule::parse("time").unwrap_err();
        assert_eq!(e, RuleError::NotServerTool("time".into()));
        assert!(e.to_string().contains("SERVER/TOOL"), "{e}");
        assert_eq!(
            Rule::parse("time/"),
            Err(RuleError::Pattern(PatternError::Empty))
        );
    }

    #[test]
    fn the_policy_and_the_client_must_both_allow_a_call() {
        let all = [Rule::parse("*/*").unwrap()];
        let time_only = [Rule::parse("time/*").unwrap()];
        let get = [p("get_*")];
        assert_eq!(decide(&all, None, "time", "get_time"), Ok(()));
        assert_eq!(
            decide(&[], None, "time", "get_time"),
            Err(Denied::NoneAllowed)
        );
        assert!(matches!(
            decide(&time_only, None, "files", "read"),
            Err(Denied::Policy { .. })
        ));
        assert_eq!(decide(&time_only, Some(&get), "time", "get_time"), Ok(()));
        let e = decide(&all, Some(&get), "time", "convert_time").unwrap_err();
        assert_eq!(
            e.to_string(),
            "the tool servers file's allowTools for time does not list convert_time"
        );
        // The client cannot widen what the policy allows.
        let wide = [p("*")];
        assert!(decide(&time_only, Some(&wide), "files", "read").is_err());
    }
}
