//! From a policy and a [`RunRequest`] to a fully resolved [`JailSpec`]:
//! which host paths are mounted where, the exact argv and environment, and
//! every limit in the jailer's units. The first step of every launch (see
//! [`crate::launch`]).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use pycell_policy::{Bytes, Interpreter, NetworkMode, Policy, RunLimits};
use pycell_wire::spec::{
    BindMount, CgroupSpec, DisplayLimits, ImageLimits, JailSpec, LandlockSpec, MediaLimits,
    NetworkSpec, WorkspaceFile, CA_CERTIFICATES, EGRESS_PROXY_PORT, WORKSPACE,
};

use pycell_protocol::messages::{
    decode_b64, LimitOverrides, RunRequest, MAX_CODE_BYTES, MAX_INPUT_FILES,
};

/// Where policies installed by the operator live.
pub const POLICY_DIR: &str = "/etc/pycell/policies";
/// In-jail mount point of a venv interpreter.
pub use pycell_wire::spec::VENV_TARGET;
/// Parent of embedded runs' cgroups, relative to the jailer's own cgroup in
/// each hierarchy (pycelld uses its delegated subtree's `runs` instead).
pub const CGROUP_PARENT: &str = "pycell";

#[derive(Debug, thiserror::Error)]
pub enum ResolveError {
    #[error("{0}")]
    Policy(#[from] pycell_policy::PolicyError),
    #[error("no policy named {name:?}; available: {available}")]
    UnknownPolicy { name: String, available: String },
    #[error("{field}: {problem}")]
    BadRequest {
        field: &'static str,
        problem: String,
    },
    #[error("{0}")]
    Interpreter(String),
}

/// A policy by name: the operator's `<dir>/NAME.toml` if present, else the
/// built-in copy. Names only: a client never picks a file by path here.
pub fn load_policy_by_name(name: &str, dir: &Path) -> Result<Policy, ResolveError> {
    if !pycell_policy::is_valid_name(name) {
        return Err(ResolveError::BadRequest {
            field: "policy",
            problem: format!("{name:?} is not a policy name ([a-z0-9][a-z0-9_-]*)"),
        });
    }
    let installed = dir.join(format!("{name}.toml"));
    if installed.exists() {
        return Ok(Policy::load(&installed)?);
    }
    if pycell_policy::builtin::source(name).is_some() {
        return Ok(pycell_policy::builtin::load(name)?);
    }
    Err(ResolveError::UnknownPolicy {
        name: name.to_string(),
        available: policy_names(dir).join(", "),
    })
}

/// Names of the policy files installed in `dir` (`NAME.toml`), sorted.
fn installed_names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_str()?.strip_suffix(".toml")?.to_string();
            pycell_policy::is_valid_name(&name).then_some(name)
        })
        .collect();
    names.sort();
    names
}

/// Names of the policies a run may name (installed or built in), sorted.
pub fn policy_names(dir: &Path) -> Vec<String> {
    let mut names = installed_names(dir);
    for b in pycell_policy::builtin::names() {
        if !names.iter().any(|n| n == b) {
            names.push((*b).to_string());
        }
    }
    names.sort();
    names
}

/// A limit a request may raise: (name, asked, ceiling, how to show it).
type RaiseCheck<'a> = (&'a str, Option<u64>, u64, fn(u64) -> String);

/// The policy's limits with the request's overrides applied and checked: a
/// request may lower any limit, and raise one only up to the policy's
/// ceiling (`[limits.max]`).
pub fn effective_limits(policy: &Policy, o: &LimitOverrides) -> Result<RunLimits, ResolveError> {
    let mut l = policy.limits.clone();
    let c = &policy.ceilings;
    if let Some(secs) = o.timeout_s {
        l.wall_timeout = pycell_policy::timeout_from_secs(secs, pycell_policy::MAX_WALL_TIMEOUT)
            .map_err(|e| bad_request("timeout", e.to_string()))?;
    }
    let over = |name: &str, asked: String, ceiling: String| {
        ResolveError::BadRequest {
        field: "limits",
        problem: format!(
            "{name} {asked} is above what policy {:?} allows ({ceiling}, its [limits.max] {name}); ask for at most that, or use a policy that allows more",
            policy.name
        ),
    }
    };
    if l.wall_timeout > c.wall_timeout {
        let d = pycell_policy::format_duration;
        return Err(over("timeout", d(l.wall_timeout), d(c.wall_timeout)));
    }
    let checks: [RaiseCheck; 4] = [
        (
            "memory",
            o.memory_bytes,
            c.memory.get(),
            pycell_policy::format_size,
        ),
        ("pids", o.pids.map(u64::from), u64::from(c.pids), |n| {
            n.to_string()
        }),
        (
            "disk",
            o.disk_bytes,
            c.disk.get(),
            pycell_policy::format_size,
        ),
        (
            "max_output",
            o.max_output_bytes,
            c.max_output.get(),
            pycell_policy::format_size,
        ),
    ];
    for (name, asked, ceiling, show) in checks {
        if let Some(asked) = asked.filter(|a| *a > ceiling) {
            return Err(over(name, show(asked), show(ceiling)));
        }
    }
    if let Some(m) = o.memory_bytes {
        l.memory = Bytes(m);
    }
    if let Some(p) = o.pids {
        l.pids = p;
    }
    if let Some(d) = o.disk_bytes {
        l.disk = Bytes(d);
    }
    if let Some(m) = o.max_output_bytes {
        l.max_output = Bytes(m);
    }
    pycell_policy::check_limits(&l)
        .map_err(|problem| bad_request("limits", problem.to_string()))?;
    Ok(l)
}

/// Limits another process settled for a run under `policy` (pycelld's
/// broker, from the client's request), checked as root checks them before
/// it launches anything (not resolved again): the ones a request may set
/// in their ranges and within the policy's ceilings, every other one the
/// policy's own.
pub fn settled_limits(policy: &Policy, settled: &RunLimits) -> Result<RunLimits, ResolveError> {
    let (p, c) = (&policy.limits, &policy.ceilings);
    let settable_only = RunLimits {
        wall_timeout: settled.wall_timeout,
        memory: settled.memory,
        pids: settled.pids,
        disk: settled.disk,
        max_output: settled.max_output,
        ..p.clone()
    };
    let within = settled.wall_timeout <= c.wall_timeout
        && settled.memory <= c.memory
        && settled.pids <= c.pids
        && settled.disk <= c.disk
        && settled.max_output <= c.max_output;
    if settable_only != *settled || !within {
        return Err(bad_request(
            "limits",
            format!(
                "{settled:?} are not limits policy {:?} gives a run",
                policy.name
            ),
        ));
    }
    pycell_policy::check_limits(settled)
        .map_err(|problem| bad_request("limits", problem.to_string()))?;
    Ok(settled.clone())
}

/// The file name the code gets in /workspace: a plain name, else `main.py`.
pub fn script_name(requested: Option<&str>) -> String {
    requested
        .map(|n| {
            Path::new(n)
                .file_name()
                .map(|f| f.to_string_lossy().into_owned())
                .unwrap_or_default()
        })
        .filter(|n| !n.is_empty() && n != "." && n != ".." && !n.contains('\0'))
        .unwrap_or_else(|| "main.py".to_string())
}

/// Is `path` (host) reachable at the same path inside the jail through one
/// of `mounts` (which all map source == target for the interpreter's prefix)?
pub(crate) fn covered(path: &Path, mounts: &[BindMount]) -> bool {
    mounts
        .iter()
        .any(|m| m.source == m.target && path.starts_with(&m.source))
}

/// The interpreter: argv[0] in the jail and any extra mounts it needs.
fn interpreter(policy: &Policy, mounts: &mut Vec<BindMount>) -> Result<String, ResolveError> {
    match &policy.interpreter {
        Interpreter::HostPython(py) => {
            let real = std::fs::canonicalize(py).map_err(|e| {
                ResolveError::Interpreter(format!(
                    "policy {}: interpreter {}: {e} (install it, e.g. `apt-get install python3`, or point [interpreter] python at an existing one)",
                    policy.name,
                    py.display()
                ))
            })?;
            if !covered(py, mounts) || !covered(&real, mounts) {
                return Err(ResolveError::Interpreter(format!(
                    "policy {}: interpreter {} (really {}) is not inside any of the policy's [[mounts]]; add a read-only mount of its prefix",
                    policy.name,
                    py.display(),
                    real.display()
                )));
            }
            Ok(py.to_string_lossy().into_owned())
        }
        Interpreter::Venv(dir) => {
            let cfg_path = dir.join("pyvenv.cfg");
            let cfg = std::fs::read_to_string(&cfg_path).map_err(|e| {
                ResolveError::Interpreter(format!(
                    "policy {}: venv {} has no readable pyvenv.cfg ({e}); create it with `uv venv --python /usr/bin/python3 {}`",
                    policy.name,
                    dir.display(),
                    dir.display()
                ))
            })?;
            let home = venv_home(&cfg).ok_or_else(|| {
                ResolveError::Interpreter(format!("{}: no `home = ...` line", cfg_path.display()))
            })?;
            check_venv_home(&cfg_path, &home)?;
            let real = std::fs::canonicalize(dir.join("bin/python")).map_err(|e| {
                ResolveError::Interpreter(format!("venv {}: bin/python: {e}", dir.display()))
            })?;
            // The base interpreter the venv points at must be visible at its
            // own path; mount its prefix read-only if the policy doesn't.
            for needed in [&home, &real] {
                if !covered(needed, mounts) {
                    let prefix = needed
                        .ancestors()
                        .find(|a| a.join("lib").is_dir() && a.join("bin").is_dir())
                        .filter(|prefix| *prefix != Path::new("/"))
                        .ok_or_else(|| {
                            ResolveError::Interpreter(format!(
                                "venv {}: cannot find the prefix of its base interpreter {}",
                                dir.display(),
                                needed.display()
                            ))
                        })?;
                    mounts.push(BindMount::new(prefix.to_path_buf(), prefix.to_path_buf()));
                }
            }
            mounts.push(BindMount::new(dir.clone(), PathBuf::from(VENV_TARGET)));
            Ok(format!("{VENV_TARGET}/bin/python"))
        }
    }
}

/// The `home = ...` of a venv's pyvenv.cfg: its base interpreter's directory.
fn venv_home(cfg: &str) -> Option<PathBuf> {
    cfg.lines().find_map(|l| {
        let (k, v) = l.split_once('=')?;
        (k.trim() == "home").then(|| PathBuf::from(v.trim()))
    })
}

/// A venv's `home` decides what host directory the jail gets mounted, so it
/// must be a plain absolute path below `/` (the jailer then insists that it
/// and every directory above it are root's and writable by no one else).
pub(crate) fn check_venv_home(cfg: &Path, home: &Path) -> Result<(), ResolveError> {
    let text = home.to_string_lossy();
    let plain = text.starts_with('/')
        && text[1..]
            .split('/')
            .all(|seg| !seg.is_empty() && seg != "." && seg != "..");
    if !plain || home == Path::new("/") || home.as_os_str().len() > 4096 {
        return Err(ResolveError::Interpreter(format!(
            "{}: home = {} must be the absolute path of the base interpreter's bin directory (no `.`, `..`, not /); recreate the venv with `uv venv --python /usr/bin/python3 DIR`",
            cfg.display(),
            home.display()
        )));
    }
    Ok(())
}

/// Everything but the sandbox uid/gid and run id, which the caller allocates.
#[derive(Debug)]
pub struct Resolved {
    pub spec: JailSpec,
    pub limits: RunLimits,
}

fn bad_request(field: &'static str, problem: impl Into<String>) -> ResolveError {
    ResolveError::BadRequest {
        field,
        problem: problem.into(),
    }
}

/// The request's stdin, after checking the sizes and arguments it carries.
fn checked_input(req: &RunRequest) -> Result<Vec<u8>, ResolveError> {
    req.check_bounds()
        .map_err(|e| bad_request(e.field, e.problem))?;
    let max_mib = MAX_CODE_BYTES >> 20;
    let stdin = req
        .stdin_bytes()
        .map_err(|p| bad_request("stdin", p.to_string()))?;
    if stdin.len() > MAX_CODE_BYTES {
        return Err(bad_request(
            "stdin",
            format!("more than the {max_mib} MiB allowed"),
        ));
    }
    Ok(stdin)
}

/// The request's input files, checked: plain names, none the script's,
/// each once, at most [`MAX_INPUT_FILES`], [`MAX_CODE_BYTES`] together.
fn input_files(req: &RunRequest) -> Result<Vec<WorkspaceFile>, ResolveError> {
    if req.files.len() > MAX_INPUT_FILES {
        return Err(bad_request(
            "files",
            format!("{} files; at most {MAX_INPUT_FILES}", req.files.len()),
        ));
    }
    let encoded: usize = req.files.iter().map(|f| f.data_base64.len()).sum();
    if encoded / 4 * 3 > MAX_CODE_BYTES {
        return Err(bad_request(
            "files",
            format!(
                "more than the {} MiB allowed together",
                MAX_CODE_BYTES >> 20
            ),
        ));
    }
    let script = script_name(req.filename.as_deref());
    let mut files = Vec::with_capacity(req.files.len());
    for f in &req.files {
        let n = f.name.as_str();
        let plain =
            !n.is_empty() && n.len() <= 255 && !n.contains(['/', '\0']) && n != "." && n != "..";
        if !plain {
            return Err(bad_request("files", format!("{n:?} is not a plain file name (no '/'): input files go directly into /workspace")));
        }
        if n == script || files.iter().any(|w: &WorkspaceFile| w.name == n) {
            return Err(bad_request(
                "files",
                format!("{n:?} is given twice (or is the script's own name)"),
            ));
        }
        let data =
            decode_b64(&f.data_base64).map_err(|e| bad_request("files", format!("{n:?}: {e}")))?;
        files.push(WorkspaceFile {
            name: n.to_string(),
            contents: String::new(),
            data,
        });
    }
    Ok(files)
}

/// What a launch adds to what its policy and request give: the env a run
/// gets as its venv, the install jail's extra mounts and files.
#[derive(Debug, Clone, Default)]
pub struct Extras {
    /// A venv from the env store, mounted read-only at [`VENV_TARGET`]; its
    /// base interpreter is the policy's.
    pub env: Option<PathBuf>,
    /// More read-only binds (source == target).
    pub mounts: Vec<PathBuf>,
    /// More files in /workspace.
    pub files: Vec<WorkspaceFile>,
    /// See [`JailSpec::export_workspace`].
    pub export_workspace: bool,
    /// RunLimits settled already (by pycelld's broker, checked by its
    /// monitor with [`settled_limits`]): the run gets these, and the
    /// request's overrides are not resolved again.
    pub limits: Option<RunLimits>,
}

/// A store env as the run's interpreter: its pyvenv.cfg must point at the
/// policy's own interpreter's directory (pycell's install built it so).
fn env_interpreter(
    policy: &Policy,
    env: &Path,
    mounts: &mut Vec<BindMount>,
) -> Result<String, ResolveError> {
    let Interpreter::HostPython(py) = &policy.interpreter else {
        return Err(ResolveError::Interpreter(format!(
            "policy {}: a venv policy cannot take an env of installed dependencies",
            policy.name
        )));
    };
    let cfg_path = env.join("pyvenv.cfg");
    let cfg = std::fs::read_to_string(&cfg_path)
        .map_err(|e| ResolveError::Interpreter(format!("{}: {e}", cfg_path.display())))?;
    let home = venv_home(&cfg);
    if home.as_deref() != py.parent() {
        return Err(ResolveError::Interpreter(format!(
            "{}: built for another interpreter than policy {}'s {}",
            cfg_path.display(),
            policy.name,
            py.display()
        )));
    }
    mounts.push(BindMount {
        hide_source: true,
        ..BindMount::new(env, VENV_TARGET)
    });
    Ok(format!("{VENV_TARGET}/bin/python"))
}

pub fn resolve(policy: &Policy, req: &RunRequest) -> Result<Resolved, ResolveError> {
    resolve_with(policy, req, &Extras::default())
}

/// Whether `policy` is for what `req` asks (a run, or a server over
/// stdio); the install jail itself (it exports its workspace) is no run.
fn check_purpose(policy: &Policy, req: &RunRequest, extras: &Extras) -> Result<(), ResolveError> {
    match policy.purpose_problem(req.serve_stdio) {
        Some(problem) if !extras.export_workspace => Err(ResolveError::BadRequest {
            field: "policy",
            problem,
        }),
        _ => Ok(()),
    }
}

pub fn resolve_with(
    policy: &Policy,
    req: &RunRequest,
    extras: &Extras,
) -> Result<Resolved, ResolveError> {
    check_purpose(policy, req, extras)?;
    let stdin = checked_input(req)?;
    let limits = match &extras.limits {
        Some(settled) => settled.clone(),
        None => effective_limits(policy, &req.limits)?,
    };
    let (python, mounts) = python_and_mounts(policy, extras)?;
    let name = script_name(req.filename.as_deref());
    // -s: no user site-packages (HOME is the workspace; nothing to find there).
    let mut argv = vec![python, "-s".to_string(), format!("{WORKSPACE}/{name}")];
    argv.extend(req.args.iter().cloned());
    let l = &policy.landlock;
    let mut env = jail_env(policy, &req.env);
    if let Some(venv) = &extras.env {
        env.extend(matplotlib_cache_env(venv, &env));
    }
    let spec = JailSpec {
        run_id: String::new(),
        sandbox_uid: 0,
        sandbox_gid: 0,
        argv,
        env,
        files: std::iter::once(WorkspaceFile::text(name, req.code.clone()))
            .chain(input_files(req)?)
            .chain(extras.files.iter().cloned())
            .collect(),
        stdin,
        mounts,
        limits: limits.clone(),
        landlock: LandlockSpec {
            min_abi: l.min_abi,
            read_exec: l.read_exec.clone(),
            read_only: l.read_only.clone(),
            read_write: l.read_write.clone(),
        },
        seccomp_profile: policy.seccomp_profile.clone(),
        cgroup: CgroupSpec {
            parent: CGROUP_PARENT.to_string(),
            keep: false,
        },
        network: match policy.network {
            NetworkMode::None => NetworkSpec::Loopback,
            NetworkMode::Allowlist(_) => NetworkSpec::Proxy {
                port: EGRESS_PROXY_PORT,
            },
        },
        export_workspace: extras.export_workspace,
        warm: false,
        session: None,
        // An install jail runs uv, and a server over stdio its own
        // program, not the runner.
        media: (!extras.export_workspace && !req.serve_stdio).then(|| MediaLimits {
            images: image_limits(&policy.images),
            displays: display_limits(&policy.output),
        }),
        // Code mode: the client offered tools (the policy's rules decide,
        // call by call, which the code may use).
        tools: req.tools.is_some() && !extras.export_workspace,
        stdio_socket: req.serve_stdio,
        grants: Vec::new(),
        timings: false,
        zygote: None,
        from_zygote: None,
        // The launcher names one when it starts a cold run.
        runner_pyc: None,
        descriptors: Vec::new(),
    };
    Ok(Resolved { spec, limits })
}

/// A run's interpreter (its env's, if it has one) and read-only mounts:
/// the policy's, the interpreter's, `extras`', and the CA certificates
/// under egress.
fn python_and_mounts(
    policy: &Policy,
    extras: &Extras,
) -> Result<(String, Vec<BindMount>), ResolveError> {
    let mut mounts: Vec<BindMount> = policy
        .mounts
        .iter()
        .map(|m| BindMount::new(m.source.clone(), m.target.clone()))
        .collect();
    let python = match &extras.env {
        Some(env) => {
            interpreter(policy, &mut mounts)?;
            env_interpreter(policy, env, &mut mounts)?
        }
        None => interpreter(policy, &mut mounts)?,
    };
    for extra in &extras.mounts {
        if !covered(extra, &mounts) {
            mounts.push(BindMount::new(extra.clone(), extra.clone()));
        }
    }
    if policy.network.egress().is_some() && Path::new(CA_CERTIFICATES).is_dir() {
        mounts.push(BindMount::new(
            PathBuf::from(CA_CERTIFICATES),
            PathBuf::from(CA_CERTIFICATES),
        ));
    }
    Ok((python, mounts))
}

/// A policy's `[images]` as the runner takes them.
pub fn image_limits(s: &pycell_policy::ImageSettings) -> ImageLimits {
    ImageLimits {
        max_edge: s.max_edge,
        max_bytes: s.max_bytes,
    }
}

/// A policy's `[output]` as the runner takes them.
pub fn display_limits(s: &pycell_policy::OutputSettings) -> DisplayLimits {
    DisplayLimits {
        part_chars: s.part_chars,
        total_bytes: s.display_bytes,
        count: s.displays,
    }
}

/// The variables that point HTTP clients (urllib, requests, httpx, aiohttp
/// with trust_env, pip, uv, curl) at the egress proxy, in both the upper
/// and lower case spellings that different clients read.
pub fn proxy_env(port: u16) -> Vec<(String, String)> {
    let url = format!("http://127.0.0.1:{port}");
    let mut env = Vec::new();
    for (name, value) in [
        ("HTTP_PROXY", url.as_str()),
        ("HTTPS_PROXY", &url),
        ("ALL_PROXY", &url),
        // Nothing bypasses the proxy: a request for a local name reaches it
        // too, and is answered with a reason.
        ("NO_PROXY", ""),
    ] {
        env.push((name.to_string(), value.to_string()));
        env.push((name.to_ascii_lowercase(), value.to_string()));
    }
    env
}

/// Thread pools that size themselves by the host's CPU count (OpenMP,
/// OpenBLAS, MKL, numexpr): in a jail they get the run's CPU bandwidth
/// instead ([`thread_pool_env`]).
pub const THREAD_POOL_VARS: [&str; 4] = [
    "OMP_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "MKL_NUM_THREADS",
    "NUMEXPR_NUM_THREADS",
];

/// Each of [`THREAD_POOL_VARS`] that `env` leaves out, set to `cpus`
/// rounded up: threads beyond the cgroup's CPU quota only spend it
/// (`import numpy` started two OpenBLAS threads on a 2-core host and took
/// about 70 ms longer under `cpus = 1.0` than with one).
pub fn thread_pool_env(cpus: f64, env: &[(String, String)]) -> Vec<(String, String)> {
    let threads = (cpus.ceil() as u64).max(1).to_string();
    THREAD_POOL_VARS
        .iter()
        .filter(|v| !env.iter().any(|(k, _)| k == *v))
        .map(|v| (v.to_string(), threads.clone()))
        .collect()
}

/// The policy's `[env]` with the request's variables over it, then the
/// thread pools' and, with egress, the proxy's (which win).
fn jail_env(policy: &Policy, request: &BTreeMap<String, String>) -> Vec<(String, String)> {
    let proxy = match policy.network {
        NetworkMode::None => Vec::new(),
        NetworkMode::Allowlist(_) => proxy_env(EGRESS_PROXY_PORT),
    };
    let mut vars = policy.env.clone();
    vars.extend(request.iter().map(|(k, v)| (k.clone(), v.clone())));
    let mut env: Vec<(String, String)> = vars
        .iter()
        .filter(|(k, _)| !proxy.iter().any(|(p, _)| p == *k))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    env.extend(thread_pool_env(policy.limits.cpus.get(), &env));
    env.extend(proxy);
    env
}

/// Where an env keeps matplotlib's font cache, built with the env
/// (`pycell_deps::fonts`).
pub const MATPLOTLIB_CACHE_DIR: &str = "share/pycell/matplotlib";
/// Where a run's runner copies it, unless the policy's `[env]` names
/// another `MPLCONFIGDIR` (matplotlib takes only a writable one): on the
/// jail's own tmpfs.
pub const MATPLOTLIB_RUN_DIR: &str = "/tmp/matplotlib";

/// The variables that make a run of `env` (mounted at [`VENV_TARGET`]) use
/// its font cache: where it is, for pycell's runner to copy before the run,
/// and, unless the run's variables so far (`vars`: the policy's own
/// `[env]`) name one, matplotlib's `MPLCONFIGDIR`. None if the env has no
/// cache.
pub fn matplotlib_cache_env(env: &Path, vars: &[(String, String)]) -> Vec<(String, String)> {
    if !env.join(MATPLOTLIB_CACHE_DIR).is_dir() {
        return Vec::new();
    }
    let cache = format!("{VENV_TARGET}/{MATPLOTLIB_CACHE_DIR}");
    let mut out = vec![("PYCELL_MATPLOTLIB_CACHE".to_string(), cache)];
    if !vars.iter().any(|(k, _)| k == "MPLCONFIGDIR") {
        out.push(("MPLCONFIGDIR".into(), MATPLOTLIB_RUN_DIR.into()));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_of_an_env_with_a_font_cache_get_it_where_the_policy_says_or_in_tmp() {
        let env = tempfile::tempdir().unwrap();
        assert!(matplotlib_cache_env(env.path(), &[]).is_empty());
        let dir = env.path().join(MATPLOTLIB_CACHE_DIR);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("fontlist-v3.json"), "{}").unwrap();
        let vars = matplotlib_cache_env(env.path(), &[]);
        let cache = (
            "PYCELL_MATPLOTLIB_CACHE".to_string(),
            "/venv/share/pycell/matplotlib".to_string(),
        );
        let run_dir = ("MPLCONFIGDIR".to_string(), MATPLOTLIB_RUN_DIR.to_string());
        assert_eq!(vars, [cache.clone(), run_dir]);
        let own = [("MPLCONFIGDIR".to_string(), "/workspace/mpl".to_string())];
        assert_eq!(matplotlib_cache_env(env.path(), &own), [cache]);
    }

    use pycell_protocol::messages::{encode_b64, InputFile};

    #[test]
    fn thread_pools_get_the_runs_cpus_unless_the_policy_sets_them() {
        let own = vec![("OMP_NUM_THREADS".to_string(), "8".to_string())];
        let env = thread_pool_env(1.5, &own);
        assert_eq!(env.len(), 3);
        assert!(env.iter().all(|(k, v)| k != "OMP_NUM_THREADS" && v == "2"));
        assert!(thread_pool_env(0.01, &[]).iter().all(|(_, v)| v == "1"));
    }

    fn with_files(names: &[&str]) -> RunRequest {
        RunRequest {
            files: names
                .iter()
                .map(|n| InputFile {
                    name: n.to_string(),
                    data_base64: encode_b64(b"\x00\xffbytes"),
                })
                .collect(),
            ..RunRequest::default()
        }
    }

    #[test]
    fn input_files_are_plain_names_once_with_their_bytes() {
        let files = input_files(&with_files(&["a.csv", "b.bin"])).unwrap();
        assert_eq!(files.len(), 2);
        assert_eq!(files[1].bytes(), b"\x00\xffbytes");
        for bad in [&["d/a.csv"][..], &[".."], &[""], &["a", "a"], &["main.py"]] {
            let e = input_files(&with_files(bad)).unwrap_err();
            assert!(
                matches!(e, ResolveError::BadRequest { field: "files", .. }),
                "{bad:?}: {e}"
            );
        }
        let mut r = with_files(&["a"]);
        r.files[0].data_base64 = "not base64!".into();
        assert!(input_files(&r).is_err());
        let many: Vec<String> = (0..=MAX_INPUT_FILES).map(|i| format!("f{i}")).collect();
        let many: Vec<&str> = many.iter().map(String::as_str).collect();
        assert!(input_files(&with_files(&many)).is_err());
    }

    #[test]
    fn a_python_run_starts_on_the_runner_and_an_install_does_not() {
        let p = pycell_policy::builtin::load("default").unwrap();
        let req = RunRequest {
            code: "print(1)".into(),
            args: vec!["a".into()],
            ..RunRequest::default()
        };
        let spec = resolve_with(&p, &req, &Extras::default()).unwrap().spec;
        let on = pycell_runner::cold_on_runner(&spec).expect("a python run");
        assert_eq!(on.argv[0], spec.argv[0]);
        assert_eq!(on.argv[1..3], ["-s", "-c"]);
        assert_eq!(on.argv[3], pycell_runner::COLD_RUNNER);
        assert_eq!(
            on.argv[4..],
            [
                pycell_runner::COLD_FLAG,
                "1024",
                "1048576",
                "16384",
                "262144",
                "16",
                "/workspace/main.py",
                "a"
            ]
        );
        assert_eq!((on.files.len(), &on.stdin), (spec.files.len(), &spec.stdin));
        let install = Extras {
            export_workspace: true,
            ..Extras::default()
        };
        let spec = resolve_with(&p, &req, &install).unwrap().spec;
        assert!(spec.media.is_none() && pycell_runner::cold_on_runner(&spec).is_none());
    }

    #[test]
    fn script_names() {
        assert_eq!(script_name(None), "main.py");
        assert_eq!(script_name(Some("/a/b/x.py")), "x.py");
        assert_eq!(script_name(Some("..")), "main.py");
        assert_eq!(script_name(Some("")), "main.py");
    }

    #[test]
    fn policies_are_chosen_by_name_only() {
        let dir = tempfile::tempdir().unwrap();
        let e = load_policy_by_name("../etc/passwd", dir.path()).unwrap_err();
        assert!(e.to_string().starts_with("policy: "), "{e}");
        assert!(load_policy_by_name("default", dir.path()).is_ok());
        let e = load_policy_by_name("nope", dir.path()).unwrap_err();
        assert!(e.to_string().contains("no policy named \"nope\""), "{e}");
    }

    #[test]
    fn overrides_are_range_checked() {
        let p = pycell_policy::builtin::load("default").unwrap();
        let o = LimitOverrides {
            memory_bytes: Some(1024),
            ..Default::default()
        };
        assert!(effective_limits(&p, &o)
            .unwrap_err()
            .to_string()
            .contains("memory"));
        let o = LimitOverrides {
            timeout_s: Some(-1.0),
            ..Default::default()
        };
        assert!(effective_limits(&p, &o)
            .unwrap_err()
            .to_string()
            .starts_with("timeout: "));
        let o = LimitOverrides {
            timeout_s: Some(2.5),
            pids: Some(8),
            ..Default::default()
        };
        let l = effective_limits(&p, &o).unwrap();
        assert_eq!(
            (l.wall_timeout, l.pids),
            (std::time::Duration::from_millis(2500), 8)
        );
    }

    /// The attempt of the issue: a client asking the default policy for far
    /// more than it allows is refused, naming each ceiling; up to the
    /// ceiling is allowed; lowering is always allowed.
    #[test]
    fn raising_a_limit_stops_at_the_policy_ceiling() {
        let p = pycell_policy::builtin::load("default").unwrap();
        let refused = |o: LimitOverrides| effective_limits(&p, &o).unwrap_err().to_string();
        let e = refused(LimitOverrides {
            memory_bytes: Some(64 << 30),
            ..Default::default()
        });
        assert_eq!(e, "limits: memory 64GiB is above what policy \"default\" allows (2GiB, its [limits.max] memory); ask for at most that, or use a policy that allows more");
        let e = refused(LimitOverrides {
            timeout_s: Some(80000.0),
            ..Default::default()
        });
        assert!(
            e.contains("timeout 80000s is above") && e.contains("(10m,"),
            "{e}"
        );
        let e = refused(LimitOverrides {
            pids: Some(60000),
            ..Default::default()
        });
        assert!(
            e.contains("pids 60000 is above") && e.contains("(256,"),
            "{e}"
        );
        let e = refused(LimitOverrides {
            max_output_bytes: Some(8 << 30),
            ..Default::default()
        });
        assert!(
            e.contains("max_output 8GiB") && e.contains("(16MiB,"),
            "{e}"
        );
        let e = refused(LimitOverrides {
            disk_bytes: Some(2 << 30),
            ..Default::default()
        });
        assert!(e.contains("disk 2GiB") && e.contains("(1GiB,"), "{e}");
        let at_ceiling = LimitOverrides {
            timeout_s: Some(600.0),
            memory_bytes: Some(2 << 30),
            pids: Some(256),
            disk_bytes: Some(1 << 30),
            max_output_bytes: Some(16 << 20),
        };
        let l = effective_limits(&p, &at_ceiling).unwrap();
        assert_eq!((l.memory, l.pids), (Bytes(2 << 30), 256));
        let lower = LimitOverrides {
            memory_bytes: Some(64 << 20),
            ..Default::default()
        };
        assert_eq!(
            effective_limits(&p, &lower).unwrap().memory,
            Bytes(64 << 20)
        );
    }

    /// A policy without `[limits.max]` allows no raising at all.
    #[test]
    fn settled_limits_are_what_the_policy_gives_and_nothing_else() {
        let policy = pycell_policy::builtin::load("default").unwrap();
        let asked = LimitOverrides {
            timeout_s: Some(2.5),
            memory_bytes: Some(64 << 20),
            ..LimitOverrides::default()
        };
        let limits = effective_limits(&policy, &asked).unwrap();
        let report = limits.clone();
        assert_eq!(settled_limits(&policy, &report).unwrap(), limits);
        // One a request cannot set, or one above a ceiling, is refused.
        let refused = |change: fn(&mut RunLimits)| {
            let mut r = report.clone();
            change(&mut r);
            settled_limits(&policy, &r).unwrap_err().to_string()
        };
        let not_given = "are not limits policy";
        assert!(refused(|r| r.cpu_time = std::time::Duration::from_secs(3600)).contains(not_given));
        assert!(refused(|r| r.open_files += 1).contains(not_given));
        assert!(refused(|r| r.memory = Bytes(1 << 40)).contains(not_given));
        assert!(refused(|r| r.wall_timeout = std::time::Duration::ZERO).contains("greater than 0"));
    }

    #[test]
    fn a_policy_without_ceilings_allows_only_lowering() {
        let text = "name = \"tight\"\ndescription = \"t\"\nnamespaces = [\"user\", \"pid\", \"mount\", \"net\", \"ipc\", \"uts\", \"cgroup\"]\n[interpreter]\npython = \"/usr/bin/python3\"\n";
        let p = Policy::from_toml_str(text, Path::new("tight.toml")).unwrap();
        let o = LimitOverrides {
            pids: Some(65),
            ..Default::default()
        };
        let e = effective_limits(&p, &o).unwrap_err().to_string();
        assert!(
            e.contains("pids 65 is above what policy \"tight\" allows (64,"),
            "{e}"
        );
        let o = LimitOverrides {
            pids: Some(64),
            ..Default::default()
        };
        assert!(effective_limits(&p, &o).is_ok());
    }

    #[test]
    fn coverage_is_by_path_prefix() {
        let m = vec![BindMount::new("/usr", "/usr")];
        assert!(covered(Path::new("/usr/bin/python3.11"), &m));
        assert!(!covered(Path::new("/usrx/bin/python"), &m));
        assert!(!covered(Path::new("/opt/py/bin/python"), &m));
    }
}

#[cfg(test)]
mod venv_home_tests {
    use super::*;

    #[test]
    fn a_venv_home_is_a_plain_absolute_path_below_the_root() {
        let cfg = Path::new("/v/pyvenv.cfg");
        assert!(check_venv_home(cfg, Path::new("/usr/bin")).is_ok());
        for bad in ["/", "usr/bin", "/usr/../etc", "/usr/./bin", ""] {
            assert!(check_venv_home(cfg, Path::new(bad)).is_err(), "{bad}");
        }
    }
}
