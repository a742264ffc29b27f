//! A cold run starts python on pycell's runner compiled for its
//! interpreter (issue 50): a `.pyc` kept in /var/cache/pycell/runner,
//! copied into the jail's root, read-only; the jailer refuses one that
//! anyone but root could have changed.

#![forbid(unsafe_code)]

use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::process::{Command, Stdio};

use pycell_tests::{pycell_bin, require_root, Pycell};
use pycell_wire::events::{read_event, Event};
use pycell_wire::spec::{JailSpec, RUNNER_PYC};

/// What the run's program sees of its start, as JSON on stdout.
const LOOKS: &str = r#"
import json, sys
cmdline = open("/proc/self/cmdline", "rb").read().split(b"\0")
try:
    open("/.pycell/runner.pyc", "ab")
    writable = True
except OSError:
    writable = False
print(json.dumps({
    "cmdline": [a.decode(errors="replace")[:40] for a in cmdline],
    "argv": sys.argv,
    "orig_argv": sys.orig_argv,
    "path0": sys.path[0],
    "file": __file__,
    "main": __name__,
    "pyc_writable": writable,
}))
def deeper():
    1 / 0
deeper()
"#;

#[test]
fn a_cold_run_starts_on_the_compiled_runner_and_behaves_as_python_script_does() {
    require_root();
    let out = Pycell::new(["run", "--embedded", "--json", "-"])
        .stdin(LOOKS)
        .run();
    let r = out.result();
    assert_eq!(r["status"], "error", "{}", out.describe());
    let seen: serde_json::Value =
        serde_json::from_str(r["stdout"].as_str().unwrap().trim()).expect("the run's report");
    // python started on the compiled runner, not on the runner's text.
    assert_eq!(seen["cmdline"][2], RUNNER_PYC, "{seen}");
    assert!(
        !seen["cmdline"].to_string().contains("pycell's runner"),
        "{seen}"
    );
    // The program sees what `python -s SCRIPT` would give it.
    let script = seen["argv"][0].as_str().unwrap();
    assert!(script.starts_with("/workspace/"), "{seen}");
    assert_eq!(seen["file"], script, "{seen}");
    assert_eq!(seen["main"], "__main__");
    assert_eq!(seen["path0"], "/workspace");
    assert_eq!(seen["orig_argv"][1], "-s", "{seen}");
    assert_eq!(seen["orig_argv"][2], script, "{seen}");
    assert_eq!(seen["pyc_writable"], false, "{seen}");
    // Its traceback shows its own frames only.
    let stderr = r["stderr"].as_str().unwrap();
    assert!(stderr.contains("in deeper"), "{stderr}");
    assert!(stderr.contains("ZeroDivisionError"), "{stderr}");
    assert!(!stderr.contains("<string>"), "{stderr}");
    assert!(!stderr.contains("runner"), "{stderr}");
    // The compiled runner is root's, read-only for others, in root's cache.
    let cached: Vec<_> = std::fs::read_dir("/var/cache/pycell/runner")
        .expect("the runner cache")
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().ends_with(".pyc"))
        .collect();
    assert!(!cached.is_empty());
    for e in cached {
        let m = e.metadata().unwrap();
        assert_eq!((m.uid(), m.mode() & 0o7777), (0, 0o644), "{e:?}");
    }
}

/// The spec `pycell debug spec` gives for `print(1)`, its python started
/// on the compiled runner at `pyc`.
fn spec_with_pyc(pyc: &std::path::Path) -> JailSpec {
    let cold = pycell_tests::debug_spec("print(1)\n");
    let on_runner = pycell_runner::cold_on_runner(&cold).expect("a python run");
    pycell_runner::on_compiled(&on_runner, pyc).expect("on the runner's text")
}

#[test]
fn the_jailer_refuses_a_compiled_runner_anyone_but_root_could_change() {
    require_root();
    // A copy in a directory everyone may write (/tmp): refused before
    // anything is made, as a bind source there would be.
    let dir = tempfile::tempdir().unwrap();
    let pyc = dir.path().join("runner.pyc");
    std::fs::write(&pyc, b"not even a pyc").unwrap();
    let spec = spec_with_pyc(&pyc);
    let frame = pycell_wire::framing::encode_within(&spec, pycell_wire::spec::MAX_SPEC_FRAME)
        .expect("a frame");
    let mut jailer = Command::new(pycell_bin().with_file_name("pycell-jailer"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("the jailer");
    let mut stdin = jailer.stdin.take().unwrap();
    stdin.write_all(&frame).unwrap();
    drop(stdin);
    let mut events = jailer.stdout.take().unwrap();
    let mut result = None;
    while let Some(ev) = read_event(&mut events).expect("events") {
        if let Event::Result(r) = ev {
            result = Some(r);
        }
    }
    jailer.wait().unwrap();
    let r = result.expect("a result");
    let e = r.error.expect("refused");
    assert_eq!(e.code.as_str(), "mounts_failed", "{e:?}");
    assert!(e.message.contains("writable by others"), "{e:?}");
    assert!(e.message.contains(&*dir.path().to_string_lossy()), "{e:?}");
}
