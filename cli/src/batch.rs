//! `pycell batch FILE`: many programs, each in a sandbox of its own, as fast
//! as the host allows. One JSON run request per input line (the protocol's
//! `RunRequest`, and an optional `id`); one result line per request, in
//! input order (or as runs end, `--unordered`). `--jobs` workers each take
//! the next line, run it (embedded, through the same path as `pycell run`,
//! or through pycelld, which queues them fairly) and write its result.
//!
//! Memory stays bounded whatever the input's length: lines are read as
//! workers take them, each at most the protocol's largest frame, and in
//! input order no worker takes a line more than a window ahead of the
//! oldest result not yet written.

use std::collections::BTreeMap;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::path::Path;
use std::sync::{Condvar, Mutex};

use pycell_engine::local;
use pycell_engine::service::{Backend, Options, RunService};
use pycell_launch::launcher::PolicyChoice;
use pycell_protocol::messages::{RunRequest, MAX_FRAME};
use pycell_protocol::result::RunResult;
use pycell_wire::codes::{FailureCode, Layer};
use pycell_wire::report::JailFailure;
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use crate::cli::BatchArgs;
use crate::say::say;

/// The longest input line: the protocol's largest message.
const MAX_LINE: usize = MAX_FRAME as usize;

pub fn main(args: &BatchArgs) -> i32 {
    let input: Box<dyn Read + Send> = match args.file == Path::new("-") {
        true => Box::new(io::stdin()),
        false => match std::fs::File::open(&args.file) {
            Ok(f) => Box::new(f),
            Err(e) => {
                eprintln!("pycell: cannot read {}: {e}", args.file.display());
                return 125;
            }
        },
    };
    let jobs = args.jobs.unwrap_or_else(|| {
        std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
    });
    if jobs == 0 {
        eprintln!("pycell: --jobs 0: at least one run must go at once");
        return 125;
    }
    let runs = match Runs::start(args, jobs) {
        Ok(r) => r,
        Err(m) => {
            eprintln!("pycell: {m}");
            return 125;
        }
    };
    let batch = Batch::new(input, jobs, !args.unordered);
    std::thread::scope(|s| {
        for _ in 0..jobs {
            s.spawn(|| batch.work(&runs, &args.policy));
        }
    });
    let state = batch.state.into_inner().unwrap_or_else(|p| p.into_inner());
    if let Some(e) = state.read_error {
        eprintln!("pycell: reading {}: {e}", args.file.display());
        return 125;
    }
    if let Some(e) = state.write_error {
        eprintln!("pycell: writing the results: {e}; the lines after are not run");
        return 125;
    }
    0
}

/// Where the runs go: the run service (to pycelld, or embedded), and
/// what stops them all.
struct Runs {
    service: RunService,
    rt: local::Runtime,
    /// SIGINT, SIGTERM or SIGHUP: every run is killed and no new line is
    /// taken.
    stop: CancellationToken,
}

impl Runs {
    /// Before any thread exists (the signals are blocked in every
    /// thread). With `--zygote`: its zygote, started and ready.
    fn start(args: &BatchArgs, jobs: usize) -> Result<Runs, String> {
        let signals = local::command_line_signals(true).map_err(|e| format!("signalfd: {e}"))?;
        let rt = local::runtime().map_err(|e| format!("starting a runtime: {e}"))?;
        let options = Options {
            policy_files: true,
            max_runs: jobs,
            ..Options::default()
        };
        let backend = Backend::choose(args.embedded, args.socket.clone());
        let service = RunService::with_options(backend, None, options);
        if args.zygote {
            service
                .start_zygote(&args.policy, jobs, rt.handle(), &signals.stop)
                .map_err(|f| format!("starting the zygote: {}", f.message))?;
        }
        Ok(Runs {
            service,
            rt,
            stop: signals.stop,
        })
    }

    fn stopped(&self) -> bool {
        self.stop.is_cancelled()
    }

    fn run(&self, mut req: RunRequest, policy: &str) -> RunResult {
        req.policy.get_or_insert_with(|| policy.to_string());
        let run = self.service.run(req, |_| {}, self.stop.clone());
        self.rt
            .block_on(run)
            .unwrap_or_else(|e| RunResult::refused("", policy, e.failure()))
    }
}

struct State {
    input: BufReader<Box<dyn Read + Send>>,
    /// The number of the next line to read (from 1).
    next_line: usize,
    eof: bool,
    read_error: Option<io::Error>,
    /// Our output could not be written: the batch stops taking lines.
    write_error: Option<io::Error>,
    /// In input order: the line whose result is written next, and the
    /// results that wait for it.
    next_out: usize,
    waiting: BTreeMap<usize, String>,
}

struct Batch {
    state: Mutex<State>,
    changed: Condvar,
    ordered: bool,
    /// In input order, how far ahead of the oldest unwritten result a line
    /// may be taken.
    window: usize,
}

impl Batch {
    fn new(input: Box<dyn Read + Send>, jobs: usize, ordered: bool) -> Batch {
        Batch {
            state: Mutex::new(State {
                input: BufReader::with_capacity(1 << 16, input),
                next_line: 1,
                eof: false,
                read_error: None,
                write_error: None,
                next_out: 1,
                waiting: BTreeMap::new(),
            }),
            changed: Condvar::new(),
            ordered,
            window: jobs.saturating_mul(4),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Take lines and run them until the input ends (or the runs are stopped).
    fn work(&self, runs: &Runs, policy: &str) {
        while let Some((n, line)) = self.take(runs) {
            let result = match line {
                Line::Blank => None,
                Line::Request(bytes) => Some(result_line(n, &bytes, runs, policy)),
                Line::TooLong => Some(refused_line(
                    n,
                    Value::Null,
                    policy,
                    format!("line {n} is longer than {} MiB", MAX_LINE >> 20),
                )),
            };
            self.put(n, result);
        }
    }

    /// The next line and its number, once the window lets us take it.
    fn take(&self, runs: &Runs) -> Option<(usize, Line)> {
        let mut st = self.lock();
        while self.ordered && !st.eof && st.next_line >= st.next_out + self.window {
            st = self.changed.wait(st).unwrap_or_else(|p| p.into_inner());
        }
        if st.eof || runs.stopped() {
            return None;
        }
        match read_line(&mut st.input) {
            Ok(Some(line)) => {
                st.next_line += 1;
                Some((st.next_line - 1, line))
            }
            Ok(None) => {
                st.eof = true;
                self.changed.notify_all();
                None
            }
            Err(e) => {
                st.eof = true;
                st.read_error = Some(e);
                self.changed.notify_all();
                None
            }
        }
    }

    /// Line `n`'s result (none for a blank line), written when its turn
    /// comes. If nothing takes our output any more, no new line is taken.
    fn put(&self, n: usize, result: Option<String>) {
        let mut st = self.lock();
        let mut out = io::stdout().lock();
        let mut written = Ok(());
        if !self.ordered {
            if let Some(r) = result {
                written = writeln!(out, "{r}").and_then(|()| out.flush());
            }
        } else {
            let State {
                waiting, next_out, ..
            } = &mut *st;
            waiting.insert(n, result.unwrap_or_default());
            while let Some(r) = waiting.remove(next_out) {
                if !r.is_empty() && written.is_ok() {
                    written = writeln!(out, "{r}");
                }
                *next_out += 1;
            }
            written = written.and_then(|()| out.flush());
        }
        if let Err(e) = written {
            st.eof = true;
            st.write_error.get_or_insert(e);
        }
        self.changed.notify_all();
    }
}

enum Line {
    Blank,
    Request(Vec<u8>),
    TooLong,
}

/// The next line (without its newline), read in bounded memory; `None` at
/// the end of the input.
fn read_line(input: &mut impl BufRead) -> io::Result<Option<Line>> {
    let mut line = Vec::new();
    let n = input
        .by_ref()
        .take(MAX_LINE as u64 + 1)
        .read_until(b'\n', &mut line)?;
    if n == 0 {
        return Ok(None);
    }
    if line.last() == Some(&b'\n') {
        line.pop();
    } else if line.len() > MAX_LINE {
        // Skip the rest of it, a buffer at a time.
        loop {
            let buf = input.fill_buf()?;
            match buf.iter().position(|b| *b == b'\n') {
                Some(i) => {
                    input.consume(i + 1);
                    break;
                }
                None if buf.is_empty() => break,
                None => {
                    let len = buf.len();
                    input.consume(len);
                }
            }
        }
        return Ok(Some(Line::TooLong));
    }
    Ok(Some(match line.iter().all(u8::is_ascii_whitespace) {
        true => Line::Blank,
        false => Line::Request(line),
    }))
}

/// The request on line `n`, parsed and checked: its id, and the request or
/// why it is none.
fn parse_line(n: usize, bytes: &[u8]) -> (Value, Result<RunRequest, String>) {
    let mut object = match serde_json::from_slice::<Value>(bytes) {
        Ok(Value::Object(o)) => o,
        Ok(_) => return (Value::Null, Err(format!("line {n} is not a JSON object"))),
        Err(e) => return (Value::Null, Err(format!("line {n} is not JSON: {e}"))),
    };
    let id = object.remove("id").unwrap_or(Value::Null);
    let req = serde_json::from_value::<RunRequest>(Value::Object(object))
        .map_err(|e| format!("line {n}: {e}"))
        .and_then(|req| match req.tools {
            Some(_) => Err(format!(
                "line {n}: a batch run cannot call tools (\"tools\"): no client answers them"
            )),
            None => Ok(req),
        })
        .and_then(|req| match req.check_bounds() {
            Ok(()) => Ok(req),
            Err(e) => Err(format!("line {n}: {e}")),
        })
        .and_then(|req| match names_a_policy_file(&req) {
            Some(p) => Err(format!(
                "line {n}: \"policy\" {p:?} is a file path; a line names a policy by name, as pycelld's protocol does (a policy file goes on the command line: --policy FILE)"
            )),
            None => Ok(req),
        });
    (id, req)
}

/// A policy file a line names: a line, often written by a model, never
/// makes pycell read a file as root (only `--policy` may name one).
fn names_a_policy_file(req: &RunRequest) -> Option<&str> {
    let p = req.policy.as_deref()?;
    matches!(PolicyChoice::from_arg(p), PolicyChoice::File(_)).then_some(p)
}

fn result_line(n: usize, bytes: &[u8], runs: &Runs, default_policy: &str) -> String {
    let (id, req) = parse_line(n, bytes);
    let req = match req {
        Ok(r) => r,
        Err(m) => return refused_line(n, id, default_policy, m),
    };
    let policy = req.policy.clone().unwrap_or_else(|| default_policy.into());
    let result = runs.run(req, &policy);
    output_line(n, id, &result)
}

fn refused_line(n: usize, id: Value, policy: &str, message: String) -> String {
    let f = JailFailure::new(FailureCode::InvalidRequest, Layer::Request, message);
    output_line(n, id, &RunResult::refused("", policy, f))
}

fn output_line(n: usize, id: Value, result: &RunResult) -> String {
    let line = serde_json::json!({"line": n, "id": id, "result": result});
    serde_json::to_string(&line).unwrap_or_else(|e| {
        say!("pycell: cannot encode the result of line {n}: {e}");
        String::new()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(input: &str) -> Vec<String> {
        let mut r = io::Cursor::new(input.as_bytes().to_vec());
        let mut out = Vec::new();
        while let Some(l) = read_line(&mut r).unwrap() {
            out.push(match l {
                Line::Blank => "<blank>".to_string(),
                Line::Request(b) => String::from_utf8(b).unwrap(),
                Line::TooLong => "<too long>".to_string(),
            });
        }
        out
    }

    #[test]
    fn lines_are_read_with_blank_ones_kept_for_numbering() {
        assert_eq!(
            lines("{\"a\":1}\n\n  \n{}"),
            ["{\"a\":1}", "<blank>", "<blank>", "{}"]
        );
        assert!(lines("").is_empty());
    }

    #[test]
    fn a_line_over_the_limit_is_skipped_whole_and_reading_goes_on() {
        let input = format!("{}\n{{\"code\":\"\"}}\n", "x".repeat(MAX_LINE + 10));
        assert_eq!(lines(&input), ["<too long>", "{\"code\":\"\"}"]);
    }

    #[test]
    fn a_line_is_a_request_with_an_optional_id_or_says_why_not() {
        let (id, req) = parse_line(
            3,
            br#"{"id": {"task": 7}, "code": "print(1)", "args": ["a"]}"#,
        );
        assert_eq!(id["task"], 7);
        let req = req.unwrap();
        assert_eq!((req.code.as_str(), req.args.len()), ("print(1)", 1));
        let (_, bad) = parse_line(4, br#"{"cod": "print(1)"}"#);
        let bad = bad.unwrap_err();
        assert!(bad.starts_with("line 4:") && bad.contains("cod"), "{bad}");
        assert!(parse_line(5, b"[1]")
            .1
            .unwrap_err()
            .contains("not a JSON object"));
        assert!(parse_line(6, b"{").1.unwrap_err().contains("not JSON"));
        let huge = format!(
            r#"{{"code": "", "args": [{}]}}"#,
            vec!["\"a\""; 2000].join(",")
        );
        assert!(parse_line(7, huge.as_bytes())
            .1
            .unwrap_err()
            .contains("args"));
    }

    #[test]
    fn a_line_names_policies_by_name_never_by_file() {
        for file in ["/etc/shadow", "./mine.toml", "x.toml", "../p"] {
            let line = serde_json::json!({"code": "", "policy": file}).to_string();
            let why = parse_line(8, line.as_bytes()).1.unwrap_err();
            assert!(why.contains("is a file path"), "{file}: {why}");
        }
        let line = br#"{"code": "", "policy": "data-science"}"#;
        assert!(parse_line(9, line).1.is_ok());
    }
}
