//! The Connect protocol (connectrpc.com/docs/protocol) as the E2B SDKs
//! speak it to envd, with the JSON codec: a unary call is a JSON body
//! answered by one (an error: an HTTP status and `{"code", "message"}`);
//! a server-streaming call's request and answer are enveloped messages
//! (a flags byte, a 32-bit big-endian length, the JSON), the answer's last
//! one flagged end-of-stream with the error, if any. Pure: no I/O here.

use bytes::{BufMut, Bytes, BytesMut};
use http::StatusCode;

/// An envelope's flag: compressed (never sent by the SDKs; refused).
const COMPRESSED: u8 = 0x01;
/// An envelope's flag: the end of the stream.
const END_STREAM: u8 = 0x02;

/// A Connect error code, as the SDKs map them to exceptions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Code {
    InvalidArgument,
    NotFound,
    AlreadyExists,
    ResourceExhausted,
    Unimplemented,
    Unavailable,
    Internal,
}

impl Code {
    pub fn name(self) -> &'static str {
        match self {
            Code::InvalidArgument => "invalid_argument",
            Code::NotFound => "not_found",
            Code::AlreadyExists => "already_exists",
            Code::ResourceExhausted => "resource_exhausted",
            Code::Unimplemented => "unimplemented",
            Code::Unavailable => "unavailable",
            Code::Internal => "internal",
        }
    }

    /// The HTTP status of a unary error (the protocol's table).
    pub fn status(self) -> StatusCode {
        match self {
            Code::InvalidArgument => StatusCode::BAD_REQUEST,
            Code::NotFound => StatusCode::NOT_FOUND,
            Code::AlreadyExists => StatusCode::CONFLICT,
            Code::ResourceExhausted => StatusCode::TOO_MANY_REQUESTS,
            Code::Unimplemented => StatusCode::NOT_IMPLEMENTED,
            Code::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
            Code::Internal => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }
}

/// An error to answer with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error {
    pub code: Code,
    pub message: String,
}

impl Error {
    pub fn new(code: Code, message: impl Into<String>) -> Error {
        Error {
            code,
            message: message.into(),
        }
    }

    /// Its JSON: `{"code": "...", "message": "..."}`.
    pub fn json(&self) -> serde_json::Value {
        serde_json::json!({"code": self.code.name(), "message": self.message})
    }
}

/// `message` in an envelope.
pub fn envelope(message: &serde_json::Value) -> Bytes {
    framed(0, message.to_string().as_bytes())
}

/// The end of a stream: `{}`, or `{"error": ...}`.
pub fn end_of_stream(error: Option<&Error>) -> Bytes {
    let end = match error {
        None => serde_json::json!({}),
        Some(e) => serde_json::json!({"error": e.json()}),
    };
    framed(END_STREAM, end.to_string().as_bytes())
}

fn framed(flags: u8, payload: &[u8]) -> Bytes {
    let mut b = BytesMut::with_capacity(5 + payload.len());
    b.put_u8(flags);
    // A payload is one of our messages: far below 4 GiB.
    b.put_u32(u32::try_from(payload.len()).unwrap_or(u32::MAX));
    b.put_slice(payload);
    b.freeze()
}

/// The one message of a server-streaming request's body.
pub fn only_message(body: &[u8]) -> Result<&[u8], Error> {
    let bad = |m: &str| Error::new(Code::InvalidArgument, m.to_string());
    let (head, rest) = body
        .split_at_checked(5)
        .ok_or_else(|| bad("the request is not an enveloped Connect message"))?;
    if head[0] & COMPRESSED != 0 {
        return Err(bad("compressed messages are not accepted"));
    }
    let len = u32::from_be_bytes([head[1], head[2], head[3], head[4]]) as usize;
    match rest.len() == len {
        true => Ok(rest),
        false => Err(bad(
            "the request's envelope does not hold exactly one message",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn envelopes_round_trip_and_bad_ones_are_refused() {
        let m = serde_json::json!({"process": {"cmd": "ls"}});
        let e = envelope(&m);
        assert_eq!(e[0], 0);
        let inner: serde_json::Value = serde_json::from_slice(only_message(&e).unwrap()).unwrap();
        assert_eq!(inner, m);
        assert!(only_message(&e[..4]).is_err());
        assert!(only_message(&e[..e.len() - 1]).is_err());
        let mut compressed = e.to_vec();
        compressed[0] = COMPRESSED;
        assert!(only_message(&compressed).is_err());
    }

    #[test]
    fn the_end_of_a_stream_carries_its_error() {
        let end = end_of_stream(Some(&Error::new(Code::NotFound, "gone")));
        assert_eq!(end[0], END_STREAM);
        let v: serde_json::Value = serde_json::from_slice(&end[5..]).unwrap();
        assert_eq!(v["error"]["code"], "not_found");
        assert_eq!(v["error"]["message"], "gone");
        assert_eq!(&end_of_stream(None)[5..], b"{}");
        assert_eq!(Code::AlreadyExists.status(), StatusCode::CONFLICT);
    }
}
