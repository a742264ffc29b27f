//! The socket protocol's frames ([`pycell_wire::framing`], bounded by the
//! protocol's [`MAX_FRAME`]): blocking, for the client and pycelld's
//! monitor link, and tokio, for the broker's connections.

use std::io::{self, Read, Write};

use serde::{de::DeserializeOwned, Serialize};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

pub use pycell_wire::framing::{decode, encode_within, frame_len, read_sync_within, FrameError};

use crate::messages::{ClientMessage, RawJson, MAX_FRAME};

/// A client's message from its frame's body. A `tool_answer` is decoded
/// as a plain struct, its `outcome` kept as text (serde buffers an
/// internally tagged enum's fields into a tree first, which for a large
/// outcome costs many times its size, and cannot keep text as it came).
pub fn decode_client_message(body: &[u8]) -> Result<ClientMessage, FrameError> {
    #[derive(serde::Deserialize)]
    struct Kind {
        #[serde(rename = "type")]
        kind: String,
    }
    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct ToolAnswer {
        #[serde(rename = "type")]
        _kind: String,
        id: String,
        call: u64,
        outcome: RawJson,
    }
    // Every other field skipped, not kept.
    let kind: Kind = decode(body)?;
    if kind.kind != "tool_answer" {
        return decode(body);
    }
    let a: ToolAnswer = decode(body)?;
    Ok(ClientMessage::ToolAnswer {
        id: a.id,
        call: a.call,
        outcome: a.outcome,
    })
}

pub fn encode<T: Serialize>(msg: &T) -> Result<Vec<u8>, FrameError> {
    encode_within(msg, u64::from(MAX_FRAME))
}

pub fn write_sync<T: Serialize>(w: &mut impl Write, msg: &T) -> Result<(), FrameError> {
    w.write_all(&encode(msg)?)?;
    w.flush()?;
    Ok(())
}

pub fn read_sync<T: DeserializeOwned>(r: &mut impl Read) -> Result<T, FrameError> {
    read_sync_within(r, u64::from(MAX_FRAME))
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
    let len = frame_len(head, u64::from(MAX_FRAME))?;
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
    use crate::messages::ClientMessage;

    #[test]
    fn round_trip_and_limits() {
        let msg = ClientMessage::Hello {
            version: 1,
            client: "t".into(),
            identity: None,
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
