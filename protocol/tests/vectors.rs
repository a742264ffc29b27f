//! The protocol vectors (protocol/vectors.json): every example frame decodes
//! into this crate's messages and encodes back unchanged, every error code
//! has one, and they and docs/protocol.md name the same message types. The
//! Python client checks the same file (python/tests/test_vectors.py), so a
//! change one codec misses fails a test.

use std::collections::BTreeSet;
use std::path::PathBuf;

use pycell_protocol::framing::decode_client_message;
use pycell_protocol::messages::{ErrorCode, ServerMessage, PROTOCOL_VERSION};
use serde_json::Value;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn vectors() -> Value {
    let text = std::fs::read_to_string(repo().join("protocol/vectors.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

fn each() -> Vec<(String, String, Value)> {
    vectors()["vectors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| {
            (
                v["name"].as_str().unwrap().to_string(),
                v["from"].as_str().unwrap().to_string(),
                v["message"].clone(),
            )
        })
        .collect()
}

#[test]
fn every_vector_decodes_and_encodes_back_unchanged() {
    assert_eq!(vectors()["version"], PROTOCOL_VERSION);
    for (name, from, message) in each() {
        let again = match from.as_str() {
            // As pycelld's broker decodes a client's frame.
            "client" => decode_client_message(message.to_string().as_bytes())
                .map_err(|e| e.to_string())
                .and_then(|m| serde_json::to_value(m).map_err(|e| e.to_string())),
            "daemon" => serde_json::from_value::<ServerMessage>(message.clone())
                .and_then(serde_json::to_value)
                .map_err(|e| e.to_string()),
            other => panic!("{name}: from {other:?}"),
        };
        let again = again.unwrap_or_else(|e| panic!("{name}: does not decode: {e}"));
        assert_eq!(again, message, "{name}: encodes back differently");
    }
}

#[test]
fn every_error_code_has_a_vector() {
    let codes: BTreeSet<String> = each()
        .into_iter()
        .filter(|(_, _, m)| m["type"] == "error")
        .map(|(_, _, m)| m["code"].as_str().unwrap().to_string())
        .collect();
    for code in ErrorCode::ALL {
        assert!(codes.contains(code.as_str()), "no vector of error {code}");
    }
}

#[test]
fn the_vectors_and_the_docs_name_the_same_messages() {
    let docs = std::fs::read_to_string(repo().join("docs/protocol.md")).unwrap();
    // The example messages: lines that start a JSON object with its type.
    let documented: BTreeSet<String> = docs
        .lines()
        .filter_map(|line| line.trim_start().strip_prefix("{\"type\": \""))
        .filter_map(|rest| rest.split('"').next())
        .map(str::to_string)
        .collect();
    let vectored: BTreeSet<String> = each()
        .into_iter()
        .map(|(_, _, m)| m["type"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(
        documented, vectored,
        "docs/protocol.md's example messages and protocol/vectors.json differ"
    );
}
