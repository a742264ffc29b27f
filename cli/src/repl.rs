//! `pycell repl`: an interactive Python prompt whose every line (or block)
//! runs as the next cell of a session: in pycelld if one answers, else
//! held by this process (embedded, as root), through the same sessions
//! `pycell mcp` uses. Line editing and history are rustyline's; the
//! history file is ~/.pycell_history.

use std::time::Duration;

use pycell_protocol::session::SessionCall;
use pycell_wire::codes::FailureCode;
use rustyline::error::ReadlineError;
use rustyline::DefaultEditor;
use tokio_util::sync::CancellationToken;

use crate::cli::ReplArgs;
use crate::session_cmd::{show_cell, start_request};
use pycell_engine::service::{Backend, RunService};

/// Exit status when the session could not start or was killed.
const FAILED: i32 = 125;

pub fn main(args: &ReplArgs) -> i32 {
    if let Some(s) = &args.socket {
        std::env::set_var("PYCELL_SOCKET", s);
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .thread_name("pycell-repl")
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("pycell repl: cannot start the async runtime: {e}");
            return 1;
        }
    };
    runtime.block_on(repl(args))
}

async fn repl(args: &ReplArgs) -> i32 {
    let req = match start_request(&args.how) {
        Ok(r) => r,
        Err(m) => {
            eprintln!("pycell repl: {m}");
            return 2;
        }
    };
    let sandboxes = RunService::new(Backend::choose(args.embedded, args.socket.clone()), None);
    let info = match sandboxes.start_session(req).await {
        Ok(i) => i,
        Err(f) => {
            eprintln!(
                "pycell repl: the session did not start ({}): {}",
                f.code, f.message
            );
            return FAILED;
        }
    };
    eprintln!(
        "Python in a pycell sandbox ({} mode): session {}, policy {}, sandbox uid {}. ^C interrupts a cell, ^D ends the session.",
        sandboxes.mode(),
        info.session,
        info.policy,
        info.sandbox_uid
    );
    let status = prompt_loop(&sandboxes, &info.session).await;
    let _ = sandboxes.end_session(&info.session).await;
    sandboxes.shutdown(Duration::from_secs(10)).await;
    status
}

/// Read cells and run them until ^D (0) or the session is over (125).
async fn prompt_loop(sandboxes: &RunService, session: &str) -> i32 {
    let Ok(mut editor) = DefaultEditor::new() else {
        eprintln!("pycell repl: cannot set up line editing");
        return FAILED;
    };
    let history =
        std::env::var_os("HOME").map(|h| std::path::PathBuf::from(h).join(".pycell_history"));
    if let Some(h) = &history {
        let _ = editor.load_history(h);
    }
    let status = loop {
        let (back, read) = match tokio::task::spawn_blocking(move || read_cell(editor)).await {
            Ok(r) => r,
            // The line editor panicked: no history to save.
            Err(_) => return FAILED,
        };
        editor = back;
        let code = match read {
            Read::Cell(code) => code,
            Read::Interrupted => {
                eprintln!("KeyboardInterrupt");
                continue;
            }
            Read::End => break 0,
        };
        let _ = editor.add_history_entry(code.trim_end());
        match run_cell(sandboxes, session, code).await {
            Ok(()) => {}
            Err(message) => {
                eprintln!("pycell repl: {message}");
                break FAILED;
            }
        }
    };
    if let Some(h) = &history {
        let _ = editor.save_history(h);
    }
    status
}

/// Run one cell, ^C interrupting it; `Err` if the session is over.
async fn run_cell(sandboxes: &RunService, session: &str, code: String) -> Result<(), String> {
    let cancel = CancellationToken::new();
    let call = sandboxes.session_call(session, SessionCall::Cell { code }, None, cancel.clone());
    tokio::pin!(call);
    let answered = loop {
        tokio::select! {
            a = &mut call => break a,
            _ = tokio::signal::ctrl_c() => cancel.cancel(),
        }
    };
    match answered {
        Ok(a) => {
            show_cell(&a);
            Ok(())
        }
        Err(f)
            if matches!(
                f.code,
                FailureCode::SessionKilled | FailureCode::SessionGone
            ) =>
        {
            Err(f.message)
        }
        Err(f) => {
            eprintln!("pycell repl ({}): {}", f.code, f.message);
            Ok(())
        }
    }
}

/// What the prompt read.
enum Read {
    Cell(String),
    Interrupted,
    End,
}

/// A cell: one line, or, when it opens a block or leaves a bracket or a
/// triple quote open, the lines that follow until it is complete (a block
/// ends at an empty line), as python's prompt reads them.
fn read_cell(mut editor: DefaultEditor) -> (DefaultEditor, Read) {
    let mut code = String::new();
    let mut prompt = ">>> ";
    loop {
        match editor.readline(prompt) {
            Ok(line) => {
                let blank = line.trim().is_empty();
                code.push_str(&line);
                code.push('\n');
                let done = match prompt {
                    ">>> " => !needs_more(&code),
                    _ => blank && !open_brackets(&code),
                };
                if done {
                    return (editor, Read::Cell(code));
                }
                prompt = "... ";
            }
            Err(ReadlineError::Interrupted) => return (editor, Read::Interrupted),
            Err(ReadlineError::Eof) if code.is_empty() => return (editor, Read::End),
            Err(ReadlineError::Eof) => return (editor, Read::Cell(code)),
            Err(_) => return (editor, Read::End),
        }
    }
}

/// Whether a first line asks for more: it opens a block (ends with `:`),
/// continues with a backslash, or leaves a bracket or triple quote open.
fn needs_more(code: &str) -> bool {
    let last = code.trim_end();
    last.ends_with(':') || last.ends_with('\\') || open_brackets(code)
}

/// Whether brackets or a triple-quoted string are still open in `code`
/// (strings and comments are skipped; good enough for a prompt: python
/// itself reports what is really wrong).
fn open_brackets(code: &str) -> bool {
    let b = code.as_bytes();
    let (mut depth, mut i) = (0i32, 0usize);
    while i < b.len() {
        match b[i] {
            b'#' => {
                while i < b.len() && b[i] != b'\n' {
                    i += 1;
                }
            }
            q @ (b'\'' | b'"') => {
                let triple = b.get(i..i + 3) == Some(&[q, q, q][..]);
                let close = if triple { vec![q, q, q] } else { vec![q] };
                i += close.len();
                loop {
                    if i >= b.len() {
                        return triple;
                    }
                    if b[i] == b'\\' {
                        i += 2;
                        continue;
                    }
                    if !triple && b[i] == b'\n' {
                        break;
                    }
                    if b[i..].starts_with(&close) {
                        i += close.len() - 1;
                        break;
                    }
                    i += 1;
                }
            }
            b'(' | b'[' | b'{' => depth += 1,
            b')' | b']' | b'}' => depth -= 1,
            _ => {}
        }
        i += 1;
    }
    depth > 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_prompt_asks_for_more_as_python_does() {
        assert!(!needs_more("x = 41\n"));
        assert!(needs_more("def f():\n"));
        assert!(needs_more("for i in range(3):  \n"));
        assert!(needs_more("x = [1,\n"));
        assert!(needs_more("s = \"\"\"doc\n"));
        assert!(needs_more("x = 1 + \\\n"));
        assert!(!needs_more("print('(')  # [\n"));
        assert!(!needs_more("s = '''one line'''\n"));
        assert!(open_brackets("f(a,\n  b\n"));
        assert!(!open_brackets("f(a,\n  b)\n"));
    }
}
