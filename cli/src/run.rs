//! `pycell run`: turn the flags into a [`RunRequest`], then either send it
//! to pycelld (a socket is configured or listening) or run it embedded:
//! through the one launch path of `pycell_launch::launcher`, which starts
//! `pycell-jailer` (this needs root). The output streams through as it
//! arrives, or is collected for `--json`; the exit status is the run's.

use std::io::{self, Read, Write};
use std::path::Path;
use std::sync::Arc;

use pycell_engine::service::Backend;
use pycell_launch::launcher::{PolicyChoice, Prepared};
use pycell_launch::tool_grant::ToolGrant;
use pycell_protocol::client::{Endpoint, Stage};
use pycell_protocol::messages::{LimitOverrides, RunRequest};
use pycell_protocol::result::RunResult;
use pycell_tools::service::ToolService;
use pycell_wire::codes::{FailureCode, Layer};
use pycell_wire::events::Stream;
use pycell_wire::report::{JailFailure, RunStatus};
use pycell_wire::timings::{self, Recorder};

use pycell_engine::local::{EmbeddedRun, HowToRun};

use crate::cli::RunArgs;
use crate::say::say;
use pycell_engine::local;
use pycell_engine::tool_source::{DaemonToolCalls, ToolSource};

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
            say!(
                "{}",
                serde_json::to_string_pretty(p.spec()).unwrap_or_default()
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
    // --timings measures this process's own jailer: embedded.
    let socket = Backend::choose_now(args.embedded || args.timings, args.socket.clone());
    let mut result = match socket {
        Some(socket) => run_via_daemon(args, &socket),
        None => run_embedded(args),
    };
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

/// `pycell run` through pycelld: the daemon does the rest.
fn run_via_daemon(args: &RunArgs, socket: &Path) -> RunResult {
    let policy = args.policy.as_str();
    let daemon = |code: FailureCode, message: String| {
        refused(policy, JailFailure::new(code, Layer::Daemon, message))
    };
    if let PolicyChoice::File(_) = PolicyChoice::from_arg(policy) {
        return daemon(FailureCode::InvalidPolicy, "pycelld runs only the operator's policies (by name); a policy file needs embedded mode (--embedded, as root)".into());
    }
    let mut req = match request(args) {
        Ok(r) => r,
        Err(m) => return refused(policy, request_failure(m)),
    };
    // Before any thread exists, so that every thread has SIGINT blocked.
    let ctrl_c = match local::interrupt_on_ctrl_c() {
        Ok(c) => c,
        Err(e) => return daemon(FailureCode::Internal, format!("signalfd: {e}")),
    };
    let tools = match offered_tools(args, &mut req) {
        Ok(t) => t,
        Err(f) => return refused(policy, f),
    };
    let calls = tools
        .as_ref()
        .map(|(servers, rt)| DaemonToolCalls::new(Arc::clone(servers), rt.handle().clone()));
    // The result carries the (capped) output too; without --json it is
    // shown as it arrives instead. A run that waits for a slot for more
    // than a second says where it is in the queue, on stderr.
    let mut queue = QueueNotice::new();
    let result = pycell_protocol::client::run_patiently(
        &Endpoint::local(socket.to_path_buf()),
        req,
        |stream, bytes| {
            if !args.json {
                show(stream, bytes);
            }
        },
        |stage| match stage {
            Stage::Queued(position) => queue.update(position),
            Stage::Started(_) => queue.update(0),
            Stage::Installing(m) => eprintln!("pycell: {m}"),
            tool_call @ Stage::ToolCall { .. } => {
                DaemonToolCalls::take(calls.as_ref(), tool_call);
            }
        },
        |client| {
            if let Some(calls) = &calls {
                calls.connected(client);
            }
            ctrl_c.connected(client);
        },
    );
    if let Some((servers, rt)) = tools {
        rt.block_on(servers.shutdown());
    }
    result.unwrap_or_else(|e| e.into_result(policy))
}

/// `--tool-servers FILE`: its servers started, their catalog in `req`,
/// and the runtime they run on.
fn offered_tools(
    args: &RunArgs,
    req: &mut RunRequest,
) -> Result<Option<(Servers, local::Runtime)>, JailFailure> {
    let Some(path) = &args.tool_servers else {
        return Ok(None);
    };
    let servers = load_tool_servers(path)?;
    let rt = local::runtime().map_err(|e| {
        JailFailure::new(
            FailureCode::Internal,
            Layer::Jailer,
            format!("starting a runtime: {e}"),
        )
    })?;
    req.tools = Some(rt.block_on(servers.catalog()).into());
    Ok(Some((servers, rt)))
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

/// An embedded run: launched through pycell-jailer, which this process
/// supervises until it ends (`pycell_launch::supervisor`).
fn run_embedded(args: &RunArgs) -> RunResult {
    let run = match embedded_run(args) {
        Ok(r) => r,
        Err(f) => return refused(&args.policy, f),
    };
    OUR_MARKS.mark("pycell: policy loaded, request read");
    let mut here = match local::Here::start() {
        Ok(h) => h,
        Err(f) => return refused(&run.policy.name, f),
    };
    OUR_MARKS.mark("pycell: signal thread and runtime started");
    let mut run = run;
    let (servers, tools) = match embedded_tools(args, &here.rt, &mut run) {
        Ok(t) => t,
        Err(f) => return refused(&run.policy.name, f),
    };
    let stream = !args.json;
    let how = HowToRun {
        installer: &mut here.installer,
        stop: &here.stop,
        tools,
        marks: args.timings.then_some(&OUR_MARKS),
        on_output: &mut |s, b| {
            if stream {
                show(s, b)
            }
        },
    };
    let result = run.run(how);
    if let Some(servers) = servers {
        here.rt.block_on(servers.shutdown());
    }
    result
}

/// An embedded run's `--tool-servers`: started here, their catalog in its
/// request, and the service this process runs for its jail's channel.
fn embedded_tools(
    args: &RunArgs,
    rt: &tokio::runtime::Runtime,
    run: &mut EmbeddedRun,
) -> Result<(Option<Servers>, Option<ToolService>), JailFailure> {
    let Some(path) = &args.tool_servers else {
        return Ok((None, None));
    };
    let servers = load_tool_servers(path)?;
    run.req.tools = Some(rt.block_on(servers.catalog()).into());
    let catalog = run.req.tools.as_ref().expect("offered just now");
    let grant = ToolGrant::new(&run.policy, catalog).map_err(|e| request_failure(e.to_string()))?;
    let upstream: Arc<dyn pycell_tools::service::Upstream> = servers.clone();
    let service = grant.service(upstream, None);
    Ok((Some(servers), Some(service)))
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
/// has already been shown) one `pycell: ...` line when the run did not end ok.
pub fn emit(json: bool, r: &RunResult) {
    if json {
        match serde_json::to_string(r) {
            Ok(s) => say!("{s}"),
            Err(e) => eprintln!("pycell: cannot encode the result: {e}"),
        }
        return;
    }
    if let Some(n) = status_note(r) {
        eprintln!("pycell: {n}");
    }
    if r.stdout_truncated || r.stderr_truncated {
        eprintln!("pycell: output truncated at the max-output limit");
    }
    if let Some(n) = &r.network {
        for line in n.notes() {
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
    Some(match (&r.error, r.exit_code, r.signal) {
        (Some(e), _, _) => match &e.hint {
            Some(h) => format!("{word} ({}): {} — {h}", e.code, e.message),
            None => format!("{word} ({}): {}", e.code, e.message),
        },
        (None, _, Some(sig)) => format!("{word}: killed by signal {sig}"),
        (None, Some(code), None) => format!("{word}: exit code {code}"),
        (None, None, None) => word.to_string(),
    })
}
