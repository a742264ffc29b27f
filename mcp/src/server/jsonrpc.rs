//! The JSON-RPC answers rmcp leaves out, for every MCP front end (stdio
//! and HTTP): a message that is not JSON gets `-32700 Parse error`, one
//! that is JSON but no message gets `-32600 Invalid Request` with its `id`
//! when it has one (`null` otherwise, as JSON-RPC 2.0 says), a request
//! of an MCP method whose params do not fit gets `-32602 Invalid params`,
//! and a message over [`MAX_MESSAGE`] gets `-32600` too, with the id read
//! from its first bytes. A notification (no `id`) is never answered.
//!
//! rmcp 3.9 drops a line that is not JSON and one over its 16 MiB line
//! cap without a word, answers `-32600` without an `id`, answers a bad
//! params object with `-32601` (the method arrives as a custom request),
//! and its HTTP service answers a body it cannot parse with status 415.
//! Our own stdio transport ([`super::stdio`]) and the HTTP front end use
//! these answers instead; the rest is rmcp's.

use std::cell::RefCell;

use serde::de::{DeserializeSeed, IgnoredAny, MapAccess, Visitor};
use serde_json::{json, Value};

/// The largest message a front end reads (a `write_file` of the largest
/// file, base64, is the largest a client sends).
pub const MAX_MESSAGE: usize = 32 << 20;

pub const PARSE_ERROR: i64 = -32700;
pub const INVALID_REQUEST: i64 = -32600;
pub const INVALID_PARAMS: i64 = -32602;

/// The request methods of MCP that rmcp parses into a type of its own: a
/// request of one of them that arrives as a custom request had params
/// that do not fit it.
pub const MCP_REQUESTS: &[&str] = &[
    "initialize",
    "ping",
    "server/discover",
    "prompts/get",
    "prompts/list",
    "resources/list",
    "resources/read",
    "resources/subscribe",
    "resources/unsubscribe",
    "resources/templates/list",
    "subscriptions/listen",
    "tools/call",
    "tools/list",
    "completion/complete",
    "logging/setLevel",
    "tasks/get",
    "tasks/update",
    "tasks/cancel",
    "skills/list",
    "skills/get",
    "resources/directory/read",
];

/// An error response to `id` (`null` if none could be read).
pub fn error_response(id: Option<Value>, code: i64, message: String) -> Value {
    json!({
        "jsonrpc": "2.0",
        "id": id.unwrap_or(Value::Null),
        "error": {"code": code, "message": message},
    })
}

/// A request id as JSON-RPC allows it: a string or a number.
fn usable_id(id: &Value) -> bool {
    id.is_string() || id.is_number()
}

/// The fields of a message the answer depends on; the rest is skipped.
#[derive(serde::Deserialize)]
struct Envelope {
    #[serde(default)]
    id: Option<Value>,
    #[serde(default)]
    method: Option<Value>,
}

/// What to answer `bytes`, which did not parse as a client message
/// (`error` says why); None for a notification, which is never answered.
pub fn answer_unparsed(bytes: &[u8], error: &serde_json::Error) -> Option<Value> {
    use serde_json::error::Category;
    if matches!(error.classify(), Category::Syntax | Category::Eof) {
        let m = format!("Parse error: the message is not JSON ({error})");
        return Some(error_response(None, PARSE_ERROR, m));
    }
    // An object only (serde would read a struct from an array too).
    let object = bytes.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'{');
    let envelope = object
        .then(|| serde_json::from_slice::<Envelope>(bytes).ok())
        .flatten();
    let (id, method) = match &envelope {
        Some(e) => (e.id.as_ref(), e.method.as_ref().and_then(Value::as_str)),
        None => (None, None),
    };
    if id.is_none() && method.is_some() {
        return None;
    }
    let id = id.filter(|i| usable_id(i)).cloned();
    Some(match method {
        Some(m) if id.is_some() && MCP_REQUESTS.contains(&m) => {
            let message = format!("Invalid params for {m}: {error}");
            error_response(id, INVALID_PARAMS, message)
        }
        _ => {
            let message = format!("Invalid Request: not a JSON-RPC 2.0 message of MCP ({error})");
            error_response(id, INVALID_REQUEST, message)
        }
    })
}

/// The answer to a request of an MCP method whose params did not fit (it
/// reached the server as a custom request); None for another method.
pub fn invalid_params(method: &str) -> Option<String> {
    MCP_REQUESTS.contains(&method).then(|| {
        format!("Invalid params for {method}: they do not match the MCP schema of {method}")
    })
}

/// The answer to a message over `limit` bytes, of which `head` is the
/// start: its id if the head names one at the top level.
pub fn answer_oversized(head: &[u8], limit: usize) -> Value {
    let message = format!(
        "Invalid Request: the message is over {limit} bytes, the most this server reads; send less (a large file in parts)"
    );
    error_response(id_in_head(head), INVALID_REQUEST, message)
}

/// The top-level `id` of a JSON object of which `head` is the start, if
/// it comes before the head ends.
pub fn id_in_head(head: &[u8]) -> Option<Value> {
    let found = RefCell::new(None);
    let mut de = serde_json::Deserializer::from_slice(head);
    // The head is cut off: the error at its end comes after the id.
    let _ = IdSeek(&found).deserialize(&mut de);
    found.into_inner().filter(usable_id)
}

/// Visits an object's keys, keeping the value of `id` and skipping the
/// others unread.
struct IdSeek<'f>(&'f RefCell<Option<Value>>);

impl<'de> DeserializeSeed<'de> for IdSeek<'_> {
    type Value = ();
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for IdSeek<'_> {
    type Value = ();
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a JSON-RPC message")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
            if key == "id" {
                *self.0.borrow_mut() = Some(map.next_value::<Value>()?);
                return Ok(());
            }
            map.next_value::<IgnoredAny>()?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(text: &str) -> Option<Value> {
        let e = serde_json::from_str::<rmcp::model::ClientJsonRpcMessage>(text).unwrap_err();
        answer_unparsed(text.as_bytes(), &e)
    }

    #[test]
    fn every_bad_message_but_a_notification_is_answered_with_its_id() {
        let a = answer("this is not json").unwrap();
        assert_eq!(
            (a["id"].clone(), a["error"]["code"].clone()),
            (Value::Null, json!(-32700))
        );
        let a = answer(r#"{"jsonrpc":"2.0","id":7,"method":5}"#).unwrap();
        assert_eq!(
            (a["id"].clone(), a["error"]["code"].clone()),
            (json!(7), json!(-32600))
        );
        let a = answer(r#"{"foo":1}"#).unwrap();
        assert_eq!(
            (a["id"].clone(), a["error"]["code"].clone()),
            (Value::Null, json!(-32600))
        );
        let a = answer("[1,2]").unwrap();
        assert_eq!(a["id"], Value::Null);
        assert!(a.as_object().unwrap().contains_key("id"), "{a}");
        let a = answer(r#"{"jsonrpc":"2.0","id":{"x":1},"method":"ping"}"#).unwrap();
        assert_eq!(a["id"], Value::Null);
        // JSON-RPC 2.0's own example: a method that is no string is an
        // invalid request, answered to id null; a notification never is.
        let a = answer(r#"{"jsonrpc":"2.0","method":7,"params":"bar"}"#).unwrap();
        assert_eq!(
            (a["id"].clone(), a["error"]["code"].clone()),
            (Value::Null, json!(-32600))
        );
        assert_eq!(
            answer(r#"{"jsonrpc":"2.0","method":"x/y","params":7}"#),
            None
        );
    }

    #[test]
    fn an_oversized_message_is_answered_to_the_id_at_its_start() {
        let big = format!(
            r#"{{"jsonrpc":"2.0","method":"tools/call","id":"r-9","params":{{"arguments":{{"code":"{}"#,
            "x".repeat(1000)
        );
        let a = answer_oversized(&big.as_bytes()[..200], 100);
        assert_eq!(
            (a["id"].clone(), a["error"]["code"].clone()),
            (json!("r-9"), json!(-32600))
        );
        assert!(a["error"]["message"]
            .as_str()
            .unwrap()
            .contains("over 100 bytes"));
        // An id after the cut, or nested deeper, is not the message's.
        let late = r#"{"jsonrpc":"2.0","params":{"id":3,"code":"xxxxxxxx"#;
        assert_eq!(id_in_head(late.as_bytes()), None);
        assert_eq!(id_in_head(b"not json"), None);
        assert_eq!(id_in_head(br#"{"id":12,"#), Some(json!(12)));
    }

    #[test]
    fn bad_params_of_an_mcp_method_are_invalid_params() {
        assert!(invalid_params("tools/call")
            .unwrap()
            .contains("Invalid params for tools/call"));
        assert_eq!(invalid_params("vendor/thing"), None);
    }
}
