//! Who may pass: the bearer token of each request (a hashed token of the
//! tokens file, or an OAuth access token), the scope a JSON-RPC request
//! needs, and the answers to those that may not (RFC 6750's
//! `WWW-Authenticate` challenges, pointing at the RFC 9728 metadata). Pure:
//! the HTTP plumbing is in `front.rs`.

use std::sync::Arc;

use http::StatusCode;

use super::callers::{Caller, TokenTable, SCOPES, SCOPE_RUN};
use super::oauth::OAuth;
use crate::server::CODE_TOOLS;

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
                .map_err(|e| Denial::Invalid(e.to_string()));
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

/// The most JSON values (scalars, arrays and objects each count one) a
/// request may hold: its parsed form is bounded by this and its size,
/// whatever its shape (a body of 30 MB of `[0,0,...]` would otherwise
/// grow tens of times larger once parsed).
pub const MAX_JSON_VALUES: usize = 100_000;

/// A request whose JSON holds more than [`MAX_JSON_VALUES`] values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the request holds more than {MAX_JSON_VALUES} JSON values")]
pub struct TooManyValues;

/// The scope a JSON-RPC message (or batch) needs beyond a valid token: a
/// `tools/call` of a tool that runs code needs `pycell:run`. Read without
/// building a tree: the message is counted against [`MAX_JSON_VALUES`]
/// (over it: an error to answer), then only `method` and `params.name`
/// are looked at. A body that is not JSON needs nothing here (the MCP
/// layer answers it).
pub fn scope_needed(body: &[u8]) -> Result<Option<&'static str>, TooManyValues> {
    if !within_value_budget(body) {
        return Err(TooManyValues);
    }
    let needs_run = |raw: &serde_json::value::RawValue| {
        let Ok(p) = serde_json::from_str::<Probe<'_>>(raw.get()) else {
            return false;
        };
        let name = p
            .params
            .and_then(|params| serde_json::from_str::<ProbeParams<'_>>(params.get()).ok())
            .and_then(|params| params.name);
        p.method.as_deref() == Some("tools/call")
            && name.is_some_and(|n| CODE_TOOLS.contains(&n.as_ref()))
    };
    let first = body.iter().find(|b| !b.is_ascii_whitespace());
    let any = match first {
        Some(b'[') => serde_json::from_slice::<Vec<&serde_json::value::RawValue>>(body)
            .map(|batch| batch.into_iter().any(needs_run))
            .unwrap_or(false),
        _ => serde_json::from_slice::<&serde_json::value::RawValue>(body)
            .map(needs_run)
            .unwrap_or(false),
    };
    Ok(any.then_some(SCOPE_RUN))
}

/// The fields of a JSON-RPC message the scope depends on; the rest is
/// skipped unread.
#[derive(serde::Deserialize)]
struct Probe<'a> {
    #[serde(default, borrow)]
    method: Option<std::borrow::Cow<'a, str>>,
    #[serde(default, borrow)]
    params: Option<&'a serde_json::value::RawValue>,
}

#[derive(serde::Deserialize)]
struct ProbeParams<'a> {
    #[serde(default, borrow)]
    name: Option<std::borrow::Cow<'a, str>>,
}

/// Whether `body` holds at most [`MAX_JSON_VALUES`] values (true for a
/// body that is not JSON at all: that is not this check's to answer).
fn within_value_budget(body: &[u8]) -> bool {
    let left = std::cell::Cell::new(MAX_JSON_VALUES);
    let mut de = serde_json::Deserializer::from_slice(body);
    let counted = serde::de::DeserializeSeed::deserialize(Budget(&left), &mut de);
    counted.is_ok() || left.get() > 0
}

/// Visits a JSON value of any shape, spending one of `left` per value.
#[derive(Clone, Copy)]
struct Budget<'b>(&'b std::cell::Cell<usize>);

impl Budget<'_> {
    fn spend<E: serde::de::Error>(self) -> Result<(), E> {
        match self.0.get() {
            0 => Err(E::custom("too many values")),
            n => {
                self.0.set(n - 1);
                Ok(())
            }
        }
    }
}

impl<'de> serde::de::DeserializeSeed<'de> for Budget<'_> {
    type Value = ();
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> serde::de::Visitor<'de> for Budget<'_> {
    type Value = ();
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_bool<E: serde::de::Error>(self, _: bool) -> Result<(), E> {
        self.spend()
    }
    fn visit_i64<E: serde::de::Error>(self, _: i64) -> Result<(), E> {
        self.spend()
    }
    fn visit_u64<E: serde::de::Error>(self, _: u64) -> Result<(), E> {
        self.spend()
    }
    fn visit_f64<E: serde::de::Error>(self, _: f64) -> Result<(), E> {
        self.spend()
    }
    fn visit_str<E: serde::de::Error>(self, _: &str) -> Result<(), E> {
        self.spend()
    }
    fn visit_unit<E: serde::de::Error>(self) -> Result<(), E> {
        self.spend()
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        self.spend()?;
        while seq.next_element_seed(self)?.is_some() {}
        Ok(())
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        self.spend()?;
        while map.next_key_seed(self)?.is_some() {
            map.next_value_seed(self)?;
        }
        Ok(())
    }
}

/// Whether a request's `Origin` may call this server (the MCP transport
/// says servers must check it, against DNS rebinding): its host is one
/// of those the `Host` header may name. `null` and what is not an origin
/// may not.
pub fn origin_allowed(origin: &[u8], allowed_hosts: &[String]) -> bool {
    let Ok(uri) = http::Uri::try_from(origin) else {
        return false;
    };
    let (Some(scheme), Some(host)) = (uri.scheme_str(), uri.host()) else {
        return false;
    };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    matches!(scheme, "http" | "https")
        && uri.path() == "/"
        && uri.query().is_none()
        && allowed_hosts.iter().any(|h| h.eq_ignore_ascii_case(host))
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
    use crate::http::callers::{hex, token_hash};

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
        assert_eq!(&**c.identity(), "alice");
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
        let needed = |body: &[u8]| scope_needed(body).unwrap();
        assert_eq!(needed(call("run_python").as_bytes()), Some(SCOPE_RUN));
        assert_eq!(needed(call("write_file").as_bytes()), Some(SCOPE_RUN));
        assert_eq!(needed(call("sandbox_info").as_bytes()), None);
        assert_eq!(
            needed(br#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#),
            None
        );
        let batch = format!("[{}]", call("session_start"));
        assert_eq!(needed(batch.as_bytes()), Some(SCOPE_RUN));
        let escaped = call("run\\u005fpython");
        assert_eq!(needed(escaped.as_bytes()), Some(SCOPE_RUN), "{escaped}");
        assert_eq!(needed(b"not json"), None);
    }

    #[test]
    fn a_request_of_more_values_than_the_budget_is_refused_unparsed() {
        let values = |n: usize| {
            let zeros = vec!["0"; n].join(",");
            format!(
                r#"{{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{{"x":[{zeros}]}}}}"#
            )
        };
        // Two objects, one array, three scalars and five keys besides.
        assert!(scope_needed(values(MAX_JSON_VALUES - 11).as_bytes()).is_ok());
        let e = scope_needed(values(MAX_JSON_VALUES - 10).as_bytes()).unwrap_err();
        assert!(
            e.to_string().contains("more than 100000 JSON values"),
            "{e}"
        );
        let deep = "[".repeat(100_000);
        assert!(
            scope_needed(deep.as_bytes()).is_ok(),
            "not JSON: rmcp answers it"
        );
    }

    #[test]
    fn an_origin_must_be_one_of_the_servers_hosts() {
        let hosts = [
            "mcp.example.net".to_string(),
            "127.0.0.1".to_string(),
            "::1".to_string(),
        ];
        for ok in [
            "https://mcp.example.net",
            "https://MCP.example.net:8443",
            "http://127.0.0.1:9000",
            "http://[::1]:9000",
        ] {
            assert!(origin_allowed(ok.as_bytes(), &hosts), "{ok}");
        }
        for bad in [
            "https://evil.example.org",
            "null",
            "https://mcp.example.net.evil.example.org",
            "file:///etc",
            "mcp.example.net",
            "",
        ] {
            assert!(!origin_allowed(bad.as_bytes(), &hosts), "{bad}");
        }
    }
}
