//! Serving one jail's tool channel: requests are read (bounded, and no
//! more of them while [`ToolLimits::max_concurrent`] calls are in flight,
//! so a flood of calls waits in the jail, not here), checked against the
//! [`Toolbox`], forwarded to the client's [`Upstream`] with a deadline,
//! capped on the way back, counted and audited. The service ends when
//! the jail closes its end; calls still in flight are then dropped.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::UnixStream;
use tokio::sync::Semaphore;

use crate::catalog::Toolbox;
use crate::frames::{
    read_request, FailureKind, ToolFailure, ToolReply, ToolRequest, MAX_REPLY, MAX_REQUEST,
};
use pycell_wire::framing::{encode_within, frame_len};

/// What a call returns: the tool's result as a Python value.
pub type CallFuture = Pin<Box<dyn Future<Output = Result<Value, ToolFailure>> + Send>>;

/// How long an upstream server may take to (re)start before a call: not
/// counted in the call's `call_timeout`, which starts once the server is
/// up (a server restarted after a crash is not slow to answer).
pub const SERVER_START_ALLOWANCE: Duration = Duration::from_secs(60);

/// Where calls go: the client's upstream servers (in its own process, or
/// relayed to it by pycelld). The upstream bounds the call itself by
/// `limits.call_timeout`, counted from when its server is up (the service
/// bounds the whole by that plus [`SERVER_START_ALLOWANCE`]), and may
/// refuse a result over `limits.max_result` before it parses it (the
/// service checks the size of what it gets again).
pub trait Upstream: Send + Sync + 'static {
    fn call(
        &self,
        server: &str,
        tool: &str,
        arguments: Map<String, Value>,
        limits: ToolLimits,
    ) -> CallFuture;
}

/// The failure of a result of `size` bytes, over `max`.
pub fn too_large(size: u64, max: u64) -> ToolFailure {
    ToolFailure {
        code: FailureKind::Limit,
        message: format!(
            "the result is {size} bytes, over the {max} a call may bring back (the policy's [tools] max_result)"
        ),
    }
}

/// The failure of a call `server`/`tool` that did not answer within `limit`.
pub fn timed_out(server: &str, tool: &str, limit: Duration) -> ToolFailure {
    ToolFailure {
        code: FailureKind::UpstreamFailed,
        message: format!(
            "{server}/{tool} did not answer within {} s (the policy's [tools] call_timeout)",
            limit.as_secs_f64()
        ),
    }
}

/// How much a run (or session) may call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ToolLimits {
    pub max_calls: u32,
    pub max_concurrent: u32,
    pub call_timeout: Duration,
    pub max_result: u64,
}

/// One call, as the audit log records it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CallRecord {
    pub server: String,
    pub tool: String,
    /// sha256 of the arguments' JSON, in hex.
    pub arguments_sha256: String,
    /// `ok`, or why it failed (a [`FailureKind`]'s name).
    pub status: String,
    pub duration_ms: u64,
    /// The request's and the reply's sizes.
    pub bytes_out: u64,
    pub bytes_in: u64,
}

/// Sees each call once it is answered.
pub type AuditHook = Arc<dyn Fn(&CallRecord) + Send + Sync>;

/// What a run's tool calls came to (its result's `tool_calls`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ToolCalls {
    /// Calls made (listings not counted).
    pub calls: u32,
    /// Of which failed or refused.
    pub failed: u32,
    /// Failures by reason (`denied`, `bad_arguments`, `upstream_failed`, ...).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub failures: BTreeMap<String, u32>,
    /// Calls the broker refused (not allowed, unknown, past the run's
    /// bound on calls), by `server.tool (reason)`: at most 16 entries.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub refused: BTreeMap<String, u32>,
    /// Bytes of arguments sent and of results received.
    pub bytes_out: u64,
    pub bytes_in: u64,
}

impl ToolCalls {
    fn add(&mut self, r: &CallRecord) {
        self.calls += 1;
        self.bytes_out += r.bytes_out;
        self.bytes_in += r.bytes_in;
        if r.status != "ok" {
            self.failed += 1;
            *self.failures.entry(r.status.clone()).or_default() += 1;
        }
        if REFUSALS.contains(&r.status.as_str()) {
            let key = refused_key(&r.server, &r.tool, &r.status);
            if self.refused.len() < MAX_REFUSED || self.refused.contains_key(&key) {
                *self.refused.entry(key).or_default() += 1;
            }
        }
    }
}

/// The failures that are the broker's refusals, not a tool's own.
const REFUSALS: [&str; 3] = ["denied", "unknown", "limit"];

/// The most refused calls a run's counts name.
const MAX_REFUSED: usize = 16;

/// `server.tool (reason)`, each name cut to 64 bytes (they come from the jail).
fn refused_key(server: &str, tool: &str, reason: &str) -> String {
    let cut = |s: &str| -> String {
        let mut end = s.len().min(64);
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s[..end].to_string()
    };
    format!("{}.{} ({reason})", cut(server), cut(tool))
}

/// A jail's tool channel and what serves it.
#[derive(Clone)]
pub struct ToolService {
    pub toolbox: Arc<Toolbox>,
    pub limits: ToolLimits,
    pub upstream: Arc<dyn Upstream>,
    pub audit: Option<AuditHook>,
}

impl std::fmt::Debug for ToolService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ToolService")
            .field("limits", &self.limits)
            .finish()
    }
}

/// What the service keeps while it serves: the counts, shared with the
/// tasks of calls in flight.
struct State {
    service: ToolService,
    counts: Mutex<ToolCalls>,
    /// Calls let through so far (the per-run bound).
    started: Mutex<u32>,
    writer: tokio::sync::Mutex<OwnedWriteHalf>,
}

/// The status of a call still in flight when its run ended.
pub const CANCELLED: &str = "cancelled";

/// A call being served: recorded once, when it is done or dropped.
struct PendingCall<'a> {
    state: &'a State,
    start: Instant,
    record: Option<CallRecord>,
}

impl PendingCall<'_> {
    fn done(&mut self, status: String, bytes_in: u64) {
        if let Some(mut r) = self.record.take() {
            r.status = status;
            r.bytes_in = bytes_in;
            r.duration_ms = self.start.elapsed().as_millis() as u64;
            self.state.record(&r);
        }
    }
}

impl Drop for PendingCall<'_> {
    fn drop(&mut self) {
        self.done(CANCELLED.to_string(), 0);
    }
}

/// Whether the other end of `channel` has closed (the jail's code ended,
/// or closed its channel), even while requests it sent are still unread.
fn peer_closed(channel: &OwnedReadHalf) -> bool {
    use rustix::event::{poll, PollFd, PollFlags, Timespec};
    let stream: &UnixStream = channel.as_ref();
    let mut fds = [PollFd::new(stream, PollFlags::RDHUP)];
    let now = Timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    match poll(&mut fds, Some(&now)) {
        Ok(_) => fds[0]
            .revents()
            .intersects(PollFlags::RDHUP | PollFlags::HUP),
        Err(_) => false,
    }
}

/// Resolves once [`peer_closed`] (looked at every 50 ms: only while every
/// slot is taken).
async fn hung_up(channel: &OwnedReadHalf) {
    while !peer_closed(channel) {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

impl ToolService {
    /// Serve `channel` until the jail closes it; what the calls came to.
    /// Requests still unread when the jail's end closes are dropped, never
    /// served: the code that sent them has ended.
    pub async fn serve(self, channel: UnixStream) -> ToolCalls {
        let (mut reader, writer) = channel.into_split();
        let slots = Arc::new(Semaphore::new(self.limits.max_concurrent.max(1) as usize));
        let state = Arc::new(State {
            service: self,
            counts: Mutex::default(),
            started: Mutex::new(0),
            writer: tokio::sync::Mutex::new(writer),
        });
        let mut calls = tokio::task::JoinSet::new();
        loop {
            // A slot first: while every one is taken, the jail's requests
            // wait in its socket; if its end closes meanwhile, the calls in
            // flight are dropped (below) and the waiting ones never served.
            let slot = tokio::select! {
                slot = Arc::clone(&slots).acquire_owned() => match slot {
                    Ok(slot) => slot,
                    Err(_) => break,
                },
                () = hung_up(&reader) => break,
            };
            let body = match read_frame(&mut reader).await {
                Ok(Some(body)) => body,
                Ok(None) => break,
                Err(e) => {
                    // Not a frame: nothing more can be read in step.
                    let _ = state.reply(0, Err(bad_request(e.to_string()))).await;
                    break;
                }
            };
            if peer_closed(&reader) {
                break;
            }
            while calls.try_join_next().is_some() {}
            let state = Arc::clone(&state);
            calls.spawn(async move {
                state.answer(body).await;
                drop(slot);
            });
        }
        // The jail is gone (or broke the framing): calls in flight are
        // dropped, their upstream requests with them.
        calls.shutdown().await;
        let counts = state.counts.lock().map(|c| c.clone()).unwrap_or_default();
        counts
    }
}

impl State {
    async fn answer(&self, body: Vec<u8>) {
        let request = match read_request(&body) {
            Ok(r) => r,
            Err(e) => {
                let id = loose_id(&body);
                let _ = self.reply(id, Err(bad_request(e.to_string()))).await;
                return;
            }
        };
        let id = request.id();
        let outcome = match request {
            ToolRequest::ListServers { .. } => Ok(self.service.toolbox.listing()),
            ToolRequest::ListTools { server, .. } => self.service.toolbox.tools_of(&server),
            ToolRequest::Call {
                server,
                tool,
                arguments,
                ..
            } => return self.call(id, server, tool, arguments, body.len()).await,
        };
        let _ = self.reply(id, outcome).await;
    }

    async fn call(
        &self,
        id: u64,
        server: String,
        tool: String,
        arguments: Map<String, Value>,
        bytes_out: usize,
    ) {
        let digest = hex(&Sha256::digest(
            serde_json::to_vec(&arguments).unwrap_or_default(),
        ));
        // Counted and audited however it ends: if the run ends first (this
        // future is then dropped), as `cancelled`.
        let mut pending = PendingCall {
            state: self,
            start: Instant::now(),
            record: Some(CallRecord {
                server: server.clone(),
                tool: tool.clone(),
                arguments_sha256: digest,
                status: CANCELLED.to_string(),
                duration_ms: 0,
                bytes_out: bytes_out as u64,
                bytes_in: 0,
            }),
        };
        let outcome = match self.admit(&server, &tool, &arguments) {
            Ok(()) => self.forward(&server, &tool, arguments).await,
            Err(f) => Err(f),
        };
        let (outcome, bytes_in) = self.cap(outcome);
        pending.done(
            match &outcome {
                Ok(_) => "ok".to_string(),
                Err(f) => kind_name(f.code),
            },
            bytes_in,
        );
        let _ = self.reply(id, outcome).await;
    }

    fn record(&self, record: &CallRecord) {
        if let Ok(mut c) = self.counts.lock() {
            c.add(record);
        }
        if let Some(audit) = &self.service.audit {
            audit(record);
        }
    }

    /// The toolbox's checks, then the per-run bound on calls.
    fn admit(
        &self,
        server: &str,
        tool: &str,
        arguments: &Map<String, Value>,
    ) -> Result<(), ToolFailure> {
        self.service.toolbox.check_call(server, tool, arguments)?;
        let max = self.service.limits.max_calls;
        let mut started = self.started.lock().map_err(|_| internal())?;
        if *started >= max {
            return Err(ToolFailure {
                code: FailureKind::Limit,
                message: format!(
                    "this run has made its {max} tool calls (the policy's [tools] max_calls)"
                ),
            });
        }
        *started += 1;
        Ok(())
    }

    async fn forward(
        &self,
        server: &str,
        tool: &str,
        arguments: Map<String, Value>,
    ) -> Result<Value, ToolFailure> {
        let limit = self.service.limits.call_timeout;
        let call = self
            .service
            .upstream
            .call(server, tool, arguments, self.service.limits);
        // The upstream counts `limit` from when its server is up; this
        // bounds a call whatever the upstream does.
        match tokio::time::timeout(limit + SERVER_START_ALLOWANCE, call).await {
            Ok(outcome) => outcome,
            Err(_) => Err(timed_out(server, tool, limit)),
        }
    }

    /// A result over `max_result` becomes a failure; the size it had.
    fn cap(&self, outcome: Result<Value, ToolFailure>) -> (Result<Value, ToolFailure>, u64) {
        let Ok(value) = outcome else {
            return (outcome, 0);
        };
        let size = serde_json::to_vec(&value).map(|v| v.len()).unwrap_or(0) as u64;
        let max = self
            .service
            .limits
            .max_result
            .min(u64::from(MAX_REPLY) - 4096);
        if size > max {
            return (Err(too_large(size, max)), size);
        }
        (Ok(value), size)
    }

    async fn reply(&self, id: u64, outcome: Result<Value, ToolFailure>) -> std::io::Result<()> {
        let reply = ToolReply {
            id,
            outcome: outcome.into(),
        };
        let frame = encode_within(&reply, u64::from(MAX_REPLY)).map_err(std::io::Error::other)?;
        let mut w = self.writer.lock().await;
        w.write_all(&frame).await
    }
}

/// One frame's body; `None` at a clean end. A length over
/// [`MAX_REQUEST`] is an error before anything of the body is read.
async fn read_frame(
    reader: &mut (impl AsyncReadExt + Unpin),
) -> Result<Option<Vec<u8>>, NotAFrame> {
    let mut head = [0u8; 4];
    match reader.read_exact(&mut head).await {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(NotAFrame::Unread(e)),
    }
    let len = frame_len(head, u64::from(MAX_REQUEST))?;
    let mut body = vec![0u8; len];
    reader
        .read_exact(&mut body)
        .await
        .map_err(NotAFrame::EndedEarly)?;
    Ok(Some(body))
}

/// What came on the channel instead of a request's frame.
#[derive(Debug, thiserror::Error)]
enum NotAFrame {
    #[error("{0}")]
    Unread(std::io::Error),
    #[error("a request: {0}")]
    Length(#[from] pycell_wire::framing::FrameError),
    #[error("the request ended early: {0}")]
    EndedEarly(std::io::Error),
}

/// The id of a request that did not parse, if it has one (so its caller
/// is answered rather than left waiting).
fn loose_id(body: &[u8]) -> u64 {
    #[derive(Deserialize)]
    struct Id {
        id: u64,
    }
    serde_json::from_slice::<Id>(body)
        .map(|i| i.id)
        .unwrap_or(0)
}

fn bad_request(message: String) -> ToolFailure {
    ToolFailure {
        code: FailureKind::BadRequest,
        message,
    }
}

fn internal() -> ToolFailure {
    ToolFailure {
        code: FailureKind::UpstreamFailed,
        message: "pycell's tool service failed".into(),
    }
}

fn kind_name(k: FailureKind) -> String {
    serde_json::to_value(k)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_else(|| "failed".into())
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::allow::Rule;
    use crate::catalog::{Catalog, CatalogServer, CatalogTool};
    use serde_json::json;

    struct Echo;

    impl Upstream for Echo {
        fn call(
            &self,
            server: &str,
            tool: &str,
            arguments: Map<String, Value>,
            limits: ToolLimits,
        ) -> CallFuture {
            let call_timeout = limits.call_timeout;
            let (server, tool) = (server.to_string(), tool.to_string());
            Box::pin(async move {
                let answer = async {
                    match tool.as_str() {
                        "hang" => {
                            tokio::time::sleep(Duration::from_secs(60)).await;
                            Ok(Value::Null)
                        }
                        "big" => Ok(json!("x".repeat(5000))),
                        _ => Ok(Value::Object(arguments)),
                    }
                };
                tokio::time::timeout(call_timeout, answer)
                    .await
                    .unwrap_or_else(|_| Err(timed_out(&server, &tool, call_timeout)))
            })
        }
    }

    fn service(max_calls: u32) -> ToolService {
        let tool = |name: &str| CatalogTool {
            name: name.into(),
            description: String::new(),
            input_schema: json!({"type": "object"}),
            client_allows: true,
        };
        let catalog = Catalog {
            servers: vec![CatalogServer {
                name: "t".into(),
                unavailable: None,
                tools: vec![tool("echo"), tool("hang"), tool("big")],
            }],
        };
        ToolService {
            toolbox: Arc::new(Toolbox::new(&catalog, &[Rule::parse("*/*").unwrap()])),
            limits: ToolLimits {
                max_calls,
                max_concurrent: 2,
                call_timeout: Duration::from_millis(200),
                max_result: 1024,
            },
            upstream: Arc::new(Echo),
            audit: None,
        }
    }

    async fn ask(s: &mut UnixStream, body: Value) -> Value {
        let body = serde_json::to_vec(&body).unwrap();
        s.write_all(&(body.len() as u32).to_be_bytes())
            .await
            .unwrap();
        s.write_all(&body).await.unwrap();
        let mut head = [0u8; 4];
        s.read_exact(&mut head).await.unwrap();
        let mut reply = vec![0u8; u32::from_be_bytes(head) as usize];
        s.read_exact(&mut reply).await.unwrap();
        serde_json::from_slice(&reply).unwrap()
    }

    #[tokio::test]
    async fn calls_are_answered_bounded_and_counted() {
        let (mut jail, ours) = UnixStream::pair().unwrap();
        let served = tokio::spawn(service(3).serve(ours));
        let r = ask(
            &mut jail,
            json!({"op": "call", "id": 1, "server": "t", "tool": "echo", "arguments": {"a": 1}}),
        )
        .await;
        assert_eq!(r, json!({"id": 1, "ok": {"a": 1}}));
        let r = ask(
            &mut jail,
            json!({"op": "call", "id": 2, "server": "t", "tool": "hang"}),
        )
        .await;
        assert_eq!(r["error"]["code"], "upstream_failed", "{r}");
        let r = ask(
            &mut jail,
            json!({"op": "call", "id": 3, "server": "t", "tool": "big"}),
        )
        .await;
        assert_eq!(r["error"]["code"], "limit", "{r}");
        let r = ask(
            &mut jail,
            json!({"op": "call", "id": 4, "server": "t", "tool": "echo"}),
        )
        .await;
        assert!(
            r["error"]["message"]
                .as_str()
                .unwrap()
                .contains("max_calls"),
            "{r}"
        );
        let r = ask(&mut jail, json!({"op": "list_servers", "id": 5})).await;
        assert_eq!(r["ok"][0]["tools"].as_array().unwrap().len(), 3);
        let r = ask(&mut jail, json!({"op": "call", "id": 6, "token": "x"})).await;
        assert_eq!(
            r,
            json!({"id": 6, "error": {"code": "bad_request", "message": r["error"]["message"]}})
        );
        drop(jail);
        let counts = served.await.unwrap();
        assert_eq!(counts.calls, 4);
        assert_eq!(counts.failed, 3);
        assert_eq!(counts.failures.get("limit"), Some(&2));
    }

    #[tokio::test]
    async fn an_oversized_frame_ends_the_service() {
        let (mut jail, ours) = UnixStream::pair().unwrap();
        let served = tokio::spawn(service(3).serve(ours));
        jail.write_all(&(MAX_REQUEST + 1).to_be_bytes())
            .await
            .unwrap();
        let mut head = [0u8; 4];
        jail.read_exact(&mut head).await.unwrap();
        let counts = tokio::time::timeout(Duration::from_secs(5), served)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(counts.calls, 0);
    }

    async fn send(s: &mut UnixStream, body: Value) {
        let body = serde_json::to_vec(&body).unwrap();
        s.write_all(&(body.len() as u32).to_be_bytes())
            .await
            .unwrap();
        s.write_all(&body).await.unwrap();
    }

    /// The jail queues calls and its code ends: the calls in flight are
    /// counted (as cancelled, their upstream had them), the queued ones
    /// never reach an upstream.
    #[tokio::test]
    async fn calls_queued_when_the_code_ends_are_dropped_and_calls_in_flight_counted() {
        let (mut jail, ours) = UnixStream::pair().unwrap();
        let audited = Arc::new(Mutex::new(Vec::new()));
        let mut s = service(10);
        s.limits.max_concurrent = 1;
        s.limits.call_timeout = Duration::from_secs(30);
        let log = Arc::clone(&audited);
        s.audit = Some(Arc::new(move |r: &CallRecord| {
            log.lock().unwrap().push(r.status.clone())
        }));
        let served = tokio::spawn(s.serve(ours));
        send(
            &mut jail,
            json!({"op": "call", "id": 1, "server": "t", "tool": "hang"}),
        )
        .await;
        for id in 2..=10 {
            send(
                &mut jail,
                json!({"op": "call", "id": id, "server": "t", "tool": "echo"}),
            )
            .await;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        drop(jail);
        let counts = tokio::time::timeout(Duration::from_secs(5), served)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(counts.calls, 1, "{counts:?}");
        assert_eq!(counts.failures.get(CANCELLED), Some(&1), "{counts:?}");
        assert_eq!(*audited.lock().unwrap(), [CANCELLED]);
    }
}
