//! The warm pool, in the monitor: for each policy named in `warm_pools`,
//! a few jails built ahead of any request, their python started on
//! pycell's runner with the policy's `[warm] imports` imported, each waiting
//! for one run (see `pycell_runner`). A run whose jail would be
//! exactly a member's (same policy, env, limits: [`runner::fits`]) takes
//! it; anything else, or an empty pool, goes cold. A member serves one run
//! and dies with it; refills start at once (backing off when members fail);
//! members idle for `warm_idle` are retired and replaced. Pools named in
//! `session_pools` keep session jails the same way (see
//! `pycell_runner::session`), each taken whole by one `session_start`.
//!
//! A run pool's members are forked from its zygote when it has one
//! (`zygote.rs`), else started cold.
//!
//! Memory: every member's memory limit, and each zygote's, is set aside
//! from the broker's admission budget ([`plan`] caps the pools at half of
//! it), so the budget holds for runs, members and zygotes together.

mod zygote;

use std::collections::HashMap;
use std::os::fd::{AsFd, BorrowedFd};
use std::time::{Duration, Instant};

use pycell_deps::{self as deps, store::EnvInUse, store::EnvStore};
use pycell_launch::fork_server::ForkServer;
use pycell_launch::launcher::{ForkedLaunch, Launcher, PolicyChoice};
use pycell_launch::resolve::Extras;
use pycell_launch::stopper::Stopper;
use pycell_launch::supervisor::PATIENCE;
use pycell_policy::Policy;
use pycell_protocol::info::WarmPoolStatus;
use pycell_protocol::result::{CacheOutcome, EnvReport};
use pycell_runner::{self as runner, Work};
use pycell_wire::events::{read_event, Event};
use pycell_wire::spec::JailSpec;

use crate::config::Config;

/// Longest wait between attempts to warm a pool whose members fail.
const MAX_BACKOFF: Duration = Duration::from_secs(60);
/// How often a pool whose env is not built yet looks again.
const ENV_RETRY: Duration = Duration::from_secs(30);
/// After a member is taken, a pool that still has a ready one waits this
/// long before it starts a new one, or until no run is going: building a
/// jail takes both cores of a small host for a moment, which the run just
/// started should not share. An empty pool refills at once.
const REFILL_QUIET: Duration = Duration::from_millis(25);

/// One pool as configured and affordable: its policy, its size, and the
/// memory each member may use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolPlan {
    pub policy: String,
    pub members: usize,
    pub member_memory: u64,
    /// Session jails (`session_pools`), not run jails (`warm_pools`).
    pub sessions: bool,
    /// Runs its zygote may fork at once (the members and the runs they
    /// become); 0 for a pool without a zygote.
    pub zygote_slots: usize,
}

/// The pools `config` asks for, cut so that their members' memory takes at
/// most half of `memory_budget` (in the order of their names); a
/// policy that does not load gets no pool, and the reason is returned.
pub fn plan(config: &Config) -> (Vec<PoolPlan>, Vec<String>) {
    let mut warnings = Vec::new();
    let mut plans = Vec::new();
    let mut left = config.memory_budget / 2;
    let runs = config.warm_pools.iter().map(|(n, w)| (n, *w, false));
    let sessions = config.session_pools.iter().map(|(n, w)| (n, *w, true));
    for (name, wanted, for_sessions) in runs.chain(sessions) {
        let key = if for_sessions {
            "session_pools"
        } else {
            "warm_pools"
        };
        let memory = match pool_memory(name, config) {
            Ok(memory) => memory,
            Err(e) => {
                warnings.push(format!("{key}: policy {name:?} gets no pool: {e}"));
                continue;
            }
        };
        // A run pool's zygote takes a member's memory of its own.
        let zygote = usize::from(config.zygotes && !for_sessions);
        let affordable = usize::try_from(left / memory.max(1)).unwrap_or(usize::MAX);
        let members = wanted.min(affordable.saturating_sub(zygote));
        if members < wanted {
            warnings.push(format!(
                "{key}: policy {name:?} gets {members} members, not {wanted}: members{} may take at most half of memory_budget",
                if zygote == 1 { " and its zygote" } else { "" }
            ));
        }
        if members > 0 {
            left -= (members + zygote) as u64 * memory;
            plans.push(PoolPlan {
                policy: name.clone(),
                members,
                member_memory: memory,
                sessions: for_sessions,
                zygote_slots: zygote_slots(zygote == 1, members, config.max_concurrent_runs),
            });
        }
    }
    (plans, warnings)
}

/// The memory limit of a member of `name`'s pool, or why it can have
/// none (it does not load, or it serves stdio only: no run would take it).
fn pool_memory(name: &str, config: &Config) -> Result<u64, NoPool> {
    let policy = pycell_launch::resolve::load_policy_by_name(name, &config.policy_dir)?;
    if let Some(problem) = policy.purpose_problem(false) {
        return Err(NoPool::NotForRuns(problem));
    }
    let limits = pycell_launch::resolve::effective_limits(&policy, &Default::default())?;
    Ok(limits.memory.get())
}

/// Why a policy named in the configuration gets no pool.
#[derive(Debug, thiserror::Error)]
enum NoPool {
    #[error(transparent)]
    Policy(#[from] pycell_launch::resolve::ResolveError),
    #[error("{0}")]
    NotForRuns(String),
}

/// A zygote's slots: its members, and the runs they become (at most
/// `max_concurrent_runs` go at once).
fn zygote_slots(zygote: bool, members: usize, max_concurrent_runs: usize) -> usize {
    match zygote {
        true => (members + max_concurrent_runs).min(pycell_wire::spec::MAX_ZYGOTE_SLOTS),
        false => 0,
    }
}

/// The memory every member (and zygote) of `plans` may use together.
pub fn reserved_memory(plans: &[PoolPlan]) -> u64 {
    plans
        .iter()
        .map(|p| (p.members + usize::from(p.zygote_slots > 0)) as u64 * p.member_memory)
        .sum()
}

/// A warm jail.
#[derive(Debug)]
struct Member {
    spec: JailSpec,
    launched: ForkedLaunch,
    env: Option<(EnvInUse, EnvReport)>,
    state: State,
    /// Its jailer's stop (only when asked; killed after the grace).
    stopper: Stopper,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum State {
    WarmingUp,
    Ready {
        since: Instant,
    },
    /// Told to stop; kept (with its uid lease) until its jailer is reaped.
    Stopping,
}

/// A member handed to a run: what the monitor keeps of it, and what the
/// broker gets.
#[derive(Debug)]
pub struct Taken {
    pub launched: ForkedLaunch,
    pub env: Option<(EnvInUse, EnvReport)>,
}

/// One policy's pool.
#[derive(Debug)]
struct Pool {
    plan: PoolPlan,
    /// By jailer pid.
    members: HashMap<i32, Member>,
    /// No new member before this (after failures, or while its env is
    /// not built).
    not_before: Instant,
    backoff: Duration,
    /// Its members come from here when it is up.
    zygote: zygote::Keeper,
    /// Short, but no member can start before something changes (its
    /// zygote starts, or a slot of it frees when a run ends): refill
    /// tries again on the monitor's next turn, not on a timer.
    stalled: bool,
}

#[derive(Debug)]
pub struct Pools {
    pools: Vec<Pool>,
    idle_limit: Duration,
    /// When a member was last handed a run.
    last_take: Option<Instant>,
}

impl Pools {
    pub fn new(plans: Vec<PoolPlan>, idle_limit: Duration) -> Pools {
        let now = Instant::now();
        Pools {
            pools: plans
                .into_iter()
                .map(|plan| Pool {
                    zygote: zygote::Keeper::new(plan.zygote_slots),
                    plan,
                    members: HashMap::new(),
                    not_before: now,
                    backoff: Duration::from_secs(1),
                    stalled: false,
                })
                .collect(),
            idle_limit,
            last_take: None,
        }
    }

    /// Members (ready, warming up or stopping) and zygotes.
    pub fn len(&self) -> usize {
        let zygotes = self.pools.iter().filter(|p| p.zygote.pid().is_some());
        self.pools.iter().map(|p| p.members.len()).sum::<usize>() + zygotes.count()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Start members where pools are short (not while stopping), their
    /// jailers forked by `forks`; `busy`: some run is going.
    pub fn refill(
        &mut self,
        launcher: &Launcher,
        forks: &mut ForkServer,
        store: Option<&EnvStore>,
        busy: bool,
    ) {
        let now = Instant::now();
        let quiet = busy && self.last_take.is_some_and(|t| now < t + REFILL_QUIET);
        for pool in &mut self.pools {
            pool.stalled = false;
            pool.zygote.tend(launcher, store, &pool.plan);
            if quiet && pool.has_ready() {
                continue;
            }
            while pool.members.len() < pool.plan.members && now >= pool.not_before {
                match start_member(launcher, forks, store, &pool.plan, pool.zygote.source()) {
                    Ok(Some(m)) => {
                        pool.members.insert(m.launched.child.id() as i32, m);
                    }
                    Ok(None) => {
                        pool.stalled = true;
                        break;
                    }
                    Err(Retry { after, why }) => {
                        if let Some(why) = why {
                            tracing::warn!(
                                policy = %pool.plan.policy,
                                "warm pool {:?}: {why}; trying again in {} s",
                                pool.plan.policy,
                                after.as_secs()
                            );
                        }
                        pool.not_before = now + after;
                    }
                }
            }
        }
    }

    /// When a short pool will start a member, if that is soon.
    pub fn next_refill(&self) -> Option<Instant> {
        let short = self
            .pools
            .iter()
            .filter(|p| p.members.len() < p.plan.members && !p.stalled);
        let after_take = self.last_take.map(|t| t + REFILL_QUIET);
        let members = short.map(|p| match (after_take, !p.has_ready()) {
            (Some(t), false) => p.not_before.max(t),
            _ => p.not_before,
        });
        let zygotes = self.pools.iter().filter_map(|p| p.zygote.due());
        members.chain(zygotes).min()
    }

    /// The event pipes of members (and zygotes) still warming up, to poll.
    pub fn warming(&self) -> Vec<(i32, BorrowedFd<'_>)> {
        let zygotes = self.pools.iter().filter_map(|p| p.zygote.starting());
        self.members()
            .filter(|(_, m)| m.state == State::WarmingUp)
            .map(|(pid, m)| (*pid, m.launched.events.as_fd()))
            .chain(zygotes)
            .collect()
    }

    fn members(&self) -> impl Iterator<Item = (&i32, &Member)> {
        self.pools.iter().flat_map(|p| p.members.iter())
    }

    fn pool_of(&mut self, pid: i32) -> Option<&mut Pool> {
        self.pools.iter_mut().find(|p| p.members.contains_key(&pid))
    }

    /// A member's event pipe is readable: it is ready, or it failed (then
    /// it is stopped, and its pool backs off).
    pub fn event(&mut self, pid: i32) {
        for pool in &mut self.pools {
            if pool.zygote.event(pid, &pool.plan.policy) {
                return;
            }
        }
        let Some(pool) = self.pool_of(pid) else {
            return;
        };
        let member = pool.members.get_mut(&pid).expect("found by pid");
        if member.state != State::WarmingUp {
            return;
        }
        match read_event(&mut member.launched.events) {
            Ok(Some(Event::Ready)) => {
                member.state = State::Ready {
                    since: Instant::now(),
                };
                pool.backoff = Duration::from_secs(1);
            }
            other => {
                let (why, layer) = match other {
                    Ok(Some(Event::Result(r))) => r
                        .error
                        .map_or_else(Default::default, |e| (e.message, Some(e.layer.as_str()))),
                    Ok(_) => ("its jailer ended".to_string(), None),
                    Err(e) => (e.to_string(), None),
                };
                tracing::warn!(
                    policy = %pool.plan.policy,
                    layer,
                    "a warm jail of policy {:?} failed: {why}; trying again in {} s",
                    pool.plan.policy,
                    pool.backoff.as_secs()
                );
                pool.not_before = Instant::now() + pool.backoff;
                pool.backoff = (pool.backoff * 2).min(MAX_BACKOFF);
                stop(member);
            }
        }
    }

    /// A member's jailer exited (reaped by the monitor): forget it. True if
    /// `pid` was a member.
    pub fn exited(&mut self, pid: i32) -> bool {
        for pool in &mut self.pools {
            if pool.zygote.exited(pid, &pool.plan.policy) {
                return true;
            }
        }
        let Some(pool) = self.pool_of(pid) else {
            return false;
        };
        if let Some(mut m) = pool.members.remove(&pid) {
            // Already reaped; the lease goes now, the cgroup went with it.
            m.stopper.reaped();
        }
        true
    }

    /// Retire members ready for longer than the idle limit.
    pub fn retire_idle(&mut self) {
        let limit = self.idle_limit;
        for pool in &mut self.pools {
            for m in pool.members.values_mut() {
                if matches!(m.state, State::Ready { since } if since.elapsed() >= limit) {
                    stop(m);
                }
            }
        }
    }

    /// SIGKILL for members and zygotes that ignored their stop for the
    /// grace (the monitor's loop calls this, as it does for runs).
    pub fn escalate(&mut self) {
        for pool in &mut self.pools {
            for m in pool.members.values_mut() {
                m.stopper.escalate();
            }
            pool.zygote.escalate();
        }
    }

    /// Stop every member and zygote (a forced shutdown).
    pub fn stop_all(&mut self) {
        self.stop_members();
        self.stop_zygotes();
    }

    /// Stop every member that is not a run (a drain): the zygotes stay
    /// while runs forked from them go on (their jails are inside theirs).
    pub fn stop_members(&mut self) {
        for pool in &mut self.pools {
            for m in pool.members.values_mut() {
                stop(m);
            }
        }
    }

    /// Stop every zygote (a drain, once no run is left).
    pub fn stop_zygotes(&mut self) {
        for pool in &mut self.pools {
            pool.zygote.stop();
        }
    }

    /// The jailers of members and zygotes.
    pub fn pids(&self) -> Vec<i32> {
        let zygotes = self.pools.iter().filter_map(|p| p.zygote.pid());
        self.members().map(|(pid, _)| *pid).chain(zygotes).collect()
    }

    /// Each pool's size, members and their jailers, for `pycell info`.
    pub fn status(&self) -> Vec<WarmPoolStatus> {
        self.pools.iter().map(Pool::status).collect()
    }

    /// A ready member of `policy` whose jail is exactly `cold` (the run's
    /// own resolved spec), given the run's work; None if there is none or
    /// the member would not take the work (it is then stopped).
    pub fn take(&mut self, policy: &str, cold: &JailSpec) -> Option<Taken> {
        let work: Work = runner::work_for(cold)?;
        let (pool, pid) = self.oldest_ready(policy, false, |spec| runner::fits(spec, cold))?;
        let member = self.pools[pool].members.get_mut(&pid)?;
        if let Err(e) = member.launched.send_work(&work) {
            tracing::warn!(
                policy,
                "a warm jail of policy {policy:?} did not take its work: {e}"
            );
            stop(member);
            return None;
        }
        self.hand_over(pool, pid)
    }

    /// A ready session jail of `policy` that is exactly `wanted` (the
    /// session's own spec: `pycell_runner::session::session_spec`). Its
    /// request stream goes to the broker with it; the broker's first
    /// request starts its clocks.
    pub fn take_session(&mut self, policy: &str, wanted: &JailSpec) -> Option<Taken> {
        let fits = |spec: &JailSpec| runner::session::fits_session(spec, wanted);
        let (pool, pid) = self.oldest_ready(policy, true, fits)?;
        self.hand_over(pool, pid)
    }

    /// The pool of `policy`'s runs (or sessions) and its ready member that
    /// has waited longest among those whose spec `fits`.
    fn oldest_ready(
        &self,
        policy: &str,
        sessions: bool,
        fits: impl Fn(&JailSpec) -> bool,
    ) -> Option<(usize, i32)> {
        let at = |p: &Pool| p.plan.policy == policy && p.plan.sessions == sessions;
        let index = self.pools.iter().position(at)?;
        let ready = self.pools[index]
            .members
            .iter()
            .filter_map(|(pid, m)| match m.state {
                State::Ready { since } if fits(&m.spec) => Some((since, *pid)),
                _ => None,
            });
        ready.min().map(|(_, pid)| (index, pid))
    }

    /// Member `pid` of pool `index` leaves it for a run or session.
    fn hand_over(&mut self, index: usize, pid: i32) -> Option<Taken> {
        let member = self.pools[index].members.remove(&pid)?;
        self.last_take = Some(Instant::now());
        Some(Taken {
            launched: member.launched,
            env: member.env,
        })
    }
}

impl Pool {
    fn status(&self) -> WarmPoolStatus {
        let count =
            |pred: fn(&State) -> bool| self.members.values().filter(|m| pred(&m.state)).count();
        let mut jailer_pids: Vec<i32> = self.members.keys().copied().collect();
        jailer_pids.sort_unstable();
        WarmPoolStatus {
            policy: self.plan.policy.clone(),
            sessions: self.plan.sessions,
            size: self.plan.members,
            ready: count(|s| matches!(s, State::Ready { .. })),
            warming: count(|s| *s == State::WarmingUp),
            jailer_pids,
            zygote_jailer_pid: self.zygote.pid(),
            member_sandbox_uids: self.members.values().map(|m| m.spec.sandbox_uid).collect(),
        }
    }

    fn has_ready(&self) -> bool {
        self.members
            .values()
            .any(|m| matches!(m.state, State::Ready { .. }))
    }
}

/// Why a member could not be started, and when to try again.
struct Retry {
    after: Duration,
    why: Option<String>,
}

/// A new member of `plan`'s pool, from `source`; `None` if it must wait
/// (for the zygote to be ready, or for one of its slots).
fn start_member(
    launcher: &Launcher,
    forks: &mut ForkServer,
    store: Option<&EnvStore>,
    plan: &PoolPlan,
    source: zygote::Source<'_>,
) -> Result<Option<Member>, Retry> {
    if matches!(source, zygote::Source::Wait) {
        return Ok(None);
    }
    let fail = |why: String| Retry {
        after: MAX_BACKOFF,
        why: Some(why),
    };
    let policy = launcher
        .load_policy(PolicyChoice::Name(&plan.policy))
        .map_err(|e| fail(e.failure().message))?;
    let env = policy_env(launcher, store, &policy)?;
    let extras = Extras {
        env: env.as_ref().map(|(e, _)| e.dir.clone()),
        ..Extras::default()
    };
    let prepared = match (plan.sessions, source) {
        (_, zygote::Source::Wait) => unreachable!("returned above"),
        (true, _) => launcher.prepare_session(&policy, &Default::default(), &extras),
        (false, zygote::Source::Cold) => {
            launcher.prepare_warm(&policy, &extras, &policy.warm_imports)
        }
        (false, zygote::Source::Zygote(z)) => match launcher.prepare_member_from_zygote(z) {
            Ok(Some(prepared)) => Ok(prepared),
            Ok(None) => return Ok(None),
            Err(e) => Err(e),
        },
    }
    .map_err(|e| fail(e.failure().message))?;
    let spec = prepared.spec().clone();
    let launched = prepared
        .spawn_forked(forks)
        .map_err(|r| fail(r.error.map_or_else(String::new, |e| e.message)))?;
    Ok(Some(Member {
        stopper: Stopper::new(launched.child.id(), None, PATIENCE.grace),
        spec,
        launched,
        env,
        state: State::WarmingUp,
    }))
}

/// The env of the policy's own packages, if it has any: from the store
/// only (a run of the policy builds it; until then the pool waits).
fn policy_env(
    launcher: &Launcher,
    store: Option<&EnvStore>,
    policy: &Policy,
) -> Result<Option<(EnvInUse, EnvReport)>, Retry> {
    let wait = |why: Option<String>| Retry {
        after: ENV_RETRY,
        why,
    };
    let Some(wanted) = deps::for_policy(policy).map_err(|f| wait(Some(f.message)))? else {
        return Ok(None);
    };
    let store = store.ok_or_else(|| wait(Some("pycelld has no env store".into())))?;
    let plan = deps::build::plan(launcher, policy, &wanted).map_err(|f| wait(Some(f.message)))?;
    // Not built yet: quietly wait for a run to build it.
    let env = store.lookup(&plan.key).ok_or_else(|| wait(None))?;
    let report = deps::build::report(&env, CacheOutcome::Hit, 0.0);
    Ok(Some((env, report)))
}

/// Ask a member's jailer to stop (it kills the jail and cleans up); the
/// monitor reaps it, escalating meanwhile ([`Pools::escalate`]).
fn stop(m: &mut Member) {
    m.state = State::Stopping;
    m.stopper.stop();
}

/// For tests of [`plan`]: a config with these pools and budget.
#[cfg(test)]
fn config_with(pools: &[(&str, usize)], budget: u64, policy_dir: &std::path::Path) -> Config {
    Config {
        warm_pools: pools.iter().map(|(n, c)| (n.to_string(), *c)).collect(),
        session_pools: Default::default(),
        memory_budget: budget,
        policy_dir: policy_dir.to_path_buf(),
        ..Config::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pools_take_at_most_half_the_budget_in_order() {
        let dir = tempfile::tempdir().unwrap();
        // Built-in policies: default 512 MiB, data-science 1 GiB per member.
        let mut c = config_with(&[("default", 2), ("data-science", 2)], 8 << 30, dir.path());
        c.zygotes = false;
        let (plans, warnings) = plan(&c);
        assert!(warnings.is_empty(), "{warnings:?}");
        assert_eq!(plans.len(), 2);
        assert_eq!(reserved_memory(&plans), 3 << 30);
        let mut c = config_with(&[("default", 2), ("data-science", 2)], 2 << 30, dir.path());
        c.zygotes = false;
        let (plans, warnings) = plan(&c);
        assert_eq!(
            plans,
            vec![PoolPlan {
                policy: "data-science".into(),
                members: 1,
                member_memory: 1 << 30,
                sessions: false,
                zygote_slots: 0,
            }]
        );
        assert!(reserved_memory(&plans) <= 1 << 30);
        assert!(
            warnings.iter().any(|w| w.contains("gets 1 members, not 2")),
            "{warnings:?}"
        );
        assert!(
            warnings.iter().any(|w| w.contains("gets 0 members")),
            "{warnings:?}"
        );
        let c = config_with(&[("nope", 2)], 4 << 30, dir.path());
        let (plans, warnings) = plan(&c);
        assert!(plans.is_empty());
        assert!(
            warnings[0].contains("\"nope\" gets no pool"),
            "{warnings:?}"
        );
        // A server policy runs no code: no run would take a warm jail of it.
        let c = config_with(&[("mcp-server", 2)], 4 << 30, dir.path());
        let (plans, warnings) = plan(&c);
        assert!(plans.is_empty());
        assert!(
            warnings[0].contains("is for MCP servers over stdio"),
            "{warnings:?}"
        );
    }

    #[test]
    fn a_run_pools_zygote_takes_a_members_memory_and_a_slot_per_run() {
        let dir = tempfile::tempdir().unwrap();
        let mut c = config_with(&[("default", 2), ("data-science", 2)], 10 << 30, dir.path());
        c.zygotes = true;
        c.session_pools = [("default".to_string(), 1)].into_iter().collect();
        c.max_concurrent_runs = 8;
        let shape = |plans: &[PoolPlan]| -> Vec<(String, bool, usize, usize)> {
            let p = plans.iter();
            p.map(|p| (p.policy.clone(), p.sessions, p.members, p.zygote_slots))
                .collect()
        };
        let (plans, warnings) = plan(&c);
        assert!(warnings.is_empty(), "{warnings:?}");
        // Half of 10 GiB: data-science 2 + its zygote (3 GiB), default 2 +
        // its zygote (1.5 GiB), the session pool's member (0.5 GiB).
        assert_eq!(reserved_memory(&plans), 5 << 30);
        let want = |ds: usize, default: usize, session: usize| {
            let mut w = vec![
                ("data-science".to_string(), false, ds, ds + 8),
                ("default".to_string(), false, default, default + 8),
            ];
            w.extend((session > 0).then(|| ("default".to_string(), true, session, 0)));
            w
        };
        assert_eq!(shape(&plans), want(2, 2, 1));
        // Half of 8 GiB: default gets 1 member and its zygote.
        c.memory_budget = 8 << 30;
        let (plans, warnings) = plan(&c);
        assert_eq!(reserved_memory(&plans), 4 << 30);
        assert_eq!(shape(&plans), want(2, 1, 0));
        assert!(
            warnings
                .iter()
                .any(|w| w.contains("gets 1 members, not 2: members and its zygote")),
            "{warnings:?}"
        );
        // Too little for a member and a zygote: no pool.
        let mut c = config_with(&[("default", 2)], 1 << 30, dir.path());
        c.zygotes = true;
        let (plans, _) = plan(&c);
        assert!(plans.is_empty(), "{plans:?}");
    }
}
