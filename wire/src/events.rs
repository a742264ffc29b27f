//! The jailer's event stream, its only output: binary frames of `u8 kind`,
//! `u32` little-endian payload length, payload. Output chunks stream as the
//! run goes; the result is the last frame. One codec for every reader:
//! [`read_event`] for blocking readers, and `pycell_launch`'s async reader
//! for tokio ones, decode the same header the same way ([`payload_len`],
//! [`decode_frame`]); this crate has no tokio.
//!
//! The stream comes from our own jailer (root) but carries the sandbox's
//! output, so a frame's length is checked before anything is allocated for
//! it, and a stream that breaks off inside a frame, or holds a frame of an
//! unknown kind, is reported as corrupt rather than as a clean end.

use std::io::{self, Read, Write};

use serde::{Deserialize, Serialize};

use crate::report::JailReport;

const KIND_STDOUT: u8 = 1;
const KIND_STDERR: u8 = 2;
const KIND_RESULT: u8 = 3;
const KIND_READY: u8 = 4;
/// A frame's header: its kind, then its payload's length.
pub const HEADER_LEN: usize = 5;
/// Larger frames are a protocol error (output chunks are at most 64 KiB).
pub const MAX_FRAME: u32 = 4 << 20;

/// Which of the program's output streams a chunk came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Stream {
    Stdout,
    Stderr,
}

#[derive(Debug)]
pub enum Event {
    Output(Stream, Vec<u8>),
    Result(Box<JailReport>),
    /// A warm jail is ready for its work (see `pycell_runner`); it
    /// comes before any output.
    Ready,
}

/// Why the event stream cannot be read further.
#[derive(Debug, thiserror::Error)]
pub enum EventError {
    #[error("reading the event stream: {0}")]
    Io(#[from] io::Error),
    #[error("the event stream ends inside a frame")]
    Truncated,
    #[error("event frame of {0} bytes exceeds {MAX_FRAME}")]
    TooLarge(u32),
    #[error("unknown event kind {0}")]
    UnknownKind(u8),
    #[error("the result frame is not a report: {0}")]
    BadResult(serde_json::Error),
}

/// The payload length a header announces, if it is within [`MAX_FRAME`].
pub fn payload_len(head: &[u8; HEADER_LEN]) -> Result<usize, EventError> {
    let len = u32::from_le_bytes([head[1], head[2], head[3], head[4]]);
    if len > MAX_FRAME {
        return Err(EventError::TooLarge(len));
    }
    Ok(len as usize)
}

/// The event a whole frame holds.
pub fn decode_frame(kind: u8, payload: Vec<u8>) -> Result<Event, EventError> {
    match kind {
        KIND_STDOUT => Ok(Event::Output(Stream::Stdout, payload)),
        KIND_STDERR => Ok(Event::Output(Stream::Stderr, payload)),
        KIND_READY if payload.is_empty() => Ok(Event::Ready),
        KIND_RESULT => serde_json::from_slice(&payload)
            .map(|r| Event::Result(Box::new(r)))
            .map_err(EventError::BadResult),
        k => Err(EventError::UnknownKind(k)),
    }
}

/// A read that stopped inside a frame is a corrupt stream, not an end.
pub fn truncated(e: io::Error) -> EventError {
    if e.kind() == io::ErrorKind::UnexpectedEof {
        EventError::Truncated
    } else {
        EventError::Io(e)
    }
}

/// The next event; `Ok(None)` when the stream ends between frames.
pub fn read_event(r: &mut impl Read) -> Result<Option<Event>, EventError> {
    let mut head = [0u8; HEADER_LEN];
    match r.read_exact(&mut head[..1]) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e.into()),
    }
    r.read_exact(&mut head[1..]).map_err(truncated)?;
    let mut payload = vec![0u8; payload_len(&head)?];
    r.read_exact(&mut payload).map_err(truncated)?;
    decode_frame(head[0], payload).map(Some)
}

fn write_frame<W: Write + ?Sized>(w: &mut W, kind: u8, payload: &[u8]) -> io::Result<()> {
    let len = u32::try_from(payload.len())
        .ok()
        .filter(|l| *l <= MAX_FRAME)
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "frame too large"))?;
    let mut head = [0u8; HEADER_LEN];
    head[0] = kind;
    head[1..].copy_from_slice(&len.to_le_bytes());
    w.write_all(&head)?;
    w.write_all(payload)?;
    w.flush()
}

/// One chunk of the program's output (at most [`MAX_FRAME`] bytes).
pub fn write_output<W: Write + ?Sized>(w: &mut W, stream: Stream, bytes: &[u8]) -> io::Result<()> {
    let kind = match stream {
        Stream::Stdout => KIND_STDOUT,
        Stream::Stderr => KIND_STDERR,
    };
    write_frame(w, kind, bytes)
}

/// A warm jail is ready for its work.
pub fn write_ready<W: Write + ?Sized>(w: &mut W) -> io::Result<()> {
    write_frame(w, KIND_READY, &[])
}

/// The result: the last frame of a run.
pub fn write_result<W: Write + ?Sized>(w: &mut W, report: &JailReport) -> io::Result<()> {
    let json = serde_json::to_vec(report).map_err(io::Error::other)?;
    write_frame(w, KIND_RESULT, &json)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codes::{FailureCode, Layer};
    use crate::report::JailFailure;

    fn sample_stream() -> Vec<u8> {
        let mut buf = Vec::new();
        write_output(&mut buf, Stream::Stdout, b"hello").unwrap();
        write_output(&mut buf, Stream::Stderr, b"").unwrap();
        let rep = JailReport::refused(JailFailure::new(
            FailureCode::MountsFailed,
            Layer::Mounts,
            "z",
        ));
        write_result(&mut buf, &rep).unwrap();
        buf
    }

    fn check_sample(events: Vec<Event>) {
        assert!(matches!(&events[0], Event::Output(Stream::Stdout, v) if v == b"hello"));
        assert!(matches!(&events[1], Event::Output(Stream::Stderr, v) if v.is_empty()));
        assert!(
            matches!(&events[2], Event::Result(r) if r.error.as_ref().unwrap().code == FailureCode::MountsFailed)
        );
        assert_eq!(events.len(), 3);
    }

    #[test]
    fn frames_round_trip_sync() {
        let buf = sample_stream();
        let mut r = &buf[..];
        let mut events = Vec::new();
        while let Some(e) = read_event(&mut r).unwrap() {
            events.push(e);
        }
        check_sample(events);
    }

    #[test]
    fn an_empty_stream_is_a_clean_end_but_a_cut_header_is_not() {
        assert!(read_event(&mut &[][..]).unwrap().is_none());
        assert!(matches!(
            read_event(&mut &[1u8, 0][..]),
            Err(EventError::Truncated)
        ));
    }
}
