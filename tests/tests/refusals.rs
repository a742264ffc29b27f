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

/// A script that makes raw system calls through ctypes and prints, for
/// each, the errno it got: `calls` is a list of `(name, number, args)`.
fn raw_calls(calls: &str) -> String {
    format!(
        r#"
import ctypes, json
libc = ctypes.CDLL(None, use_errno=True)
got = []
for name, nr, args, times in {calls}:
    errnos = set()
    for _ in range(times):
        ctypes.set_errno(0)
        r = libc.syscall(nr, *[ctypes.c_long(a) for a in args])
        errnos.add(ctypes.get_errno() if r == -1 else 0)
    got.append([name, sorted(errnos)])
print(json.dumps(got))
"#
    )
}

/// The `seccomp` refusals of a result, as `(object, count)`.
fn seccomp_refusals(result: &serde_json::Value) -> Vec<(String, u64)> {
    let list = result["refusals"].as_array().expect("refusals");
    list.iter()
        .filter(|r| r["layer"] == "seccomp")
        .inspect(|r| {
            assert!(
                r["rule"].as_str().unwrap().contains("seccomp profile"),
                "{r}"
            )
        })
        .map(|r| {
            (
                r["object"].as_str().unwrap().to_string(),
                r["count"].as_u64().unwrap(),
            )
        })
        .collect()
}

// x86_64 numbers: unshare 272, mount 165, seccomp 317, getpid 39.
#[cfg(target_arch = "x86_64")]
#[test]
fn each_refused_system_call_is_counted_and_still_fails_with_eperm() {
    let calls = r#"[("unshare", 272, [0x10000000], 3), ("mount", 165, [0, 0, 0, 0, 0], 1),
        ("listener", 317, [1, 8, 0], 1), ("getpid", 39, [], 2)]"#;
    let out = run_code("calls.py", &raw_calls(calls), &[], &[]);
    assert_eq!(status_of(&out), "ok", "{}", out.describe());
    let r = out.result();
    let stdout = r["stdout"].as_str().unwrap().trim().to_string();
    assert_eq!(
        stdout,
        r#"[["unshare", [1]], ["mount", [1]], ["listener", [1]], ["getpid", [0]]]"#,
        "the program must still get EPERM\n{}",
        out.describe()
    );
    let mut got = seccomp_refusals(&r);
    got.sort();
    let want = [
        ("the system call mount (EPERM)".to_string(), 1),
        ("the system call seccomp (EPERM)".to_string(), 1),
        ("the system call unshare (EPERM)".to_string(), 3),
    ];
    assert_eq!(got, want, "{}", out.describe());
}

#[cfg(target_arch = "x86_64")]
#[test]
fn past_the_answers_a_jail_gets_at_full_speed_refusals_are_still_eperm_and_counted() {
    // 5000 refused calls: the jailer answers 4096 as they come, then one
    // per millisecond (about a second here); every one fails with EPERM.
    // A listener of the program's own is still refused after them.
    let calls = r#"[("unshare", 272, [0x10000000], 5000), ("listener", 317, [1, 8, 0], 1)]"#;
    let out = run_code("flood.py", &raw_calls(calls), &["--timeout", "60"], &[]);
    let r = out.result();
    assert_eq!(
        r["stdout"].as_str().unwrap().trim(),
        r#"[["unshare", [1]], ["listener", [1]]]"#,
        "{}",
        out.describe()
    );
    let mut got = seccomp_refusals(&r);
    got.sort();
    let want = [
        ("the system call seccomp (EPERM)".to_string(), 1),
        ("the system call unshare (EPERM)".to_string(), 5000),
    ];
    assert_eq!(got, want, "{}", out.describe());
}
