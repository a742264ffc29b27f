//! The envs of runs' dependencies: found in the store, or built by a
//! builder the monitor starts, after which the run starts.

use super::*;

/// Where a run's env stands when it is asked for.
pub(super) enum EnvStep {
    NoDependencies,
    Ready((EnvInUse, EnvReport)),
    /// Its builder started; this is the reply for the broker.
    Building((ToBroker, Vec<OwnedFd>)),
}

impl Monitor {
    /// The run's env: none needed, in the store, or being built now (the
    /// run starts when its builder is done, see [`Monitor::built`]).
    pub(super) fn env_for(
        &mut self,
        req: u64,
        peer: &PeerIds,
        policy: &pycell_policy::Policy,
        order: RunOrder,
        built: Option<EnvReport>,
        grant_sources: &mut Vec<OwnedFd>,
    ) -> Result<EnvStep, Box<ToBroker>> {
        let failed = |failure| {
            Box::new(ToBroker::Failed {
                req,
                policy: policy.name.clone(),
                failure,
            })
        };
        let Some(wanted) = &order.dependencies else {
            return Ok(EnvStep::NoDependencies);
        };
        let (store, builders) = self.envs.as_ref().map_err(|why| {
            failed(deps::failure(
                FailureCode::DepsUnavailable,
                format!("pycelld cannot build dependency envs: {why}"),
            ))
        })?;
        let plan: Plan = deps::build::plan(&self.launcher, policy, wanted).map_err(failed)?;
        if let Some(env) = store.lookup(&plan.key) {
            let report = built.unwrap_or_else(|| {
                deps::build::report(&env, pycell_protocol::result::CacheOutcome::Hit, 0.0)
            });
            return Ok(EnvStep::Ready((env, report)));
        }
        if built.is_some() {
            return Err(failed(deps::failure(
                FailureCode::DepsInstallFailed,
                "the env was built, yet the store does not have it (removed meanwhile?); try again",
            )));
        }
        let (child, progress) = builders.start(&policy.name, wanted).map_err(|e| {
            failed(deps::failure(
                FailureCode::DepsUnavailable,
                format!("starting the env builder: {e}"),
            ))
        })?;
        let deadline = builders.deadline(plan.install_timeout());
        self.audit
            .env_build_started(&plan.key, peer, &policy.name, wanted);
        // Kept until the build is done.
        let name = policy.name.clone();
        let mut build = Build::new(req, peer.clone(), order, name, plan.key, child, deadline);
        build.grant_sources = std::mem::take(grant_sources);
        self.builds.insert(build.pid(), build);
        Ok(EnvStep::Building((
            ToBroker::Installing { req },
            vec![progress],
        )))
    }

    /// A builder ended: start its run, or say why it cannot start.
    pub(super) fn built(&mut self, mut build: Build, how: &str) {
        let (req, peer) = (build.req, build.peer.clone());
        let outcome = build.outcome(how);
        self.audit
            .env_build_ended(&build.key, build.elapsed(), how, &outcome);
        let reply = match outcome {
            Ok(env) => {
                let grants = std::mem::take(&mut build.grant_sources);
                let reply = self.spawn(req, &peer, build.order, Some(env), grants);
                // After the run holds its env: gc never removes one in use.
                self.collect_garbage();
                reply
            }
            Err(failure) => Err(Box::new(ToBroker::Failed {
                req,
                policy: build.policy.clone(),
                failure,
            })),
        };
        self.reply(req, &peer, reply);
    }

    /// After a build: envs over the store's age and size caps go (by a
    /// child doing `Job::CollectEnvs`, so the monitor never waits on the disk).
    pub(super) fn collect_garbage(&self) {
        if let Ok((_, builders)) = &self.envs {
            if let Err(e) = builders.collect_garbage(&self.config) {
                tracing::warn!(
                    layer = "dependencies",
                    "cannot start the env store's gc: {e}"
                );
            }
        }
    }
}
