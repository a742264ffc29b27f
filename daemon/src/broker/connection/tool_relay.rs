//! Code mode through pycelld: the calls a run's code makes (already
//! checked by the broker's tool service: the policy's rules, the input
//! schema, the limits) go to the client that offered the tools, on the
//! run's own connection (`tool_call`), and come back as its `tool_answer`.
//! The client's servers are its own: another connection, another uid,
//! never sees them, and pycelld never starts them.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use pycell_protocol::messages::ServerMessage;
use pycell_tools::frames::{FailureKind, Outcome, ToolFailure};
use pycell_tools::service::{CallFuture, Upstream};
use serde_json::{Map, Value};
use tokio::sync::{mpsc, oneshot};

/// Calls of one run (or session call) waiting for their client.
#[derive(Debug)]
pub(crate) struct ToolRelay {
    /// The run's id on its connection.
    id: String,
    out: mpsc::Sender<ServerMessage>,
    next: AtomicU64,
    waiting: Mutex<HashMap<u64, oneshot::Sender<Outcome>>>,
}

impl ToolRelay {
    pub(crate) fn new(id: &str, out: mpsc::Sender<ServerMessage>) -> Arc<ToolRelay> {
        Arc::new(ToolRelay {
            id: id.to_string(),
            out,
            next: AtomicU64::new(1),
            waiting: Mutex::default(),
        })
    }

    /// The client's answer to call `call` (an unknown or late one is
    /// dropped: its call has failed already).
    pub(crate) fn answer(&self, call: u64, outcome: Outcome) {
        let waiter = self.waiting.lock().ok().and_then(|mut w| w.remove(&call));
        if let Some(w) = waiter {
            let _ = w.send(outcome);
        }
    }
}

impl Upstream for ToolRelay {
    /// The client bounds the call by `call_timeout` once its server is up
    /// (it is told the limit); the tool service bounds the whole.
    fn call(
        &self,
        server: &str,
        tool: &str,
        arguments: Map<String, Value>,
        call_timeout: Duration,
    ) -> CallFuture {
        let call = self.next.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        if let Ok(mut w) = self.waiting.lock() {
            w.insert(call, tx);
        }
        let msg = ServerMessage::ToolCall {
            id: self.id.clone(),
            call,
            server: server.to_string(),
            tool: tool.to_string(),
            arguments,
            timeout_ms: Some(call_timeout.as_millis() as u64),
        };
        let out = self.out.clone();
        Box::pin(async move {
            let gone = || ToolFailure {
                code: FailureKind::UpstreamFailed,
                message: "the client that offered the tools is gone".into(),
            };
            out.send(msg).await.map_err(|_| gone())?;
            rx.await.map_err(|_| gone())?.into_result()
        })
    }
}

/// A session's way to its tools: the connection of the call being served
/// (sessions serve one call at a time), or none between calls.
#[derive(Debug, Default)]
pub(crate) struct RelaySwitch {
    current: Mutex<Option<Arc<ToolRelay>>>,
}

impl RelaySwitch {
    /// Calls go to `relay` from now on (none: they fail).
    pub(crate) fn set(&self, relay: Option<Arc<ToolRelay>>) {
        if let Ok(mut c) = self.current.lock() {
            *c = relay;
        }
    }
}

impl Upstream for RelaySwitch {
    fn call(
        &self,
        server: &str,
        tool: &str,
        arguments: Map<String, Value>,
        call_timeout: Duration,
    ) -> CallFuture {
        let current = self.current.lock().ok().and_then(|c| c.clone());
        match current {
            Some(relay) => relay.call(server, tool, arguments, call_timeout),
            None => Box::pin(async {
                Err(ToolFailure {
                    code: FailureKind::UpstreamFailed,
                    message: "no client is waiting on this session: tools are called only while a call of its client runs".into(),
                })
            }),
        }
    }
}
