//! Where a plain-HTTP request's body ends, by its own framing: a
//! `Content-Length`, or chunks (sizes read by `httparse`) and trailers.
//! The proxy forwards exactly the body's bytes and nothing after them, so
//! a second request pipelined, sent later, or hidden behind a body never
//! reaches the origin. Pure.

/// How a request says its body ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    /// `Content-Length: N`.
    Length(u64),
    /// `Transfer-Encoding: chunked`.
    Chunked,
}

/// Largest chunk accepted (a client that sends more uses more chunks).
pub const MAX_CHUNK: u64 = 16 << 20;
/// Longest chunk-size line or trailer line.
const MAX_LINE: usize = 1024;
/// Most trailer bytes in all.
const MAX_TRAILERS: usize = 16 * 1024;

/// Why a body was cut off.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BodyError {
    #[error("a malformed chunk-size line")]
    ChunkSize,
    #[error("a chunk of more than {MAX_CHUNK} bytes")]
    ChunkTooLarge,
    #[error("a chunk not followed by CRLF")]
    ChunkEnd,
    #[error("a malformed or oversized trailer")]
    Trailer,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum State {
    /// Bytes of data left (in a chunk when `chunked`).
    Data {
        left: u64,
        chunked: bool,
    },
    /// After a chunk's data: how many bytes of its CRLF came.
    DataEnd(u8),
    /// A chunk-size line so far.
    Size(Vec<u8>),
    /// A trailer line so far, and the trailer bytes before it.
    Trailer(Vec<u8>, usize),
    Done,
}

/// A body being read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Body {
    state: State,
}

impl Body {
    /// A body framed by `framing` (`None`: no body at all).
    pub fn new(framing: Option<Framing>) -> Body {
        let state = match framing {
            None | Some(Framing::Length(0)) => State::Done,
            Some(Framing::Length(n)) => State::Data {
                left: n,
                chunked: false,
            },
            Some(Framing::Chunked) => State::Size(Vec::new()),
        };
        Body { state }
    }

    /// Whether the body is complete.
    pub fn is_done(&self) -> bool {
        self.state == State::Done
    }

    /// Take the next bytes: how many of them (a prefix) belong to the
    /// body. Fewer than `buf.len()` only once the body is complete.
    pub fn feed(&mut self, buf: &[u8]) -> Result<usize, BodyError> {
        let mut at = 0;
        while at < buf.len() && !self.is_done() {
            at += self.step(&buf[at..])?;
        }
        Ok(at)
    }

    /// One step on a non-empty `buf`: the bytes it took.
    fn step(&mut self, buf: &[u8]) -> Result<usize, BodyError> {
        match &mut self.state {
            State::Data { left, chunked } => {
                let n = buf.len().min(usize::try_from(*left).unwrap_or(usize::MAX));
                *left -= n as u64;
                if *left == 0 {
                    self.state = match chunked {
                        true => State::DataEnd(0),
                        false => State::Done,
                    };
                }
                Ok(n)
            }
            State::DataEnd(seen) => {
                if buf[0] != b"\r\n"[usize::from(*seen)] {
                    return Err(BodyError::ChunkEnd);
                }
                *seen += 1;
                if *seen == 2 {
                    self.state = State::Size(Vec::new());
                }
                Ok(1)
            }
            State::Size(line) => {
                let Some(line) =
                    take_line(line, buf[0], MAX_LINE).map_err(|_| BodyError::ChunkSize)?
                else {
                    return Ok(1);
                };
                let size = chunk_size(&line)?;
                self.state = match size {
                    0 => State::Trailer(Vec::new(), 0),
                    n => State::Data {
                        left: n,
                        chunked: true,
                    },
                };
                Ok(1)
            }
            State::Trailer(line, total) => {
                *total += 1;
                if *total > MAX_TRAILERS {
                    return Err(BodyError::Trailer);
                }
                let total = *total;
                let Some(line) =
                    take_line(line, buf[0], MAX_LINE).map_err(|_| BodyError::Trailer)?
                else {
                    return Ok(1);
                };
                self.state = match &line[..] {
                    b"\r\n" => State::Done,
                    l if trailer_ok(l) => State::Trailer(Vec::new(), total),
                    _ => return Err(BodyError::Trailer),
                };
                Ok(1)
            }
            State::Done => Ok(0),
        }
    }
}

/// Add `b` to `line`; the whole line once it ends with CRLF. A bare CR or
/// LF, or a line longer than `max`, is an error.
fn take_line(line: &mut Vec<u8>, b: u8, max: usize) -> Result<Option<Vec<u8>>, ()> {
    let after_cr = line.last() == Some(&b'\r');
    if (b == b'\n') != after_cr || line.len() >= max {
        return Err(());
    }
    line.push(b);
    Ok((b == b'\n').then(|| std::mem::take(line)))
}

/// The size a chunk-size line (CRLF included) announces.
fn chunk_size(line: &[u8]) -> Result<u64, BodyError> {
    if !line.first().is_some_and(u8::is_ascii_hexdigit) {
        return Err(BodyError::ChunkSize);
    }
    match httparse::parse_chunk_size(line) {
        Ok(httparse::Status::Complete((n, size))) if n == line.len() => match size {
            s if s > MAX_CHUNK => Err(BodyError::ChunkTooLarge),
            s => Ok(s),
        },
        _ => Err(BodyError::ChunkSize),
    }
}

/// A trailer line: a header field name (a token), a colon, a value of
/// visible characters, spaces and tabs.
fn trailer_ok(line: &[u8]) -> bool {
    let line = &line[..line.len() - 2];
    let Some(colon) = line.iter().position(|&b| b == b':') else {
        return false;
    };
    let (name, value) = (&line[..colon], &line[colon + 1..]);
    !name.is_empty()
        && name
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(b))
        && value
            .iter()
            .all(|&b| b == b'\t' || b == b' ' || b.is_ascii_graphic() || b >= 0x80)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The body's length within `data`, fed in pieces of `step` bytes.
    fn body_len(framing: Option<Framing>, data: &[u8], step: usize) -> Result<usize, BodyError> {
        let mut body = Body::new(framing);
        let mut total = 0;
        for piece in data.chunks(step) {
            let n = body.feed(piece)?;
            total += n;
            if n < piece.len() {
                break;
            }
        }
        assert!(body.is_done(), "{:?}", String::from_utf8_lossy(data));
        Ok(total)
    }

    const NEXT: &[u8] = b"GET http://evil.example.net/ HTTP/1.1\r\n\r\n";

    #[test]
    fn a_body_ends_where_its_framing_says_whatever_follows() {
        for step in [1, 3, 1000] {
            let mut data = b"hello".to_vec();
            data.extend(NEXT);
            assert_eq!(body_len(Some(Framing::Length(5)), &data, step), Ok(5));
            assert_eq!(body_len(None, NEXT, step), Ok(0));
            let chunked = b"5\r\nhello\r\n3;ext=1\r\nabc\r\n0\r\nX-Sum: 1\r\n\r\n";
            let mut data = chunked.to_vec();
            data.extend(NEXT);
            assert_eq!(
                body_len(Some(Framing::Chunked), &data, step),
                Ok(chunked.len())
            );
        }
    }

    #[test]
    fn malformed_chunks_are_refused() {
        for (data, why) in [
            (&b"5\nhello\r\n0\r\n\r\n"[..], BodyError::ChunkSize),
            (b"\r\n", BodyError::ChunkSize),
            (b"zz\r\n", BodyError::ChunkSize),
            (b"5;a\nb\r\nhello\r\n", BodyError::ChunkSize),
            (b"1000001\r\n", BodyError::ChunkTooLarge),
            (b"ffffffffffffffffff\r\n", BodyError::ChunkSize),
            (b"5\r\nhelloXY", BodyError::ChunkEnd),
            (b"0\r\nno colon\r\n\r\n", BodyError::Trailer),
            (b"0\r\nX: a\nb\r\n\r\n", BodyError::Trailer),
        ] {
            let mut body = Body::new(Some(Framing::Chunked));
            assert_eq!(
                body.feed(data),
                Err(why),
                "{:?}",
                String::from_utf8_lossy(data)
            );
        }
        let mut body = Body::new(Some(Framing::Chunked));
        let long = format!("1;{}\r\n", "x".repeat(2000));
        assert_eq!(body.feed(long.as_bytes()), Err(BodyError::ChunkSize));
        let mut body = Body::new(Some(Framing::Chunked));
        let many = format!("0\r\n{}", "X: 1\r\n".repeat(5000));
        assert_eq!(body.feed(many.as_bytes()), Err(BodyError::Trailer));
    }
}
