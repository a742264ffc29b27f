//! OAuth 2.1 as a resource server: `pycell mcp --http` accepts access
//! tokens that a configured authorization server issued (JWTs signed with
//! one of its keys), for this server (the audience), unexpired, and maps
//! each to a caller: `oauth:` and the token's subject, with the pycell
//! scopes it carries. The `--oauth` file:
//!
//! ```toml
//! issuer = "https://auth.example.net"      # must equal the tokens' `iss`
//! jwks = "/etc/pycell/issuer-keys.json"    # the issuer's JWK Set (public keys)
//! audience = "https://pycell.example.net/mcp"  # default: --public-url
//! algorithms = ["RS256", "ES256"]          # default: RS256, ES256, EdDSA
//! leeway_s = 30                            # clock skew allowed (default 30)
//! [quotas]                                 # for each identity (defaults 4, 60)
//! max_concurrent_runs = 4
//! runs_per_minute = 60
//! ```
//!
//! The key set is a file because this server makes no outbound requests;
//! when a token names a key id not in it, the file is read again if it
//! changed (so keys rotate without a restart). Only asymmetric algorithms:
//! a shared secret would let anyone holding it mint tokens.

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::SystemTime;

use jsonwebtoken::errors::ErrorKind;
use jsonwebtoken::jwk::JwkSet;
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde::Deserialize;

use super::callers::{Caller, Quotas, Scopes};

const DEFAULT_ALGORITHMS: [Algorithm; 3] = [Algorithm::RS256, Algorithm::ES256, Algorithm::EdDSA];

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct OAuthFile {
    issuer: String,
    jwks: PathBuf,
    audience: Option<String>,
    algorithms: Option<Vec<String>>,
    leeway_s: Option<u64>,
    #[serde(default)]
    quotas: Quotas,
}

/// The claims pycell reads; the rest of a token is not its business.
#[derive(Debug, Deserialize)]
struct Claims {
    sub: String,
    /// RFC 8693/9068: space-separated.
    #[serde(default)]
    scope: Option<String>,
    /// Some issuers' list form.
    #[serde(default)]
    scp: Option<Vec<String>>,
}

/// The issuer's keys as last read.
#[derive(Debug)]
struct Keys {
    set: Vec<(Option<String>, DecodingKey)>,
    modified: Option<SystemTime>,
}

#[derive(Debug)]
pub struct OAuth {
    pub issuer: String,
    pub audience: String,
    jwks: PathBuf,
    keys: Mutex<Keys>,
    validation: Validation,
    quotas: Quotas,
}

impl OAuth {
    /// Load the `--oauth` file and the key set it names; `public_url` is
    /// the audience unless the file says another.
    pub fn load(path: &Path, public_url: &str) -> Result<OAuth, OAuthConfigError> {
        let at = |problem| OAuthConfigError {
            path: path.to_path_buf(),
            problem,
        };
        let text = std::fs::read_to_string(path).map_err(|e| at(ConfigProblem::Read(e)))?;
        let file: OAuthFile =
            toml::from_str(&text).map_err(|e| at(ConfigProblem::Toml(Box::new(e))))?;
        let algorithms = algorithms(file.algorithms.as_deref()).map_err(at)?;
        if let Some(p) = file.quotas.problem() {
            return Err(at(ConfigProblem::Quotas(p)));
        }
        let audience = file.audience.unwrap_or_else(|| public_url.to_string());
        let mut validation = Validation::new(algorithms[0]);
        validation.algorithms = algorithms;
        validation.set_issuer(&[&file.issuer]);
        validation.set_audience(&[&audience]);
        validation.set_required_spec_claims(&["exp", "iss", "aud", "sub"]);
        validation.validate_nbf = true;
        validation.leeway = file.leeway_s.unwrap_or(30);
        let keys = read_keys(&file.jwks)?;
        if keys.set.is_empty() {
            return Err(OAuthConfigError {
                path: file.jwks.clone(),
                problem: ConfigProblem::NoKey,
            });
        }
        Ok(OAuth {
            issuer: file.issuer,
            audience,
            jwks: file.jwks,
            keys: Mutex::new(keys),
            validation,
            quotas: file.quotas,
        })
    }

    /// The caller this access token proves, or why it proves none (said to
    /// the client in `WWW-Authenticate`: nothing secret in it).
    pub fn verify(&self, token: &str) -> Result<Caller, TokenRejected> {
        let header = jsonwebtoken::decode_header(token).map_err(|e| why(e.kind()))?;
        if !self.validation.algorithms.contains(&header.alg) {
            return Err(TokenRejected::Algorithm);
        }
        let key = self.key(header.kid.as_deref())?;
        // One algorithm at a time: the library wants each it is given to
        // be of the key's family.
        let mut validation = self.validation.clone();
        validation.algorithms = vec![header.alg];
        let data =
            jsonwebtoken::decode::<Claims>(token, &key, &validation).map_err(|e| why(e.kind()))?;
        let claims = data.claims;
        let identity = format!("oauth:{}", claims.sub);
        if pycell_protocol::bounds::check_identity(&identity).is_err() {
            return Err(TokenRejected::Subject);
        }
        let scope_names = claims.scope.iter().flat_map(|s| s.split(' '));
        let listed = claims.scp.iter().flatten().map(String::as_str);
        let all: Vec<&str> = scope_names.chain(listed).collect();
        let mut policies: Vec<String> = super::callers::DEFAULT_POLICIES
            .iter()
            .map(|p| p.to_string())
            .collect();
        policies.extend(
            all.iter()
                .filter_map(|s| s.strip_prefix(super::callers::POLICY_SCOPE_PREFIX))
                .filter(|p| pycell_policy::is_valid_name(p) && !policies.iter().any(|q| q == p))
                .map(str::to_string)
                .collect::<Vec<_>>(),
        );
        Ok(Caller::new(
            &identity,
            Scopes::from_names(all.iter().copied()),
            self.quotas,
            policies.into(),
        ))
    }

    /// The key `kid` names (or, without a kid, the only key): from the set
    /// read last, or from the file again if it changed since.
    fn key(&self, kid: Option<&str>) -> Result<DecodingKey, TokenRejected> {
        let mut keys = self.keys.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(k) = pick(&keys.set, kid) {
            return Ok(k);
        }
        let modified = std::fs::metadata(&self.jwks)
            .and_then(|m| m.modified())
            .ok();
        if modified.is_some() && modified != keys.modified {
            if let Ok(fresh) = read_keys(&self.jwks) {
                *keys = fresh;
            }
        }
        pick(&keys.set, kid).ok_or_else(|| match kid {
            Some(k) => TokenRejected::UnknownKey(k.to_string()),
            None => TokenRejected::NoKeyId,
        })
    }
}

fn pick(set: &[(Option<String>, DecodingKey)], kid: Option<&str>) -> Option<DecodingKey> {
    match kid {
        Some(kid) => set
            .iter()
            .find(|(k, _)| k.as_deref() == Some(kid))
            .map(|(_, key)| key.clone()),
        None if set.len() == 1 => Some(set[0].1.clone()),
        None => None,
    }
}

fn read_keys(path: &Path) -> Result<Keys, OAuthConfigError> {
    let at = |problem| OAuthConfigError {
        path: path.to_path_buf(),
        problem,
    };
    let text = std::fs::read_to_string(path).map_err(|e| at(ConfigProblem::Read(e)))?;
    let set: JwkSet = serde_json::from_str(&text).map_err(|e| at(ConfigProblem::NotJwks(e)))?;
    let mut keys = Vec::new();
    for jwk in &set.keys {
        // Symmetric (oct) keys are secrets, not an issuer's public keys.
        if matches!(
            jwk.algorithm,
            jsonwebtoken::jwk::AlgorithmParameters::OctetKey(_)
        ) {
            return Err(at(ConfigProblem::SymmetricKey));
        }
        let key = DecodingKey::from_jwk(jwk).map_err(|e| at(ConfigProblem::BadKey(e)))?;
        keys.push((jwk.common.key_id.clone(), key));
    }
    let modified = std::fs::metadata(path).and_then(|m| m.modified()).ok();
    Ok(Keys {
        set: keys,
        modified,
    })
}

fn algorithms(names: Option<&[String]>) -> Result<Vec<Algorithm>, ConfigProblem> {
    let Some(names) = names else {
        return Ok(DEFAULT_ALGORITHMS.to_vec());
    };
    if names.is_empty() {
        return Err(ConfigProblem::NoAlgorithm);
    }
    names
        .iter()
        .map(|n| match n.parse::<Algorithm>() {
            Ok(Algorithm::HS256 | Algorithm::HS384 | Algorithm::HS512) => {
                Err(ConfigProblem::SharedSecretAlgorithm(n.clone()))
            }
            Ok(a) => Ok(a),
            Err(_) => Err(ConfigProblem::UnknownAlgorithm(n.clone())),
        })
        .collect()
}

/// Why the `--oauth` file (or the key set it names) cannot be used.
#[derive(Debug, thiserror::Error)]
#[error("{}: {problem}", path.display())]
pub struct OAuthConfigError {
    /// The file at fault.
    pub path: std::path::PathBuf,
    pub problem: ConfigProblem,
}

/// What is wrong with it.
#[derive(Debug, thiserror::Error)]
pub enum ConfigProblem {
    #[error("cannot read: {0}")]
    Read(std::io::Error),
    #[error("{0}")]
    Toml(Box<toml::de::Error>),
    #[error("quotas: {0}")]
    Quotas(&'static str),
    #[error("algorithms: name at least one")]
    NoAlgorithm,
    #[error("algorithms: {0} needs a shared secret; use the issuer's public-key algorithm (RS256, ES256, EdDSA...)")]
    SharedSecretAlgorithm(String),
    #[error("algorithms: unknown algorithm {0:?}")]
    UnknownAlgorithm(String),
    #[error("not a JWK Set: {0}")]
    NotJwks(serde_json::Error),
    #[error("a symmetric (oct) key: only public keys belong here")]
    SymmetricKey,
    #[error("a key does not load: {0}")]
    BadKey(jsonwebtoken::errors::Error),
    #[error("no usable key (RSA, EC or OKP public keys)")]
    NoKey,
}

/// Why an access token proves no caller: said to the client as the
/// `error_description` of `WWW-Authenticate` (nothing secret in it).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TokenRejected {
    #[error("the token has expired")]
    Expired,
    #[error("the token is not valid yet (nbf)")]
    NotYetValid,
    #[error("the token is for another audience than this server")]
    Audience,
    #[error("the token is from another issuer")]
    Issuer,
    #[error("the token's signature does not verify")]
    Signature,
    #[error("the token's algorithm is not one this server accepts")]
    Algorithm,
    #[error("the token has no {0:?} claim")]
    MissingClaim(String),
    #[error("the token is not a well-formed JWT")]
    Malformed,
    #[error(
        "the token is signed with key {0:?}, which is not one of the issuer's keys this server has"
    )]
    UnknownKey(String),
    #[error("the token names no key (kid) and the issuer has several")]
    NoKeyId,
    #[error("the token's subject is not up to 255 printable ASCII characters")]
    Subject,
}

/// What was wrong with a token, as the JWT library found it.
fn why(kind: &ErrorKind) -> TokenRejected {
    match kind {
        ErrorKind::ExpiredSignature => TokenRejected::Expired,
        ErrorKind::ImmatureSignature => TokenRejected::NotYetValid,
        ErrorKind::InvalidAudience => TokenRejected::Audience,
        ErrorKind::InvalidIssuer => TokenRejected::Issuer,
        ErrorKind::InvalidSignature => TokenRejected::Signature,
        ErrorKind::InvalidAlgorithm | ErrorKind::MissingAlgorithm => TokenRejected::Algorithm,
        ErrorKind::MissingRequiredClaim(c) => TokenRejected::MissingClaim(c.clone()),
        _ => TokenRejected::Malformed,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_public_key_algorithms_are_accepted() {
        assert_eq!(algorithms(None).unwrap().len(), 3);
        let names = |n: &[&str]| n.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            algorithms(Some(&names(&["ES256"]))).unwrap(),
            vec![Algorithm::ES256]
        );
        assert!(matches!(
            algorithms(Some(&names(&["HS256"]))),
            Err(ConfigProblem::SharedSecretAlgorithm(n)) if n == "HS256"
        ));
        assert!(algorithms(Some(&names(&["XX1"])))
            .unwrap_err()
            .to_string()
            .contains("unknown algorithm"));
        assert!(matches!(
            algorithms(Some(&[])),
            Err(ConfigProblem::NoAlgorithm)
        ));
    }

    #[test]
    fn a_key_set_with_a_secret_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("jwks.json");
        std::fs::write(&p, r#"{"keys":[{"kty":"oct","k":"c2VjcmV0","kid":"s"}]}"#).unwrap();
        let e = read_keys(&p).unwrap_err();
        assert!(matches!(e.problem, ConfigProblem::SymmetricKey), "{e}");
        assert!(
            e.to_string().starts_with(&format!("{}: ", p.display())),
            "{e}"
        );
        std::fs::write(&p, "{}").unwrap();
        let e = read_keys(&p).unwrap_err();
        assert!(e.to_string().contains("not a JWK Set"), "{e}");
    }
}
