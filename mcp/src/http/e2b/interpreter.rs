//! The code interpreter's endpoints: `POST /execute` runs a cell in a
//! context (a pycell session) and streams its output, results and error
//! as the SDKs read them (one JSON object a line); `/contexts` makes,
//! lists, restarts and removes contexts.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::SystemTime;

use bytes::Bytes;
use http::{Method, Response, StatusCode};
use serde::Deserialize;
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

use super::sandboxes::{Context, Sandbox};
use super::{error, parse, sandboxes, streamed, E2b, Lines, Refusal};
use crate::http::front::Body;
use pycell_engine::service::{OutputSink, SessionFailure};
use pycell_protocol::session::{SessionAnswer, SessionCall, SessionStartRequest};
use pycell_wire::codes::FailureCode;
use pycell_wire::events::Stream;
use pycell_wire::report::{Display, DisplayKind};

/// Where contexts work: the workspace, by either of its names.
const CWD: &str = "/home/user";

#[derive(Debug, Deserialize)]
struct ExecuteBody {
    code: String,
    #[serde(default)]
    context_id: Option<String>,
    #[serde(default)]
    language: Option<String>,
    #[serde(default)]
    env_vars: Option<BTreeMap<String, String>>,
}

#[derive(Debug, Deserialize)]
struct ContextBody {
    #[serde(default)]
    language: Option<String>,
    #[serde(default)]
    cwd: Option<String>,
}

pub(super) async fn serve(
    e2b: &Arc<E2b>,
    s: &Arc<Sandbox>,
    parts: &http::request::Parts,
    path: &str,
    body: &[u8],
) -> Response<Body> {
    let rest: Vec<&str> = path.trim_matches('/').split('/').collect();
    match (&parts.method, rest.as_slice()) {
        (&Method::POST, ["execute"]) => execute(e2b, s, body).await,
        (&Method::POST, ["contexts"]) => new_context(e2b, s, body).await,
        (&Method::GET, ["contexts"]) => {
            let mut all = vec![context_json(&s.id)];
            all.extend(s.contexts().iter().map(|c| context_json(&c.id)));
            super::json(StatusCode::OK, &Value::Array(all))
        }
        (&Method::DELETE, ["contexts", id]) => match s.remove_context(id) {
            Some(c) => {
                let _ = e2b.service_of(s).end_session(&c.session).await;
                super::empty(StatusCode::NO_CONTENT)
            }
            None => error(StatusCode::NOT_FOUND, &format!("context {id} not found")),
        },
        (&Method::POST, ["contexts", id, "restart"]) => restart(e2b, s, id).await,
        (m, _) => super::unsupported(&format!("{m} {path} of the code interpreter")),
    }
}

fn context_json(id: &str) -> Value {
    json!({"id": id, "language": "python", "cwd": CWD})
}

/// Whether `language` is one pycell runs (Python only).
fn python(language: Option<&str>) -> Result<(), Refusal> {
    match language {
        None | Some("python" | "python3" | "") => Ok(()),
        Some(other) => Err(Refusal::new(
            StatusCode::BAD_REQUEST,
            format!("language {other:?} is not supported by pycell: it runs Python only"),
        )),
    }
}

async fn new_context(e2b: &Arc<E2b>, s: &Arc<Sandbox>, body: &[u8]) -> Response<Body> {
    let b: ContextBody = match parse(body) {
        Ok(b) => b,
        Err(r) => return r.answer(),
    };
    if let Err(r) = python(b.language.as_deref()) {
        return r.answer();
    }
    if let Some(cwd) = b
        .cwd
        .as_deref()
        .filter(|c| ![CWD, "/workspace"].contains(c))
    {
        let m = format!(
            "cwd {cwd:?}: a context works in /home/user, which is the sandbox's /workspace"
        );
        return error(StatusCode::BAD_REQUEST, &m);
    }
    let id = match sandboxes::random_hex(8) {
        Ok(h) => format!("ctx-{h}"),
        Err(m) => return error(StatusCode::INTERNAL_SERVER_ERROR, &m),
    };
    let session = match start(e2b, s).await {
        Ok(session) => session,
        Err(r) => return r.answer(),
    };
    if let Err(c) = s.add_context(Context {
        id: id.clone(),
        session,
    }) {
        let _ = e2b.service_of(s).end_session(&c.session).await;
        let m = format!(
            "a sandbox has at most {} contexts besides its default one",
            sandboxes::MAX_CONTEXTS
        );
        return error(StatusCode::TOO_MANY_REQUESTS, &m);
    }
    super::json(StatusCode::OK, &context_json(&id))
}

/// A new session of `s`'s policy.
async fn start(e2b: &E2b, s: &Sandbox) -> Result<String, Refusal> {
    let req = SessionStartRequest {
        policy: Some(s.policy.clone()),
        ..SessionStartRequest::default()
    };
    match e2b.service_of(s).start_session(req).await {
        Ok(info) => Ok(info.session),
        Err(f) => Err(Refusal::failed("no context was made", &f)),
    }
}

/// A context's state dropped: its session ended and a new one in its
/// place (the default context cannot be restarted: its session is the
/// sandbox's).
async fn restart(e2b: &Arc<E2b>, s: &Arc<Sandbox>, id: &str) -> Response<Body> {
    if id == s.id {
        let m = "the default context is the sandbox's own session: make a new context, or a new sandbox";
        return super::unsupported(&format!("restarting it ({m})"));
    }
    let Some(old) = s.remove_context(id) else {
        return error(StatusCode::NOT_FOUND, &format!("context {id} not found"));
    };
    let _ = e2b.service_of(s).end_session(&old.session).await;
    match start(e2b, s).await {
        Ok(session) => {
            let _ = s.add_context(Context {
                id: id.to_string(),
                session,
            });
            super::empty(StatusCode::NO_CONTENT)
        }
        Err(r) => r.answer(),
    }
}

async fn execute(e2b: &Arc<E2b>, s: &Arc<Sandbox>, body: &[u8]) -> Response<Body> {
    let b: ExecuteBody = match parse(body) {
        Ok(b) => b,
        Err(r) => return r.answer(),
    };
    if let Err(r) = python(b.language.as_deref()) {
        return r.answer();
    }
    if b.env_vars.as_ref().is_some_and(|e| !e.is_empty()) {
        let m = "envs are not supported by pycell: a cell runs in its session's environment (set os.environ in code)";
        return error(StatusCode::BAD_REQUEST, m);
    }
    let Some(session) = s.context_session(b.context_id.as_deref()) else {
        let id = b.context_id.unwrap_or_default();
        return error(StatusCode::NOT_FOUND, &format!("context {id} not found"));
    };
    let permit = match e2b.permit(s) {
        Ok(p) => p,
        Err(m) => return error(StatusCode::TOO_MANY_REQUESTS, &m),
    };
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<Bytes>();
    let cancel = CancellationToken::new();
    let (out, lines) = (tx.clone(), Arc::new(Lines::default()));
    let taken = Arc::clone(&lines);
    let sink: OutputSink = Arc::new(move |stream, bytes| {
        if let Some(ready) = taken.take(stream, bytes) {
            let _ = out.send(line(&output_line(stream, &ready)));
        }
    });
    let (e2b, s, stop) = (Arc::clone(e2b), Arc::clone(s), cancel.clone());
    tokio::spawn(async move {
        let _permit = permit;
        let call = SessionCall::Cell {
            code: shell_escapes(&b.code),
        };
        let answer = e2b
            .service_of(&s)
            .session_call_watched(&session, call, None, stop, Some(sink))
            .await;
        if let Ok(a) = &answer {
            for (stream, whole) in [(Stream::Stdout, &a.stdout), (Stream::Stderr, &a.stderr)] {
                if let Some(rest) = lines.finish(stream, whole) {
                    let _ = tx.send(line(&output_line(stream, &rest)));
                }
            }
        }
        for l in answer_lines(&answer) {
            let _ = tx.send(line(&l));
        }
        if is_gone(&answer) && s.session().as_ref() == Some(&session) {
            e2b.gone(&s).await;
        }
    });
    streamed(StatusCode::OK, "application/x-ndjson", rx, cancel)
}

/// `code` with IPython's shell escapes (a line `!cmd`, or `%pip ...` and
/// `%sh ...`), which E2B's interpreter runs, as the same commands run by
/// the jail's shell from Python (a line that starts with `!` is never
/// Python; one inside a multi-line string is changed too).
fn shell_escapes(code: &str) -> String {
    if !code.lines().any(|l| escaped_command(l).is_some()) {
        return code.to_string();
    }
    let mut out = String::with_capacity(code.len() + 64);
    for l in code.split_inclusive('\n') {
        let body = l.trim_end_matches(['\n', '\r']);
        match escaped_command(body) {
            Some((indent, command)) => {
                // A JSON string is a Python string literal.
                let literal = serde_json::Value::String(command.to_string());
                out.push_str(&format!(
                    "{indent}__import__('subprocess').run({literal}, shell=True)"
                ));
                out.push_str(&l[body.len()..]);
            }
            None => out.push_str(l),
        }
    }
    out
}

/// A shell escape's indentation and command.
fn escaped_command(line: &str) -> Option<(&str, &str)> {
    let rest = line.trim_start();
    let indent = &line[..line.len() - rest.len()];
    let command = match rest.strip_prefix('!') {
        Some(c) => c,
        None => ["%pip ", "%sh "].iter().find_map(|m| {
            rest.strip_prefix(m)
                .map(|c| if *m == "%pip " { &rest[1..] } else { c })
        })?,
    };
    Some((indent, command.trim()))
}

/// Whether a call found its session over.
pub(super) fn is_gone<T>(answer: &Result<T, SessionFailure>) -> bool {
    matches!(answer, Err(f) if matches!(f.code, FailureCode::SessionGone | FailureCode::UnknownSession | FailureCode::SessionKilled))
}

fn line(v: &Value) -> Bytes {
    let mut text = v.to_string();
    text.push('\n');
    Bytes::from(text)
}

/// A chunk of a cell's output as the SDKs read it.
fn output_line(stream: Stream, bytes: &[u8]) -> Value {
    let kind = match stream {
        Stream::Stdout => "stdout",
        Stream::Stderr => "stderr",
    };
    let nanos = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    json!({"type": kind, "text": String::from_utf8_lossy(bytes), "timestamp": nanos as u64})
}

/// What a cell's answer says after its output: its results (what it
/// displayed, its figures, then its value), its error, its number.
fn answer_lines(answer: &Result<SessionAnswer, SessionFailure>) -> Vec<Value> {
    let a = match answer {
        Ok(a) => a,
        Err(f) => {
            let name = format!("PycellError[{}]", f.code.as_str());
            return vec![
                json!({"type": "error", "name": name, "value": f.message, "traceback": f.message}),
            ];
        }
    };
    let r = &a.reply;
    let mut lines: Vec<Value> = r
        .displays
        .iter()
        .filter(|d| d.kind == DisplayKind::Display)
        .map(|d| result_of(d, false))
        .collect();
    lines.extend(r.images.iter().map(|i| {
        let text = format!("<image {} {}x{}>", i.path, i.width, i.height);
        json!({"type": "result", "text": text, "png": i.png, "is_main_result": false})
    }));
    let value = r.displays.iter().find(|d| d.kind == DisplayKind::Value);
    match (value, &r.value) {
        (Some(d), _) => lines.push(result_of(d, true)),
        (None, Some(text)) => {
            lines.push(json!({"type": "result", "text": text, "is_main_result": true}))
        }
        (None, None) => {}
    }
    if let Some(e) = &r.error {
        lines.push(
            json!({"type": "error", "name": e.kind, "value": e.message, "traceback": e.traceback}),
        );
    }
    if let Some(refused) = &r.refused {
        lines.push(json!({"type": "error", "name": "PycellRefused", "value": refused, "traceback": refused}));
    }
    if let Some(n) = r.cell {
        lines.push(json!({"type": "number_of_executions", "execution_count": n}));
    }
    lines
}

/// A display as a result: each MIME part pycell made under E2B's name.
fn result_of(d: &Display, main: bool) -> Value {
    let mut v = json!({"type": "result", "text": d.text, "is_main_result": main});
    let parts = [
        ("html", &d.html),
        ("markdown", &d.markdown),
        ("svg", &d.svg),
        ("png", &d.png),
    ];
    for (name, part) in parts {
        if let Some(p) = part {
            v[name] = json!(p);
        }
    }
    if let Some(j) = d
        .json
        .as_deref()
        .and_then(|j| serde_json::from_str::<Value>(j).ok())
    {
        v["json"] = j;
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(reply: Value) -> SessionAnswer {
        serde_json::from_value(json!({
            "run_id": "r", "policy": "default", "timeout_s": 30.0, "reply": reply,
            "stdout": "", "stderr": "",
            "measure": serde_json::to_value(pycell_wire::events::ReplyMeasure::default()).unwrap(),
        }))
        .unwrap()
    }

    #[test]
    fn a_cells_answer_becomes_results_then_its_error_then_its_number() {
        let a = answer(json!({
            "cell": 3,
            "value": "   a\n0  1",
            "displays": [
                {"kind": "display", "text": "shown", "markdown": "**shown**", "truncated": false},
                {"kind": "value", "text": "   a\n0  1", "html": "<table></table>", "json": "{\"a\": [1]}", "truncated": false}
            ],
            "images": [{"path": "/workspace/figures/cell-3-figure-1.png", "png": "iVBOR", "width": 640, "height": 480}],
        }));
        let lines = answer_lines(&Ok(a));
        let kinds: Vec<_> = lines.iter().map(|l| l["type"].as_str().unwrap()).collect();
        assert_eq!(
            kinds,
            ["result", "result", "result", "number_of_executions"]
        );
        assert_eq!(lines[0]["markdown"], "**shown**");
        assert_eq!(lines[0]["is_main_result"], false);
        assert_eq!(lines[1]["png"], "iVBOR");
        assert_eq!(lines[2]["html"], "<table></table>");
        assert_eq!(lines[2]["json"], json!({"a": [1]}));
        assert_eq!(lines[2]["is_main_result"], true);
        assert_eq!(lines[3]["execution_count"], 3);
    }

    #[test]
    fn an_exception_and_a_lost_session_are_errors() {
        let a = answer(json!({
            "cell": 1,
            "error": {"type": "ZeroDivisionError", "message": "division by zero", "traceback": "Traceback...\nZeroDivisionError: division by zero\n"},
        }));
        let lines = answer_lines(&Ok(a));
        assert_eq!(lines[0]["type"], "error");
        assert_eq!(lines[0]["name"], "ZeroDivisionError");
        assert_eq!(lines[0]["value"], "division by zero");
        let gone = Err(SessionFailure::new(FailureCode::SessionGone, "it ended"));
        assert!(is_gone(&gone));
        let lines = answer_lines(&gone);
        assert_eq!(lines[0]["name"], "PycellError[session_gone]");
    }

    #[test]
    fn ipython_shell_escapes_become_shell_commands_and_python_is_untouched() {
        let plain = "x = 1\nif x != 2:\n    print(x)\n";
        assert_eq!(shell_escapes(plain), plain);
        let code = "import os\n!pip install numpy\nfor i in range(2):\n    !echo \"$HOME\" 'a'\n%pip list\n";
        assert_eq!(
            shell_escapes(code),
            "import os\n__import__('subprocess').run(\"pip install numpy\", shell=True)\nfor i in range(2):\n    __import__('subprocess').run(\"echo \\\"$HOME\\\" 'a'\", shell=True)\n__import__('subprocess').run(\"pip list\", shell=True)\n"
        );
    }

    #[test]
    fn output_is_told_by_stream_with_a_timestamp_in_nanoseconds() {
        let l = output_line(Stream::Stderr, b"oops\n");
        assert_eq!(l["type"], "stderr");
        assert_eq!(l["text"], "oops\n");
        assert!(l["timestamp"].as_u64().unwrap() > 1_600_000_000_000_000_000);
    }
}
