//! The jailer's event stream for tokio readers: the same codec as
//! [`pycell_wire::events::read_event`] (the same header check and frame
//! decoding), so every mode reads the stream the same way.

use std::io;

use pycell_wire::events::{decode_frame, payload_len, truncated, Event, EventError, HEADER_LEN};
use tokio::io::{AsyncRead, AsyncReadExt};

pub use pycell_wire::events::{read_event, Stream};

/// The next event; `Ok(None)` when the stream ends between frames.
pub async fn read_event_async(
    r: &mut (impl AsyncRead + Unpin),
) -> Result<Option<Event>, EventError> {
    let mut head = [0u8; HEADER_LEN];
    match r.read_exact(&mut head[..1]).await {
        Ok(_) => {}
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e.into()),
    }
    r.read_exact(&mut head[1..]).await.map_err(truncated)?;
    let mut payload = vec![0u8; payload_len(&head)?];
    r.read_exact(&mut payload).await.map_err(truncated)?;
    decode_frame(head[0], payload).map(Some)
}

#[cfg(test)]
mod tests {
    use super::*;
    use pycell_wire::codes::{FailureCode, Layer};
    use pycell_wire::events::{write_output, write_result};
    use pycell_wire::report::{JailFailure, JailReport};

    #[tokio::test]
    async fn frames_round_trip_async() {
        let mut buf = Vec::new();
        write_output(&mut buf, Stream::Stdout, b"hello").unwrap();
        let rep = JailReport::refused(JailFailure::new(
            FailureCode::MountsFailed,
            Layer::Mounts,
            "z",
        ));
        write_result(&mut buf, &rep).unwrap();
        let mut r = &buf[..];
        let mut events = Vec::new();
        while let Some(e) = read_event_async(&mut r).await.unwrap() {
            events.push(e);
        }
        assert!(matches!(&events[0], Event::Output(Stream::Stdout, v) if v == b"hello"));
        assert!(
            matches!(&events[1], Event::Result(r) if r.error.as_ref().unwrap().code == FailureCode::MountsFailed)
        );
        assert_eq!(events.len(), 2);
    }

    #[tokio::test]
    async fn both_readers_reject_the_same_corruption() {
        let cases: [(&[u8], &str); 4] = [
            (&[1, 0xff, 0xff, 0xff, 0xff], "exceeds"),
            (&[9, 0, 0, 0, 0], "unknown event kind 9"),
            (&[1, 9, 0, 0, 0, b'a'], "ends inside a frame"),
            (&[3, 2, 0, 0, 0, b'{', b'}'], "not a report"),
        ];
        for (bytes, want) in cases {
            let sync = read_event(&mut &bytes[..]).unwrap_err().to_string();
            let asyn = read_event_async(&mut &bytes[..])
                .await
                .unwrap_err()
                .to_string();
            assert!(sync.contains(want), "{sync}");
            assert_eq!(sync, asyn);
        }
    }
}
