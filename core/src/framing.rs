//! Length-delimited frames: a 4-byte big-endian length, then that many bytes
//! of JSON. Frames over [`MAX_FRAME`] (the protocol's; the `_within`
//! functions take another bound) are refused before anything is read or
//! allocated for them. The client/daemon protocol, the monitor link and the
//! jailer's stdin (spec and work frames, see [`crate::runner`]) all use them.

use std::io::{self, Read, Write};

use serde::{de::DeserializeOwned, Serialize};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::protocol::MAX_FRAME;

#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    #[error("connection closed")]
    Closed,
    #[error("frame of {0} bytes exceeds the maximum of {1}")]
    TooLarge(u64, u64),
    #[error("i/o: {0}")]
    Io(#[from] io::Error),
    #[error("bad message: {0}")]
    BadMessage(String),
}

/// The body length a frame's header announces, if it is at most `max`.
pub fn frame_len(head: [u8; 4], max: u64) -> Result<usize, FrameError> {
    let len = u64::from(u32::from_be_bytes(head));
    if len > max {
        return Err(FrameError::TooLarge(len, max));
    }
    Ok(len as usize)
}

fn check_len(head: [u8; 4]) -> Result<usize, FrameError> {
    frame_len(head, u64::from(MAX_FRAME))
}

pub fn encode<T: Serialize>(msg: &T) -> Result<Vec<u8>, FrameError> {
    encode_within(msg, u64::from(MAX_FRAME))
}

/// [`encode`] with a bound of the caller's (at most `u32::MAX`).
pub fn encode_within<T: Serialize>(msg: &T, max: u64) -> Result<Vec<u8>, FrameError> {
    let body = serde_json::to_vec(msg).map_err(|e| FrameError::BadMessage(e.to_string()))?;
    let too_large = || FrameError::TooLarge(body.len() as u64, max);
    let len = u32::try_from(body.len()).map_err(|_| too_large())?;
    if u64::from(len) > max {
        return Err(too_large());
    }
    let mut out = Vec::with_capacity(4 + body.len());
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(&body);
    Ok(out)
}

pub fn decode<T: DeserializeOwned>(body: &[u8]) -> Result<T, FrameError> {
    serde_json::from_slice(body).map_err(|e| FrameError::BadMessage(e.to_string()))
}

pub fn write_sync<T: Serialize>(w: &mut impl Write, msg: &T) -> Result<(), FrameError> {
    w.write_all(&encode(msg)?)?;
    w.flush()?;
    Ok(())
}

pub fn read_sync<T: DeserializeOwned>(r: &mut impl Read) -> Result<T, FrameError> {
    read_sync_within(r, u64::from(MAX_FRAME))
}

/// [`read_sync`] with a bound of the caller's.
pub fn read_sync_within<T: DeserializeOwned>(r: &mut impl Read, max: u64) -> Result<T, FrameError> {
    let mut head = [0u8; 4];
    match r.read_exact(&mut head) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Err(FrameError::Closed),
        Err(e) => return Err(e.into()),
    }
    let len = frame_len(head, max)?;
    let mut body = vec![0u8; len];
    r.read_exact(&mut body)?;
    decode(&body)
}

pub async fn write_async<T: Serialize>(
    w: &mut (impl tokio::io::AsyncWrite + Unpin),
    msg: &T,
) -> Result<(), FrameError> {
    w.write_all(&encode(msg)?).await?;
    w.flush().await?;
    Ok(())
}

/// Read one frame's raw body (the caller decodes it, so that a bad message
/// can be answered without dropping the connection).
pub async fn read_async_raw(
    r: &mut (impl tokio::io::AsyncRead + Unpin),
) -> Result<Vec<u8>, FrameError> {
    let mut head = [0u8; 4];
    match r.read_exact(&mut head).await {
        Ok(_) => {}
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Err(FrameError::Closed),
        Err(e) => return Err(e.into()),
    }
    read_body(r, head).await
}

async fn read_body(
    r: &mut (impl tokio::io::AsyncRead + Unpin),
    head: [u8; 4],
) -> Result<Vec<u8>, FrameError> {
    let len = check_len(head)?;
    let mut body = vec![0u8; len];
    r.read_exact(&mut body).await?;
    Ok(body)
}

/// [`read_async_raw`] for a peer that may dawdle: the frame may take as
/// long as it likes to begin, but once its first byte is in, the rest must
/// arrive within `limit` (else `Io(TimedOut)`).
pub async fn read_async_raw_within(
    r: &mut (impl tokio::io::AsyncRead + Unpin),
    limit: std::time::Duration,
) -> Result<Vec<u8>, FrameError> {
    let mut head = [0u8; 4];
    if r.read(&mut head[..1]).await? == 0 {
        return Err(FrameError::Closed);
    }
    let rest = async {
        r.read_exact(&mut head[1..]).await?;
        read_body(r, head).await
    };
    tokio::time::timeout(limit, rest)
        .await
        .unwrap_or_else(|_| Err(io::Error::from(io::ErrorKind::TimedOut).into()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::ClientMessage;

    #[test]
    fn round_trip_and_limits() {
        let msg = ClientMessage::Hello {
            version: 1,
            client: "t".into(),
        };
        let mut buf = Vec::new();
        write_sync(&mut buf, &msg).unwrap();
        let back: ClientMessage = read_sync(&mut &buf[..]).unwrap();
        assert_eq!(back, msg);
        let huge = (MAX_FRAME + 1).to_be_bytes();
        assert!(matches!(
            read_sync::<ClientMessage>(&mut &huge[..]),
            Err(FrameError::TooLarge(..))
        ));
        assert!(matches!(
            read_sync::<ClientMessage>(&mut &[][..]),
            Err(FrameError::Closed)
        ));
        let mut bad = Vec::new();
        bad.extend_from_slice(&5u32.to_be_bytes());
        bad.extend_from_slice(b"nope!");
        assert!(matches!(
            read_sync::<ClientMessage>(&mut &bad[..]),
            Err(FrameError::BadMessage(_))
        ));
    }

    #[test]
    fn unknown_fields_and_types_are_bad_messages() {
        let e = decode::<ClientMessage>(br#"{"type":"hello","version":1,"client":"x","extra":1}"#)
            .unwrap_err();
        assert!(matches!(e, FrameError::BadMessage(_)));
        let e = decode::<ClientMessage>(br#"{"type":"format_disk"}"#).unwrap_err();
        assert!(matches!(e, FrameError::BadMessage(_)));
    }
}
