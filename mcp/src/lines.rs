//! Newline-delimited JSON-RPC, read and written for pycell's own MCP
//! transports (the stdio server, `server::stdio`; the client of tool
//! servers, `tool_servers::transport`): a line is read into a buffer that
//! never grows past its limit (an oversized line keeps only its first
//! [`HEAD`] bytes, to find its id in), and lines are written whole, one
//! writer at a time.

use std::sync::Arc;

use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::sync::Mutex;

/// How much of an oversized line is kept.
pub const HEAD: usize = 64 << 10;

/// One line read, or why there is none.
#[derive(Debug, PartialEq, Eq)]
pub enum Line {
    /// A whole line is in the buffer.
    Whole,
    /// The line was over the limit; the buffer holds its head.
    Oversized,
    End,
}

pub struct LineReader<R> {
    read: BufReader<R>,
    line: Vec<u8>,
    limit: usize,
    /// Dropping the rest of an oversized line.
    discarding: bool,
}

impl<R: AsyncRead + Unpin> LineReader<R> {
    pub fn new(read: R, limit: usize) -> Self {
        LineReader {
            read: BufReader::new(read),
            line: Vec::new(),
            limit,
            discarding: false,
        }
    }

    pub fn limit(&self) -> usize {
        self.limit
    }

    /// The next line (or an oversized one's head), taken out of the
    /// buffer. Cancel-safe: a partial line stays in the buffer for the
    /// next call (rmcp polls `receive` in a `select!`), and nothing awaits
    /// between a copy and its `consume`.
    pub async fn next(&mut self) -> (Line, Vec<u8>) {
        let read = self.read_line().await;
        (read, std::mem::take(&mut self.line))
    }

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
}

/// The message of a line: without its newline, a carriage return or a
/// UTF-8 byte order mark.
pub fn message_of(line: &[u8]) -> &[u8] {
    let line = line.strip_suffix(b"\n").unwrap_or(line);
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    line.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(line)
}

/// The writing half, shared by every sender; `close` takes it away.
pub struct LineWriter<W>(Arc<Mutex<Option<W>>>);

impl<W> Clone for LineWriter<W> {
    fn clone(&self) -> Self {
        LineWriter(Arc::clone(&self.0))
    }
}

impl<W: AsyncWrite + Unpin> LineWriter<W> {
    pub fn new(write: W) -> Self {
        LineWriter(Arc::new(Mutex::new(Some(write))))
    }

    /// `message` as one line (a newline added).
    pub async fn send(&self, message: &impl serde::Serialize) -> std::io::Result<()> {
        let mut bytes = serde_json::to_vec(message)?;
        bytes.push(b'\n');
        let mut guard = self.0.lock().await;
        let Some(w) = guard.as_mut() else {
            return Err(std::io::Error::new(
                std::io::ErrorKind::NotConnected,
                "the transport is closed",
            ));
        };
        w.write_all(&bytes).await?;
        w.flush().await
    }

    pub async fn close(&self) -> std::io::Result<()> {
        match self.0.lock().await.take() {
            Some(mut w) => w.shutdown().await,
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn lines_are_bounded_and_an_oversized_one_keeps_its_head() {
        let long = "x".repeat(HEAD * 3);
        let input = format!("short\r\n{long}\nafter\n{long}");
        let mut r = LineReader::new(input.as_bytes(), HEAD * 2);
        let (l, b) = r.next().await;
        assert_eq!((l, message_of(&b)), (Line::Whole, &b"short"[..]));
        let (l, b) = r.next().await;
        assert_eq!((l, b.len()), (Line::Oversized, HEAD));
        let (l, b) = r.next().await;
        assert_eq!((l, message_of(&b)), (Line::Whole, &b"after"[..]));
        // An oversized last line without its newline: the end.
        assert_eq!(r.next().await.0, Line::End);
    }
}
