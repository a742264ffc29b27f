//! Each caller's quotas: how many calls that run code it has going, and
//! how many it started in the last minute (a bucket of `runs_per_minute`
//! refilled evenly). Over either, the call is refused with a message the
//! model can act on; pycelld's per-identity admission queues the rest.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use super::callers::Caller;
use crate::server::{Entered, Gate, Turned};

#[derive(Debug)]
struct State {
    running: u32,
    /// Runs the bucket still allows now.
    tokens: f64,
    refilled: Instant,
}

/// Per-identity counts.
#[derive(Debug, Default)]
pub struct Limiter {
    by_identity: Mutex<HashMap<Arc<str>, State>>,
}

/// A call counted as running; dropping it ends the count.
#[derive(Debug)]
pub struct Permit {
    limiter: Arc<Limiter>,
    identity: Arc<str>,
}

/// A call a caller's quotas do not let start now.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum OverQuota {
    #[error("{identity} has {running} calls running, its most at once (max_concurrent_runs = {max}): wait for one to finish")]
    Concurrent {
        identity: Arc<str>,
        running: u32,
        max: u32,
    },
    #[error("{identity} started its {per_minute} runs for this minute (runs_per_minute = {per_minute}): try again in {wait_s:.1} s")]
    Rate {
        identity: Arc<str>,
        per_minute: u32,
        wait_s: f64,
    },
}

impl Limiter {
    /// Count a call of `caller` that runs code, at `now`, or say why not.
    pub fn begin(self: &Arc<Self>, caller: &Caller, now: Instant) -> Result<Permit, OverQuota> {
        let mut all = self.by_identity.lock().unwrap_or_else(|p| p.into_inner());
        let q = caller.quotas;
        let per_minute = f64::from(q.runs_per_minute);
        let s = all.entry(caller.identity().clone()).or_insert(State {
            running: 0,
            tokens: per_minute,
            refilled: now,
        });
        let elapsed = now.saturating_duration_since(s.refilled).as_secs_f64();
        s.tokens = (s.tokens + elapsed * per_minute / 60.0).min(per_minute);
        s.refilled = now;
        if s.running >= q.max_concurrent_runs {
            return Err(OverQuota::Concurrent {
                identity: caller.identity().clone(),
                running: s.running,
                max: q.max_concurrent_runs,
            });
        }
        if s.tokens < 1.0 {
            let wait = (1.0 - s.tokens) * 60.0 / per_minute;
            return Err(OverQuota::Rate {
                identity: caller.identity().clone(),
                per_minute: q.runs_per_minute,
                wait_s: wait,
            });
        }
        s.tokens -= 1.0;
        s.running += 1;
        Ok(Permit {
            limiter: Arc::clone(self),
            identity: caller.identity().clone(),
        })
    }
}

/// The gate in front of the MCP server of `pycell mcp --http` with
/// authentication: the caller the front end left in the request, and a
/// call that runs code counted against its quotas.
#[derive(Debug, Default)]
pub struct QuotaGate(Arc<Limiter>);

impl QuotaGate {
    /// A gate counting in `limiter` (which other endpoints may share).
    pub fn new(limiter: Arc<Limiter>) -> QuotaGate {
        QuotaGate(limiter)
    }
}

impl Gate for QuotaGate {
    fn enter(
        &self,
        parts: Option<&http::request::Parts>,
        runs_code: bool,
    ) -> Result<Entered, Turned> {
        let caller = parts
            .and_then(|p| p.extensions.get::<Arc<Caller>>())
            .ok_or(Turned::NoCaller)?;
        let held: Option<Box<dyn Send>> = match runs_code {
            true => {
                let permit = self
                    .0
                    .begin(caller, Instant::now())
                    .map_err(|e| Turned::Quota(e.to_string()))?;
                Some(Box::new(permit))
            }
            false => None,
        };
        Ok(Entered {
            caller: Arc::clone(&caller.speaks_as),
            held,
        })
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        let mut all = self
            .limiter
            .by_identity
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if let Some(s) = all.get_mut(&self.identity) {
            s.running = s.running.saturating_sub(1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::callers::{Quotas, Scopes};
    use std::time::Duration;

    fn caller(name: &str, concurrent: u32, per_minute: u32) -> Caller {
        Caller::new(
            name,
            Scopes::default(),
            Quotas {
                max_concurrent_runs: concurrent,
                runs_per_minute: per_minute,
            },
            crate::http::callers::policies_allowed(None),
        )
    }

    #[test]
    fn concurrency_is_per_identity_and_freed_by_dropping() {
        let l = Arc::new(Limiter::default());
        let (a, b) = (caller("a", 2, 100), caller("b", 2, 100));
        let t = Instant::now();
        let p1 = l.begin(&a, t).unwrap();
        let _p2 = l.begin(&a, t).unwrap();
        let e = l.begin(&a, t).unwrap_err();
        assert!(
            matches!(
                e,
                OverQuota::Concurrent {
                    running: 2,
                    max: 2,
                    ..
                }
            ),
            "{e}"
        );
        assert!(e.to_string().contains("max_concurrent_runs = 2"), "{e}");
        assert!(l.begin(&b, t).is_ok());
        drop(p1);
        assert!(l.begin(&a, t).is_ok());
    }

    #[test]
    fn the_rate_refills_evenly() {
        let l = Arc::new(Limiter::default());
        let a = caller("a", 100, 2);
        let t = Instant::now();
        drop(l.begin(&a, t).unwrap());
        drop(l.begin(&a, t).unwrap());
        let e = l.begin(&a, t).unwrap_err().to_string();
        assert!(
            e.contains("runs_per_minute = 2") && e.contains("try again in 30.0 s"),
            "{e}"
        );
        assert!(l.begin(&a, t + Duration::from_secs(20)).is_err());
        assert!(l.begin(&a, t + Duration::from_secs(31)).is_ok());
    }
}
