//! The client's transport to a tool server over stdio: rmcp's own would
//! parse an answer of up to 16 MiB into typed trees before anyone could
//! look at its size (a 14 MB result grew the client by 820 MiB). Here a
//! line is read bounded ([`crate::lines`]), and the answer to a
//! `tools/call` sent with a [`ResultCap`] is measured before it is
//! parsed: one far longer than any answer within the cap can be is never
//! parsed and becomes a [`RESULT_TOO_LARGE`] error for that call (the
//! exact check of the result's size comes after, in the tool service).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use rmcp::model::{ClientNotification, ClientRequest, JsonRpcMessage};
use rmcp::service::{RoleClient, RxJsonRpcMessage, TxJsonRpcMessage};
use rmcp::transport::Transport;
use serde_json::{json, Value};
use tokio::process::{Child, ChildStdin, ChildStdout};

use crate::lines::{message_of, Line, LineReader, LineWriter, HEAD};
use crate::server::jsonrpc::id_in_head;

/// The most any answer may be: the largest reply a tool call may bring
/// back, and a head's room for its envelope.
pub const MAX_ANSWER: usize = pycell_tools::frames::MAX_REPLY as usize + HEAD;

/// The error code of an answer refused for its size (JSON-RPC's range for
/// implementations' own errors), with [`TOO_LARGE_TAG`] as its data, by
/// which it is told from a server's own error of that code.
pub const RESULT_TOO_LARGE: i32 = -32001;
pub const TOO_LARGE_TAG: &str = "pycell: result too large";

/// The most bytes a call's result may bring back (the policy's
/// `max_result`), carried in the request's extensions (never sent).
#[derive(Debug, Clone, Copy)]
pub struct ResultCap(pub u64);

impl ResultCap {
    /// How long its answer's line may be before it is refused unread: a
    /// loose bound, as what the service measures (the result as compact
    /// JSON) comes in the line escaped, and usually twice (structured
    /// content, then the same as indented text): eight times the result
    /// and an envelope.
    fn line_allowance(self) -> usize {
        (self.0 as usize).saturating_mul(8).saturating_add(HEAD)
    }
}

pub struct ChildTransport {
    read: LineReader<ChildStdout>,
    write: LineWriter<ChildStdin>,
    /// The calls in flight with a cap, by request id (as JSON text).
    caps: Arc<Mutex<HashMap<String, ResultCap>>>,
    child: Child,
}

impl ChildTransport {
    /// Over `child`'s stdin and stdout (both piped).
    pub fn new(mut child: Child) -> std::io::Result<ChildTransport> {
        let missing = || std::io::Error::other("the server's stdin and stdout must be piped");
        let stdout = child.stdout.take().ok_or_else(missing)?;
        let stdin = child.stdin.take().ok_or_else(missing)?;
        Ok(ChildTransport {
            read: LineReader::new(stdout, MAX_ANSWER),
            write: LineWriter::new(stdin),
            caps: Arc::default(),
            child,
        })
    }

    /// The cap of the call `id`; taken out once its answer has come.
    fn cap(&self, id: &Value, take: bool) -> Option<ResultCap> {
        let mut caps = self.caps.lock().unwrap_or_else(|p| p.into_inner());
        match take {
            true => caps.remove(&id.to_string()),
            false => caps.get(&id.to_string()).copied(),
        }
    }
}

/// Whether `e` is this transport's refusal of an answer for its size.
pub fn is_too_large(e: &rmcp::ErrorData) -> bool {
    e.code.0 == RESULT_TOO_LARGE && e.data.as_ref().and_then(Value::as_str) == Some(TOO_LARGE_TAG)
}

/// How long an answer was: `Exactly` its length, or `Over` the most read.
#[derive(Debug, Clone, Copy)]
enum Size {
    Exactly(usize),
    Over(usize),
}

/// The error answer to call `id` whose answer was `size`.
fn too_large(
    id: Value,
    size: Size,
    cap: Option<ResultCap>,
) -> Option<RxJsonRpcMessage<RoleClient>> {
    let size = match size {
        Size::Exactly(n) => format!("{n} bytes"),
        Size::Over(n) => format!("over {n} bytes"),
    };
    let message = match cap {
        Some(c) => format!(
            "the answer is {size}, more than a result of {} bytes (the policy's [tools] max_result) can be; it was not read",
            c.0
        ),
        None => format!("the answer is {size}, more than any tool result may be; it was not read"),
    };
    let answer = json!({
        "jsonrpc": "2.0",
        "id": id,
        "error": {"code": RESULT_TOO_LARGE, "message": message, "data": TOO_LARGE_TAG},
    });
    serde_json::from_value(answer).ok()
}

impl Transport<RoleClient> for ChildTransport {
    type Error = std::io::Error;

    fn send(
        &mut self,
        item: TxJsonRpcMessage<RoleClient>,
    ) -> impl std::future::Future<Output = Result<(), Self::Error>> + Send + 'static {
        if let JsonRpcMessage::Notification(n) = &item {
            // A call given up (timed out): its answer, if it comes, is nobody's.
            if let ClientNotification::CancelledNotification(c) = &n.notification {
                if let Ok(id) = serde_json::to_value(&c.params.request_id) {
                    self.cap(&id, true);
                }
            }
        }
        if let JsonRpcMessage::Request(r) = &item {
            if let ClientRequest::CallToolRequest(call) = &r.request {
                if let Some(cap) = call.extensions.get::<ResultCap>() {
                    let id = serde_json::to_value(&r.id).unwrap_or_default().to_string();
                    let mut caps = self.caps.lock().unwrap_or_else(|p| p.into_inner());
                    // Calls that never got an answer (timed out) leave
                    // theirs behind: never more than this many kept.
                    if caps.len() >= 4096 {
                        caps.clear();
                    }
                    caps.insert(id, *cap);
                }
            }
        }
        let write = self.write.clone();
        async move { write.send(&item).await }
    }

    async fn receive(&mut self) -> Option<RxJsonRpcMessage<RoleClient>> {
        loop {
            let (read, line) = self.read.next().await;
            match read {
                Line::End => return None,
                Line::Oversized => {
                    // An answer of nobody we can name: the connection is
                    // out of step, so it ends (the calls in flight fail at
                    // once, and the next one starts the server again).
                    let id = id_in_head(&line)?;
                    let cap = self.cap(&id, true);
                    match too_large(id, Size::Over(self.read.limit()), cap) {
                        Some(m) => return Some(m),
                        None => continue,
                    }
                }
                Line::Whole => {}
            }
            let message = message_of(&line);
            if message.iter().all(u8::is_ascii_whitespace) {
                continue;
            }
            if let Some(id) = id_in_head(message) {
                let cap = self.cap(&id, false);
                if cap.is_some_and(|c| message.len() > c.line_allowance()) {
                    self.cap(&id, true);
                    match too_large(id, Size::Exactly(message.len()), cap) {
                        Some(m) => return Some(m),
                        None => continue,
                    }
                }
            }
            // What is no message is the server's mistake: skipped.
            let Ok(m) = serde_json::from_slice::<RxJsonRpcMessage<RoleClient>>(message) else {
                continue;
            };
            let answered = match &m {
                JsonRpcMessage::Response(r) => serde_json::to_value(&r.id).ok(),
                JsonRpcMessage::Error(e) => serde_json::to_value(&e.id).ok(),
                _ => None,
            };
            if let Some(id) = answered {
                self.cap(&id, true);
            }
            return Some(m);
        }
    }

    async fn close(&mut self) -> Result<(), Self::Error> {
        // Its stdin closed ends a stdio server; it is killed in any case.
        let _ = self.write.close().await;
        let _ = self.child.start_kill();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_answer_too_large_for_its_call_is_an_error_for_that_call() {
        let cap = ResultCap(1000);
        assert_eq!(cap.line_allowance(), 8000 + HEAD);
        let m = too_large(json!(5), Size::Exactly(70_000), Some(cap)).unwrap();
        let v = serde_json::to_value(&m).unwrap();
        assert_eq!(v["id"], 5);
        assert_eq!(v["error"]["code"], RESULT_TOO_LARGE);
        assert_eq!(v["error"]["data"], TOO_LARGE_TAG);
        assert!(
            v["error"]["message"]
                .as_str()
                .unwrap()
                .contains("70000 bytes"),
            "{v}"
        );
    }
}
