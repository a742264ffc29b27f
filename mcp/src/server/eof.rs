//! Noticing the end of the client's input.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, ReadBuf};
use tokio_util::sync::CancellationToken;

/// Passes reads through and cancels a token at the end of the stream.
#[derive(Debug)]
pub struct EofSignal<R> {
    inner: R,
    eof: CancellationToken,
}

impl<R> EofSignal<R> {
    pub fn new(inner: R, eof: CancellationToken) -> Self {
        EofSignal { inner, eof }
    }
}

impl<R: AsyncRead + Unpin> AsyncRead for EofSignal<R> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let asked = buf.remaining() > 0;
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = polled {
            if asked && buf.filled().len() == before {
                self.eof.cancel();
            }
        }
        polled
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;

    #[tokio::test]
    async fn the_token_fires_at_the_end_only() {
        let eof = CancellationToken::new();
        let mut r = EofSignal::new(&b"ab"[..], eof.clone());
        let mut one = [0u8; 1];
        r.read_exact(&mut one).await.unwrap();
        assert!(!eof.is_cancelled());
        let mut rest = Vec::new();
        r.read_to_end(&mut rest).await.unwrap();
        assert_eq!(rest, b"b");
        assert!(eof.is_cancelled());
    }
}
