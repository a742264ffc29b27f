//! The second layer: raw values → types that cannot hold bad values.
//!
//! Each check reports the field path of the offending value; the caller
//! turns that path into a line and column.

use std::collections::BTreeMap;
use std::path::{Component, Path, PathBuf};
use std::time::Duration;

use crate::error::{Diagnostic, FieldPath};
use crate::limits::{
    between, Cores, LimitCeilings, RunLimits, INOTIFY_INSTANCES_RANGE, INOTIFY_WATCHES_RANGE,
    OPEN_FILES_RANGE, PIDS_RANGE,
};
use crate::network::{EgressLimits, EgressRules, Host, Rule, RuleKind, Scheme};
use crate::raw::{bytes, duration, size};
use crate::raw::{
    RawCeilings, RawDependencies, RawInstall, RawLandlock, RawLimits, RawMount, RawNetwork,
    RawNetworkMode, RawPolicy, RawSeccomp,
};
use crate::types::{
    Dependencies, InstallSource, Interpreter, LandlockRules, Namespace, NetworkMode, ReadOnlyMount,
};
use crate::Policy;

/// Whether every field must be written out. Shipped policies are complete so
/// that an operator reading one sees every knob; a user's file may leave
/// out anything that has a default.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Completeness {
    Complete,
    Partial,
}

/// In-jail places the jailer builds itself; a mount over them would replace
/// or shadow what the jail depends on.
const RESERVED_TARGETS: [&str; 5] = ["/proc", "/dev", "/tmp", "/workspace", "/etc"];
/// The only places a run may write (both are size-limited tmpfs).
const WRITABLE_ROOTS: [&str; 2] = ["/workspace", "/tmp"];
const LANDLOCK_ABI_RANGE: (i64, i64) = (1, 7);
const DEFAULT_SECCOMP_PROFILE: &str = "default";

type Result<T> = std::result::Result<T, Diagnostic>;

pub(crate) fn validate(
    raw: RawPolicy,
    origin: &Path,
    completeness: Completeness,
) -> Result<Policy> {
    let root = FieldPath::root();
    let name = check_identity(&raw, origin, &root)?;
    check_sections_present(&raw, completeness, &root)?;

    check_namespaces(&raw.namespaces, &root.key("namespaces"))?;

    let interpreter = check_interpreter(&raw, &root.key("interpreter"))?;

    let (limits, ceilings) = check_limits_table(raw.limits, &root.key("limits"), completeness)?;

    let network = raw
        .network
        .map(|n| check_network(n, &root.key("network"), completeness))
        .transpose()?
        .unwrap_or(NetworkMode::None);

    let mounts = check_mounts(raw.mounts.unwrap_or_default(), &root.key("mounts"))?;

    let landlock = check_landlock(
        raw.landlock.unwrap_or_default(),
        &root.key("landlock"),
        completeness,
    )?;

    let seccomp_profile = check_seccomp(raw.seccomp, &root.key("seccomp"))?;

    let env = check_env(raw.env.unwrap_or_default(), &root.key("env"))?;

    let dependencies = check_dependencies(
        raw.dependencies.unwrap_or_default(),
        &interpreter,
        &root.key("dependencies"),
    )?;
    let install = raw
        .install
        .map(|i| check_install(i, &network, &root.key("install")))
        .transpose()?;
    let warm_imports = check_warm(raw.warm, &root.key("warm"))?;
    let session = crate::session::check_session(raw.session, &root.key("session"))?;
    let images = crate::session::check_images(raw.images, &root.key("images"))?;
    let output = crate::session::check_output(raw.output, &root.key("output"))?;
    let tools = crate::tools::check_tools(raw.tools, &root.key("tools"))?;

    Ok(Policy {
        name,
        description: raw.description,
        purpose: raw.purpose.unwrap_or_default(),
        interpreter,
        limits,
        ceilings,
        network,
        mounts,
        landlock,
        seccomp_profile,
        env,
        dependencies,
        install,
        warm_imports,
        session,
        images,
        output,
        tools,
    })
}

/// In complete mode (the shipped policies) every section is written out:
/// the first one missing is the error.
fn check_sections_present(
    raw: &RawPolicy,
    completeness: Completeness,
    root: &FieldPath,
) -> Result<()> {
    if completeness != Completeness::Complete {
        return Ok(());
    }
    let sections = [
        ("limits", raw.limits.is_some()),
        ("network", raw.network.is_some()),
        ("mounts", raw.mounts.is_some()),
        ("landlock", raw.landlock.is_some()),
        ("seccomp", raw.seccomp.is_some()),
        ("env", raw.env.is_some()),
        ("dependencies", raw.dependencies.is_some()),
    ];
    match sections.iter().find(|(_, present)| !present) {
        Some((key, _)) => Err(Diagnostic::at(
            root.key(key),
            "missing required field: shipped policies state every section and field explicitly",
        )),
        None => Ok(()),
    }
}

/// `[warm]`: its imports (none when it is absent).
fn check_warm(raw: Option<crate::raw::RawWarm>, path: &FieldPath) -> Result<Vec<String>> {
    let imports = raw.unwrap_or_default().imports.unwrap_or_default();
    check_warm_imports(imports, &path.key("imports"))
}

/// Most modules `[warm] imports` may name.
const MAX_WARM_IMPORTS: usize = 64;

/// Dotted Python module names (`numpy`, `matplotlib.pyplot`), each once.
fn check_warm_imports(imports: Vec<String>, path: &FieldPath) -> Result<Vec<String>> {
    if imports.len() > MAX_WARM_IMPORTS {
        return Err(Diagnostic::at(
            path.clone(),
            format!("at most {MAX_WARM_IMPORTS} modules"),
        ));
    }
    let identifier = |s: &str| {
        s.chars()
            .next()
            .is_some_and(|c| c == '_' || c.is_ascii_alphabetic())
            && s.chars().all(|c| c == '_' || c.is_ascii_alphanumeric())
    };
    for (i, m) in imports.iter().enumerate() {
        if m.len() > 200 || !m.split('.').all(identifier) {
            return Err(Diagnostic::at(
                path.index(i),
                format!("{m:?} is not a module name (dotted identifiers, such as \"matplotlib.pyplot\")"),
            ));
        }
        if imports[..i].contains(m) {
            return Err(Diagnostic::at(
                path.index(i),
                format!("{m:?} is listed twice"),
            ));
        }
    }
    Ok(imports)
}

/// The policy's name (matching its file's) and a non-empty description.
fn check_identity(raw: &RawPolicy, origin: &Path, root: &FieldPath) -> Result<String> {
    let name = check_name(&raw.name).map_err(|m| Diagnostic::at(root.key("name"), m))?;
    check_name_matches_file(&name, origin).map_err(|m| Diagnostic::at(root.key("name"), m))?;
    if raw.description.trim().is_empty() {
        return Err(Diagnostic::at(
            root.key("description"),
            "must not be empty: say in one line what this policy allows",
        ));
    }
    Ok(name)
}

fn check_seccomp(raw: Option<RawSeccomp>, path: &FieldPath) -> Result<String> {
    match raw {
        Some(s) => {
            check_profile_name(&s.profile).map_err(|m| Diagnostic::at(path.key("profile"), m))?;
            Ok(s.profile)
        }
        None => Ok(DEFAULT_SECCOMP_PROFILE.to_owned()),
    }
}

/// Whether `name` is a valid policy name: `[a-z0-9][a-z0-9_-]{0,63}`, safe as
/// a file name, a cgroup name and a log field. Use it to tell `--policy NAME`
/// from `--policy ./file.toml`: a valid name never contains "/" or ".".
pub fn is_valid_name(name: &str) -> bool {
    let bytes = name.as_bytes();
    let allowed = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-';
    !bytes.is_empty()
        && bytes.len() <= 64
        && (bytes[0].is_ascii_lowercase() || bytes[0].is_ascii_digit())
        && bytes.iter().all(|&b| allowed(b))
}

/// What is wrong with one field's value (said at the field, as a
/// [`Diagnostic`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum FieldProblem {
    #[error("invalid name {0:?}: use 1 to 64 lowercase letters, digits, \"_\" or \"-\", starting with a letter or digit")]
    Name(String),
    #[error("name {name:?} does not match the file name {file:?}: name the file {name}.toml or set name = {stem:?}")]
    NameNotTheFiles {
        name: String,
        file: String,
        stem: String,
    },
    #[error("target \"/\" would replace the jail's root: mount a directory below it")]
    RootTarget,
    #[error("target {target:?} is inside {reserved}, which the jailer builds itself: choose another target")]
    ReservedTarget {
        target: String,
        reserved: &'static str,
    },
    #[error("invalid profile name {0:?}: use 1 to 64 lowercase letters, digits, \"_\" or \"-\"")]
    ProfileName(String),
    #[error("path contains a NUL byte")]
    PathWithNul,
    #[error("path {0:?} is not absolute: use a path that starts with /")]
    PathNotAbsolute(String),
    #[error("path {0:?} is not normalized: write it without \".\" or \"..\" components, repeated slashes or a trailing slash")]
    PathNotNormalized(String),
    #[error("{0:?}: the index URL must start with https:// or http://")]
    IndexScheme(String),
    #[error("{0:?}: no credentials or spaces in the index URL")]
    IndexCredentials(String),
    #[error("{url:?}: {port:?} is not a port")]
    IndexPort { url: String, port: String },
    #[error("{url:?}: {problem}")]
    IndexHost { url: String, problem: String },
}

fn check_name(name: &str) -> std::result::Result<String, FieldProblem> {
    match is_valid_name(name) {
        true => Ok(name.to_owned()),
        false => Err(FieldProblem::Name(name.to_owned())),
    }
}

/// `--policy NAME` finds NAME.toml, so a file whose name disagrees with its
/// content would be a policy that cannot be selected by its own name.
fn check_name_matches_file(name: &str, origin: &Path) -> std::result::Result<(), FieldProblem> {
    if origin.extension().and_then(|e| e.to_str()) != Some("toml") {
        return Ok(());
    }
    let Some(stem) = origin.file_stem().and_then(|s| s.to_str()) else {
        return Ok(());
    };
    if stem == name {
        return Ok(());
    }
    let file = origin
        .file_name()
        .map(|f| f.to_string_lossy())
        .unwrap_or_default();
    Err(FieldProblem::NameNotTheFiles {
        name: name.to_owned(),
        file: file.into_owned(),
        stem: stem.to_owned(),
    })
}

fn check_namespaces(listed: &[Namespace], path: &FieldPath) -> Result<()> {
    for (i, ns) in listed.iter().enumerate() {
        if listed[..i].contains(ns) {
            return Err(Diagnostic::at(
                path.index(i),
                format!("duplicate namespace \"{ns}\": list each namespace once"),
            ));
        }
    }
    if let Some(missing) = Namespace::ALL.iter().find(|ns| !listed.contains(ns)) {
        let all: Vec<&str> = Namespace::ALL.iter().map(|n| n.as_str()).collect();
        return Err(Diagnostic::at(
            path.clone(),
            format!(
                "missing \"{missing}\": pycell always isolates {missing}; it cannot be turned off \
                 (list all of: {})",
                all.join(", ")
            ),
        ));
    }
    Ok(())
}

fn check_interpreter(raw: &RawPolicy, path: &FieldPath) -> Result<Interpreter> {
    match (&raw.interpreter.python, &raw.interpreter.venv) {
        (Some(python), None) => {
            let p = path.key("python");
            check_path(python).map(Interpreter::HostPython).map_err(|m| Diagnostic::at(p, m))
        }
        (None, Some(venv)) => {
            let p = path.key("venv");
            check_path(venv).map(Interpreter::Venv).map_err(|m| Diagnostic::at(p, m))
        }
        (Some(_), Some(_)) => Err(Diagnostic::at(
            path.clone(),
            "set exactly one of python or venv, not both",
        )),
        (None, None) => Err(Diagnostic::at(
            path.clone(),
            "set one of python (a host python executable) or venv (a virtual environment directory made by uv)",
        )),
    }
}

fn check_limits(raw: RawLimits, path: &FieldPath, completeness: Completeness) -> Result<RunLimits> {
    let mut limits = RunLimits::default();
    let field = |name: &str| path.key(name);
    let require = |present: bool, name: &str| -> Result<()> {
        if completeness == Completeness::Complete && !present {
            return Err(Diagnostic::at(
                field(name),
                "missing required field: shipped policies set every limit explicitly",
            ));
        }
        Ok(())
    };
    macro_rules! set {
        ($name:ident, $convert:expr) => {
            require(raw.$name.is_some(), stringify!($name))?;
            if let Some(v) = raw.$name {
                #[allow(clippy::redundant_closure_call)]
                let converted =
                    ($convert)(v).map_err(|m| Diagnostic::at(field(stringify!($name)), m))?;
                limits.$name = converted;
            }
        };
    }
    for (old, given) in [
        ("workspace_size", raw.workspace_size.is_some()),
        ("tmp_size", raw.tmp_size.is_some()),
    ] {
        if given {
            return Err(Diagnostic::at(
                field(old),
                "replaced by `disk`: one size for /workspace, /tmp and /dev/shm together (they are directories of one tmpfs); write `disk = \"128MiB\"` instead".to_string(),
            ));
        }
    }
    set!(wall_timeout, duration);
    set!(cpu_time, duration);
    set!(memory, bytes);
    set!(pids, |v: i64| u32::try_from(v)
        .map_err(|_| between(PIDS_RANGE, v)));
    set!(cpus, |v: f64| Ok::<Cores, String>(Cores(v)));
    set!(open_files, |v: i64| u64::try_from(v)
        .map_err(|_| between(OPEN_FILES_RANGE, v)));
    set!(file_size, bytes);
    set!(disk, bytes);
    set!(max_output, bytes);
    set!(inotify_instances, |v: i64| u32::try_from(v)
        .map_err(|_| between(INOTIFY_INSTANCES_RANGE, v)));
    set!(inotify_watches, |v: i64| u64::try_from(v)
        .map_err(|_| between(INOTIFY_WATCHES_RANGE, v)));
    crate::limits::check(&limits).map_err(|e| Diagnostic::at(field(e.field), e.message))?;
    Ok(limits)
}

/// `[limits]` with its `[limits.max]`.
fn check_limits_table(
    raw: Option<RawLimits>,
    path: &FieldPath,
    completeness: Completeness,
) -> Result<(RunLimits, LimitCeilings)> {
    let mut raw = raw.unwrap_or_default();
    let raw_ceilings = raw.max.take();
    let limits = check_limits(raw, path, completeness)?;
    let ceilings = check_ceilings(raw_ceilings, &limits, &path.key("max"), completeness)?;
    Ok((limits, ceilings))
}

/// `[limits.max]`: each ceiling in range and at least the limit it caps.
fn check_ceilings(
    raw: Option<RawCeilings>,
    limits: &RunLimits,
    path: &FieldPath,
    completeness: Completeness,
) -> Result<LimitCeilings> {
    if completeness == Completeness::Complete && raw.is_none() {
        return Err(Diagnostic::at(
            path.clone(),
            "missing required field: shipped policies state how far a request may raise each limit",
        ));
    }
    let raw = raw.unwrap_or_default();
    let mut ceilings = LimitCeilings::at(limits);
    macro_rules! set {
        ($name:ident, $convert:expr) => {
            if completeness == Completeness::Complete && raw.$name.is_none() {
                return Err(Diagnostic::at(
                    path.key(stringify!($name)),
                    "missing required field: shipped policies state every ceiling explicitly",
                ));
            }
            if let Some(v) = raw.$name {
                #[allow(clippy::redundant_closure_call)]
                let converted =
                    ($convert)(v).map_err(|m| Diagnostic::at(path.key(stringify!($name)), m))?;
                ceilings.$name = converted;
            }
        };
    }
    set!(wall_timeout, duration);
    set!(memory, bytes);
    set!(pids, |v: i64| u32::try_from(v)
        .map_err(|_| between(PIDS_RANGE, v)));
    set!(disk, bytes);
    set!(max_output, bytes);
    crate::limits::check(&ceilings.raised(limits))
        .map_err(|e| Diagnostic::at(path.key(e.field), e.message))?;
    if let Some((field, ceiling, limit)) = crate::limits::ceiling_below(&ceilings, limits) {
        return Err(Diagnostic::at(
            path.key(field),
            format!("{ceiling} is below the limit it caps ({limit}): a ceiling says how far a request may raise the limit, so it must be at least the limit"),
        ));
    }
    Ok(ceilings)
}

fn check_mounts(raw: Vec<RawMount>, path: &FieldPath) -> Result<Vec<ReadOnlyMount>> {
    let mut mounts: Vec<ReadOnlyMount> = Vec::with_capacity(raw.len());
    for (i, m) in raw.into_iter().enumerate() {
        let source_path = path.index(i).key("source");
        let source = check_path(&m.source).map_err(|e| Diagnostic::at(source_path.clone(), e))?;
        let (target, target_path) = match &m.target {
            Some(t) => {
                let tp = path.index(i).key("target");
                (
                    check_path(t).map_err(|e| Diagnostic::at(tp.clone(), e))?,
                    tp,
                )
            }
            None => (source.clone(), source_path),
        };
        check_mount_target(&target).map_err(|e| Diagnostic::at(target_path.clone(), e))?;
        if let Some(j) = mounts.iter().position(|earlier| earlier.target == target) {
            return Err(Diagnostic::at(
                target_path,
                format!(
                    "target {:?} is already the target of mounts[{j}]: each target may be mounted once",
                    target.display().to_string()
                ),
            ));
        }
        mounts.push(ReadOnlyMount { source, target });
    }
    Ok(mounts)
}

fn check_mount_target(target: &Path) -> std::result::Result<(), FieldProblem> {
    if target == Path::new("/") {
        return Err(FieldProblem::RootTarget);
    }
    if let Some(reserved) = RESERVED_TARGETS.iter().find(|r| target.starts_with(r)) {
        return Err(FieldProblem::ReservedTarget {
            target: target.display().to_string(),
            reserved,
        });
    }
    Ok(())
}

fn check_landlock(
    raw: RawLandlock,
    path: &FieldPath,
    completeness: Completeness,
) -> Result<LandlockRules> {
    if completeness == Completeness::Complete {
        let fields = [
            ("min_abi", raw.min_abi.is_some()),
            ("read_exec", raw.read_exec.is_some()),
            ("read_only", raw.read_only.is_some()),
            ("read_write", raw.read_write.is_some()),
        ];
        if let Some((name, _)) = fields.iter().find(|(_, present)| !present) {
            return Err(Diagnostic::at(
                path.key(name),
                "missing required field: shipped policies state every section and field explicitly",
            ));
        }
    }
    let mut rules = LandlockRules::default();
    if let Some(abi) = raw.min_abi {
        rules.min_abi = u8::try_from(abi)
            .ok()
            .filter(|a| (LANDLOCK_ABI_RANGE.0..=LANDLOCK_ABI_RANGE.1).contains(&i64::from(*a)))
            .ok_or_else(|| Diagnostic::at(path.key("min_abi"), between(LANDLOCK_ABI_RANGE, abi)))?;
    }
    let paths = |list: Option<Vec<String>>, name: &str| -> Result<Vec<PathBuf>> {
        let list_path = path.key(name);
        list.unwrap_or_default()
            .iter()
            .enumerate()
            .map(|(i, p)| check_path(p).map_err(|m| Diagnostic::at(list_path.index(i), m)))
            .collect()
    };
    rules.read_exec = paths(raw.read_exec, "read_exec")?;
    rules.read_only = paths(raw.read_only, "read_only")?;
    rules.read_write = paths(raw.read_write, "read_write")?;
    for (i, p) in rules.read_write.iter().enumerate() {
        if !WRITABLE_ROOTS.iter().any(|root| p.starts_with(root)) {
            return Err(Diagnostic::at(
                path.key("read_write").index(i),
                format!(
                    "{:?} is not writable in the jail: read_write paths must be /workspace, /tmp or below them",
                    p.display().to_string()
                ),
            ));
        }
    }
    Ok(rules)
}

fn check_profile_name(name: &str) -> std::result::Result<(), FieldProblem> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-');
    match ok {
        true => Ok(()),
        false => Err(FieldProblem::ProfileName(name.to_owned())),
    }
}

fn check_network(
    raw: RawNetwork,
    path: &FieldPath,
    completeness: Completeness,
) -> Result<NetworkMode> {
    let fields = [
        ("allow", raw.allow.is_some()),
        ("deny", raw.deny.is_some()),
        ("max_connections", raw.max_connections.is_some()),
        ("max_bytes", raw.max_bytes.is_some()),
        ("connect_timeout", raw.connect_timeout.is_some()),
    ];
    if raw.mode == RawNetworkMode::None {
        return match fields.iter().find(|(_, present)| *present) {
            Some((name, _)) => Err(Diagnostic::at(
                path.key(name),
                "only for mode = \"allowlist\": mode \"none\" has no egress to configure",
            )),
            None => Ok(NetworkMode::None),
        };
    }
    if completeness == Completeness::Complete {
        if let Some((name, _)) = fields.iter().find(|(_, present)| !present) {
            return Err(Diagnostic::at(
                path.key(name),
                "missing required field: shipped policies state every section and field explicitly",
            ));
        }
    }
    let rules = |list: Option<Vec<String>>, name: &str, kind: RuleKind| -> Result<Vec<Rule>> {
        list.unwrap_or_default()
            .iter()
            .enumerate()
            .map(|(i, text)| {
                Rule::parse(text, kind).map_err(|m| Diagnostic::at(path.key(name).index(i), m))
            })
            .collect()
    };
    let mut limits = EgressLimits::default();
    if let Some(n) = raw.max_connections {
        limits.max_connections = u32::try_from(n)
            .ok()
            .filter(|n| (1..=MAX_EGRESS_CONNECTIONS).contains(n))
            .ok_or_else(|| {
                Diagnostic::at(
                    path.key("max_connections"),
                    between((1, i64::from(MAX_EGRESS_CONNECTIONS)), n),
                )
            })?;
    }
    if let Some(q) = raw.max_bytes {
        let at = || path.key("max_bytes");
        limits.max_bytes = match size(q).map_err(|e| Diagnostic::at(at(), e))? {
            0 => return Err(Diagnostic::at(at(), "must be at least 1 byte")),
            b => b,
        };
    }
    if let Some(q) = raw.connect_timeout {
        let at = || path.key("connect_timeout");
        let d = duration(q).map_err(|e| Diagnostic::at(at(), e))?;
        if d < Duration::from_millis(100) || d > Duration::from_secs(300) {
            return Err(Diagnostic::at(at(), "must be between 100ms and 5m"));
        }
        limits.connect_timeout = d;
    }
    Ok(NetworkMode::Allowlist(EgressRules {
        allow: rules(raw.allow, "allow", RuleKind::Allow)?,
        deny: rules(raw.deny, "deny", RuleKind::Deny)?,
        limits,
    }))
}

/// Most connections one run may open to the egress proxy.
const MAX_EGRESS_CONNECTIONS: u32 = 65536;

fn check_env(raw: BTreeMap<String, String>, path: &FieldPath) -> Result<BTreeMap<String, String>> {
    for (key, value) in &raw {
        let mut bytes = key.bytes();
        let valid_key = bytes
            .next()
            .is_some_and(|b| b.is_ascii_alphabetic() || b == b'_')
            && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_');
        if !valid_key {
            return Err(Diagnostic::at(
                path.key(key),
                format!(
                    "invalid variable name {key:?}: use letters, digits and \"_\", not starting with a digit"
                ),
            ));
        }
        if value.contains('\0') {
            return Err(Diagnostic::at(path.key(key), "value contains a NUL byte"));
        }
    }
    Ok(raw)
}

/// Absolute and normalized, so that prefix checks (`starts_with("/etc")`)
/// mean what they say and the jailer never resolves "..".
pub(crate) fn check_path(s: &str) -> std::result::Result<PathBuf, FieldProblem> {
    if s.contains('\0') {
        return Err(FieldProblem::PathWithNul);
    }
    if !s.starts_with('/') {
        return Err(FieldProblem::PathNotAbsolute(s.to_owned()));
    }
    let normalized = s == "/"
        || (!s.ends_with('/')
            && !s.contains("//")
            && Path::new(s)
                .components()
                .all(|c| matches!(c, Component::RootDir | Component::Normal(_)))
            && !s.split('/').any(|part| part == "."));
    if !normalized {
        return Err(FieldProblem::PathNotNormalized(s.to_owned()));
    }
    Ok(PathBuf::from(s))
}

fn check_dependencies(
    raw: RawDependencies,
    interpreter: &Interpreter,
    path: &FieldPath,
) -> Result<Dependencies> {
    let mut deps = Dependencies {
        allow: raw.allow.unwrap_or(false),
        packages: crate::requirement::parse_list(&raw.packages.unwrap_or_default())
            .map_err(|(i, m)| Diagnostic::at(path.key("packages").index(i), m))?,
        ..Dependencies::default()
    };
    if let Some(name) = raw.install_policy {
        deps.install_policy =
            check_name(&name).map_err(|m| Diagnostic::at(path.key("install_policy"), m))?;
    }
    // A venv policy's runs that ask for packages are refused when they do
    // (its `allow` may stay as copied from a shipped file); packages for
    // every run would never be installed, so they are an error here.
    if !deps.packages.is_empty() && matches!(interpreter, Interpreter::Venv(_)) {
        return Err(Diagnostic::at(
            path.key("packages"),
            "a policy whose [interpreter] is a venv has its packages already; install them into the venv, or use [interpreter] python to let pycell build envs",
        ));
    }
    Ok(deps)
}

/// `scheme://host[:port]/...` of an index URL: what the egress rules see.
fn index_endpoint(url: &str) -> std::result::Result<(Scheme, Host, u16), FieldProblem> {
    let (scheme, rest) = if let Some(r) = url.strip_prefix("https://") {
        (Scheme::Https, r)
    } else if let Some(r) = url.strip_prefix("http://") {
        (Scheme::Http, r)
    } else {
        return Err(FieldProblem::IndexScheme(url.to_owned()));
    };
    let authority = rest.split('/').next().unwrap_or_default();
    if authority.contains('@') || url.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(FieldProblem::IndexCredentials(url.to_owned()));
    }
    let (host, port) = match authority.rsplit_once(':') {
        Some((h, p)) if !h.ends_with(']') || authority.starts_with('[') => {
            let port = p.parse::<u16>().map_err(|_| FieldProblem::IndexPort {
                url: url.to_owned(),
                port: p.to_owned(),
            })?;
            (h, port)
        }
        _ => (authority, if scheme == Scheme::Https { 443 } else { 80 }),
    };
    let host = Host::parse(host.trim_start_matches('[').trim_end_matches(']')).map_err(|m| {
        FieldProblem::IndexHost {
            url: url.to_owned(),
            problem: m.to_string(),
        }
    })?;
    Ok((scheme, host, port))
}

fn check_install(
    raw: RawInstall,
    network: &NetworkMode,
    path: &FieldPath,
) -> Result<InstallSource> {
    let find_links = raw
        .find_links
        .unwrap_or_default()
        .iter()
        .enumerate()
        .map(|(i, p)| check_path(p).map_err(|m| Diagnostic::at(path.key("find_links").index(i), m)))
        .collect::<Result<Vec<_>>>()?;
    match (network, &raw.index_url) {
        (NetworkMode::None, Some(_)) => Err(Diagnostic::at(
            path.key("index_url"),
            "this policy has network mode \"none\": it cannot reach an index; use find_links (local wheel directories), or [network] mode = \"allowlist\" allowing the index's host",
        )),
        (NetworkMode::None, None) if find_links.is_empty() => Err(Diagnostic::at(
            path.key("find_links"),
            "an offline install policy (network mode \"none\") needs at least one directory of wheels",
        )),
        (NetworkMode::Allowlist(_), None) => Err(Diagnostic::at(
            path.key("index_url"),
            "missing: with network mode \"allowlist\" an install policy names its package index (e.g. \"https://pypi.org/simple\")",
        )),
        (NetworkMode::Allowlist(rules), Some(url)) => {
            let (scheme, host, port) =
                index_endpoint(url).map_err(|m| Diagnostic::at(path.key("index_url"), m))?;
            rules.check(scheme, &host, port).map_err(|d| {
                Diagnostic::at(
                    path.key("index_url"),
                    format!("{url:?} is not reachable under this policy's [network] rules ({}): allow its host", d.reason),
                )
            })?;
            Ok(InstallSource { index_url: Some(url.clone()), find_links })
        }
        (NetworkMode::None, None) => Ok(InstallSource { index_url: None, find_links }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        for good in ["default", "a", "0", "data-science", "x_1", &"a".repeat(64)] {
            assert!(is_valid_name(good), "{good:?}");
        }
        for bad in [
            "",
            "-a",
            "_a",
            "Default",
            "a b",
            "a.b",
            "é",
            &"a".repeat(65),
        ] {
            assert!(!is_valid_name(bad), "{bad:?}");
        }
    }

    #[test]
    fn paths() {
        for good in ["/", "/usr", "/usr/lib/python3", "/a.b/..c/d..", "/.hidden"] {
            assert_eq!(check_path(good), Ok(PathBuf::from(good)), "{good:?}");
        }
        for bad in [
            "",
            "usr",
            "./usr",
            "/usr/",
            "//usr",
            "/usr//lib",
            "/usr/./lib",
            "/usr/..",
            "/.",
            "/a/\0",
        ] {
            assert!(check_path(bad).is_err(), "{bad:?}");
        }
        assert_eq!(
            check_path("/usr/../etc").unwrap_err().to_string(),
            "path \"/usr/../etc\" is not normalized: write it without \".\" or \"..\" components, \
             repeated slashes or a trailing slash"
        );
    }

    #[test]
    fn mount_targets() {
        assert!(check_mount_target(Path::new("/usr")).is_ok());
        assert!(check_mount_target(Path::new("/etcetera")).is_ok());
        assert!(check_mount_target(Path::new("/workspace2")).is_ok());
        for bad in [
            "/",
            "/proc",
            "/proc/sys",
            "/dev/shm",
            "/tmp",
            "/workspace/x",
            "/etc/ssl",
        ] {
            assert!(check_mount_target(Path::new(bad)).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn file_name_check_only_for_toml_files() {
        assert!(check_name_matches_file("x", Path::new("/etc/pycell/policies/x.toml")).is_ok());
        assert!(check_name_matches_file("x", Path::new("<stdin>")).is_ok());
        assert!(check_name_matches_file("x", Path::new("x.txt")).is_ok());
        assert_eq!(
            check_name_matches_file("x", Path::new("dir/y.toml")).unwrap_err().to_string(),
            "name \"x\" does not match the file name \"y.toml\": name the file x.toml or set name = \"y\""
        );
    }
}
