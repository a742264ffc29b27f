//! Many pycelld nodes behind one front end (`pycell mcp --http --node
//! NAME=ADDR ...`): where each run and session goes, and how the front end
//! reaches a node.
//!
//! - A run goes to the least-loaded node that is up (runs going and
//!   waiting there, as its last `status` said, plus this front end's calls
//!   in flight to it, over its `max_concurrent_runs`; ties rotate). A node
//!   that cannot be reached, or is draining (`shutting_down`), before the
//!   run started is marked down and the run goes to the next one.
//! - A session stays on the node that started it: its handle names the
//!   node (`s-...@NAME`). A node that is gone (unreachable, or restarted,
//!   which ends its sessions) answers `session_gone` for its handles.
//! - Each node's `status` is polled every [`POLL`]; a node that does not
//!   answer is down until it does.
//!
//! A node is a pycelld socket on this host (`NAME=unix:/run/pycell/pycell.sock`)
//! or a `pycell gateway` on another (`NAME=HOST:PORT`, mutual TLS, which
//! the front end provides as a [`Reach`]). Either way the daemon client
//! speaks to a Unix socket: for a remote node, one the front end serves,
//! each of whose connections it carries over TLS to the node's gateway.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use pycell_protocol::client::{ClientError, DaemonClient, Endpoint};

/// How often each node's load is asked.
pub const POLL: Duration = Duration::from_secs(1);
/// Sessions started that a node keeps counting until a status covers
/// them (more only while its polls fail, when it is down anyway).
const MAX_STARTED: usize = 4096;
/// The least a node stays down once a call could not reach it.
const DOWN_AT_LEAST: Duration = Duration::from_secs(2);

/// The handle a caller sees for session `local` of node `node`.
pub fn join_handle(local: &str, node: &str) -> String {
    format!("{local}@{node}")
}

/// A caller's handle taken apart: (the node's own handle, the node).
pub fn split_handle(handle: &str) -> Option<(&str, &str)> {
    handle.rsplit_once('@')
}

#[derive(Debug, Default)]
struct NodeState {
    /// Runs going and waiting there, and how many may go, as last told.
    active: usize,
    max: usize,
    /// This front end's calls to it now.
    in_flight: usize,
    /// When the sessions this front end started there began, for those no
    /// status asked for since has counted yet (a session holds a slot,
    /// which only a status asked after its start shows). A run that ended
    /// holds nothing, so it is not here.
    started: Vec<Instant>,
    /// Sessions this front end has started there, ever: between nodes as
    /// loaded, the one with fewer takes the next (a status may still count
    /// a run that has ended since, and make a node with a new session look
    /// no busier than one without).
    sessions_placed: usize,
    down_until: Option<Instant>,
    /// Why it is down, for messages.
    down_because: String,
    /// No longer listed by the DNS name nodes are found by.
    gone: bool,
}

/// One node.
#[derive(Debug)]
pub struct Node {
    pub name: String,
    /// The socket the daemon client connects to for it.
    pub socket: PathBuf,
    state: Mutex<NodeState>,
}

/// A call in flight to a node; dropping it ends the count.
#[derive(Debug)]
pub struct Lease {
    node: Arc<Node>,
    started_a_session: bool,
}

impl Lease {
    /// The call started a session, which holds a slot on the node after
    /// the call ends.
    pub fn started_a_session(&mut self) {
        self.started_a_session = true;
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        let mut s = self.node.state();
        s.in_flight = s.in_flight.saturating_sub(1);
        if self.started_a_session {
            s.sessions_placed += 1;
            if s.started.len() < MAX_STARTED {
                s.started.push(Instant::now());
            }
        }
    }
}

impl Node {
    fn state(&self) -> std::sync::MutexGuard<'_, NodeState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn endpoint(&self, identity: Option<Arc<str>>) -> Endpoint {
        Endpoint {
            socket: self.socket.clone(),
            identity,
        }
    }

    /// Count a call to it (for placement) while the lease lives.
    pub fn lease(self: &Arc<Self>) -> Lease {
        let mut s = self.state();
        s.in_flight += 1;
        drop(s);
        Lease {
            node: Arc::clone(self),
            started_a_session: false,
        }
    }

    /// It could not be reached (or is draining): down until a poll finds
    /// it again, and at least [`DOWN_AT_LEAST`].
    pub fn mark_down(&self, because: &str) {
        let mut s = self.state();
        if s.down_until.is_none() {
            say(&format!("node {} is down: {because}", self.name));
        }
        s.down_until = Some(Instant::now() + DOWN_AT_LEAST);
        s.down_because = because.to_string();
    }

    /// Why it is down, if it is.
    pub fn down(&self) -> Option<String> {
        let s = self.state();
        if s.gone {
            return Some("it left the cluster (no longer listed)".into());
        }
        s.down_until.map(|_| s.down_because.clone())
    }

    fn set_gone(&self, gone: bool) {
        let mut s = self.state();
        if s.gone != gone {
            let what = if gone {
                "left the cluster"
            } else {
                "is listed again"
            };
            say(&format!("node {} {what}", self.name));
        }
        s.gone = gone;
    }

    /// Load: calls going and waiting per slot, as its last status said,
    /// with this front end's calls going now and the sessions it started
    /// since that status was asked for; then how many sessions this front
    /// end has placed there.
    fn load(&self) -> (f64, usize) {
        let s = self.state();
        let busy = s.active + s.in_flight + s.started.len();
        (busy as f64 / s.max.max(1) as f64, s.sessions_placed)
    }

    /// Its status, asked for at `asked_at`: the sessions started before
    /// then are in it; those started since may not be (a status the node
    /// wrote before a session started must not make the node look free of
    /// it).
    fn polled(
        &self,
        answer: Result<pycell_protocol::info::DaemonStatus, PollFailed>,
        asked_at: Instant,
    ) {
        let mut s = self.state();
        match answer {
            Ok(st) => {
                s.active = st.active_runs + st.queued_runs;
                s.max = st.max_concurrent_runs;
                s.started.retain(|at| *at >= asked_at);
                if s.down_until.is_some_and(|t| Instant::now() >= t) {
                    s.down_until = None;
                    say(&format!("node {} is up", self.name));
                }
            }
            Err(why) => {
                if s.down_until.is_none() {
                    say(&format!("node {} is down: {why}", self.name));
                }
                let at_least = Instant::now() + DOWN_AT_LEAST;
                s.down_until = Some(s.down_until.map_or(at_least, |t| t.max(at_least)));
                s.down_because = why.to_string();
            }
        }
    }
}

/// Why a node's status poll has no answer.
#[derive(Debug, thiserror::Error)]
enum PollFailed {
    #[error(transparent)]
    Node(ClientError),
    /// The poll's own task ended without one (pycelld is not to blame).
    #[error("{0}")]
    Task(tokio::task::JoinError),
}

/// The cluster's nodes: those given, or those a DNS name lists now (a
/// node no longer listed stays, gone, so that its handles answer
/// `session_gone`).
#[derive(Debug)]
pub struct Nodes {
    list: RwLock<Vec<Arc<Node>>>,
    turn: AtomicUsize,
    /// `--nodes-dns HOST:PORT`: every address the name has is a node's
    /// gateway.
    dns: Option<String>,
    /// How nodes behind gateways are reached (their tunnels live as long
    /// as this).
    tunnels: Option<Arc<dyn Reach>>,
}

/// How the nodes a DNS name lists are reached: a Unix socket of this
/// process's for each, carried to the node's gateway.
pub trait Reach: Send + Sync + std::fmt::Debug {
    /// The socket for node `name`, whose gateway is at `remote` (from
    /// within the runtime).
    fn open(&self, name: &str, remote: String) -> std::io::Result<PathBuf>;
}

fn node(name: String, socket: PathBuf) -> Arc<Node> {
    Arc::new(Node {
        name,
        socket,
        state: Mutex::new(NodeState {
            max: 1,
            ..NodeState::default()
        }),
    })
}

/// A node's name for the gateway at `addr`: its address, `:` as `-`.
pub fn name_of(addr: &SocketAddr) -> String {
    addr.ip().to_string().replace(':', "-")
}

impl Nodes {
    pub fn new(
        nodes: Vec<(String, PathBuf)>,
        dns: Option<String>,
        tunnels: Option<Arc<dyn Reach>>,
    ) -> Arc<Nodes> {
        let list = nodes.into_iter().map(|(n, s)| node(n, s)).collect();
        Arc::new(Nodes {
            list: RwLock::new(list),
            turn: AtomicUsize::new(0),
            dns,
            tunnels,
        })
    }

    fn list(&self) -> Vec<Arc<Node>> {
        self.list.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    pub fn names(&self) -> Vec<String> {
        self.list().iter().map(|n| n.name.clone()).collect()
    }

    pub fn named(&self, name: &str) -> Option<Arc<Node>> {
        self.list().into_iter().find(|n| n.name == name)
    }

    /// The nodes that are up, least loaded first; between equal loads,
    /// the one this front end placed fewer sessions on; then they take
    /// turns.
    pub fn ranked(&self) -> Vec<Arc<Node>> {
        let list = self.list();
        let start = self.turn.fetch_add(1, Ordering::Relaxed);
        let n = list.len().max(1);
        let mut up: Vec<((f64, usize), usize, Arc<Node>)> = list
            .into_iter()
            .enumerate()
            .filter(|(_, node)| node.down().is_none())
            .map(|(i, node)| (node.load(), (i + n - start % n) % n, node))
            .collect();
        up.sort_by(|a, b| {
            (a.0 .0.total_cmp(&b.0 .0))
                .then(a.0 .1.cmp(&b.0 .1))
                .then(a.1.cmp(&b.1))
        });
        up.into_iter().map(|(_, _, node)| node).collect()
    }

    /// Why no node can take a call.
    pub fn none_up(&self) -> String {
        let list = self.list();
        if list.is_empty() {
            return "the cluster has no node yet; try again shortly".into();
        }
        let why: Vec<String> = list
            .iter()
            .map(|n| format!("{}: {}", n.name, n.down().unwrap_or_else(|| "up".into())))
            .collect();
        format!(
            "no node of the cluster can take it now ({}); try again shortly",
            why.join("; ")
        )
    }

    /// The nodes the DNS name lists now: new ones joined (a tunnel each),
    /// those no longer listed gone, those listed again back.
    async fn discover(&self) {
        let (Some(name), Some(tunnels)) = (&self.dns, &self.tunnels) else {
            return;
        };
        let name = name.clone();
        let found = tokio::task::spawn_blocking(move || {
            std::net::ToSocketAddrs::to_socket_addrs(&name).map(|a| a.collect::<Vec<_>>())
        })
        .await;
        let Ok(Ok(found)) = found else {
            // A name that does not resolve now changes nothing: the
            // status polls say which nodes still answer.
            return;
        };
        let mut joined = Vec::new();
        let known = self.list();
        for addr in &found {
            let name = name_of(addr);
            if known.iter().any(|n| n.name == name)
                || joined.iter().any(|n: &Arc<Node>| n.name == name)
            {
                continue;
            }
            match tunnels.open(&name, addr.to_string()) {
                Ok(socket) => {
                    say(&format!("node {name} joined (its gateway at {addr})"));
                    joined.push(node(name, socket));
                }
                Err(e) => say(&format!("node {name}: {e}")),
            }
        }
        let listed: Vec<String> = found.iter().map(name_of).collect();
        for n in &known {
            n.set_gone(!listed.contains(&n.name));
        }
        if !joined.is_empty() {
            self.list
                .write()
                .unwrap_or_else(|p| p.into_inner())
                .extend(joined);
        }
    }

    /// Ask every node its load now, and then every [`POLL`], until `stop`
    /// (finding nodes by DNS first, if that is how they are found).
    pub async fn watch(self: Arc<Self>, stop: tokio_util::sync::CancellationToken) {
        loop {
            self.discover().await;
            for node in self.list() {
                let socket = node.socket.clone();
                let asked_at = Instant::now();
                let answer = tokio::task::spawn_blocking(move || {
                    DaemonClient::connect(&socket).and_then(|mut c| c.status())
                })
                .await
                .map_err(PollFailed::Task)
                .and_then(|r| r.map_err(PollFailed::Node));
                node.polled(answer, asked_at);
            }
            tokio::select! {
                _ = tokio::time::sleep(POLL) => {}
                _ = stop.cancelled() => return,
            }
        }
    }
}

/// What becomes of the nodes, on the front end's stderr (its log).
fn say(m: &str) {
    eprintln!("pycell mcp --http: {m}");
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(active: usize, max: usize) -> pycell_protocol::info::DaemonStatus {
        pycell_protocol::info::DaemonStatus {
            socket: PathBuf::new(),
            max_concurrent_runs: max,
            max_runs_per_uid: max,
            active_runs: active,
            queued_runs: 0,
            max_queued_runs: 0,
            queue_wait_s: 0.0,
            memory_budget_bytes: 0,
            memory_admitted_bytes: 0,
            max_connections: 0,
            max_connections_per_uid: 0,
            connections: 0,
            uid_range: String::new(),
            warm_pools: vec![],
        }
    }

    fn three() -> Arc<Nodes> {
        Nodes::new(
            ["a", "b", "c"]
                .map(|n| (n.to_string(), PathBuf::from(n)))
                .to_vec(),
            None,
            None,
        )
    }

    #[test]
    fn runs_go_to_the_least_loaded_node_that_is_up() {
        let nodes = three();
        nodes
            .named("a")
            .unwrap()
            .polled(Ok(status(6, 8)), Instant::now());
        nodes
            .named("b")
            .unwrap()
            .polled(Ok(status(1, 8)), Instant::now());
        nodes
            .named("c")
            .unwrap()
            .polled(Ok(status(3, 8)), Instant::now());
        let order: Vec<String> = nodes.ranked().iter().map(|n| n.name.clone()).collect();
        assert_eq!(order, ["b", "c", "a"]);
        // Calls going now count: three on b put it after c.
        let b = nodes.named("b").unwrap();
        let leases: Vec<Lease> = (0..3).map(|_| b.lease()).collect();
        assert_eq!(nodes.ranked()[0].name, "c");
        // Runs that ended hold nothing there.
        drop(leases);
        assert_eq!(nodes.ranked()[0].name, "b");
        // Sessions started there do, until a status asked for after they
        // started covers them (one asked before may have been written
        // before they held their slots).
        let asked_at = Instant::now();
        let started = |n: usize| {
            for _ in 0..n {
                b.lease().started_a_session();
            }
        };
        started(3);
        assert_eq!(nodes.ranked()[0].name, "c");
        b.polled(Ok(status(1, 8)), asked_at);
        assert_eq!(nodes.ranked()[0].name, "c");
        b.polled(Ok(status(4, 8)), Instant::now());
        assert_eq!(nodes.ranked()[0].name, "c");
        b.polled(Ok(status(1, 8)), Instant::now());
        assert_eq!(nodes.ranked()[0].name, "b");
        b.mark_down("gone");
        assert!(nodes.ranked().iter().all(|n| n.name != "b"));
        assert!(nodes.none_up().contains("b: gone"));
        nodes.named("a").unwrap().polled(
            Err(PollFailed::Node(ClientError::Unexpected("refused".into()))),
            Instant::now(),
        );
        assert_eq!(nodes.ranked().len(), 1);
    }

    #[test]
    fn between_equal_loads_the_node_with_fewer_sessions_placed_goes_first() {
        let nodes = three();
        for name in ["a", "b", "c"] {
            nodes
                .named(name)
                .unwrap()
                .polled(Ok(status(1, 8)), Instant::now());
        }
        // a's session is in its status; b's status still counts a run
        // that has ended since: both look as busy.
        nodes.named("a").unwrap().lease().started_a_session();
        nodes
            .named("a")
            .unwrap()
            .polled(Ok(status(1, 8)), Instant::now());
        nodes.named("c").unwrap().lease().started_a_session();
        nodes
            .named("c")
            .unwrap()
            .polled(Ok(status(1, 8)), Instant::now());
        for _ in 0..3 {
            assert_eq!(nodes.ranked()[0].name, "b");
        }
    }

    #[test]
    fn equal_loads_take_turns() {
        let nodes = three();
        let firsts: Vec<String> = (0..3).map(|_| nodes.ranked()[0].name.clone()).collect();
        let mut sorted = firsts.clone();
        sorted.sort();
        assert_eq!(sorted, ["a", "b", "c"], "{firsts:?}");
    }

    #[test]
    fn handles_name_their_node() {
        let h = join_handle("s-0123abcd", "node-2");
        assert_eq!(h, "s-0123abcd@node-2");
        assert_eq!(split_handle(&h), Some(("s-0123abcd", "node-2")));
        assert_eq!(split_handle("s-0123abcd"), None);
    }
}
