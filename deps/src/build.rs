//! From a run's [`DepsRequest`] to an env it can use: found in the store,
//! or built once in the install jail (whoever asks for the same request
//! meanwhile waits for that build) and published.

use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use pycell_policy::{Interpreter, Policy};
use serde::{Deserialize, Serialize};

use crate::store::{read_file_at, EnvInUse, EnvMeta, EnvStore};
use crate::{digest, failure, fonts, install, request_key, DepsRequest};
use pycell_launch::launcher::{LaunchError, Launcher, PolicyChoice, Prepared};
use pycell_launch::resolve::Extras;
use pycell_protocol::messages::RunRequest;
use pycell_protocol::result::Package;
use pycell_protocol::result::{CacheOutcome, EnvReport, RunResult};
use pycell_wire::codes::FailureCode;
use pycell_wire::report::{JailFailure, RunStatus};

/// Runs the install jail for [`ensure_env`]; each mode has its own way to
/// start and supervise a jailer.
pub trait InstallRunner {
    /// Run `prepared` to its end. Each line the install script prints on
    /// stdout is a progress message for `progress`. Returns the result and
    /// the jail's /workspace (see `Started::take_workspace`).
    fn run_install(
        &mut self,
        prepared: Prepared,
        progress: &mut dyn FnMut(&str),
    ) -> (RunResult, Option<OwnedFd>);
}

/// Splits the install script's stdout into progress lines.
#[derive(Debug, Default)]
pub struct ProgressLines {
    partial: Vec<u8>,
}

impl ProgressLines {
    /// Take a chunk; call `progress` for every line it completes.
    pub fn feed(&mut self, bytes: &[u8], progress: &mut dyn FnMut(&str)) {
        self.partial.extend_from_slice(bytes);
        while let Some(at) = self.partial.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = self.partial.drain(..=at).collect();
            let line = String::from_utf8_lossy(&line[..at]);
            if !line.trim().is_empty() {
                progress(line.trim_end());
            }
        }
    }
}

/// An env ready for a run: in use until dropped.
#[derive(Debug)]
pub struct Ensured {
    pub env: EnvInUse,
    pub report: EnvReport,
}

/// What install.py writes to /workspace/report.json.
#[derive(Debug, Deserialize)]
struct InstallReport {
    python: String,
    platform: String,
    packages: Vec<Package>,
}

fn unavailable(m: impl Into<String>) -> JailFailure {
    failure(FailureCode::DepsUnavailable, m)
}

pub fn report(env: &EnvInUse, cache: CacheOutcome, install_ms: f64) -> EnvReport {
    EnvReport {
        key: env.meta.key.clone(),
        packages: env.meta.packages.clone(),
        cache,
        install_ms,
    }
}

/// What building a run's env takes: its install policy and job, and the
/// key under which the store answers the request.
#[derive(Debug)]
pub struct Plan {
    install_policy: Policy,
    job: install::InstallJob,
    /// The request's key in the store ([`request_key`]).
    pub key: String,
}

impl Plan {
    /// How long the install jail may run.
    pub fn install_timeout(&self) -> std::time::Duration {
        self.install_policy.limits.wall_timeout
    }
}

/// The [`Plan`] for `deps` under `policy` (the install policy loaded, uv
/// found); nothing is built or looked up yet.
pub fn plan(launcher: &Launcher, policy: &Policy, deps: &DepsRequest) -> Result<Plan, JailFailure> {
    let Interpreter::HostPython(python) = &policy.interpreter else {
        return Err(failure(
            FailureCode::DepsNotAllowed,
            format!(
                "policy {:?} runs a fixed venv; it cannot install dependencies",
                policy.name
            ),
        ));
    };
    let install_policy = launcher
        .load_policy(PolicyChoice::Name(&policy.dependencies.install_policy))
        .map_err(|e| unavailable(format!("the install policy: {}", e.failure().message)))?;
    let uv = install::find_uv()?;
    let job = install::job(&install_policy, python, deps, &uv)?;
    let key = request_key(deps, python, &job.source);
    Ok(Plan {
        install_policy,
        job,
        key,
    })
}

/// How an env build ends, as a builder prints it on its stdout: what
/// pycelld reads from the builder it starts for a run's env (`pycelld
/// --job`), and what `pycell env build --json` prints.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "snake_case", deny_unknown_fields)]
pub enum BuildOutcome {
    Ready { env: EnvReport },
    Failed { failure: JailFailure },
}

/// The env for `deps` under `policy`: from `store`, or built now by
/// `runner` in the jail of the policy's install policy.
pub fn ensure_env(
    launcher: &Launcher,
    store: &EnvStore,
    policy: &Policy,
    deps: &DepsRequest,
    runner: &mut dyn InstallRunner,
    progress: &mut dyn FnMut(&str),
) -> Result<Ensured, JailFailure> {
    let Plan {
        install_policy,
        job,
        key,
    } = plan(launcher, policy, deps)?;
    if let Some(env) = store.lookup(&key) {
        return Ok(Ensured {
            report: report(&env, CacheOutcome::Hit, 0.0),
            env,
        });
    }
    let _building = store.build_lock(&key).map_err(|e| {
        unavailable(format!(
            "locking the env store {}: {e}",
            store.root().display()
        ))
    })?;
    if let Some(env) = store.lookup(&key) {
        return Ok(Ensured {
            report: report(&env, CacheOutcome::Hit, 0.0),
            env,
        });
    }
    let started = Instant::now();
    let prepared = launcher
        .prepare_with(&install_policy, &job.request, &job.extras)
        .map_err(|e: LaunchError| {
            unavailable(format!("the install jail: {}", e.failure().message))
        })?;
    let (result, workspace) = runner.run_install(prepared, progress);
    if result.status != RunStatus::Ok {
        return Err(install::classify(&result, &install_policy.name));
    }
    let workspace = workspace.ok_or_else(|| {
        failure(
            FailureCode::DepsInstallFailed,
            "the install jail ended without handing out its workspace",
        )
    })?;
    let install_ms = started.elapsed().as_secs_f64() * 1000.0;
    let meta = built_meta(&workspace, deps, install_ms)?;
    let n = meta.packages.len();
    let plural = if n == 1 { "" } else { "s" };
    progress(&format!(
        "env {} ready ({n} package{plural})",
        &meta.key[..12]
    ));
    let mut fonts = |staged: &Path| add_font_cache(launcher, policy, staged, runner, progress);
    let env = store
        .publish(&key, workspace.as_fd(), "env", meta, &mut fonts)
        .map_err(|m| {
            failure(
                FailureCode::DepsInstallFailed,
                format!("storing the env: {m}"),
            )
        })?;
    Ok(Ensured {
        report: report(&env, CacheOutcome::Miss, install_ms),
        env,
    })
}

/// matplotlib's font cache for the env at `staged`, if it has matplotlib
/// (see [`crate::fonts`]), built by a jail of the run's own policy. An env
/// without one still works (its plotting runs build the list, as
/// matplotlib does anywhere), so a failure is said and the env published
/// without.
fn add_font_cache(
    launcher: &Launcher,
    policy: &Policy,
    staged: &Path,
    runner: &mut dyn InstallRunner,
    progress: &mut dyn FnMut(&str),
) {
    if !fonts::has_matplotlib(staged) {
        return;
    }
    match build_font_cache(launcher, policy, staged, runner) {
        Ok(()) => progress("matplotlib's font cache built"),
        Err(m) => progress(&format!(
            "matplotlib's font cache not built ({m}); plotting runs will build it each time"
        )),
    }
}

/// Why matplotlib's font cache was not built (the env is published
/// without it).
#[derive(Debug, thiserror::Error)]
enum FontCacheError {
    #[error("{0}")]
    NotPrepared(String),
    #[error("its jail ended {status}: {why}")]
    JailEnded { status: &'static str, why: String },
    #[error(transparent)]
    NotAFontList(#[from] fonts::NotAFontList),
    #[error("keeping it in the env: {0}")]
    NotKept(#[from] std::io::Error),
}

fn build_font_cache(
    launcher: &Launcher,
    policy: &Policy,
    staged: &Path,
    runner: &mut dyn InstallRunner,
) -> Result<(), FontCacheError> {
    let request = RunRequest {
        code: fonts::BUILD_CODE.into(),
        ..RunRequest::default()
    };
    let extras = Extras {
        env: Some(staged.to_path_buf()),
        ..Extras::default()
    };
    let prepared = launcher
        .prepare_with(policy, &request, &extras)
        .map_err(|e| FontCacheError::NotPrepared(e.failure().message))?;
    let (result, _) = runner.run_install(prepared, &mut |_| {});
    if result.status != RunStatus::Ok {
        let why = result.stderr.lines().last().unwrap_or_default().to_string();
        let status = result.status.as_str();
        return Err(FontCacheError::JailEnded { status, why });
    }
    let (name, body) = fonts::parse_output(&result.stdout)?;
    Ok(fonts::store(staged, name, body)?)
}

/// The env's record, from what the install script left in its workspace.
fn built_meta(
    workspace: &OwnedFd,
    deps: &DepsRequest,
    install_ms: f64,
) -> Result<EnvMeta, JailFailure> {
    let broken = |m: &dyn std::fmt::Display| {
        failure(
            FailureCode::DepsInstallFailed,
            format!("the install's output: {m}"),
        )
    };
    let text = read_file_at(workspace.as_fd(), "report.json", 1 << 20).map_err(|e| broken(&e))?;
    let r: InstallReport =
        serde_json::from_str(&text).map_err(|e| broken(&format!("report.json: {e}")))?;
    let lock = read_file_at(workspace.as_fd(), "lock.txt", 16 << 20).map_err(|e| broken(&e))?;
    let key = digest([
        // v2: envs are byte-compiled (install.py); v3: an env with
        // matplotlib has its font cache (`fonts`). Older envs are not
        // found again, so each is rebuilt once, and the gc removes them.
        b"pycell-env-v3".as_slice(),
        r.python.as_bytes(),
        r.platform.as_bytes(),
        lock.as_bytes(),
    ]);
    Ok(EnvMeta {
        key,
        python: r.python,
        platform: r.platform,
        packages: r.packages,
        requirements: deps.requirements.iter().map(|r| r.to_string()).collect(),
        built_at: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
        install_ms,
        size_bytes: 0,
    })
}

/// The env store of embedded mode: `$PYCELL_ENV_STORE`, else
/// [`crate::store::EMBEDDED_STORE`].
pub fn embedded_store() -> Result<EnvStore, JailFailure> {
    let root = std::env::var_os("PYCELL_ENV_STORE")
        .filter(|p| !p.is_empty())
        .map(PathBuf::from);
    open_store(root.as_deref())
}

/// The env store at `root` (default [`crate::store::EMBEDDED_STORE`]),
/// created if need be.
pub fn open_store(root: Option<&std::path::Path>) -> Result<EnvStore, JailFailure> {
    let root = root.unwrap_or(std::path::Path::new(crate::store::EMBEDDED_STORE));
    let store = EnvStore::open(root).map_err(|e| {
        unavailable(format!("the env store {}: {e}", root.display()))
            .with_hint("run as root, or set PYCELL_ENV_STORE to a directory root owns")
    })?;
    store_path_problem(root).map_or(Ok(store), |why| {
        Err(unavailable(format!("the env store {}: {why}", root.display())).with_hint(
            "runs mount their envs from it, and the jailer mounts only what root owns and no one else may write, on a path of such directories without symlinks: set PYCELL_ENV_STORE to such a directory (the default is /var/cache/pycell)",
        ))
    })
}

/// Why the jailer would refuse to mount envs from the store at `root`
/// (each directory from `/` to it owned by root, writable by no one
/// else, and no symlink): found before anything is installed into it.
fn store_path_problem(root: &std::path::Path) -> Option<String> {
    let mut at = std::path::PathBuf::new();
    for part in root.components() {
        at.push(part);
        let meta = match std::fs::symlink_metadata(&at) {
            Ok(m) => m,
            Err(e) => return Some(format!("{}: {e}", at.display())),
        };
        if meta.file_type().is_symlink() {
            return Some(format!("{} is a symlink", at.display()));
        }
        use std::os::unix::fs::MetadataExt;
        if let Err(why) = pycell_wire::spec::trusted(meta.uid(), meta.gid(), meta.mode()) {
            return Some(format!("{} {why}", at.display()));
        }
    }
    None
}
