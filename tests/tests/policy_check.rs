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
