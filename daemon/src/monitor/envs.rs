//! The envs of daemon runs' dependencies. The monitor looks a run's env up
//! in pycelld's store (`env_store`, root's); one that is not built yet is
//! built by a child of the monitor, pycelld's [`Job::BuildEnv`] (root, like
//! an embedded run: it runs the install jail through pycell-jailer, its
//! egress proxy, and copies the env into the store), whose stderr lines are
//! the install's progress (the broker relays them to the client) and whose
//! stdout is its [`BuildOutcome`]. The monitor stays single-threaded and
//! never waits for an install.

use std::ffi::OsString;
use std::io::Read;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use pycell_deps::build::BuildOutcome;
use pycell_deps::{self as deps, DepsRequest};
use pycell_launch::launcher::Launcher;
use pycell_launch::stopper::{Escalation, Stopper};
use pycell_protocol::result::EnvReport;
use pycell_wire::codes::FailureCode;
use pycell_wire::report::JailFailure;
use tokio::time::Instant as TokioInstant;

use crate::config::Config;
use crate::link::{PeerIds, RunOrder};
use crate::monitor::jobs::{Job, JOB_FLAG};

/// What a builder may print on stdout (one JSON object).
const OUTCOME_CAP: u64 = 1 << 20;
/// A builder that ignores SIGTERM this long gets SIGKILL.
const KILL_GRACE: Duration = Duration::from_secs(5);
/// Past twice the install policy's own timeout, how long a builder gets
/// (the jail's start, the copy into the store, a wait for another build).
const BUILD_SLACK: Duration = Duration::from_secs(60);

/// How the monitor starts builders: this executable and the settings that
/// make its launches the daemon's (policies, store, uids, cgroups).
#[derive(Debug)]
pub struct Builders {
    exe: PathBuf,
    env: Vec<(String, OsString)>,
}

/// A run whose env is being built: what to start once it is.
#[derive(Debug)]
pub struct Build {
    pub req: u64,
    pub peer: PeerIds,
    /// The run to start when the env is built, and the descriptors of its
    /// grants.
    pub order: RunOrder,
    pub grant_sources: Vec<std::os::fd::OwnedFd>,
    pub policy: String,
    /// The env's key in the store.
    pub key: String,
    pub child: Child,
    started: Instant,
    /// Stopped at its deadline or when asked, killed after a grace.
    stopper: Stopper,
}

impl Builders {
    /// For the monitor's `launcher` and `config`.
    pub fn new(config: &Config, launcher: &Launcher) -> Result<Builders, EnvsError> {
        let (exe, env) = job_env(config, launcher)?;
        Ok(Builders { exe, env })
    }

    /// pycelld doing `job`, with the builders' environment and no stdin.
    fn command(&self, job: &Job) -> Command {
        job_command(&self.exe, &self.env, job)
    }
}

/// `exe` doing `job`, with `env` only and no stdin.
pub(crate) fn job_command(exe: &Path, env: &[(String, OsString)], job: &Job) -> Command {
    let mut cmd = Command::new(exe);
    cmd.arg(JOB_FLAG)
        .arg(job.arg())
        .env_clear()
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null());
    cmd
}

/// This executable (which the monitor's jobs run again) and the
/// environment that makes their embedded launches the daemon's: its
/// policies, store, jailer, sandbox uids and cgroup parent.
pub(crate) fn job_env(
    config: &Config,
    launcher: &Launcher,
) -> Result<(PathBuf, Vec<(String, OsString)>), EnvsError> {
    let exe = std::env::current_exe().map_err(EnvsError::Locate)?;
    let jailer = launcher
        .jailer
        .clone()
        .map_err(|f| EnvsError::Jailer(f.message))?;
    let uids = format!(
        "{}-{}",
        launcher.uid_range.start(),
        launcher.uid_range.end()
    );
    let mut env: Vec<(String, OsString)> = vec![
        (
            "PYCELL_POLICY_DIR".into(),
            launcher.policy_dir.clone().into(),
        ),
        ("PYCELL_ENV_STORE".into(), config.env_store.clone().into()),
        ("PYCELL_JAILER".into(), jailer.into()),
        ("PYCELL_UID_RANGE".into(), uids.into()),
        (
            "PYCELL_CGROUP_PARENT".into(),
            launcher.cgroup_parent.clone().into(),
        ),
    ];
    // The install's proxy goes upstream as pycelld's environment says;
    // a test's uv comes from PYCELL_UV.
    env.extend(
        std::env::vars_os()
            .filter_map(|(k, v)| Some((k.into_string().ok()?, v)))
            .filter(|(k, _)| passed_to_builders(k)),
    );
    Ok((exe, env))
}

impl Builders {
    /// Start building `deps` for `policy`: the builder, and the read end of
    /// its progress (a line per step).
    pub fn start(&self, policy: &str, deps: &DepsRequest) -> std::io::Result<(Child, OwnedFd)> {
        let mut child = self
            .command(&Job::BuildEnv {
                policy: policy.to_string(),
                deps: deps.clone(),
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()?;
        let progress = child.stderr.take().map(OwnedFd::from);
        let progress = progress.ok_or_else(|| std::io::Error::other("no stderr pipe"))?;
        Ok((child, progress))
    }

    /// Start collecting envs past the configured caps (reaped, unwatched,
    /// by the monitor's loop).
    pub fn collect_garbage(&self, config: &Config) -> std::io::Result<()> {
        let job = Job::CollectEnvs {
            max_size_bytes: config.env_store_max_size,
            max_age_secs: config.env_max_age.as_secs(),
        };
        self.command(&job)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map(drop)
    }

    /// When a builder whose install jail may take `install_timeout` is
    /// stopped.
    pub fn deadline(&self, install_timeout: Duration) -> Instant {
        Instant::now() + install_timeout * 2 + BUILD_SLACK
    }
}

/// The store and every directory above it must be root's and writable by
/// root only (the jailer's rule for bind sources): whoever else could write
/// one could swap an env that runs mount. The jailer refuses such mounts
/// too; this says so at start.
pub fn check_store_path(store: &Path) -> Result<(), EnvsError> {
    use std::os::unix::fs::MetadataExt;
    for dir in store.ancestors() {
        let m = std::fs::metadata(dir).map_err(|source| EnvsError::Stat {
            dir: dir.to_path_buf(),
            source,
        })?;
        pycell_wire::spec::trusted(m.uid(), m.gid(), m.mode()).map_err(|why| {
            EnvsError::Untrusted {
                dir: dir.to_path_buf(),
                why,
            }
        })?;
    }
    Ok(())
}

/// Why pycelld cannot build dependency envs (its runs with dependencies
/// are then refused with this reason).
#[derive(Debug, thiserror::Error)]
pub enum EnvsError {
    #[error("locating pycelld: {0}")]
    Locate(std::io::Error),
    #[error("{0}")]
    Jailer(String),
    #[error("the env store {}: {source}", path.display())]
    Open {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{}: {source}", dir.display())]
    Stat {
        dir: PathBuf,
        source: std::io::Error,
    },
    #[error("{} {why}: the env store and the directories above it must be root's and writable by root only", dir.display())]
    Untrusted {
        dir: PathBuf,
        why: pycell_wire::spec::Untrusted,
    },
}

/// The environment variables pycelld passes on to builders besides its own
/// settings: the proxy settings and `PYCELL_UV`.
fn passed_to_builders(name: &str) -> bool {
    name == "PYCELL_UV" || crate::config::is_proxy_setting(name)
}

impl Build {
    pub fn new(
        req: u64,
        peer: PeerIds,
        order: RunOrder,
        policy: String,
        key: String,
        child: Child,
        deadline: Instant,
    ) -> Build {
        Build {
            req,
            peer,
            order,
            grant_sources: Vec::new(),
            policy,
            key,
            stopper: Stopper::new(
                child.id(),
                Some(TokioInstant::from_std(deadline)),
                KILL_GRACE,
            ),
            child,
            started: Instant::now(),
        }
    }

    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// Ask the builder to stop (it stops its install jail, which cleans up).
    pub fn stop(&mut self) {
        self.stopper.stop();
    }

    /// Stop a builder past its deadline; SIGKILL one that ignored SIGTERM.
    pub fn escalate(&mut self) {
        if self.stopper.escalate() == Some(Escalation::Stopped) {
            tracing::warn!(
                peer_uid = self.peer.uid,
                policy = %self.policy,
                layer = "dependencies",
                "the env build for request {} ran past its deadline; stopping it",
                self.req
            );
        }
    }

    /// How long it has been going.
    pub fn elapsed(&self) -> Duration {
        self.started.elapsed()
    }

    /// The env, or why there is none, once the builder was reaped with
    /// `status` (as the audit log words it).
    pub fn outcome(&mut self, status: &str) -> Result<EnvReport, JailFailure> {
        let mut out = Vec::new();
        if let Some(stdout) = self.child.stdout.take() {
            let _ = stdout.take(OUTCOME_CAP).read_to_end(&mut out);
        }
        let _ = self.child.try_wait();
        self.stopper.reaped();
        let stopped = self.stopper.told();
        read_outcome(&out, status, stopped, self.started.elapsed())
    }
}

/// What a builder's stdout says (pure: unit-tested).
pub fn read_outcome(
    stdout: &[u8],
    status: &str,
    stopped: bool,
    took: Duration,
) -> Result<EnvReport, JailFailure> {
    match serde_json::from_slice::<BuildOutcome>(stdout) {
        Ok(BuildOutcome::Ready { env }) => Ok(env),
        Ok(BuildOutcome::Failed { failure }) => Err(failure),
        Err(_) if stopped => Err(deps::failure(
            FailureCode::DepsInstallLimit,
            format!(
                "installing the dependencies was stopped after {:.0} s (the run was cancelled, pycelld is stopping, or the install ran past its deadline)",
                took.as_secs_f64()
            ),
        )),
        Err(e) => Err(deps::failure(
            FailureCode::DepsInstallFailed,
            format!("the env builder ({status}) gave no outcome ({e})"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_proxy_settings_and_the_test_uv_pass_to_builders() {
        for v in ["PYCELL_UV", "HTTPS_PROXY", "no_proxy"] {
            assert!(passed_to_builders(v), "{v}");
        }
        for v in [
            "PATH",
            "LD_PRELOAD",
            "PYCELL_ENV_STORE",
            "PYCELL_POLICY_DIR",
        ] {
            assert!(!passed_to_builders(v), "{v}");
        }
    }

    #[test]
    fn a_builder_outcome_is_read_or_explained() {
        let took = Duration::from_secs(3);
        let ready = br#"{"outcome":"ready","env":{"key":"ab","packages":[{"name":"six","version":"1.16.0"}],"cache":"miss","install_ms":12.5}}"#;
        let env = read_outcome(ready, "exited 0", false, took).unwrap();
        assert_eq!((env.key.as_str(), env.packages.len()), ("ab", 1));
        let failed = br#"{"outcome":"failed","failure":{"code":"deps_no_wheel","layer":"dependencies","message":"no wheel for x"}}"#;
        let f = read_outcome(failed, "exited 1", false, took).unwrap_err();
        assert_eq!(f.code, FailureCode::DepsNoWheel);
        let f = read_outcome(b"", "killed by SIGKILL", true, took).unwrap_err();
        assert_eq!(f.code, FailureCode::DepsInstallLimit);
        let f = read_outcome(b"garbage", "exited 101", false, took).unwrap_err();
        assert_eq!(f.code, FailureCode::DepsInstallFailed);
        assert!(f.message.contains("exited 101"), "{}", f.message);
    }
}
