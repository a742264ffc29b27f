//! Sessions: a warm jail whose runner (`python -s -c RUNNER
//! --pycell-session MODULE...`) stays alive and serves requests one at a
//! time, like a Jupyter kernel: cells run in one persistent `__main__`, and
//! files are written, read and listed in /workspace.
//!
//! ```text
//! launcher ──SessionOp──> pycell-jailer ──request──> runner (socket as its stdin)
//!          <──output events, then a Reply event──    <──reply── (stdout, stderr as pipes)
//! ```
//!
//! The launcher's [`SessionOp`] carries the request and its clocks (wall
//! timeout, CPU allowance, output cap); the jailer passes the request on as
//! a frame of its own on the runner's channel, which is not the program's
//! stdout: what a cell prints cannot forge or end its result. The runner's
//! reply comes back as untrusted bytes that the jailer only measures and
//! forwards ([`pycell_wire::events::Event::Reply`]); the launcher parses
//! it ([`RunnerReply`]), never anything running as root.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use pycell_wire::limits::{whole_secs, Bytes};
use pycell_wire::spec::{DisplayLimits, ImageLimits, JailSpec, SessionSpec};

use crate::RUNNER;

/// The runner's argument that starts a session.
pub const SESSION_FLAG: &str = "--pycell-session";

/// The largest request frame (a file write of [`MAX_FILE_BYTES`] in base64,
/// or a cell's code, with room to spare).
pub const MAX_REQUEST_FRAME: u64 = 24 << 20;

/// The largest file a session moves in or out in one request.
pub const MAX_FILE_BYTES: u64 = 8 << 20;

/// The argv of a session's jail: the interpreter on the runner, in
/// session mode, importing `modules` before it is ready.
pub fn session_argv(python: String, modules: &[String]) -> Vec<String> {
    let mut argv = vec![
        python,
        "-s".to_string(),
        "-c".to_string(),
        RUNNER.to_string(),
        SESSION_FLAG.to_string(),
    ];
    argv.extend(modules.iter().cloned());
    argv
}

/// The jail of a session whose runs would get `cold` (a spec resolved for
/// an empty request): the warm jail, in session mode, with `clocks`. Its
/// RLIMIT_CPU is the whole session's (one CPU-second per second of its
/// lifetime); each cell gets its own allowance from there.
pub fn session_spec(cold: &JailSpec, modules: &[String], clocks: SessionSpec) -> JailSpec {
    let mut spec = crate::warm_spec(cold, modules);
    spec.argv = session_argv(cold.argv[0].clone(), modules);
    let lifetime = Duration::from_millis(clocks.lifetime_ms);
    spec.limits.cpu_time = Duration::from_secs(whole_secs(lifetime));
    spec.limits.wall_timeout = lifetime;
    spec.session = Some(clocks);
    spec
}

/// Whether a session jail built ahead (`member`) is exactly the jail a
/// session would get (`wanted`, from [`session_spec`]), but for what the
/// launcher assigns (its run id, sandbox uid, cgroup, the descriptors it
/// hands its jailer).
pub fn fits_session(member: &JailSpec, wanted: &JailSpec) -> bool {
    let shape = |s: &JailSpec| {
        let mut s = s.clone();
        s.run_id.clear();
        (s.sandbox_uid, s.sandbox_gid) = (0, 0);
        s.cgroup = Default::default();
        s.descriptors.clear();
        serde_json::to_value(s).ok()
    };
    if member.session.is_none() {
        return false;
    }
    let member = shape(member);
    member.is_some() && member == shape(wanted)
}

/// One request for a session, from its launcher to its jailer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SessionOp {
    /// Past it, the runner gets SIGINT (KeyboardInterrupt in a cell); if
    /// it has not answered the session's grace later, the session ends.
    #[serde(rename = "wall_timeout_s", with = "pycell_wire::limits::seconds")]
    pub wall_timeout: Duration,
    /// CPU time the runner may use for this request (RLIMIT_CPU from now,
    /// in whole seconds: SIGXCPU, which a cell also sees as
    /// KeyboardInterrupt).
    #[serde(rename = "cpu_time_s", with = "pycell_wire::limits::seconds")]
    pub cpu_time: Duration,
    /// Cap for each of stdout and stderr during this request.
    #[serde(rename = "max_output_bytes")]
    pub max_output: Bytes,
    pub request: SessionRequest,
}

/// What the runner is asked to do.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum SessionRequest {
    /// Run `code` as the next cell in the session's `__main__`.
    Cell { code: String, limits: CellLimits },
    /// Write `data` (base64) to `path` in /workspace, creating its
    /// directories.
    Write { path: String, data: String },
    /// Read `path` in /workspace, if it has at most `max_bytes`.
    Read { path: String, max_bytes: u64 },
    /// List the directory `path` in /workspace.
    List { path: String, max_entries: u32 },
    /// Make the directory `path` in /workspace, and those above it.
    MakeDir { path: String },
    /// Remove `path` in /workspace: a file, a link, or a directory tree.
    Remove { path: String },
    /// Run `command` with /bin/sh in /workspace; its output is the call's.
    Command { command: String },
    /// Write the session's state (`__main__` and /workspace) as a bundle
    /// of at most `max_bytes`, kept in the runner until read: its size,
    /// and what it carries and leaves ([`StateReport`]).
    ExportState { max_bytes: u64 },
    /// At most `max_bytes` of bundle `export` (its number, from its
    /// [`StateReport`]) from `offset` (base64).
    ExportChunk {
        export: u64,
        offset: u64,
        max_bytes: u64,
    },
    /// The bundle's next bytes (base64), which start at `offset`.
    ImportChunk { offset: u64, data: String },
    /// Load the `size` bytes taken into `__main__` and /workspace; the
    /// cells go on numbered after `cells`.
    ImportState { size: u64, cells: u64 },
}

/// What a cell's reply may hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CellLimits {
    /// Changed files listed.
    pub files: u32,
    /// The images sent back.
    pub images: ImageLimits,
    /// The displays sent back (`display()`, the value), and each text
    /// part of the value.
    pub displays: DisplayLimits,
}

impl Default for CellLimits {
    fn default() -> CellLimits {
        CellLimits {
            files: 100,
            images: ImageLimits {
                max_edge: 1024,
                max_bytes: 1 << 20,
            },
            displays: DisplayLimits::default(),
        }
    }
}

/// Why a request was refused before it reached the runner.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SessionOpError {
    #[error("the wall timeout, CPU allowance and output cap must be positive (the clocks at most 30 days)")]
    Zero,
    #[error("a path contains a NUL byte")]
    NulInPath,
    #[error("a read of {0} bytes is more than the {MAX_FILE_BYTES} a session moves at once")]
    ReadTooLarge(u64),
}

impl SessionOp {
    /// Check what the jailer relies on.
    pub fn validate(&self) -> Result<(), SessionOpError> {
        let clocks = [self.wall_timeout, self.cpu_time];
        let out_of_range = |d: &Duration| d.is_zero() || *d > pycell_wire::limits::MAX_CLOCK;
        if clocks.iter().any(out_of_range) || self.max_output.get() == 0 {
            return Err(SessionOpError::Zero);
        }
        match &self.request {
            SessionRequest::Cell { .. } => Ok(()),
            SessionRequest::Write { path, .. }
            | SessionRequest::List { path, .. }
            | SessionRequest::MakeDir { path }
            | SessionRequest::Remove { path }
                if path.contains('\0') =>
            {
                Err(SessionOpError::NulInPath)
            }
            SessionRequest::Read { path, .. } if path.contains('\0') => {
                Err(SessionOpError::NulInPath)
            }
            SessionRequest::Read { max_bytes, .. }
            | SessionRequest::ExportChunk { max_bytes, .. }
                if *max_bytes > MAX_FILE_BYTES =>
            {
                Err(SessionOpError::ReadTooLarge(*max_bytes))
            }
            _ => Ok(()),
        }
    }

    /// The frame the jailer writes on the runner's channel: a 4-byte
    /// big-endian length, then `token`, then the request's JSON. The
    /// runner's reply starts with the same token ([`reply_body`]).
    pub fn runner_frame(&self, token: &Token) -> Vec<u8> {
        let json = serde_json::to_vec(&self.request).expect("a request serializes");
        let len = u32::try_from(TOKEN_LEN + json.len())
            .ok()
            .filter(|n| u64::from(*n) <= MAX_REQUEST_FRAME + TOKEN_LEN as u64)
            .expect("a request that came in a frame fits in one");
        let mut frame = Vec::with_capacity(4 + len as usize);
        frame.extend_from_slice(&len.to_be_bytes());
        frame.extend_from_slice(token);
        frame.extend_from_slice(&json);
        frame
    }
}

/// The bytes of a request's token: hex, so the runner handles text.
pub const TOKEN_LEN: usize = 32;

/// What the jailer sends with a request and wants back first in its
/// reply: a reply with another token (a frame the code wrote without it,
/// or the runner's late reply to an earlier request) answers nothing, and
/// ends the session, instead of answering the next request.
pub type Token = [u8; TOKEN_LEN];

/// A fresh token, which the jail cannot guess: 128 bits from the kernel
/// (`getrandom`) for each token, in hex. Never from a generator seeded in
/// this process: a jailer forked by pycelld's fork server starts with a
/// copy of its server's memory, so a seed kept there would be every
/// jailer's. The kernel always has random bytes for root on the kernels
/// pycell runs on; a jailer that got none aborts (its jail dies with it)
/// rather than send a guessable token.
pub fn new_token() -> Token {
    let mut bytes = [0u8; TOKEN_LEN / 2];
    if getrandom::fill(&mut bytes).is_err() {
        std::process::abort();
    }
    let mut token = [0u8; TOKEN_LEN];
    for (pair, b) in token.chunks_exact_mut(2).zip(bytes) {
        pair.copy_from_slice(format!("{b:02x}").as_bytes());
    }
    token
}

/// A reply's body after `token`, if it starts with it.
pub fn reply_body<'a>(body: &'a [u8], token: &Token) -> Option<&'a [u8]> {
    body.strip_prefix(token.as_slice())
}

/// A runner's reply, as the launcher reads it: every field any request's
/// reply may have (the runner is inside the jail, so nothing here is
/// trusted beyond its shape; sizes were bounded by the jailer).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RunnerReply {
    /// The request could not be served as asked (a path outside the
    /// workspace, a file too big): the reason.
    #[serde(default)]
    pub refused: Option<String>,
    /// A cell: its number in the session.
    #[serde(default)]
    pub cell: Option<u64>,
    #[serde(default)]
    pub value: Option<String>,
    #[serde(default)]
    pub value_truncated: bool,
    /// A cut value kept whole in the workspace: `json` or `txt` (the host
    /// names the file; see `pycell_protocol::session::value_file`).
    #[serde(default)]
    pub value_saved: Option<String>,
    #[serde(default)]
    pub error: Option<CellError>,
    #[serde(default)]
    pub files: Vec<ChangedFile>,
    #[serde(default)]
    pub files_truncated: bool,
    #[serde(default)]
    pub images: Vec<Image>,
    #[serde(default)]
    pub images_omitted: u32,
    /// What the cell showed (`display()`, its value in a richer form).
    #[serde(default)]
    pub displays: Vec<Display>,
    #[serde(default)]
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
    #[serde(default)]
    pub created: Option<bool>,
    /// A command: its exit status (negative: the signal that ended it).
    #[serde(default)]
    pub exit_code: Option<i32>,
    /// A state's export or import: what it carried and left.
    #[serde(default)]
    pub state: Option<StateReport>,
}

/// What a session's state bundle carried and left out, as its runners
/// said (from the jail: bounded by the host before anyone sees it).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct StateReport {
    /// The names of `__main__` it carries (an export) or set (an import).
    #[serde(default)]
    pub names: Vec<String>,
    /// The workspace's files it wrote (an import).
    #[serde(default)]
    pub files: u64,
    /// Names left out, with why (an export).
    #[serde(default)]
    pub dropped: std::collections::BTreeMap<String, String>,
    /// Workspace paths left out, with why (an export).
    #[serde(default)]
    pub skipped: std::collections::BTreeMap<String, String>,
    /// The kinds of random generators reseeded (an export).
    #[serde(default)]
    pub reseeded: Vec<String>,
    /// The threads running besides the main one, not carried (an export).
    #[serde(default)]
    pub threads: Vec<String>,
    /// The cells the session had run (an export).
    #[serde(default)]
    pub cells: u64,
    /// The export's number, which its chunks are read by.
    #[serde(default)]
    pub export: u64,
}

/// The exception a cell ended with.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CellError {
    #[serde(rename = "type")]
    pub kind: String,
    pub message: String,
    /// As python prints it, without the runner's frames.
    pub traceback: String,
}

pub use pycell_wire::report::ChangedFile;

pub use pycell_wire::report::{Display, Image};

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

#[cfg(test)]
mod tests {
    use super::*;

    fn op(request: SessionRequest) -> SessionOp {
        SessionOp {
            wall_timeout: Duration::from_secs(1),
            cpu_time: Duration::from_secs(1),
            max_output: Bytes(1024),
            request,
        }
    }

    #[test]
    fn the_runner_gets_the_request_alone_tagged_by_its_op() {
        let cell = op(SessionRequest::Cell {
            code: "x = 1".into(),
            limits: CellLimits::default(),
        });
        let token = new_token();
        let frame = cell.runner_frame(&token);
        let len = u32::from_be_bytes(frame[..4].try_into().unwrap()) as usize;
        assert_eq!(len, frame.len() - 4);
        assert_eq!(&frame[4..4 + TOKEN_LEN], token.as_slice());
        let v: serde_json::Value = serde_json::from_slice(&frame[4 + TOKEN_LEN..]).unwrap();
        assert_eq!(v["op"], "cell");
        assert_eq!(v["code"], "x = 1");
        assert_eq!(v["limits"]["images"]["max_edge"], 1024);
        assert!(v.get("wall_timeout_s").is_none(), "{v}");
    }

    #[test]
    fn tokens_differ_and_only_a_reply_with_its_own_is_an_answer() {
        let (a, b) = (new_token(), new_token());
        assert_ne!(a, b);
        assert!(a.iter().all(u8::is_ascii_hexdigit));
        let mut reply = a.to_vec();
        reply.extend_from_slice(b"{}");
        assert_eq!(reply_body(&reply, &a), Some(&b"{}"[..]));
        assert_eq!(reply_body(&reply, &b), None);
        assert_eq!(reply_body(b"{\"value\": \"666\"}", &a), None);
    }

    #[test]
    fn bad_requests_are_refused_before_the_runner() {
        let mut zero = op(SessionRequest::List {
            path: String::new(),
            max_entries: 10,
        });
        zero.wall_timeout = Duration::ZERO;
        assert_eq!(zero.validate(), Err(SessionOpError::Zero));
        let nul = op(SessionRequest::Write {
            path: "a\0b".into(),
            data: String::new(),
        });
        assert_eq!(nul.validate(), Err(SessionOpError::NulInPath));
        let big = op(SessionRequest::Read {
            path: "a".into(),
            max_bytes: MAX_FILE_BYTES + 1,
        });
        assert!(matches!(
            big.validate(),
            Err(SessionOpError::ReadTooLarge(_))
        ));
    }

    #[test]
    fn a_reply_reads_whatever_fields_its_request_has() {
        let r: RunnerReply = serde_json::from_str(
            r#"{"cell": 2, "value": "42", "value_truncated": false, "files": [], "images": [], "images_omitted": 0, "id": null}"#,
        )
        .unwrap();
        assert_eq!((r.cell, r.value.as_deref()), (Some(2), Some("42")));
        let r: RunnerReply = serde_json::from_str(r#"{"refused": "no"}"#).unwrap();
        assert_eq!(r.refused.as_deref(), Some("no"));
    }
}
