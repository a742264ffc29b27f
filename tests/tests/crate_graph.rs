//! docs/architecture.md's crate graph is generated from the Cargo.toml
//! files: this test fails when a crate, or a link between pycell's crates,
//! is missing from it or no longer true, and prints the block to paste
//! (`PYCELL_WRITE_DOCS=1` writes it in place). Every workspace crate also
//! needs its row in the page's table of crates.

#![forbid(unsafe_code)]

use std::collections::BTreeMap;
use std::fs;
use std::path::Path;

use pycell_tests::repo_root;

const BEGIN: &str = "<!-- crate graph: generated from the Cargo.toml files by tests/tests/crate_graph.rs; PYCELL_WRITE_DOCS=1 cargo test -p pycell-tests --test crate_graph rewrites it -->";
const END: &str = "<!-- crate graph: end -->";

fn manifest(dir: &Path) -> toml::Table {
    let path = dir.join("Cargo.toml");
    let text = fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    text.parse()
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Each workspace crate's directory, and the pycell crates it links
/// (normal dependencies), by package name.
fn workspace() -> BTreeMap<String, (String, Vec<String>)> {
    let root = repo_root();
    let members = manifest(&root)["workspace"]["members"]
        .as_array()
        .expect("workspace.members")
        .iter()
        .map(|m| m.as_str().expect("a member is a path").to_string())
        .collect::<Vec<_>>();
    members
        .into_iter()
        .map(|dir| {
            let m = manifest(&root.join(&dir));
            let name = m["package"]["name"].as_str().expect("package.name");
            let mut links: Vec<String> = m
                .get("dependencies")
                .and_then(|d| d.as_table())
                .map(|d| {
                    d.keys()
                        .filter(|k| k.starts_with("pycell"))
                        .cloned()
                        .collect()
                })
                .unwrap_or_default();
            links.sort();
            (name.to_string(), (dir, links))
        })
        .collect()
}

/// The graph as the page shows it: a line per crate, what it links.
fn graph(crates: &BTreeMap<String, (String, Vec<String>)>) -> String {
    let width = crates.keys().map(String::len).max().unwrap_or(0);
    let mut out = String::from("```\n");
    for (name, (_, links)) in crates {
        let links = match links.is_empty() {
            true => "(no pycell crate)".to_string(),
            false => links.join(", "),
        };
        out.push_str(&format!("{name:<width$} -> {links}\n"));
    }
    out.push_str("```\n");
    out
}

#[test]
fn the_architecture_page_shows_every_crate_and_what_it_links() {
    let path = repo_root().join("docs/architecture.md");
    let page = fs::read_to_string(&path).unwrap();
    let crates = workspace();
    assert!(crates.len() >= 15, "too few crates read: {crates:?}");
    let missing_rows: Vec<String> = crates
        .iter()
        .filter(|(name, (dir, _))| !page.contains(&format!("| `{dir}/` | `{name}` |")))
        .map(|(name, (dir, _))| format!("| `{dir}/` | `{name}` |"))
        .collect();
    assert!(
        missing_rows.is_empty(),
        "docs/architecture.md's table of crates has no row {missing_rows:?}"
    );
    let wanted = format!("{BEGIN}\n{}{END}", graph(&crates));
    let (Some(a), Some(b)) = (page.find(BEGIN), page.find(END)) else {
        panic!("docs/architecture.md has no generated crate graph; put this under \"Which crate links which\":\n{wanted}");
    };
    let shown = &page[a..b + END.len()];
    if shown == wanted {
        return;
    }
    if std::env::var_os("PYCELL_WRITE_DOCS").is_some() {
        fs::write(&path, page.replace(shown, &wanted)).unwrap();
        return;
    }
    panic!(
        "docs/architecture.md's crate graph is not the Cargo.toml files' (PYCELL_WRITE_DOCS=1 rewrites it); it should be:\n{wanted}"
    );
}
