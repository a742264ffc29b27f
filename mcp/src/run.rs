//! `pycell run` in embedded mode: load the policy, turn the flags into a
//! [`RunRequest`], resolve it, lease a sandbox uid, run the jail supervisor
//! in-process (this process is single-threaded), stream or collect the
//! output, and exit with the run's status.

use std::io::{self, Read, Write};
use std::path::Path;

use std::path::PathBuf;

use pycell_daemon::client::{ClientError, DaemonClient, DEFAULT_SOCKET};
use pycell_daemon::protocol::{LimitOverrides, RunRequest, Stream};
use pycell_daemon::resolve::{self, Resolved, POLICY_DIR};
use pycell_daemon::result::RunResult;
use pycell_jailer::report::{JailFailure, RunStatus};
use pycell_jailer::supervisor::{self, OutputSink, OutputStream};
use pycell_jailer::uidalloc;
use pycell_policy::Policy;

use crate::cli::RunArgs;

/// Where embedded runs keep their uid leases.
const UID_LOCK_DIR: &str = "/run/pycell/uids";
/// Largest script or stdin we accept from the command line.
const MAX_INPUT: u64 = pycell_daemon::protocol::MAX_CODE_BYTES as u64;

/// A failure before any jail exists, reported like a refused run.
#[derive(Debug)]
struct Early {
    policy: String,
    code: String,
    layer: &'static str,
    message: String,
}

fn early(policy: &str, code: &str, layer: &'static str, message: impl Into<String>) -> Early {
    Early {
        policy: policy.to_string(),
        code: code.to_string(),
        layer,
        message: message.into(),
    }
}

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

/// `--policy NAME|PATH`: a path (contains '/' or ends in .toml) is the
/// caller's own file; a name goes through the same lookup as the daemon's.
pub fn load_policy(arg: &str) -> Result<Policy, String> {
    if arg.contains('/') || arg.ends_with(".toml") {
        return Policy::load(Path::new(arg)).map_err(|e| e.to_string());
    }
    resolve::load_policy_by_name(arg, Path::new(POLICY_DIR)).map_err(|e| match e {
        resolve::ResolveError::UnknownPolicy { .. } => {
            format!("{e}; in embedded mode you can also pass a path to a .toml file")
        }
        e => e.to_string(),
    })
}

fn size_flag(flag: &str, v: &Option<String>) -> Result<Option<u64>, String> {
    v.as_deref()
        .map(|s| pycell_policy::parse_size(s).map_err(|e| format!("--{flag} {s:?}: {e}")))
        .transpose()
}

/// The request the flags describe (the same shape a daemon client sends).
fn request(args: &RunArgs) -> Result<RunRequest, String> {
    let code = if args.script == Path::new("-") {
        read_bounded("the code from stdin", io::stdin().lock())?
    } else {
        let f = std::fs::File::open(&args.script)
            .map_err(|e| format!("cannot read {}: {e}", args.script.display()))?;
        read_bounded(&args.script.display().to_string(), f)?
    };
    let code = String::from_utf8(code)
        .map_err(|_| "the code is not valid UTF-8 (Python source must be)".to_string())?;
    let stdin = match &args.input {
        None => Vec::new(),
        Some(p) if p == Path::new("-") => {
            if args.script == Path::new("-") {
                return Err("--input - and a script on stdin cannot both use stdin".into());
            }
            read_bounded("stdin", io::stdin().lock())?
        }
        Some(p) => {
            let f = std::fs::File::open(p)
                .map_err(|e| format!("cannot read --input {}: {e}", p.display()))?;
            read_bounded(&p.display().to_string(), f)?
        }
    };
    let timeout_s = match &args.timeout {
        None => None,
        Some(t) => Some(
            pycell_policy::parse_duration(t)
                .map_err(|e| format!("--timeout {t:?}: {e}"))?
                .as_secs_f64(),
        ),
    };
    let filename =
        (args.script != Path::new("-")).then(|| args.script.to_string_lossy().into_owned());
    let mut req = RunRequest {
        code,
        filename,
        args: args.script_args.clone(),
        stdin_base64: None,
        policy: Some(args.policy.clone()),
        limits: LimitOverrides {
            timeout_s,
            memory_bytes: size_flag("memory", &args.memory)?,
            pids: args.pids,
            workspace_bytes: size_flag("disk", &args.disk)?,
            max_output_bytes: size_flag("max-output", &args.max_output)?,
        },
    };
    req.set_stdin(&stdin);
    Ok(req)
}

fn prepare(args: &RunArgs) -> Result<(Policy, Resolved), Early> {
    let policy = load_policy(&args.policy)
        .map_err(|m| early(&args.policy, "invalid_policy", "policy", m))?;
    let req = request(args).map_err(|m| early(&policy.name, "invalid_request", "request", m))?;
    let resolved = resolve::resolve(&policy, &req)
        .map_err(|e| early(&policy.name, "invalid_request", "policy", e.to_string()))?;
    Ok((policy, resolved))
}

pub fn print_spec(args: &RunArgs) -> i32 {
    match prepare(args) {
        Ok((_, mut r)) => {
            r.spec.run_id = pycell_jailer::spec::new_run_id();
            r.spec.sandbox_uid = *uidalloc::DEFAULT_RANGE.start();
            r.spec.sandbox_gid = *uidalloc::DEFAULT_RANGE.start();
            println!(
                "{}",
                serde_json::to_string_pretty(&r.spec).unwrap_or_default()
            );
            0
        }
        Err(e) => {
            eprintln!("pycell: {}", e.message);
            125
        }
    }
}

/// The daemon socket to use, if any: `--socket`/PYCELL_SOCKET (must work),
/// else the default path if it exists, else none (embedded mode).
fn daemon_socket(args: &RunArgs) -> Option<PathBuf> {
    if args.embedded {
        return None;
    }
    match &args.socket {
        Some(p) if !p.as_os_str().is_empty() => Some(p.clone()),
        _ => {
            let d = Path::new(DEFAULT_SOCKET);
            d.exists().then(|| d.to_path_buf())
        }
    }
}

/// `pycell run` through pycelld: the daemon does the rest.
fn run_via_daemon(args: &RunArgs, socket: &Path) -> Result<RunResult, Early> {
    let policy = args.policy.clone();
    if policy.contains('/') || policy.ends_with(".toml") {
        return Err(early(
            &policy,
            "invalid_policy",
            "policy",
            "pycelld runs only the operator's policies (by name); a policy file needs embedded mode (--embedded, as root)",
        ));
    }
    let req = request(args).map_err(|m| early(&policy, "invalid_request", "request", m))?;
    let mut client = DaemonClient::connect(socket).map_err(|e| match e {
        ClientError::Refused { code, message } => early(&policy, code.as_str(), "daemon", message),
        e => early(&policy, "daemon_unavailable", "daemon", e.to_string()),
    })?;
    // The result carries the (capped) output too; without --json it is
    // shown as it arrives instead.
    let mut sink = CliSink {
        collect: false,
        out: Vec::new(),
        err: Vec::new(),
    };
    let result = client.run(req, |stream, bytes| {
        if !args.json {
            let s = match stream {
                Stream::Stdout => OutputStream::Stdout,
                Stream::Stderr => OutputStream::Stderr,
            };
            let _ = sink.output(s, bytes);
        }
    });
    match result {
        Ok(r) => Ok(r),
        Err(ClientError::Refused { code, message }) => {
            Err(early(&policy, code.as_str(), "daemon", message))
        }
        Err(e) => Err(early(&policy, "daemon_failed", "daemon", e.to_string())),
    }
}

pub fn main(args: &RunArgs) -> i32 {
    let outcome = match daemon_socket(args) {
        Some(socket) => run_via_daemon(args, &socket),
        None => run(args),
    };
    let result = match outcome {
        Ok(r) => r,
        Err(e) => RunResult::refused(
            "",
            &e.policy,
            JailFailure {
                code: e.code,
                layer: e.layer.to_string(),
                message: e.message,
                hint: None,
            },
        ),
    };
    emit(args.json, &result);
    result.process_exit_code()
}

fn run(args: &RunArgs) -> Result<RunResult, Early> {
    let (policy, mut resolved) = prepare(args)?;
    if !nix::unistd::geteuid().is_root() {
        return Err(early(
            &policy.name,
            "not_root",
            "jailer",
            "embedded mode needs root (it creates cgroups and maps a sandbox uid): run pycell as root",
        ));
    }
    let range = match std::env::var("PYCELL_UID_RANGE") {
        Ok(s) => uidalloc::parse_range(&s).ok_or_else(|| {
            early(
                &policy.name,
                "invalid_config",
                "uid",
                format!("PYCELL_UID_RANGE={s:?}: expected START-END"),
            )
        })?,
        Err(_) => uidalloc::DEFAULT_RANGE,
    };
    let lease = uidalloc::allocate(&range, Path::new(UID_LOCK_DIR))
        .map_err(|e| early(&policy.name, "uid_unavailable", "uid", e.to_string()))?;
    let run_id = pycell_jailer::spec::new_run_id();
    resolved.spec.run_id = run_id.clone();
    resolved.spec.sandbox_uid = lease.uid;
    resolved.spec.sandbox_gid = lease.gid;
    let mut sink = CliSink {
        collect: args.json,
        out: Vec::new(),
        err: Vec::new(),
    };
    let report = supervisor::run(&resolved.spec, &mut sink);
    drop(lease);
    Ok(RunResult::new(
        &run_id,
        &policy.name,
        Some(&resolved.limits),
        report,
        &sink.out,
        &sink.err,
    ))
}

/// Streams the program's output to our own stdout/stderr, or collects it
/// for the JSON result.
struct CliSink {
    collect: bool,
    out: Vec<u8>,
    err: Vec<u8>,
}

impl OutputSink for CliSink {
    fn output(&mut self, stream: OutputStream, bytes: &[u8]) -> io::Result<()> {
        match (self.collect, stream) {
            (true, OutputStream::Stdout) => self.out.extend_from_slice(bytes),
            (true, OutputStream::Stderr) => self.err.extend_from_slice(bytes),
            // A closed terminal or pipe on our side must not stop the run.
            (false, OutputStream::Stdout) => {
                let mut o = io::stdout().lock();
                let _ = o.write_all(bytes).and_then(|()| o.flush());
            }
            (false, OutputStream::Stderr) => {
                let _ = io::stderr().lock().write_all(bytes);
            }
        }
        Ok(())
    }
}

/// Print the result: one JSON object, or (streaming mode, where the output
/// has already been shown) one `pycell: ...` line when the run did not end ok.
pub fn emit(json: bool, r: &RunResult) {
    if json {
        match serde_json::to_string(r) {
            Ok(s) => println!("{s}"),
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
}

fn status_note(r: &RunResult) -> Option<String> {
    let word = match r.status {
        RunStatus::Ok => return None,
        RunStatus::Error => "error",
        RunStatus::Timeout => "timeout",
        RunStatus::Oom => "out of memory",
        RunStatus::Killed => "killed",
        RunStatus::Refused => "refused",
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
