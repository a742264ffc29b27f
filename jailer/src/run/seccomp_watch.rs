//! The jail's seccomp listener. The filter hands every call it refuses
//! with `EPERM` to the jailer (`SECCOMP_RET_USER_NOTIF`, see
//! `pycell_seccomp::CompiledFilter::notifying`); the jailer answers each
//! with `EPERM`, as the filter alone would have, and counts it by
//! syscall: what the result's `seccomp` refusals say (docs/refusals.md).
//! Allowed calls never reach the jailer.
//!
//! A refused call waits for the jailer's answer, so a program that makes
//! refused calls in a loop could keep the jailer busy outside the jail's
//! CPU limit. After [`FREE_ANSWERS`] answers the jailer answers at most
//! one per [`THROTTLED_EVERY`]: the calls still fail with `EPERM` and are
//! still counted, they just wait (on the jail's own wall clock).
//!
//! The counts are what the jail did not hide: its own filters (which may
//! only refuse harder) can refuse a call before pycell's hands it over.

use std::collections::BTreeMap;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::time::{Duration, Instant};

use pycell_seccomp::SyscallNames;
use pycell_syscall as syscall;
use pycell_wire::report::{RefusedCall, SeccompRefused};

/// Refused calls answered for one jail as fast as they come.
pub(crate) const FREE_ANSWERS: u64 = 4096;

/// After those, at most one answer per this.
pub(crate) const THROTTLED_EVERY: Duration = Duration::from_millis(1);

/// Counts by syscall number.
pub(crate) type Counts = BTreeMap<i32, u64>;

pub(crate) struct SeccompWatch {
    listener: Option<OwnedFd>,
    names: SyscallNames,
    counts: Counts,
    answered: u64,
    /// Past [`FREE_ANSWERS`]: when the next call may be answered.
    resume_at: Option<Instant>,
    /// The listener broke while calls could still come: later ones fail
    /// with `ENOSYS`, uncounted.
    uncounted: bool,
}

impl SeccompWatch {
    pub fn new(listener: OwnedFd, names: SyscallNames) -> SeccompWatch {
        SeccompWatch {
            listener: Some(listener),
            names,
            counts: Counts::new(),
            answered: 0,
            resume_at: None,
            uncounted: false,
        }
    }

    /// The listener, while the jailer listens and may answer at `now`.
    pub fn fd(&self, now: Instant) -> Option<BorrowedFd<'_>> {
        if self.resume_at.is_some_and(|t| now < t) {
            return None;
        }
        self.listener.as_ref().map(AsFd::as_fd)
    }

    /// When a throttled listener may be read again.
    pub fn resume_at(&self) -> Option<Instant> {
        self.listener.as_ref().and(self.resume_at)
    }

    /// Answer the call waiting on the listener (poll said one is).
    pub fn answer(&mut self, now: Instant) {
        let Some(listener) = self.listener.as_ref() else {
            return;
        };
        match syscall::seccomp_notification(listener.as_fd()) {
            Ok(call) => {
                // A caller that died or was interrupted meanwhile is not
                // answered (an interrupted one asks again): not counted.
                if syscall::seccomp_answer_error(listener.as_fd(), call.id, libc::EPERM).is_ok() {
                    *self.counts.entry(call.nr).or_default() += 1;
                    self.answered += 1;
                }
                if self.answered >= FREE_ANSWERS {
                    self.resume_at = Some(now + THROTTLED_EVERY);
                }
            }
            Err(e) if matches!(e.raw_os_error(), Some(libc::ENOENT | libc::EINTR)) => {}
            Err(_) => {
                self.listener = None;
                self.uncounted = true;
            }
        }
    }

    /// Stop listening: no process uses the filter any more, so no call
    /// can come (its hang-up), or the listener broke. Counted calls stay.
    pub fn stop_listening(&mut self) {
        self.listener = None;
    }

    /// The counts so far, for [`SeccompWatch::refused_since`] later.
    pub fn counts(&self) -> Counts {
        self.counts.clone()
    }

    /// The calls refused since `before` (a snapshot of [`counts`]).
    pub fn refused_since(&self, before: &Counts) -> SeccompRefused {
        let named = |nr: i32| match u32::try_from(nr).ok().and_then(|n| self.names.name(n)) {
            Some(name) => name.to_string(),
            None => format!("syscall {nr}"),
        };
        refused(&self.counts, before, named, self.uncounted)
    }
}

/// The calls counted in `now` and not in `before`, named by `name`, by
/// name; `stopped`: the listener was closed (later calls went uncounted).
fn refused(
    now: &Counts,
    before: &Counts,
    name: impl Fn(i32) -> String,
    stopped: bool,
) -> SeccompRefused {
    let mut calls: Vec<RefusedCall> = now
        .iter()
        .filter_map(|(&nr, &n)| {
            let count = n - before.get(&nr).copied().unwrap_or(0);
            (count > 0).then(|| RefusedCall {
                syscall: name(nr),
                count,
            })
        })
        .collect();
    calls.sort_by(|a, b| a.syscall.cmp(&b.syscall));
    SeccompRefused {
        calls,
        uncounted: stopped,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_are_counted_since_a_snapshot_and_named() {
        let before = Counts::from([(165, 2)]);
        let now = Counts::from([(165, 5), (101, 1), (272, 0)]);
        let name = |nr: i32| match nr {
            165 => "mount".to_string(),
            _ => format!("syscall {nr}"),
        };
        let got = refused(&now, &before, name, false);
        assert_eq!(
            got.calls,
            [
                RefusedCall {
                    syscall: "mount".into(),
                    count: 3
                },
                RefusedCall {
                    syscall: "syscall 101".into(),
                    count: 1
                },
            ]
        );
        assert!(!got.uncounted);
        let none = refused(&now, &now, |n| n.to_string(), true);
        assert!(none.calls.is_empty() && none.uncounted);
    }
}
