//! The structured outcome of one sandbox run, as the jailer reports it.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::codes::{FailureCode, Layer};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum RunStatus {
    /// The program exited with code 0.
    Ok,
    /// The program exited non-zero (e.g. an uncaught exception: see stderr) or died of a signal it did not get from pycell.
    Error,
    /// The wall-clock limit expired; the whole sandbox was killed.
    Timeout,
    /// The memory limit was reached; the kernel killed the program.
    Oom,
    /// Killed on request (the run was cancelled), by the CPU-time limit, or
    /// with the zygote it was forked from (`error.code` says which).
    Killed,
    /// The sandbox could not be built, so the code never ran; `error` says why.
    Refused,
}

impl RunStatus {
    /// Every status, in declaration order.
    pub const ALL: [RunStatus; 6] = [
        RunStatus::Ok,
        RunStatus::Error,
        RunStatus::Timeout,
        RunStatus::Oom,
        RunStatus::Killed,
        RunStatus::Refused,
    ];

    /// The status a wire name (`ok`, `timeout`, ...) names, if any.
    pub fn from_wire(name: &str) -> Option<RunStatus> {
        RunStatus::ALL.into_iter().find(|s| s.as_str() == name)
    }

    /// The status as it appears on the wire (`ok`, `timeout`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            RunStatus::Ok => "ok",
            RunStatus::Error => "error",
            RunStatus::Timeout => "timeout",
            RunStatus::Oom => "oom",
            RunStatus::Killed => "killed",
            RunStatus::Refused => "refused",
        }
    }
}

/// A file a run (or a session's cell) created or changed in /workspace.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ChangedFile {
    pub path: String,
    pub size: u64,
    /// Its contents' sha256, in hex; absent when it was not read (the
    /// run's files were larger together than what is hashed).
    pub sha256: Option<String>,
    /// True if the file is new.
    pub created: bool,
}

/// An image for the caller: a figure a run or cell left open, or a PNG or
/// JPEG file it wrote, as the runner made it in the jail (untrusted: only
/// its shape is checked).
/// What a writable grant held when its jail ended that a grant may not
/// leave on the host, and what the jailer did about it (see the jailer's
/// `grant_sweep`): `path` is the host path (a grant shows at the same
/// path in the jail).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct GrantCleanup {
    pub path: String,
    /// What was done, e.g. "removed (a FIFO)" or "mode 0777 -> 0775 (writable by others)".
    pub action: String,
}

impl GrantCleanup {
    /// The cleanup as one line: `PATH: ACTION`.
    pub fn line(&self) -> String {
        match self.path.is_empty() {
            true => self.action.clone(),
            false => format!("{}: {}", self.path, self.action),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Image {
    /// Where the full-size image is in /workspace.
    pub path: String,
    /// PNG, base64, scaled to at most the policy's `[images] max_edge`.
    pub png: String,
    /// Its size as sent, in pixels.
    pub width: u32,
    pub height: u32,
}

/// What a display is of.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum DisplayKind {
    /// A `display()` call.
    Display,
    /// A session cell's last value, in a richer form than its text.
    Value,
}

/// One thing a run or cell showed: its MIME parts, as a notebook has
/// them, each text part within the policy's `[output] part_chars`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Display {
    pub kind: DisplayKind,
    /// `text/plain`, always there.
    pub text: String,
    /// `text/markdown` (pandas objects get a table of their first and last rows).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub markdown: Option<String>,
    /// `text/html`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub html: Option<String>,
    /// `application/json`, as JSON text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub json: Option<String>,
    /// `image/svg+xml`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub svg: Option<String>,
    /// `image/png`, base64.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub png: Option<String>,
    /// Whether a text part was cut (its head and tail kept).
    #[serde(default)]
    pub truncated: bool,
}

/// What a run's runner sends back when its code is done: the images it
/// made and what it showed, and how many of each did not fit the result.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunMedia {
    #[serde(default)]
    pub images: Vec<Image>,
    #[serde(default)]
    pub images_omitted: u32,
    #[serde(default)]
    pub displays: Vec<Display>,
    #[serde(default)]
    pub displays_omitted: u32,
}

/// Why a session's jail ended, when its jailer ended it (or its launcher
/// closed it); other ends (memory, a crash) are the report's status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum SessionEnd {
    /// Its launcher ended it (closed its request stream).
    Closed,
    /// No request came for its idle timeout.
    Idle,
    /// It reached its maximum lifetime.
    Lifetime,
    /// A cell overran its wall timeout and did not stop when interrupted.
    CellTimeout,
    /// Its launcher or its runner broke the session's protocol.
    Protocol,
}

impl SessionEnd {
    pub fn as_str(self) -> &'static str {
        match self {
            SessionEnd::Closed => "closed",
            SessionEnd::Idle => "idle",
            SessionEnd::Lifetime => "lifetime",
            SessionEnd::CellTimeout => "cell_timeout",
            SessionEnd::Protocol => "protocol",
        }
    }
}

/// Why a run was refused, or ended other than by itself.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JailFailure {
    /// Stable machine-readable code, e.g. `landlock_unavailable`.
    pub code: FailureCode,
    /// The layer or step concerned, e.g. `landlock`, `mounts`, `cgroup`.
    pub layer: Layer,
    pub message: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hint: Option<String>,
}

impl JailFailure {
    pub fn new(code: FailureCode, layer: Layer, message: impl Into<String>) -> Self {
        JailFailure {
            code,
            layer,
            message: message.into(),
            hint: None,
        }
    }

    /// The same failure with what the caller can do about it.
    pub fn with_hint(mut self, hint: impl Into<String>) -> Self {
        self.hint = Some(hint.into());
        self
    }
}

/// How completely Landlock restricted the run (a run it could not restrict
/// at all is refused, so there is no `not_enforced`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum LandlockStatus {
    /// Every access right the policy restricts is restricted.
    FullyEnforced,
    /// The kernel's ABI lacks some rights (at or above the policy's `min_abi`).
    PartiallyEnforced,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LandlockReport {
    pub abi: u8,
    pub status: LandlockStatus,
    /// With egress, on kernels with Landlock's network rules (ABI 4 and
    /// up): the one TCP port the sandbox may connect to, the proxy's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tcp_connect_only_to: Option<u16>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SeccompReport {
    pub profile: String,
    pub instructions: usize,
    /// Calls the profile allows that this kernel would let the jail misuse,
    /// refused on top of it (docs/seccomp.md): `memfd_create` where memfds
    /// cannot be sealed non-executable, the xattr writes where the kernel
    /// lets the jail set `security.*` attributes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub refused_on_this_kernel: Vec<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum CgroupVersion {
    V1,
    V2,
}

impl CgroupVersion {
    pub fn as_str(self) -> &'static str {
        match self {
            CgroupVersion::V1 => "v1",
            CgroupVersion::V2 => "v2",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CgroupReport {
    pub version: CgroupVersion,
    pub name: String,
}

/// Which isolation layers were enforced for the run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Layers {
    pub namespaces: Vec<String>,
    pub sandbox_uid: u32,
    pub landlock: LandlockReport,
    pub seccomp: SeccompReport,
    pub cgroup: CgroupReport,
    pub no_new_privs: bool,
    pub capabilities: String,
}

/// The end of a stream that went over its cap: after the part kept
/// (`stdout`, `stderr`), `skipped_bytes` were read and dropped, then came
/// `tail`, the stream's last bytes (at most 16 KiB, lossy UTF-8).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct StreamTail {
    pub skipped_bytes: u64,
    pub tail: String,
    /// A session cell: the file in its workspace that has every byte
    /// past the part kept (the skipped bytes and the tail), if it could
    /// be made.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rest_file: Option<String>,
    /// The bytes written to `rest_file` (fewer than came past the part
    /// kept past a quarter of the disk budget, or if it ran out).
    #[serde(default, skip_serializing_if = "is_zero_u64")]
    pub rest_file_bytes: u64,
}

fn is_zero_u64(n: &u64) -> bool {
    *n == 0
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct JailReport {
    pub status: RunStatus,
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub stdout_truncated: bool,
    pub stderr_truncated: bool,
    /// The ends of streams that went over the cap.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stdout_tail: Option<StreamTail>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stderr_tail: Option<StreamTail>,
    pub wall_ms: f64,
    pub cpu_ms: f64,
    pub peak_memory_bytes: u64,
    /// Bytes stored in /workspace, /tmp and /dev/shm together at the end.
    #[serde(default)]
    pub disk_used_bytes: u64,
    /// A warm jail's run: how long the jail had waited for it, ready.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub warm_waited_ms: Option<f64>,
    /// A session's jail: why it ended, if its jailer (or launcher) ended it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_end: Option<SessionEnd>,
    /// The files the run created or changed in /workspace (a run's
    /// inputs, as given, are not listed).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub files: Vec<ChangedFile>,
    /// More files changed than are listed.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub files_truncated: bool,
    /// What the jailer undid in the writable grants once the jail ended.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub grant_cleanups: Vec<GrantCleanup>,
    pub layers: Option<Layers>,
    pub error: Option<JailFailure>,
    /// The jailer's and the jail's steps, when the spec asked for them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub timings: Vec<crate::timings::Mark>,
    /// What the kernel counted of the run's limits refusing it.
    #[serde(default, skip_serializing_if = "LimitEvents::is_none")]
    pub limit_events: LimitEvents,
    /// The calls the seccomp filter refused (when the kernel could tell).
    #[serde(default, skip_serializing_if = "SeccompRefused::is_none")]
    pub seccomp_refused: SeccompRefused,
}

/// The calls the jail's seccomp filter refused with `EPERM` (pycell's
/// fixed profile), by syscall, as the kernel handed each to the jailer.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SeccompRefused {
    /// By syscall name (or `syscall N`), sorted by name.
    pub calls: Vec<RefusedCall>,
    /// The jailer's listener broke: later refusals were not counted (and
    /// failed with `ENOSYS` instead of `EPERM`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub uncounted: bool,
}

impl SeccompRefused {
    pub fn is_none(&self) -> bool {
        self.calls.is_empty() && !self.uncounted
    }
}

/// One refused system call, and how many times it was refused.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RefusedCall {
    pub syscall: String,
    pub count: u64,
}

/// What the kernel counted of a jail's limits refusing it (the run's, or
/// one cell's: the counts since it began): facts a result's `refusals`
/// are explained from, on the host.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LimitEvents {
    /// Processes the memory cgroup's OOM killer killed (`memory.events`'s
    /// `oom_kill` on v2, `memory.oom_control`'s on v1).
    #[serde(default)]
    pub oom_kills: u64,
    /// New processes or threads the pids limit refused (`pids.events`'s `max`).
    #[serde(default)]
    pub pids_refused: u64,
    /// The disk budget (the writable tmpfs) was full when the run or cell ended:
    /// less than one block, or no inode, was left.
    #[serde(default)]
    pub disk_full: bool,
}

impl LimitEvents {
    pub fn is_none(&self) -> bool {
        *self == LimitEvents::default()
    }

    /// The counts since `before` (the same jail's, read earlier).
    pub fn since(self, before: LimitEvents) -> LimitEvents {
        LimitEvents {
            oom_kills: self.oom_kills.saturating_sub(before.oom_kills),
            pids_refused: self.pids_refused.saturating_sub(before.pids_refused),
            disk_full: self.disk_full,
        }
    }
}

impl JailReport {
    /// A run refused before any code ran.
    pub fn refused(failure: JailFailure) -> JailReport {
        JailReport {
            status: RunStatus::Refused,
            exit_code: None,
            signal: None,
            stdout_truncated: false,
            stderr_truncated: false,
            stdout_tail: None,
            stderr_tail: None,
            wall_ms: 0.0,
            cpu_ms: 0.0,
            peak_memory_bytes: 0,
            disk_used_bytes: 0,
            warm_waited_ms: None,
            session_end: None,
            files: Vec::new(),
            files_truncated: false,
            grant_cleanups: Vec::new(),
            layers: None,
            error: Some(failure),
            timings: Vec::new(),
            limit_events: LimitEvents::default(),
            seccomp_refused: SeccompRefused::default(),
        }
    }

    /// The conventional process exit code for this outcome (see [`exit_code_for`]).
    pub fn process_exit_code(&self) -> i32 {
        exit_code_for(self.status, self.exit_code, self.signal)
    }
}

/// The process exit code that stands for a run's outcome: the script's own
/// code, 128+signal, 124 for a timeout, 137 for OOM, 125 when refused.
pub fn exit_code_for(status: RunStatus, exit_code: Option<i32>, signal: Option<i32>) -> i32 {
    match status {
        RunStatus::Timeout => 124,
        RunStatus::Oom => 137,
        RunStatus::Refused => 125,
        _ => match (exit_code, signal) {
            (Some(c), _) => c,
            (None, Some(s)) => 128 + s,
            (None, None) => 125,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_status_reads_back_from_the_name_serde_writes() {
        for status in RunStatus::ALL {
            let json = serde_json::to_string(&status).unwrap();
            assert_eq!(json, format!("\"{}\"", status.as_str()));
            assert_eq!(RunStatus::from_wire(status.as_str()), Some(status));
        }
        assert_eq!(RunStatus::from_wire("OK"), None);
    }
}
