//! An embedded zygote (`pycell batch --embedded --zygote`): python started
//! once for one policy, with its warm imports, and each run of that policy
//! forked from it into a jail of its own (its own uid, cgroup and limits).
//! A run that does not fit it (more dependencies, a spec the zygote's
//! python cannot take) goes the cold way, as isolated, slower.

use std::sync::Mutex;

use pycell_deps::DepsRequest;
use pycell_launch::launcher::{JailerStderr, Launcher};
use pycell_launch::supervisor::{supervise, Patience, Services, StoppedBy};
use pycell_launch::zygote::Zygote;
use pycell_policy::Policy;
use pycell_protocol::messages::RunRequest;
use pycell_protocol::result::RunResult;
use pycell_wire::report::{JailFailure, RunStatus};
use tokio_util::sync::CancellationToken;

use super::{OnEvent, RunEvent};
use crate::local::{self, Installer, StopRequest};

/// A zygote, and what its runs are prepared with.
#[derive(Debug)]
pub struct Forked {
    launcher: Launcher,
    /// The policy as the front end named it (a name or a file's path):
    /// the runs that name it are the zygote's.
    chosen_as: String,
    policy: Policy,
    /// The dependencies of runs it serves (the policy's): a run that
    /// brings more goes the cold way, to an env of its own.
    deps: Option<DepsRequest>,
    zygote: Mutex<Zygote>,
}

/// `stop` as an install's stop request, forwarded on `rt`.
pub(super) fn stop_request(rt: &tokio::runtime::Handle, stop: CancellationToken) -> StopRequest {
    let (tx, rx) = tokio::sync::watch::channel(None);
    rt.spawn(async move {
        tokio::select! {
            _ = stop.cancelled() => { let _ = tx.send(Some(StoppedBy::Request)); }
            _ = tx.closed() => {}
        }
    });
    rx
}

impl Forked {
    /// The zygote of `chosen_as` (its env built first, if it has
    /// dependencies), started and ready; blocking.
    pub(super) fn start(
        launcher: Launcher,
        chosen_as: &str,
        policy_files: bool,
        slots: usize,
        installer: &mut Installer,
    ) -> Result<Forked, JailFailure> {
        let policy = launcher
            .load_policy(super::policy_choice(policy_files, chosen_as))
            .map_err(|e| e.failure())?;
        let deps = pycell_deps::gather(&policy, "", &[])?;
        let none = RunRequest::default();
        let mut progress = |m: &str| eprintln!("pycell: {m}");
        let env = local::env_for(&launcher, &policy, &none, installer, &mut progress)?;
        let zygote = launcher
            .start_zygote(&policy, env.map(|e| e.env.dir.clone()), slots)
            .map_err(|e| e.failure())?;
        Ok(Forked {
            launcher,
            chosen_as: chosen_as.to_string(),
            policy,
            deps,
            zygote: Mutex::new(zygote),
        })
    }

    /// Stop the zygote (its jail and cgroup gone, its jailer reaped) and
    /// wait for it: later runs of its policy go the cold way.
    pub(super) fn stop(&self) {
        self.zygote
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .stop_and_reap();
    }

    fn alive(&self) -> bool {
        self.zygote
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_alive()
    }

    /// `req` forked from the zygote, if it names its policy, fits it and
    /// the zygote is alive (else `None`: the run goes the cold way). A run
    /// refused because the zygote died meanwhile (its code never ran)
    /// goes cold too.
    pub(super) async fn run(
        &self,
        req: &RunRequest,
        patience: Patience,
        until: impl std::future::Future<Output = StoppedBy>,
        on_event: OnEvent<'_>,
    ) -> Option<RunResult> {
        if req.policy_name() != self.chosen_as {
            return None;
        }
        let same_deps = pycell_deps::gather(&self.policy, &req.code, &req.dependencies)
            .is_ok_and(|d| d == self.deps);
        let prepared = {
            let mut zygote = self.zygote.lock().unwrap_or_else(|e| e.into_inner());
            if !same_deps || !zygote.is_alive() {
                return None;
            }
            self.launcher
                .prepare_from_zygote(&zygote, &self.policy, req)
        };
        let name = &self.policy.name;
        let (prepared, work) = match prepared {
            Ok(Some(p)) => p,
            Ok(None) => return None,
            Err(e) => return Some(RunResult::refused("", name, e.failure())),
        };
        let result = match prepared.spawn_async(JailerStderr::Capture).await {
            Ok(mut l) => {
                on_event(RunEvent::Started {
                    run_id: &l.run_id,
                    sandbox_uid: Some(l.lease.uid),
                });
                // If it fails, the jailer sees the stream end and says so.
                let _ = l.send_work(&work);
                let output = |stream, bytes: &[u8]| on_event(RunEvent::Output { stream, bytes });
                supervise(l, patience, until, Services::default(), output)
                    .await
                    .0
            }
            Err(result) => *result,
        };
        match result.status == RunStatus::Refused && !self.alive() {
            true => None,
            false => Some(result),
        }
    }
}
