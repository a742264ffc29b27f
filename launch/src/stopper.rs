//! The one stop escalation for every process pycell starts and must be
//! able to end: a run's or a session's jailer, a warm-pool member, a
//! zygote, an env builder. Asked to stop (or past its deadline) it gets
//! SIGTERM once; still there after its grace, SIGKILL. Its owner calls
//! [`Stopper::escalate`] from its loop (or its wait) until it has reaped
//! the process, then [`Stopper::reaped`], after which nothing is sent: a
//! pid is never signalled once it may belong to someone else.

use std::time::Duration;

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use tokio::time::Instant;

/// What [`Stopper::escalate`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Escalation {
    /// The deadline passed: SIGTERM.
    Stopped,
    /// SIGTERM was ignored for the grace: SIGKILL.
    Killed,
}

/// One process's stop escalation.
#[derive(Debug)]
pub struct Stopper {
    /// 0 once reaped (or if it never had a pid).
    pid: i32,
    /// When it is told to stop unasked; `None`: only when asked.
    deadline: Option<Instant>,
    grace: Duration,
    told: Option<Instant>,
    killed: bool,
}

impl Stopper {
    /// For the process `pid`, told to stop at `deadline` if not asked
    /// before, killed `grace` after it was told.
    pub fn new(pid: u32, deadline: Option<Instant>, grace: Duration) -> Stopper {
        Stopper {
            pid: i32::try_from(pid).unwrap_or(0),
            deadline,
            grace,
            told: None,
            killed: false,
        }
    }

    /// Ask it to stop (SIGTERM, once); its grace starts now. True if it
    /// was told just now.
    pub fn stop(&mut self) -> bool {
        if self.told.is_some() || self.pid <= 0 {
            return false;
        }
        let _ = kill(Pid::from_raw(self.pid), Signal::SIGTERM);
        self.told = Some(Instant::now());
        true
    }

    /// Whether it was told to stop.
    pub fn told(&self) -> bool {
        self.told.is_some()
    }

    /// Stop it at its deadline, kill it after its grace: what was done.
    pub fn escalate(&mut self) -> Option<Escalation> {
        if self.pid <= 0 || self.killed {
            return None;
        }
        let step = due(Instant::now(), self.deadline, self.told, self.grace)?;
        match step {
            Escalation::Stopped => {
                self.stop();
            }
            Escalation::Killed => {
                let _ = kill(Pid::from_raw(self.pid), Signal::SIGKILL);
                self.killed = true;
            }
        }
        Some(step)
    }

    /// When [`Stopper::escalate`] has something to do next (far off if
    /// nothing is due).
    pub fn next_due(&self) -> Instant {
        let idle = Instant::now() + Duration::from_secs(3600);
        match (self.told, self.deadline) {
            _ if self.killed || self.pid <= 0 => idle,
            (Some(t), _) => t + self.grace,
            (None, Some(d)) => d,
            (None, None) => idle,
        }
    }

    /// It was reaped: from now on its pid is not ours to signal.
    pub fn reaped(&mut self) {
        self.pid = 0;
    }

    /// Whether it was reaped (or never had a pid): nothing to stop, wait
    /// for or signal.
    pub fn is_reaped(&self) -> bool {
        self.pid <= 0
    }
}

/// What is due at `now` for a process with `deadline` that was told to
/// stop at `told` (pure, for tests).
fn due(
    now: Instant,
    deadline: Option<Instant>,
    told: Option<Instant>,
    grace: Duration,
) -> Option<Escalation> {
    match told {
        None if deadline.is_some_and(|d| now >= d) => Some(Escalation::Stopped),
        Some(t) if now >= t + grace => Some(Escalation::Killed),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_process_is_stopped_at_its_deadline_and_killed_after_its_grace() {
        let t0 = Instant::now();
        let deadline = Some(t0 + Duration::from_secs(10));
        let grace = Duration::from_secs(5);
        assert_eq!(due(t0, deadline, None, grace), None);
        assert_eq!(
            due(t0 + Duration::from_secs(10), deadline, None, grace),
            Some(Escalation::Stopped)
        );
        // Told to stop (a cancel) before its deadline: killed after the
        // grace, whatever the deadline.
        let told = t0 + Duration::from_secs(1);
        assert_eq!(
            due(told + Duration::from_secs(4), deadline, Some(told), grace),
            None
        );
        assert_eq!(
            due(told + grace, deadline, Some(told), grace),
            Some(Escalation::Killed)
        );
        // No deadline: only a stop that was asked for escalates.
        assert_eq!(
            due(t0 + Duration::from_secs(1 << 20), None, None, grace),
            None
        );
        assert_eq!(
            due(told + grace, None, Some(told), grace),
            Some(Escalation::Killed)
        );
    }

    #[test]
    fn a_reaped_process_is_never_signalled() {
        // pid 0 would signal our own process group: a reaped stopper (and
        // one without a pid) sends nothing.
        let mut s = Stopper::new(0, Some(Instant::now()), Duration::ZERO);
        assert!(!s.stop());
        assert_eq!(s.escalate(), None);
        let mut s = Stopper::new(u32::MAX, Some(Instant::now()), Duration::ZERO);
        assert!(!s.stop(), "a pid that is no i32 is no pid");
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let mut s = Stopper::new(child.id(), None, Duration::ZERO);
        assert!(s.stop());
        assert!(!s.stop(), "told once");
        let _ = child.wait();
        s.reaped();
        assert_eq!(s.escalate(), None);
    }
}
