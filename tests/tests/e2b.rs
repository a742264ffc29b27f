//! The E2B endpoint of `pycell mcp --http` (docs/e2b.md), driven by the
//! published E2B code interpreter SDK, unchanged (tests/mcp/sdk_e2b.py),
//! against a real pycelld: sandboxes made, used and killed by two
//! identities whose tokens are the SDK's API keys.
//!
//! Needs root, the tools venv's python (PYCELL_TEST_TOOLS_PYTHON) with the
//! SDK, and the test venv (PYCELL_TEST_NUMPY_VENV) with pandas and
//! matplotlib, which the test's `data-science` policy runs.

#![forbid(unsafe_code)]

use std::process::{Command, Stdio};
use std::time::Duration;

use pycell_tests::daemon::Daemon;
use pycell_tests::http::{get, make_token, start_front, text, FRONT_UID};
use pycell_tests::sdk::sdk_report_with;
use pycell_tests::{output_guarded, repo_root, require_root};
use serde_json::{json, Value};

const GUARD: Duration = Duration::from_secs(300);
/// `npm ci` of the JavaScript SDK on its first run here.
const NPM_GUARD: Duration = Duration::from_secs(600);

/// The JavaScript SDK (tests/e2b-node, pinned by its lockfile) installed
/// once under the target directory: that directory.
fn node_sdk() -> std::path::PathBuf {
    let from = repo_root().join("tests/e2b-node");
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("e2b-node");
    std::fs::create_dir_all(&dir).unwrap();
    let lock = std::fs::read(from.join("package-lock.json")).unwrap();
    let installed = std::fs::read(dir.join("package-lock.json")).ok();
    for f in ["package.json", "package-lock.json", "sdk_e2b.mjs"] {
        std::fs::copy(from.join(f), dir.join(f)).unwrap();
    }
    if installed.as_deref() != Some(&lock[..]) || !dir.join("node_modules").exists() {
        let child = Command::new("npm")
            .args(["ci", "--silent", "--no-audit", "--no-fund"])
            .current_dir(&dir)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("npm runs (Node.js is on PATH)");
        let g = output_guarded(child, NPM_GUARD);
        assert!(
            g.status.is_some_and(|s| s.success()),
            "npm ci: {}",
            g.stderr
        );
    }
    dir
}

/// `node sdk_e2b.mjs URL TOKENS`: its report.
fn node_report(origin: &str, tokens: &str) -> Value {
    let dir = node_sdk();
    let child = Command::new("node")
        .args(["sdk_e2b.mjs", origin, tokens])
        .current_dir(&dir)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("node runs");
    let g = output_guarded(child, GUARD);
    serde_json::from_str(g.stdout.trim())
        .unwrap_or_else(|e| panic!("node printed no report ({e}): {}\n{}", g.stdout, g.stderr))
}

/// A policy directory: pycell's policies, and `data-science` as the
/// default policy with the test venv for its interpreter.
fn policies(dir: &std::path::Path) -> std::path::PathBuf {
    let venv = std::env::var("PYCELL_TEST_NUMPY_VENV").expect(
        "PYCELL_TEST_NUMPY_VENV is not set: run the tests through scripts/test, which builds the test venv",
    );
    let out = dir.join("policies");
    std::fs::create_dir(&out).unwrap();
    for name in ["default", "install"] {
        let from = repo_root().join(format!("policies/{name}.toml"));
        std::fs::copy(from, out.join(format!("{name}.toml"))).unwrap();
    }
    let default = std::fs::read_to_string(out.join("default.toml")).unwrap();
    let science = default
        .replacen("name = \"default\"", "name = \"data-science\"", 1)
        .replacen(
            "python = \"/usr/bin/python3\"",
            &format!("venv = {venv:?}"),
            1,
        );
    assert_ne!(
        science, default,
        "policies/default.toml names no python to replace"
    );
    std::fs::write(out.join("data-science.toml"), science).unwrap();
    out
}

#[test]
fn the_published_e2b_sdk_makes_uses_and_kills_sandboxes_of_its_own() {
    require_root();
    let dir = tempfile::tempdir().unwrap();
    let policy_dir = policies(dir.path());
    let daemon = Daemon::start(&format!(
        "socket_mode = \"0666\"\nallowed_uids = [{FRONT_UID}]\nfront_end_uids = [{FRONT_UID}]\npolicy_dir = {:?}\npolicies_by_uid = {{ \"{FRONT_UID}\" = [\"default\", \"data-science\"] }}\n",
        policy_dir
    ));
    let mut file = String::new();
    let mut tokens = serde_json::Map::new();
    for name in ["alice", "bob"] {
        let (token, entry) = make_token(name, &[]);
        file.push_str(&entry);
        file.push_str("policies = [\"default\", \"data-science\"]\n");
        tokens.insert(name.into(), Value::String(token));
    }
    let tokens_file = dir.path().join("tokens.toml");
    std::fs::write(&tokens_file, file).unwrap();
    let socket = daemon.socket();
    let front = start_front(&[
        "--socket",
        socket.to_str().unwrap(),
        "--tokens",
        tokens_file.to_str().unwrap(),
    ]);
    let origin = front.at.trim_end_matches("/mcp").to_string();
    let tokens = Value::Object(tokens).to_string();
    let r = sdk_report_with(
        "sdk_e2b.py",
        &["--url", &origin, "--tokens", &tokens],
        GUARD,
    );
    let show = || {
        format!(
            "{}\nfront end:\n{}\npycelld:\n{}",
            serde_json::to_string_pretty(&r).unwrap(),
            front.said(),
            daemon.log()
        )
    };
    let eq = |pointer: &str, want: Value| {
        assert_eq!(get(&r, pointer), &want, "{pointer}\n{}", show());
    };
    let has = |pointer: &str, part: &str| {
        let t = text(&r, pointer);
        assert!(
            t.contains(part),
            "{pointer}: {t:?} lacks {part:?}\n{}",
            show()
        );
    };

    // Two cells keep state; the second's value is its main result.
    eq("/state/text", json!("42"));
    eq("/state/count", json!(2));
    // Output reaches the callbacks as it is printed, in order.
    let seen: Vec<(String, String)> = get(&r, "/stream/seen")
        .as_array()
        .unwrap_or_else(|| panic!("no stream step\n{}", show()))
        .iter()
        .map(|s| (text(s, "/0"), text(s, "/1")))
        .collect();
    let want = [
        ("stdout", "one\n"),
        ("stderr", "two\n"),
        ("stdout", "three\n"),
    ];
    assert_eq!(
        seen,
        want.map(|(a, b)| (a.to_string(), b.to_string())),
        "{}",
        show()
    );
    // A DataFrame is a main result with its text and a markdown table; a
    // figure is a PNG.
    eq("/dataframe/main", json!(1));
    eq("/dataframe/markdown_table", json!(true));
    has("/dataframe/text", "4.5");
    eq("/plot/pngs", json!(1));
    eq("/plot/png_magic", json!(true));
    // An exception: its name, value and traceback; on_error heard.
    eq("/error/name", json!("ZeroDivisionError"));
    eq("/error/value", json!("division by zero"));
    has("/error/traceback", "return 1 / 0");
    eq("/error/on_error", json!(["KeyError"]));
    // Files: /home/user is the session's /workspace; nothing else.
    eq("/files/write_path", json!("/home/user/notes/data.txt"));
    eq("/files/read", json!("hello from e2b"));
    eq("/files/read_bytes", json!([0, 1, 2]));
    eq("/files/exists", json!(true));
    eq("/files/missing", json!(false));
    eq("/files/made", json!(true));
    eq("/files/made_again", json!(false));
    eq("/files/removed", json!(true));
    eq("/files/seen_by_code", json!("'hello from e2b'"));
    has("/files/outside", "only under /home/user");
    let listed = get(&r, "/files/listed");
    assert!(
        listed.as_array().is_some_and(
            |l| l.contains(&json!(["notes", "dir"])) && l.contains(&json!(["raw.bin", "file"]))
        ),
        "{}",
        show()
    );
    // Commands run in the jail's shell, in /workspace.
    has("/command/stdout", "raw.bin");
    eq("/command/exit_code", json!(0));
    eq("/command/both", json!(["out\n", "err\n"]));
    eq("/command/failed/exit_code", json!(3));
    // A context is a session of its own.
    eq("/contexts/in_context", json!("True"));
    eq("/contexts/in_default", json!("False"));
    eq("/contexts/x_in_context", json!("False"));
    eq("/contexts/listed", json!(2));
    // The control plane: listed for its owner only; connect keeps state.
    eq("/control/mine", json!(true));
    eq("/control/theirs", json!(false));
    eq("/control/running", json!(true));
    eq("/control/template", json!("data-science"));
    eq("/control/connected_state", json!("41"));
    // A wrong key is refused as E2B refuses one; another identity cannot
    // kill or connect to the sandbox.
    eq("/wrong_key/type", json!("AuthenticationException"));
    // What cannot be made as asked is refused, saying why, and leaves no
    // sandbox (alice's one is all she has).
    has("/refused_creates/unknown_template", "no-such-template");
    has(
        "/refused_creates/too_long",
        "ends a session 3600 s after it starts",
    );
    has("/refused_creates/internet", "egress allowlist");
    eq("/refused_creates/left", json!(1));
    eq("/stranger/kill", json!(false));
    eq("/stranger/connect", json!("SandboxNotFoundException"));
    eq("/stranger/still_alive", json!("41"));
    eq("/forged/no_token/status", json!(401));
    eq("/forged/wrong_token/status", json!(502));
    has("/forged/wrong_token/message", "was not found");
    has("/unsupported/metrics", "not supported by pycell");
    // Pause and connect, fork, snapshot: pycell's snapshots and forks.
    eq("/lifecycle/paused", json!(true));
    eq("/lifecycle/states", json!(["paused"]));
    eq("/lifecycle/while_paused", json!("TimeoutException"));
    eq("/lifecycle/resumed_x", json!("41"));
    eq("/lifecycle/same_id", json!(true));
    eq("/lifecycle/forks", json!(1));
    eq("/lifecycle/fork_x", json!("41"));
    eq("/lifecycle/source_x_after_fork_changed", json!("41"));
    eq("/lifecycle/fork_killed", json!(true));
    has("/lifecycle/snapshot_id", "snap-");
    eq("/lifecycle/restored_x", json!("41"));
    eq("/lifecycle/restored_file", json!("hello from e2b"));
    eq("/lifecycle/restored_killed", json!(true));
    has("/unsupported/language", "runs Python only");
    eq("/kill/killed", json!(true));
    eq("/kill/listed", json!(false));
    assert_ne!(text(&r, "/kill/after"), "", "{}", show());
    // smolagents' E2B executor, unchanged: its CodeAgent's actions ran in
    // a sandbox here (the scripted model's first printed, the second
    // answered).
    eq("/smolagents/answer", json!(90));
    let observed = get(&r, "/smolagents/observations").to_string();
    assert!(observed.contains("python 3"), "{}", show());

    // The JavaScript SDK, the same way.
    let n = node_report(&origin, &tokens);
    let shown = || {
        format!(
            "{}\nfront end:\n{}",
            serde_json::to_string_pretty(&n).unwrap(),
            front.said()
        )
    };
    let is = |pointer: &str, want: Value| {
        assert_eq!(get(&n, pointer), &want, "node {pointer}\n{}", shown());
    };
    is("/state/text", json!("42"));
    is(
        "/stream/seen",
        json!([
            ["stdout", "one\n"],
            ["stderr", "two\n"],
            ["stdout", "three\n"]
        ]),
    );
    is("/dataframe/main", json!(1));
    assert!(
        text(&n, "/dataframe/markdown").contains("| 4.5"),
        "{}",
        shown()
    );
    is("/plot/png_magic", json!(true));
    is("/error/name", json!("ZeroDivisionError"));
    is("/files/read", json!("from node"));
    is("/files/listed", json!([["note.txt", "file"]]));
    is("/files/exists", json!(true));
    is("/files/made", json!(true));
    is("/command/stdout", json!("note.txt\nsub\n"));
    is("/command/exitCode", json!(0));
    is("/command/failed/exitCode", json!(4));
    is("/stranger/killed", json!(false));
    is("/stranger/listed", json!(false));
    is("/stranger/alive", json!("41"));
    is("/wrong_key/name", json!("AuthenticationError"));
    is("/kill/killed", json!(true));
    is("/kill/listed", json!(false));
    drop(front);
    daemon.assert_sandbox_gone(Duration::from_secs(10));
}
