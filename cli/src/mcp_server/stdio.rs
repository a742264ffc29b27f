//! `pycell mcp`'s stdio transport: newline-delimited JSON-RPC as rmcp's
//! own, but every message that cannot be served is answered
//! ([`super::jsonrpc`]): not JSON, no message, over [`MAX_MESSAGE`].
//! A line is read into a buffer that never grows past the limit (an
//! oversized one keeps only its first [`HEAD`] bytes, for its id).

use std::sync::Arc;

use rmcp::service::{RoleServer, RxJsonRpcMessage, TxJsonRpcMessage};
use rmcp::transport::Transport;
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::sync::Mutex;

use super::jsonrpc::{answer_oversized, answer_unparsed, MAX_MESSAGE};

/// How much of an oversized message is kept to find its id in.
const HEAD: usize = 64 << 10;

/// One line read, or why there is none.
enum Line {
    /// A whole line is in the buffer.
    Whole,
    /// The line was over the limit; the buffer holds its head.
    Oversized,
    End,
}

pub struct StdioTransport<R, W> {
    read: BufReader<R>,
    line: Vec<u8>,
    limit: usize,
    /// Dropping the rest of an oversized line.
    discarding: bool,
    write: Arc<Mutex<Option<W>>>,
    /// Answers being written; `close` waits for them.
    answering: Vec<tokio::task::JoinHandle<()>>,
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
        StdioTransport {
            read: BufReader::new(read),
            line: Vec::new(),
            limit,
            discarding: false,
            write: Arc::new(Mutex::new(Some(write))),
            answering: Vec::new(),
        }
    }

    /// The next line into `self.line`, never past `limit`. Cancel-safe: a
    /// partial line stays in the buffer for the next call (rmcp polls
    /// `receive` in a `select!`), and nothing awaits between a copy and
    /// its `consume`.
    async fn read_line(&mut self) -> Line {
        loop {
            let available = match self.read.fill_buf().await {
                Ok([]) | Err(_) => return Line::End,
                Ok(a) => a,
            };
            let newline = available.iter().position(|b| *b == b'\n');
            let take = newline.map_or(available.len(), |i| i + 1);
            let room = HEAD.saturating_sub(self.line.len()).min(take);
            let over = self.discarding || self.line.len() + take > self.limit;
            if over {
                // Keep the head only (it may already be longer: cut it).
                self.line.truncate(HEAD);
                self.line.extend_from_slice(&available[..room]);
                self.discarding = newline.is_none();
            } else {
                self.line.extend_from_slice(&available[..take]);
            }
            self.read.consume(take);
            match (newline.is_some(), over) {
                (true, false) => return Line::Whole,
                (true, true) => return Line::Oversized,
                (false, _) => {}
            }
        }
    }

    /// Write `answer` as a line, on a task of its own (so that a
    /// cancelled `receive` never leaves half a line written).
    fn answer(&mut self, answer: Value) {
        let write = Arc::clone(&self.write);
        self.answering.retain(|t| !t.is_finished());
        self.answering.push(tokio::spawn(async move {
            let mut bytes = answer.to_string().into_bytes();
            bytes.push(b'\n');
            let _ = write_line(&write, &bytes).await;
        }));
    }
}

async fn write_line<W: AsyncWrite + Unpin>(
    write: &Mutex<Option<W>>,
    bytes: &[u8],
) -> std::io::Result<()> {
    let mut guard = write.lock().await;
    let Some(w) = guard.as_mut() else {
        return Err(std::io::Error::new(
            std::io::ErrorKind::NotConnected,
            "the transport is closed",
        ));
    };
    w.write_all(bytes).await?;
    w.flush().await
}

/// The message of a line: without its newline, a carriage return or a
/// UTF-8 byte order mark.
fn message_of(line: &[u8]) -> &[u8] {
    let line = line.strip_suffix(b"\n").unwrap_or(line);
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    line.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(line)
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
        let write = Arc::clone(&self.write);
        async move {
            let mut bytes = serde_json::to_vec(&item)?;
            bytes.push(b'\n');
            write_line(&write, &bytes).await
        }
    }

    async fn receive(&mut self) -> Option<RxJsonRpcMessage<RoleServer>> {
        loop {
            let read = self.read_line().await;
            let line = std::mem::take(&mut self.line);
            match read {
                Line::End => return None,
                Line::Oversized => {
                    self.answer(answer_oversized(&line, self.limit));
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
                        self.answer(answer);
                    }
                }
            }
        }
    }

    async fn close(&mut self) -> Result<(), Self::Error> {
        for answer in std::mem::take(&mut self.answering) {
            let _ = answer.await;
        }
        let mut write = self.write.lock().await;
        match write.take() {
            Some(mut w) => w.shutdown().await,
            None => Ok(()),
        }
    }
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
}
