//! Runs: starting one (cold, or in a warm jail of the pool) or a
//! session's jail, and keeping its jailer within the supervisor's
//! deadline.

use super::*;
use crate::link::{SpawnFd, SpawnedFd};
use pycell_launch::launcher::RequestError;
use pycell_wire::spec::{Grant, SlotIds};

/// How long a session's python may take to get ready (its imports).
pub(crate) const SESSION_READY_WITHIN: Duration = Duration::from_secs(60);

impl Monitor {
    /// Start the run, or its env's build first. `built` is the outcome of
    /// that build, once it is done.
    pub(super) fn spawn(
        &mut self,
        req: u64,
        peer: &PeerIds,
        order: RunOrder,
        built: Option<EnvReport>,
        mut grant_sources: Vec<OwnedFd>,
    ) -> Reply {
        let refuse = |(code, message)| Box::new(ToBroker::Refused { req, code, message });
        order
            .check_bounds()
            .map_err(|e| refuse((ErrorCode::InvalidRequest, e.to_string())))?;
        let cap = self.config.max_concurrent_runs * JAILERS_PER_SLOT;
        if self.runs.len() + self.builds.len() >= cap {
            return Err(refuse((
                ErrorCode::Busy,
                format!("the monitor already runs {cap} jailers and env builds (twice max_concurrent_runs); try again shortly"),
            )));
        }
        let policy = self
            .launcher
            .load_policy(PolicyChoice::Name(&order.policy))
            .map_err(|e| refuse(refusal(e)))?;
        order.check(&policy).map_err(|failure| {
            Box::new(ToBroker::Failed {
                req,
                policy: policy.name.clone(),
                failure,
            })
        })?;
        // The broker settled the limits; root checks them, and launches
        // with them as they are.
        let limits = pycell_launch::resolve::settled_limits(&policy, &order.limits)
            .map_err(|e| refuse(refusal(e.into())))?;
        let request = order.to_request();
        let session = order.session;
        let granted = granted(&request, grant_sources.len(), peer)
            .map_err(|e| refuse((ErrorCode::InvalidRequest, e.to_string())))?;
        let env = match self.env_for(req, peer, &policy, order, built, &mut grant_sources)? {
            EnvStep::Building(reply) => return Ok(reply),
            EnvStep::Ready(env) => Some(env),
            EnvStep::NoDependencies => None,
        };
        let extras = Extras {
            env: env.as_ref().map(|(e, _)| e.dir.clone()),
            limits: Some(limits),
            ..Extras::default()
        };
        if session {
            return self.start_session(req, peer, &policy, &request, &extras, env);
        }
        if let Some(reply) = self.start_warm(req, peer, &policy, &request, &extras, &env) {
            return Ok(reply);
        }
        let mut prepared = self
            .launcher
            .prepare_with(&policy, &request, &extras)
            .map_err(|e| refuse(refusal(e)))?;
        prepared
            .grant(granted.into_iter().zip(grant_sources).collect())
            .map_err(|f| refuse((ErrorCode::InvalidRequest, f.message)))?;
        let launched = prepared.spawn_forked(&mut self.forks).map_err(|r| {
            let message = r.error.map_or_else(String::new, |e| e.message);
            refuse((ErrorCode::Internal, message))
        })?;
        Ok(self.started(req, peer, launched, env, &request.code, false))
    }

    /// Start a session's jail. Its jailer keeps the session's clocks; the
    /// monitor's deadline (its warm-up and lifetime, and the slack) only
    /// catches a jailer that stopped answering. Its stdin goes to the
    /// broker too, which sends the session's requests on it.
    fn start_session(
        &mut self,
        req: u64,
        peer: &PeerIds,
        policy: &pycell_policy::Policy,
        request: &RunRequest,
        extras: &Extras,
        env: Option<(EnvInUse, EnvReport)>,
    ) -> Reply {
        let refuse = |(code, message)| Box::new(ToBroker::Refused { req, code, message });
        let (mut launched, env, pooled) = match self.take_session_jail(policy, request, extras) {
            Some(taken) => {
                let env = member_env(taken.env, env.map(|(_, report)| report));
                (taken.launched, env, true)
            }
            None => {
                let prepared = self
                    .launcher
                    .prepare_session(policy, request, extras)
                    .map_err(|e| refuse(refusal(e)))?;
                let launched = prepared.spawn_forked(&mut self.forks).map_err(|r| {
                    let message = r.error.map_or_else(String::new, |e| e.message);
                    refuse((ErrorCode::Internal, message))
                })?;
                (launched, env, false)
            }
        };
        // The jailer's stdin, which the broker needs whether or not the
        // jail hands descriptors out on it.
        let requests = launched.take_work_stream().map(OwnedFd::from);
        launched.handouts = launched.handouts.or(requests);
        let wall = SESSION_READY_WITHIN + policy.session.lifetime;
        Ok(self.started_for(req, peer, launched, env, "", pooled, wall))
    }

    /// A session jail of the pool that is exactly the session's, with its
    /// limits as the session's.
    fn take_session_jail(
        &mut self,
        policy: &pycell_policy::Policy,
        request: &RunRequest,
        extras: &Extras,
    ) -> Option<crate::monitor::pool::Taken> {
        let resolved = pycell_launch::resolve::resolve_with(policy, request, extras).ok()?;
        let clocks = pycell_launch::launcher::session_clocks(&policy.session);
        let wanted =
            pycell_runner::session::session_spec(&resolved.spec, &policy.warm_imports, clocks);
        let mut taken = self.pools.take_session(&policy.name, &wanted)?;
        taken.launched.limits = resolved.limits.clone();
        Some(taken)
    }

    /// Hand the run to a warm jail of the pool, if one is exactly the jail
    /// the run would get.
    pub(super) fn start_warm(
        &mut self,
        req: u64,
        peer: &PeerIds,
        policy: &pycell_policy::Policy,
        request: &RunRequest,
        extras: &Extras,
        env: &Option<(EnvInUse, EnvReport)>,
    ) -> Option<(ToBroker, Vec<OwnedFd>)> {
        let resolved = pycell_launch::resolve::resolve_with(policy, request, extras).ok()?;
        let taken = self.pools.take(&policy.name, &resolved.spec)?;
        let mut launched = taken.launched;
        // The run's own limits (its timeout, its output cap), which its
        // work carried.
        launched.limits = resolved.limits.clone();
        let env = member_env(taken.env, env.as_ref().map(|(_, report)| report.clone()));
        Some(self.started(req, peer, launched, env, &request.code, true))
    }

    /// A run's jailer started (cold, or a warm jail given its work): the
    /// broker's message and descriptors; the run is kept until reaped.
    pub(super) fn started(
        &mut self,
        req: u64,
        peer: &PeerIds,
        launched: ForkedLaunch,
        env: Option<(EnvInUse, EnvReport)>,
        code: &str,
        warm: bool,
    ) -> (ToBroker, Vec<OwnedFd>) {
        let wall = launched.limits.wall_timeout;
        self.started_for(req, peer, launched, env, code, warm, wall)
    }

    /// [`Monitor::started`], with the monitor's deadline for its jailer
    /// `wall` (and the slack) from now.
    #[allow(clippy::too_many_arguments)]
    fn started_for(
        &mut self,
        req: u64,
        peer: &PeerIds,
        launched: ForkedLaunch,
        env: Option<(EnvInUse, EnvReport)>,
        code: &str,
        warm: bool,
        wall: Duration,
    ) -> (ToBroker, Vec<OwnedFd>) {
        self.audit.run_started(&RunStart {
            run_id: &launched.run_id,
            peer,
            code,
            policy: &launched.policy,
            limits: &launched.limits,
            sandbox_uid: launched.lease.uid,
            warm,
        });
        tracing::debug!(
            run_id = %launched.run_id,
            peer_uid = peer.uid,
            policy = %launched.policy,
            sandbox_uid = launched.lease.uid,
            warm,
            "run started"
        );
        let started = Instant::now();
        let mut named = vec![(SpawnedFd::Events, OwnedFd::from(launched.events))];
        named.extend(launched.handouts.map(|h| (SpawnedFd::JailerStdin, h)));
        let (descriptors, fds) = pycell_wire::named_fds::split(named);
        let egress = launched.egress;
        let (env, report) = env.unzip();
        let msg = ToBroker::Spawned {
            req,
            run_id: launched.run_id.clone(),
            sandbox_uid: launched.lease.uid,
            policy: launched.policy,
            limits: launched.limits,
            media: launched.media,
            egress,
            descriptors,
            env: report,
            ready: warm,
        };
        let process = JailerProcess::new(launched.child, launched.lease, wall, PATIENCE);
        self.runs.insert(
            process.pid(),
            Run {
                run_id: launched.run_id,
                process,
                _env: env,
                started,
                outcome: launched.outcome,
            },
        );
        (msg, fds)
    }

    /// Stop jailers past the monitor's own deadline (whatever their
    /// clients or the broker do), and SIGKILL those that ignored a SIGTERM
    /// for [`PATIENCE`]'s grace: runs', env builders', pool members' and
    /// zygotes' alike (`pycell_launch::stopper`).
    pub(super) fn escalate_kills(&mut self) {
        for run in self.runs.values_mut() {
            if run.process.escalate() == Some(Escalation::Stopped) {
                tracing::warn!(
                    run_id = %run.run_id,
                    "run {} outlived its timeout by {} s; stopping its jailer",
                    run.run_id,
                    PATIENCE.slack.as_secs()
                );
            }
        }
        for build in self.builds.values_mut() {
            build.escalate();
        }
        self.pools.escalate();
    }
}

/// The env of a run or session given a pool's member: the member holds
/// it (in use), the report is the request's (`hit`, its install time).
fn member_env(
    held: Option<(EnvInUse, EnvReport)>,
    report: Option<EnvReport>,
) -> Option<(EnvInUse, EnvReport)> {
    match (held, report) {
        (Some((env, _)), Some(report)) => Some((env, report)),
        (held, _) => held,
    }
}

/// A run's grants as its jail takes them: one descriptor came for each
/// (`count`), and the client's ids own them in the jail (the broker
/// checked what it could; the jailer checks each descriptor again).
/// The descriptors of `order.grants`, in its order, each taken by its
/// name ([`SpawnFd::GrantSource`]); refused if one is missing or another
/// came.
pub(super) fn grant_sources(
    order: &RunOrder,
    names: Vec<SpawnFd>,
    fds: Vec<OwnedFd>,
) -> Result<Vec<OwnedFd>, pycell_wire::named_fds::NamedFdsError> {
    let mut named = pycell_wire::named_fds::Named::pair(names, fds)?;
    let sources = (0..order.grants.len())
        .map(|grant| named.one(&SpawnFd::GrantSource { grant }))
        .collect::<Result<Vec<_>, _>>()?;
    named.done()?;
    Ok(sources)
}

fn granted(request: &RunRequest, count: usize, peer: &PeerIds) -> Result<Vec<Grant>, RequestError> {
    if request.grants.len() != count {
        return Err(RequestError {
            field: "grants",
            problem: format!("{} paths but {count} descriptors", request.grants.len()),
        });
    }
    let owner = SlotIds {
        uid: peer.uid,
        gid: peer.gid,
    };
    Ok(request
        .grants
        .iter()
        .map(|g| Grant {
            target: g.target.clone(),
            writable: g.writable,
            owner: Some(owner),
        })
        .collect())
}
