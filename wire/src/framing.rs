//! Length-delimited frames: a 4-byte big-endian length, then that many bytes
//! of JSON. Every reader and writer names its bound, and a frame over it is
//! refused before anything is read or allocated for it. The jailer's stdin
//! (spec and work frames), the client/daemon protocol and pycelld's monitor
//! link (`pycell_protocol::framing`, blocking and tokio, with the
//! protocol's bound) all use them.

use std::io::{self, Read};

use serde::{de::DeserializeOwned, Serialize};

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

/// How many bytes `msg`'s JSON takes, counted without keeping it.
pub fn encoded_len<T: Serialize>(msg: &T) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += buf.len();
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut count = Count(0);
    match serde_json::to_writer(&mut count, msg) {
        Ok(()) => count.0,
        Err(_) => usize::MAX,
    }
}

/// One frame of `msg`, if its JSON is at most `max` bytes (and `u32::MAX`).
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

/// Read one frame of at most `max` bytes and decode it.
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

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, PartialEq, serde::Serialize, serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Msg {
        n: u32,
    }

    #[test]
    fn frames_round_trip_within_their_bound() {
        let frame = encode_within(&Msg { n: 7 }, 64).unwrap();
        assert_eq!(&frame[..4], &7u32.to_be_bytes());
        let back: Msg = read_sync_within(&mut &frame[..], 7).unwrap();
        assert_eq!(back, Msg { n: 7 });
        assert!(matches!(
            read_sync_within::<Msg>(&mut &frame[..], 6),
            Err(FrameError::TooLarge(7, 6))
        ));
        assert!(matches!(
            encode_within(&Msg { n: 7 }, 6),
            Err(FrameError::TooLarge(7, 6))
        ));
        assert!(matches!(
            read_sync_within::<Msg>(&mut &[][..], 64),
            Err(FrameError::Closed)
        ));
        assert!(matches!(
            decode::<Msg>(br#"{"n":1,"x":2}"#),
            Err(FrameError::BadMessage(_))
        ));
    }
}
