//! `pycell mcp-server PACKAGE`: a third-party MCP server from the package
//! index, jailed, as a drop-in for `uvx PACKAGE` in an MCP host's config.
//!
//! 1. Stage: PACKAGE and `--with` installed wheels-only into the env store
//!    by the install jail (no build backend runs; cached by the lock, like
//!    a run's dependencies).
//! 2. Resolve: a jail of the policy without network reads the env's
//!    metadata and says which console scripts there are (no package code
//!    runs); [`plan::choose`] picks the entry.
//! 3. Serve: a cold jail of the policy whose program's stdin and stdout
//!    are a socket the jail hands out (`JailSpec::stdio_socket`); this
//!    process relays its own stdin and stdout to it byte for byte, and the
//!    server's stderr to its stderr. The caller's grants are bound in from
//!    descriptors opened here, `--env` variables set, `--allow` hosts
//!    reached through the egress proxy, whose use is summed up at the end.
//!
//! The server ends with its client: when our stdin ends (the server gets
//! EOF and has [`CLOSE_GRACE`] to exit) or our stdout is gone, and with
//! this process (the jailer's parent-death signal).

mod daemon;
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
use pycell_deps::build::Ensured;
use pycell_launch::launcher::JailerStderr;
use pycell_launch::resolve::Extras;
use pycell_launch::supervisor::{supervise, Services, StoppedBy, PATIENCE};
use pycell_policy::requirement::Requirement;
use pycell_policy::{NetworkMode, Policy};
use pycell_protocol::messages::RunRequest;
use pycell_protocol::result::{NetworkReport, RunResult};
use pycell_wire::codes::{FailureCode, Layer};
use pycell_wire::events::Stream;
use pycell_wire::report::{JailFailure, RunStatus};
use pycell_wire::spec::{Grant, MAX_GRANTS};
use serde::Serialize;

use crate::cli::McpServerArgs;
use crate::run::request_failure;
use pycell_engine::local::EmbeddedRun;
use pycell_engine::local::{self, Installer, StopRequest};

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

/// Stage, resolve and serve (through pycelld if it runs, else embedded);
/// the server's result, or why it never started.
fn serve(args: &McpServerArgs) -> Result<RunResult, JailFailure> {
    let package = Requirement::parse(&args.package)
        .map_err(|e| request_failure(format!("PACKAGE {:?}: {e}", args.package)))?;
    let variables =
        plan::variables(&args.env, |n| std::env::var(n).ok()).map_err(request_failure)?;
    let socket = pycell_engine::service::Backend::choose_now(args.embedded, args.socket.clone());
    let (result, allowed_rules) = match socket {
        Some(socket) => daemon::serve(args, &socket, &package.name, variables)?,
        None => serve_embedded(args, &package.name, variables)?,
    };
    write_egress_report(args, allowed_rules, &result)?;
    say_egress(&result);
    for cleanup in &result.grant_cleanups {
        eprintln!("pycell: grant: {}", cleanup.line());
    }
    Ok(result)
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

/// Embedded: this process stages, resolves and runs the jails itself.
fn serve_embedded(
    args: &McpServerArgs,
    package: &str,
    variables: BTreeMap<String, String>,
) -> Result<(RunResult, Vec<String>), JailFailure> {
    let mut here = local::Here::start()?;
    let EmbeddedRun {
        launcher,
        mut policy,
        ..
    } = EmbeddedRun::new(&args.policy, RunRequest::default())?;
    plan::allow(&mut policy, &args.allow).map_err(request_failure)?;
    let grants = open_grants(args, policy.limits.disk)?;
    let ensured = stage(args, &launcher, &policy, &mut here.installer)?;
    let found = resolve(args, &launcher, &policy, &ensured, package, &here.installer)?;
    let req = server_request(args, &chosen(args, package, &found)?, variables);
    let extras = Extras {
        env: Some(ensured.env.dir.clone()),
        ..Extras::default()
    };
    let mut prepared = launcher
        .prepare_with(&policy, &req, &extras)
        .map_err(|e| e.failure())?;
    prepared.grant(grants)?;
    let result = here.rt.block_on(run_server(prepared, here.stop.clone()));
    let rules = policy
        .network
        .egress()
        .map(|e| e.allowed())
        .unwrap_or_default();
    Ok((result, rules))
}

/// PACKAGE and `--with`, installed (or found in the store).
fn stage(
    args: &McpServerArgs,
    launcher: &pycell_launch::launcher::Launcher,
    policy: &Policy,
    installer: &mut Installer,
) -> Result<Ensured, JailFailure> {
    let deps = pycell_deps::gather(policy, "", &packages(args))?
        .ok_or_else(|| request_failure("no package to install".into()))?;
    let store = pycell_deps::build::embedded_store()?;
    let mut progress = |m: &str| eprintln!("pycell: {m}");
    local::ensure_here(launcher, &store, policy, &deps, installer, &mut progress)
}

/// The env's console scripts, read by a jail of the policy without
/// network (metadata only: no package code runs).
fn resolve(
    args: &McpServerArgs,
    launcher: &pycell_launch::launcher::Launcher,
    policy: &Policy,
    ensured: &Ensured,
    package: &str,
    installer: &Installer,
) -> Result<plan::Found, JailFailure> {
    let mut offline = policy.clone();
    offline.network = NetworkMode::None;
    let extras = Extras {
        env: Some(ensured.env.dir.clone()),
        ..Extras::default()
    };
    let prepared = launcher
        .prepare_with(&offline, &resolver_request(args, package), &extras)
        .map_err(|e| e.failure())?;
    let stop = installer.stop.clone();
    let (result, answer) = installer.handle.block_on(async move {
        let launched = match prepared.spawn_async(JailerStderr::Capture).await {
            Ok(l) => l,
            Err(result) => return (*result, Vec::new()),
        };
        let (stdio_tx, stdio_rx) = tokio::sync::oneshot::channel();
        let reader = tokio::spawn(async move {
            match stdio_rx.await {
                Ok(sock) => tokio::task::spawn_blocking(move || read_answer(sock))
                    .await
                    .unwrap_or_default(),
                Err(_) => Vec::new(),
            }
        });
        let services = Services {
            stdio: Some(stdio_tx),
            ..Services::default()
        };
        let until = local::stopped(stop);
        let (result, _) = supervise(launched, PATIENCE, until, services, |_, _| {}).await;
        (result, reader.await.unwrap_or_default())
    });
    found_in(result, &answer, package)
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
) -> Result<Vec<(Grant, OwnedFd)>, JailFailure> {
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
    let mut grants: Vec<(Grant, OwnedFd)> = Vec::new();
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

fn open_grant(flag: &str, path: &Path, writable: bool) -> Result<(Grant, OwnedFd), String> {
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
    let grant = Grant {
        target,
        writable,
        owner: None,
    };
    Ok((grant, fd))
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

/// Start the server's jail and relay its stdio until it ends.
async fn run_server(prepared: pycell_launch::launcher::Prepared, stop: StopRequest) -> RunResult {
    let launched = match prepared.spawn_async(JailerStderr::Capture).await {
        Ok(l) => l,
        Err(result) => return *result,
    };
    let (stdio_tx, stdio_rx) = tokio::sync::oneshot::channel();
    let (closed_tx, closed_rx) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        if let Ok(sock) = stdio_rx.await {
            relay::start(sock, closed_tx);
        }
    });
    let services = Services {
        stdio: Some(stdio_tx),
        ..Services::default()
    };
    let until = async move {
        tokio::select! {
            by = local::stopped(stop) => by,
            by = client_closed(closed_rx) => by,
        }
    };
    let (result, _) = supervise(launched, PATIENCE, until, services, server_output).await;
    result
}

/// The server's output (its stderr, and anything it wrote to the jail's
/// own stdout): to our stderr, never our stdout, the client's channel.
fn server_output(_: Stream, bytes: &[u8]) {
    use std::io::Write;
    let _ = std::io::stderr().lock().write_all(bytes);
}

/// Resolves [`CLOSE_GRACE`] after the client closed its side (never if
/// the relay never started).
async fn client_closed(closed: tokio::sync::oneshot::Receiver<()>) -> StoppedBy {
    match closed.await {
        Ok(()) => {
            tokio::time::sleep(CLOSE_GRACE).await;
            StoppedBy::Request
        }
        Err(_) => std::future::pending().await,
    }
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
