//! Exit codes, statuses, stdin, --input and script arguments.

#![forbid(unsafe_code)]

use pycell_tests::{run_code, Pycell, Script};
use serde_json::{json, Value};

#[test]
fn sys_exit_code_is_passed_through() {
    let out = run_code("exit3.py", "import sys\nsys.exit(3)\n", &[], &[]);
    let r = out.result();
    assert_eq!(r["status"], "error", "{}", out.describe());
    assert_eq!(r["exit_code"], 3, "{}", out.describe());
    assert_eq!(r["signal"], Value::Null, "{}", out.describe());
    assert_eq!(out.exit_code, Some(3), "{}", out.describe());
}

#[test]
fn killed_by_own_signal_is_128_plus_n() {
    let out = run_code(
        "sigkill.py",
        "import os\nos.kill(os.getpid(), 9)\n",
        &[],
        &[],
    );
    let r = out.result();
    assert_eq!(r["status"], "error", "{}", out.describe());
    assert_eq!(r["signal"], 9, "{}", out.describe());
    assert_eq!(r["exit_code"], Value::Null, "{}", out.describe());
    assert_eq!(out.exit_code, Some(137), "{}", out.describe());
}

#[test]
fn code_from_stdin_runs() {
    let out = Pycell::new(["run", "--json", "-"])
        .stdin("import sys\nprint('from stdin', sys.argv[0])\n")
        .run();
    let r = out.result();
    assert_eq!(r["status"], "ok", "{}", out.describe());
    assert_eq!(
        r["stdout"],
        "from stdin /workspace/main.py\n",
        "{}",
        out.describe()
    );
    assert_eq!(out.exit_code, Some(0), "{}", out.describe());
}

#[test]
fn streaming_mode_prints_the_scripts_output() {
    let out = Pycell::new(["run", "-"])
        .stdin("import sys\nprint(6 * 7)\nprint('to stderr', file=sys.stderr)\n")
        .run();
    assert_eq!(out.exit_code, Some(0), "{}", out.describe());
    assert_eq!(out.stdout_str(), "42\n", "{}", out.describe());
    assert!(out.stderr.contains("to stderr"), "{}", out.describe());
}

#[test]
fn streaming_mode_reports_a_failure_on_stderr() {
    let out = Pycell::new(["run", "-"])
        .stdin("import sys\nprint('partial')\nsys.exit(5)\n")
        .run();
    assert_eq!(out.exit_code, Some(5), "{}", out.describe());
    assert_eq!(out.stdout_str(), "partial\n", "{}", out.describe());
    assert!(
        out.stderr.lines().any(|l| l.starts_with("pycell: ")),
        "no \"pycell: ...\" line on stderr for a non-ok end\n{}",
        out.describe()
    );
}

#[test]
fn input_file_becomes_stdin() {
    let input = Script::new("input.txt", "hello\nworld\n\u{e9}\n");
    let script = Script::new(
        "upper.py",
        "import sys\nsys.stdout.write(sys.stdin.read().upper())\n",
    );
    let out = Pycell::new(pycell_tests::run_args(
        &script.path,
        &["--input", input.path.to_str().expect("utf-8 path")],
        &[],
    ))
    .run();
    let r = out.result();
    assert_eq!(r["status"], "ok", "{}", out.describe());
    assert_eq!(r["stdout"], "HELLO\nWORLD\n\u{c9}\n", "{}", out.describe());
}

#[test]
fn stdin_is_empty_without_input() {
    // Even if the caller's own stdin has data, the script must not see it.
    let script = Script::new("stdin.py", "import sys\nprint(repr(sys.stdin.read()))\n");
    let out = Pycell::new(pycell_tests::run_args(&script.path, &[], &[]))
        .stdin("caller's stdin must not reach the script\n")
        .run();
    let r = out.result();
    assert_eq!(r["status"], "ok", "{}", out.describe());
    assert_eq!(r["stdout"], "''\n", "{}", out.describe());
}

#[test]
fn script_args_reach_sys_argv() {
    let out = run_code(
        "args.py",
        "import json, os, sys\nprint(json.dumps({'argv': sys.argv, 'exists': os.path.exists(sys.argv[0])}))\n",
        &[],
        &["a", "b c", "--flag", "-", "--"],
    );
    let r = out.result();
    assert_eq!(r["status"], "ok", "{}", out.describe());
    let v: Value = serde_json::from_str(r["stdout"].as_str().unwrap_or_default().trim())
        .unwrap_or_else(|e| panic!("script output is not JSON ({e})\n{}", out.describe()));
    assert_eq!(
        v,
        json!({"argv": ["/workspace/args.py", "a", "b c", "--flag", "-", "--"], "exists": true}),
        "{}",
        out.describe()
    );
}

#[test]
fn a_reader_that_went_away_ends_pycell_info_quietly() {
    // `pycell info | head -1`, with head gone before pycell writes.
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let out = std::process::Command::new(pycell_tests::pycell_bin())
        .arg("info")
        .env("PYCELL_SOCKET", "")
        .stdout(writer)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(141), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[test]
fn no_code_run_borrows_a_server_policy_embedded() {
    let out = Pycell::new(["run", "--embedded", "--json", "--policy", "mcp-server", "-"])
        .stdin("print(1)\n")
        .run();
    assert_eq!(out.exit_code, Some(125), "{}", out.describe());
    let r = out.result();
    assert_eq!(r["status"], "refused", "{}", out.describe());
    let message = r["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("\"mcp-server\" is for MCP servers over stdio"),
        "{}",
        out.describe()
    );
}
