//! `pycell mcp-server` through pycelld: the resolver is a run of the
//! daemon's (which stages the packages as any run's dependencies), then the
//! server is a run with `serve_stdio`, whose socket the daemon passes here
//! (SCM_RIGHTS) for this process to relay. Nothing of the server's stdio
//! passes through the daemon. The server ends when this process's
//! connection does (the daemon then stops it), so it dies with its client.

use std::collections::BTreeMap;
use std::path::Path;

use pycell_protocol::client::{DaemonClient, Stage};
use pycell_protocol::result::RunResult;
use pycell_wire::codes::{FailureCode, Layer};
use pycell_wire::report::JailFailure;

use super::{
    chosen, found_in, open_grants, packages, read_answer, relay, resolver_request, server_output,
    server_request, CLOSE_GRACE,
};
use crate::cli::McpServerArgs;
use crate::run::request_failure;
use pycell_protocol::messages::PathGrant;

fn daemon_failure(e: pycell_protocol::client::ClientError, policy: &str) -> JailFailure {
    e.into_result(policy).error.unwrap_or_else(|| {
        JailFailure::new(FailureCode::DaemonFailed, Layer::Daemon, "pycelld failed")
    })
}

/// Resolve and serve through pycelld at `socket`; the server's result and
/// the allow rules it asked for.
pub(super) fn serve(
    args: &McpServerArgs,
    socket: &Path,
    package: &str,
    variables: BTreeMap<String, String>,
) -> Result<(RunResult, Vec<String>), JailFailure> {
    let policy = args.policy.as_str();
    let mut client = DaemonClient::connect(socket).map_err(|e| daemon_failure(e, policy))?;
    let info = client.info().map_err(|e| daemon_failure(e, policy))?;
    let Some(summary) = info.host.policies.iter().find(|p| p.name == policy) else {
        let names: Vec<&str> = info.host.policies.iter().map(|p| p.name.as_str()).collect();
        return Err(request_failure(format!(
            "pycelld has no policy {policy:?} (it has: {})",
            names.join(", ")
        )));
    };
    let (grants, sources): (Vec<_>, Vec<_>) = open_grants(args, summary.limits.disk_bytes)?
        .into_iter()
        .map(|(g, fd)| {
            let grant = PathGrant {
                target: g.target,
                writable: g.writable,
            };
            (grant, fd)
        })
        .unzip();
    let rules = match args.allow.is_empty() {
        true => summary.network_allow.clone(),
        false => args.allow.clone(),
    };
    let on_stage = |stage: Stage<'_>| {
        if let Stage::Installing(m) = stage {
            eprintln!("pycell: {m}");
        }
    };
    let mut resolver = resolver_request(args, package);
    resolver.dependencies = packages(args);
    let mut reader = None;
    let result = client
        .run_serving(
            resolver,
            &[],
            |_, _| {},
            on_stage,
            |sock| reader = Some(std::thread::spawn(move || read_answer(sock))),
        )
        .map_err(|e| daemon_failure(e, policy))?;
    let answer = reader.and_then(|r| r.join().ok()).unwrap_or_default();
    let found = found_in(result, &answer, package)?;
    let mut req = server_request(args, &chosen(args, package, &found)?, variables);
    req.dependencies = packages(args);
    req.allow = args.allow.clone();
    req.grants = grants;
    let result = run_server(&mut client, req, &sources).map_err(|e| daemon_failure(e, policy))?;
    Ok((result, rules))
}

/// The server's run: its socket relayed to our stdio once it comes; once
/// our side closed, [`CLOSE_GRACE`] for it to end before it is cancelled.
fn run_server(
    client: &mut DaemonClient,
    req: pycell_protocol::messages::RunRequest,
    grant_sources: &[std::os::fd::OwnedFd],
) -> Result<RunResult, pycell_protocol::client::ClientError> {
    let mut canceller = client
        .canceller()
        .map_err(|e| pycell_protocol::client::ClientError::Unexpected(e.to_string()))?;
    let (closed_tx, closed_rx) = tokio::sync::oneshot::channel();
    let mut closed_tx = Some(closed_tx);
    std::thread::spawn(move || {
        if closed_rx.blocking_recv().is_ok() {
            std::thread::sleep(CLOSE_GRACE);
            let _ = canceller.cancel();
        }
    });
    client.run_serving(
        req,
        grant_sources,
        server_output,
        |_| {},
        |sock| {
            if let Some(closed) = closed_tx.take() {
                relay::start(sock, closed);
            }
        },
    )
}
