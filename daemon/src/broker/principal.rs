//! Who a request is for. A local client is its uid (SO_PEERCRED). A trusted
//! front end (a uid in `front_end_uids`: `pycell mcp --http` serving remote
//! agents) may say, in its `hello`, which of its authenticated identities a
//! connection speaks for; that identity is then the principal: admission
//! counts and queues it as it does a uid, its sessions are its own (no other
//! identity, nor the front end itself, may name them), and the audit log
//! names it. Only trusted front ends may name identities: from any other
//! peer the `hello` is refused, so a local user can neither pose as a
//! remote identity nor split its own quota into many.

use std::fmt;
use std::sync::Arc;

/// A uid, or an identity a trusted front end speaks for.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Principal {
    Uid(u32),
    Identity {
        /// The front end's uid (identities of two front ends never mix).
        front_end: u32,
        name: Arc<str>,
    },
}

impl Principal {
    /// The identity's name, if it is one.
    pub fn identity(&self) -> Option<&str> {
        match self {
            Principal::Uid(_) => None,
            Principal::Identity { name, .. } => Some(name),
        }
    }

    /// The principal's key in the snapshot store (a directory's name): a
    /// uid as such, an identity by its front end and the SHA-256 of its
    /// name (which the front end chose, and may be any text).
    pub fn store_key(&self) -> String {
        use sha2::Digest;
        match self {
            Principal::Uid(uid) => format!("uid-{uid}"),
            Principal::Identity { front_end, name } => {
                let digest = sha2::Sha256::digest(name.as_bytes());
                let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
                format!("id-{front_end}-{hex}")
            }
        }
    }
}

impl fmt::Display for Principal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Principal::Uid(uid) => write!(f, "uid {uid}"),
            Principal::Identity { name, .. } => write!(f, "identity {name:?}"),
        }
    }
}

/// Why a `hello` naming an identity is refused, if it is.
pub fn identity_problem(peer_uid: u32, front_ends: &[u32], identity: &str) -> Option<String> {
    if !front_ends.contains(&peer_uid) {
        return Some(format!("uid {peer_uid} may not speak for identity {identity:?}: only trusted front ends may (add the uid to front_end_uids in pycelld.toml for a `pycell mcp --http` that runs as it)"));
    }
    pycell_protocol::bounds::check_identity(identity)
        .err()
        .map(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn store_keys_keep_principals_apart_and_are_plain_names() {
        let id = |f: u32, n: &str| Principal::Identity {
            front_end: f,
            name: n.into(),
        };
        let keys = [
            Principal::Uid(1000).store_key(),
            id(1000, "alice").store_key(),
            id(1001, "alice").store_key(),
            id(1000, "../bob").store_key(),
        ];
        assert_eq!(keys[0], "uid-1000");
        for (i, k) in keys.iter().enumerate() {
            assert!(
                k.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-'),
                "{k}"
            );
            assert!(keys[i + 1..].iter().all(|o| o != k), "{keys:?}");
        }
    }

    #[test]
    fn only_front_ends_may_name_identities() {
        assert!(identity_problem(1000, &[], "alice").is_some());
        assert!(identity_problem(1000, &[999], "alice").is_some());
        assert_eq!(identity_problem(999, &[999], "alice"), None);
        assert!(identity_problem(999, &[999], "").is_some());
        assert!(identity_problem(999, &[999], "a b").is_some());
    }

    #[test]
    fn identities_of_two_front_ends_differ() {
        let a = Principal::Identity {
            front_end: 1,
            name: "alice".into(),
        };
        let b = Principal::Identity {
            front_end: 2,
            name: "alice".into(),
        };
        assert_ne!(a, b);
        assert_ne!(a, Principal::Uid(1));
        assert_eq!(a.to_string(), "identity \"alice\"");
        assert_eq!(Principal::Uid(7).to_string(), "uid 7");
    }
}
