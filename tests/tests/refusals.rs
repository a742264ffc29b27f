//! What the model reads when the sandbox refuses: the line the runner adds
//! after a traceback whose exception came from a refusal (the result's
//! `refusals` are tested with each limit, in limits.rs, egress.rs and
//! tool_calls.rs), and nothing for the program's own errors.

#![forbid(unsafe_code)]

use pycell_tests::{run_code, status_of};

/// The run's stderr, after checking that it ended in an error.
fn failed_stderr(code: &str) -> String {
    let out = run_code("refused.py", code, &[], &[]);
    assert_eq!(status_of(&out), "error", "{}", out.describe());
    out.result()["stderr"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

/// The `pycell: ` line after the traceback, which must come last.
fn explanation(stderr: &str) -> &str {
    let last = stderr.lines().last().unwrap_or_default();
    assert!(
        last.starts_with("pycell: "),
        "no explanation last:\n{stderr}"
    );
    last
}

#[test]
fn writing_outside_the_workspace_names_the_layer_and_where_to_write() {
    let stderr = failed_stderr("open('/usr/lib/pycell-refusal-test', 'w')\n");
    assert!(stderr.contains("Error: [Errno"), "{stderr}");
    let line = explanation(&stderr);
    assert!(line.contains("layer landlock"), "{line}");
    assert!(line.contains("/workspace"), "{line}");
}

#[test]
fn the_empty_network_says_there_is_none() {
    let stderr =
        failed_stderr("import socket\nsocket.create_connection(('192.0.2.1', 80), timeout=5)\n");
    let line = explanation(&stderr);
    assert!(line.contains("no network"), "{line}");
    let stderr = failed_stderr("import socket\nsocket.getaddrinfo('example.net', 443)\n");
    let line = explanation(&stderr);
    assert!(line.contains("did not resolve"), "{line}");
}

#[test]
fn a_refused_system_call_names_seccomp() {
    // unshare(CLONE_NEWUSER) is refused by pycell's fixed profile.
    let code = "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\nif libc.unshare(0x10000000) != 0:\n    e = ctypes.get_errno()\n    raise OSError(e, os.strerror(e))\n";
    let stderr = failed_stderr(code);
    let line = explanation(&stderr);
    assert!(line.contains("layer seccomp"), "{line}");
}

#[test]
fn the_programs_own_error_gets_no_line() {
    let stderr = failed_stderr("raise ValueError('boom')\n");
    assert!(stderr.ends_with("ValueError: boom\n"), "{stderr}");
    assert!(!stderr.contains("pycell:"), "{stderr}");
}
