//! Who may pass: the bearer token of each request (a hashed token of the
//! tokens file, or an OAuth access token), the scope a JSON-RPC request
//! needs, and the answers to those that may not (RFC 6750's
//! `WWW-Authenticate` challenges, pointing at the RFC 9728 metadata). Pure:
//! the HTTP plumbing is in `front.rs`.

use std::sync::Arc;

use http::StatusCode;

use super::callers::{Caller, TokenTable, SCOPES, SCOPE_RUN};
use super::oauth::OAuth;
use crate::mcp_server::CODE_TOOLS;

/// Why a request may not pass.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Denial {
    /// No credentials at all.
    Missing,
    /// Credentials that prove nothing, and why.
    Invalid(String),
    /// A valid token without this scope.
    Scope(&'static str),
}

/// How requests are authenticated.
#[derive(Debug)]
pub struct Gate {
    /// `--no-auth` (loopback only): every request passes, as this
    /// process's own uid.
    pub open: bool,
    pub tokens: Option<TokenTable>,
    pub oauth: Option<OAuth>,
    /// Where the protected resource metadata is (for challenges).
    pub metadata_url: String,
}

impl Gate {
    /// The caller the `Authorization` header proves (None when open).
    pub fn authenticate(
        &self,
        authorization: Option<&[u8]>,
    ) -> Result<Option<Arc<Caller>>, Denial> {
        if self.open {
            return Ok(None);
        }
        let Some(value) = authorization else {
            return Err(Denial::Missing);
        };
        let token = std::str::from_utf8(value)
            .ok()
            .and_then(bearer)
            .ok_or_else(|| {
                Denial::Invalid("use the header `Authorization: Bearer TOKEN`".into())
            })?;
        if let (Some(oauth), true) = (&self.oauth, looks_like_jwt(token)) {
            return oauth
                .verify(token)
                .map(|c| Some(Arc::new(c)))
                .map_err(Denial::Invalid);
        }
        match self.tokens.as_ref().and_then(|t| t.caller(token)) {
            Some(caller) => Ok(Some(caller)),
            None => Err(Denial::Invalid("the token is not valid here".into())),
        }
    }

    /// The status and `WWW-Authenticate` value that answer `denial`.
    pub fn challenge(&self, denial: &Denial) -> (StatusCode, String) {
        let meta = format!("resource_metadata=\"{}\"", self.metadata_url);
        let scope = format!("scope=\"{}\"", SCOPES.join(" "));
        match denial {
            Denial::Missing => (
                StatusCode::UNAUTHORIZED,
                format!("Bearer {meta}, {scope}"),
            ),
            Denial::Invalid(why) => (
                StatusCode::UNAUTHORIZED,
                format!(
                    "Bearer error=\"invalid_token\", error_description=\"{}\", {meta}",
                    quoted_safe(why)
                ),
            ),
            Denial::Scope(needed) => (
                StatusCode::FORBIDDEN,
                format!(
                    "Bearer error=\"insufficient_scope\", scope=\"{needed}\", error_description=\"this call needs the {needed} scope\", {meta}"
                ),
            ),
        }
    }
}

/// The scope a JSON-RPC message (or batch) needs beyond a valid token: a
/// `tools/call` of a tool that runs code needs `pycell:run`. A body that
/// is not JSON needs nothing here (the MCP layer refuses it).
pub fn scope_needed(body: &[u8]) -> Option<&'static str> {
    let value: serde_json::Value = serde_json::from_slice(body).ok()?;
    let messages = match &value {
        serde_json::Value::Array(batch) => batch.iter().collect(),
        one => vec![one],
    };
    messages
        .into_iter()
        .any(|m| {
            m.get("method").and_then(|v| v.as_str()) == Some("tools/call")
                && m.pointer("/params/name")
                    .and_then(|v| v.as_str())
                    .is_some_and(|name| CODE_TOOLS.contains(&name))
        })
        .then_some(SCOPE_RUN)
}

fn bearer(value: &str) -> Option<&str> {
    let (scheme, token) = value.split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

fn looks_like_jwt(token: &str) -> bool {
    token.matches('.').count() == 2
}

/// `text` as it may stand in a quoted-string of a header: printable ASCII
/// without quotes or backslashes, at most 200 characters (a token's key id
/// is the client's text).
fn quoted_safe(text: &str) -> String {
    text.chars()
        .map(|c| match c {
            '"' | '\\' => '\'',
            c if c.is_ascii_graphic() || c == ' ' => c,
            _ => '?',
        })
        .take(200)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mcp_http::callers::{hex, token_hash};

    fn gate() -> Gate {
        let text = format!(
            "[[token]]\nname = \"alice\"\nsha256 = \"{}\"\n",
            hex(&token_hash("s3cret"))
        );
        Gate {
            open: false,
            tokens: Some(TokenTable::parse(&text).unwrap()),
            oauth: None,
            metadata_url: "http://127.0.0.1:1/.well-known/oauth-protected-resource/mcp".into(),
        }
    }

    #[test]
    fn a_token_of_the_file_passes_as_its_name() {
        let g = gate();
        let c = g.authenticate(Some(b"Bearer s3cret")).unwrap().unwrap();
        assert_eq!(&*c.identity, "alice");
        assert!(g.authenticate(Some(b"bearer  s3cret ")).is_ok());
        assert_eq!(g.authenticate(None), Err(Denial::Missing));
        assert!(matches!(
            g.authenticate(Some(b"Bearer wrong")),
            Err(Denial::Invalid(_))
        ));
        assert!(matches!(
            g.authenticate(Some(b"Basic s3cret")),
            Err(Denial::Invalid(_))
        ));
        assert!(matches!(
            g.authenticate(Some(b"Bearer ")),
            Err(Denial::Invalid(_))
        ));
        let open = Gate {
            open: true,
            ..gate()
        };
        assert_eq!(open.authenticate(None), Ok(None));
    }

    #[test]
    fn challenges_follow_rfc_6750_and_9728() {
        let g = gate();
        let (s, h) = g.challenge(&Denial::Missing);
        assert_eq!(s, StatusCode::UNAUTHORIZED);
        assert_eq!(h, "Bearer resource_metadata=\"http://127.0.0.1:1/.well-known/oauth-protected-resource/mcp\", scope=\"pycell:run pycell:tools\"");
        let (s, h) = g.challenge(&Denial::Invalid("key \"x\\\u{7}\" unknown".into()));
        assert_eq!(s, StatusCode::UNAUTHORIZED);
        assert!(
            h.starts_with(
                "Bearer error=\"invalid_token\", error_description=\"key 'x'?' unknown\""
            ),
            "{h}"
        );
        let (s, h) = g.challenge(&Denial::Scope(SCOPE_RUN));
        assert_eq!(s, StatusCode::FORBIDDEN);
        assert!(
            h.starts_with("Bearer error=\"insufficient_scope\", scope=\"pycell:run\""),
            "{h}"
        );
    }

    #[test]
    fn running_code_needs_the_run_scope() {
        let call = |name: &str| {
            format!(
                r#"{{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{{"name":"{name}"}}}}"#
            )
        };
        assert_eq!(scope_needed(call("run_python").as_bytes()), Some(SCOPE_RUN));
        assert_eq!(scope_needed(call("write_file").as_bytes()), Some(SCOPE_RUN));
        assert_eq!(scope_needed(call("sandbox_info").as_bytes()), None);
        assert_eq!(
            scope_needed(br#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#),
            None
        );
        let batch = format!("[{}]", call("session_start"));
        assert_eq!(scope_needed(batch.as_bytes()), Some(SCOPE_RUN));
        assert_eq!(scope_needed(b"not json"), None);
    }
}
