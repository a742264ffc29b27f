//! Sessions on the wire (protocol version 4): what a client asks of a
//! session, and what pycelld answers. A session outlives the connection
//! that started it: any connection of the same uid may name its handle.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use pycell_runner::session::RunnerReply;
use pycell_wire::events::ReplyMeasure;
use pycell_wire::report::{ChangedFile, Display, Image};

use crate::limits::LimitOverrides;
use crate::result::{EnvReport, RunLimits};

/// `session_start`: the session's policy, limits and dependencies (fixed
/// for its life).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SessionStartRequest {
    /// Policy name (default `default`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy: Option<String>,
    /// The session's limits (memory, pids, disk for the whole session;
    /// `timeout_s` and `max_output_bytes` each cell's default).
    #[serde(default)]
    pub limits: LimitOverrides,
    /// Packages the session has (PEP 508).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub dependencies: Vec<String>,
    /// Code mode: the MCP tools the client offers the session's cells.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tools: Option<crate::tools::ToolCatalog>,
    /// Start from this snapshot of the caller's (`session_snapshot`): its
    /// session's policy, limits and dependencies, then its state loaded.
    /// Nothing else may be given with it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from_snapshot: Option<String>,
}

impl SessionStartRequest {
    pub fn policy_name(&self) -> &str {
        self.policy.as_deref().unwrap_or("default")
    }
}

/// What a `session` message asks of a session.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum SessionCall {
    /// Run `code` as the session's next cell.
    Cell { code: String },
    /// Write a file into /workspace (missing directories are created).
    Write { path: String, data_base64: String },
    /// Read a file of /workspace.
    Read { path: String },
    /// List a directory of /workspace (`""`: /workspace itself).
    List { path: String },
    /// Make a directory of /workspace, and those above it.
    MakeDir { path: String },
    /// Remove a file, link or directory tree of /workspace.
    Remove { path: String },
    /// Run a shell command (`/bin/sh -c`) in /workspace, in the session's
    /// jail; its output is the call's, its exit status the answer's.
    Command { command: String },
}

/// A started session, as `session_started` reports it (and MCP's
/// `session_start`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SessionInfo {
    /// The handle: name it in later calls (MCP: pass it as `session` to run_python, write_file, read_file, list_files and session_end).
    pub session: String,
    /// The session jail's run id (in the audit log).
    pub run_id: String,
    pub policy: String,
    /// Host uid the session's code runs as (unique to it, no account has it).
    pub sandbox_uid: u32,
    /// Each cell's limits (wall_timeout_s is a cell's default timeout); memory, processes and disk hold for the whole session.
    pub limits: RunLimits,
    /// A session with no call for this long is ended.
    pub idle_timeout_s: f64,
    /// The session is ended this long after it started.
    pub lifetime_s: f64,
    /// The largest file moved in or out at once, in bytes.
    pub max_file_bytes: u64,
    /// The session's packages (when it has dependencies).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub env: Option<EnvReport>,
    /// A session started from a snapshot: which, and what it loaded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restored: Option<Restored>,
}

/// What a session started from a snapshot loaded.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Restored {
    pub snapshot: String,
    /// The names of `__main__` it set.
    pub names: Vec<String>,
    /// The files of /workspace it wrote.
    pub files: u64,
}

/// A snapshot, as `session_snapshotted` reports it (and MCP's
/// `session_snapshot`): kept in the server's store under its owner, until
/// it expires or a newer one of the same owner needs its room.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SnapshotInfo {
    /// Its id: pass it as `from_snapshot` to session_start.
    pub snapshot: String,
    /// The session it was taken of, which goes on unchanged.
    pub session: String,
    pub policy: String,
    /// The state kept, in bytes.
    pub size_bytes: u64,
    /// When it was taken and when it expires (seconds since the epoch).
    pub created_at: u64,
    pub expires_at: u64,
    /// The names of `__main__` it keeps.
    pub names: Vec<String>,
    /// Names not kept, with why (an open file, a socket, a lock...).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub dropped: BTreeMap<String, String>,
    /// Workspace paths not kept, with why.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub skipped: BTreeMap<String, String>,
    /// Random generators that a restore reseeds.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reseeded: Vec<String>,
    /// Threads that ran besides the main one: not kept.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub threads_not_carried: Vec<String>,
    /// Older snapshots of the same owner removed to make room (the store
    /// keeps a number and a size per owner).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub evicted: Vec<String>,
    /// How long taking it took, in milliseconds.
    pub took_ms: f64,
}

/// A session call's answer: the runner's reply (a cell's value, exception,
/// files and images; a file's bytes; a listing; or why it was refused),
/// the output the call printed (capped), and what the jailer measured.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SessionAnswer {
    /// The session jail's run id, and its policy.
    pub run_id: String,
    pub policy: String,
    /// The call's wall timeout, in seconds.
    pub timeout_s: f64,
    pub reply: SessionReply,
    pub stdout: String,
    pub stderr: String,
    pub measure: ReplyMeasure,
    /// A cell: what the sandbox refused it, layer by layer (docs/refusals.md).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub refusals: Vec<crate::refusals::Refusal>,
    /// A cell: how it ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub termination: Option<crate::refusals::Termination>,
    /// The session was paused (idle) and this call resumed it: what a
    /// snapshot does not keep is gone (docs/sessions.md).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub resumed: bool,
}

impl SessionAnswer {
    /// Explain a cell's answer: what its limits refused it (from what the
    /// jailer measured), and how it ended. `max_output` is the cell's cap
    /// on each stream. Other answers (file operations) have neither.
    pub fn explained(mut self, max_output: u64) -> SessionAnswer {
        if self.reply.cell.is_none() {
            return self;
        }
        let m = &self.measure;
        self.refusals = crate::refusals::of_limits(&crate::refusals::LimitFacts {
            events: m.limit_events,
            timed_out: m.interrupted,
            wall_timeout_s: Some(self.timeout_s),
            truncated: [m.stdout_truncated, m.stderr_truncated],
            max_output: Some(max_output),
            cell: true,
            seccomp: Some(&m.seccomp_refused),
            ..Default::default()
        });
        let raised = self.reply.error.as_ref().map(|e| e.kind.as_str());
        let end = crate::refusals::cell_termination(m.interrupted, raised, self.timeout_s);
        self.termination = Some(end);
        self
    }
}

/// What the session's runner answered a call: every field any call's
/// answer may have. The protocol's own type: the runner's reply becomes it
/// field by field ([`From<RunnerReply>`]), so a change in the runner
/// cannot change what clients decode without a change here.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SessionReply {
    /// The request could not be served as asked (a path outside the
    /// workspace, a file too big): the reason.
    #[serde(default)]
    pub refused: Option<String>,
    /// A cell: its number in the session.
    #[serde(default)]
    pub cell: Option<u64>,
    /// A cell: its last expression's value as text (its repr; a pandas
    /// object's or numpy array's bounded rendering; a long container's
    /// summary and the head and tail of its repr).
    #[serde(default)]
    pub value: Option<String>,
    #[serde(default)]
    pub value_truncated: bool,
    /// A cell whose value was cut: the file in the session's workspace
    /// that has it whole (`/workspace/outputs/cell-N-value.json` for a
    /// dict or list JSON can write, else `.txt` with its text).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value_file: Option<String>,
    /// A cell: the exception it ended with.
    #[serde(default)]
    pub error: Option<CellError>,
    /// A cell: the files it changed in the workspace.
    #[serde(default)]
    pub files: Vec<ChangedFile>,
    #[serde(default)]
    pub files_truncated: bool,
    /// A cell: the plots and images it made.
    #[serde(default)]
    pub images: Vec<Image>,
    #[serde(default)]
    pub images_omitted: u32,
    /// A cell: what it showed with `display()`, then its value if that has
    /// a richer form than its text (a markdown table, HTML, an image).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub displays: Vec<Display>,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub displays_omitted: u32,
    /// A file operation: the path it resolved to, and the file's size.
    #[serde(default)]
    pub path: Option<String>,
    #[serde(default)]
    pub size: Option<u64>,
    /// A read: the file's bytes in base64.
    #[serde(default)]
    pub data: Option<String>,
    /// A listing.
    #[serde(default)]
    pub entries: Vec<DirEntry>,
    #[serde(default)]
    pub truncated: bool,
    /// A make_dir: whether the directory was made (false: it was there).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created: Option<bool>,
    /// A command: its exit status (negative: the signal that ended it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    /// A fork's state requests (never a client's call): what the runner
    /// said its state carried. Not on the wire.
    #[serde(skip)]
    pub state: Option<pycell_runner::session::StateReport>,
}

/// Where the runner keeps cell `cell`'s value whole, if `kind` (what the
/// runner said it wrote, from the jail: untrusted) is one it writes.
pub fn value_file(cell: u64, kind: &str) -> Option<String> {
    matches!(kind, "json" | "txt").then(|| format!("/workspace/outputs/cell-{cell}-value.{kind}"))
}

/// The exception a cell ended with.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CellError {
    /// Its class, `ZeroDivisionError` say.
    #[serde(rename = "type")]
    pub kind: String,
    pub message: String,
    /// As Python prints it, without the runner's frames.
    pub traceback: String,
}

/// One entry of a listing.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DirEntry {
    pub name: String,
    /// `file`, `directory`, `symlink` or `other`.
    pub kind: String,
    pub size: u64,
    /// Seconds since the epoch.
    pub mtime: f64,
}

impl From<RunnerReply> for SessionReply {
    fn from(r: RunnerReply) -> SessionReply {
        // Every field named: a new one in the runner fails to build here.
        let RunnerReply {
            refused,
            cell,
            value,
            value_truncated,
            value_saved,
            error,
            files,
            files_truncated,
            images,
            images_omitted,
            displays,
            displays_omitted,
            path,
            size,
            data,
            entries,
            truncated,
            created,
            exit_code,
            state,
        } = r;
        SessionReply {
            refused,
            value_file: cell.and_then(|n| value_file(n, value_saved.as_deref()?)),
            cell,
            value,
            value_truncated,
            error: error.map(|e| {
                let pycell_runner::session::CellError {
                    kind,
                    message,
                    traceback,
                } = e;
                CellError {
                    kind,
                    message,
                    traceback,
                }
            }),
            files,
            files_truncated,
            images,
            images_omitted,
            displays,
            displays_omitted,
            path,
            size,
            data,
            entries: entries.into_iter().map(DirEntry::from).collect(),
            truncated,
            created,
            exit_code,
            state,
        }
    }
}

impl From<pycell_runner::session::DirEntry> for DirEntry {
    fn from(e: pycell_runner::session::DirEntry) -> DirEntry {
        let pycell_runner::session::DirEntry {
            name,
            kind,
            size,
            mtime,
        } = e;
        DirEntry {
            name,
            kind,
            size,
            mtime,
        }
    }
}

/// A session that ended, as `session_ended` reports it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SessionEndInfo {
    pub session: String,
    /// `ended` when this call ended it; else why it had ended.
    pub reason: String,
    pub message: String,
    /// The session's peak memory, in bytes.
    pub peak_memory_bytes: u64,
}

/// A fork, as `session_forked` reports it (and MCP's `session_fork`): the
/// new session, and what its state carried from its source and left.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SessionForkInfo {
    /// The new session: its handle, jail, uid and limits are its own.
    pub session: SessionInfo,
    /// The session it is a copy of, which goes on unchanged.
    pub forked_from: String,
    /// The names of `__main__` it has, copies of the source's (modules imported again by name).
    pub names: Vec<String>,
    /// The files of /workspace copied.
    pub files: u64,
    /// Names not carried, with why (an open file, a socket, a lock, a generator...).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub dropped: BTreeMap<String, String>,
    /// Workspace paths not carried, with why (symlinks and other non-regular files).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub skipped: BTreeMap<String, String>,
    /// Random generators carried with fresh seeds (the fork never draws what its source draws).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reseeded: Vec<String>,
    /// Threads that ran in the source besides the main one: not carried (a fork has only its main thread).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub threads_not_carried: Vec<String>,
    /// The size of the state moved, in bytes.
    pub state_bytes: u64,
    /// How long the fork took, in milliseconds (the new jail's start included).
    pub took_ms: f64,
}

/// One session of `sessions`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SessionSummary {
    pub session: String,
    pub policy: String,
    /// Seconds since it started.
    pub age_s: f64,
    /// Seconds since its last call.
    pub idle_s: f64,
    /// Seconds left before the idle timeout ends it (or pauses it).
    pub expires_in_s: f64,
    /// Paused (idle, under a policy that pauses sessions): its next call
    /// resumes it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub paused: bool,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_host_names_a_kept_value_only_for_the_kinds_the_runner_writes() {
        assert_eq!(
            value_file(3, "json").as_deref(),
            Some("/workspace/outputs/cell-3-value.json")
        );
        assert_eq!(
            value_file(4, "txt").as_deref(),
            Some("/workspace/outputs/cell-4-value.txt")
        );
        for kind in ["", "../../etc/passwd", "json/../x", "png"] {
            assert_eq!(value_file(1, kind), None, "{kind:?}");
        }
        let reply = |cell: Option<u64>, saved: &str| RunnerReply {
            cell,
            value_saved: Some(saved.into()),
            ..RunnerReply::default()
        };
        let kept = SessionReply::from(reply(Some(2), "json")).value_file;
        assert_eq!(
            kept.as_deref(),
            Some("/workspace/outputs/cell-2-value.json")
        );
        assert_eq!(SessionReply::from(reply(None, "json")).value_file, None);
        assert_eq!(SessionReply::from(reply(Some(2), "/etc")).value_file, None);
    }
}
