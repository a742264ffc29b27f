//! docs/errors.md lists every failure code, layer and protocol error code,
//! one table each; these tests keep the tables and the enums in step.

use std::collections::BTreeSet;

use pycell_protocol::messages::ErrorCode;
use pycell_wire::codes::{FailureCode, Layer};

fn errors_md() -> String {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/errors.md");
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {path}: {e}"))
}

/// The backticked first-column names of the table under `heading`: every
/// line starting with "| `" between that heading and the next "## ".
fn first_column(doc: &str, heading: &str) -> BTreeSet<String> {
    let section = doc
        .split_once(&format!("\n{heading}\n"))
        .unwrap_or_else(|| panic!("docs/errors.md has no heading {heading:?}"))
        .1;
    let section = section.split("\n## ").next().unwrap_or_default();
    section
        .lines()
        .filter_map(|line| line.strip_prefix("| `")?.split_once('`'))
        .map(|(name, _)| name.to_string())
        .collect()
}

fn assert_lists(heading: &str, expected: impl IntoIterator<Item = &'static str>) {
    let expected: BTreeSet<String> = expected.into_iter().map(String::from).collect();
    let documented = first_column(&errors_md(), heading);
    let missing: Vec<_> = expected.difference(&documented).collect();
    let extra: Vec<_> = documented.difference(&expected).collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "docs/errors.md, table under {heading:?}: missing {missing:?}, extra (not in the code) {extra:?}"
    );
}

#[test]
fn failure_codes_table_lists_every_failure_code() {
    assert_lists(
        "## Failure codes",
        FailureCode::ALL.iter().map(|c| c.as_str()),
    );
}

#[test]
fn layers_table_lists_every_layer() {
    assert_lists("## Layers", Layer::ALL.iter().map(|l| l.as_str()));
}

#[test]
fn protocol_table_lists_every_error_code() {
    assert_lists(
        "## Protocol error codes",
        ErrorCode::ALL.iter().map(|c| c.as_str()),
    );
}

#[test]
fn the_tables_come_in_order() {
    let doc = errors_md();
    let at = |h: &str| doc.find(&format!("\n{h}\n")).unwrap_or(usize::MAX);
    let (f, l, p) = (
        at("## Failure codes"),
        at("## Layers"),
        at("## Protocol error codes"),
    );
    assert!(
        f < l && l < p && p < usize::MAX,
        "headings missing or out of order"
    );
}
