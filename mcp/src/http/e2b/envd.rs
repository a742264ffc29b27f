//! envd's side of a sandbox: `/files` (download, and upload as multipart
//! or octet-stream), `/health`, and over Connect the filesystem service's
//! Stat, ListDir, MakeDir and Remove and the process service's Start
//! (`commands.run`: the jail's own `/bin/sh`, in the sandbox's session).
//! E2B's paths `/home/user/...` are the session's `/workspace/...`
//! ([`workspace_path`]); other absolute paths are refused.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use base64::Engine;
use bytes::Bytes;
use http::{header, Method, Response, StatusCode};
use serde::Deserialize;
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

use super::connect::{self, Code};
use super::interpreter::is_gone;
use super::sandboxes::Sandbox;
use super::{error, streamed, E2b, Lines};
use crate::http::front::Body;
use pycell_engine::service::{OutputSink, SessionFailure};
use pycell_protocol::session::{DirEntry, SessionAnswer, SessionCall};
use pycell_wire::events::Stream;

/// E2B's home directory: the sandbox's /workspace.
const HOME: &str = "/home/user";
const WORKSPACE: &str = "/workspace";
/// Entries a recursive listing returns at most.
const MAX_LISTED: usize = 1000;

const B64: base64::engine::GeneralPurpose = base64::engine::general_purpose::STANDARD;

pub(super) async fn serve(
    e2b: &Arc<E2b>,
    s: &Arc<Sandbox>,
    parts: &http::request::Parts,
    path: &str,
    body: Bytes,
) -> Response<Body> {
    let calls = Calls { e2b, s };
    match (&parts.method, path) {
        (&Method::GET, "/health") => super::empty(StatusCode::NO_CONTENT),
        (&Method::GET, "/files") => calls.download(parts).await,
        (&Method::POST, "/files") => calls.upload(parts, body).await,
        (&Method::POST, "/process.Process/Start") => calls.start_process(&body).await,
        (&Method::POST, p) if p.starts_with("/filesystem.Filesystem/") => {
            let method = &p["/filesystem.Filesystem/".len()..];
            match calls.filesystem(method, &body).await {
                Ok(v) => super::json(StatusCode::OK, &v),
                Err(e) => unary_error(&e),
            }
        }
        (&Method::POST, "/process.Process/List") => super::json(StatusCode::OK, &json!({"processes": []})),
        (&Method::POST, p) if p.starts_with("/process.Process/") => unary_error(&connect::Error::new(
            Code::Unimplemented,
            format!("{} is not supported by pycell: a command runs to its end in one call (commands.run); background processes, input and signals are not kept", &p[1..]),
        )),
        (m, p) => super::unsupported(&format!("{m} {p} of envd")),
    }
}

fn unary_error(e: &connect::Error) -> Response<Body> {
    super::json(e.code.status(), &e.json())
}

/// The path below /workspace (`""`: itself) of an E2B path.
pub(super) fn workspace_path(path: &str) -> Result<String, String> {
    for root in [HOME, WORKSPACE] {
        if path == root || path == format!("{root}/") {
            return Ok(String::new());
        }
        if let Some(rest) = path.strip_prefix(root).and_then(|r| r.strip_prefix('/')) {
            return Ok(rest.to_string());
        }
    }
    match path.starts_with('/') {
        true => Err(format!("{path}: a pycell sandbox keeps files only under {HOME} (its /workspace); other paths are not reachable")),
        false => Ok(path.to_string()),
    }
}

/// `ws` (a path the runner gave, under /workspace) under the root the
/// caller named in `asked`.
fn shown(asked: &str, ws: &str) -> String {
    let rest = ws.strip_prefix(WORKSPACE).unwrap_or(ws);
    let root = match asked.starts_with(WORKSPACE) {
        true => WORKSPACE,
        false => HOME,
    };
    format!("{root}{rest}")
}

/// A command line for `/bin/sh -c` from a process config, or why not.
pub(super) fn command_line(p: &ProcessConfig) -> Result<String, String> {
    let shells = ["/bin/bash", "bash", "/bin/sh", "sh"];
    let script = match (shells.contains(&p.cmd.as_str()), p.args.as_slice()) {
        (true, [.., c, script]) if c == "-c" => script.clone(),
        _ => std::iter::once(&p.cmd)
            .chain(&p.args)
            .map(|a| quoted(a))
            .collect::<Vec<_>>()
            .join(" "),
    };
    let mut line = String::new();
    for (k, v) in &p.envs {
        let ok = !k.is_empty()
            && !k.starts_with(|c: char| c.is_ascii_digit())
            && k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !ok {
            return Err(format!("envs: {k:?} is not a shell variable's name"));
        }
        line.push_str(&format!("export {k}={}; ", quoted(v)));
    }
    if let Some(cwd) = p.cwd.as_deref().filter(|c| !c.is_empty()) {
        let rel = workspace_path(cwd)?;
        if !rel.is_empty() {
            line.push_str(&format!("cd {} && ", quoted(&rel)));
        }
    }
    line.push_str(&script);
    Ok(line)
}

/// `s` in single quotes for the shell.
fn quoted(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// An entry as envd's `EntryInfo`.
fn entry_info(e: &DirEntry, path: &str) -> Value {
    let kind = match e.kind.as_str() {
        "file" => "FILE_TYPE_FILE",
        "directory" => "FILE_TYPE_DIRECTORY",
        "symlink" => "FILE_TYPE_SYMLINK",
        _ => "FILE_TYPE_UNSPECIFIED",
    };
    let mtime = SystemTime::UNIX_EPOCH + Duration::from_secs_f64(e.mtime.max(0.0));
    json!({
        "name": e.name, "type": kind, "path": path, "size": e.size,
        "mode": 0, "permissions": "", "owner": "user", "group": "user",
        "modifiedTime": super::rfc3339(mtime),
    })
}

/// Its process config (`StartRequest.process`).
#[derive(Debug, Default, Deserialize)]
pub(super) struct ProcessConfig {
    #[serde(default)]
    cmd: String,
    #[serde(default)]
    args: Vec<String>,
    #[serde(default)]
    envs: std::collections::BTreeMap<String, String>,
    #[serde(default)]
    cwd: Option<String>,
}

#[derive(Debug, Deserialize)]
struct StartRequest {
    #[serde(default)]
    process: ProcessConfig,
    #[serde(default)]
    pty: Option<Value>,
}

#[derive(Debug, Deserialize)]
struct PathRequest {
    #[serde(default)]
    path: String,
    #[serde(default)]
    depth: Option<u32>,
}

/// A chunk of a command's output, as a process event.
fn data_event(stream: Stream, bytes: &[u8]) -> Value {
    let key = match stream {
        Stream::Stdout => "stdout",
        Stream::Stderr => "stderr",
    };
    json!({"event": {"data": {key: B64.encode(bytes)}}})
}

/// A session call failed: as a Connect error.
fn call_error(f: &SessionFailure) -> connect::Error {
    use pycell_wire::codes::FailureCode as F;
    let code = match f.code {
        F::SessionGone | F::UnknownSession | F::SessionKilled => Code::Unavailable,
        F::SessionBusy | F::Busy => Code::ResourceExhausted,
        F::InvalidRequest | F::FileRefused => Code::InvalidArgument,
        _ => Code::Internal,
    };
    connect::Error::new(code, format!("{} ({})", f.message, f.code.as_str()))
}

/// A runner's refusal: missing things are not found.
fn refusal(why: &str) -> connect::Error {
    match why.contains("does not exist") {
        true => connect::Error::new(Code::NotFound, why),
        false => connect::Error::new(Code::InvalidArgument, why),
    }
}

/// One sandbox's envd calls.
struct Calls<'a> {
    e2b: &'a Arc<E2b>,
    s: &'a Arc<Sandbox>,
}

impl Calls<'_> {
    /// A file operation in the sandbox's session: its reply, or the error.
    async fn call(&self, call: SessionCall) -> Result<SessionAnswer, connect::Error> {
        let service = self.e2b.service_of(self.s);
        let session = self.session()?;
        let answer = service
            .session_call(&session, call, None, CancellationToken::new())
            .await;
        if is_gone(&answer) {
            self.e2b.gone(self.s).await;
        }
        let a = answer.map_err(|f| call_error(&f))?;
        match &a.reply.refused {
            Some(why) => Err(refusal(why)),
            None => Ok(a),
        }
    }

    /// The sandbox's session (paused: none, and the call is refused).
    fn session(&self) -> Result<String, connect::Error> {
        self.s.session().ok_or_else(|| {
            let m = format!(
                "The sandbox {} is paused: Sandbox.connect() resumes it",
                self.s.id
            );
            connect::Error::new(Code::Unavailable, m)
        })
    }

    async fn list(&self, rel: &str) -> Result<Vec<DirEntry>, connect::Error> {
        let call = SessionCall::List {
            path: rel.to_string(),
        };
        Ok(self.call(call).await?.reply.entries)
    }

    async fn filesystem(&self, method: &str, body: &[u8]) -> Result<Value, connect::Error> {
        let r: PathRequest = serde_json::from_slice(body).map_err(|e| {
            connect::Error::new(
                Code::InvalidArgument,
                format!("the request is not a {method} message: {e}"),
            )
        })?;
        let rel =
            workspace_path(&r.path).map_err(|m| connect::Error::new(Code::InvalidArgument, m))?;
        match method {
            "Stat" => Ok(json!({"entry": self.stat(&r.path, &rel).await?})),
            "ListDir" => {
                self.list_dir(&r.path, &rel, r.depth.unwrap_or(1).max(1))
                    .await
            }
            "MakeDir" => {
                let a = self
                    .call(SessionCall::MakeDir { path: rel.clone() })
                    .await?;
                if a.reply.created == Some(false) {
                    let m = format!("{}: the directory already exists", r.path);
                    return Err(connect::Error::new(Code::AlreadyExists, m));
                }
                Ok(json!({"entry": self.stat(&r.path, &rel).await?}))
            }
            "Remove" => {
                self.call(SessionCall::Remove { path: rel }).await?;
                Ok(json!({}))
            }
            other => Err(connect::Error::new(
                Code::Unimplemented,
                format!(
                    "filesystem.Filesystem/{other} is not supported by pycell (see docs/e2b.md)"
                ),
            )),
        }
    }

    /// The entry at `rel`, from its directory's listing.
    async fn stat(&self, asked: &str, rel: &str) -> Result<Value, connect::Error> {
        if rel.is_empty() {
            let root = DirEntry {
                name: "user".into(),
                kind: "directory".into(),
                size: 0,
                mtime: 0.0,
            };
            return Ok(entry_info(&root, asked));
        }
        let (parent, name) = rel.rsplit_once('/').unwrap_or(("", rel));
        let entries = self.list(parent).await?;
        let e = entries.iter().find(|e| e.name == name).ok_or_else(|| {
            connect::Error::new(
                Code::NotFound,
                format!("{asked}: no such file or directory"),
            )
        })?;
        Ok(entry_info(e, asked))
    }

    /// A directory's entries, and theirs down to `depth` levels.
    async fn list_dir(&self, asked: &str, rel: &str, depth: u32) -> Result<Value, connect::Error> {
        let mut out = Vec::new();
        let mut todo = vec![(rel.to_string(), asked.trim_end_matches('/').to_string(), 1)];
        while let Some((dir, shown_dir, level)) = todo.pop() {
            for e in self.list(&dir).await? {
                if out.len() >= MAX_LISTED {
                    break;
                }
                let path = format!("{shown_dir}/{}", e.name);
                if e.kind == "directory" && level < depth {
                    let sub = match dir.is_empty() {
                        true => e.name.clone(),
                        false => format!("{dir}/{}", e.name),
                    };
                    todo.push((sub, path.clone(), level + 1));
                }
                out.push(entry_info(&e, &path));
            }
        }
        Ok(json!({"entries": out}))
    }

    async fn download(&self, parts: &http::request::Parts) -> Response<Body> {
        let asked = super::query_param(parts, "path").unwrap_or_default();
        let rel = match workspace_path(&asked) {
            Ok(r) => r,
            Err(m) => return error(StatusCode::BAD_REQUEST, &m),
        };
        let data = match self.call(SessionCall::Read { path: rel }).await {
            Ok(a) => a.reply.data.unwrap_or_default(),
            Err(e) => return error(e.code.status(), &e.message),
        };
        match B64.decode(data) {
            Ok(bytes) => super::respond(
                StatusCode::OK,
                "application/octet-stream",
                Bytes::from(bytes),
            ),
            Err(_) => error(
                StatusCode::INTERNAL_SERVER_ERROR,
                "the sandbox sent a file that is not base64",
            ),
        }
    }

    async fn upload(&self, parts: &http::request::Parts, body: Bytes) -> Response<Body> {
        let files = match uploaded_files(parts, body).await {
            Ok(f) => f,
            Err(m) => return error(StatusCode::BAD_REQUEST, &m),
        };
        let mut written = Vec::new();
        for (asked, data) in files {
            let rel = match workspace_path(&asked) {
                Ok(r) if !r.is_empty() => r,
                Ok(_) => return error(StatusCode::BAD_REQUEST, &format!("{asked} is a directory")),
                Err(m) => return error(StatusCode::BAD_REQUEST, &m),
            };
            let call = SessionCall::Write {
                path: rel,
                data_base64: B64.encode(&data),
            };
            match self.call(call).await {
                Ok(a) => {
                    let ws = a.reply.path.unwrap_or_default();
                    let name = ws.rsplit('/').next().unwrap_or_default().to_string();
                    written.push(json!({"name": name, "type": "file", "path": shown(&asked, &ws)}));
                }
                Err(e) => return error(e.code.status(), &e.message),
            }
        }
        super::json(StatusCode::OK, &Value::Array(written))
    }

    async fn start_process(&self, body: &[u8]) -> Response<Body> {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<Bytes>();
        let cancel = CancellationToken::new();
        let started = self.command(body).and_then(|line| {
            let session = self.session()?;
            let permit = self
                .e2b
                .permit(self.s)
                .map_err(|m| connect::Error::new(Code::ResourceExhausted, m))?;
            Ok((line, session, permit))
        });
        let (line, session, permit) = match started {
            Ok(x) => x,
            Err(e) => {
                let _ = tx.send(connect::end_of_stream(Some(&e)));
                return streamed(StatusCode::OK, "application/connect+json", rx, cancel);
            }
        };
        let _ = tx.send(connect::envelope(&json!({"event": {"start": {"pid": 1}}})));
        let (out, lines) = (tx.clone(), Arc::new(Lines::default()));
        let taken = Arc::clone(&lines);
        let sink: OutputSink = Arc::new(move |stream, bytes| {
            if let Some(ready) = taken.take(stream, bytes) {
                let _ = out.send(connect::envelope(&data_event(stream, &ready)));
            }
        });
        let (e2b, s, stop) = (Arc::clone(self.e2b), Arc::clone(self.s), cancel.clone());
        tokio::spawn(async move {
            let _permit = permit;
            let call = SessionCall::Command { command: line };
            let answer = e2b
                .service_of(&s)
                .session_call_watched(&session, call, None, stop, Some(sink))
                .await;
            if is_gone(&answer) {
                e2b.gone(&s).await;
            }
            if let Ok(a) = &answer {
                for (stream, whole) in [(Stream::Stdout, &a.stdout), (Stream::Stderr, &a.stderr)] {
                    if let Some(rest) = lines.finish(stream, whole) {
                        let _ = tx.send(connect::envelope(&data_event(stream, &rest)));
                    }
                }
            }
            let end = match answer {
                Ok(a) => match (a.reply.refused, a.reply.exit_code) {
                    (Some(why), _) => Err(refusal(&why)),
                    (None, code) => Ok(code.unwrap_or(-1)),
                },
                Err(f) => Err(call_error(&f)),
            };
            let _ = match end {
                Ok(code) => {
                    let status = format!("exit status {code}");
                    let ended = json!({"event": {"end": {"exitCode": code, "exited": true, "status": status}}});
                    tx.send(connect::envelope(&ended))
                        .and_then(|_| tx.send(connect::end_of_stream(None)))
                }
                Err(e) => tx.send(connect::end_of_stream(Some(&e))),
            };
        });
        streamed(StatusCode::OK, "application/connect+json", rx, cancel)
    }

    /// The command line a `Start` request asks for.
    fn command(&self, body: &[u8]) -> Result<String, connect::Error> {
        let bad = |m: String| connect::Error::new(Code::InvalidArgument, m);
        let message = connect::only_message(body)?;
        let r: StartRequest = serde_json::from_slice(message)
            .map_err(|e| bad(format!("the request is not a StartRequest: {e}")))?;
        if r.pty.as_ref().is_some_and(|p| !p.is_null()) {
            let m = "a pty is not supported by pycell: commands run without a terminal";
            return Err(connect::Error::new(Code::Unimplemented, m));
        }
        command_line(&r.process).map_err(bad)
    }
}

/// The files of an upload, each with the path it is to have: a
/// multipart body's file parts (each named by its filename, or the
/// `path` query for one), or an octet-stream body (the `path` query).
async fn uploaded_files(
    parts: &http::request::Parts,
    body: Bytes,
) -> Result<Vec<(String, Bytes)>, String> {
    let query_path = super::query_param(parts, "path");
    let content_type = parts
        .headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if parts.headers.contains_key(header::CONTENT_ENCODING) {
        return Err(
            "compressed uploads (gzip) are not supported by pycell: send the file as it is".into(),
        );
    }
    let Ok(boundary) = multer::parse_boundary(content_type) else {
        let path = query_path.ok_or("an octet-stream upload needs the `path` query")?;
        return Ok(vec![(path, body)]);
    };
    let stream = futures::stream::once(async move { Ok::<Bytes, std::io::Error>(body) });
    let mut form = multer::Multipart::new(stream, boundary);
    let mut files = Vec::new();
    while let Some(field) = form
        .next_field()
        .await
        .map_err(|e| format!("the multipart body: {e}"))?
    {
        let name = field.file_name().map(str::to_string);
        let data = field
            .bytes()
            .await
            .map_err(|e| format!("the multipart body: {e}"))?;
        files.push((name, data));
    }
    let single = files.len() == 1;
    files
        .into_iter()
        .map(|(name, data)| match (single, &query_path, name) {
            (true, Some(p), _) => Ok((p.clone(), data)),
            (_, _, Some(n)) => Ok((n, data)),
            _ => Err("a file part has no filename to say where it goes".to_string()),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn home_and_workspace_paths_are_the_workspace_and_nothing_else_is_reached() {
        assert_eq!(workspace_path("/home/user").unwrap(), "");
        assert_eq!(workspace_path("/home/user/").unwrap(), "");
        assert_eq!(workspace_path("/home/user/a/b.txt").unwrap(), "a/b.txt");
        assert_eq!(workspace_path("/workspace/x").unwrap(), "x");
        assert_eq!(workspace_path("data.csv").unwrap(), "data.csv");
        assert!(workspace_path("/etc/passwd")
            .unwrap_err()
            .contains("only under /home/user"));
        assert!(workspace_path("/home/username").is_err());
        assert_eq!(shown("/home/user/a", "/workspace/a"), "/home/user/a");
        assert_eq!(shown("/workspace/a", "/workspace/a"), "/workspace/a");
    }

    #[test]
    fn commands_become_one_shell_line_with_their_environment_and_directory() {
        let sdk = ProcessConfig {
            cmd: "/bin/bash".into(),
            args: vec!["-l".into(), "-c".into(), "ls /workspace".into()],
            ..ProcessConfig::default()
        };
        assert_eq!(command_line(&sdk).unwrap(), "ls /workspace");
        let mut p = ProcessConfig {
            cmd: "echo".into(),
            args: vec!["it's".into()],
            cwd: Some("/home/user/sub".into()),
            ..ProcessConfig::default()
        };
        p.envs.insert("GREETING".into(), "hi there".into());
        assert_eq!(
            command_line(&p).unwrap(),
            r"export GREETING='hi there'; cd 'sub' && 'echo' 'it'\''s'"
        );
        p.envs.insert("BAD NAME".into(), "x".into());
        assert!(command_line(&p).is_err());
        let outside = ProcessConfig {
            cwd: Some("/etc".into()),
            ..ProcessConfig::default()
        };
        assert!(command_line(&outside).is_err());
    }
}
