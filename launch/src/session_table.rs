//! The sessions a server holds, by handle: who owns each, how many each
//! owner has, and why recently ended ones ended (so that a call with the
//! handle of a session that was killed says so, rather than "unknown").
//!
//! A handle is `s-` and 32 hex digits: 128 bits from the kernel's random
//! source, unguessable. A handle its caller does not own gets the very
//! answer an unknown handle gets, so that handles cannot be probed across
//! owners.

use std::collections::{HashMap, VecDeque};
use std::time::Instant;

use pycell_wire::codes::FailureCode;

use crate::session::{EndReason, Session, SessionEnded};

/// Ended sessions remembered, for their handles' next calls.
const REMEMBERED_ENDS: usize = 1024;

/// A new session handle.
pub fn new_handle() -> std::io::Result<String> {
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes).map_err(|e| std::io::Error::other(e.to_string()))?;
    Ok(handle_from(bytes))
}

fn handle_from(bytes: [u8; 16]) -> String {
    let mut s = String::with_capacity(34);
    s.push_str("s-");
    for b in bytes {
        s.push_str(&format!("{b:02x}"));
    }
    s
}

/// Whether `s` has a handle's shape (checked before any lookup).
pub fn is_handle(s: &str) -> bool {
    s.len() == 34
        && s.starts_with("s-")
        && s[2..]
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// One live session and what the server keeps about it.
#[derive(Debug, Clone)]
pub struct Entry<T> {
    pub session: Session,
    pub owner: u32,
    pub started: Instant,
    pub last_used: Instant,
    /// The caller's own record (policy, limits, env).
    pub info: T,
}

/// Why a handle names no live session of the caller's.
#[derive(Debug, Clone)]
pub enum Lookup {
    /// Never a session of this caller's (or not a handle at all).
    Unknown,
    /// It was, and it ended.
    Gone(SessionEnded),
}

/// The table.
#[derive(Debug)]
pub struct SessionTable<T> {
    live: HashMap<String, Entry<T>>,
    ended: HashMap<String, (u32, SessionEnded)>,
    ended_order: VecDeque<String>,
}

impl<T> Default for SessionTable<T> {
    fn default() -> Self {
        SessionTable {
            live: HashMap::new(),
            ended: HashMap::new(),
            ended_order: VecDeque::new(),
        }
    }
}

impl<T: Clone> SessionTable<T> {
    /// Live sessions of `owner`.
    pub fn count(&self, owner: u32) -> usize {
        self.live.values().filter(|e| e.owner == owner).count()
    }

    pub fn insert(&mut self, handle: String, entry: Entry<T>) {
        self.live.insert(handle, entry);
    }

    /// The live session `handle` of `owner`, marked used; a session found
    /// ended is moved to the ended ones.
    pub fn get(&mut self, owner: u32, handle: &str) -> Result<Entry<T>, Lookup> {
        if let Some(e) = self.live.get_mut(handle).filter(|e| e.owner == owner) {
            if let Some(ended) = e.session.ended() {
                self.forget(handle, ended.clone());
                return Err(Lookup::Gone(ended));
            }
            e.last_used = Instant::now();
            return Ok(e.clone());
        }
        match self.ended.get(handle) {
            Some((o, ended)) if *o == owner => Err(Lookup::Gone(ended.clone())),
            _ => Err(Lookup::Unknown),
        }
    }

    /// `handle`'s session is over: remember why.
    pub fn forget(&mut self, handle: &str, ended: SessionEnded) {
        let Some(e) = self.live.remove(handle) else {
            return;
        };
        if self.ended_order.len() >= REMEMBERED_ENDS {
            if let Some(old) = self.ended_order.pop_front() {
                self.ended.remove(&old);
            }
        }
        self.ended.insert(handle.to_string(), (e.owner, ended));
        self.ended_order.push_back(handle.to_string());
    }

    /// Live sessions of `owner` (ended ones found on the way are moved).
    pub fn list(&mut self, owner: u32) -> Vec<(String, Entry<T>)> {
        let over: Vec<(String, SessionEnded)> = self
            .live
            .iter()
            .filter_map(|(h, e)| e.session.ended().map(|x| (h.clone(), x)))
            .collect();
        for (h, x) in over {
            self.forget(&h, x);
        }
        let mut out: Vec<_> = self
            .live
            .iter()
            .filter(|(_, e)| e.owner == owner)
            .map(|(h, e)| (h.clone(), e.clone()))
            .collect();
        out.sort_by_key(|(_, e)| e.started);
        out
    }

    /// Every live session (to end them all).
    pub fn all(&self) -> Vec<Session> {
        self.live.values().map(|e| e.session.clone()).collect()
    }
}

/// What a call with a handle that names no live session is told.
pub fn lookup_message(l: &Lookup, handle: &str) -> (FailureCode, String) {
    match l {
        Lookup::Unknown => (
            FailureCode::UnknownSession,
            format!("there is no session {handle:?}: start one with session_start (session_list shows yours)"),
        ),
        Lookup::Gone(e)
            if matches!(
                e.reason,
                EndReason::Ended | EndReason::Idle | EndReason::Lifetime
            ) =>
        {
            (
                FailureCode::SessionGone,
                format!(
                    "session {handle} is over ({}): {}; start a new one with session_start",
                    e.reason.as_str(),
                    e.message
                ),
            )
        }
        Lookup::Gone(e) => (
            FailureCode::SessionKilled,
            format!(
                "session {handle} is over ({}): {}; start a new one with session_start",
                e.reason.as_str(),
                e.message
            ),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_are_128_random_bits_in_hex() {
        let a = new_handle().unwrap();
        let b = new_handle().unwrap();
        assert!(is_handle(&a) && is_handle(&b), "{a} {b}");
        assert_ne!(a, b);
        assert_eq!(handle_from([0xab; 16]), format!("s-{}", "ab".repeat(16)));
        for bad in [
            "",
            "s-",
            "s-ABABABABABABABABABABABABABABABAB",
            "x-abababababababababababababababab",
        ] {
            assert!(!is_handle(bad), "{bad}");
        }
    }
}
