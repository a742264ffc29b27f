//! `pycell run`: turn the flags into a [`RunRequest`] and run it through
//! the run service, which sends it to pycelld (a socket is configured or
//! listening) or runs it embedded (this needs root). The output streams
//! through as it arrives, or is collected for `--json`; the exit status is
//! the run's.

use std::io::{self, Read, Write};
use std::path::Path;
use std::sync::Arc;

use pycell_engine::local::{self, EmbeddedRun};
use pycell_engine::service::{Backend, Options, RunEvent, RunService};
use pycell_engine::tool_source::ToolSource;
use pycell_launch::launcher::Prepared;
use pycell_protocol::messages::{LimitOverrides, RunRequest};
use pycell_protocol::result::RunResult;
use pycell_wire::codes::{FailureCode, Layer};
use pycell_wire::events::Stream;
use pycell_wire::report::{JailFailure, RunStatus};
use pycell_wire::timings::{self, Recorder};

use crate::cli::RunArgs;
use crate::say::say;

/// When this process started, for `--timings`.
pub(crate) static STARTED_US: std::sync::OnceLock<u64> = std::sync::OnceLock::new();

/// Largest script or stdin we accept from the command line.
const MAX_INPUT: u64 = pycell_protocol::messages::MAX_CODE_BYTES as u64;

fn read_bounded(what: &str, r: impl Read) -> Result<Vec<u8>, String> {
    let mut buf = Vec::new();
    r.take(MAX_INPUT + 1)
        .read_to_end(&mut buf)
        .map_err(|e| format!("reading {what}: {e}"))?;
    if buf.len() as u64 > MAX_INPUT {
        return Err(format!("{what} is larger than {} MiB", MAX_INPUT >> 20));
    }
    Ok(buf)
}

fn read_file(what: &str, path: &Path) -> Result<Vec<u8>, String> {
    let f = std::fs::File::open(path)
        .map_err(|e| format!("cannot read {what}{}: {e}", path.display()))?;
    read_bounded(&path.display().to_string(), f)
}

fn size_flag(flag: &str, v: &Option<String>) -> Result<Option<u64>, String> {
    v.as_deref()
        .map(|s| pycell_policy::parse_size(s).map_err(|e| format!("--{flag} {s:?}: {e}")))
        .transpose()
}

fn limit_flags(args: &RunArgs) -> Result<LimitOverrides, String> {
    let timeout_s = match &args.timeout {
        None => None,
        Some(t) => Some(
            pycell_policy::parse_duration(t)
                .map_err(|e| format!("--timeout {t:?}: {e}"))?
                .as_secs_f64(),
        ),
    };
    Ok(LimitOverrides {
        timeout_s,
        memory_bytes: size_flag("memory", &args.memory)?,
        pids: args.pids,
        disk_bytes: size_flag("disk", &args.disk)?,
        max_output_bytes: size_flag("max-output", &args.max_output)?,
    })
}

/// The request the flags describe (the same shape a daemon client sends).
/// The code of `script` ("-": stdin), which must be UTF-8.
pub(crate) fn read_code(script: &Path) -> Result<String, String> {
    let code = match script == Path::new("-") {
        true => read_bounded("the code from stdin", io::stdin().lock())?,
        false => read_file("", script)?,
    };
    String::from_utf8(code)
        .map_err(|_| "the code is not valid UTF-8 (Python source must be)".to_string())
}

fn request(args: &RunArgs) -> Result<RunRequest, String> {
    let from_stdin = args.script == Path::new("-");
    let code = read_code(&args.script)?;
    let stdin = match &args.input {
        None => Vec::new(),
        Some(p) if p == Path::new("-") && from_stdin => {
            return Err("--input - and a script on stdin cannot both use stdin".into())
        }
        Some(p) if p == Path::new("-") => read_bounded("stdin", io::stdin().lock())?,
        Some(p) => read_file("--input ", p)?,
    };
    let mut req = RunRequest {
        code,
        filename: (!from_stdin).then(|| args.script.to_string_lossy().into_owned()),
        args: args.script_args.clone(),
        stdin_base64: None,
        policy: Some(args.policy.clone()),
        limits: limit_flags(args)?,
        dependencies: listed_dependencies(args.requirements.as_deref(), &args.with)?,
        files: Vec::new(),
        tools: None,
        ..RunRequest::default()
    };
    req.set_stdin(&stdin);
    Ok(req)
}

/// `--requirements FILE` (each line checked), then every `--with`.
pub(crate) fn listed_dependencies(
    requirements: Option<&Path>,
    with: &[String],
) -> Result<Vec<String>, String> {
    let mut deps = Vec::new();
    if let Some(path) = requirements {
        let text = read_file("--requirements ", path)?;
        let text = String::from_utf8(text)
            .map_err(|_| format!("--requirements {}: not UTF-8 text", path.display()))?;
        deps = pycell_deps::requirements_file(&text, &path.display().to_string())
            .map_err(|m| format!("--requirements {m}"))?;
    }
    deps.extend(with.iter().cloned());
    Ok(deps)
}

pub(crate) fn request_failure(message: String) -> JailFailure {
    JailFailure::new(FailureCode::InvalidRequest, Layer::Request, message)
}

fn embedded_run(args: &RunArgs) -> Result<EmbeddedRun, JailFailure> {
    let req = request(args).map_err(request_failure)?;
    EmbeddedRun::new(&args.policy, req)
}

/// An embedded run, prepared (policy, request, uid lease, spec), or why
/// not; without its dependencies' env.
fn prepare_embedded(args: &RunArgs) -> Result<Prepared, JailFailure> {
    let run = embedded_run(args)?;
    run.launcher
        .prepare(&run.policy, &run.req)
        .map_err(|e| e.failure())
}

/// `pycell debug spec`: the spec the jailer would get (with a uid lease
/// taken and given back, so it needs root like a run).
pub fn print_spec(args: &RunArgs) -> i32 {
    match prepare_embedded(args) {
        Ok(p) => {
            // Without the descriptors a launcher attaches when it starts
            // the jailer: the spec as given on a pipe (none can come).
            let mut spec = p.spec().clone();
            spec.descriptors.clear();
            say!(
                "{}",
                serde_json::to_string_pretty(&spec).unwrap_or_default()
            );
            0
        }
        Err(f) => {
            eprintln!("pycell: {}", f.message);
            125
        }
    }
}

pub fn main(args: &RunArgs) -> i32 {
    if args.timings {
        let started = *STARTED_US.get_or_init(timings::now_us);
        OUR_MARKS.keep("pycell: started", started);
    }
    let mut result = run(args);
    if args.timings {
        add_our_timings(&mut result);
    }
    emit(args.json, &result);
    if args.timings && !args.json {
        eprint!(
            "pycell: where the run's time went\n{}",
            timings::table(&result.timings)
        );
    }
    result.process_exit_code()
}

/// Our own marks added to the jailer's and the jail's.
fn add_our_timings(result: &mut RunResult) {
    OUR_MARKS.mark("pycell: result in hand");
    result.timings.extend(OUR_MARKS.take());
    result.timings.sort_by_key(|m| m.at_us);
}

/// This process's marks: kept for `--timings` only.
static OUR_MARKS: Recorder = Recorder::new();

fn refused(policy: &str, f: JailFailure) -> RunResult {
    RunResult::refused("", policy, f)
}

/// The run, through the run service: to pycelld (a socket is configured
/// or listening) or embedded (`--embedded`, `--timings`, or no pycelld).
fn run(args: &RunArgs) -> RunResult {
    let policy = args.policy.as_str();
    let req = match request(args) {
        Ok(r) => r,
        Err(m) => return refused(policy, request_failure(m)),
    };
    OUR_MARKS.mark("pycell: request read");
    let internal = |what: &str, e: &dyn std::fmt::Display| {
        let f = JailFailure::new(FailureCode::Internal, Layer::Jailer, format!("{what}: {e}"));
        refused(policy, f)
    };
    // Before any thread exists, so that every thread has them blocked.
    let signals = match local::command_line_signals(false) {
        Ok(s) => s,
        Err(e) => return internal("signalfd", &e),
    };
    let rt = match local::runtime_on_this_thread() {
        Ok(rt) => rt,
        Err(e) => return internal("starting a runtime", &e),
    };
    let tools = match args.tool_servers.as_deref().map(load_tool_servers) {
        Some(Err(f)) => return refused(policy, f),
        Some(Ok(servers)) => Some(servers),
        None => None,
    };
    let options = Options {
        policy_files: true,
        timings: args.timings,
        ctrl_c: Some(signals.ctrl_c),
        ..Options::default()
    };
    // --timings measures this process's own jailer: embedded.
    let backend = Backend::choose(args.embedded || args.timings, args.socket.clone());
    let service = RunService::with_options(backend, tools.clone(), options);
    OUR_MARKS.mark("pycell: signal thread and runtime started");
    let result = rt.block_on(service.run(req, on_event(args), signals.stop));
    if let Some(servers) = tools {
        rt.block_on(servers.shutdown());
    }
    result.unwrap_or_else(|e| refused(policy, e.failure()))
}

/// What `pycell run` does with a run's events: shows the output as it
/// arrives (unless `--json`, whose result carries it), says where in the
/// queue a run waits for more than a second and what an install does, on
/// stderr, and marks our steps for `--timings`.
fn on_event(args: &RunArgs) -> impl FnMut(RunEvent<'_>) + Send + '_ {
    let mut queue = QueueNotice::new();
    move |event| match event {
        RunEvent::Output { stream, bytes } if !args.json => show(stream, bytes),
        RunEvent::Output { .. } | RunEvent::Started { .. } => {}
        RunEvent::Queued { position } => queue.update(position),
        RunEvent::Installing { message } => eprintln!("pycell: {message}"),
        RunEvent::Step { what } if args.timings => OUR_MARKS.mark(what),
        RunEvent::Step { .. } => {}
    }
}

/// Tells the user on stderr that their run waits for a slot, once it has
/// waited a second, and again whenever its place changes (the daemon sends
/// the place every second while the run waits).
struct QueueNotice {
    since: std::time::Instant,
    said: Option<usize>,
}

impl QueueNotice {
    fn new() -> QueueNotice {
        QueueNotice {
            since: std::time::Instant::now(),
            said: None,
        }
    }

    fn update(&mut self, position: usize) {
        let waited = self.since.elapsed() >= std::time::Duration::from_secs(1);
        if position > 0 && waited && self.said != Some(position) {
            self.said = Some(position);
            eprintln!("pycell: waiting for a free sandbox slot: number {position} in the queue");
        }
    }
}

/// Our own output, as the program's arrives. A closed terminal or pipe on
/// our side must not stop the run.
fn show(stream: Stream, bytes: &[u8]) {
    let _ = match stream {
        Stream::Stdout => io::stdout()
            .lock()
            .write_all(bytes)
            .and_then(|()| io::stdout().flush()),
        Stream::Stderr => io::stderr().lock().write_all(bytes),
    };
}

/// The client's tool servers (`--tool-servers`).
type Servers = Arc<dyn ToolSource>;

/// `--tool-servers FILE`'s servers (nothing started yet).
fn load_tool_servers(path: &Path) -> Result<Servers, JailFailure> {
    #[cfg(feature = "mcp")]
    let loaded = pycell_mcp::tool_servers::ToolServers::load(path)
        .map(|s| Arc::new(s) as Arc<dyn ToolSource>)
        .map_err(|m| format!("--tool-servers {m}"));
    #[cfg(not(feature = "mcp"))]
    let loaded = Err(format!(
        "--tool-servers {}: this pycell was built without MCP (cargo feature `mcp`), which tool servers need; build it with its default features",
        path.display()
    ));
    loaded.map_err(request_failure)
}

/// Print the result: one JSON object, or (streaming mode, where the output
/// has already been shown) the text of what it showed with `display()`,
/// then one `pycell: ...` line when the run did not end ok.
pub fn emit(json: bool, r: &RunResult) {
    if json {
        match serde_json::to_string(r) {
            Ok(s) => say!("{s}"),
            Err(e) => eprintln!("pycell: cannot encode the result: {e}"),
        }
        return;
    }
    if let Some(t) = &r.stdout_tail {
        eprintln!(
            "pycell: [... {} bytes of stdout past the output cap were not kept; its last {} follow]",
            t.skipped_bytes,
            t.tail.len()
        );
        let _ = std::io::Write::write_all(&mut std::io::stdout().lock(), t.tail.as_bytes());
    }
    if let Some(t) = &r.stderr_tail {
        eprintln!(
            "pycell: [... {} bytes of stderr past the output cap were not kept; its last {} follow]",
            t.skipped_bytes,
            t.tail.len()
        );
        let _ = std::io::Write::write_all(&mut std::io::stderr().lock(), t.tail.as_bytes());
    }
    for d in &r.displays {
        say!("{}", d.text);
    }
    if r.displays_omitted > 0 {
        eprintln!(
            "pycell: {} more displays were not kept (over the policy's [output] bounds)",
            r.displays_omitted
        );
    }
    if let Some(n) = status_note(r) {
        eprintln!("pycell: {n}");
    }
    for refusal in &r.refusals {
        eprintln!("pycell: {}", refusal.line());
    }
    if let Some(n) = &r.network {
        for line in n.failure_notes() {
            eprintln!("pycell: {line}");
        }
    }
}

fn status_note(r: &RunResult) -> Option<String> {
    let word = match r.status {
        RunStatus::Ok => return None,
        RunStatus::Oom => "out of memory",
        other => other.as_str(),
    };
    Some(match (&r.error, &r.termination, r.exit_code, r.signal) {
        (Some(e), _, _, _) => match &e.hint {
            Some(h) => format!("{word} ({}): {} — {h}", e.code, e.message),
            None => format!("{word} ({}): {}", e.code, e.message),
        },
        (None, Some(t), _, _) => format!("{word} ({}): {}", t.reason_str(), t.detail),
        (None, None, _, Some(sig)) => format!("{word}: killed by signal {sig}"),
        (None, None, Some(code), None) => format!("{word}: exit code {code}"),
        (None, None, None, None) => word.to_string(),
    })
}
