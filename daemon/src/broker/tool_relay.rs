//! Code mode through pycelld: the calls a run's code makes (already
//! checked by the broker's tool service: the policy's rules, the input
//! schema, the limits) go to the client that offered the tools, on the
//! run's own connection (`tool_call`), and come back as its `tool_answer`.
//! The client's servers are its own: another connection, another uid,
//! never sees them, and pycelld never starts them.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use pycell_protocol::messages::RawJson;
use pycell_protocol::messages::ServerMessage;
use pycell_tools::frames::{FailureKind, Outcome, ToolFailure};
use pycell_tools::service::{too_large, CallFuture, ToolLimits, Upstream};
use serde_json::{Map, Value};

/// Bytes an answer may have beyond the value it carries (`{"ok": ...}`).
const ANSWER_SLACK: u64 = 4096;
use tokio::sync::{mpsc, oneshot};

/// Calls of one run (or session call) waiting for their client.
#[derive(Debug)]
pub(crate) struct ToolRelay {
    /// The run's id on its connection.
    id: String,
    out: mpsc::Sender<ServerMessage>,
    next: AtomicU64,
    /// Each call's waiter, and the largest answer it takes.
    waiting: Mutex<HashMap<u64, (oneshot::Sender<Outcome>, u64)>>,
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

    /// The client's answer to call `call`, as it came (an unknown or late
    /// one is dropped: its call has failed already). Parsed only if its
    /// size is within the call's `max_result`: an answer over it costs its
    /// bytes, never the tree a parse would build.
    pub(crate) fn answer(&self, call: u64, outcome: &RawJson) {
        let waiter = self.waiting.lock().ok().and_then(|mut w| w.remove(&call));
        let Some((w, max_result)) = waiter else {
            return;
        };
        let size = outcome.get().len() as u64;
        let outcome = match size > max_result.saturating_add(ANSWER_SLACK) {
            true => Outcome::Error(too_large(size, max_result)),
            false => serde_json::from_str(outcome.get()).unwrap_or_else(|e| {
                Outcome::Error(ToolFailure {
                    code: FailureKind::UpstreamFailed,
                    message: format!("the client's answer is not an outcome: {e}"),
                })
            }),
        };
        let _ = w.send(outcome);
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
        limits: ToolLimits,
    ) -> CallFuture {
        let call = self.next.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        if let Ok(mut w) = self.waiting.lock() {
            w.insert(call, (tx, limits.max_result));
        }
        let msg = ServerMessage::ToolCall {
            id: self.id.clone(),
            call,
            server: server.to_string(),
            tool: tool.to_string(),
            arguments,
            timeout_ms: Some(limits.call_timeout.as_millis() as u64),
            max_result_bytes: Some(limits.max_result),
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
        limits: ToolLimits,
    ) -> CallFuture {
        let current = self.current.lock().ok().and_then(|c| c.clone());
        match current {
            Some(relay) => relay.call(server, tool, arguments, limits),
            None => Box::pin(async {
                Err(ToolFailure {
                    code: FailureKind::UpstreamFailed,
                    message: "no client is waiting on this session: tools are called only while a call of its client runs".into(),
                })
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::value::RawValue;
    use std::time::Duration;

    fn limits(max_result: u64) -> ToolLimits {
        ToolLimits {
            max_calls: 10,
            max_concurrent: 1,
            call_timeout: Duration::from_secs(5),
            max_result,
        }
    }

    fn raw(text: String) -> RawJson {
        RawJson(RawValue::from_string(text).unwrap())
    }

    /// An answer over the call's max_result is refused by its size,
    /// before it is parsed; one within it is the outcome it says.
    #[tokio::test]
    async fn an_answer_is_parsed_only_within_its_calls_max_result() {
        let (tx, mut rx) = mpsc::channel(4);
        let relay = ToolRelay::new("1", tx);
        let big = relay.call("s", "t", Map::new(), limits(1000));
        let small = relay.call("s", "t", Map::new(), limits(1000));
        let (big, small) = (tokio::spawn(big), tokio::spawn(small));
        for _ in 0..2 {
            rx.recv().await.expect("the call goes to the client");
        }
        // Not even JSON past its first bytes: never parsed.
        relay.answer(1, &raw(format!("{{\"ok\": [{}1]}}", "1,".repeat(100_000))));
        relay.answer(2, &raw("{\"ok\": {\"a\": 1}}".into()));
        let f = big.await.unwrap().unwrap_err();
        assert_eq!(f.code, FailureKind::Limit, "{f:?}");
        assert!(f.message.contains("200011 bytes"), "{f:?}");
        assert_eq!(small.await.unwrap().unwrap(), serde_json::json!({"a": 1}));
    }
}
