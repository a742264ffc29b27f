//! `pycell session ...`: sessions in pycelld from the command line. A
//! session outlives one command, so it needs the daemon (`pycell repl`
//! does not: it holds its session for as long as it runs).

use std::io::{Read, Write};
use std::path::Path;

use base64::Engine;
use pycell_engine::service::Backend;
use pycell_protocol::client::{ClientError, DaemonClient};
use pycell_protocol::messages::LimitOverrides;
use pycell_protocol::session::{SessionAnswer, SessionCall, SessionStartRequest};

use crate::cli::{SessionArgs, SessionCommand, SessionStartArgs};
use crate::say::say;

/// Exit status of a refused call (as `pycell run`'s refused runs).
const REFUSED: i32 = 125;

/// The session start request the flags describe.
pub fn start_request(how: &SessionStartArgs) -> Result<SessionStartRequest, String> {
    let memory_bytes = how
        .memory
        .as_deref()
        .map(|m| pycell_policy::parse_size(m).map_err(|e| format!("--memory {m:?}: {e}")))
        .transpose()?;
    let timeout_s = how
        .timeout
        .as_deref()
        .map(|t| {
            pycell_policy::parse_duration(t)
                .map(|d| d.as_secs_f64())
                .map_err(|e| format!("--timeout {t:?}: {e}"))
        })
        .transpose()?;
    if let Some(id) = &how.from_snapshot {
        return Ok(SessionStartRequest {
            from_snapshot: Some(id.clone()),
            ..SessionStartRequest::default()
        });
    }
    Ok(SessionStartRequest {
        policy: Some(how.policy.clone()),
        limits: LimitOverrides {
            timeout_s,
            memory_bytes,
            ..LimitOverrides::default()
        },
        dependencies: how.with.clone(),
        tools: None,
        from_snapshot: None,
    })
}

pub fn main(args: &SessionArgs) -> i32 {
    let Some(socket) = Backend::choose_now(false, args.daemon.socket.clone()) else {
        eprintln!("pycell session: no pycelld here (no --socket, no PYCELL_SOCKET, no /run/pycell/pycell.sock): a session outlives one command, so it lives in pycelld; without it, `pycell repl` holds a session for as long as it runs");
        return REFUSED;
    };
    let mut client = match DaemonClient::connect(&socket) {
        Ok(c) => c,
        Err(e) => return refused(&e),
    };
    match run(&mut client, &args.command) {
        Ok(code) => code,
        Err(Failure::Client(e)) => refused(&e),
        Err(Failure::Local(m)) => {
            eprintln!("pycell session: {m}");
            REFUSED
        }
    }
}

enum Failure {
    Client(ClientError),
    Local(String),
}

impl From<ClientError> for Failure {
    fn from(e: ClientError) -> Failure {
        Failure::Client(e)
    }
}

fn refused(e: &ClientError) -> i32 {
    eprintln!("pycell session: {e}");
    REFUSED
}

fn run(c: &mut DaemonClient, command: &SessionCommand) -> Result<i32, Failure> {
    match command {
        SessionCommand::Start { how, json } => {
            let req = start_request(how).map_err(Failure::Local)?;
            let info = c.session_start(req, |stage| {
                if let pycell_protocol::client::Stage::Installing(m) = stage {
                    eprintln!("pycell: installing dependencies: {m}");
                }
            })?;
            match json {
                true => say!("{}", serde_json::to_string(&info).unwrap_or_default()),
                false => say!("{}", info.session),
            }
            Ok(0)
        }
        SessionCommand::Run {
            session,
            file,
            code,
            timeout,
            json,
        } => {
            let code = match (code, file) {
                (Some(c), _) => c.clone(),
                (None, Some(f)) => read_code(f).map_err(Failure::Local)?,
                (None, None) => return Err(Failure::Local("give a file, \"-\" or --code".into())),
            };
            let a = c.session_call(session, SessionCall::Cell { code }, *timeout)?;
            if *json {
                say!("{}", serde_json::to_string(&a).unwrap_or_default());
                return Ok(cell_status(&a));
            }
            Ok(show_cell(&a))
        }
        SessionCommand::Put {
            session,
            local,
            remote,
        } => put(c, session, local, remote.as_deref()),
        SessionCommand::Get {
            session,
            remote,
            local,
        } => get(c, session, remote, local.as_deref()),
        SessionCommand::Ls { session, path } => {
            let a = c.session_call(session, SessionCall::List { path: path.clone() }, None)?;
            if let Some(why) = a.reply.refused {
                return Err(Failure::Local(why));
            }
            for e in &a.reply.entries {
                let slash = if e.kind == "directory" { "/" } else { "" };
                say!("{:>10}  {}{slash}", e.size, e.name);
            }
            Ok(0)
        }
        SessionCommand::End { session } => {
            let e = c.session_end(session)?;
            say!("{}: {}", e.session, e.message);
            Ok(0)
        }
        SessionCommand::Snapshot { session, json } => snapshot(c, session, *json),
        SessionCommand::Fork { session, json } => fork(c, session, *json),
        SessionCommand::List { json } => {
            let list = c.session_list()?;
            if *json {
                say!("{}", serde_json::to_string(&list).unwrap_or_default());
                return Ok(0);
            }
            for s in &list {
                say!(
                    "{}  {}  started {:.0} s ago, idle {:.0} s",
                    s.session,
                    s.policy,
                    s.age_s,
                    s.idle_s
                );
            }
            Ok(0)
        }
    }
}

/// `pycell session snapshot`: the id on stdout (or the whole as JSON),
/// what was not kept on stderr.
fn snapshot(c: &mut DaemonClient, session: &str, json: bool) -> Result<i32, Failure> {
    let s = c.session_snapshot(session)?;
    match json {
        true => say!("{}", serde_json::to_string(&s).unwrap_or_default()),
        false => say!("{}", s.snapshot),
    }
    for (name, why) in s.dropped.iter().chain(&s.skipped) {
        eprintln!("pycell: not kept: {name}: {why}");
    }
    Ok(0)
}

/// `pycell session fork`.
fn fork(c: &mut DaemonClient, session: &str, json: bool) -> Result<i32, Failure> {
    let fork = c.session_fork(session, |_| {})?;
    match json {
        true => say!("{}", serde_json::to_string(&fork).unwrap_or_default()),
        false => show_fork(&fork),
    }
    Ok(0)
}

/// The new handle on stdout; what was not carried on stderr.
fn show_fork(f: &pycell_protocol::session::SessionForkInfo) {
    say!("{}", f.session.session);
    let names = f.dropped.iter().chain(&f.skipped);
    for (name, why) in names {
        eprintln!("pycell: not carried: {name}: {why}");
    }
    if !f.reseeded.is_empty() {
        eprintln!("pycell: reseeded: {}", f.reseeded.join(", "));
    }
    if !f.threads_not_carried.is_empty() {
        let threads = f.threads_not_carried.join(", ");
        eprintln!("pycell: threads not carried: {threads}");
    }
}

fn read_code(f: &Path) -> Result<String, String> {
    let mut code = String::new();
    let read = match f == Path::new("-") {
        true => std::io::stdin().read_to_string(&mut code),
        false => std::fs::File::open(f).and_then(|mut h| h.read_to_string(&mut code)),
    };
    read.map_err(|e| format!("reading {}: {e}", f.display()))?;
    Ok(code)
}

fn put(
    c: &mut DaemonClient,
    session: &str,
    local: &Path,
    remote: Option<&str>,
) -> Result<i32, Failure> {
    let bytes = std::fs::read(local)
        .map_err(|e| Failure::Local(format!("reading {}: {e}", local.display())))?;
    let name = local
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let path = remote.map_or(name, str::to_string);
    let data_base64 = base64::engine::general_purpose::STANDARD.encode(&bytes);
    let a = c.session_call(session, SessionCall::Write { path, data_base64 }, None)?;
    match a.reply.refused {
        Some(why) => Err(Failure::Local(why)),
        None => {
            eprintln!(
                "{} ({} bytes)",
                a.reply.path.unwrap_or_default(),
                a.reply.size.unwrap_or(0)
            );
            Ok(0)
        }
    }
}

fn get(
    c: &mut DaemonClient,
    session: &str,
    remote: &str,
    local: Option<&Path>,
) -> Result<i32, Failure> {
    let a = c.session_call(
        session,
        SessionCall::Read {
            path: remote.to_string(),
        },
        None,
    )?;
    if let Some(why) = a.reply.refused {
        return Err(Failure::Local(why));
    }
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(a.reply.data.unwrap_or_default())
        .map_err(|e| Failure::Local(format!("the session sent bytes that are not base64: {e}")))?;
    let written = match local.filter(|l| *l != Path::new("-")) {
        Some(l) => std::fs::write(l, &bytes),
        None => std::io::stdout().lock().write_all(&bytes),
    };
    written.map_err(|e| Failure::Local(format!("writing the file: {e}")))?;
    Ok(0)
}

/// A cell's exit status: 0, 1 if it raised, 124 if it was interrupted at
/// its timeout, 125 if the session refused it.
pub fn cell_status(a: &SessionAnswer) -> i32 {
    match (&a.reply.refused, a.measure.interrupted, &a.reply.error) {
        (Some(_), _, _) => REFUSED,
        (None, true, _) => 124,
        (None, false, Some(_)) => 1,
        (None, false, None) => 0,
    }
}

/// Show a cell's answer as python's prompt would: its output, what it
/// showed with `display()`, its value's text, its traceback on stderr.
/// Returns [`cell_status`].
pub fn show_cell(a: &SessionAnswer) -> i32 {
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(a.stdout.as_bytes());
    if let Some(t) = &a.measure.stdout_tail {
        let _ = writeln!(out, "[... {} bytes not kept here ...]", t.skipped_bytes);
        let _ = out.write_all(t.tail.as_bytes());
    }
    for d in &a.reply.displays {
        if d.kind == pycell_wire::report::DisplayKind::Display {
            let _ = writeln!(out, "{}", d.text);
        }
    }
    if let Some(v) = &a.reply.value {
        let _ = writeln!(out, "{v}");
    }
    let _ = out.flush();
    let mut err = std::io::stderr().lock();
    let _ = err.write_all(a.stderr.as_bytes());
    if let Some(t) = &a.measure.stderr_tail {
        let _ = writeln!(err, "[... {} bytes not kept here ...]", t.skipped_bytes);
        let _ = err.write_all(t.tail.as_bytes());
    }
    let tails = [&a.measure.stdout_tail, &a.measure.stderr_tail];
    for file in tails
        .into_iter()
        .flatten()
        .filter_map(|t| t.rest_file.as_ref())
    {
        let _ = writeln!(err, "pycell: the output past the cap is whole in {file}");
    }
    if let Some(e) = &a.reply.error {
        let _ = err.write_all(e.traceback.as_bytes());
    }
    if let Some(why) = &a.reply.refused {
        let _ = writeln!(err, "pycell: {why}");
    }
    if let Some(f) = &a.reply.value_file {
        let _ = writeln!(err, "pycell: the value was cut; the whole value is in {f}");
    }
    for refusal in &a.refusals {
        let _ = writeln!(err, "pycell: {}", refusal.line());
    }
    for i in &a.reply.images {
        let _ = writeln!(
            err,
            "pycell: figure saved as {} (pycell session get to fetch it)",
            i.path
        );
    }
    cell_status(a)
}
