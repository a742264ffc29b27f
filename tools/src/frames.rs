//! The frames between `pycell_tools` in the jail and the launcher outside
//! it: each a 4-byte big-endian length, then JSON. Requests carry an id
//! the reply repeats, so that calls from threads and asyncio tasks may be
//! in flight at once. Everything from the jail is hostile: a request is
//! bounded before it is read ([`MAX_REQUEST`]) and parsed into one of
//! three shapes, unknown fields refused.

use serde::{Deserialize, Serialize};

/// The largest request frame (a call's arguments among it).
pub const MAX_REQUEST: u32 = 1 << 20;

/// The largest reply frame.
pub const MAX_REPLY: u32 = 16 << 20;

/// Names `pycell_tools` defines itself, which no server may shadow.
pub const MODULE_NAMES: &[&str] = &["call", "list_servers", "list_tools", "ToolError"];

/// What code in the jail asks.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum ToolRequest {
    /// The servers it may call, with their tools.
    ListServers { id: u64 },
    /// One server's callable tools (name, description, input schema).
    ListTools { id: u64, server: String },
    /// Call a tool.
    Call {
        id: u64,
        server: String,
        tool: String,
        #[serde(default)]
        arguments: serde_json::Map<String, serde_json::Value>,
    },
}

impl ToolRequest {
    pub fn id(&self) -> u64 {
        match self {
            ToolRequest::ListServers { id }
            | ToolRequest::ListTools { id, .. }
            | ToolRequest::Call { id, .. } => *id,
        }
    }
}

/// The answer to one request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolReply {
    pub id: u64,
    #[serde(flatten)]
    pub outcome: Outcome,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// The tool's result as a Python value: its structured content when it
    /// gives one, else `{"text": ..., "images": [...]}`; for a listing, the
    /// listing.
    Ok(serde_json::Value),
    /// Why not: raised in the jail as `pycell_tools.ToolError`.
    Error(ToolFailure),
}

impl From<Result<serde_json::Value, ToolFailure>> for Outcome {
    fn from(r: Result<serde_json::Value, ToolFailure>) -> Outcome {
        match r {
            Ok(v) => Outcome::Ok(v),
            Err(f) => Outcome::Error(f),
        }
    }
}

impl Outcome {
    pub fn into_result(self) -> Result<serde_json::Value, ToolFailure> {
        match self {
            Outcome::Ok(v) => Ok(v),
            Outcome::Error(f) => Err(f),
        }
    }
}

/// A refused or failed call.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolFailure {
    pub code: FailureKind,
    pub message: String,
}

/// Stable names for why a call failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FailureKind {
    /// Not allowed by the policy or the client's allowTools.
    Denied,
    /// No such server or tool.
    Unknown,
    /// The arguments do not fit the tool's input schema.
    BadArguments,
    /// The upstream said the call failed (its message follows).
    ToolFailed,
    /// The upstream crashed, hung past the call's time or sent garbage.
    UpstreamFailed,
    /// A per-run bound was reached (calls, concurrency, bytes).
    Limit,
    /// The request itself was malformed.
    BadRequest,
}

/// Why a request from the jail was not read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BadRequest {
    #[error("a request of {0} bytes is over the {MAX_REQUEST} allowed")]
    TooLarge(usize),
    #[error("not a tool request: {0}")]
    NotARequest(String),
}

/// A request's body (without its length), checked.
pub fn read_request(body: &[u8]) -> Result<ToolRequest, BadRequest> {
    if body.len() > MAX_REQUEST as usize {
        return Err(BadRequest::TooLarge(body.len()));
    }
    serde_json::from_slice(body).map_err(|e| BadRequest::NotARequest(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_have_three_shapes_and_nothing_else() {
        let r = read_request(br#"{"op": "call", "id": 7, "server": "time", "tool": "get_time", "arguments": {"tz": "UTC"}}"#).unwrap();
        assert_eq!(r.id(), 7);
        assert!(matches!(r, ToolRequest::Call { ref tool, .. } if tool == "get_time"));
        assert!(read_request(br#"{"op": "list_servers", "id": 1}"#).is_ok());
        assert!(
            read_request(br#"{"op": "list_tools", "id": 1}"#).is_err(),
            "a server is needed"
        );
        assert!(read_request(
            br#"{"op": "call", "id": 1, "server": "t", "tool": "x", "token": "y"}"#
        )
        .is_err());
        assert!(read_request(
            br#"{"op": "call", "id": 1, "server": "t", "tool": "x", "arguments": [1]}"#
        )
        .is_err());
        assert!(matches!(
            read_request(b"garbage"),
            Err(BadRequest::NotARequest(_))
        ));
        let big = vec![b' '; MAX_REQUEST as usize + 1];
        let e = read_request(&big).unwrap_err();
        assert_eq!(e, BadRequest::TooLarge(big.len()));
        assert!(e.to_string().contains("over the"), "{e}");
    }

    #[test]
    fn replies_carry_their_id_and_one_outcome() {
        let ok = ToolReply {
            id: 3,
            outcome: Outcome::Ok(serde_json::json!({"time": "12:00"})),
        };
        assert_eq!(
            serde_json::to_value(&ok).unwrap(),
            serde_json::json!({"id": 3, "ok": {"time": "12:00"}})
        );
        let err = ToolReply {
            id: 4,
            outcome: Outcome::Error(ToolFailure {
                code: FailureKind::BadArguments,
                message: "at /tz: 3 is not of type \"string\"".into(),
            }),
        };
        let v = serde_json::to_value(&err).unwrap();
        assert_eq!(v["error"]["code"], "bad_arguments");
    }
}
