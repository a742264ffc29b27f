//! Runs and sessions on a cluster of pycelld nodes: placement and routing
//! as [`crate::cluster`] describes; the calls themselves are the daemon
//! backend's.

use std::sync::Arc;

use async_trait::async_trait;
use tokio_util::sync::CancellationToken;

use pycell_launch::session_table::{self, Lookup};
use pycell_protocol::info::PolicySummary;
use pycell_protocol::messages::RunRequest;
use pycell_protocol::result::RunResult;
use pycell_protocol::session::{
    SessionAnswer, SessionCall, SessionEndInfo, SessionForkInfo, SessionInfo, SessionStartRequest,
    SessionSummary, SnapshotInfo,
};
use pycell_wire::codes::FailureCode;

use super::daemon::{self, via_daemon, Asked};
use super::{Asker, OnEvent, OutputSink, RequestError, Sandboxes, Serving, SessionFailure};
use crate::cluster::{join_handle, split_handle, Node, Nodes};

/// Nothing of the call happened on the node: another may take it.
fn not_reached(code: FailureCode) -> bool {
    matches!(
        code,
        FailureCode::DaemonUnavailable | FailureCode::ShuttingDown
    )
}

/// The nodes of a cluster.
#[derive(Debug)]
pub struct Cluster {
    nodes: Arc<Nodes>,
    shutdown: CancellationToken,
}

impl Cluster {
    pub fn new(nodes: Arc<Nodes>, shutdown: CancellationToken) -> Cluster {
        Cluster { nodes, shutdown }
    }

    /// The node `handle` names and the node's own handle, or why the
    /// session cannot be reached.
    /// A session from snapshot `id` (`LOCAL@NODE`), on the node that keeps it.
    async fn start_from_snapshot(
        &self,
        asker: &Asker,
        id: String,
        mut req: SessionStartRequest,
    ) -> Result<SessionInfo, SessionFailure> {
        let unknown = || {
            let m = format!("there is no snapshot {id:?} of yours on this cluster (its ids name the node that keeps it: LOCAL@NODE)");
            SessionFailure::new(FailureCode::UnknownSnapshot, m)
        };
        let (local, name) = split_handle(&id).ok_or_else(unknown)?;
        let node = self.nodes.named(name).ok_or_else(unknown)?;
        req.from_snapshot = Some(local.to_string());
        let mut lease = node.lease();
        let started = via_daemon(node.endpoint(asker.identity.clone()), move |c| {
            c.session_start(req, |_| {})
        })
        .await;
        let mut info = started?;
        lease.started_a_session();
        info.session = join_handle(&info.session, &node.name);
        if let Some(r) = &mut info.restored {
            r.snapshot = id.clone();
        }
        Ok(info)
    }

    fn node_of<'h>(&self, handle: &'h str) -> Result<(Arc<Node>, &'h str), SessionFailure> {
        let unknown = || {
            let (code, message) = session_table::lookup_message(&Lookup::Unknown, handle);
            SessionFailure::new(code, message)
        };
        let (local, name) = split_handle(handle).ok_or_else(unknown)?;
        let node = self.nodes.named(name).ok_or_else(unknown)?;
        match node.down() {
            Some(why) => Err(gone(handle, &node.name, &why)),
            None => Ok((node, local)),
        }
    }
}

#[async_trait]
impl Sandboxes for Cluster {
    /// A run on the least-loaded node that takes it (never a server over
    /// stdio: its socket would come from another machine).
    async fn run(
        &self,
        asker: &Asker,
        req: RunRequest,
        serving: Option<Serving>,
        on_event: OnEvent<'_>,
        cancel: CancellationToken,
    ) -> Result<RunResult, RequestError> {
        if serving.is_some() {
            let problem = "a server over stdio runs embedded or through the pycelld of this machine, not on a cluster";
            return Err(RequestError {
                field: "serve_stdio",
                problem: problem.into(),
            });
        }
        for node in self.nodes.ranked() {
            let _lease = node.lease();
            let endpoint = node.endpoint(asker.identity.clone());
            let (shutdown, asked) = (&self.shutdown, (req.clone(), None));
            let r = daemon::run(endpoint, asker, asked, on_event, &cancel, shutdown).await?;
            match r.error.as_ref().filter(|e| not_reached(e.code)) {
                Some(e) => node.mark_down(&e.message),
                None => return Ok(r),
            }
        }
        let f = pycell_wire::report::JailFailure::new(
            FailureCode::DaemonUnavailable,
            pycell_wire::codes::Layer::Daemon,
            self.nodes.none_up(),
        );
        Ok(RunResult::refused("", req.policy_name(), f))
    }

    /// The policy as the first node that answers lists it.
    async fn describe_policy(
        &self,
        asker: &Asker,
        name: &str,
    ) -> Result<PolicySummary, RequestError> {
        for node in self.nodes.ranked() {
            let endpoint = node.endpoint(asker.identity.clone());
            if let Ok(policies) = daemon::policies_of(endpoint).await {
                return daemon::find_policy(policies, name);
            }
        }
        Err(RequestError {
            field: "policy",
            problem: self.nodes.none_up(),
        })
    }

    /// A session on the least-loaded node that takes it; its handle names
    /// the node.
    async fn start_session(
        &self,
        asker: &Asker,
        req: SessionStartRequest,
    ) -> Result<SessionInfo, SessionFailure> {
        if let Some(id) = &req.from_snapshot {
            return self.start_from_snapshot(asker, id.clone(), req).await;
        }
        for node in self.nodes.ranked() {
            let mut lease = node.lease();
            let r = req.clone();
            let started = via_daemon(node.endpoint(asker.identity.clone()), move |c| {
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
            self.nodes.none_up(),
        ))
    }

    async fn session_call(
        &self,
        asker: &Asker,
        handle: &str,
        call: SessionCall,
        timeout_s: Option<f64>,
        cancel: CancellationToken,
        watch: Option<OutputSink>,
    ) -> Result<SessionAnswer, SessionFailure> {
        let (node, local) = self.node_of(handle)?;
        let _lease = node.lease();
        let endpoint = node.endpoint(asker.identity.clone());
        let asked = Asked {
            handle: local,
            call,
            timeout_s,
            watch,
        };
        let answer = daemon::session_call(endpoint, asker, asked, cancel).await;
        reached(answer, &node, handle)
    }

    async fn end_session(
        &self,
        asker: &Asker,
        handle: &str,
    ) -> Result<SessionEndInfo, SessionFailure> {
        let (node, local) = self.node_of(handle)?;
        let local = local.to_string();
        let ended = via_daemon(node.endpoint(asker.identity.clone()), move |c| {
            c.session_end(&local)
        })
        .await;
        let mut info = reached(ended, &node, handle)?;
        info.session = handle.to_string();
        Ok(info)
    }

    /// A fork stays on its source's node (its state moves between two
    /// jails there, never across the network).
    async fn fork_session(
        &self,
        asker: &Asker,
        handle: &str,
    ) -> Result<SessionForkInfo, SessionFailure> {
        let (node, local) = self.node_of(handle)?;
        let mut lease = node.lease();
        let local = local.to_string();
        let forked = via_daemon(node.endpoint(asker.identity.clone()), move |c| {
            c.session_fork(&local, |_| {})
        })
        .await;
        let mut fork = reached(forked, &node, handle)?;
        lease.started_a_session();
        fork.session.session = join_handle(&fork.session.session, &node.name);
        fork.forked_from = handle.to_string();
        Ok(fork)
    }

    /// A snapshot is kept by its session's node (restoring it needs that
    /// node: a snapshot id does not name one).
    async fn snapshot_session(
        &self,
        asker: &Asker,
        handle: &str,
    ) -> Result<SnapshotInfo, SessionFailure> {
        let (node, local) = self.node_of(handle)?;
        let local = local.to_string();
        let taken = via_daemon(node.endpoint(asker.identity.clone()), move |c| {
            c.session_snapshot(&local)
        })
        .await;
        let mut info = reached(taken, &node, handle)?;
        info.session = handle.to_string();
        info.snapshot = join_handle(&info.snapshot, &node.name);
        for id in &mut info.evicted {
            *id = join_handle(id, &node.name);
        }
        Ok(info)
    }

    /// The caller's sessions on every node that is up.
    async fn list_sessions(&self, asker: &Asker) -> Result<Vec<SessionSummary>, SessionFailure> {
        let mut all = Vec::new();
        for node in self.nodes.ranked() {
            let endpoint = node.endpoint(asker.identity.clone());
            let listed = via_daemon(endpoint, |c| c.session_list()).await;
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

    fn mode(&self) -> String {
        format!("cluster (nodes {})", self.nodes.names().join(", "))
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
