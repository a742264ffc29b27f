//! Runs and sessions on a cluster of pycelld nodes (`pycell mcp --http
//! --node ...`): placement and routing as `crate::cluster` describes; the
//! calls themselves are the daemon path's.

use std::sync::Arc;

use pycell_protocol::result::RunResult;
use pycell_protocol::session::{
    SessionAnswer, SessionCall, SessionEndInfo, SessionInfo, SessionStartRequest, SessionSummary,
};
use pycell_wire::codes::FailureCode;
use tokio_util::sync::CancellationToken;

use super::sandboxes::{RequestError, RunEvent, Sandboxes};
use super::sessions::{via_daemon, SessionFailure};
use crate::cluster::{join_handle, split_handle, Node, Nodes};
use pycell_launch::session_table::{self, Lookup};
use pycell_protocol::messages::RunRequest;

/// Nothing of the call happened on the node: another may take it.
fn not_reached(code: FailureCode) -> bool {
    matches!(
        code,
        FailureCode::DaemonUnavailable | FailureCode::ShuttingDown
    )
}

impl Sandboxes {
    /// A run on the least-loaded node that takes it.
    pub(super) async fn run_in_cluster(
        &self,
        nodes: &Nodes,
        req: RunRequest,
        mut on_event: impl FnMut(RunEvent<'_>) + Send,
        cancel: CancellationToken,
    ) -> Result<RunResult, RequestError> {
        for node in nodes.ranked() {
            let _lease = node.lease();
            let endpoint = node.endpoint(self.identity());
            let r = self
                .run_via_daemon(endpoint, req.clone(), &mut on_event, cancel.clone())
                .await?;
            match r.error.as_ref().filter(|e| not_reached(e.code)) {
                Some(e) => node.mark_down(&e.message),
                None => return Ok(r),
            }
        }
        let f = pycell_wire::report::JailFailure::new(
            FailureCode::DaemonUnavailable,
            pycell_wire::codes::Layer::Daemon,
            nodes.none_up(),
        );
        Ok(RunResult::refused("", req.policy_name(), f))
    }

    /// A session on the least-loaded node that takes it; its handle names
    /// the node.
    pub(super) async fn start_in_cluster(
        &self,
        nodes: &Nodes,
        req: SessionStartRequest,
    ) -> Result<SessionInfo, SessionFailure> {
        for node in nodes.ranked() {
            let mut lease = node.lease();
            let r = req.clone();
            let started = via_daemon(node.endpoint(self.identity()), move |c| {
                c.session_start(r, |_| {})
            })
            .await;
            match started {
                Ok(mut info) => {
                    lease.started_a_session();
                    info.session = join_handle(&info.session, &node.name);
                    return Ok(info);
                }
                Err(f) if not_reached(f.code) => node.mark_down(&f.message),
                Err(f) => return Err(f),
            }
        }
        Err(SessionFailure::new(
            FailureCode::DaemonUnavailable,
            nodes.none_up(),
        ))
    }

    /// The node `handle` names and the node's own handle, or why the
    /// session cannot be reached.
    fn node_of<'h>(
        &self,
        nodes: &Nodes,
        handle: &'h str,
    ) -> Result<(Arc<Node>, &'h str), SessionFailure> {
        let unknown = || {
            let (code, message) = session_table::lookup_message(&Lookup::Unknown, handle);
            SessionFailure::new(code, message)
        };
        let (local, name) = split_handle(handle).ok_or_else(unknown)?;
        let node = nodes.named(name).ok_or_else(unknown)?;
        match node.down() {
            Some(why) => Err(gone(handle, &node.name, &why)),
            None => Ok((node, local)),
        }
    }

    pub(super) async fn call_in_cluster(
        &self,
        nodes: &Nodes,
        handle: &str,
        call: SessionCall,
        timeout_s: Option<f64>,
        cancel: CancellationToken,
    ) -> Result<SessionAnswer, SessionFailure> {
        let (node, local) = self.node_of(nodes, handle)?;
        let _lease = node.lease();
        let endpoint = node.endpoint(self.identity());
        let answer = self
            .daemon_call(endpoint, local, call, timeout_s, cancel)
            .await;
        reached(answer, &node, handle)
    }

    pub(super) async fn end_in_cluster(
        &self,
        nodes: &Nodes,
        handle: &str,
    ) -> Result<SessionEndInfo, SessionFailure> {
        let (node, local) = self.node_of(nodes, handle)?;
        let local = local.to_string();
        let ended = via_daemon(node.endpoint(self.identity()), move |c| {
            c.session_end(&local)
        })
        .await;
        let mut info = reached(ended, &node, handle)?;
        info.session = handle.to_string();
        Ok(info)
    }

    /// The caller's sessions on every node that is up.
    pub(super) async fn list_in_cluster(
        &self,
        nodes: &Nodes,
    ) -> Result<Vec<SessionSummary>, SessionFailure> {
        let mut all = Vec::new();
        for node in nodes.ranked() {
            let listed = via_daemon(node.endpoint(self.identity()), |c| c.session_list()).await;
            match listed {
                Ok(list) => all.extend(list.into_iter().map(|mut s| {
                    s.session = join_handle(&s.session, &node.name);
                    s
                })),
                Err(f) if not_reached(f.code) => node.mark_down(&f.message),
                Err(f) => return Err(f),
            }
        }
        Ok(all)
    }
}

/// A session's node could not be reached: it is gone, and so is the session.
fn gone(handle: &str, node: &str, why: &str) -> SessionFailure {
    SessionFailure::new(
        FailureCode::SessionGone,
        format!("session {handle} is over: node {node}, which held it, is gone ({why}); start a new session with session_start"),
    )
}

fn reached<T>(
    r: Result<T, SessionFailure>,
    node: &Node,
    handle: &str,
) -> Result<T, SessionFailure> {
    r.map_err(|f| match not_reached(f.code) {
        true => {
            node.mark_down(&f.message);
            gone(handle, &node.name, &f.message)
        }
        false => f,
    })
}
