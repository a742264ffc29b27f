//! Who calls `pycell mcp --http`, and what each caller may do: the
//! identity a bearer token or an OAuth access token proves, its scopes and
//! its quotas. Pure data and parsing; no I/O but reading the files named.
//!
//! The tokens file (`--tokens`) holds only SHA-256 hashes of tokens, so a
//! leaked file grants nothing:
//!
//! ```toml
//! [[token]]
//! name = "ci-bot"                 # the identity: in pycelld's queue and audit log
//! sha256 = "9f86d081884c7d65..."  # of the token; `pycell mcp-token ci-bot` makes one
//! scopes = ["pycell:run"]         # default; add "pycell:tools" for code mode
//! max_concurrent_runs = 2         # default 4
//! runs_per_minute = 30            # default 60
//! policies = ["default", "data-science"]  # default: ["default"] only
//! ```
//!
//! A caller may name only its policies in `run_python` and `session_start`
//! (an OAuth access token: `default` and each `pycell:policy:NAME` scope
//! it carries): a token cannot pick a policy with longer clocks or more
//! reach than its owner was given (`mcp-server`'s 24 h, `network`'s
//! egress).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::Deserialize;
use sha2::{Digest, Sha256};

/// Scope to run code: run_python, sessions and their files.
pub const SCOPE_RUN: &str = "pycell:run";
/// Scope for a run's code to call the tool servers this front end offers
/// (code mode); without it, runs get no tools.
pub const SCOPE_TOOLS: &str = "pycell:tools";
/// Every scope, as the protected resource metadata lists them.
pub const SCOPES: [&str; 2] = [SCOPE_RUN, SCOPE_TOOLS];
/// An OAuth scope `pycell:policy:NAME` lets its caller name policy NAME.
pub const POLICY_SCOPE_PREFIX: &str = "pycell:policy:";
/// What a caller may name when its token says nothing.
pub const DEFAULT_POLICIES: [&str; 1] = ["default"];

/// The policies of a token that names `listed` (None: the default).
pub fn policies_allowed(listed: Option<&[String]>) -> Arc<[String]> {
    match listed {
        Some(l) => l.iter().cloned().collect(),
        None => DEFAULT_POLICIES.iter().map(|p| p.to_string()).collect(),
    }
}

/// What a caller's token grants.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Scopes {
    pub run: bool,
    pub tools: bool,
}

impl Scopes {
    /// From scope names; unknown ones are ignored (an issuer may put
    /// others' scopes in the same token).
    pub fn from_names<'a>(names: impl IntoIterator<Item = &'a str>) -> Scopes {
        let mut s = Scopes::default();
        for n in names {
            match n {
                SCOPE_RUN => s.run = true,
                SCOPE_TOOLS => s.tools = true,
                _ => {}
            }
        }
        s
    }
}

/// A caller's limits, enforced by this front end (pycelld's per-identity
/// admission queues and shares slots on top).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Quotas {
    /// Calls that run code going at once.
    #[serde(default = "default_concurrent")]
    pub max_concurrent_runs: u32,
    /// Calls that run code in any minute (a bucket refilled evenly).
    #[serde(default = "default_per_minute")]
    pub runs_per_minute: u32,
}

fn default_concurrent() -> u32 {
    4
}

fn default_per_minute() -> u32 {
    60
}

impl Default for Quotas {
    fn default() -> Quotas {
        Quotas {
            max_concurrent_runs: default_concurrent(),
            runs_per_minute: default_per_minute(),
        }
    }
}

impl Quotas {
    pub fn problem(&self) -> Option<&'static str> {
        match (self.max_concurrent_runs, self.runs_per_minute) {
            (0, _) => Some("max_concurrent_runs must be at least 1"),
            (_, 0) => Some("runs_per_minute must be at least 1"),
            (c, _) if c > 1024 => Some("max_concurrent_runs is at most 1024"),
            (_, r) if r > 60_000 => Some("runs_per_minute is at most 60000"),
            _ => None,
        }
    }
}

/// An authenticated caller: what it may do here (scopes, quotas), and
/// the run service's caller it is (its identity and policies).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    pub scopes: Scopes,
    pub quotas: Quotas,
    /// It, as the run service speaks for it.
    pub speaks_as: Arc<pycell_engine::service::Caller>,
}

impl Caller {
    /// `identity` (a token's name, or `oauth:` and the token's subject)
    /// with its scopes, quotas and the policies it may name.
    pub fn new(identity: &str, scopes: Scopes, quotas: Quotas, policies: Arc<[String]>) -> Caller {
        Caller {
            speaks_as: Arc::new(pycell_engine::service::Caller {
                identity: Arc::from(identity),
                tools: scopes.tools,
                policies,
                grant_hint: format!("the operator grants more with `policies` in the tokens file or {POLICY_SCOPE_PREFIX}NAME scopes").into(),
            }),
            scopes,
            quotas,
        }
    }

    /// Its name for pycelld.
    pub fn identity(&self) -> &Arc<str> {
        &self.speaks_as.identity
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TokensFile {
    #[serde(default)]
    token: Vec<TokenEntry>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TokenEntry {
    name: String,
    sha256: String,
    #[serde(default)]
    scopes: Option<Vec<String>>,
    // Not a flattened Quotas: serde cannot deny unknown fields through one.
    #[serde(default = "default_concurrent")]
    max_concurrent_runs: u32,
    #[serde(default = "default_per_minute")]
    runs_per_minute: u32,
    #[serde(default)]
    policies: Option<Vec<String>>,
}

/// The bearer tokens, by the SHA-256 of each.
#[derive(Debug, Default)]
pub struct TokenTable {
    by_hash: HashMap<[u8; 32], Arc<Caller>>,
}

/// Why a tokens file cannot be served.
#[derive(Debug, thiserror::Error)]
pub enum TokensError {
    #[error("{}: cannot read: {error}", path.display())]
    Read {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("{}: {error}", path.display())]
    In {
        path: PathBuf,
        error: Box<TokensError>,
    },
    #[error("{0}")]
    Toml(#[from] toml::de::Error),
    /// Entry `index` (from 1), named `name`, is wrong.
    #[error("token {index} ({name:?}): {problem}")]
    Token {
        index: usize,
        name: String,
        problem: TokenProblem,
    },
}

/// What is wrong with one token of the file.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TokenProblem {
    #[error("{0}")]
    Name(#[from] BadTokenName),
    #[error("sha256 {0:?}: not 64 hexadecimal digits (the SHA-256 of the token, as `pycell mcp-token` prints it)")]
    Hash(String),
    #[error("{0}")]
    Quotas(&'static str),
    #[error("unknown scope {0:?}; the scopes are {scopes}", scopes = SCOPES.join(", "))]
    Scope(String),
    #[error("policies: {0:?} is not a policy name")]
    Policy(String),
    #[error("another token has the same name; names are identities and must differ")]
    SameName,
    #[error("the same sha256 as an earlier token")]
    SameHash,
}

impl TokenTable {
    pub fn load(path: &Path) -> Result<TokenTable, TokensError> {
        let at = || path.to_path_buf();
        let text = std::fs::read_to_string(path)
            .map_err(|error| TokensError::Read { path: at(), error })?;
        TokenTable::parse(&text).map_err(|e| TokensError::In {
            path: at(),
            error: Box::new(e),
        })
    }

    pub fn parse(text: &str) -> Result<TokenTable, TokensError> {
        let file: TokensFile = toml::from_str(text)?;
        let mut table = TokenTable::default();
        for (i, t) in file.token.into_iter().enumerate() {
            let name = t.name.clone();
            let at = |problem| TokensError::Token {
                index: i + 1,
                name: name.clone(),
                problem,
            };
            let (hash, caller) = entry(t).map_err(at)?;
            if table
                .by_hash
                .values()
                .any(|c| c.identity() == caller.identity())
            {
                return Err(at(TokenProblem::SameName));
            }
            if table.by_hash.insert(hash, Arc::new(caller)).is_some() {
                return Err(at(TokenProblem::SameHash));
            }
        }
        Ok(table)
    }

    pub fn len(&self) -> usize {
        self.by_hash.len()
    }

    /// The caller whose token this is.
    pub fn caller(&self, token: &str) -> Option<Arc<Caller>> {
        self.by_hash.get(&token_hash(token)).cloned()
    }
}

fn entry(t: TokenEntry) -> Result<([u8; 32], Caller), TokenProblem> {
    check_name(&t.name)?;
    let hash = parse_hash(&t.sha256).ok_or_else(|| TokenProblem::Hash(t.sha256.clone()))?;
    let quotas = Quotas {
        max_concurrent_runs: t.max_concurrent_runs,
        runs_per_minute: t.runs_per_minute,
    };
    if let Some(p) = quotas.problem() {
        return Err(TokenProblem::Quotas(p));
    }
    let scopes = match &t.scopes {
        None => Scopes {
            run: true,
            tools: false,
        },
        Some(names) => {
            if let Some(n) = names.iter().find(|n| !SCOPES.contains(&n.as_str())) {
                return Err(TokenProblem::Scope(n.clone()));
            }
            Scopes::from_names(names.iter().map(String::as_str))
        }
    };
    if let Some(bad) = t
        .policies
        .iter()
        .flatten()
        .find(|p| !pycell_policy::is_valid_name(p))
    {
        return Err(TokenProblem::Policy(bad.clone()));
    }
    let caller = Caller::new(
        &t.name,
        scopes,
        quotas,
        policies_allowed(t.policies.as_deref()),
    );
    Ok((hash, caller))
}

/// A token name that is not 1 to 64 of `A-Z a-z 0-9 . _ -`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("name {0:?}: 1 to 64 letters, digits, '.', '_' or '-'")]
pub struct BadTokenName(pub String);

/// A token's name: 1 to 64 of `A-Z a-z 0-9 . _ -` (no `:`, which OAuth
/// identities have).
pub fn check_name(name: &str) -> Result<(), BadTokenName> {
    let ok = (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
    ok.then_some(())
        .ok_or_else(|| BadTokenName(name.to_string()))
}

/// 64 hexadecimal digits, as bytes.
fn parse_hash(hex: &str) -> Option<[u8; 32]> {
    if hex.len() != 64 || !hex.is_ascii() {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(out)
}

pub fn token_hash(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

/// A hash as the tokens file writes it.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {

    #[test]
    fn a_token_names_its_policies_else_it_has_only_default() {
        let line = |extra: &str| {
            format!(
                "[[token]]\nname = \"t\"\nsha256 = \"{}\"\n{extra}",
                "ab".repeat(32)
            )
        };
        let only = |extra: &str| {
            let t = TokenTable::parse(&line(extra)).unwrap();
            let c = t.by_hash.values().next().unwrap().clone();
            c
        };
        let c = only("");
        assert!(c.speaks_as.may_use("default").is_ok());
        let e = c.speaks_as.may_use("mcp-server").unwrap_err().to_string();
        assert!(
            e.contains("\"mcp-server\" is not one this caller may use (it may use: default)"),
            "{e}"
        );
        let c = only("policies = [\"data-science\"]\n");
        assert!(c.speaks_as.may_use("data-science").is_ok());
        assert!(c.speaks_as.may_use("default").is_err());
        let e = TokenTable::parse(&line("policies = [\"../x\"]\n")).unwrap_err();
        assert!(
            matches!(&e, TokensError::Token { index: 1, problem: TokenProblem::Policy(p), .. } if p == "../x"),
            "{e}"
        );
        assert!(e.to_string().contains("not a policy name"), "{e}");
    }
    use super::*;

    fn line(name: &str, token: &str) -> String {
        format!(
            "[[token]]\nname = \"{name}\"\nsha256 = \"{}\"\n",
            hex(&token_hash(token))
        )
    }

    #[test]
    fn a_token_maps_to_its_name_scopes_and_quotas() {
        let text = format!(
            "{}scopes = [\"pycell:run\", \"pycell:tools\"]\nmax_concurrent_runs = 2\n{}",
            line("ci-bot", "secret-1"),
            line("alice", "secret-2")
        );
        let t = TokenTable::parse(&text).unwrap();
        assert_eq!(t.len(), 2);
        let ci = t.caller("secret-1").unwrap();
        assert_eq!(&**ci.identity(), "ci-bot");
        assert_eq!(
            ci.scopes,
            Scopes {
                run: true,
                tools: true
            }
        );
        assert_eq!(ci.quotas.max_concurrent_runs, 2);
        assert_eq!(ci.quotas.runs_per_minute, 60);
        let alice = t.caller("secret-2").unwrap();
        assert_eq!(
            alice.scopes,
            Scopes {
                run: true,
                tools: false
            }
        );
        assert!(t.caller("secret-3").is_none());
        assert!(t.caller("").is_none());
    }

    #[test]
    fn mistakes_in_the_file_say_where() {
        let e = |text: &str| TokenTable::parse(text).unwrap_err().to_string();
        assert!(
            e("[[token]]\nname = \"a b\"\nsha256 = \"00\"\n").contains("token 1 (\"a b\"): name")
        );
        assert!(e("[[token]]\nname = \"a\"\nsha256 = \"00\"\n").contains("not 64 hexadecimal"));
        let twice = format!("{}{}", line("a", "x"), line("a", "y"));
        assert!(e(&twice).contains("token 2 (\"a\"): another token has the same name"));
        let same = format!("{}{}", line("a", "x"), line("b", "x"));
        assert!(e(&same).contains("the same sha256"));
        let scope = format!("{}scopes = [\"admin\"]\n", line("a", "x"));
        assert!(e(&scope).contains("unknown scope \"admin\""));
        let zero = format!("{}runs_per_minute = 0\n", line("a", "x"));
        assert!(e(&zero).contains("runs_per_minute must be at least 1"));
        assert!(e("[[token]]\nname = \"a\"\nhash = \"x\"\n").contains("unknown field"));
    }
}
