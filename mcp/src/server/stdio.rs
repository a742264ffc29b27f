//! `pycell mcp`'s stdio transport: newline-delimited JSON-RPC as rmcp's
//! own, but every message that cannot be served is answered
//! ([`super::jsonrpc`]): not JSON, no message, over [`MAX_MESSAGE`]
//! (lines read bounded: [`crate::lines`]).

use rmcp::service::{RoleServer, RxJsonRpcMessage, TxJsonRpcMessage};
use rmcp::transport::Transport;
use std::sync::Arc;

use serde_json::Value;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::task::TaskTracker;

use super::jsonrpc::{answer_oversized, answer_unparsed, MAX_MESSAGE};
use crate::lines::{message_of, Line, LineReader, LineWriter};

/// Error answers being written at once, at most: past it no line is read
/// until one is out (a client that sends bad lines and reads nothing
/// stops being read).
const MAX_PENDING_ANSWERS: usize = 64;
/// How long the answers to malformed lines may take to be written once
/// the session ends (a client that sent its last line and reads no more
/// cannot hold us).
pub const ANSWER_GRACE: std::time::Duration = std::time::Duration::from_secs(5);

pub struct StdioTransport<R, W> {
    read: LineReader<R>,
    write: LineWriter<W>,
    /// Answers being written; `close` waits for them, and so may whoever
    /// holds [`StdioTransport::answers`] (rmcp drops the transport
    /// without closing it when the input ends before `initialize`).
    answering: TaskTracker,
    /// A permit per answer being written.
    room: Arc<Semaphore>,
    /// How long `close` waits for the answers and the writer.
    grace: std::time::Duration,
}

impl<R, W> StdioTransport<R, W>
where
    R: AsyncRead + Unpin + Send,
    W: AsyncWrite + Unpin + Send + 'static,
{
    pub fn new(read: R, write: W) -> Self {
        Self::with_limit(read, write, MAX_MESSAGE)
    }

    fn with_limit(read: R, write: W, limit: usize) -> Self {
        Self::with_limit_and_grace(read, write, limit, ANSWER_GRACE)
    }

    fn with_limit_and_grace(read: R, write: W, limit: usize, grace: std::time::Duration) -> Self {
        StdioTransport {
            read: LineReader::new(read, limit),
            write: LineWriter::new(write),
            answering: TaskTracker::new(),
            room: Arc::new(Semaphore::new(MAX_PENDING_ANSWERS)),
            grace,
        }
    }

    /// The answers this transport writes itself, to wait for
    /// ([`wait_for_answers`]) after it is gone.
    pub fn answers(&self) -> TaskTracker {
        self.answering.clone()
    }

    /// Write `answer` as a line, on a task of its own (so that a
    /// cancelled `receive` never leaves half a line written).
    fn answer(&self, answer: Value, permit: OwnedSemaphorePermit) {
        let write = self.write.clone();
        self.answering.spawn(async move {
            let _ = write.send(&answer).await;
            drop(permit);
        });
    }
}

impl<R, W> Transport<RoleServer> for StdioTransport<R, W>
where
    R: AsyncRead + Unpin + Send,
    W: AsyncWrite + Unpin + Send + 'static,
{
    type Error = std::io::Error;

    fn send(
        &mut self,
        item: TxJsonRpcMessage<RoleServer>,
    ) -> impl std::future::Future<Output = Result<(), Self::Error>> + Send + 'static {
        let write = self.write.clone();
        async move { write.send(&item).await }
    }

    async fn receive(&mut self) -> Option<RxJsonRpcMessage<RoleServer>> {
        loop {
            // Room for the answer this line may need, before it is read
            // (cancelled here, nothing is lost).
            let Ok(permit) = Arc::clone(&self.room).acquire_owned().await else {
                return None;
            };
            let (read, line) = self.read.next().await;
            match read {
                Line::End => return None,
                Line::Oversized => {
                    self.answer(answer_oversized(&line, self.read.limit()), permit);
                    continue;
                }
                Line::Whole => {}
            }
            let message = message_of(&line);
            if message.iter().all(u8::is_ascii_whitespace) {
                continue;
            }
            match serde_json::from_slice::<RxJsonRpcMessage<RoleServer>>(message) {
                Ok(m) => return Some(m),
                Err(e) => {
                    if let Some(answer) = answer_unparsed(message, &e) {
                        self.answer(answer, permit);
                    }
                }
            }
        }
    }

    /// Bounded: an answer stuck on a client that reads no more (holding
    /// the writer) cannot keep the session from ending.
    async fn close(&mut self) -> Result<(), Self::Error> {
        wait_for_answers(self.answering.clone(), self.grace).await;
        match tokio::time::timeout(self.grace, self.write.close()).await {
            Ok(closed) => closed,
            Err(_) => Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "the client reads no more of its output",
            )),
        }
    }
}

/// Waits, at most `grace`, for the answers a transport wrote itself (a
/// client that sent its last line and reads no more cannot hold us).
pub async fn wait_for_answers(answers: TaskTracker, grace: std::time::Duration) {
    answers.close();
    let _ = tokio::time::timeout(grace, answers.wait()).await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;

    /// Feeds `input` to a transport of `limit`; the messages it passed on
    /// and the lines it answered itself.
    async fn feed(input: Vec<u8>, limit: usize) -> (Vec<String>, Vec<Value>) {
        let (ours, mut theirs) = tokio::io::duplex(1 << 20);
        let mut t = StdioTransport::with_limit(&input[..], ours, limit);
        let mut passed = Vec::new();
        while let Some(m) = t.receive().await {
            passed.push(serde_json::to_string(&m).unwrap());
        }
        Transport::<RoleServer>::close(&mut t).await.unwrap();
        drop(t);
        let mut out = String::new();
        theirs.read_to_string(&mut out).await.unwrap();
        let answers = out
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        (passed, answers)
    }

    #[tokio::test]
    async fn bad_and_oversized_lines_are_answered_and_good_ones_pass() {
        let big = format!(
            "{{\"jsonrpc\":\"2.0\",\"id\":41,\"method\":\"tools/call\",\"params\":{{\"name\":\"run_python\",\"arguments\":{{\"code\":\"{}\"}}}}}}",
            "x".repeat(300_000)
        );
        let input = [
            "not json\n",
            "\r\n",
            "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\"}\r\n",
            &format!("{big}\n"),
            "{\"jsonrpc\":\"2.0\",\"id\":2,\"method\":\"ping\"}\n",
        ]
        .concat();
        let (passed, answers) = feed(input.into_bytes(), 200_000).await;
        assert_eq!(passed.len(), 2, "{passed:?}");
        assert!(
            passed[0].contains("\"id\":1") && passed[1].contains("\"id\":2"),
            "{passed:?}"
        );
        let codes: Vec<(Value, Value)> = answers
            .iter()
            .map(|a| (a["id"].clone(), a["error"]["code"].clone()))
            .collect();
        let want = vec![(Value::Null, (-32700).into()), (41.into(), (-32600).into())];
        let mut got = codes.clone();
        got.sort_by_key(|(id, _)| id.to_string());
        let mut want_sorted = want.clone();
        want_sorted.sort_by_key(|(id, _)| id.to_string());
        assert_eq!(got, want_sorted, "{answers:?}");
    }

    #[tokio::test]
    async fn an_oversized_last_line_without_newline_ends_quietly() {
        let input = format!(
            "{{\"jsonrpc\":\"2.0\",\"id\":3,\"params\":\"{}",
            "y".repeat(5000)
        );
        let (passed, _) = feed(input.into_bytes(), 1000).await;
        assert!(passed.is_empty());
    }

    #[tokio::test]
    async fn answers_of_a_transport_dropped_unclosed_can_still_be_awaited() {
        let (ours, mut theirs) = tokio::io::duplex(1 << 16);
        let mut t = StdioTransport::with_limit(&b"not json\n"[..], ours, 1000);
        let answers = t.answers();
        assert!(t.receive().await.is_none());
        // As rmcp does when the input ends before `initialize`.
        drop(t);
        wait_for_answers(answers.clone(), std::time::Duration::from_secs(30)).await;
        assert!(answers.is_empty(), "an answer is still being written");
        let mut line = vec![0u8; 1 << 10];
        let n = theirs.read(&mut line).await.unwrap();
        let answer: Value = serde_json::from_slice(&line[..n]).unwrap();
        assert_eq!(answer["error"]["code"], -32700, "{answer}");
    }

    #[tokio::test]
    async fn close_ends_while_a_client_reads_no_answers() {
        let input = "not json\n".repeat(4);
        let (ours, _theirs) = tokio::io::duplex(8);
        let grace = std::time::Duration::from_millis(50);
        let mut t = StdioTransport::with_limit_and_grace(input.as_bytes(), ours, 1000, grace);
        assert!(t.receive().await.is_none());
        let closing = Transport::<RoleServer>::close(&mut t);
        let closed = tokio::time::timeout(std::time::Duration::from_secs(60), closing).await;
        let err = closed.expect("close waited for a client that reads nothing");
        assert_eq!(err.unwrap_err().kind(), std::io::ErrorKind::TimedOut);
    }

    #[tokio::test]
    async fn a_client_that_reads_no_answers_stops_being_read() {
        let input = "not json\n".repeat(MAX_PENDING_ANSWERS * 3);
        // Room for no whole answer: every write waits for a reader.
        let (ours, _theirs) = tokio::io::duplex(8);
        let mut t = StdioTransport::with_limit(input.as_bytes(), ours, 1000);
        let wait = std::time::Duration::from_millis(200);
        let got = tokio::time::timeout(wait, t.receive()).await;
        assert!(got.is_err(), "every line was read: {got:?}");
        assert_eq!(t.answers().len(), MAX_PENDING_ANSWERS);
    }
}
