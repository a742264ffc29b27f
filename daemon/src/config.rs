//! `/etc/pycell/pycelld.toml`: where the socket lives, who may use it, how
//! many runs may go at once, and where the audit log goes. Unknown fields are
//! rejected; errors name the file, line, column and field.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

pub const DEFAULT_CONFIG: &str = "/etc/pycell/pycelld.toml";

/// The leaf of pycelld's own v2 cgroup that the monitor and broker live in;
/// runs live in its sibling `cgroup_parent` (see
/// `CgroupLayout::adopt_own_subtree`).
pub const SUPERVISOR_CGROUP: &str = "supervisor";

/// pycelld's env store (`StateDirectory=pycell` in pycelld.service).
pub const DEFAULT_ENV_STORE: &str = "/var/lib/pycell";

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    socket: Option<PathBuf>,
    socket_group: Option<String>,
    socket_mode: Option<String>,
    broker_user: Option<String>,
    allowed_uids: Option<Vec<u32>>,
    allowed_groups: Option<Vec<String>>,
    front_end_uids: Option<Vec<u32>>,
    policies_by_uid: Option<std::collections::BTreeMap<String, Vec<String>>>,
    uid_range: Option<String>,
    max_concurrent_runs: Option<usize>,
    max_runs_per_uid: Option<usize>,
    max_queued_runs: Option<usize>,
    queue_wait: Option<String>,
    memory_budget: Option<String>,
    max_connections: Option<usize>,
    max_connections_per_uid: Option<usize>,
    shutdown_grace: Option<String>,
    audit_log: Option<String>,
    log_level: Option<String>,
    policy_dir: Option<PathBuf>,
    cgroup_parent: Option<String>,
    env_store: Option<PathBuf>,
    env_store_max_size: Option<String>,
    env_max_age: Option<String>,
    snapshots_per_owner: Option<usize>,
    snapshot_bytes_per_owner: Option<String>,
    snapshot_expiry: Option<String>,
    warm_pools: Option<std::collections::BTreeMap<String, usize>>,
    session_pools: Option<std::collections::BTreeMap<String, usize>>,
    warm_idle: Option<String>,
    zygotes: Option<bool>,
}

/// Where audit lines go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AuditSink {
    /// One line per run on stderr (the journal, under systemd).
    Stderr,
    File(PathBuf),
    Off,
}

#[derive(Debug, Clone)]
pub struct Config {
    /// Socket path (default /run/pycell/pycell.sock).
    pub socket: PathBuf,
    /// Group owning the socket; its members may connect (default "pycell").
    pub socket_group: String,
    pub socket_mode: u32,
    /// Unprivileged user the broker runs as (default "pycell").
    pub broker_user: String,
    /// Peers allowed besides root and members of `allowed_groups`.
    pub allowed_uids: Vec<u32>,
    /// Groups whose members (primary or supplementary) may run code
    /// (default: the socket group).
    pub allowed_groups: Vec<String>,
    /// Uids of trusted front ends (`pycell mcp --http`), which may speak
    /// for the identities they authenticate (default: none). A front end
    /// must also be allowed to connect.
    pub front_end_uids: Vec<u32>,
    /// Which policies each local uid may name (`policies_by_uid`;
    /// default: `default` only, any for root).
    pub policy_access: crate::broker::policy_access::PolicyAccess,
    pub uid_range: std::ops::RangeInclusive<u32>,
    /// Runs going at once (default: 4 per core, 4 to 256).
    pub max_concurrent_runs: usize,
    /// Runs of one uid going at once (default: half of max_concurrent_runs).
    pub max_runs_per_uid: usize,
    /// Runs waiting for a slot, all uids together (default: 64 per
    /// concurrent run, at most 4096); beyond it a run is refused `busy`.
    pub max_queued_runs: usize,
    /// Longest a run waits for its slot before it is refused `busy`.
    pub queue_wait: Duration,
    /// Sum of the memory limits of the runs going at once, in bytes
    /// (default: 3/4 of the host's RAM).
    pub memory_budget: u64,
    /// Client connections open at once, and per uid.
    pub max_connections: usize,
    pub max_connections_per_uid: usize,
    pub shutdown_grace: Duration,
    pub audit: AuditSink,
    /// How much pycelld logs (`PYCELLD_LOG` overrides it).
    pub log_level: crate::logging::LogLevel,
    pub policy_dir: PathBuf,
    /// Parent of the daemon's run cgroups, relative to the daemon's own
    /// cgroup (the service's delegated subtree); distinct from embedded
    /// mode's, so that a daemon restart can sweep it.
    pub cgroup_parent: String,
    /// Where the envs of runs' dependencies are built and kept (default
    /// /var/lib/pycell: envs/<key> below it).
    pub env_store: PathBuf,
    /// After each build, envs unused for longer than `env_max_age` go, then
    /// the least recently used until the rest fit in `env_store_max_size`;
    /// never one in use.
    pub env_store_max_size: u64,
    pub env_max_age: Duration,
    /// Sessions' snapshots kept per owner: how many, how many bytes in
    /// all, and for how long (in `snapshot_dir`).
    pub snapshots: pycell_launch::snapshots::Quota,
    /// Warm jails kept per policy (default: 2 of `default`); see
    /// `crate::monitor::pool`.
    pub warm_pools: std::collections::BTreeMap<String, usize>,
    /// Session jails kept ready per policy (for `session_start`).
    pub session_pools: std::collections::BTreeMap<String, usize>,
    /// A warm jail unused this long is replaced by a fresh one.
    pub warm_idle: Duration,
    /// Fork each run pool's members from a zygote of its policy (default
    /// true; a run its zygote's death kills ends `zygote_died`); see
    /// `crate::monitor::pool`.
    pub zygotes: bool,
    /// The text this configuration was parsed from (empty for the built-in
    /// defaults): the monitor hands it to the broker, which so never reads
    /// a file of its own.
    pub source_text: String,
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}:{line}:{column}: {}{message}", if field.is_empty() { String::new() } else { format!("{field}: ") })]
    Invalid {
        path: PathBuf,
        line: usize,
        column: usize,
        field: String,
        message: String,
    },
}

fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let before = &text[..offset.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    (line, column)
}

/// Defaults that follow the host: (max_concurrent_runs, max_runs_per_uid,
/// max_queued_runs, memory_budget) for `cores` CPUs and `memory` bytes of RAM.
pub fn host_sized(cores: usize, memory: u64) -> (usize, usize, usize, u64) {
    let concurrent = cores.saturating_mul(4).clamp(4, 256);
    let (per_uid, queued) = slot_sized(concurrent);
    (concurrent, per_uid, queued, memory / 4 * 3)
}

/// Defaults that follow the run slots: (max_runs_per_uid, max_queued_runs)
/// for `concurrent` slots, whether the host sized them or the file set them.
fn slot_sized(concurrent: usize) -> (usize, usize) {
    (
        concurrent.div_ceil(2),
        concurrent.saturating_mul(64).min(4096),
    )
}

/// This host's CPU count and RAM, as the defaults are sized. RAM comes from
/// sysinfo(2), not /proc/meminfo, which pycelld.service cannot read
/// (`ProcSubset=pid`): a default memory_budget from a 1 GiB guess left the
/// default warm pool without members on any host. A memory limit on
/// pycelld's own cgroup (a pod's `limits.memory`, a unit's `MemoryMax`)
/// caps it: every run's cgroup is below it, so that is all runs can have.
pub fn host_resources() -> (usize, u64) {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let ram = nix::sys::sysinfo::sysinfo().map_or(1 << 30, |s| s.ram_total());
    let limit = pycell_host::cgroup::layout::own_memory_limit().unwrap_or(u64::MAX);
    (cores, ram.min(limit))
}

impl Default for Config {
    fn default() -> Config {
        let (cores, memory) = host_resources();
        let (concurrent, per_uid, queued, budget) = host_sized(cores, memory);
        Config {
            socket: PathBuf::from("/run/pycell/pycell.sock"),
            socket_group: "pycell".into(),
            socket_mode: 0o660,
            broker_user: "pycell".into(),
            allowed_uids: Vec::new(),
            allowed_groups: vec!["pycell".into()],
            front_end_uids: Vec::new(),
            policy_access: Default::default(),
            uid_range: pycell_host::uidalloc::DEFAULT_RANGE,
            max_concurrent_runs: concurrent,
            max_runs_per_uid: per_uid,
            max_queued_runs: queued,
            queue_wait: Duration::from_secs(300),
            memory_budget: budget,
            max_connections: 512,
            max_connections_per_uid: 128,
            shutdown_grace: Duration::from_secs(10),
            audit: AuditSink::Stderr,
            log_level: crate::logging::LogLevel::default(),
            policy_dir: PathBuf::from(pycell_launch::resolve::POLICY_DIR),
            cgroup_parent: "runs".into(),
            env_store: PathBuf::from(DEFAULT_ENV_STORE),
            env_store_max_size: 20 << 30,
            env_max_age: Duration::from_secs(30 * 24 * 3600),
            snapshots: pycell_launch::snapshots::Quota::default(),
            warm_pools: [("default".to_string(), 2)].into_iter().collect(),
            session_pools: [("default".to_string(), 1)].into_iter().collect(),
            warm_idle: Duration::from_secs(600),
            zygotes: true,
            source_text: String::new(),
        }
    }
}

impl Config {
    /// Load `path`; a missing file at the default location means defaults.
    pub fn load(path: &Path, must_exist: bool) -> Result<Config, ConfigError> {
        let text = match std::fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && !must_exist => {
                return Ok(Config::default())
            }
            Err(source) => {
                return Err(ConfigError::Read {
                    path: path.to_path_buf(),
                    source,
                })
            }
        };
        Config::parse(&text, path)
    }

    pub fn parse(text: &str, path: &Path) -> Result<Config, ConfigError> {
        let at = Locator { text, path };
        let de = toml::de::Deserializer::parse(text)
            .map_err(|e| at.invalid(e.span().map(|s| s.start), "", e.message().to_string()))?;
        let raw: RawConfig = serde_path_to_error::deserialize(de).map_err(|e| {
            let field = e.path().to_string();
            let inner = e.into_inner();
            at.invalid(
                inner.span().map(|s| s.start),
                &field,
                inner.message().to_string(),
            )
        })?;
        let mut c = Config::default();
        c.apply_access(&raw, &at)?;
        c.apply_runs(&raw, &at)?;
        c.apply_envs(&raw, &at)?;
        c.apply_warm(&raw, &at)?;
        c.apply_paths(raw, &at)?;
        c.source_text = text.to_string();
        Ok(c)
    }

    /// Who may connect, and as whom the broker runs.
    fn apply_access(&mut self, raw: &RawConfig, at: &Locator<'_>) -> Result<(), ConfigError> {
        if let Some(s) = &raw.socket {
            if !s.is_absolute() {
                return Err(at.field("socket", "must be an absolute path"));
            }
            self.socket = s.clone();
        }
        if let Some(g) = &raw.socket_group {
            self.allowed_groups = vec![g.clone()];
            self.socket_group = g.clone();
        }
        if let Some(m) = &raw.socket_mode {
            self.socket_mode = u32::from_str_radix(m.trim_start_matches("0o"), 8)
                .ok()
                .filter(|m| *m <= 0o777)
                .ok_or_else(|| {
                    at.field(
                        "socket_mode",
                        format!("{m:?} is not an octal mode like \"0660\""),
                    )
                })?;
        }
        if let Some(u) = &raw.broker_user {
            self.broker_user = u.clone();
        }
        if let Some(u) = &raw.allowed_uids {
            self.allowed_uids = u.clone();
        }
        if let Some(g) = &raw.allowed_groups {
            self.allowed_groups = g.clone();
        }
        if let Some(u) = &raw.front_end_uids {
            if u.contains(&0) {
                return Err(at.field("front_end_uids", "uid 0 cannot be a front end: a front end parses HTTP from the network and runs unprivileged"));
            }
            self.front_end_uids = u.clone();
        }
        if let Some(t) = &raw.policies_by_uid {
            let user_uid = |name: &str| {
                nix::unistd::User::from_name(name)
                    .ok()
                    .flatten()
                    .map(|u| u.uid.as_raw())
            };
            self.policy_access =
                crate::broker::policy_access::PolicyAccess::from_table(t, user_uid)
                    .map_err(|e| at.field(crate::broker::policy_access::KEY, e))?;
        }
        Ok(())
    }

    /// Sandbox uids, quotas and the shutdown grace.
    fn apply_runs(&mut self, raw: &RawConfig, at: &Locator<'_>) -> Result<(), ConfigError> {
        if let Some(r) = &raw.uid_range {
            self.uid_range = pycell_host::uidalloc::parse_range(r)
                .filter(|r| *r.start() > 0 && *r.end() < u32::MAX)
                .ok_or_else(|| {
                    at.field(
                        "uid_range",
                        format!("{r:?}: expected \"START-END\" with 0 < START <= END < 4294967295"),
                    )
                })?;
        }
        if let Some(n) = raw.max_concurrent_runs {
            if n == 0 || n > 4096 {
                return Err(at.field("max_concurrent_runs", "must be 1..=4096"));
            }
            self.max_concurrent_runs = n;
            (self.max_runs_per_uid, self.max_queued_runs) = slot_sized(n);
        }
        if let Some(n) = raw.max_runs_per_uid {
            if n == 0 {
                return Err(at.field("max_runs_per_uid", "must be at least 1"));
            }
            self.max_runs_per_uid = n;
        }
        self.apply_queue(raw, at)?;
        if let Some(g) = &raw.shutdown_grace {
            self.shutdown_grace =
                pycell_policy::parse_duration(g).map_err(|e| at.field("shutdown_grace", e))?;
        }
        Ok(())
    }

    /// The admission queue, the memory budget and the connection caps.
    fn apply_queue(&mut self, raw: &RawConfig, at: &Locator<'_>) -> Result<(), ConfigError> {
        if let Some(n) = raw.max_queued_runs {
            if n > 65536 {
                return Err(at.field(
                    "max_queued_runs",
                    "must be 0..=65536 (0: never wait, refuse busy at once)",
                ));
            }
            self.max_queued_runs = n;
        }
        if let Some(w) = &raw.queue_wait {
            self.queue_wait =
                pycell_policy::parse_duration(w).map_err(|e| at.field("queue_wait", e))?;
        }
        if let Some(b) = &raw.memory_budget {
            self.memory_budget =
                parse_budget(b, host_resources().1).map_err(|e| at.field("memory_budget", e))?;
        }
        for (key, value, target) in [
            (
                "max_connections",
                raw.max_connections,
                &mut self.max_connections,
            ),
            (
                "max_connections_per_uid",
                raw.max_connections_per_uid,
                &mut self.max_connections_per_uid,
            ),
        ] {
            if let Some(n) = value {
                if !(1..=65536).contains(&n) {
                    return Err(at.field(key, "must be 1..=65536"));
                }
                *target = n;
            }
        }
        Ok(())
    }

    /// The env store and its garbage collection.
    fn apply_envs(&mut self, raw: &RawConfig, at: &Locator<'_>) -> Result<(), ConfigError> {
        if let Some(p) = &raw.env_store {
            if !p.is_absolute() || p == Path::new("/") {
                return Err(at.field("env_store", "must be an absolute path below /"));
            }
            self.env_store = p.clone();
        }
        if let Some(s) = &raw.env_store_max_size {
            self.env_store_max_size =
                pycell_policy::parse_size(s).map_err(|e| at.field("env_store_max_size", e))?;
        }
        if let Some(a) = &raw.env_max_age {
            self.env_max_age =
                pycell_policy::parse_duration(a).map_err(|e| at.field("env_max_age", e))?;
        }
        self.apply_snapshots(raw, at)
    }

    /// Sessions' snapshots: what each owner may keep.
    fn apply_snapshots(&mut self, raw: &RawConfig, at: &Locator<'_>) -> Result<(), ConfigError> {
        let q = &mut self.snapshots;
        if let Some(n) = raw.snapshots_per_owner {
            if n == 0 {
                let why = "must be at least 1 (snapshots cannot be turned off here; a policy without sessions has none)";
                return Err(at.field("snapshots_per_owner", why));
            }
            q.count = n;
        }
        if let Some(s) = &raw.snapshot_bytes_per_owner {
            q.bytes = pycell_policy::parse_size(s)
                .map_err(|e| at.field("snapshot_bytes_per_owner", e))?;
        }
        if let Some(d) = &raw.snapshot_expiry {
            q.keep =
                pycell_policy::parse_duration(d).map_err(|e| at.field("snapshot_expiry", e))?;
        }
        Ok(())
    }

    /// Where sessions' snapshots are kept: `snapshots` in the env store's
    /// directory, the broker's alone.
    pub fn snapshot_dir(&self) -> PathBuf {
        self.env_store.join("snapshots")
    }

    /// The warm pools.
    fn apply_warm(&mut self, raw: &RawConfig, at: &Locator<'_>) -> Result<(), ConfigError> {
        if let Some(pools) = &raw.warm_pools {
            check_pools("warm_pools", pools, at)?;
            self.warm_pools = pools.clone();
        }
        if let Some(pools) = &raw.session_pools {
            check_pools("session_pools", pools, at)?;
            self.session_pools = pools.clone();
        }
        if let Some(i) = &raw.warm_idle {
            self.warm_idle =
                pycell_policy::parse_duration(i).map_err(|e| at.field("warm_idle", e))?;
        }
        if let Some(z) = raw.zygotes {
            self.zygotes = z;
        }
        Ok(())
    }

    /// The audit log, the policies and the runs' cgroups.
    fn apply_paths(&mut self, raw: RawConfig, at: &Locator<'_>) -> Result<(), ConfigError> {
        if let Some(a) = raw.audit_log {
            self.audit = match a.as_str() {
                "stderr" => AuditSink::Stderr,
                "off" => AuditSink::Off,
                p if p.starts_with('/') => AuditSink::File(PathBuf::from(p)),
                _ => {
                    return Err(at.field(
                        "audit_log",
                        "use \"stderr\", \"off\" or an absolute file path",
                    ))
                }
            };
        }
        if let Some(l) = &raw.log_level {
            self.log_level = crate::logging::LogLevel::parse(l).ok_or_else(|| {
                at.field(
                    "log_level",
                    "use \"error\", \"warn\", \"info\", \"debug\" or \"trace\"",
                )
            })?;
        }
        if let Some(d) = raw.policy_dir {
            self.policy_dir = d;
        }
        if let Some(p) = raw.cgroup_parent {
            if !pycell_wire::spec::is_plain_relative_path(&p) {
                return Err(at.field("cgroup_parent", "must be a relative path of plain names"));
            }
            if p.split('/').next() == Some(SUPERVISOR_CGROUP) {
                return Err(at.field(
                    "cgroup_parent",
                    format!("{SUPERVISOR_CGROUP:?} is the cgroup pycelld itself lives in; pick another name"),
                ));
            }
            self.cgroup_parent = p;
        }
        Ok(())
    }
}

/// Most warm jails one policy's pool may have.
const MAX_WARM_MEMBERS: usize = 64;

/// `memory_budget`: a size ("24GiB") or a share of the host's RAM ("75%").
/// Why a memory budget (`admission_memory`) cannot be used.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
enum BudgetError {
    #[error("{0:?}: a share must be 1% to 100%")]
    Share(String),
    #[error(transparent)]
    Size(#[from] pycell_policy::UnitError),
    #[error("{0:?} is less than one run's smallest memory limit (16MiB)")]
    TooSmall(String),
}

fn parse_budget(text: &str, host_memory: u64) -> Result<u64, BudgetError> {
    let budget = match text.strip_suffix('%') {
        Some(pct) => {
            let pct: u64 = pct
                .trim()
                .parse()
                .ok()
                .filter(|p| (1..=100).contains(p))
                .ok_or_else(|| BudgetError::Share(text.to_string()))?;
            u64::try_from(u128::from(host_memory) * u128::from(pct) / 100).unwrap_or(u64::MAX)
        }
        None => pycell_policy::parse_size(text)?,
    };
    if budget < pycell_policy::MIN_MEMORY {
        return Err(BudgetError::TooSmall(text.to_string()));
    }
    Ok(budget)
}

/// Turns a problem with a field into an error at its place in the file.
struct Locator<'a> {
    text: &'a str,
    path: &'a Path,
}

impl Locator<'_> {
    fn invalid(&self, offset: Option<usize>, field: &str, message: String) -> ConfigError {
        let (line, column) = offset.map_or((1, 1), |o| line_col(self.text, o));
        ConfigError::Invalid {
            path: self.path.to_path_buf(),
            line,
            column,
            field: field.to_string(),
            message,
        }
    }

    /// An error at the first `key = ...` in the file.
    fn field(&self, key: &str, message: impl std::fmt::Display) -> ConfigError {
        let message = message.to_string();
        let offset = self
            .text
            .find(&format!("{key} "))
            .or_else(|| self.text.find(&format!("{key}=")));
        self.invalid(offset, key, message)
    }
}

/// `HTTPS_PROXY`, `HTTP_PROXY`, `ALL_PROXY`, `NO_PROXY`, in either case.
pub(crate) fn is_proxy_setting(name: &str) -> bool {
    ["HTTPS_PROXY", "HTTP_PROXY", "ALL_PROXY", "NO_PROXY"]
        .iter()
        .any(|p| name == *p || name == p.to_ascii_lowercase())
}

/// A pools table (`warm_pools`, `session_pools`): policy names, sizes
/// within bounds.
fn check_pools(
    key: &'static str,
    pools: &std::collections::BTreeMap<String, usize>,
    at: &Locator<'_>,
) -> Result<(), ConfigError> {
    for (name, &n) in pools {
        if !pycell_policy::is_valid_name(name) {
            return Err(at.field(key, format!("{name:?} is not a policy name")));
        }
        if n > MAX_WARM_MEMBERS {
            return Err(at.field(
                key,
                format!("{name} = {n}: at most {MAX_WARM_MEMBERS} warm jails per policy"),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_follow_the_host() {
        assert_eq!(host_sized(1, 4 << 30), (4, 2, 256, 3 << 30));
        assert_eq!(host_sized(2, 8 << 30), (8, 4, 512, 6 << 30));
        assert_eq!(host_sized(64, 256 << 30), (256, 128, 4096, 192 << 30));
        assert_eq!(parse_budget("50%", 8 << 30), Ok(4 << 30));
        assert_eq!(parse_budget("3GiB", 8 << 30), Ok(3 << 30));
        assert!(parse_budget("0%", 8 << 30).is_err());
        assert!(parse_budget("1MiB", 8 << 30).is_err());
        let c = Config::parse(
            "max_concurrent_runs = 10\nqueue_wait = \"2s\"\nmemory_budget = \"1GiB\"\n",
            Path::new("c.toml"),
        )
        .unwrap();
        assert_eq!((c.max_concurrent_runs, c.max_runs_per_uid), (10, 5));
        assert_eq!(c.max_queued_runs, 640);
        assert_eq!(c.queue_wait, Duration::from_secs(2));
        assert_eq!(c.memory_budget, 1 << 30);
        let e = Config::parse("max_connections = 0\n", Path::new("c.toml")).unwrap_err();
        assert_eq!(
            e.to_string(),
            "c.toml:1:1: max_connections: must be 1..=65536"
        );
    }

    #[test]
    fn empty_file_means_defaults() {
        let c = Config::parse("", Path::new("x.toml")).unwrap();
        assert_eq!(c.socket, PathBuf::from("/run/pycell/pycell.sock"));
        assert_eq!(c.socket_mode, 0o660);
        assert_eq!(c.allowed_groups, vec!["pycell".to_string()]);
        assert!(c.zygotes);
        let c = Config::parse("zygotes = false\n", Path::new("x.toml")).unwrap();
        assert!(!c.zygotes);
        let e = Config::parse("zygotes = \"no\"\n", Path::new("x.toml")).unwrap_err();
        assert!(e.to_string().contains("x.toml:1"), "{e}");
    }

    #[test]
    fn unknown_fields_name_file_line_and_field() {
        let e = Config::parse(
            "socket = \"/x\"\nmax_runz = 3\n",
            Path::new("/etc/pycell/pycelld.toml"),
        )
        .unwrap_err();
        let s = e.to_string();
        assert!(s.starts_with("/etc/pycell/pycelld.toml:2:1: "), "{s}");
        assert!(s.contains("max_runz"), "{s}");
    }

    #[test]
    fn values_are_checked() {
        let e = Config::parse("socket_mode = \"999\"\n", Path::new("c.toml")).unwrap_err();
        assert_eq!(
            e.to_string(),
            "c.toml:1:1: socket_mode: \"999\" is not an octal mode like \"0660\""
        );
        let e = Config::parse("\nlog_level = \"verbose\"\n", Path::new("c.toml")).unwrap_err();
        assert!(
            e.to_string()
                .starts_with("c.toml:2:1: log_level: use \"error\""),
            "{e}"
        );
        let c = Config::parse("log_level = \"debug\"\n", Path::new("c.toml")).unwrap();
        assert_eq!(c.log_level, crate::logging::LogLevel::Debug);
        let c = Config::parse("uid_range = \"5000-6000\"\nsocket_group = \"staff\"\naudit_log = \"/var/log/pycell.jsonl\"\n", Path::new("c.toml")).unwrap();
        assert_eq!(c.uid_range, 5000..=6000);
        assert_eq!(c.allowed_groups, vec!["staff".to_string()]);
        assert_eq!(c.audit, AuditSink::File("/var/log/pycell.jsonl".into()));
        assert!(Config::parse("uid_range = \"0-10\"\n", Path::new("c.toml")).is_err());
        assert_eq!(Config::default().cgroup_parent, "runs");
        let e = Config::parse("cgroup_parent = \"supervisor/x\"\n", Path::new("c.toml"))
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with(
                "c.toml:1:1: cgroup_parent: \"supervisor\" is the cgroup pycelld itself lives in"
            ),
            "{e}"
        );
        assert!(Config::parse("cgroup_parent = \"../x\"\n", Path::new("c.toml")).is_err());
        let text = "policies_by_uid = { \"*\" = [\"default\", \"network\"], root = [\"install\"], \"1000\" = [\"mcp-server\"] }\n";
        let c = Config::parse(text, Path::new("c.toml")).unwrap();
        assert_eq!(c.policy_access.check(1000, "mcp-server"), Ok(()));
        assert_eq!(c.policy_access.check(1001, "network"), Ok(()));
        assert!(c.policy_access.check(1001, "mcp-server").is_err());
        assert!(Config::default()
            .policy_access
            .check(1001, "network")
            .is_err());
        let e = Config::parse(
            "policies_by_uid = { nobody-here = [\"default\"] }\n",
            Path::new("c.toml"),
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("c.toml:1:1: policies_by_uid: \"nobody-here\" is neither"),
            "{e}"
        );
        let c = Config::parse("front_end_uids = [998]\n", Path::new("c.toml")).unwrap();
        assert_eq!(c.front_end_uids, vec![998]);
        assert!(Config::default().front_end_uids.is_empty());
        let e = Config::parse("front_end_uids = [0]\n", Path::new("c.toml")).unwrap_err();
        assert!(e.to_string().contains("uid 0 cannot be a front end"), "{e}");
    }
}

#[cfg(test)]
mod proxy_setting_tests {
    use super::is_proxy_setting;

    #[test]
    fn only_the_proxy_variables_reach_the_broker() {
        for v in [
            "HTTPS_PROXY",
            "https_proxy",
            "NO_PROXY",
            "no_proxy",
            "ALL_PROXY",
            "http_proxy",
        ] {
            assert!(is_proxy_setting(v), "{v}");
        }
        for v in ["PATH", "HOME", "Https_Proxy", "LD_PRELOAD", "HTTPS_PROXY_X"] {
            assert!(!is_proxy_setting(v), "{v}");
        }
    }
}
