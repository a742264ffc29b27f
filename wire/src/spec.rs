//! The fully resolved description of one sandbox run, as the jailer receives
//! it (JSON on stdin). The caller (the CLI in embedded mode, later the daemon's
//! monitor) resolves a policy into this; the jailer re-validates it anyway,
//! because it runs as root and must not trust its input's shape.

use std::path::{Component, Path, PathBuf};

use serde::{Deserialize, Serialize};

pub use crate::limits::RunLimits;
use crate::limits::MAX_CLOCK;

/// In-jail uid/gid of the sandboxed code. It maps to the unique host
/// `sandbox_uid`/`sandbox_gid`; uid 0 is not mapped at all.
pub const JAIL_UID: u32 = 1000;
pub const JAIL_GID: u32 = 1000;
/// Where the code's files go, and its working directory.
pub const WORKSPACE: &str = "/workspace";
/// The variable that tells the program which descriptor is its end of the
/// tool channel (see [`JailSpec::tools`]).
pub const TOOLS_FD_VAR: &str = "PYCELL_TOOLS_FD";

/// The largest spec frame a jailer reads (code and stdin of 16 MiB each,
/// the stdin as a JSON list of numbers).
pub const MAX_SPEC_FRAME: u64 = 64 << 20;

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JailSpec {
    /// `r-` followed by lowercase hex; names the cgroup.
    pub run_id: String,
    /// Host uid/gid the code runs as (allocated by the caller, unique per
    /// concurrent sandbox, not root and not an existing account).
    pub sandbox_uid: u32,
    pub sandbox_gid: u32,
    /// argv of the program exec'd inside the jail; argv[0] is an absolute
    /// in-jail path.
    pub argv: Vec<String>,
    /// The complete environment (nothing is inherited).
    pub env: Vec<(String, String)>,
    /// Files written into /workspace before the code starts.
    pub files: Vec<WorkspaceFile>,
    /// Bytes fed to the program's stdin (then closed).
    #[serde(default)]
    pub stdin: Vec<u8>,
    /// Read-only bind mounts (host source → in-jail target). A source that is
    /// a symlink on the host is recreated as the same symlink.
    pub mounts: Vec<BindMount>,
    pub limits: RunLimits,
    pub landlock: LandlockSpec,
    /// Name of a profile known to the `pycell-seccomp` crate.
    pub seccomp_profile: String,
    pub cgroup: CgroupSpec,
    /// What the jail's network namespace holds besides loopback.
    #[serde(default)]
    pub network: NetworkSpec,
    /// Hand a descriptor of /workspace out on the jailer's stdin socket
    /// (before the proxy's listener, if any), for the launcher to copy
    /// what the jail built: the install jail's env.
    #[serde(default)]
    pub export_workspace: bool,
    /// A warm jail: `argv` starts pycell's runner, which waits for its work
    /// on the jailer's stdin after this spec (see [`crate::runner`]); the
    /// clocks start when it arrives.
    #[serde(default)]
    pub warm: bool,
    /// A session: a warm jail whose runner serves requests (cells, file
    /// operations) one at a time, for as long as the session lives (see
    /// `pycell_runner::session`). Needs `warm`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session: Option<SessionSpec>,
    /// A python run on pycell's runner, which sends back the figures it
    /// leaves open, the image files it writes and what it shows with
    /// `display()`, within these limits (on its stdin, then a socket: see
    /// `pycell_runner`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub media: Option<MediaLimits>,
    /// Code mode: the jail makes a socketpair, hands one end out on the
    /// jailer's stdin socket (`Handout::ToolChannel`) and gives the other
    /// to the program (its number in `PYCELL_TOOLS_FD`), through which
    /// pycell's runner serves `import pycell_tools`. Needs the runner.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub tools: bool,
    /// A server over stdio (`pycell mcp-server`): the program's stdin and
    /// stdout are one end of a socketpair whose other end the jail hands
    /// out on the jailer's stdin socket (`Handout::Stdio`), for whoever
    /// launched it to relay; bytes go between them and never through the
    /// jailer. stderr is the run's output as ever. Not on the runner.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub stdio_socket: bool,
    /// Host paths the caller granted (`pycell mcp-server --ro/--rw`),
    /// bound after `mounts`: the source of the i-th is the i-th
    /// [`SpecFd::Grant`] descriptor that comes with the spec, the one the
    /// caller opened it on.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub grants: Vec<Grant>,
    /// The descriptors that come with this spec (attached to its frame's
    /// first bytes on the jailer's stdin socket, `SCM_RIGHTS`), named in
    /// the order they come. Handed over with the spec rather than
    /// inherited at fixed numbers, the jailer is started without a
    /// pre-exec step in its starter (a `vfork`-style spawn, not a copy of
    /// a large multi-threaded process).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub descriptors: Vec<SpecFd>,
    /// Mark each step of the jail's start and end in the report
    /// ([`crate::timings`]).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub timings: bool,
    /// A zygote: a warm jail whose runner, once warm, forks one run per
    /// request instead of running work itself (see [`ZygoteSpec`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub zygote: Option<ZygoteSpec>,
    /// A warm jail forked from a zygote (whose channel comes with the
    /// spec, [`SpecFd::Zygote`]) instead of cloned.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from_zygote: Option<FromZygote>,
    /// A cold run's runner compiled for its interpreter: a host file (root's,
    /// in a directory only root may change) that the jailer copies into the
    /// jail's root at [`RUNNER_PYC`], where argv names it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runner_pyc: Option<PathBuf>,
}

/// Where a cold run's compiled runner ([`JailSpec::runner_pyc`]) is in the
/// jail: a read-only file of the jail's root.
pub const RUNNER_PYC: &str = "/.pycell/runner.pyc";

/// The largest compiled runner the jailer copies in.
pub const MAX_RUNNER_PYC: u64 = 1 << 20;

/// A granted host path: where it shows in the jail, and whether the jail
/// may write there. Its files keep their owner on the host; in the jail
/// files of `owner` are the jail user's (an idmapped mount), so the jail
/// has that owner's rights there and nobody else's.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Grant {
    pub target: PathBuf,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub writable: bool,
    /// Whose files are the jail's: the caller's ids (through pycelld, the
    /// client's), or, when none is given (a root caller), the granted
    /// path's own owner.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<SlotIds>,
}

/// Where a run's env of installed dependencies is mounted.
pub const VENV_TARGET: &str = "/venv";

/// The most grants one jail takes.
pub const MAX_GRANTS: usize = 8;

/// A descriptor that comes with a spec ([`JailSpec::descriptors`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SpecFd {
    /// The pipe the jailer writes its outcome line to when the run ends
    /// (`crate::outcome`): pycelld's monitor reads it for its audit log.
    Outcome,
    /// The channel of the zygote a run is forked from ([`FromZygote`]).
    Zygote,
    /// The source of the next of [`JailSpec::grants`].
    Grant,
}

/// The variable that tells a run's program forked from a zygote where the
/// zygote's channel is (in the zygote, which serves runs on it).
pub const ZYGOTE_FD_ENV: &str = "PYCELL_ZYGOTE_FD";
/// The variable that tells a zygote's program where its library is
/// (`/proc/self/fd/N`: the sealed memfd its jailer made).
pub const ZYGOTE_LIB_ENV: &str = "PYCELL_ZYGOTE_LIB";
/// In a zygote's user namespace: the zygote itself is uid/gid 0 (mapped
/// to its `sandbox_uid`), slot `i` is `ZYGOTE_SLOT_BASE + i` (mapped to
/// the slot's host ids). A run from slot `i` becomes that id before it
/// makes its own user namespace, where it is [`JAIL_UID`].
pub const ZYGOTE_SLOT_BASE: u32 = 2000;
/// The most slots (runs at once) one zygote has.
pub const MAX_ZYGOTE_SLOTS: usize = 256;

/// What a zygote's user namespace maps besides the zygote: one host
/// uid/gid per slot, each lent to one run at a time; and the library its
/// python loads (which the jailer copies into a sealed memfd for it, so
/// that no host path is bound into the jail or shows in its maps).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ZygoteSpec {
    pub slots: Vec<SlotIds>,
    /// `libpycell_zygote.so` on the host (beside the jailer).
    pub lib: PathBuf,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SlotIds {
    pub uid: u32,
    pub gid: u32,
}

/// Which of its zygote's slots a run has (its `sandbox_uid` is that
/// slot's host uid), and the zygote's own host uid, which owns the user
/// namespace the run's is nested in (its jailer acts as that owner to pin
/// the run's rlimits).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FromZygote {
    pub slot: u32,
    pub zygote_uid: u32,
}

/// What a python run's runner sends back besides its output (images and
/// displays), and how large it may be.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MediaLimits {
    pub images: ImageLimits,
    pub displays: DisplayLimits,
}

/// How large the images a run sends back may be.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ImageLimits {
    /// The longest side of an image, in pixels.
    pub max_edge: u32,
    /// All of one result's images together, in bytes of PNG.
    pub max_bytes: u64,
}

/// How large the displays a run or cell sends back may be (`display()`,
/// a cell's value): the policy's `[output]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DisplayLimits {
    /// Characters of each text part (its head and tail kept).
    pub part_chars: u32,
    /// All of one result's displays together, in bytes.
    pub total_bytes: u64,
    /// Displays kept per result.
    pub count: u32,
}

impl Default for DisplayLimits {
    fn default() -> DisplayLimits {
        DisplayLimits {
            part_chars: 16 << 10,
            total_bytes: 256 << 10,
            count: 16,
        }
    }
}

/// A session's clocks, which its jailer keeps: the jail ends when it has
/// been idle (no request in flight) for `idle_timeout_ms`, at the latest
/// `lifetime_ms` after it became ready, and when a cell that was told to
/// stop (SIGINT, at its wall timeout) has not answered `cell_grace_ms`
/// later.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SessionSpec {
    pub idle_timeout_ms: u64,
    pub lifetime_ms: u64,
    pub cell_grace_ms: u64,
}

/// The host's TLS trust store (Debian's ca-certificates), bound read-only
/// at the same place in jails with egress: the one bind allowed under the
/// jailer's synthetic /etc, so that HTTPS clients can verify their hosts.
pub const CA_CERTIFICATES: &str = "/etc/ssl/certs";

/// Where the egress proxy listens inside a jail (on its loopback).
pub const EGRESS_PROXY_PORT: u16 = 3128;

/// The jail's network namespace: always its own, with no route and no
/// resolver.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum NetworkSpec {
    /// Loopback only.
    #[default]
    Loopback,
    /// Loopback, with a listening socket on 127.0.0.1:`port` that the
    /// jailer makes inside the namespace and hands out on its stdin (a unix
    /// socket) to whoever runs the egress proxy. Landlock (ABI 4 and up)
    /// lets the sandbox connect to that port only.
    Proxy { port: u16 },
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkspaceFile {
    /// A plain file name (no slashes).
    pub name: String,
    /// The file's text; or
    pub contents: String,
    /// its bytes, for a file that is not text (a run's input files).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub data: Vec<u8>,
}

impl WorkspaceFile {
    /// A text file.
    pub fn text(name: impl Into<String>, contents: impl Into<String>) -> WorkspaceFile {
        WorkspaceFile {
            name: name.into(),
            contents: contents.into(),
            data: Vec::new(),
        }
    }

    /// What the file holds.
    pub fn bytes(&self) -> &[u8] {
        match self.data.is_empty() {
            true => self.contents.as_bytes(),
            false => &self.data,
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BindMount {
    pub source: PathBuf,
    pub target: PathBuf,
    /// The source's host path must not show in the jail (a directory of
    /// pycell's own stores): it is mounted as a read-only overlay of the
    /// source, whose mountinfo line names no host path.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub hide_source: bool,
}

impl BindMount {
    /// A bind of `source` at `target`.
    pub fn new(source: impl Into<PathBuf>, target: impl Into<PathBuf>) -> BindMount {
        BindMount {
            source: source.into(),
            target: target.into(),
            hide_source: false,
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LandlockSpec {
    /// The run is refused if the kernel's Landlock ABI is lower.
    pub min_abi: u8,
    pub read_exec: Vec<PathBuf>,
    pub read_only: Vec<PathBuf>,
    pub read_write: Vec<PathBuf>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CgroupSpec {
    /// Parent under which the per-run cgroup is created, relative to the
    /// jailer's own cgroup in each hierarchy (e.g. "pycell").
    pub parent: String,
    /// Whether the run may take a kept cgroup, and keep its own for the
    /// next run, on v1 (`pycell_host::cgroup::kept`): only for a
    /// long-lived owner of `parent` that removes what is kept when it
    /// stops (pycelld); a one-off `pycell run` leaves nothing.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub keep: bool,
}

/// Why a spec was rejected by [`JailSpec::validate`].
#[derive(Debug, thiserror::Error)]
#[error("invalid jail spec: {field}: {problem}")]
pub struct SpecError {
    pub field: String,
    pub problem: String,
}

fn bad(field: impl Into<String>, problem: impl Into<String>) -> SpecError {
    SpecError {
        field: field.into(),
        problem: problem.into(),
    }
}

/// Absolute, no `.`/`..`, no NUL.
pub fn is_clean_absolute(p: &Path) -> bool {
    p.is_absolute()
        && !p.as_os_str().as_encoded_bytes().contains(&0)
        && p.components()
            .all(|c| matches!(c, Component::RootDir | Component::Normal(_)))
}

/// In-jail paths the jailer builds itself; binds may not cover them.
const RESERVED_TARGETS: &[&str] = &["/proc", "/dev", "/tmp", WORKSPACE, "/etc"];

/// A fresh run id: `r-` and 16 lowercase hex digits (what
/// [`JailSpec::validate`] accepts), unique within this process and very
/// likely across processes (time, pid and a counter mixed).
pub fn new_run_id() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let mixed = t ^ (u64::from(std::process::id()) << 40) ^ n.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    format!("r-{mixed:016x}")
}

/// A cgroup path below some base: plain names (ASCII letters, digits, `-`,
/// `_`, `.`) separated by single `/`, none of them `.` or `..`.
/// Why a path component is not trusted (see [`trusted`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Untrusted {
    #[error("is owned by uid {0}, not root")]
    Owner(u32),
    #[error("is writable by others (mode {0:o})")]
    WritableByOthers(u32),
    #[error("is writable by group {gid} (mode {mode:o})")]
    WritableByGroup { gid: u32, mode: u32 },
}

/// Owned by root and writable by no one else: the rule for every component
/// of a bind source, as the host sees it (the jailer checks it; pycelld
/// checks its env store with it at start).
pub fn trusted(uid: u32, gid: u32, mode: u32) -> Result<(), Untrusted> {
    if uid != 0 {
        return Err(Untrusted::Owner(uid));
    }
    if mode & 0o002 != 0 {
        return Err(Untrusted::WritableByOthers(mode & 0o7777));
    }
    if mode & 0o020 != 0 && gid != 0 {
        return Err(Untrusted::WritableByGroup {
            gid,
            mode: mode & 0o7777,
        });
    }
    Ok(())
}

pub fn is_plain_relative_path(p: &str) -> bool {
    !p.is_empty()
        && p.split('/').all(|seg| {
            !seg.is_empty()
                && seg != "."
                && seg != ".."
                && seg
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
        })
}

impl JailSpec {
    /// Check every field a jailer relies on; the first problem is the error.
    pub fn validate(&self) -> Result<(), SpecError> {
        self.validate_identity()?;
        self.validate_program()?;
        self.validate_mounts()?;
        if let Some(pyc) = &self.runner_pyc {
            if !is_clean_absolute(pyc) {
                return Err(bad("runner_pyc", "must be a clean absolute path"));
            }
            if self.argv.get(2).map(String::as_str) != Some(RUNNER_PYC) {
                return Err(bad("runner_pyc", format!("argv[2] must be {RUNNER_PYC}")));
            }
        }
        self.validate_descriptors()?;
        check_limits(&self.limits)?;
        self.landlock.validate()?;
        if !is_plain_relative_path(&self.cgroup.parent) {
            return Err(bad(
                "cgroup.parent",
                "must be a relative path of plain names (letters, digits, - _ .) separated by /",
            ));
        }
        Ok(())
    }

    fn validate_identity(&self) -> Result<(), SpecError> {
        let id_ok = self.run_id.len() <= 40
            && self.run_id.starts_with("r-")
            && self.run_id.len() > 2
            && self.run_id[2..]
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
        if !id_ok {
            return Err(bad("run_id", "must be r- followed by lowercase hex"));
        }
        if self.sandbox_uid == 0 || self.sandbox_gid == 0 {
            return Err(bad("sandbox_uid", "the sandbox must not run as root"));
        }
        if self.sandbox_uid == u32::MAX || self.sandbox_gid == u32::MAX {
            return Err(bad("sandbox_uid", "(uid_t)-1 is not a valid id"));
        }
        Ok(())
    }

    /// argv, environment and workspace files.
    fn validate_program(&self) -> Result<(), SpecError> {
        match self.argv.first() {
            Some(a0) if is_clean_absolute(Path::new(a0)) => {}
            _ => return Err(bad("argv", "argv[0] must be an absolute in-jail path")),
        }
        if self.argv.iter().any(|a| a.contains('\0')) {
            return Err(bad("argv", "contains a NUL byte"));
        }
        for (k, v) in &self.env {
            let key_ok = !k.is_empty()
                && k.bytes().enumerate().all(|(i, b)| {
                    b == b'_' || b.is_ascii_alphabetic() || (i > 0 && b.is_ascii_digit())
                });
            if !key_ok || v.contains('\0') {
                return Err(bad(
                    format!("env.{k}"),
                    "invalid variable name or NUL in value",
                ));
            }
        }
        if self.tools && self.media.is_none() && self.session.is_none() {
            return Err(bad(
                "tools",
                "tool calls need a python run on pycell's runner",
            ));
        }
        if self.stdio_socket
            && (self.warm || self.tools || self.media.is_some() || !self.stdin.is_empty())
        {
            return Err(bad(
                "stdio_socket",
                "a server over stdio is a plain cold run: no runner, tools or stdin bytes",
            ));
        }
        if self.warm && (self.export_workspace || !self.files.is_empty() || !self.stdin.is_empty())
        {
            return Err(bad(
                "warm",
                "a warm jail gets its script and stdin with its work, and exports nothing",
            ));
        }
        self.validate_zygote()?;
        if let Some(s) = &self.session {
            if !self.warm {
                return Err(bad("session", "a session's jail is a warm jail"));
            }
            if s.idle_timeout_ms == 0 || s.lifetime_ms == 0 || s.cell_grace_ms == 0 {
                return Err(bad("session", "its timeouts must be positive"));
            }
        }
        for (i, f) in self.files.iter().enumerate() {
            let n = f.name.as_str();
            if n.is_empty() || n.contains('/') || n.contains('\0') || n == "." || n == ".." {
                return Err(bad("files", format!("{n:?} is not a plain file name")));
            }
            if !f.contents.is_empty() && !f.data.is_empty() {
                return Err(bad("files", format!("{n:?} has both text and bytes")));
            }
            if self.files[..i].iter().any(|o| o.name == f.name) {
                return Err(bad("files", format!("{n:?} is given twice")));
            }
        }
        Ok(())
    }

    /// A zygote and its runs are plain warm jails: no session, no tool
    /// channel, loopback only (what the zygote's children can set up
    /// without the jailer's help).
    fn validate_zygote(&self) -> Result<(), SpecError> {
        let (field, slots) = match (&self.zygote, &self.from_zygote) {
            (None, None) => return Ok(()),
            (Some(_), Some(_)) => {
                return Err(bad(
                    "zygote",
                    "a jail is a zygote or forked from one, not both",
                ))
            }
            (Some(z), None) => ("zygote", z.slots.len()),
            (None, Some(f)) if f.zygote_uid == 0 || f.zygote_uid == u32::MAX => {
                return Err(bad(
                    "from_zygote",
                    "the zygote's uid: not root, not (uid_t)-1",
                ));
            }
            (None, Some(f)) => ("from_zygote", f.slot as usize + 1),
        };
        if !self.warm || self.session.is_some() || self.tools {
            return Err(bad(field, "only a warm jail without a session or tools"));
        }
        if self.network != NetworkSpec::Loopback {
            return Err(bad(field, "only a jail with loopback only"));
        }
        if slots == 0 || slots > MAX_ZYGOTE_SLOTS {
            return Err(bad(field, format!("1 to {MAX_ZYGOTE_SLOTS} slots")));
        }
        let Some(z) = &self.zygote else {
            return Ok(());
        };
        if !is_clean_absolute(&z.lib) {
            return Err(bad("zygote.lib", "must be a clean absolute path"));
        }
        for (i, s) in z.slots.iter().enumerate() {
            let ids = [s.uid, s.gid];
            if ids.iter().any(|&id| id == 0 || id == u32::MAX) {
                return Err(bad("zygote.slots", "not root, not (uid_t)-1"));
            }
            let taken = |o: &SlotIds| o.uid == s.uid || o.gid == s.gid;
            if z.slots[..i].iter().any(taken)
                || s.uid == self.sandbox_uid
                || s.gid == self.sandbox_gid
            {
                return Err(bad("zygote.slots", format!("{} is given twice", s.uid)));
            }
        }
        Ok(())
    }

    fn validate_mounts(&self) -> Result<(), SpecError> {
        for m in &self.mounts {
            if !is_clean_absolute(&m.source) || !is_clean_absolute(&m.target) {
                return Err(bad(
                    "mounts",
                    format!(
                        "{} -> {} must be clean absolute paths",
                        m.source.display(),
                        m.target.display()
                    ),
                ));
            }
            let trust_store = m.source == Path::new(CA_CERTIFICATES)
                && m.target == Path::new(CA_CERTIFICATES)
                && self.network != NetworkSpec::Loopback;
            if built_by_jailer(&m.target) && !trust_store {
                let t = m.target.display();
                return Err(bad("mounts", format!("target {t} is built by the jailer")));
            }
        }
        self.validate_grants()
    }

    /// Exactly the descriptors the spec needs come with it: one per
    /// grant, the zygote's channel for a run from a zygote, and at most
    /// an outcome pipe besides.
    fn validate_descriptors(&self) -> Result<(), SpecError> {
        let count = |k: SpecFd| self.descriptors.iter().filter(|d| **d == k).count();
        if count(SpecFd::Grant) != self.grants.len() {
            return Err(bad("descriptors", "one grant descriptor per grant"));
        }
        if count(SpecFd::Zygote) != usize::from(self.from_zygote.is_some()) {
            return Err(bad(
                "descriptors",
                "the zygote's channel comes with a run from a zygote, and only then",
            ));
        }
        if count(SpecFd::Outcome) > 1 {
            return Err(bad("descriptors", "one outcome pipe at most"));
        }
        Ok(())
    }

    fn validate_grants(&self) -> Result<(), SpecError> {
        if self.grants.len() > MAX_GRANTS {
            return Err(bad("grants", format!("at most {MAX_GRANTS}")));
        }
        if !self.grants.is_empty() && (self.warm || self.zygote.is_some()) {
            return Err(bad("grants", "only a cold run takes grants"));
        }
        for (i, g) in self.grants.iter().enumerate() {
            if let Some(problem) = grant_target_problem(&g.target) {
                return Err(bad("grants", problem));
            }
            if self.grants[..i].iter().any(|o| o.target == g.target) {
                let t = g.target.display();
                return Err(bad("grants", format!("{t} is given twice")));
            }
        }
        Ok(())
    }
}

/// Why `target` cannot be where a granted host path shows in a jail, if
/// it cannot: it must be clean and absolute, and neither a place the
/// jailer builds itself (/, /proc, /dev, /tmp, /workspace, /etc) nor the
/// run's env.
pub fn grant_target_problem(target: &Path) -> Option<String> {
    let t = target.display();
    if !is_clean_absolute(target) {
        return Some(format!("{t} is not a clean absolute path"));
    }
    if built_by_jailer(target) {
        return Some(format!(
            "{t} is in a place each jail has its own of (/, /proc, /dev, /tmp, /workspace, /etc): grant a path elsewhere"
        ));
    }
    if target.starts_with(VENV_TARGET) {
        return Some(format!(
            "{t} is where the jail's env is mounted: grant a path elsewhere"
        ));
    }
    None
}

/// Why a descriptor with open `flags` and `fstat` mode `mode` cannot be
/// a grant's source, if it cannot: it must be a directory or a regular
/// file, opened for reading (an `O_PATH` or write-only descriptor proves
/// no right to read it).
pub fn grant_source_problem(flags: u32, mode: u32) -> Option<&'static str> {
    use rustix::fs::{FileType, OFlags};
    let flags = OFlags::from_bits_retain(flags);
    if flags.contains(OFlags::PATH) || flags & OFlags::RWMODE == OFlags::WRONLY {
        return Some("its descriptor must be open for reading");
    }
    match FileType::from_raw_mode(mode) {
        FileType::Directory | FileType::RegularFile => None,
        _ => Some("only a directory or a regular file can be granted"),
    }
}

/// Whether the jailer builds `target` itself (/, or under /proc, /dev,
/// /tmp, /workspace or /etc), so that no bind may cover it.
fn built_by_jailer(target: &Path) -> bool {
    target == Path::new("/") || RESERVED_TARGETS.iter().any(|r| target.starts_with(r))
}

/// The limits as the jailer needs them: positive, and large enough for
/// python to start (their policy ranges were checked where they were
/// settled).
fn check_limits(l: &RunLimits) -> Result<(), SpecError> {
    if l.wall_timeout.is_zero()
        || l.cpu_time.is_zero()
        || l.wall_timeout > MAX_CLOCK
        || l.cpu_time > MAX_CLOCK
        || l.memory.get() < (16 << 20)
        || l.pids == 0
        || l.cpus.get().is_nan()
        || l.cpus.get() <= 0.0
    {
        return Err(bad(
            "limits",
            "timeout and CPU time (at most 30 days), memory (>= 16MiB), pids and cpus must be positive",
        ));
    }
    if l.disk.get() < 4096 || l.open_files < 16 {
        return Err(bad(
            "limits",
            "workspace/tmp sizes and open_files are too small",
        ));
    }
    Ok(())
}

impl LandlockSpec {
    fn validate(&self) -> Result<(), SpecError> {
        let all = self
            .read_exec
            .iter()
            .chain(&self.read_only)
            .chain(&self.read_write);
        for p in all {
            if !is_clean_absolute(p) {
                return Err(bad(
                    "landlock",
                    format!("{} is not a clean absolute path", p.display()),
                ));
            }
        }
        for p in &self.read_write {
            if !(p.starts_with(WORKSPACE) || p.starts_with("/tmp")) {
                return Err(bad(
                    "landlock.read_write",
                    format!("{} is outside /workspace and /tmp", p.display()),
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::{is_plain_relative_path, new_run_id};
    use super::{FromZygote, JailSpec, NetworkSpec, SlotIds, ZygoteSpec};

    /// A warm jail's spec that validates.
    fn warm() -> JailSpec {
        let spec: JailSpec = serde_json::from_value(serde_json::json!({
            "run_id": "r-1f", "sandbox_uid": 1_800_000_001u32, "sandbox_gid": 1_800_000_001u32,
            "argv": ["/usr/bin/python3"], "env": [], "files": [], "mounts": [],
            "limits": {"wall_timeout_s": 1.0, "cpu_time_s": 1.0, "memory_bytes": 64 << 20,
                       "pids": 16, "cpus": 1.0, "open_files": 64,
                       "file_size_bytes": 1 << 20, "disk_bytes": 1 << 20, "max_output_bytes": 1 << 20,
                       "inotify_instances": 16, "inotify_watches": 8192},
            "landlock": {"min_abi": 1, "read_exec": [], "read_only": [], "read_write": []},
            "seccomp_profile": "default", "cgroup": {"parent": "pycell"}, "warm": true,
        }))
        .unwrap();
        spec.validate().unwrap();
        spec
    }

    fn slot(id: u32) -> SlotIds {
        SlotIds { uid: id, gid: id }
    }

    #[test]
    fn zygotes_and_their_runs_are_plain_warm_jails_with_distinct_slots() {
        let mut z = warm();
        z.zygote = Some(ZygoteSpec {
            slots: vec![slot(1_800_000_002), slot(1_800_000_003)],
            lib: "/usr/libexec/pycell/libpycell_zygote.so".into(),
        });
        z.validate().unwrap();
        let mut run = warm();
        run.from_zygote = Some(FromZygote {
            slot: 1,
            zygote_uid: 1_800_000_001,
        });
        assert_eq!(run.validate().unwrap_err().field, "descriptors");
        use super::SpecFd;
        run.descriptors = vec![SpecFd::Outcome, SpecFd::Zygote];
        run.validate().unwrap();
        let mut channel_to_a_zygote = z.clone();
        channel_to_a_zygote.descriptors = vec![SpecFd::Zygote];
        assert_eq!(
            channel_to_a_zygote.validate().unwrap_err().field,
            "descriptors"
        );
        let refused = |s: &JailSpec, why: &str| {
            let e = s.validate().unwrap_err().to_string();
            assert!(e.contains(why), "{e}");
        };
        let mut both = z.clone();
        both.from_zygote = Some(FromZygote {
            slot: 0,
            zygote_uid: 1_800_000_001,
        });
        refused(&both, "not both");
        let mut cold = run.clone();
        cold.warm = false;
        refused(&cold, "only a warm jail");
        let mut egress = z.clone();
        egress.network = NetworkSpec::Proxy { port: 3128 };
        refused(&egress, "loopback only");
        let mut twice = z.clone();
        twice.zygote.as_mut().unwrap().slots = vec![slot(1_800_000_002), slot(1_800_000_002)];
        refused(&twice, "given twice");
        let mut own = z.clone();
        own.zygote.as_mut().unwrap().slots = vec![slot(1_800_000_001)];
        refused(&own, "given twice");
        let mut root = z.clone();
        root.zygote.as_mut().unwrap().slots = vec![slot(0)];
        refused(&root, "not root");
        let mut relative = z.clone();
        relative.zygote.as_mut().unwrap().lib = "lib.so".into();
        refused(&relative, "zygote.lib");
        let mut none = z;
        none.zygote.as_mut().unwrap().slots = vec![];
        refused(&none, "slots");
        let mut far = run;
        far.from_zygote = Some(FromZygote {
            slot: 256,
            zygote_uid: 1_800_000_001,
        });
        refused(&far, "slots");
    }

    #[test]
    fn a_server_over_stdio_is_a_plain_cold_run() {
        let mut server = warm();
        server.warm = false;
        server.stdio_socket = true;
        server.validate().unwrap();
        let refused = |s: &JailSpec| {
            let e = s.validate().unwrap_err().to_string();
            assert!(e.contains("stdio_socket"), "{e}");
        };
        let mut warm_server = server.clone();
        warm_server.warm = true;
        refused(&warm_server);
        let mut with_stdin = server.clone();
        with_stdin.stdin = b"{}".to_vec();
        refused(&with_stdin);
        let mut on_runner = server;
        on_runner.media = Some(super::MediaLimits {
            images: super::ImageLimits {
                max_edge: 64,
                max_bytes: 1024,
            },
            displays: super::DisplayLimits::default(),
        });
        refused(&on_runner);
    }

    #[test]
    fn grants_go_to_a_cold_run_outside_what_the_jailer_builds_once_each() {
        use super::{grant_target_problem, Grant, SpecFd, MAX_GRANTS};
        let mut cold = warm();
        cold.warm = false;
        let grant = |t: &str, writable| Grant {
            target: t.into(),
            writable,
            owner: None,
        };
        cold.grants = vec![grant("/srv/repo", false), grant("/home/u/state", true)];
        let descriptors = |s: &JailSpec| s.validate().unwrap_err().field == "descriptors";
        assert!(descriptors(&cold), "a grant's source comes with the spec");
        cold.descriptors = vec![SpecFd::Outcome, SpecFd::Grant];
        assert!(descriptors(&cold), "one per grant");
        cold.descriptors.push(SpecFd::Grant);
        cold.validate().unwrap();
        cold.descriptors.push(SpecFd::Outcome);
        assert!(descriptors(&cold), "one outcome pipe");
        cold.descriptors.pop();
        for bad in [
            "/",
            "/tmp/x",
            "/workspace",
            "/etc/ssh",
            "/proc/1",
            "/dev/x",
            "/venv/lib",
            "rel",
            "/a/../b",
        ] {
            assert!(
                grant_target_problem(std::path::Path::new(bad)).is_some(),
                "{bad}"
            );
        }
        assert!(grant_target_problem(std::path::Path::new("/tmpfoo")).is_none());
        use super::grant_source_problem as source;
        let (dir, file, fifo) = (0o040755, 0o100644, 0o010644);
        let (rdonly, rdwr, wronly, path) = (0, 2, 1, 0o10000000);
        assert_eq!(source(rdonly, dir), None);
        assert_eq!(source(rdwr | 0o2000000, file), None);
        assert!(source(path, dir).is_some());
        assert!(source(wronly, file).is_some());
        assert!(source(rdonly, fifo).is_some());
        let mut twice = cold.clone();
        twice.grants.push(grant("/srv/repo", true));
        assert!(twice.validate().unwrap_err().to_string().contains("twice"));
        let mut many = cold.clone();
        many.grants = (0..=MAX_GRANTS)
            .map(|i| grant(&format!("/srv/{i}"), false))
            .collect();
        assert!(many.validate().is_err());
        let mut warm_grants = cold;
        warm_grants.warm = true;
        assert!(warm_grants
            .validate()
            .unwrap_err()
            .to_string()
            .contains("cold run"));
    }

    #[test]
    fn run_ids_are_what_the_jailer_accepts_and_distinct() {
        let (a, b) = (new_run_id(), new_run_id());
        assert_ne!(a, b);
        for id in [a, b] {
            assert_eq!(id.len(), 18, "{id}");
            assert!(id.starts_with("r-"));
            assert!(id[2..]
                .bytes()
                .all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(&c)));
        }
    }

    #[test]
    fn cgroup_parents_are_plain_relative_paths() {
        for ok in ["pycell", "runs", "system.slice/pycelld.service/runs"] {
            assert!(is_plain_relative_path(ok), "{ok}");
        }
        for bad in [
            "", "/runs", "runs/", "a//b", "..", "a/../b", "./a", "a b", "a/b\n",
        ] {
            assert!(!is_plain_relative_path(bad), "{bad:?}");
        }
    }
}
