//! Work the monitor hands to a child of its own: pycelld started again as
//! root with `--job JSON`, the job one of [`Job`]. The monitor stays
//! single-threaded and never waits for an install or a jail, and it never
//! runs the client binary (`pycell`, which carries the HTTP, OAuth and
//! gateway code): a job links only the engine (`pycell_engine`), the same
//! code embedded mode runs.
//!
//! A job learns where it launches (policies, store, jailer, sandbox uids,
//! cgroup parent) from the environment the monitor gives it, as embedded
//! mode does ([`super::envs::job_command`]); the job itself says only what
//! to do. Its stdout is its answer (one JSON line); its stderr, progress.

use std::time::Duration;

use pycell_deps::build::embedded_store;
use pycell_deps::DepsRequest;
use pycell_engine::envs::{self, EnvWanted};
use pycell_engine::local;
use pycell_engine::service::{Backend, RunService};
use pycell_launch::launcher::Launcher;
use pycell_protocol::messages::RunRequest;
use pycell_protocol::result::RunResult;
use pycell_wire::codes::{FailureCode, Layer};
use pycell_wire::report::JailFailure;
use serde::{Deserialize, Serialize};

/// The hidden flag that makes pycelld run a job instead of serving.
pub const JOB_FLAG: &str = "--job";

/// What a child of the monitor is to do.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "job", rename_all = "snake_case", deny_unknown_fields)]
pub enum Job {
    /// Build the env of `deps` under `policy` into the store: stdout a
    /// `BuildOutcome`, stderr the install's progress, a line a step.
    BuildEnv { policy: String, deps: DepsRequest },
    /// Remove envs unused for `max_age_secs`, then the least recently used
    /// until the rest fit in `max_size_bytes` (never one in use).
    CollectEnvs {
        max_size_bytes: u64,
        max_age_secs: u64,
    },
    /// The start-up self-check: `code` run embedded under `policy`;
    /// stdout its `RunResult`.
    SelfCheck { policy: String, code: String },
}

impl Job {
    /// The job as its flag's value.
    pub fn arg(&self) -> String {
        serde_json::to_string(self).expect("a job is plain data")
    }
}

/// Run the job `json` names; the process's exit status.
pub fn main(json: &str) -> i32 {
    let job: Job = match serde_json::from_str(json) {
        Ok(j) => j,
        Err(e) => {
            eprintln!("pycelld: {JOB_FLAG}: not a job ({e})");
            return 2;
        }
    };
    // The monitor that started it may go away: a build or a self-check
    // stops, and lets a jail it started clean up (SIGTERM is read, not
    // fatal, once a jail is going). A collection is not interrupted: a
    // removal cut short would leave a half-deleted env under its key.
    if !matches!(job, Job::CollectEnvs { .. }) {
        let _ = nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGTERM);
    }
    match job {
        Job::BuildEnv { policy, deps } => build_env(&policy, &deps),
        Job::CollectEnvs {
            max_size_bytes,
            max_age_secs,
        } => collect_envs(max_size_bytes, Duration::from_secs(max_age_secs)),
        Job::SelfCheck { policy, code } => self_check(&policy, code),
    }
}

fn build_env(policy: &str, deps: &DepsRequest) -> i32 {
    let built = Launcher::embedded_from_env().and_then(|launcher| {
        let store = embedded_store()?;
        let wanted = EnvWanted {
            policy,
            code: "",
            listed: &deps.requirements,
            requires_python: deps.requires_python.as_deref(),
        };
        envs::build(&launcher, &store, wanted, &mut |m| eprintln!("{m}"))
    });
    let outcome = envs::outcome(built);
    println!("{}", envs::outcome_line(&outcome));
    i32::from(matches!(
        outcome,
        pycell_deps::build::BuildOutcome::Failed { .. }
    ))
}

fn collect_envs(max_size_bytes: u64, max_age: Duration) -> i32 {
    match embedded_store() {
        Ok(store) => {
            for e in store.gc(max_size_bytes, max_age) {
                eprintln!("removed env {}", e.meta.key);
            }
            0
        }
        Err(f) => {
            eprintln!("{}", f.message);
            1
        }
    }
}

fn self_check(policy: &str, code: String) -> i32 {
    let req = RunRequest {
        code,
        policy: Some(policy.to_string()),
        ..RunRequest::default()
    };
    let result = match run_embedded(req) {
        Ok(r) => r,
        Err(f) => RunResult::refused("", policy, f),
    };
    println!("{}", serde_json::to_string(&result).unwrap_or_default());
    i32::from(result.status != pycell_wire::report::RunStatus::Ok)
}

/// `req` run embedded, through the run service, SIGTERM or SIGHUP
/// stopping it.
fn run_embedded(req: RunRequest) -> Result<RunResult, JailFailure> {
    let internal = |what: &str, e: &dyn std::fmt::Display| {
        JailFailure::new(FailureCode::Internal, Layer::Jailer, format!("{what}: {e}"))
    };
    let signals = local::command_line_signals(false).map_err(|e| internal("signalfd", &e))?;
    let rt = local::runtime().map_err(|e| internal("starting a runtime", &e))?;
    let service = RunService::new(Backend::Embedded, None);
    let policy = req.policy_name().to_string();
    let result = rt.block_on(service.run(req, |_| {}, signals.stop));
    Ok(result.unwrap_or_else(|e| RunResult::refused("", &policy, e.failure())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_job_goes_through_its_flag_unchanged_and_unknown_fields_are_refused() {
        let jobs = [
            Job::BuildEnv {
                policy: "data-science".into(),
                deps: DepsRequest {
                    requirements: vec!["pandas>=2.2".into(), "six".into()],
                    requires_python: Some(">=3.9".into()),
                },
            },
            Job::CollectEnvs {
                max_size_bytes: 1 << 30,
                max_age_secs: 86_400,
            },
            Job::SelfCheck {
                policy: "default".into(),
                code: "print(1)\n".into(),
            },
        ];
        for job in jobs {
            let back: Job = serde_json::from_str(&job.arg()).unwrap();
            assert_eq!(back, job);
        }
        let extra = r#"{"job":"collect_envs","max_size_bytes":1,"max_age_secs":1,"path":"/"}"#;
        assert!(serde_json::from_str::<Job>(extra).is_err());
        assert_ne!(main(r#"{"job":"format_disk"}"#), 0);
    }
}
