//! `pycell policy check`: the shipped policy passes; a typo is located.

#![forbid(unsafe_code)]

use std::fs;

use pycell_tests::{repo_root, Pycell};

#[test]
fn shipped_default_policy_passes() {
    let path = repo_root().join("policies/default.toml");
    let out = Pycell::new(["policy".as_ref(), "check".as_ref(), path.as_os_str()]).run();
    assert_eq!(out.exit_code, Some(0), "{}", out.describe());
    let want = format!("{}: ok (policy default)", path.display());
    assert!(
        out.stdout_str().contains(&want),
        "want {want:?} on stdout\n{}",
        out.describe()
    );
}

#[test]
fn unknown_field_is_reported_with_file_line_column_and_path() {
    let original = fs::read_to_string(repo_root().join("policies/default.toml"))
        .expect("read policies/default.toml");
    let mut lines: Vec<&str> = original.lines().collect();
    let limits = lines
        .iter()
        .position(|l| l.trim() == "[limits]")
        .expect("policies/default.toml has a [limits] table");
    lines.insert(limits + 1, "bogus_limit = 1");
    // 1-based line of the inserted key.
    let line = limits + 2;
    let dir = tempfile::tempdir().expect("tempdir");
    // The policy name must match the file name, so keep it default.toml.
    let path = dir.path().join("default.toml");
    fs::write(&path, lines.join("\n") + "\n").expect("write bad policy");

    let out = Pycell::new(["policy".as_ref(), "check".as_ref(), path.as_os_str()]).run();
    assert_eq!(out.exit_code, Some(1), "{}", out.describe());
    let text = format!("{}{}", out.stdout_str(), out.stderr);
    let want = format!(
        "{}:{line}:1: limits.bogus_limit: unknown field",
        path.display()
    );
    assert!(
        text.contains(&want),
        "want {want:?} in the output\n{}",
        out.describe()
    );
}

#[test]
fn bad_policy_refuses_a_run() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("broken.toml");
    fs::write(&path, "name = \"broken\"\nnot toml at all [\n").expect("write");
    let out = Pycell::new([
        "run".as_ref(),
        "--json".as_ref(),
        "--policy".as_ref(),
        path.as_os_str(),
        "-".as_ref(),
    ])
    .stdin("print('must not run')\n")
    .run();
    assert_eq!(out.exit_code, Some(125), "{}", out.describe());
    assert!(
        !out.stdout_str().contains("must not run"),
        "the script ran under an unparseable policy\n{}",
        out.describe()
    );
}

#[test]
fn a_policy_file_runs_where_pycell_falls_back_to_embedded_mode() {
    // No --embedded and no --socket: pycelld if one listens at the
    // default socket, else this process jails (as root). A policy file
    // runs only embedded; through pycelld it is refused, saying why.
    let dir = tempfile::tempdir().expect("tempdir");
    let shipped = fs::read_to_string(repo_root().join("policies/default.toml")).expect("read");
    let mine = shipped.replacen("name = \"default\"", "name = \"mine\"", 1);
    assert_ne!(
        mine, shipped,
        "policies/default.toml names itself `default`"
    );
    let path = dir.path().join("mine.toml");
    fs::write(&path, mine).expect("write");
    let out = Pycell::new([
        "batch".as_ref(),
        "--policy".as_ref(),
        path.as_os_str(),
        "-".as_ref(),
    ])
    .stdin("{\"code\": \"print(7)\"}\n")
    .run();
    assert_eq!(out.exit_code, Some(0), "{}", out.describe());
    let line: serde_json::Value = serde_json::from_str(out.stdout_str().trim()).expect("a line");
    let result = &line["result"];
    match std::path::Path::new("/run/pycell/pycell.sock").exists() {
        false => {
            assert_eq!(result["status"], "ok", "{}", out.describe());
            assert_eq!(result["stdout"], "7\n", "{}", out.describe());
            assert_eq!(result["policy"], "mine", "{}", out.describe());
        }
        true => {
            let why = result["error"]["message"].as_str().unwrap_or_default();
            assert!(why.contains("needs embedded mode"), "{}", out.describe());
        }
    }
}
