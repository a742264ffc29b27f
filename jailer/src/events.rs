//! Binary event frames the jailer writes on its stdout: `u8 kind`, `u32`
//! little-endian payload length, payload. Output chunks stream as the run
//! goes; the result is always the last frame.

use std::io::{self, Read, Write};

use crate::report::JailReport;

pub const KIND_STDOUT: u8 = 1;
pub const KIND_STDERR: u8 = 2;
pub const KIND_RESULT: u8 = 3;
/// Larger frames are a protocol error (output chunks are at most 64 KiB).
pub const MAX_FRAME: u32 = 4 << 20;

#[derive(Debug)]
pub enum Event {
    Stdout(Vec<u8>),
    Stderr(Vec<u8>),
    Result(Box<JailReport>),
}

pub fn write_frame(w: &mut impl Write, kind: u8, payload: &[u8]) -> io::Result<()> {
    let len = u32::try_from(payload.len())
        .ok()
        .filter(|l| *l <= MAX_FRAME)
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "frame too large"))?;
    let mut head = [0u8; 5];
    head[0] = kind;
    head[1..].copy_from_slice(&len.to_le_bytes());
    w.write_all(&head)?;
    w.write_all(payload)?;
    w.flush()
}

pub fn write_result(w: &mut impl Write, report: &JailReport) -> io::Result<()> {
    let json = serde_json::to_vec(report).map_err(io::Error::other)?;
    write_frame(w, KIND_RESULT, &json)
}

/// Read the next event; `Ok(None)` on a clean end of stream.
pub fn read_event(r: &mut impl Read) -> io::Result<Option<Event>> {
    let mut head = [0u8; 5];
    match r.read_exact(&mut head[..1]) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    r.read_exact(&mut head[1..])?;
    let len = u32::from_le_bytes([head[1], head[2], head[3], head[4]]);
    if len > MAX_FRAME {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("event frame of {len} bytes exceeds {MAX_FRAME}"),
        ));
    }
    let mut payload = vec![0u8; len as usize];
    r.read_exact(&mut payload)?;
    match head[0] {
        KIND_STDOUT => Ok(Some(Event::Stdout(payload))),
        KIND_STDERR => Ok(Some(Event::Stderr(payload))),
        KIND_RESULT => serde_json::from_slice(&payload)
            .map(|r| Some(Event::Result(Box::new(r))))
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e)),
        k => Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("unknown event kind {k}"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::{JailFailure, JailReport};

    #[test]
    fn frames_round_trip() {
        let mut buf = Vec::new();
        write_frame(&mut buf, KIND_STDOUT, b"hello").unwrap();
        write_frame(&mut buf, KIND_STDERR, b"").unwrap();
        let rep = JailReport::refused(JailFailure {
            code: "x".into(),
            layer: "y".into(),
            message: "z".into(),
            hint: None,
        });
        write_result(&mut buf, &rep).unwrap();
        let mut r = &buf[..];
        assert!(matches!(read_event(&mut r).unwrap(), Some(Event::Stdout(v)) if v == b"hello"));
        assert!(matches!(read_event(&mut r).unwrap(), Some(Event::Stderr(v)) if v.is_empty()));
        assert!(
            matches!(read_event(&mut r).unwrap(), Some(Event::Result(r)) if r.error.as_ref().unwrap().code == "x")
        );
        assert!(read_event(&mut r).unwrap().is_none());
    }

    #[test]
    fn oversized_and_unknown_frames_are_rejected() {
        let mut r: &[u8] = &[1, 0xff, 0xff, 0xff, 0xff];
        assert!(read_event(&mut r).is_err());
        let mut r: &[u8] = &[9, 0, 0, 0, 0];
        assert!(read_event(&mut r).is_err());
    }
}
