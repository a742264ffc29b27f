//! Which policies a local user may name (`policies_by_uid` in
//! pycelld.toml): what `"*"` lists, for everyone allowed to connect, and
//! what their own uid (or user name) lists. Without the table only
//! `default`. Root may name any: it writes the policy files. A trusted
//! front end's uid bounds what every identity it speaks for may name
//! (their tokens narrow it further, in the front end).

use std::collections::{BTreeMap, BTreeSet};

/// The `policies_by_uid` table, resolved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicyAccess {
    everyone: BTreeSet<String>,
    by_uid: BTreeMap<u32, BTreeSet<String>>,
}

impl Default for PolicyAccess {
    fn default() -> PolicyAccess {
        PolicyAccess {
            everyone: ["default".to_string()].into_iter().collect(),
            by_uid: BTreeMap::new(),
        }
    }
}

/// The config key, for messages.
pub const KEY: &str = "policies_by_uid";

/// An entry of the table that names no policy or nobody.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BadEntry {
    #[error("{who:?}: {name:?} is not a policy name")]
    NotAPolicyName { who: String, name: String },
    #[error("{0:?} is neither \"*\", a uid nor a user of this host")]
    NobodyKnown(String),
}

/// A policy a uid may not name through pycelld.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("uid {uid} may not use policy {policy:?} through pycelld (it may use: {may}); the operator grants policies per user in {KEY} in /etc/pycell/pycelld.toml")]
pub struct NotGranted {
    pub uid: u32,
    pub policy: String,
    /// The policies it may name, or `none`.
    pub may: String,
}

impl PolicyAccess {
    /// From the table's entries: `"*"`, a uid, or a user name (looked up
    /// with `user_uid`), each to policy names. An error names the entry.
    pub fn from_table(
        table: &BTreeMap<String, Vec<String>>,
        user_uid: impl Fn(&str) -> Option<u32>,
    ) -> Result<PolicyAccess, BadEntry> {
        let mut access = PolicyAccess {
            everyone: BTreeSet::new(),
            by_uid: BTreeMap::new(),
        };
        for (who, names) in table {
            if let Some(bad) = names.iter().find(|n| !pycell_policy::is_valid_name(n)) {
                return Err(BadEntry::NotAPolicyName {
                    who: who.clone(),
                    name: bad.clone(),
                });
            }
            let set = match who.as_str() {
                "*" => &mut access.everyone,
                _ => {
                    let uid = who
                        .parse::<u32>()
                        .ok()
                        .or_else(|| user_uid(who))
                        .ok_or_else(|| BadEntry::NobodyKnown(who.clone()))?;
                    access.by_uid.entry(uid).or_default()
                }
            };
            set.extend(names.iter().cloned());
        }
        Ok(access)
    }

    /// Whether `uid` may name `policy`; if not, what to tell it.
    pub fn check(&self, uid: u32, policy: &str) -> Result<(), NotGranted> {
        let own = self.by_uid.get(&uid);
        if uid == 0 || self.everyone.contains(policy) || own.is_some_and(|o| o.contains(policy)) {
            return Ok(());
        }
        let mut may: Vec<&str> = self.everyone.iter().map(String::as_str).collect();
        may.extend(own.into_iter().flatten().map(String::as_str));
        may.sort_unstable();
        may.dedup();
        let may = match may.is_empty() {
            true => "none".to_string(),
            false => may.join(", "),
        };
        Err(NotGranted {
            uid,
            policy: policy.to_string(),
            may,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(entries: &[(&str, &[&str])]) -> BTreeMap<String, Vec<String>> {
        entries
            .iter()
            .map(|(k, v)| (k.to_string(), v.iter().map(|s| s.to_string()).collect()))
            .collect()
    }

    fn alice(name: &str) -> Option<u32> {
        (name == "alice").then_some(1000)
    }

    #[test]
    fn without_a_table_everyone_but_root_gets_default_only() {
        let a = PolicyAccess::default();
        assert_eq!(a.check(1000, "default"), Ok(()));
        let e = a.check(1000, "mcp-server").unwrap_err().to_string();
        assert!(e.contains("may use: default") && e.contains(KEY), "{e}");
        assert_eq!(a.check(0, "mcp-server"), Ok(()));
    }

    #[test]
    fn a_user_gets_what_everyone_gets_and_their_own() {
        let t = table(&[
            ("*", &["default"]),
            ("alice", &["network"]),
            ("1001", &["mcp-server"]),
        ]);
        let a = PolicyAccess::from_table(&t, alice).unwrap();
        assert_eq!(a.check(1000, "network"), Ok(()));
        assert_eq!(a.check(1000, "default"), Ok(()));
        assert!(a.check(1000, "mcp-server").is_err());
        assert_eq!(a.check(1001, "mcp-server"), Ok(()));
        let e = a.check(1001, "network").unwrap_err().to_string();
        assert!(e.contains("(it may use: default, mcp-server)"), "{e}");
        // A table without "*" leaves others nothing.
        let only = PolicyAccess::from_table(&table(&[("1001", &["default"])]), alice).unwrap();
        assert!(only
            .check(1000, "default")
            .unwrap_err()
            .to_string()
            .contains("may use: none"));
    }

    #[test]
    fn bad_entries_are_named() {
        let e = PolicyAccess::from_table(&table(&[("bob", &["default"])]), alice).unwrap_err();
        assert!(e.to_string().contains("\"bob\" is neither"), "{e}");
        let e = PolicyAccess::from_table(&table(&[("*", &["../x"])]), alice).unwrap_err();
        assert!(
            e.to_string().contains("\"../x\" is not a policy name"),
            "{e}"
        );
    }
}
