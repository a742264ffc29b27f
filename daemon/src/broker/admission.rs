//! Admission: which runs may start now, which wait, and in what order.
//!
//! A run starts at once if it fits: under `max_concurrent_runs`, under its
//! uid's `max_runs_per_uid`, and with the memory limits of all admitted runs
//! together within the memory budget. Otherwise it waits in one bounded
//! queue, fair across uids: whenever something frees up, waiting uids take
//! turns (round-robin), each uid's own runs in arrival order. A run is
//! refused (`busy`) only when the queue is full or its wait runs out, and at
//! once if it could never fit (more memory than the whole budget).
//!
//! [`Queue`] is the pure bookkeeping (unit-tested here); [`Admission`] is
//! the broker's async front: it parks a waiting connection until its ticket
//! is admitted, and gives the slot back when the run's guard is dropped,
//! whatever way the connection ends.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use tokio::sync::oneshot;

use crate::broker::principal::Principal;

/// How many runs may go and wait; from the configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdmissionLimits {
    pub max_running: usize,
    pub max_running_per_uid: usize,
    /// Sum of admitted runs' memory limits, in bytes.
    pub memory_budget: u64,
    pub max_queued: usize,
}

/// One run asking to start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ask {
    /// A uid, or an identity a trusted front end speaks for.
    pub who: Principal,
    /// The run's memory limit, in bytes.
    pub memory: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    Admitted,
    /// Waiting, with this ticket.
    Queued(u64),
    Refused(Refusal),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// More memory than the whole budget: it would wait forever.
    NeverFits,
    QueueFull,
}

#[derive(Debug)]
struct Waiter {
    ticket: u64,
    ask: Ask,
}

/// Who runs and who waits.
#[derive(Debug)]
pub struct Queue {
    limits: AdmissionLimits,
    running: usize,
    running_per_uid: HashMap<Principal, usize>,
    memory: u64,
    waiting: HashMap<Principal, VecDeque<Waiter>>,
    /// Uids with waiting runs, in the order they get their next turn.
    turns: VecDeque<Principal>,
    queued: usize,
    next_ticket: u64,
}

impl Queue {
    pub fn new(limits: AdmissionLimits) -> Queue {
        Queue {
            limits,
            running: 0,
            running_per_uid: HashMap::new(),
            memory: 0,
            waiting: HashMap::new(),
            turns: VecDeque::new(),
            queued: 0,
            next_ticket: 1,
        }
    }

    pub fn running(&self) -> usize {
        self.running
    }

    pub fn queued(&self) -> usize {
        self.queued
    }

    pub fn memory_admitted(&self) -> u64 {
        self.memory
    }

    fn fits(&self, ask: &Ask) -> bool {
        let of_uid = self.running_per_uid.get(&ask.who).copied().unwrap_or(0);
        self.running < self.limits.max_running
            && of_uid < self.limits.max_running_per_uid
            && self.memory.saturating_add(ask.memory) <= self.limits.memory_budget
    }

    fn take(&mut self, ask: &Ask) {
        self.running += 1;
        *self.running_per_uid.entry(ask.who.clone()).or_insert(0) += 1;
        self.memory += ask.memory;
    }

    /// A new run: admitted now, queued, or refused. A uid that already has
    /// runs waiting queues behind them.
    pub fn request(&mut self, ask: &Ask) -> Decision {
        if ask.memory > self.limits.memory_budget {
            return Decision::Refused(Refusal::NeverFits);
        }
        if !self.waiting.contains_key(&ask.who) && self.fits(ask) {
            self.take(ask);
            return Decision::Admitted;
        }
        if self.queued >= self.limits.max_queued {
            return Decision::Refused(Refusal::QueueFull);
        }
        let ticket = self.next_ticket;
        self.next_ticket += 1;
        self.waiting
            .entry(ask.who.clone())
            .or_insert_with(|| {
                self.turns.push_back(ask.who.clone());
                VecDeque::new()
            })
            .push_back(Waiter {
                ticket,
                ask: ask.clone(),
            });
        self.queued += 1;
        Decision::Queued(ticket)
    }

    /// An admitted run ended; returns the tickets admitted in its place.
    pub fn release(&mut self, ask: &Ask) -> Vec<u64> {
        self.running = self.running.saturating_sub(1);
        if let Some(n) = self.running_per_uid.get_mut(&ask.who) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                self.running_per_uid.remove(&ask.who);
            }
        }
        self.memory = self.memory.saturating_sub(ask.memory);
        self.grant()
    }

    /// Admit waiting runs, uids taking turns, until nothing more fits.
    fn grant(&mut self) -> Vec<u64> {
        let mut admitted = Vec::new();
        let mut passed = 0;
        while passed < self.turns.len() {
            let Some(uid) = self.turns.pop_front() else {
                break;
            };
            let head = self
                .waiting
                .get(&uid)
                .and_then(|q| q.front())
                .map(|w| w.ask.clone());
            match head {
                Some(ask) if self.fits(&ask) => {
                    let w = self.pop_waiter(&uid);
                    self.take(&ask);
                    admitted.extend(w.map(|w| w.ticket));
                    passed = 0;
                }
                _ => {
                    self.turns.push_back(uid);
                    passed += 1;
                }
            }
        }
        admitted
    }

    /// Take `uid`'s first waiter; its next turn comes after every other
    /// waiting uid's.
    fn pop_waiter(&mut self, uid: &Principal) -> Option<Waiter> {
        let q = self.waiting.get_mut(uid)?;
        let w = q.pop_front();
        if q.is_empty() {
            self.waiting.remove(uid);
        } else {
            self.turns.push_back(uid.clone());
        }
        self.queued -= usize::from(w.is_some());
        w
    }

    /// A waiting run gave up (its wait ran out, its client left). False if
    /// it is not waiting (it was admitted meanwhile).
    pub fn withdraw(&mut self, ticket: u64) -> bool {
        let Some((uid, i)) = self.find(ticket) else {
            return false;
        };
        let q = self.waiting.get_mut(&uid).expect("found above");
        q.remove(i);
        if q.is_empty() {
            self.waiting.remove(&uid);
            self.turns.retain(|u| *u != uid);
        }
        self.queued -= 1;
        true
    }

    fn find(&self, ticket: u64) -> Option<(Principal, usize)> {
        self.waiting.iter().find_map(|(uid, q)| {
            q.iter()
                .position(|w| w.ticket == ticket)
                .map(|i| (uid.clone(), i))
        })
    }

    /// 1 for the run that goes next, and so on: the order in which the
    /// queue would admit its waiters if each freed slot fitted them.
    pub fn position(&self, ticket: u64) -> Option<usize> {
        let (uid, index) = self.find(ticket)?;
        let own_turn = self.turns.iter().position(|u| *u == uid)?;
        // Every uid (this one too) gets `index` turns before this waiter's
        // (or fewer if it has fewer waiters), those ahead in the turn order
        // one more.
        let ahead: usize = self
            .turns
            .iter()
            .enumerate()
            .map(|(t, u)| {
                let n = self.waiting.get(u).map_or(0, VecDeque::len);
                let rounds = if t < own_turn { index + 1 } else { index };
                n.min(rounds)
            })
            .sum();
        Some(ahead + 1)
    }
}

/// The broker's admission: [`Queue`] behind a lock, with a way to wait.
#[derive(Debug)]
pub struct Admission {
    inner: Mutex<Inner>,
}

#[derive(Debug)]
struct Inner {
    queue: Queue,
    wakers: HashMap<u64, oneshot::Sender<()>>,
}

/// Holds an admitted run's place; dropping it frees the place and admits
/// whoever is next.
#[derive(Debug)]
pub struct Slot {
    admission: Arc<Admission>,
    ask: Ask,
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.admission.release(&self.ask);
    }
}

/// A run waiting in the queue. Dropping it (the client left, the wait ran
/// out) withdraws it, or, if it was admitted meanwhile, frees that place.
#[derive(Debug)]
pub struct Waiting {
    admission: Arc<Admission>,
    ask: Ask,
    ticket: u64,
    admitted: Option<oneshot::Receiver<()>>,
}

/// What [`Admission::request`] gives.
#[derive(Debug)]
pub enum Entry {
    Admitted(Slot),
    Waiting(Waiting),
    Refused(Refusal),
}

impl Admission {
    pub fn new(limits: AdmissionLimits) -> Arc<Admission> {
        Arc::new(Admission {
            inner: Mutex::new(Inner {
                queue: Queue::new(limits),
                wakers: HashMap::new(),
            }),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // The state is plain counters; a panic elsewhere cannot leave it
        // half-updated in a way worse than refusing everything.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn request(self: &Arc<Self>, ask: Ask) -> Entry {
        let mut inner = self.lock();
        match inner.queue.request(&ask) {
            Decision::Admitted => Entry::Admitted(Slot {
                admission: Arc::clone(self),
                ask,
            }),
            Decision::Queued(ticket) => {
                let (tx, rx) = oneshot::channel();
                inner.wakers.insert(ticket, tx);
                Entry::Waiting(Waiting {
                    admission: Arc::clone(self),
                    ask,
                    ticket,
                    admitted: Some(rx),
                })
            }
            Decision::Refused(r) => Entry::Refused(r),
        }
    }

    fn release(&self, ask: &Ask) {
        let mut inner = self.lock();
        for ticket in inner.queue.release(ask) {
            if let Some(tx) = inner.wakers.remove(&ticket) {
                // A waiter that is gone frees its place in its own Drop.
                let _ = tx.send(());
            }
        }
    }

    /// (running, queued, memory admitted), for `info`.
    pub fn status(&self) -> (usize, usize, u64) {
        let inner = self.lock();
        let q = &inner.queue;
        (q.running(), q.queued(), q.memory_admitted())
    }
}

impl Waiting {
    /// Place in the queue (1 = next), None once admitted.
    pub fn position(&self) -> Option<usize> {
        self.admission.lock().queue.position(self.ticket)
    }

    /// Wait until admitted. Cancel-safe: dropping the future keeps the
    /// place in the queue (until this `Waiting` is dropped).
    pub async fn admitted(&mut self) {
        if let Some(rx) = self.admitted.as_mut() {
            let _ = rx.await;
            self.admitted = None;
        }
    }

    /// The place, once [`Waiting::admitted`] returned.
    pub fn into_slot(mut self) -> Slot {
        self.admitted = None;
        let slot = Slot {
            admission: Arc::clone(&self.admission),
            ask: self.ask.clone(),
        };
        self.ticket = 0;
        slot
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        if self.ticket == 0 {
            return;
        }
        let mut inner = self.admission.lock();
        inner.wakers.remove(&self.ticket);
        if !inner.queue.withdraw(self.ticket) {
            // Admitted just now, but nobody will use it.
            drop(inner);
            self.admission.release(&self.ask);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    const MIB: u64 = 1 << 20;

    fn queue(running: usize, per_uid: usize, budget: u64, queued: usize) -> Queue {
        Queue::new(AdmissionLimits {
            max_running: running,
            max_running_per_uid: per_uid,
            memory_budget: budget,
            max_queued: queued,
        })
    }

    fn ask(uid: u32) -> Ask {
        Ask {
            who: Principal::Uid(uid),
            memory: 100 * MIB,
        }
    }

    fn ticket(d: Decision) -> u64 {
        match d {
            Decision::Queued(t) => t,
            other => panic!("expected queued, got {other:?}"),
        }
    }

    #[test]
    fn runs_start_while_they_fit_then_wait_then_are_refused() {
        let mut q = queue(2, 2, 10_000 * MIB, 2);
        assert_eq!(q.request(&ask(1)), Decision::Admitted);
        assert_eq!(q.request(&ask(1)), Decision::Admitted);
        let t1 = ticket(q.request(&ask(1)));
        let t2 = ticket(q.request(&ask(2)));
        assert_eq!(q.request(&ask(3)), Decision::Refused(Refusal::QueueFull));
        assert_eq!((q.running(), q.queued()), (2, 2));
        // uid 1 had a turn first: its waiter goes first.
        assert_eq!(q.release(&ask(1)), vec![t1]);
        assert_eq!(q.release(&ask(1)), vec![t2]);
        assert_eq!((q.running(), q.queued()), (2, 0));
    }

    #[test]
    fn uids_take_turns() {
        let mut q = queue(1, 1, 10_000 * MIB, 100);
        assert_eq!(q.request(&ask(1)), Decision::Admitted);
        let a: Vec<u64> = (0..3).map(|_| ticket(q.request(&ask(1)))).collect();
        let b: Vec<u64> = (0..2).map(|_| ticket(q.request(&ask(2)))).collect();
        let c = ticket(q.request(&ask(3)));
        // Positions: a0 b0 c a1 b1 a2.
        let pos = |t| q.position(t).unwrap();
        assert_eq!(
            [
                pos(a[0]),
                pos(b[0]),
                pos(c),
                pos(a[1]),
                pos(b[1]),
                pos(a[2])
            ],
            [1, 2, 3, 4, 5, 6]
        );
        let mut order = Vec::new();
        let mut last = ask(1);
        for _ in 0..6 {
            let next = q.release(&last);
            assert_eq!(next.len(), 1);
            order.push(next[0]);
            last = if a.contains(&next[0]) {
                ask(1)
            } else if b.contains(&next[0]) {
                ask(2)
            } else {
                ask(3)
            };
        }
        assert_eq!(order, vec![a[0], b[0], c, a[1], b[1], a[2]]);
    }

    #[test]
    fn identities_of_a_front_end_have_quotas_of_their_own() {
        let mut q = queue(4, 1, 10_000 * MIB, 100);
        let of = |name: &str| Ask {
            who: Principal::Identity {
                front_end: 998,
                name: name.into(),
            },
            memory: 100 * MIB,
        };
        assert_eq!(q.request(&of("alice")), Decision::Admitted);
        let t = ticket(q.request(&of("alice")));
        assert_eq!(q.request(&of("bob")), Decision::Admitted);
        // The front end's own uid is another principal still.
        assert_eq!(q.request(&ask(998)), Decision::Admitted);
        assert_eq!(q.release(&of("bob")), Vec::<u64>::new());
        assert_eq!(q.release(&of("alice")), vec![t]);
    }

    #[test]
    fn a_uid_at_its_quota_waits_while_others_start() {
        let mut q = queue(4, 1, 10_000 * MIB, 100);
        assert_eq!(q.request(&ask(1)), Decision::Admitted);
        let t = ticket(q.request(&ask(1)));
        assert_eq!(q.request(&ask(2)), Decision::Admitted);
        assert_eq!(q.position(t), Some(1));
        assert_eq!(q.release(&ask(2)), Vec::<u64>::new());
        assert_eq!(q.release(&ask(1)), vec![t]);
    }

    #[test]
    fn memory_is_budgeted() {
        let mut q = queue(10, 10, 250 * MIB, 100);
        assert_eq!(q.request(&ask(1)), Decision::Admitted);
        assert_eq!(q.request(&ask(2)), Decision::Admitted);
        let t = ticket(q.request(&ask(3)));
        assert_eq!(q.memory_admitted(), 200 * MIB);
        let huge = Ask {
            who: Principal::Uid(4),
            memory: 251 * MIB,
        };
        assert_eq!(q.request(&huge), Decision::Refused(Refusal::NeverFits));
        assert_eq!(q.release(&ask(1)), vec![t]);
    }

    #[test]
    fn withdrawn_waiters_leave_no_trace() {
        let mut q = queue(1, 1, 10_000 * MIB, 100);
        assert_eq!(q.request(&ask(1)), Decision::Admitted);
        let t1 = ticket(q.request(&ask(2)));
        let t2 = ticket(q.request(&ask(2)));
        let t3 = ticket(q.request(&ask(3)));
        assert!(q.withdraw(t1));
        assert!(!q.withdraw(t1));
        assert_eq!((q.position(t2), q.position(t3)), (Some(1), Some(2)));
        assert!(q.withdraw(t2));
        assert_eq!(q.position(t3), Some(1));
        assert_eq!(q.release(&ask(1)), vec![t3]);
        assert_eq!(q.queued(), 0);
    }

    #[tokio::test]
    async fn a_dropped_slot_wakes_the_next_and_a_dropped_waiter_gives_its_place_back() {
        let a = Admission::new(AdmissionLimits {
            max_running: 1,
            max_running_per_uid: 1,
            memory_budget: u64::MAX,
            max_queued: 10,
        });
        let Entry::Admitted(first) = a.request(ask(1)) else {
            panic!("first run must start")
        };
        let Entry::Waiting(mut second) = a.request(ask(2)) else {
            panic!("second run must wait")
        };
        assert_eq!(second.position(), Some(1));
        drop(first);
        tokio::time::timeout(Duration::from_secs(1), second.admitted())
            .await
            .unwrap();
        // Admitted but dropped before use: the place is free again.
        drop(second);
        assert_eq!(a.status(), (0, 0, 0));
        assert!(matches!(a.request(ask(3)), Entry::Admitted(_)));
    }
}
