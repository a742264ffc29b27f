//! Messages between a client (`pycell run`, `pycell mcp`) and the daemon,
//! and the request shape embedded mode resolves too. On the socket each
//! message is one JSON object in a length-delimited frame (see
//! `docs/protocol.md`).

use base64::Engine;
use serde::{Deserialize, Serialize};

use pycell_wire::codes::FailureCode;
pub use pycell_wire::events::Stream;

/// Bumped on any incompatible change; the handshake refuses a mismatch.
pub const PROTOCOL_VERSION: u32 = 6;
/// Largest code (and largest stdin) a request may carry.
pub const MAX_CODE_BYTES: usize = 16 << 20;

pub use crate::limits::LimitOverrides;

/// One sandboxed run: what to execute and under which policy.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunRequest {
    /// Python source (UTF-8).
    pub code: String,
    /// File name the code gets in /workspace (default `main.py`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub filename: Option<String>,
    /// `sys.argv[1:]`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
    /// Bytes for the program's stdin, base64 (standard alphabet).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stdin_base64: Option<String>,
    /// Policy name (default `default`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy: Option<String>,
    #[serde(default)]
    pub limits: LimitOverrides,
    /// Packages to install for this run (PEP 508, e.g. `"pandas>=2.2"`),
    /// besides those of a PEP 723 block in `code`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub dependencies: Vec<String>,
    /// Files put into /workspace before the code runs.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub files: Vec<InputFile>,
    /// Code mode: the MCP tools the client offers the run's code
    /// (`import pycell_tools`), as its servers listed them. The calls come
    /// back to the client (`tool_call`), which answers (`tool_answer`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tools: Option<crate::tools::ToolCatalog>,
    /// A server over stdio (`pycell mcp-server`): the program's stdin and
    /// stdout are a socket whose other end comes to the client in a
    /// `stdio` message (the descriptor attached to it), instead of stdin
    /// bytes and stdout output; its stderr streams as output. Not with
    /// stdin, tools or a session.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub serve_stdio: bool,
    /// Variables for the program besides its policy's `[env]` (none of
    /// pycell's own: see [`check_variable`]).
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub env: std::collections::BTreeMap<String, String>,
    /// Egress to these hosts only: `[SCHEME://]HOST[:PORT]` rules, each
    /// one the policy's allowlist allows (pycelld); in embedded mode they
    /// open the allowlist.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allow: Vec<String>,
    /// Host paths granted to the program, each with a descriptor of it
    /// attached to this `run` message (SCM_RIGHTS, in this order), opened
    /// by the client for reading: proof it may. In the jail the client's
    /// own files there are the jail user's, other files anyone's.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub grants: Vec<PathGrant>,
}

/// A host path granted to a run (`pycell mcp-server --ro/--rw/--state`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PathGrant {
    /// Where it shows in the jail: its own canonical path.
    pub target: std::path::PathBuf,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub writable: bool,
}

/// Variables pycell sets itself, which a request may not set: the egress
/// proxy's and `PYCELL_*`.
fn reserved_variable(name: &str) -> bool {
    let upper = name.to_ascii_uppercase();
    upper.starts_with("PYCELL_")
        || ["HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY"].contains(&upper.as_str())
}

/// Why a variable may not be a request's.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BadVariable {
    #[error("{0:?} is not a variable name")]
    Name(String),
    #[error("{0}: pycell sets that variable itself")]
    Reserved(String),
    #[error("{0}: its value has a NUL byte")]
    NulInValue(String),
}

/// Whether `name=value` may be a request's variable: a C identifier, not
/// one of pycell's own, no NUL in the value.
pub fn check_variable(name: &str, value: &str) -> Result<(), BadVariable> {
    let valid = name
        .chars()
        .next()
        .is_some_and(|c| c == '_' || c.is_ascii_alphabetic())
        && name.chars().all(|c| c == '_' || c.is_ascii_alphanumeric());
    if !valid {
        return Err(BadVariable::Name(name.to_string()));
    }
    if reserved_variable(name) {
        return Err(BadVariable::Reserved(name.to_string()));
    }
    if value.contains('\0') {
        return Err(BadVariable::NulInValue(name.to_string()));
    }
    Ok(())
}

/// A file for /workspace: a plain name (no `/`), its bytes in base64.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InputFile {
    pub name: String,
    pub data_base64: String,
}

/// Most input files a run may have.
pub const MAX_INPUT_FILES: usize = 64;

impl RunRequest {
    pub fn stdin_bytes(&self) -> Result<Vec<u8>, BadBase64> {
        match &self.stdin_base64 {
            None => Ok(Vec::new()),
            Some(s) => base64::engine::general_purpose::STANDARD
                .decode(s)
                .map_err(|e| BadBase64::Field("stdin_base64", e)),
        }
    }

    pub fn set_stdin(&mut self, bytes: &[u8]) {
        self.stdin_base64 = if bytes.is_empty() {
            None
        } else {
            Some(base64::engine::general_purpose::STANDARD.encode(bytes))
        };
    }

    pub fn policy_name(&self) -> &str {
        self.policy.as_deref().unwrap_or("default")
    }
}

/// Largest frame either side accepts (a maximal request: 16 MiB of code plus
/// 16 MiB of stdin in base64, with room to spare).
pub const MAX_FRAME: u32 = 48 << 20;

pycell_wire::named_enum! {
    /// Stable error codes (part of the protocol; never renamed).
    pub enum ErrorCode {
        /// The frame was larger than [`MAX_FRAME`]; the connection is closed.
        FrameTooLarge = "frame_too_large",
        /// The frame was not a JSON message of this protocol (garbage, unknown
        /// type, unknown or missing fields).
        BadMessage = "bad_message",
        /// The first message was not `hello`.
        HandshakeRequired = "handshake_required",
        /// The client speaks another protocol version.
        VersionMismatch = "version_mismatch",
        /// The peer's uid/groups are not allowed to use pycell.
        Unauthorized = "unauthorized",
        /// The run could not get a slot: the queue is full, its wait ran out, it
        /// needs more memory than the daemon's whole budget, or the connection
        /// caps are reached. Try again later.
        Busy = "busy",
        /// The run request is invalid (unknown policy, limits out of range, ...).
        InvalidRequest = "invalid_request",
        /// A `run` arrived while this connection already has one going.
        RunInProgress = "run_in_progress",
        /// `cancel` named no run of this connection.
        NoSuchRun = "no_such_run",
        /// The daemon is shutting down and takes no new runs.
        ShuttingDown = "shutting_down",
        /// Something failed inside the daemon.
        Internal = "internal",
        /// The handle names no session of the caller's uid.
        UnknownSession = "unknown_session",
        /// The session ended (its caller, its idle timeout or lifetime, a restart).
        SessionGone = "session_gone",
        /// The session was killed (a cell ignored KeyboardInterrupt, memory, its python died).
        SessionKilled = "session_killed",
        /// The session already has as many calls waiting as it queues.
        SessionBusy = "session_busy",
        /// The uid holds as many sessions as the policy allows.
        TooManySessions = "too_many_sessions",
        /// Sessions are turned off for the policy.
        SessionsUnavailable = "sessions_unavailable",
        /// A file operation was refused (a path outside /workspace, too big).
        FileRefused = "file_refused",
        /// A session's state could not be carried to a fork (too big, refused by its runner).
        StateRefused = "state_refused",
        /// The snapshot id names no snapshot of the caller's.
        UnknownSnapshot = "unknown_snapshot",
    }
}

impl From<ErrorCode> for FailureCode {
    /// A daemon's refusal, as a run result reports it (the same name).
    fn from(c: ErrorCode) -> FailureCode {
        match c {
            ErrorCode::FrameTooLarge => FailureCode::FrameTooLarge,
            ErrorCode::BadMessage => FailureCode::BadMessage,
            ErrorCode::HandshakeRequired => FailureCode::HandshakeRequired,
            ErrorCode::VersionMismatch => FailureCode::VersionMismatch,
            ErrorCode::Unauthorized => FailureCode::Unauthorized,
            ErrorCode::Busy => FailureCode::Busy,
            ErrorCode::InvalidRequest => FailureCode::InvalidRequest,
            ErrorCode::RunInProgress => FailureCode::RunInProgress,
            ErrorCode::NoSuchRun => FailureCode::NoSuchRun,
            ErrorCode::ShuttingDown => FailureCode::ShuttingDown,
            ErrorCode::Internal => FailureCode::Internal,
            ErrorCode::UnknownSession => FailureCode::UnknownSession,
            ErrorCode::SessionGone => FailureCode::SessionGone,
            ErrorCode::SessionKilled => FailureCode::SessionKilled,
            ErrorCode::SessionBusy => FailureCode::SessionBusy,
            ErrorCode::TooManySessions => FailureCode::TooManySessions,
            ErrorCode::SessionsUnavailable => FailureCode::SessionsUnavailable,
            ErrorCode::FileRefused => FailureCode::FileRefused,
            ErrorCode::StateRefused => FailureCode::StateRefused,
            ErrorCode::UnknownSnapshot => FailureCode::UnknownSnapshot,
        }
    }
}

impl ErrorCode {
    /// The error a session message gets for a failure: the same name where
    /// the protocol has it, else the nearest (a bad request, a busy
    /// daemon), else `internal`.
    pub fn for_failure(code: FailureCode) -> ErrorCode {
        match code {
            FailureCode::UnknownSession => ErrorCode::UnknownSession,
            FailureCode::SessionGone => ErrorCode::SessionGone,
            FailureCode::SessionKilled => ErrorCode::SessionKilled,
            FailureCode::SessionBusy => ErrorCode::SessionBusy,
            FailureCode::TooManySessions => ErrorCode::TooManySessions,
            FailureCode::SessionsUnavailable => ErrorCode::SessionsUnavailable,
            FailureCode::FileRefused => ErrorCode::FileRefused,
            FailureCode::StateRefused => ErrorCode::StateRefused,
            FailureCode::UnknownSnapshot => ErrorCode::UnknownSnapshot,
            FailureCode::InvalidRequest | FailureCode::InvalidPolicy => ErrorCode::InvalidRequest,
            FailureCode::Busy | FailureCode::UidUnavailable => ErrorCode::Busy,
            FailureCode::ShuttingDown => ErrorCode::ShuttingDown,
            _ => ErrorCode::Internal,
        }
    }
}

/// Client → daemon.
// One message per frame, decoded and matched at once: the size of the
// `Run` variant costs nothing worth a Box (and a Box would change every
// match on it).
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum ClientMessage {
    Hello {
        version: u32,
        client: String,
        /// The identity this connection speaks for: only a trusted front
        /// end (a uid in pycelld's `front_end_uids`) may say; its runs and
        /// sessions are then the identity's (see docs/protocol.md).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        identity: Option<String>,
    },
    Run {
        id: String,
        request: RunRequest,
    },
    Cancel {
        id: String,
    },
    /// Pass SIGINT to run `id`'s program, as ^C does in a terminal (the
    /// program may handle it; a Python program gets KeyboardInterrupt).
    Interrupt {
        id: String,
    },
    Info,
    /// The daemon's load and limits only (what a router polls): `status`
    /// answers; cheaper than `info`, which measures the host.
    Status,
    /// Start a session; `session_started` answers.
    SessionStart {
        id: String,
        request: crate::session::SessionStartRequest,
    },
    /// A call in session `session` (a cell, a file operation), queued
    /// behind the session's earlier calls; `session_answer` answers. A
    /// `cancel` with this id interrupts it (KeyboardInterrupt in a cell).
    Session {
        id: String,
        session: String,
        call: crate::session::SessionCall,
        /// A cell's wall timeout (default: the policy's).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        timeout_s: Option<f64>,
        /// Send `output` messages as the call prints (up to its cap; a
        /// live view, dropped while the client lags: the answer's output
        /// is the record).
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        watch: bool,
    },
    /// End a session; `session_ended` answers once its jail is gone.
    SessionEnd {
        id: String,
        session: String,
    },
    /// Keep session `session`'s Python state and /workspace in the
    /// server's store; `session_snapshotted` answers.
    SessionSnapshot {
        id: String,
        session: String,
    },
    /// A new session of the caller's whose Python state and /workspace
    /// are a copy of session `session`'s; `session_forked` answers.
    SessionFork {
        id: String,
        session: String,
    },
    /// The uid's open sessions; `sessions` answers.
    SessionList {
        id: String,
    },
    /// The answer to a `tool_call` of run or session call `id`.
    ToolAnswer {
        id: String,
        call: u64,
        /// A `pycell_tools::frames::Outcome`, kept as it came: pycelld
        /// parses it only if its size is within the call's `max_result`.
        outcome: RawJson,
    },
}

/// A JSON value kept as the text it came as, parsed only when wanted.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(transparent)]
pub struct RawJson(pub Box<serde_json::value::RawValue>);

impl RawJson {
    /// Its JSON text.
    pub fn get(&self) -> &str {
        self.0.get()
    }
}

impl PartialEq for RawJson {
    fn eq(&self, other: &RawJson) -> bool {
        self.get() == other.get()
    }
}

/// Daemon → client.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum ServerMessage {
    Welcome {
        version: u32,
        server: String,
    },
    /// The run waits for a slot; `position` 1 goes next. Sent when it
    /// starts waiting and every second while it waits.
    Queued {
        id: String,
        position: usize,
    },
    /// The run's dependencies are being installed (its env is not in the
    /// store yet): one message per step, e.g. "installed six 1.16.0 (1 of
    /// 1)". Sent after `queued`, before `started`.
    Installing {
        id: String,
        message: String,
    },
    Started {
        id: String,
        run_id: String,
    },
    Output {
        id: String,
        stream: Stream,
        data_base64: String,
    },
    Result {
        id: String,
        result: Box<crate::result::RunResult>,
    },
    /// A server over stdio (`serve_stdio`) is up: the socket of its stdin
    /// and stdout comes attached to this message (SCM_RIGHTS), for the
    /// client to read and write; its `result` follows when it ends.
    Stdio {
        id: String,
    },
    Info {
        info: Box<crate::info::DaemonInfo>,
    },
    Status {
        status: Box<crate::info::DaemonStatus>,
    },
    SessionStarted {
        id: String,
        session: Box<crate::session::SessionInfo>,
    },
    SessionAnswer {
        id: String,
        answer: Box<crate::session::SessionAnswer>,
    },
    SessionEnded {
        id: String,
        ended: crate::session::SessionEndInfo,
    },
    SessionForked {
        id: String,
        fork: Box<crate::session::SessionForkInfo>,
    },
    SessionSnapshotted {
        id: String,
        snapshot: Box<crate::session::SnapshotInfo>,
    },
    Sessions {
        id: String,
        sessions: Vec<crate::session::SessionSummary>,
    },
    /// Code of run (or session call) `id` calls a tool the client offered,
    /// checked by the daemon (the policy's rules, the input schema, the
    /// limits); the client calls it and sends `tool_answer` with the same
    /// `call`.
    ToolCall {
        id: String,
        call: u64,
        server: String,
        tool: String,
        arguments: serde_json::Map<String, serde_json::Value>,
        /// The policy's `call_timeout`: how long the call may take once
        /// the client's server is up (starting it is not counted).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        timeout_ms: Option<u64>,
        /// The policy's `max_result`: the client may refuse a larger
        /// answer before it parses it (the daemon checks it again).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        max_result_bytes: Option<u64>,
    },
    Error {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        id: Option<String>,
        code: ErrorCode,
        message: String,
    },
}

pub fn encode_b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// Bytes that should be base64 and are not.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BadBase64 {
    #[error("{0} is not valid base64: {1}")]
    Field(&'static str, base64::DecodeError),
    #[error("invalid base64: {0}")]
    Data(base64::DecodeError),
}

pub fn decode_b64(s: &str) -> Result<Vec<u8>, BadBase64> {
    base64::engine::general_purpose::STANDARD
        .decode(s)
        .map_err(BadBase64::Data)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failure_maps_to_the_error_of_its_name_and_back() {
        for code in ErrorCode::ALL {
            let failure = FailureCode::from(*code);
            assert_eq!(failure.as_str(), code.as_str());
            let back = ErrorCode::for_failure(failure);
            // The run-level codes are the daemon's own; sessions' map back.
            if code.as_str().contains("session")
                || code.as_str().contains("snapshot")
                || [ErrorCode::FileRefused, ErrorCode::StateRefused].contains(code)
            {
                assert_eq!(back, *code, "{code}");
            }
        }
        assert_eq!(
            ErrorCode::for_failure(FailureCode::UidUnavailable),
            ErrorCode::Busy
        );
        assert_eq!(
            ErrorCode::for_failure(FailureCode::Oom),
            ErrorCode::Internal
        );
    }
}
