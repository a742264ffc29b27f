//! Sessions for people: `pycell repl` driven on a pseudo-terminal
//! (tests/repl/drive.py: values and errors as python's prompt shows them,
//! blocks, ^C, history, ^D), embedded and through pycelld; and `pycell
//! session start|run|put|get|ls|list|fork|end` through pycelld.

#![forbid(unsafe_code)]

use std::process::{Command, Stdio};
use std::time::Duration;

use pycell_tests::daemon::Daemon;
use pycell_tests::{
    find_cgroups, output_guarded, processes_with_uid, pycell_bin, repo_root, require_root,
};
use serde_json::Value;

const GUARD: Duration = Duration::from_secs(240);

fn drive_repl(args: &[&str]) -> Value {
    require_root();
    let home = tempfile::tempdir().unwrap();
    let child = Command::new("python3")
        .arg(repo_root().join("tests/repl/drive.py"))
        .arg(pycell_bin())
        .args(args)
        .env("REPL_HOME", home.path())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let g = output_guarded(child, GUARD);
    assert!(g.status.is_some(), "the repl driver hung: {}", g.stderr);
    let v: Value = serde_json::from_str(g.stdout.trim())
        .unwrap_or_else(|e| panic!("{e}: {}\n{}", g.stdout, g.stderr));
    assert!(
        home.path().join(".pycell_history").exists(),
        "no history file was written"
    );
    v
}

fn check_repl(v: &Value) {
    let s = |k: &str| v[k].as_str().unwrap_or_default().to_string();
    assert!(s("banner").contains("Python in a pycell sandbox"), "{v}");
    assert!(s("value").contains("\n42\n"), "{v}");
    assert!(s("continuation").ends_with("... "), "{v}");
    assert!(s("block").contains("\n7\n"), "{v}");
    assert!(
        s("error").contains("ZeroDivisionError: division by zero"),
        "{v}"
    );
    assert!(
        !s("error").contains("<string>"),
        "runner frames in the traceback: {v}"
    );
    assert!(s("interrupt").contains("KeyboardInterrupt"), "{v}");
    assert!(s("after_interrupt").contains("still 41"), "{v}");
    assert!(s("history").contains("print('still', x)"), "{v}");
    assert_eq!(v["exit"], 0, "{v}");
    let uid = v["uid"]
        .as_u64()
        .unwrap_or_else(|| panic!("no sandbox uid shown: {v}")) as u32;
    assert!(
        processes_with_uid(uid).is_empty(),
        "processes of uid {uid} left"
    );
    let prefix = format!("pycell-{uid}-");
    assert!(
        find_cgroups(|n| n.starts_with(&prefix)).is_empty(),
        "cgroups of uid {uid} left"
    );
}

#[test]
fn the_repl_behaves_like_pythons_prompt_embedded() {
    check_repl(&drive_repl(&["--embedded"]));
}

#[test]
fn the_repl_behaves_like_pythons_prompt_through_pycelld() {
    let d = Daemon::start("");
    let socket = d.socket();
    let v = drive_repl(&["--socket", socket.to_str().unwrap()]);
    assert!(
        v["banner"].as_str().unwrap_or_default().contains("daemon"),
        "{v}"
    );
    check_repl(&v);
    d.assert_sandbox_gone(Duration::from_secs(10));
}

/// `pycell session ARGS --socket S`: (exit code, stdout, stderr).
fn session(d: &Daemon, args: &[&str], stdin: Option<&str>) -> (i32, String, String) {
    let mut cmd = Command::new(pycell_bin());
    cmd.arg("session")
        .args(args)
        .arg("--socket")
        .arg(d.socket());
    cmd.stdin(if stdin.is_some() {
        Stdio::piped()
    } else {
        Stdio::null()
    })
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    let mut child = cmd.spawn().unwrap();
    if let Some(text) = stdin {
        use std::io::Write;
        child
            .stdin
            .take()
            .unwrap()
            .write_all(text.as_bytes())
            .unwrap();
    }
    let g = output_guarded(child, Duration::from_secs(60));
    let code = g.status.and_then(|s| s.code()).unwrap_or(-1);
    (code, g.stdout, g.stderr)
}

#[test]
fn pycell_session_commands_work_through_pycelld() {
    let d = Daemon::start("");
    let (code, handle, err) = session(&d, &["start"], None);
    assert_eq!(code, 0, "{err}\n{}", d.log());
    let handle = handle.trim().to_string();
    assert!(handle.starts_with("s-"), "{handle}");
    let h = handle.as_str();
    assert_eq!(session(&d, &["run", h, "--code", "x = 41"], None).0, 0);
    let (code, out, _) = session(&d, &["run", h, "-"], Some("print('hi')\nx + 1\n"));
    assert_eq!((code, out.as_str()), (0, "hi\n42\n"));
    let (code, _, err) = session(&d, &["run", h, "--code", "1/0"], None);
    assert_eq!(code, 1);
    assert!(err.contains("ZeroDivisionError"), "{err}");
    let (code, _, _) = session(
        &d,
        &[
            "run",
            h,
            "--code",
            "import time; time.sleep(30)",
            "--timeout",
            "0.5",
        ],
        None,
    );
    assert_eq!(code, 124);
    // A file in and out, exact bytes.
    let dir = tempfile::tempdir().unwrap();
    let local = dir.path().join("in.bin");
    let bytes: Vec<u8> = (0..=255u8).cycle().take(3000).collect();
    std::fs::write(&local, &bytes).unwrap();
    let (code, _, err) = session(
        &d,
        &["put", h, local.to_str().unwrap(), "data/in.bin"],
        None,
    );
    assert_eq!(code, 0, "{err}");
    let back = dir.path().join("back.bin");
    let (code, _, err) = session(&d, &["get", h, "data/in.bin", back.to_str().unwrap()], None);
    assert_eq!(code, 0, "{err}");
    assert_eq!(std::fs::read(&back).unwrap(), bytes);
    let (code, out, _) = session(
        &d,
        &["run", h, "--code", "len(open('data/in.bin','rb').read())"],
        None,
    );
    assert_eq!((code, out.as_str()), (0, "3000\n"));
    let (_, out, _) = session(&d, &["ls", h, "data"], None);
    assert!(out.contains("in.bin"), "{out}");
    let (code, _, err) = session(&d, &["get", h, "../etc/passwd"], None);
    assert_eq!(code, 125);
    assert!(err.contains("'..'"), "{err}");
    let (_, out, _) = session(&d, &["list"], None);
    assert!(out.contains(h), "{out}");
    // A fork: its handle on stdout, what it did not carry on stderr.
    session(&d, &["run", h, "--code", "f = open('/dev/null')"], None);
    let (code, fork, err) = session(&d, &["fork", h], None);
    assert_eq!(code, 0, "{err}");
    let fork = fork.trim().to_string();
    assert!(fork.starts_with("s-") && fork != h, "{fork}");
    assert!(err.contains("not carried: f: TextIOWrapper"), "{err}");
    let (code, out, _) = session(
        &d,
        &[
            "run",
            &fork,
            "--code",
            "x = 0\nlen(open('data/in.bin','rb').read())",
        ],
        None,
    );
    assert_eq!((code, out.as_str()), (0, "3000\n"));
    let (_, out, _) = session(&d, &["run", h, "--code", "x"], None);
    assert_eq!(out, "41\n");
    assert_eq!(session(&d, &["end", &fork], None).0, 0);
    assert_eq!(session(&d, &["end", h], None).0, 0);
    d.assert_sandbox_gone(Duration::from_secs(10));
    let (code, _, err) = session(&d, &["run", h, "--code", "x"], None);
    assert_eq!(code, 125);
    assert!(err.contains("session_gone"), "{err}");
}

#[test]
fn pycell_session_without_pycelld_says_what_to_do() {
    let out = Command::new(pycell_bin())
        .args(["session", "list", "--socket", "/nonexistent/pycell.sock"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(125));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("cannot connect to pycelld"), "{err}");
}
