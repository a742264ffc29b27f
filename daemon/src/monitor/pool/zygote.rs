//! A run pool's zygote (`zygotes = true`, the default): one warm jail of
//! the pool's policy whose python, its warm imports done, forks the pool's
//! members (`pycell_launch::zygote`). A member forked from it costs a
//! jailer and a jail's setup, not a python start and the imports, so a
//! pool refills in milliseconds under load.
//!
//! The zygote starts without blocking the monitor (its events are polled
//! with the members'); until it is ready, or when it cannot start (a
//! policy whose runs cannot come from a zygote: egress, tools), members
//! start cold as before. Its death kills the members it forked (they live
//! in its pid namespace); their jailers report that and are reaped like
//! any member's, and a new zygote starts after a backoff.

use std::os::fd::BorrowedFd;
use std::time::{Duration, Instant};

use pycell_deps::store::{EnvInUse, EnvStore};
use pycell_launch::launcher::{LaunchError, Launcher, PolicyChoice};
use pycell_launch::zygote::{StartingZygote, Zygote, ZygoteStep};
use pycell_wire::codes::FailureCode;

use super::{policy_env, PoolPlan, Retry, MAX_BACKOFF};

/// Where a pool's next member comes from.
pub(super) enum Source<'a> {
    /// A cold jail of its own (no zygote, or none ready).
    Cold,
    /// Forked from this zygote.
    Zygote(&'a Zygote),
    /// None now: the zygote is starting (its members follow at once).
    Wait,
}

enum State {
    /// None running; the next may start at `not_before`.
    Down,
    Starting(StartingZygote),
    Up(Zygote),
    /// Told to stop; kept until its jailer is reaped.
    Stopping(Stopping),
}

enum Stopping {
    Starting(StartingZygote),
    Up(Zygote),
}

/// A pool's zygote, through its life.
pub(super) struct Keeper {
    /// Runs it may fork at once (its uid slots); 0: this pool has none.
    slots: usize,
    state: State,
    /// The env of the policy's dependencies, held in use while a zygote
    /// (started or stopping) has it mounted.
    env: Option<EnvInUse>,
    not_before: Instant,
    backoff: Duration,
}

impl std::fmt::Debug for Keeper {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Keeper")
            .field("slots", &self.slots)
            .field("pid", &self.pid())
            .finish()
    }
}

impl Keeper {
    pub(super) fn new(slots: usize) -> Keeper {
        Keeper {
            slots,
            state: State::Down,
            env: None,
            not_before: Instant::now(),
            backoff: Duration::from_secs(1),
        }
    }

    /// Where the pool's next member comes from.
    pub(super) fn source(&self) -> Source<'_> {
        match &self.state {
            State::Up(z) => Source::Zygote(z),
            State::Starting(_) => Source::Wait,
            State::Down | State::Stopping(_) => Source::Cold,
        }
    }

    /// When a zygote that is down will start, if this pool has one.
    pub(super) fn due(&self) -> Option<Instant> {
        let down = self.slots > 0 && matches!(self.state, State::Down);
        down.then_some(self.not_before)
    }

    /// Notice a zygote whose python is gone (stopped, a new one after a
    /// backoff); start one when it is down and due.
    pub(super) fn tend(&mut self, launcher: &Launcher, store: Option<&EnvStore>, plan: &PoolPlan) {
        if self.slots == 0 {
            return;
        }
        if let State::Up(z) = &self.state {
            if !z.channel_open() {
                tracing::warn!(
                    policy = %plan.policy,
                    "the zygote of policy {:?} is gone; a new one starts in {} s",
                    plan.policy,
                    self.backoff.as_secs()
                );
                self.back_off();
                self.stop();
            }
        }
        if matches!(self.state, State::Down) && Instant::now() >= self.not_before {
            self.start(launcher, store, plan);
        }
    }

    fn start(&mut self, launcher: &Launcher, store: Option<&EnvStore>, plan: &PoolPlan) {
        match spawn(launcher, store, plan, self.slots) {
            Ok((starting, env)) => {
                self.state = State::Starting(starting);
                self.env = env;
            }
            Err(NotStarted::Never(why)) => {
                tracing::info!(
                    policy = %plan.policy,
                    "policy {:?} gets no zygote ({why}); its warm jails start cold",
                    plan.policy
                );
                self.slots = 0;
            }
            Err(NotStarted::Later(Retry { after, why })) => {
                if let Some(why) = why {
                    tracing::warn!(
                        policy = %plan.policy,
                        "the zygote of policy {:?} did not start: {why}; its warm jails start cold",
                        plan.policy
                    );
                }
                self.not_before = Instant::now() + after;
            }
        }
    }

    /// The starting zygote's event stream, with its jailer's pid.
    pub(super) fn starting(&self) -> Option<(i32, BorrowedFd<'_>)> {
        match &self.state {
            State::Starting(z) => Some((z.jailer_pid() as i32, z.events())),
            _ => None,
        }
    }

    /// The starting zygote's events are readable. False if `pid` is not
    /// its jailer's.
    pub(super) fn event(&mut self, pid: i32, policy: &str) -> bool {
        if !matches!(&self.state, State::Starting(z) if z.jailer_pid() as i32 == pid) {
            return false;
        }
        let State::Starting(starting) = std::mem::replace(&mut self.state, State::Down) else {
            unreachable!("matched above");
        };
        self.state = match starting.step() {
            Ok(ZygoteStep::Starting(z)) => State::Starting(z),
            Ok(ZygoteStep::Ready(z)) => {
                tracing::info!(policy, "the zygote of policy {policy:?} is ready");
                self.backoff = Duration::from_secs(1);
                State::Up(z)
            }
            Err((mut z, e)) => {
                tracing::warn!(
                    policy,
                    "the zygote of policy {policy:?} failed: {}; trying again in {} s",
                    e.failure().message,
                    self.backoff.as_secs()
                );
                self.back_off();
                z.stopper().stop();
                State::Stopping(Stopping::Starting(*z))
            }
        };
        true
    }

    fn back_off(&mut self) {
        self.not_before = Instant::now() + self.backoff;
        self.backoff = (self.backoff * 2).min(MAX_BACKOFF);
    }

    /// Ask it to stop (its members die with it); reaped later.
    pub(super) fn stop(&mut self) {
        self.state = match std::mem::replace(&mut self.state, State::Down) {
            State::Starting(mut z) => {
                z.stopper().stop();
                State::Stopping(Stopping::Starting(z))
            }
            State::Up(mut z) => {
                z.stopper().stop();
                State::Stopping(Stopping::Up(z))
            }
            other => other,
        };
    }

    /// A zygote told to stop and still there after the grace: SIGKILL.
    pub(super) fn escalate(&mut self) {
        let _ = match &mut self.state {
            State::Stopping(Stopping::Starting(z)) => z.stopper().escalate(),
            State::Stopping(Stopping::Up(z)) => z.stopper().escalate(),
            _ => None,
        };
    }

    /// Its jailer's pid, while it has one.
    pub(super) fn pid(&self) -> Option<i32> {
        let pid = match &self.state {
            State::Down => return None,
            State::Starting(z) | State::Stopping(Stopping::Starting(z)) => z.jailer_pid(),
            State::Up(z) | State::Stopping(Stopping::Up(z)) => z.jailer_pid(),
        };
        Some(pid as i32)
    }

    /// A child of the monitor was reaped: true if it was the zygote's
    /// jailer (then forgotten, without a signal).
    pub(super) fn exited(&mut self, pid: i32, policy: &str) -> bool {
        if self.pid() != Some(pid) {
            return false;
        }
        match std::mem::replace(&mut self.state, State::Down) {
            State::Starting(z) | State::Stopping(Stopping::Starting(z)) => z.forget_reaped(),
            State::Up(z) => {
                tracing::warn!(
                    policy,
                    "the zygote of policy {policy:?} ended; a new one starts in {} s",
                    self.backoff.as_secs()
                );
                self.back_off();
                z.forget_reaped();
            }
            State::Stopping(Stopping::Up(z)) => z.forget_reaped(),
            State::Down => {}
        }
        self.env = None;
        true
    }
}

/// Why a zygote did not start.
enum NotStarted {
    /// The policy's runs cannot come from a zygote.
    Never(String),
    Later(Retry),
}

/// Start the zygote of `plan`'s policy, with its env (from the store).
fn spawn(
    launcher: &Launcher,
    store: Option<&EnvStore>,
    plan: &PoolPlan,
    slots: usize,
) -> Result<(StartingZygote, Option<EnvInUse>), NotStarted> {
    let fail = |e: LaunchError| {
        let f = e.failure();
        match f.code {
            FailureCode::InvalidPolicy => NotStarted::Never(f.message),
            _ => NotStarted::Later(Retry {
                after: MAX_BACKOFF,
                why: Some(f.message),
            }),
        }
    };
    let policy = launcher
        .load_policy(PolicyChoice::Name(&plan.policy))
        .map_err(fail)?;
    let env = policy_env(launcher, store, &policy)
        .map_err(NotStarted::Later)?
        .map(|(env, _)| env);
    let starting = launcher
        .spawn_zygote(&policy, env.as_ref().map(|e| e.dir.clone()), slots)
        .map_err(fail)?;
    Ok((starting, env))
}
