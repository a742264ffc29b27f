//! `pycell run` in embedded mode: resolve the policy, lease a sandbox uid,
//! run the jail supervisor in-process (this process is single-threaded),
//! stream or collect the output, and exit with the run's status.

use std::io::{self, Read, Write};
use std::path::Path;

use pycell_jailer::report::{JailFailure, JailReport, RunStatus};
use pycell_jailer::supervisor::{self, OutputSink, OutputStream};
use pycell_jailer::uidalloc;
use serde::Serialize;

use crate::cli::RunArgs;
use crate::resolve::{self, Resolved};

/// Where embedded runs keep their uid leases.
const UID_LOCK_DIR: &str = "/run/pycell/uids";
/// Largest script or stdin we accept from the command line.
const MAX_INPUT: u64 = 16 << 20;

/// The JSON printed by `pycell run --json`.
#[derive(Debug, Serialize)]
struct RunResult<'a> {
    run_id: &'a str,
    status: RunStatus,
    exit_code: Option<i32>,
    signal: Option<i32>,
    stdout: String,
    stderr: String,
    stdout_truncated: bool,
    stderr_truncated: bool,
    wall_ms: f64,
    cpu_ms: f64,
    peak_memory_bytes: u64,
    policy: &'a str,
    limits: Option<&'a pycell_policy::Limits>,
    layers: Option<&'a pycell_jailer::report::Layers>,
    error: Option<&'a JailFailure>,
}

/// A failure before the jail exists: reported like a refused run.
fn refuse(args: &RunArgs, policy: &str, code: &str, layer: &str, message: String) -> i32 {
    let failure = JailFailure {
        code: code.into(),
        layer: layer.into(),
        message,
        hint: None,
    };
    let report = JailReport::refused(failure);
    emit(args, "", policy, None, &report, Vec::new(), Vec::new());
    report.process_exit_code()
}

fn read_bounded(what: &str, mut r: impl Read) -> Result<Vec<u8>, String> {
    let mut buf = Vec::new();
    r.by_ref()
        .take(MAX_INPUT + 1)
        .read_to_end(&mut buf)
        .map_err(|e| format!("reading {what}: {e}"))?;
    if buf.len() as u64 > MAX_INPUT {
        return Err(format!("{what} is larger than {} MiB", MAX_INPUT >> 20));
    }
    Ok(buf)
}

fn read_inputs(args: &RunArgs) -> Result<(String, Vec<u8>), String> {
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
    Ok((code, stdin))
}

fn new_run_id() -> String {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    format!("r-{:016x}", t ^ (u64::from(std::process::id()) << 40))
}

fn prepare(
    args: &RunArgs,
) -> Result<(pycell_policy::Policy, Resolved), (String, &'static str, String)> {
    let policy = resolve::load_policy(&args.policy)
        .map_err(|e| (args.policy.clone(), "policy", e.to_string()))?;
    let (code, stdin) = read_inputs(args).map_err(|e| (policy.name.clone(), "input", e))?;
    let resolved = resolve::resolve(&policy, args, code, stdin)
        .map_err(|e| (policy.name.clone(), "policy", e.to_string()))?;
    Ok((policy, resolved))
}

pub fn print_spec(args: &RunArgs) -> i32 {
    match prepare(args) {
        Ok((_, mut r)) => {
            r.spec.run_id = new_run_id();
            r.spec.sandbox_uid = *uidalloc::DEFAULT_RANGE.start();
            r.spec.sandbox_gid = *uidalloc::DEFAULT_RANGE.start();
            println!(
                "{}",
                serde_json::to_string_pretty(&r.spec).unwrap_or_default()
            );
            0
        }
        Err((_, _, msg)) => {
            eprintln!("pycell: {msg}");
            125
        }
    }
}

pub fn main(args: &RunArgs) -> i32 {
    let (policy, mut resolved) = match prepare(args) {
        Ok(x) => x,
        Err((policy, layer, msg)) => {
            return refuse(args, &policy, &format!("invalid_{layer}"), layer, msg)
        }
    };
    if !nix::unistd::geteuid().is_root() {
        return refuse(
            args,
            &policy.name,
            "not_root",
            "jailer",
            "embedded mode needs root (it creates cgroups and maps a sandbox uid): run pycell as root".into(),
        );
    }
    let range = match std::env::var("PYCELL_UID_RANGE") {
        Ok(s) => match uidalloc::parse_range(&s) {
            Some(r) => r,
            None => {
                return refuse(
                    args,
                    &policy.name,
                    "invalid_config",
                    "uid",
                    format!("PYCELL_UID_RANGE={s:?}: expected START-END"),
                )
            }
        },
        Err(_) => uidalloc::DEFAULT_RANGE,
    };
    let lease = match uidalloc::allocate(&range, Path::new(UID_LOCK_DIR)) {
        Ok(l) => l,
        Err(e) => return refuse(args, &policy.name, "uid_unavailable", "uid", e.to_string()),
    };
    let run_id = new_run_id();
    resolved.spec.run_id = run_id.clone();
    resolved.spec.sandbox_uid = lease.uid;
    resolved.spec.sandbox_gid = lease.gid;

    let (report, out, err) = run_embedded(&resolved, args.json);
    drop(lease);
    emit(
        args,
        &run_id,
        &policy.name,
        Some(&resolved.limits),
        &report,
        out,
        err,
    );
    report.process_exit_code()
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

/// Embedded mode runs the jailer's supervisor in this (single-threaded)
/// process instead of starting `pycell-jailer`: same code, one exec less.
fn run_embedded(resolved: &Resolved, collect: bool) -> (JailReport, Vec<u8>, Vec<u8>) {
    let mut sink = CliSink {
        collect,
        out: Vec::new(),
        err: Vec::new(),
    };
    let report = supervisor::run(&resolved.spec, &mut sink);
    (report, sink.out, sink.err)
}

fn emit(
    args: &RunArgs,
    run_id: &str,
    policy: &str,
    limits: Option<&pycell_policy::Limits>,
    report: &JailReport,
    out: Vec<u8>,
    err: Vec<u8>,
) {
    if args.json {
        let result = RunResult {
            run_id,
            status: report.status,
            exit_code: report.exit_code,
            signal: report.signal,
            stdout: String::from_utf8_lossy(&out).into_owned(),
            stderr: String::from_utf8_lossy(&err).into_owned(),
            stdout_truncated: report.stdout_truncated,
            stderr_truncated: report.stderr_truncated,
            wall_ms: report.wall_ms,
            cpu_ms: report.cpu_ms,
            peak_memory_bytes: report.peak_memory_bytes,
            policy,
            limits,
            layers: report.layers.as_ref(),
            error: report.error.as_ref(),
        };
        match serde_json::to_string(&result) {
            Ok(s) => println!("{s}"),
            Err(e) => eprintln!("pycell: cannot encode the result: {e}"),
        }
        return;
    }
    let note = match (report.status, &report.error) {
        (RunStatus::Ok, _) => None,
        (_, Some(e)) => Some(match &e.hint {
            Some(h) => format!(
                "{} ({}): {} — {h}",
                status_word(report.status),
                e.code,
                e.message
            ),
            None => format!("{} ({}): {}", status_word(report.status), e.code, e.message),
        }),
        (s, None) => Some(match (report.exit_code, report.signal) {
            (_, Some(sig)) => format!("{}: killed by signal {sig}", status_word(s)),
            (Some(code), None) => format!("{}: exit code {code}", status_word(s)),
            (None, None) => status_word(s).to_string(),
        }),
    };
    if let Some(n) = note {
        eprintln!("pycell: {n}");
    }
    if report.stdout_truncated || report.stderr_truncated {
        eprintln!("pycell: output truncated at the max-output limit");
    }
}

fn status_word(s: RunStatus) -> &'static str {
    match s {
        RunStatus::Ok => "ok",
        RunStatus::Error => "error",
        RunStatus::Timeout => "timeout",
        RunStatus::Oom => "out of memory",
        RunStatus::Killed => "killed",
        RunStatus::Refused => "refused",
    }
}
