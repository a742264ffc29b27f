//! Calls a caller may cancel from outside their own exchange: over
//! stateless HTTP each message is a request of its own, so rmcp never
//! pairs a `notifications/cancelled` with the call it names. The front
//! end keeps each caller's calls in flight here, by request id, and a
//! cancel cancels the caller's own calls of that id (never another
//! caller's).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use rmcp::model::RequestId;
use serde_json::Value;
use tokio_util::sync::CancellationToken;

/// The largest `notifications/cancelled` read as one (its reason
/// included); a larger message is something else.
const MAX_CANCEL: usize = 4096;

/// Whose call, which request id (as JSON text).
type Key = (Option<Arc<str>>, String);

#[derive(Debug, Default)]
pub struct Cancels {
    calls: Mutex<HashMap<Key, Vec<(u64, CancellationToken)>>>,
    serial: AtomicU64,
}

/// A call in the registry; dropping it takes it out.
#[derive(Debug)]
pub struct InFlight {
    cancels: Arc<Cancels>,
    key: Key,
    serial: u64,
}

impl Cancels {
    /// `caller`'s call `id`, cancelled through `ct`, until the result is dropped.
    pub fn register(
        self: &Arc<Self>,
        caller: Option<Arc<str>>,
        id: &RequestId,
        ct: CancellationToken,
    ) -> InFlight {
        let key = (
            caller,
            id_text(&serde_json::to_value(id).unwrap_or_default()),
        );
        let serial = self.serial.fetch_add(1, Ordering::Relaxed);
        let mut calls = self.calls.lock().unwrap_or_else(|p| p.into_inner());
        calls.entry(key.clone()).or_default().push((serial, ct));
        InFlight {
            cancels: Arc::clone(self),
            key,
            serial,
        }
    }

    /// Cancel `caller`'s calls of request `id`; how many there were.
    pub fn cancel(&self, caller: Option<Arc<str>>, id: &Value) -> usize {
        let calls = self.calls.lock().unwrap_or_else(|p| p.into_inner());
        let Some(found) = calls.get(&(caller, id_text(id))) else {
            return 0;
        };
        found.iter().for_each(|(_, ct)| ct.cancel());
        found.len()
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        let calls = self.calls.lock().unwrap_or_else(|p| p.into_inner());
        calls.values().map(Vec::len).sum()
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let mut calls = self.cancels.calls.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(v) = calls.get_mut(&self.key) {
            v.retain(|(s, _)| *s != self.serial);
            if v.is_empty() {
                calls.remove(&self.key);
            }
        }
    }
}

/// A request id's key: its JSON text (7 and "7" differ).
fn id_text(id: &Value) -> String {
    id.to_string()
}

/// The request id a `notifications/cancelled` message names, if `body`
/// is one.
pub fn cancelled_request_id(body: &[u8]) -> Option<Value> {
    #[derive(serde::Deserialize)]
    struct Cancel<'a> {
        #[serde(borrow)]
        method: std::borrow::Cow<'a, str>,
        params: Params,
    }
    #[derive(serde::Deserialize)]
    struct Params {
        #[serde(rename = "requestId")]
        request_id: Value,
    }
    if body.len() > MAX_CANCEL {
        return None;
    }
    let c = serde_json::from_slice::<Cancel<'_>>(body).ok()?;
    let id = c.params.request_id;
    (c.method == "notifications/cancelled" && (id.is_string() || id.is_number())).then_some(id)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rmcp::model::NumberOrString;

    #[test]
    fn a_cancel_reaches_the_callers_own_call_of_that_id_only() {
        let cancels = Arc::new(Cancels::default());
        let alice: Option<Arc<str>> = Some("alice".into());
        let bob: Option<Arc<str>> = Some("bob".into());
        let (a, b, a2) = (
            CancellationToken::new(),
            CancellationToken::new(),
            CancellationToken::new(),
        );
        let _a = cancels.register(alice.clone(), &NumberOrString::Number(7), a.clone());
        let _b = cancels.register(bob.clone(), &NumberOrString::Number(7), b.clone());
        let a2_call = cancels.register(
            alice.clone(),
            &NumberOrString::String("7".into()),
            a2.clone(),
        );
        assert_eq!(cancels.cancel(alice.clone(), &Value::from(7)), 1);
        assert!(a.is_cancelled() && !b.is_cancelled() && !a2.is_cancelled());
        drop(a2_call);
        assert_eq!(cancels.cancel(alice, &Value::from("7")), 0);
        assert_eq!(cancels.len(), 2);
    }

    #[test]
    fn only_a_cancel_notification_names_a_request() {
        let cancel = br#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":"r-1","reason":"user"}}"#;
        assert_eq!(cancelled_request_id(cancel), Some(Value::from("r-1")));
        let call = br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"requestId":3}}"#;
        assert_eq!(cancelled_request_id(call), None);
        assert_eq!(cancelled_request_id(b"nonsense"), None);
    }
}
