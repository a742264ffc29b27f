//! What a run's connections add up to: the report's counts and the
//! per-run limits, shared by all of its connections.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Mutex;

use pycell_policy::network::EgressLimits;
use pycell_protocol::result::{Denied, HostCount, NetworkReport};

/// One connection, as the audit log records it when it ends.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct ConnectionRecord {
    /// `https`, `http`, `tcp`, or empty when the request never said.
    pub scheme: &'static str,
    pub host: String,
    pub port: u16,
    /// `allowed`, `denied` or `failed`.
    pub verdict: &'static str,
    /// Why it was denied or failed.
    pub reason: Option<String>,
    /// The address it was relayed to.
    pub address: Option<String>,
    pub bytes_in: u64,
    pub bytes_out: u64,
}

type Key = (String, u16);

#[derive(Debug, Default)]
struct Counts {
    allowed: BTreeMap<Key, u64>,
    denied: BTreeMap<(Key, String), u64>,
    failed: BTreeMap<(Key, String), u64>,
    limit_reached: Option<&'static str>,
}

#[derive(Debug)]
pub(crate) struct Tally {
    limits: EgressLimits,
    opened: AtomicU32,
    bytes: AtomicU64,
    bytes_in: AtomicU64,
    bytes_out: AtomicU64,
    counts: Mutex<Counts>,
}

impl Tally {
    pub(crate) fn new(limits: EgressLimits) -> Tally {
        Tally {
            limits,
            opened: AtomicU32::new(0),
            bytes: AtomicU64::new(0),
            bytes_in: AtomicU64::new(0),
            bytes_out: AtomicU64::new(0),
            counts: Mutex::new(Counts::default()),
        }
    }

    pub(crate) fn limits(&self) -> &EgressLimits {
        &self.limits
    }

    fn counts(&self) -> std::sync::MutexGuard<'_, Counts> {
        self.counts.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Count a new connection; false if the run has had its share.
    pub(crate) fn admit(&self) -> bool {
        let n = self.opened.fetch_add(1, Ordering::Relaxed);
        if n < self.limits.max_connections {
            return true;
        }
        self.opened.fetch_sub(1, Ordering::Relaxed);
        self.counts().limit_reached.get_or_insert("max_connections");
        false
    }

    /// Charge `n` relayed bytes (`inbound`: from the host); false once the
    /// run's byte budget is spent (the chunk is not relayed).
    pub(crate) fn charge(&self, n: u64, inbound: bool) -> bool {
        let before = self.bytes.fetch_add(n, Ordering::Relaxed);
        if before.saturating_add(n) > self.limits.max_bytes {
            self.counts().limit_reached.get_or_insert("max_bytes");
            return false;
        }
        let dir = if inbound {
            &self.bytes_in
        } else {
            &self.bytes_out
        };
        dir.fetch_add(n, Ordering::Relaxed);
        true
    }

    /// Add an ended connection to the counts; returns its key's count.
    pub(crate) fn record(&self, r: &ConnectionRecord) -> u64 {
        let key = (r.host.clone(), r.port);
        let reason = r.reason.clone().unwrap_or_default();
        let mut c = self.counts();
        let count = match r.verdict {
            "allowed" => c.allowed.entry(key).or_default(),
            "denied" => c.denied.entry((key, reason)).or_default(),
            _ => c.failed.entry((key, reason)).or_default(),
        };
        *count += 1;
        *count
    }

    pub(crate) fn report(&self) -> NetworkReport {
        let c = self.counts();
        let listed = |m: &BTreeMap<(Key, String), u64>| -> Vec<Denied> {
            m.iter()
                .map(|(((host, port), reason), count)| Denied {
                    host: host.clone(),
                    port: *port,
                    reason: reason.clone(),
                    count: *count,
                })
                .collect()
        };
        NetworkReport {
            allowed: c
                .allowed
                .iter()
                .map(|((host, port), count)| HostCount {
                    host: host.clone(),
                    port: *port,
                    count: *count,
                })
                .collect(),
            denied: listed(&c.denied),
            failed: listed(&c.failed),
            bytes_in: self.bytes_in.load(Ordering::Relaxed),
            bytes_out: self.bytes_out.load(Ordering::Relaxed),
            limit_reached: c.limit_reached.map(str::to_string),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_are_counted_and_reported() {
        let t = Tally::new(EgressLimits {
            max_connections: 2,
            max_bytes: 100,
            connect_timeout: std::time::Duration::from_secs(1),
        });
        assert!(t.admit() && t.admit() && !t.admit());
        assert!(t.charge(60, true) && t.charge(40, false) && !t.charge(1, true));
        let rec = |verdict, reason: Option<&str>| ConnectionRecord {
            host: "a.example.net".into(),
            port: 443,
            verdict,
            reason: reason.map(str::to_string),
            ..Default::default()
        };
        t.record(&rec("allowed", None));
        t.record(&rec("allowed", None));
        t.record(&rec("denied", Some("not_allowlisted")));
        let r = t.report();
        assert_eq!((r.bytes_in, r.bytes_out), (60, 40));
        assert_eq!(r.allowed[0].count, 2);
        assert_eq!(r.denied[0].reason, "not_allowlisted");
        assert_eq!(r.limit_reached.as_deref(), Some("max_connections"));
    }
}
