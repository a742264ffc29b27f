//! `pycell mcp-server PACKAGE`: a third-party MCP server from the package
//! index, jailed, as a drop-in for `uvx PACKAGE` in an MCP host's config.
//! Both of its runs are the run service's (`RunService::serve`), embedded
//! or through pycelld as `--embedded` and `--socket` choose.
//!
//! 1. Resolve: a server run of the policy whose dependencies are PACKAGE
//!    and `--with` (installed wheels-only into the env store by the
//!    install jail: no build backend runs; cached by the lock, like any
//!    run's dependencies) reads the env's metadata and says on its stdio
//!    which console scripts there are (no package code runs);
//!    [`plan::choose`] picks the entry.
//! 2. Serve: a run of the same env whose program's stdin and stdout are a
//!    socket the jail hands out; this process relays its own stdin and
//!    stdout to it byte for byte, and the server's stderr to its stderr.
//!    The caller's grants are bound in from descriptors opened here,
//!    `--env` variables set, `--allow` hosts reached through the egress
//!    proxy (added to the policy's in embedded mode, where the user could
//!    write the policy; narrowing it through pycelld), whose use is summed
//!    up at the end.
//!
//! The server ends with its client: when our stdin ends (the server gets
//! EOF and has [`CLOSE_GRACE`] to exit) or our stdout is gone; with
//! SIGTERM or SIGHUP to this process; and with this process (the jailer's
//! parent-death signal, or pycelld seeing the connection close).

mod plan;
mod relay;

use std::collections::BTreeMap;
use std::fs;
use std::os::fd::OwnedFd;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use nix::fcntl::OFlag;
use nix::sys::stat::Mode;
use nix::unistd::AccessFlags;
use pycell_engine::local;
use pycell_engine::service::{Backend, Options, RunEvent, RunService, Serving};
use pycell_policy::requirement::Requirement;
use pycell_protocol::info::PolicySummary;
use pycell_protocol::messages::{PathGrant, RunRequest};
use pycell_protocol::result::{NetworkReport, RunResult};
use pycell_wire::codes::{FailureCode, Layer};
use pycell_wire::report::{JailFailure, RunStatus};
use pycell_wire::spec::MAX_GRANTS;
use serde::Serialize;
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;

use crate::cli::McpServerArgs;
use crate::run::request_failure;

/// How long a server has to exit once its stdin has ended (or its client's
/// end of stdout is gone) before its jail is stopped.
pub const CLOSE_GRACE: Duration = Duration::from_secs(5);

pub fn main(args: &McpServerArgs) -> i32 {
    // A server that never started ends as a refused run does.
    let result = serve(args).unwrap_or_else(|f| RunResult::refused("", &args.policy, f));
    crate::run::emit(false, &result);
    result.process_exit_code()
}

fn internal(what: &str, e: impl std::fmt::Display) -> JailFailure {
    JailFailure::new(FailureCode::Internal, Layer::Jailer, format!("{what}: {e}"))
}

/// Resolve and serve (through pycelld if it runs, else embedded); the
/// server's result, or why it never started.
fn serve(args: &McpServerArgs) -> Result<RunResult, JailFailure> {
    let package = Requirement::parse(&args.package)
        .map_err(|e| request_failure(format!("PACKAGE {:?}: {e}", args.package)))?;
    let variables =
        plan::variables(&args.env, |n| std::env::var(n).ok()).map_err(request_failure)?;
    plan::check_allow(&args.allow).map_err(request_failure)?;
    // Before any thread exists (see `command_line_signals`).
    let signals = local::command_line_signals(false).map_err(|e| internal("signalfd", e))?;
    let rt = local::runtime_on_this_thread().map_err(|e| internal("starting a runtime", e))?;
    let options = Options {
        policy_files: true,
        ..Options::default()
    };
    // Made once: its lookup, resolver and server all go to one place.
    let backend = Backend::choose(args.embedded, args.socket.clone()).settled();
    let service = RunService::with_options(backend, None, options);
    let asked = Asked {
        args,
        package: &package.name,
        stop: signals.stop,
    };
    let result = rt.block_on(asked.serve(&service, variables))?;
    for cleanup in &result.grant_cleanups {
        eprintln!("pycell: grant: {}", cleanup.line());
    }
    Ok(result)
}

/// What `pycell mcp-server` was asked for.
struct Asked<'a> {
    args: &'a McpServerArgs,
    /// PACKAGE's name.
    package: &'a str,
    /// Cancelled by SIGTERM or SIGHUP.
    stop: CancellationToken,
}

impl Asked<'_> {
    /// The policy looked up, the grants opened, the entry resolved, the
    /// server served; its egress reported.
    async fn serve(
        &self,
        service: &RunService,
        variables: BTreeMap<String, String>,
    ) -> Result<RunResult, JailFailure> {
        let args = self.args;
        let policy = service
            .policy(&args.policy)
            .await
            .map_err(|e| e.failure())?;
        let (grants, granted) = open_grants(args, policy.limits.disk.get())?
            .into_iter()
            .unzip();
        let found = self.resolve(service).await?;
        let mut req = server_request(args, &chosen(args, self.package, &found)?, variables);
        req.grants = grants;
        let result = self.run_server(service, req, granted).await?;
        let rules = allowed_rules(&policy, &args.allow, service.widens_allow());
        write_egress_report(args, rules, &result)?;
        say_egress(&result);
        Ok(result)
    }

    /// The env's console scripts, read by a server run whose one answer
    /// is what it writes on its stdio (metadata only: no package code
    /// runs).
    async fn resolve(&self, service: &RunService) -> Result<plan::Found, JailFailure> {
        let (stdio, socket) = oneshot::channel();
        let reader = tokio::spawn(async move {
            match socket.await {
                Ok(sock) => tokio::task::spawn_blocking(move || read_answer(sock))
                    .await
                    .unwrap_or_default(),
                Err(_) => Vec::new(),
            }
        });
        let serving = Serving {
            granted: Vec::new(),
            stdio,
        };
        let req = resolver_request(self.args, self.package);
        let result = service
            .serve(req, serving, on_event, self.stop.clone())
            .await
            .map_err(|e| e.failure())?;
        found_in(result, &reader.await.unwrap_or_default(), self.package)
    }

    /// The server's run: its socket relayed to our stdio once it comes;
    /// once our side closed, [`CLOSE_GRACE`] for it to end before it is
    /// stopped.
    async fn run_server(
        &self,
        service: &RunService,
        req: RunRequest,
        granted: Vec<OwnedFd>,
    ) -> Result<RunResult, JailFailure> {
        let (stdio, socket) = oneshot::channel();
        let cancel = self.stop.child_token();
        let closer = cancel.clone();
        tokio::spawn(async move {
            let Ok(sock) = socket.await else {
                return;
            };
            let (closed_tx, closed) = oneshot::channel();
            relay::start(sock, closed_tx);
            if closed.await.is_ok() {
                tokio::time::sleep(CLOSE_GRACE).await;
                closer.cancel();
            }
        });
        let serving = Serving { granted, stdio };
        service
            .serve(req, serving, on_event, cancel)
            .await
            .map_err(|e| e.failure())
    }
}

/// A server run's events: installs said on our stderr, and the server's
/// output (its stderr, and anything it wrote to the jail's own stdout)
/// to our stderr, never our stdout, the client's channel.
fn on_event(event: RunEvent<'_>) {
    use std::io::Write;
    match event {
        RunEvent::Installing { message } => eprintln!("pycell: {message}"),
        RunEvent::Output { bytes, .. } => {
            let _ = std::io::stderr().lock().write_all(bytes);
        }
        RunEvent::Started { .. } | RunEvent::Queued { .. } | RunEvent::Step { .. } => {}
    }
}

/// The allow rules a server ran with: `allow` added to the policy's where
/// the service widens it, else `allow` if given (a narrowing), else the
/// policy's.
fn allowed_rules(policy: &PolicySummary, allow: &[String], widens: bool) -> Vec<String> {
    match (widens, allow.is_empty()) {
        (true, _) => policy.network_allow.iter().chain(allow).cloned().collect(),
        (false, true) => policy.network_allow.clone(),
        (false, false) => allow.to_vec(),
    }
}

/// What to run of what the resolver found, as the options say.
fn chosen(
    args: &McpServerArgs,
    package: &str,
    found: &plan::Found,
) -> Result<plan::Launch, JailFailure> {
    let (entry, module) = (args.entry.as_deref(), args.module.as_deref());
    plan::choose(package, found, entry, module).map_err(request_failure)
}

/// The request that runs the server `launch` picked.
fn server_request(
    args: &McpServerArgs,
    launch: &plan::Launch,
    variables: BTreeMap<String, String>,
) -> RunRequest {
    let mut req = RunRequest {
        code: plan::LAUNCHER.to_string(),
        filename: Some("pycell_server.py".to_string()),
        args: launch.launcher_args().to_vec(),
        policy: Some(args.policy.clone()),
        serve_stdio: true,
        env: variables,
        dependencies: packages(args),
        allow: args.allow.clone(),
        ..RunRequest::default()
    };
    req.args.extend(args.server_args.iter().cloned());
    req
}

/// The request that reads the env's console scripts for `package`: a
/// server over stdio too, whose one answer is what it writes there (so
/// that a server policy, whose long clocks no code run may borrow, serves
/// it: see `Policy::purpose_problem`).
fn resolver_request(args: &McpServerArgs, package: &str) -> RunRequest {
    RunRequest {
        code: plan::RESOLVER.to_string(),
        filename: Some("pycell_resolve.py".to_string()),
        args: vec![package.to_string()],
        policy: Some(args.policy.clone()),
        serve_stdio: true,
        dependencies: packages(args),
        ..RunRequest::default()
    }
}

/// PACKAGE and `--with`.
fn packages(args: &McpServerArgs) -> Vec<String> {
    std::iter::once(args.package.clone())
        .chain(args.with.iter().cloned())
        .collect()
}

/// What the resolver's run said, or why it said nothing.
fn found_in(result: RunResult, answer: &[u8], package: &str) -> Result<plan::Found, JailFailure> {
    let failed = |why: String| {
        JailFailure::new(
            FailureCode::JailerFailed,
            Layer::Request,
            format!("finding {package}'s console scripts: {why}"),
        )
    };
    if result.status != RunStatus::Ok {
        return Err(match result.error {
            Some(e) => e,
            None => failed(format!("{}: {}", result.status.as_str(), result.stderr)),
        });
    }
    if answer.len() > MAX_ANSWER {
        return Err(failed(format!("its answer is over {MAX_ANSWER} bytes")));
    }
    serde_json::from_slice(answer).map_err(|e| failed(format!("its answer: {e}")))
}

/// The most a resolver's answer may be: the env's console scripts, as JSON.
const MAX_ANSWER: usize = 4 << 20;

/// What the resolver wrote on its stdio socket, to its end (at most
/// [`MAX_ANSWER`] and a byte: then the socket is closed, and the
/// resolver's next write fails).
fn read_answer(sock: OwnedFd) -> Vec<u8> {
    use std::io::Read;
    let sock = std::os::unix::net::UnixStream::from(sock);
    let _ = sock.shutdown(std::net::Shutdown::Write);
    let mut answer = Vec::new();
    let _ = sock.take(MAX_ANSWER as u64 + 1).read_to_end(&mut answer);
    answer
}

/// The paths granted (`--ro`, `--rw`, `--state`), each opened here (so this
/// process could reach it) and checked.
fn open_grants(
    args: &McpServerArgs,
    disk_limit: u64,
) -> Result<Vec<(PathGrant, OwnedFd)>, JailFailure> {
    let mut asked: Vec<(&str, &Path, bool)> = Vec::new();
    asked.extend(args.read_only.iter().map(|p| ("--ro", p.as_path(), false)));
    asked.extend(args.read_write.iter().map(|p| ("--rw", p.as_path(), true)));
    if let Some(state) = &args.state {
        make_state_dir(state, disk_limit)?;
        asked.push(("--state", state.as_path(), true));
    }
    if asked.len() > MAX_GRANTS {
        return Err(request_failure(format!(
            "at most {MAX_GRANTS} paths can be granted"
        )));
    }
    let mut grants: Vec<(PathGrant, OwnedFd)> = Vec::new();
    for (flag, path, writable) in asked {
        let (grant, fd) = open_grant(flag, path, writable).map_err(request_failure)?;
        if grants.iter().any(|(g, _)| g.target == grant.target) {
            let t = grant.target.display();
            return Err(request_failure(format!("{flag} {t}: granted twice")));
        }
        grants.push((grant, fd));
    }
    Ok(grants)
}

fn open_grant(flag: &str, path: &Path, writable: bool) -> Result<(PathGrant, OwnedFd), String> {
    let p = path.display();
    let canonical = fs::canonicalize(path).map_err(|e| format!("{flag} {p}: {e}"))?;
    let kind = fs::metadata(&canonical).map_err(|e| format!("{flag} {p}: {e}"))?;
    if !kind.is_dir() && !kind.is_file() {
        return Err(format!(
            "{flag} {p}: only a directory or a regular file can be granted"
        ));
    }
    let mut need = AccessFlags::R_OK;
    if writable {
        need |= AccessFlags::W_OK;
    }
    if kind.is_dir() {
        need |= AccessFlags::X_OK;
    }
    nix::unistd::access(&canonical, need).map_err(|e| {
        let what = if writable { "read and write" } else { "read" };
        format!("{flag} {p}: you cannot {what} it yourself ({e})")
    })?;
    let target = plan::grant_target(&canonical).map_err(|e| format!("{flag} {p}: {e}"))?;
    // For reading (proof that we may), never blocking (on a FIFO swapped
    // in since we looked: the jailer refuses anything but a directory or
    // a regular file).
    let fd = nix::fcntl::open(
        &canonical,
        OFlag::O_RDONLY | OFlag::O_CLOEXEC | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK,
        Mode::empty(),
    )
    .map_err(|e| format!("{flag} {p}: {e}"))?;
    Ok((PathGrant { target, writable }, fd))
}

/// `--state DIR`: made (mode 0700) if missing; refused if it already holds
/// more than `limit` bytes.
fn make_state_dir(dir: &Path, limit: u64) -> Result<(), JailFailure> {
    let d = dir.display();
    if !dir.exists() {
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|e| request_failure(format!("--state {d}: {e}")))?;
    }
    let used = disk_use(dir, limit).map_err(|e| request_failure(format!("--state {d}: {e}")))?;
    if used > limit {
        return Err(request_failure(format!(
            "--state {d} holds more than the policy's disk limit ({})",
            pycell_policy::format_size(limit)
        )));
    }
    Ok(())
}

/// Bytes of the files under `dir` (not following symlinks), counting
/// stopped once past `limit`.
fn disk_use(dir: &Path, limit: u64) -> std::io::Result<u64> {
    let mut used = 0u64;
    let mut todo: Vec<PathBuf> = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for entry in fs::read_dir(&d)? {
            let entry = entry?;
            let meta = entry.metadata()?;
            used = used.saturating_add(meta.len());
            if meta.is_dir() {
                todo.push(entry.path());
            }
            if used > limit {
                return Ok(used);
            }
        }
    }
    Ok(used)
}

/// What `--egress-report FILE` holds.
#[derive(Debug, Serialize)]
struct EgressReport<'a> {
    package: &'a str,
    policy: &'a str,
    /// The allow rules the server ran with (none: no network; through
    /// pycelld without --allow: its policy's, not listed here).
    allowed_rules: Vec<String>,
    /// What it reached and what was refused (none without network).
    network: Option<&'a NetworkReport>,
}

fn write_egress_report(
    args: &McpServerArgs,
    allowed_rules: Vec<String>,
    result: &RunResult,
) -> Result<(), JailFailure> {
    let Some(path) = &args.egress_report else {
        return Ok(());
    };
    let report = EgressReport {
        package: &args.package,
        policy: &args.policy,
        allowed_rules,
        network: result.network.as_ref(),
    };
    let json = serde_json::to_vec_pretty(&report).map_err(|e| internal("the egress report", e))?;
    fs::write(path, json)
        .map_err(|e| request_failure(format!("--egress-report {}: {e}", path.display())))
}

/// One line of what the server reached (refusals are the result's own
/// notes).
fn say_egress(result: &RunResult) {
    let Some(n) = &result.network else {
        return;
    };
    let reached: Vec<String> = n
        .allowed
        .iter()
        .map(|h| format!("{}:{} x{}", h.host, h.port, h.count))
        .collect();
    eprintln!(
        "pycell: egress: reached {}; {} refused; {} bytes in, {} out",
        match reached.is_empty() {
            true => "no host".to_string(),
            false => reached.join(", "),
        },
        n.denied.iter().map(|d| d.count).sum::<u64>(),
        n.bytes_in,
        n.bytes_out
    );
}
