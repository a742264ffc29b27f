//! The session tools of `pycell mcp`: `session_start`, `write_file`,
//! `read_file`, `list_files`, `session_end`, `session_list` (and
//! `run_python`'s `session` argument, handled with it): their arguments,
//! descriptions, output schemas and handlers.

use std::time::Duration;

use base64::Engine;
use rmcp::handler::server::common::{schema_for_empty_input, schema_for_input, schema_for_output};
use rmcp::model::{
    CallToolResult, ContentBlock, JsonObject, ResourceContents, Tool, ToolAnnotations,
};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

use pycell_protocol::refusals::{EndReason, Termination};
use pycell_protocol::session::{
    SessionCall, SessionEndInfo, SessionForkInfo, SessionInfo, SessionStartRequest, SessionSummary,
    SnapshotInfo,
};

use super::cell_output::{display_info, image_info, CellException, CellInfo, FileChange};
use super::output::{human_bytes, structured, DetachedInfo, ErrorInfo, RunPythonOutput, Status};
use super::tools::{portable, ArgumentError};
use super::PycellServer;
use pycell_engine::service::detached::{CellAnswer, CellTurn};
use pycell_engine::service::SessionFailure;
use pycell_launch::session::Answer;
use pycell_wire::codes::{FailureCode, Layer};
use pycell_wire::report::RunStatus;

pub const SESSION_START: &str = "session_start";
pub const WRITE_FILE: &str = "write_file";
pub const READ_FILE: &str = "read_file";
pub const LIST_FILES: &str = "list_files";
pub const SESSION_END: &str = "session_end";
pub const SESSION_LIST: &str = "session_list";
pub const SESSION_FORK: &str = "session_fork";
pub const SESSION_SNAPSHOT: &str = "session_snapshot";

/// Arguments of `session_start`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SessionStartArgs {
    /// Policy the session runs under (see sandbox_info). Default: the server's default policy.
    #[serde(default)]
    #[schemars(with = "String", transform = super::tools::no_default)]
    pub policy: Option<String>,
    /// Packages the session has, as pip requirement strings, e.g. ["pandas>=2.2"]. Fixed for the session's life. Default: none.
    #[serde(default)]
    #[schemars(with = "Vec<String>", transform = super::tools::no_default)]
    pub dependencies: Option<Vec<String>>,
    /// A snapshot id from session_snapshot: the session starts with that snapshot's policy and packages, then its variables, imports and files. Give no policy or dependencies with it.
    #[serde(default)]
    #[schemars(with = "String", transform = super::tools::no_default)]
    pub from_snapshot: Option<String>,
}

/// Arguments of `write_file`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WriteFileArgs {
    /// The session's handle (from session_start).
    pub session: String,
    /// Where the file goes: a path relative to /workspace (e.g. "data/input.csv"), or an absolute one under /workspace. Missing directories are created.
    pub path: String,
    /// The file's text (UTF-8). Give this or content_base64.
    #[serde(default)]
    #[schemars(with = "String", transform = super::tools::no_default)]
    pub content: Option<String>,
    /// The file's bytes in base64, for binary files. Give this or content.
    #[serde(default)]
    #[schemars(with = "String", transform = super::tools::no_default)]
    pub content_base64: Option<String>,
}

/// Arguments of `read_file`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ReadFileArgs {
    /// The session's handle (from session_start).
    pub session: String,
    /// The file: a path relative to /workspace, or an absolute one under it.
    pub path: String,
}

/// Arguments of `list_files`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListFilesArgs {
    /// The session's handle (from session_start).
    pub session: String,
    /// The directory, relative to /workspace. Default: /workspace itself.
    #[serde(default)]
    #[schemars(with = "String", transform = super::tools::no_default)]
    pub path: Option<String>,
}

/// Arguments of `session_end`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SessionEndArgs {
    /// The session's handle (from session_start).
    pub session: String,
}

/// What `session_start` returns: the protocol's description of a session.
type SessionStartOutput = SessionInfo;

/// What `write_file` returns.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct WriteFileOutput {
    pub session: String,
    /// The file's absolute path in the sandbox.
    pub path: String,
    pub size: u64,
}

/// What `read_file` returns (the bytes also come as content: text, an image, or an embedded resource).
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct ReadFileOutput {
    pub session: String,
    pub path: String,
    pub size: u64,
    /// `image/png`, `image/jpeg`, `text/plain` or `application/octet-stream`.
    pub mime_type: String,
    /// The file's text, when it is UTF-8 text.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    /// The file's bytes in base64, when it is not text.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content_base64: Option<String>,
}

/// One entry of `list_files`.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct FileEntry {
    pub name: String,
    /// `file`, `directory`, `symlink` or `other`.
    pub kind: String,
    pub size: u64,
    /// Last modification, seconds since the epoch.
    pub mtime: f64,
}

/// What `list_files` returns.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct ListFilesOutput {
    pub session: String,
    pub path: String,
    pub entries: Vec<FileEntry>,
    /// True if the directory has more entries than are listed.
    pub truncated: bool,
}

/// What `session_end` returns.
type SessionEndOutput = SessionEndInfo;

/// Arguments of `session_fork`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SessionForkArgs {
    /// The handle of the session to copy (from session_start or session_fork).
    pub session: String,
}

/// What `session_list` returns.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct SessionListOutput {
    pub sessions: Vec<SessionSummary>,
}

fn parse<T: serde::de::DeserializeOwned>(
    tool: &str,
    args: Option<JsonObject>,
    example: &str,
) -> Result<T, ArgumentError> {
    serde_json::from_value(serde_json::Value::Object(args.unwrap_or_default()))
        .map_err(|e| ArgumentError(format!("{tool}: invalid arguments: {e}; e.g. {example}")))
}

/// A tool call that failed with a stable code: a result with isError, the
/// code and what to do in its text.
pub fn failure(tool: &str, f: &SessionFailure) -> CallToolResult {
    CallToolResult::error(vec![ContentBlock::text(format!(
        "{tool} failed ({}): {}",
        f.code, f.message
    ))])
}

impl PycellServer {
    pub(super) async fn session_start(&self, args: Option<JsonObject>) -> CallToolResult {
        let a: SessionStartArgs = match parse(SESSION_START, args, r#"{"policy": "data-science"}"#)
        {
            Ok(a) => a,
            Err(ArgumentError(m)) => return CallToolResult::error(vec![ContentBlock::text(m)]),
        };
        if let Err(m) = self.may_use(a.policy.as_deref()) {
            return CallToolResult::error(vec![ContentBlock::text(m.to_string())]);
        }
        let req = match a.from_snapshot {
            Some(id) => SessionStartRequest {
                policy: a.policy,
                dependencies: a.dependencies.unwrap_or_default(),
                from_snapshot: Some(id),
                ..SessionStartRequest::default()
            },
            None => SessionStartRequest {
                policy: Some(a.policy.unwrap_or_else(|| self.default_policy.clone())),
                dependencies: a.dependencies.unwrap_or_default(),
                ..SessionStartRequest::default()
            },
        };
        match self.sandboxes.start_session(req).await {
            Ok(out) if out.restored.is_some() => {
                let r = out.restored.as_ref().expect("restored");
                let text = format!(
                    "session {} started from snapshot {} (policy {}): {} names and {} files restored; pass it as `session` to run_python.",
                    out.session, r.snapshot, out.policy, r.names.len(), r.files
                );
                structured(&out, text, vec![])
            }
            Ok(out) => {
                let text = format!(
                    "session {} started (policy {}): pass it as `session` to run_python, write_file, read_file, list_files and session_end. Variables, imports and /workspace files persist between its cells. It ends after {} s without a call, or {} s after it started.",
                    out.session, out.policy, out.idle_timeout_s, out.lifetime_s
                );
                structured(&out, text, vec![])
            }
            Err(f) => failure(SESSION_START, &f),
        }
    }

    /// `run_python` with `session`: the code runs as the session's next
    /// cell, waited for at most `wait`; past it the cell is detached, and
    /// the next call collects it (see `pycell_engine::service::detached`).
    pub(super) async fn run_cell(
        &self,
        asked: CellAsked<'_>,
        cancel: CancellationToken,
    ) -> CallToolResult {
        let CellAsked {
            session,
            code,
            timeout,
            wait,
            watch,
        } = asked;
        let timeout_s = timeout.map(|t| t.as_secs_f64());
        let resend = match code.trim().is_empty() {
            true => "",
            false => " The code of this call was NOT run: send it again.",
        };
        let turn = self
            .sandboxes
            .cell_within(session, code, timeout_s, cancel, wait, watch)
            .await;
        match turn {
            CellTurn::Answered(answer) => cell_answer(session, answer, None),
            CellTurn::Collected { answer, ran_for } => {
                let note = format!(
                    "This is the result of the cell detached earlier (it ran {:.0} s).{resend}",
                    ran_for.as_secs_f64()
                );
                let detached = DetachedInfo {
                    running_for_s: ran_for.as_secs_f64(),
                    code_run: false,
                    note,
                };
                cell_answer(session, answer, Some(detached))
            }
            CellTurn::Detached { running_for } => {
                let note = format!("The cell is still running after {:.0} s, detached: it goes on within the session's limits. Call run_python with session {session:?} again to get its result (the code of that call is not run while this cell is pending; empty code is fine), or session_end to stop it.", running_for.as_secs_f64());
                still_running(session, running_for, true, note)
            }
            CellTurn::StillRunning { running_for } => {
                let note = format!("The cell detached earlier is still running ({:.0} s so far).{resend} Call run_python with session {session:?} again to get its result, or session_end to stop it.", running_for.as_secs_f64());
                still_running(session, running_for, false, note)
            }
        }
    }

    /// A file operation's answer, or the failure to show.
    async fn file_call(
        &self,
        tool: &str,
        session: &str,
        call: SessionCall,
        cancel: CancellationToken,
    ) -> Result<pycell_protocol::session::SessionReply, CallToolResult> {
        match self
            .sandboxes
            .session_call(session, call, None, cancel)
            .await
        {
            Ok(answer) => match answer.reply.refused {
                Some(why) => Err(failure(tool, &refused(why))),
                None => Ok(answer.reply),
            },
            Err(f) => Err(failure(tool, &f)),
        }
    }

    pub(super) async fn write_file(
        &self,
        args: Option<JsonObject>,
        cancel: CancellationToken,
    ) -> CallToolResult {
        let a: WriteFileArgs = match parse(
            WRITE_FILE,
            args,
            r#"{"session": "s-...", "path": "data.csv", "content": "a,b\n1,2\n"}"#,
        ) {
            Ok(a) => a,
            Err(ArgumentError(m)) => return CallToolResult::error(vec![ContentBlock::text(m)]),
        };
        let bytes = match file_bytes(a.content, a.content_base64) {
            Ok(b) => b,
            Err(ArgumentError(m)) => {
                return CallToolResult::error(vec![ContentBlock::text(format!(
                    "{WRITE_FILE}: {m}"
                ))])
            }
        };
        let data_base64 = base64::engine::general_purpose::STANDARD.encode(&bytes);
        let call = SessionCall::Write {
            path: a.path,
            data_base64,
        };
        match self.file_call(WRITE_FILE, &a.session, call, cancel).await {
            Ok(reply) => {
                let out = WriteFileOutput {
                    session: a.session,
                    path: reply.path.unwrap_or_default(),
                    size: reply.size.unwrap_or(0),
                };
                let text = format!("wrote {} ({})", out.path, human_bytes(out.size));
                structured(&out, text, vec![])
            }
            Err(r) => r,
        }
    }

    pub(super) async fn read_file(
        &self,
        args: Option<JsonObject>,
        cancel: CancellationToken,
    ) -> CallToolResult {
        let a: ReadFileArgs = match parse(
            READ_FILE,
            args,
            r#"{"session": "s-...", "path": "figures/cell-2-figure-1.png"}"#,
        ) {
            Ok(a) => a,
            Err(ArgumentError(m)) => return CallToolResult::error(vec![ContentBlock::text(m)]),
        };
        let call = SessionCall::Read { path: a.path };
        match self.file_call(READ_FILE, &a.session, call, cancel).await {
            Ok(reply) => read_result(&a.session, reply),
            Err(r) => r,
        }
    }

    pub(super) async fn list_files(
        &self,
        args: Option<JsonObject>,
        cancel: CancellationToken,
    ) -> CallToolResult {
        let a: ListFilesArgs = match parse(
            LIST_FILES,
            args,
            r#"{"session": "s-...", "path": "figures"}"#,
        ) {
            Ok(a) => a,
            Err(ArgumentError(m)) => return CallToolResult::error(vec![ContentBlock::text(m)]),
        };
        let call = SessionCall::List {
            path: a.path.unwrap_or_default(),
        };
        match self.file_call(LIST_FILES, &a.session, call, cancel).await {
            Ok(r) => {
                let out = ListFilesOutput {
                    session: a.session,
                    path: r.path.unwrap_or_default(),
                    entries: r
                        .entries
                        .into_iter()
                        .map(|e| FileEntry {
                            name: e.name,
                            kind: e.kind,
                            size: e.size,
                            mtime: e.mtime,
                        })
                        .collect(),
                    truncated: r.truncated,
                };
                let text = render_listing(&out);
                structured(&out, text, vec![])
            }
            Err(r) => r,
        }
    }

    pub(super) async fn session_end(&self, args: Option<JsonObject>) -> CallToolResult {
        let a: SessionEndArgs = match parse(SESSION_END, args, r#"{"session": "s-..."}"#) {
            Ok(a) => a,
            Err(ArgumentError(m)) => return CallToolResult::error(vec![ContentBlock::text(m)]),
        };
        match self.sandboxes.end_session(&a.session).await {
            Ok(out) => {
                let text = format!("session {} ended: {}", out.session, out.message);
                structured(&out, text, vec![])
            }
            Err(f) => failure(SESSION_END, &f),
        }
    }

    pub(super) async fn session_fork(&self, args: Option<JsonObject>) -> CallToolResult {
        let a: SessionForkArgs = match parse(SESSION_FORK, args, r#"{"session": "s-..."}"#) {
            Ok(a) => a,
            Err(ArgumentError(m)) => return CallToolResult::error(vec![ContentBlock::text(m)]),
        };
        match self.sandboxes.fork_session(&a.session).await {
            Ok(out) => {
                let text = fork_text(&out);
                structured(&out, text, vec![])
            }
            Err(f) => failure(SESSION_FORK, &f),
        }
    }

    pub(super) async fn session_snapshot(&self, args: Option<JsonObject>) -> CallToolResult {
        let example = r#"{"session": "s-..."}"#;
        let a: SessionEndArgs = match parse(SESSION_SNAPSHOT, args, example) {
            Ok(a) => a,
            Err(ArgumentError(m)) => return CallToolResult::error(vec![ContentBlock::text(m)]),
        };
        match self.sandboxes.snapshot_session(&a.session).await {
            Ok(out) => {
                let mut text = format!(
                    "snapshot {} of session {} kept ({} bytes, until {} s since the epoch): pass it as `from_snapshot` to session_start to start a session with its state. The session goes on unchanged.",
                    out.snapshot, out.session, out.size_bytes, out.expires_at
                );
                if !out.dropped.is_empty() {
                    let names: Vec<&str> = out.dropped.keys().map(String::as_str).collect();
                    text.push_str(&format!(" Not kept: {}.", names.join(", ")));
                }
                structured(&out, text, vec![])
            }
            Err(f) => failure(SESSION_SNAPSHOT, &f),
        }
    }

    pub(super) async fn session_list(&self) -> CallToolResult {
        let sessions = match self.sandboxes.list_sessions().await {
            Ok(l) => l,
            Err(f) => return failure(SESSION_LIST, &f),
        };
        let mut text = format!("{} open sessions\n", sessions.len());
        for s in &sessions {
            text.push_str(&format!(
                "{} (policy {}): started {:.0} s ago, idle {:.0} s\n",
                s.session, s.policy, s.age_s, s.idle_s
            ));
        }
        structured(&SessionListOutput { sessions }, text, vec![])
    }
}

/// What an agent reads of a fork: the new handle, and what was not carried.
fn fork_text(f: &SessionForkInfo) -> String {
    let mut text = format!(
        "session {} forked from {} in {:.0} ms: {} names and {} files copied ({} bytes of state). Pass it as `session` to run_python; both sessions go on independently.",
        f.session.session, f.forked_from, f.took_ms, f.names.len(), f.files, f.state_bytes
    );
    let named = |m: &std::collections::BTreeMap<String, String>| {
        let parts: Vec<String> = m.iter().map(|(k, v)| format!("{k} ({v})")).collect();
        parts.join(", ")
    };
    if !f.dropped.is_empty() {
        text.push_str(&format!(" Not carried: {}.", named(&f.dropped)));
    }
    if !f.skipped.is_empty() {
        text.push_str(&format!(" Files not copied: {}.", named(&f.skipped)));
    }
    if !f.reseeded.is_empty() {
        text.push_str(&format!(
            " Random generators reseeded: {}.",
            f.reseeded.join(", ")
        ));
    }
    if !f.threads_not_carried.is_empty() {
        text.push_str(&format!(
            " Threads not carried (the fork has only its main thread): {}.",
            f.threads_not_carried.join(", ")
        ));
    }
    text
}

/// A file's bytes for `write_file`: `content`, or `content_base64` decoded.
fn file_bytes(text: Option<String>, b64: Option<String>) -> Result<Vec<u8>, ArgumentError> {
    match (text, b64) {
        (Some(t), None) => Ok(t.into_bytes()),
        (None, Some(b)) => base64::engine::general_purpose::STANDARD
            .decode(b.trim())
            .map_err(|e| ArgumentError(format!("`content_base64` is not base64: {e}"))),
        _ => Err(ArgumentError(
            "give exactly one of `content` (text) and `content_base64` (bytes)".into(),
        )),
    }
}

fn refused(why: String) -> SessionFailure {
    SessionFailure {
        code: FailureCode::FileRefused,
        message: why,
    }
}

/// A `run_python` call with `session`.
pub(super) struct CellAsked<'a> {
    pub session: &'a str,
    pub code: String,
    pub timeout: Option<Duration>,
    /// How long the call waits before the cell is detached.
    pub wait: Duration,
    /// Hears the cell's output as it comes (its progress).
    pub watch: Option<pycell_engine::service::OutputSink>,
}

/// A cell's answer (or failure) as `run_python`'s result.
fn cell_answer(
    session: &str,
    answer: CellAnswer,
    detached: Option<DetachedInfo>,
) -> CallToolResult {
    match answer {
        Ok(answer) => {
            let images =
                super::cell_output::media_content(&answer.reply.images, &answer.reply.displays);
            let mut out = cell_result(session, answer);
            out.detached = detached;
            out.tool_result(images)
        }
        Err(f)
            if matches!(
                f.code,
                FailureCode::SessionKilled | FailureCode::SessionGone
            ) =>
        {
            killed_cell(session, &f)
        }
        Err(f) => failure(super::tools::RUN_PYTHON, &f),
    }
}

/// A cell still running after the call's wait.
fn still_running(
    session: &str,
    running_for: Duration,
    code_run: bool,
    note: String,
) -> CallToolResult {
    let mut out = RunPythonOutput::bare(Status::Running, session);
    out.detached = Some(DetachedInfo {
        running_for_s: running_for.as_secs_f64(),
        code_run,
        note,
    });
    out.tool_result(vec![])
}

/// A cell whose session ended under it: a result that says so.
fn killed_cell(session: &str, f: &SessionFailure) -> CallToolResult {
    let status = if f.message.contains("(oom)") {
        RunStatus::Oom
    } else {
        RunStatus::Killed
    };
    let mut out = RunPythonOutput::bare(status.into(), session);
    out.error = Some(ErrorInfo {
        code: f.code,
        layer: Layer::Sessions,
        message: f.message.clone(),
        hint: Some("start a new session with session_start".into()),
    });
    out.termination = Some(session_gone(status, &f.message));
    let mut r = out.tool_result(vec![]);
    r.is_error = Some(true);
    r
}

/// `read_file`'s result: text as text, PNG and JPEG as an image, other
/// bytes as an embedded resource; the structured part says which.
fn read_result(session: &str, r: pycell_protocol::session::SessionReply) -> CallToolResult {
    let path = r.path.unwrap_or_default();
    let b64 = r.data.unwrap_or_default();
    let Ok(bytes) = base64::engine::general_purpose::STANDARD.decode(&b64) else {
        return failure(
            READ_FILE,
            &refused("the session sent back bytes that are not base64".into()),
        );
    };
    let mime = mime_of(&bytes);
    let uri = format!("file://{path}");
    let (text, content_base64, extra) = match (mime, std::str::from_utf8(&bytes)) {
        ("image/png" | "image/jpeg", _) => (
            None,
            Some(b64.clone()),
            vec![ContentBlock::image(b64, mime)],
        ),
        (_, Ok(t)) => (
            Some(t.to_string()),
            None,
            vec![ContentBlock::embedded_text(uri, t)],
        ),
        (_, Err(_)) => (
            None,
            Some(b64.clone()),
            vec![ContentBlock::resource(
                ResourceContents::BlobResourceContents {
                    uri,
                    mime_type: Some(mime.to_string()),
                    blob: b64,
                    meta: None,
                },
            )],
        ),
    };
    let mime = if text.is_some() { "text/plain" } else { mime };
    let out = ReadFileOutput {
        session: session.to_string(),
        size: bytes.len() as u64,
        path,
        mime_type: mime.to_string(),
        text,
        content_base64,
    };
    let summary = format!(
        "{} ({}, {})",
        out.path,
        human_bytes(out.size),
        out.mime_type
    );
    structured(&out, summary, extra)
}

fn mime_of(bytes: &[u8]) -> &'static str {
    if bytes.starts_with(b"\x89PNG\r\n\x1a\n") {
        "image/png"
    } else if bytes.starts_with(&[0xff, 0xd8, 0xff]) {
        "image/jpeg"
    } else {
        "application/octet-stream"
    }
}

fn render_listing(out: &ListFilesOutput) -> String {
    let mut t = format!("{} ({} entries)\n", out.path, out.entries.len());
    for e in &out.entries {
        let slash = if e.kind == "directory" { "/" } else { "" };
        t.push_str(&format!("  {}{slash}  {}\n", e.name, human_bytes(e.size)));
    }
    if out.truncated {
        t.push_str("  (more entries not listed)\n");
    }
    t
}

const SESSION_START_DESCRIPTION: &str = r#"Start a session: a sandbox whose Python interpreter stays alive between calls, like a Jupyter kernel. Pass the returned handle as `session` to run_python to run code as the session's next cell: variables, imports and files in /workspace persist from cell to cell, and a cell's last expression is shown as its value (as in a REPL). Use write_file/read_file/list_files to move files in and out, and session_end when done. Figures a cell leaves open (matplotlib) come back as images. Dependencies are fixed when the session starts. A session ends when idle for its idle timeout or at its lifetime (both in the result); later calls with its handle say session_gone. Example: {"policy": "data-science"} returns {"session": "s-3f2a...", "idle_timeout_s": 600, ...}."#;

const WRITE_FILE_DESCRIPTION: &str = r#"Write a file into a session's /workspace (text in `content`, or bytes in `content_base64`), creating missing directories; code in the session's cells then reads it (e.g. pandas.read_csv("data.csv")). Paths are relative to /workspace; paths outside it, `..` and symlinks are refused. Example: {"session": "s-3f2a...", "path": "data.csv", "content": "x,y\n1,2\n"}."#;

const READ_FILE_DESCRIPTION: &str = r#"Read a file from a session's /workspace: text comes back as text, PNG and JPEG as an image you can see, other bytes as an embedded resource (also base64 in the structured result). Use it for a figure's full-size file (run_python lists figures under cell.images and files) or for results a cell wrote. Example: {"session": "s-3f2a...", "path": "figures/cell-2-figure-1.png"}."#;

const LIST_FILES_DESCRIPTION: &str = r#"List a directory of a session's /workspace: names, kinds (file, directory, symlink, other), sizes and modification times. Example: {"session": "s-3f2a...", "path": "figures"}."#;

const SESSION_END_DESCRIPTION: &str = r#"End a session: its interpreter, files and processes are gone, and its handle is no longer valid. Example: {"session": "s-3f2a..."}."#;

const SESSION_FORK_DESCRIPTION: &str = r#"Fork a session: a new session whose variables, functions, classes, imports and /workspace files are a copy of the given session's at this moment, in a sandbox of its own (its own process, uid and limits); both go on independently, and neither sees the other's later changes. Use it to try an approach without losing the state you built. What cannot be copied is listed, not carried: open files and sockets, locks, threads other than the main one, child processes; random generators get fresh seeds. The fork counts as one of your sessions. Example: {"session": "s-3f2a..."} returns {"session": {"session": "s-9b1c...", ...}, "forked_from": "s-3f2a...", "names": ["df", "model"], ...}."#;

const SESSION_SNAPSHOT_DESCRIPTION: &str = r#"Keep a session's state (variables, functions, classes, imports and /workspace files) as a snapshot that outlives the session and server restarts; start a session from it later with session_start's `from_snapshot`. The session goes on unchanged. What cannot be kept is listed (open files, sockets, threads). Snapshots expire, and a new one replaces your oldest when your quota is full (the result lists what it evicted). Example: {"session": "s-3f2a..."} returns {"snapshot": "snap-9c41...", "size_bytes": 48213, "expires_at": 1767225600, ...}."#;

const SESSION_LIST_DESCRIPTION: &str = r#"List the open sessions of this server: handle, policy, age, time since the last call, and time left before the idle timeout ends each. Takes no arguments. Example: {} returns {"sessions": [{"session": "s-3f2a...", "policy": "default", "age_s": 42.0, ...}]}."#;

fn tool<I: JsonSchema + 'static, O: JsonSchema + 'static>(
    name: &'static str,
    title: &'static str,
    description: &'static str,
    read_only: bool,
) -> Tool {
    let input = portable(schema_for_input::<I>().expect("arguments are a struct"));
    Tool::new(name, description, input)
        .with_title(title)
        .with_raw_output_schema(portable(schema_for_output::<O>()))
        .with_annotations(
            ToolAnnotations::with_title(title)
                .read_only(read_only)
                .destructive(false)
                .idempotent(read_only)
                .open_world(false),
        )
}

/// The session tools.
pub fn session_tools() -> Vec<Tool> {
    let list = Tool::new(
        SESSION_LIST,
        SESSION_LIST_DESCRIPTION,
        schema_for_empty_input(),
    )
    .with_title("List open sessions")
    .with_raw_output_schema(portable(schema_for_output::<SessionListOutput>()))
    .with_annotations(
        ToolAnnotations::with_title("List open sessions")
            .read_only(true)
            .idempotent(true)
            .open_world(false),
    );
    vec![
        tool::<SessionStartArgs, SessionStartOutput>(
            SESSION_START,
            "Start a Python session",
            SESSION_START_DESCRIPTION,
            false,
        ),
        tool::<WriteFileArgs, WriteFileOutput>(
            WRITE_FILE,
            "Write a file into a session",
            WRITE_FILE_DESCRIPTION,
            false,
        ),
        tool::<ReadFileArgs, ReadFileOutput>(
            READ_FILE,
            "Read a file from a session",
            READ_FILE_DESCRIPTION,
            true,
        ),
        tool::<ListFilesArgs, ListFilesOutput>(
            LIST_FILES,
            "List a session's files",
            LIST_FILES_DESCRIPTION,
            true,
        ),
        tool::<SessionEndArgs, SessionEndOutput>(
            SESSION_END,
            "End a session",
            SESSION_END_DESCRIPTION,
            false,
        ),
        tool::<SessionForkArgs, SessionForkInfo>(
            SESSION_FORK,
            "Fork a session",
            SESSION_FORK_DESCRIPTION,
            false,
        ),
        tool::<SessionEndArgs, SnapshotInfo>(
            SESSION_SNAPSHOT,
            "Snapshot a session",
            SESSION_SNAPSHOT_DESCRIPTION,
            false,
        ),
        list,
    ]
}

/// A cell's answer as `run_python`'s result, and the image content to
/// send with it.
pub fn cell_result(session: &str, a: Answer) -> RunPythonOutput {
    let timeout_s = a.timeout_s;
    let m = &a.measure;
    let r = &a.reply;
    let status = match (&r.refused, m.interrupted, &r.error) {
        (Some(_), _, _) => RunStatus::Error,
        (None, true, _) => RunStatus::Timeout,
        (None, false, Some(_)) => RunStatus::Error,
        (None, false, None) => RunStatus::Ok,
    };
    let error = match (&r.refused, status) {
        (Some(why), _) => Some(ErrorInfo {
            code: FailureCode::Internal,
            layer: Layer::Sessions,
            message: why.clone(),
            hint: None,
        }),
        (None, RunStatus::Timeout) => Some(ErrorInfo {
            code: FailureCode::Timeout,
            layer: Layer::Limits,
            message: format!("the cell ran past its timeout of {timeout_s} s and was interrupted (KeyboardInterrupt); the session goes on, with everything the cell did before"),
            hint: Some("pass a larger timeout_s, or do the work in smaller cells".into()),
        }),
        _ => None,
    };
    RunPythonOutput {
        run_id: a.run_id.clone(),
        status: status.into(),
        exit_code: None,
        signal: None,
        tool_calls: None,
        stdout: a.stdout.clone(),
        stderr: a.stderr.clone(),
        stdout_truncated: m.stdout_truncated,
        stderr_truncated: m.stderr_truncated,
        stdout_tail: m.stdout_tail.clone(),
        stderr_tail: m.stderr_tail.clone(),
        duration_ms: m.wall_ms,
        cpu_ms: m.cpu_ms,
        peak_memory_bytes: m.peak_memory_bytes,
        disk_used_bytes: 0,
        warm: true,
        policy: a.policy.clone(),
        limits: None,
        layers: None,
        error,
        network: None,
        env: None,
        files: r.files.iter().map(FileChange::from).collect(),
        files_truncated: r.files_truncated,
        cell: Some(CellInfo {
            session: session.to_string(),
            number: r.cell.unwrap_or(0),
            value: r.value.clone(),
            value_truncated: r.value_truncated,
            value_file: r.value_file.clone(),
            exception: r.error.as_ref().map(|e| CellException {
                kind: e.kind.clone(),
                message: e.message.clone(),
                traceback: e.traceback.clone(),
            }),
            memory_bytes: m.memory_bytes,
            resumed: a.resumed,
        }),
        images: r.images.iter().map(image_info).collect(),
        images_omitted: r.images_omitted,
        displays: r.displays.iter().map(display_info).collect(),
        displays_omitted: r.displays_omitted,
        refusals: a.refusals.clone(),
        termination: a.termination.clone(),
        detached: None,
    }
}

/// How a cell whose session ended under it ended.
fn session_gone(status: RunStatus, why: &str) -> Termination {
    let reason = match status {
        RunStatus::Oom => EndReason::OomKill,
        _ => EndReason::SessionEnded,
    };
    Termination {
        reason,
        detail: why.to_string(),
        memory_bytes: None,
    }
}
