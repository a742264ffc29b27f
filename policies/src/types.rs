//! Validated policy parts. Values of these types only come out of
//! validation, so the jailer may trust their invariants (absolute, normalized
//! paths; known modes) without checking again.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// What a policy's jails are for (`purpose`): code (runs and sessions:
/// `pycell run`, `run_python`, `session_start`), or a server over stdio
/// only (`pycell mcp-server`), whose long clocks no code run may borrow.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Purpose {
    #[default]
    Code,
    Server,
}

impl Purpose {
    pub fn as_str(self) -> &'static str {
        match self {
            Purpose::Code => "code",
            Purpose::Server => "server",
        }
    }
}

/// A Linux namespace. pycell puts every run in a new one of each kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Namespace {
    User,
    Pid,
    Mount,
    Net,
    Ipc,
    Uts,
    Cgroup,
}

impl Namespace {
    /// Every namespace, in the order the policy format lists them.
    pub const ALL: [Namespace; 7] = [
        Namespace::User,
        Namespace::Pid,
        Namespace::Mount,
        Namespace::Net,
        Namespace::Ipc,
        Namespace::Uts,
        Namespace::Cgroup,
    ];

    /// The name used in policy files ("user", "pid", ...).
    pub fn as_str(self) -> &'static str {
        match self {
            Namespace::User => "user",
            Namespace::Pid => "pid",
            Namespace::Mount => "mount",
            Namespace::Net => "net",
            Namespace::Ipc => "ipc",
            Namespace::Uts => "uts",
            Namespace::Cgroup => "cgroup",
        }
    }
}

impl std::fmt::Display for Namespace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The namespaces of every run: always all of them. A policy must list all
/// seven so that a reader of the file sees what the jail is.
pub fn namespaces() -> &'static [Namespace] {
    &Namespace::ALL
}

/// Which Python runs the code.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub enum Interpreter {
    /// A host python executable, e.g. Debian's /usr/bin/python3. Its
    /// directory tree must be reachable through `mounts`.
    #[serde(rename = "python")]
    HostPython(PathBuf),
    /// A host virtual environment directory made by uv; the CLI/daemon
    /// mounts it read-only into the jail (at /venv).
    #[serde(rename = "venv")]
    Venv(PathBuf),
}

impl Interpreter {
    /// The configured path: the executable, or the venv directory.
    pub fn path(&self) -> &std::path::Path {
        match self {
            Interpreter::HostPython(p) | Interpreter::Venv(p) => p,
        }
    }
}

/// Network access of the jail. Either way it has a network namespace of its
/// own with only loopback: no route, no resolver.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "mode", rename_all = "lowercase")]
pub enum NetworkMode {
    /// Nothing beyond loopback.
    None,
    /// HTTP(S) egress to allowlisted hosts through pycell's proxy, reachable
    /// on the jail's loopback.
    Allowlist(crate::network::EgressRules),
}

impl NetworkMode {
    pub fn as_str(&self) -> &'static str {
        match self {
            NetworkMode::None => "none",
            NetworkMode::Allowlist(_) => "allowlist",
        }
    }

    /// The allowlist's rules, if this mode has one.
    pub fn egress(&self) -> Option<&crate::network::EgressRules> {
        match self {
            NetworkMode::None => None,
            NetworkMode::Allowlist(r) => Some(r),
        }
    }
}

/// A read-only bind mount of a host path into the jail. There is no writable
/// kind: the only writable places are the jailer's tmpfs mounts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ReadOnlyMount {
    /// Absolute, normalized host path. If it is a symlink on the host, the
    /// jailer recreates the same symlink at `target` instead of binding.
    pub source: PathBuf,
    /// Absolute, normalized path in the jail; never /, nor under /proc, /dev,
    /// /tmp, /workspace or /etc.
    pub target: PathBuf,
}

/// Extra Landlock grants, on top of what the jailer grants by itself (the
/// interpreter, every mount target, /tmp, /workspace, /dev basics).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LandlockRules {
    /// The run is refused if the kernel's Landlock ABI is lower. 1..=7.
    pub min_abi: u8,
    /// Absolute in-jail paths granted read + execute.
    pub read_exec: Vec<PathBuf>,
    /// Absolute in-jail paths granted read.
    pub read_only: Vec<PathBuf>,
    /// Absolute in-jail paths granted read + write; each is /workspace, /tmp,
    /// or under one of them.
    pub read_write: Vec<PathBuf>,
}

impl Default for LandlockRules {
    fn default() -> Self {
        LandlockRules {
            min_abi: 2,
            read_exec: Vec::new(),
            read_only: Vec::new(),
            read_write: Vec::new(),
        }
    }
}

/// `[dependencies]`: whether runs may name packages, which packages every
/// run gets, and which policy's jail builds the env.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Dependencies {
    /// Runs may name packages (a PEP 723 block, `pycell run --with`, the
    /// MCP tool's `dependencies`).
    pub allow: bool,
    /// Installed into every run's env (e.g. numpy for `data-science`).
    pub packages: Vec<crate::requirement::Requirement>,
    /// The policy whose jail resolves and installs (`install`).
    pub install_policy: String,
}

impl Default for Dependencies {
    fn default() -> Dependencies {
        Dependencies {
            allow: false,
            packages: Vec::new(),
            install_policy: "install".to_owned(),
        }
    }
}

/// `[install]`: present only in a policy that builds envs: where its uv
/// finds wheels.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct InstallSource {
    /// A PEP 503 simple index (http or https), reached through the egress
    /// proxy; `None` for an offline policy (network mode "none").
    pub index_url: Option<String>,
    /// Local directories of wheels, mounted read-only at the same path.
    pub find_links: Vec<PathBuf>,
}
