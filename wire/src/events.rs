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
const KIND_REPLY: u8 = 5;
/// A frame's header: its kind, then its payload's length.
pub const HEADER_LEN: usize = 5;
/// Larger frames are a protocol error (output chunks are at most 64 KiB;
/// a session's reply, at most [`MAX_REPLY`] and its measurements).
pub const MAX_FRAME: u32 = MAX_REPLY + (64 << 10);
/// The largest reply a session's runner may give to one request (a file
/// read, a cell's images), in bytes.
pub const MAX_REPLY: u32 = 16 << 20;

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
    /// A session's answer to one request: what the jailer measured, and
    /// the runner's reply, as the runner wrote it (untrusted bytes: the
    /// jailer does not parse them). The request's output came before it.
    Reply(Box<ReplyMeasure>, Vec<u8>),
}

/// What the jailer measured of one session request.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ReplyMeasure {
    /// From the request reaching the runner to its reply.
    pub wall_ms: f64,
    /// CPU time of the whole jail (every process) meanwhile.
    pub cpu_ms: f64,
    /// The jail's memory when the reply came, and its peak so far.
    pub memory_bytes: u64,
    pub peak_memory_bytes: u64,
    /// Output of this request past the cap was dropped.
    pub stdout_truncated: bool,
    pub stderr_truncated: bool,
    /// The ends of this request's streams that went over the cap.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stdout_tail: Option<crate::report::StreamTail>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stderr_tail: Option<crate::report::StreamTail>,
    /// It overran its wall timeout and was interrupted (SIGINT, which a
    /// cell sees as KeyboardInterrupt).
    pub interrupted: bool,
    /// What the kernel counted of the jail's limits refusing it during
    /// the request.
    #[serde(default, skip_serializing_if = "crate::report::LimitEvents::is_none")]
    pub limit_events: crate::report::LimitEvents,
    /// The calls the seccomp filter refused during the request.
    #[serde(
        default,
        skip_serializing_if = "crate::report::SeccompRefused::is_none"
    )]
    pub seccomp_refused: crate::report::SeccompRefused,
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
    #[error("a reply frame without its measurements")]
    BadReply,
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
        KIND_REPLY => decode_reply(payload),
        k => Err(EventError::UnknownKind(k)),
    }
}

/// A reply's payload: the measurements' length (u32, little-endian), the
/// measurements (JSON), the runner's bytes.
fn decode_reply(mut payload: Vec<u8>) -> Result<Event, EventError> {
    let head: [u8; 4] = payload
        .get(..4)
        .and_then(|h| h.try_into().ok())
        .ok_or(EventError::BadReply)?;
    let end = 4usize.saturating_add(u32::from_le_bytes(head) as usize);
    let measure = payload
        .get(4..end)
        .and_then(|m| serde_json::from_slice(m).ok())
        .ok_or(EventError::BadReply)?;
    Ok(Event::Reply(Box::new(measure), payload.split_off(end)))
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

/// A session's reply to one request (`body` at most [`MAX_REPLY`] bytes).
pub fn write_reply<W: Write + ?Sized>(
    w: &mut W,
    measure: &ReplyMeasure,
    body: &[u8],
) -> io::Result<()> {
    let head = serde_json::to_vec(measure).map_err(io::Error::other)?;
    let mut payload = Vec::with_capacity(4 + head.len() + body.len());
    payload.extend_from_slice(&(head.len() as u32).to_le_bytes());
    payload.extend_from_slice(&head);
    payload.extend_from_slice(body);
    write_frame(w, KIND_REPLY, &payload)
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
    fn a_reply_keeps_its_measurements_apart_from_the_runners_bytes() {
        let m = ReplyMeasure {
            wall_ms: 1.5,
            memory_bytes: 7,
            interrupted: true,
            ..Default::default()
        };
        let mut buf = Vec::new();
        write_reply(&mut buf, &m, b"{\"cell\":1}").unwrap();
        match read_event(&mut &buf[..]).unwrap().unwrap() {
            Event::Reply(got, body) => {
                assert_eq!(*got, m);
                assert_eq!(body, b"{\"cell\":1}");
            }
            other => panic!("{other:?}"),
        }
        // A payload that lies about its measurements' length.
        let mut bad = vec![KIND_REPLY, 6, 0, 0, 0];
        bad.extend_from_slice(&[200, 0, 0, 0, b'{', b'}']);
        assert!(matches!(
            read_event(&mut &bad[..]),
            Err(EventError::BadReply)
        ));
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
