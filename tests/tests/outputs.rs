//! Outputs sized for a model's context. What a run shows with
//! `display()` comes back as displays, each in the richest form the object
//! offers (markdown, a PNG, text), held to the policy's `[output]` on the
//! host: cold embedded (the runner's limits on its command line) and warm
//! through pycelld (in its work frame) alike; a runner that forges
//! displays past those bounds gets them cut or counted. A 5 MB stdout
//! comes back as its head (the output cap) and its tail, in a run and in
//! a session cell. (A DataFrame and a 2 MB value through the official MCP
//! SDK are in mcp_sessions.)

#![forbid(unsafe_code)]

use base64::Engine;
use pycell_protocol::messages::RunRequest;
use pycell_protocol::session::{SessionCall, SessionStartRequest};
use pycell_tests::daemon::Daemon;
use pycell_tests::{run_code, status_of, PNG_WRITER};
use serde_json::Value;

/// A markdown object, a 20x10 PNG through `_repr_png_`, a long string,
/// then two more than `[output] displays = 3` keeps (after
/// [`PNG_WRITER`]).
const SHOWS: &str = r#"
class Table:
    def _repr_markdown_(self):
        return "| a |\n|---|\n| 1 |"
    def __repr__(self):
        return "Table(a=[1])"
class Picture:
    def _repr_png_(self):
        return png(20, 10)
display(Table(), Picture(), "x" * 5000)
display(4, 5)
print("shown")
"#;

/// The policy `outputs`: the default with `[output] part_chars = 300`
/// and `displays = 3`.
fn outputs_policy() -> String {
    let text = pycell_policy::builtin::source("default")
        .unwrap()
        .replace("name = \"default\"", "name = \"outputs\"")
        .replace("part_chars = 16384", "part_chars = 300")
        .replace("displays = 16", "displays = 3");
    assert!(text.contains("part_chars = 300") && text.contains("displays = 3"));
    text
}

fn policy_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(
        dir.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    std::fs::write(dir.path().join("outputs.toml"), outputs_policy()).unwrap();
    dir
}

fn check_displays(r: &Value) {
    assert_eq!(r["status"], "ok", "{r}");
    assert_eq!(r["stdout"], "shown\n", "{r}");
    let shown = r["displays"].as_array().unwrap_or_else(|| panic!("{r}"));
    assert_eq!(shown.len(), 3, "{r}");
    assert_eq!(r["displays_omitted"], 2, "{r}");
    assert_eq!(shown[0]["kind"], "display");
    assert_eq!(shown[0]["markdown"], "| a |\n|---|\n| 1 |");
    assert_eq!(shown[0]["text"], "Table(a=[1])");
    let png = base64::engine::general_purpose::STANDARD
        .decode(
            shown[1]["png"]
                .as_str()
                .unwrap_or_else(|| panic!("no png: {r}")),
        )
        .unwrap();
    assert!(png.starts_with(b"\x89PNG\r\n\x1a\n") && png[16..24] == [0, 0, 0, 20, 0, 0, 0, 10]);
    let long = shown[2]["text"].as_str().unwrap();
    assert!(long.chars().count() <= 300, "{long}");
    assert!(
        long.starts_with("'xxx") && long.contains("characters cut"),
        "{long}"
    );
    assert_eq!(shown[2]["truncated"], true);
}

#[test]
fn a_cold_embedded_run_shows_its_displays_within_the_policys_output_bounds() {
    let dir = policy_dir();
    let policy = dir.path().join("outputs.toml");
    let out = run_code(
        "main.py",
        &format!("{PNG_WRITER}{SHOWS}"),
        &["--policy", policy.to_str().unwrap()],
        &[],
    );
    assert_eq!(status_of(&out), "ok", "{}", out.describe());
    check_displays(&out.result());
}

#[test]
fn a_warm_run_through_pycelld_shows_them_too() {
    let dir = policy_dir();
    let d = Daemon::start(&format!(
        "policy_dir = \"{}\"\nwarm_pools = {{ outputs = 1 }}\n",
        dir.path().display()
    ));
    let result = d.warm_run(&RunRequest {
        code: format!("{PNG_WRITER}{SHOWS}"),
        policy: Some("outputs".into()),
        ..RunRequest::default()
    });
    check_displays(&serde_json::to_value(&result).unwrap());
}

/// Code that writes the runner's frame itself on the way back (its stdin)
/// and closes it, with displays past every bound: the host keeps three,
/// cuts each text part to 300 characters, drops a PNG part that is not a
/// PNG within the 1024 px edge, and counts the rest.
const FORGED: &str = r#"
import base64, json, os
def shown(**parts):
    return dict({"kind": "display", "text": "t", "truncated": False}, **parts)
frame = {"displays": [
    shown(markdown="m" * 100000, html="h" * 100000),
    shown(png=base64.b64encode(b"GIF89a" + b"\0" * 30).decode()),
    shown(json="[" + "1," * 50000 + "1]"),
    shown(), shown(), shown(),
], "displays_omitted": 1}
body = json.dumps(frame).encode()
os.write(0, len(body).to_bytes(4, "big") + body)
os.close(0)
print("forged")
"#;

#[test]
fn displays_a_runner_forges_are_held_to_the_policy_on_the_host() {
    let dir = policy_dir();
    let policy = dir.path().join("outputs.toml");
    let out = run_code(
        "main.py",
        FORGED,
        &["--policy", policy.to_str().unwrap()],
        &[],
    );
    assert_eq!(status_of(&out), "ok", "{}", out.describe());
    let r = out.result();
    assert_eq!(r["stdout"], "forged\n", "{r}");
    let shown = r["displays"].as_array().unwrap_or_else(|| panic!("{r}"));
    assert_eq!(shown.len(), 3, "{r}");
    assert_eq!(r["displays_omitted"], 4, "{r}");
    for part in ["markdown", "html"] {
        let text = shown[0][part].as_str().unwrap();
        assert!(text.chars().count() <= 300, "{part}: {}", text.len());
    }
    assert_eq!(shown[0]["truncated"], true);
    assert!(shown[1].get("png").is_none(), "{r}");
    assert!(shown[2]["json"].as_str().unwrap().chars().count() <= 300);
}

/// A default session of pycelld `d`, started on `c`: its handle.
fn new_session(d: &Daemon, c: &mut pycell_protocol::client::DaemonClient) -> String {
    c.session_start(SessionStartRequest::default(), |_| {})
        .unwrap_or_else(|e| panic!("session_start: {e}\n{}", d.log()))
        .session
}

/// 5 MB of numbered lines on stdout, then a last line the model needs.
const FLOOD: &str = r#"
import sys
for i in range(250_000):
    sys.stdout.write("line %019d\n" % i)
print("THE END: 42")
"#;

fn check_tail(stdout: &str, truncated: bool, tail: &Value) {
    assert!(truncated, "5 MB is over the 1 MiB cap");
    assert_eq!(stdout.len(), 1 << 20, "the head is the cap");
    assert!(stdout.starts_with("line 0000000000000000000\n"));
    let end = tail["tail"]
        .as_str()
        .unwrap_or_else(|| panic!("no tail: {tail}"));
    assert!(
        end.ends_with("line 0000000000000249999\nTHE END: 42\n"),
        "{}",
        &end[end.len().saturating_sub(80)..]
    );
    assert_eq!(end.len(), 16 << 10, "the tail is 16 KiB");
    let total = 250_000 * 25 + "THE END: 42\n".len() as u64;
    let skipped = tail["skipped_bytes"].as_u64().unwrap();
    assert_eq!(skipped, total - (1 << 20) - (16 << 10), "{tail}");
}

#[test]
fn a_long_stdout_keeps_its_head_and_its_tail_in_a_run_and_a_cell() {
    let out = run_code("main.py", FLOOD, &[], &[]);
    assert_eq!(status_of(&out), "ok", "{}", out.describe());
    let r = out.result();
    check_tail(
        r["stdout"].as_str().unwrap(),
        r["stdout_truncated"] == true,
        &r["stdout_tail"],
    );
    assert!(r.get("stderr_tail").is_none(), "{}", r["stderr_tail"]);

    let d = Daemon::start("");
    let mut c = d.client();
    let s = new_session(&d, &mut c);
    let a = c
        .session_call(&s, SessionCall::Cell { code: FLOOD.into() }, None)
        .unwrap_or_else(|e| panic!("{e}\n{}", d.log()));
    let m = serde_json::to_value(&a.measure).unwrap();
    check_tail(&a.stdout, a.measure.stdout_truncated, &m["stdout_tail"]);
    // A cell's stream past the cap is kept whole in its workspace: the
    // answer's head and the file are all it printed.
    let mut whole: String = (0..250_000).map(|i| format!("line {i:019}\n")).collect();
    whole.push_str("THE END: 42\n");
    let rest = &m["stdout_tail"];
    assert_eq!(
        rest["rest_file"], "/workspace/outputs/cell-1-stdout.txt",
        "{rest}"
    );
    assert_eq!(
        rest["rest_file_bytes"],
        (whole.len() - (1 << 20)) as u64,
        "{rest}"
    );
    let read = SessionCall::Read {
        path: "outputs/cell-1-stdout.txt".into(),
    };
    let file = c
        .session_call(&s, read, None)
        .unwrap()
        .reply
        .data
        .unwrap_or_default();
    let file = base64::engine::general_purpose::STANDARD
        .decode(file)
        .unwrap();
    assert!(a.stdout.as_bytes() == &whole.as_bytes()[..1 << 20]);
    assert!(
        file == whole.as_bytes()[1 << 20..],
        "the file is not the rest"
    );
    // The next cell's streams are its own.
    let next = c
        .session_call(
            &s,
            SessionCall::Cell {
                code: "print('short')".into(),
            },
            None,
        )
        .unwrap();
    assert_eq!(next.stdout, "short\n");
    assert!(next.measure.stdout_tail.is_none());
    c.session_end(&s).unwrap();
}

/// A value whose markdown is not UTF-8 (a file name read with
/// surrogateescape) and one whose markdown never ends: the first comes
/// back with "?" for the byte (the frame stays readable), the second is
/// interrupted at the cell's timeout like the cell's own code, and the
/// session lives on.
#[test]
fn a_values_rendering_is_the_cells_own_code_and_cannot_break_the_reply() {
    let d = Daemon::start("");
    let mut c = d.client();
    let s = new_session(&d, &mut c);
    let mut cell = |code: &str, timeout: Option<f64>| {
        c.session_call(&s, SessionCall::Cell { code: code.into() }, timeout)
            .unwrap_or_else(|e| panic!("{code}: {e}\n{}", d.log()))
    };
    let odd = cell(
        "import os\nclass Odd:\n    def _repr_markdown_(self):\n        return os.fsdecode(b'caf\\xe9')\nOdd()",
        None,
    );
    let shown = &odd.reply.displays;
    assert_eq!(shown.len(), 1, "{odd:?}");
    assert_eq!(shown[0].markdown.as_deref(), Some("caf?"), "{odd:?}");
    let stuck = cell(
        "class Stuck:\n    def _repr_markdown_(self):\n        while True:\n            pass\nStuck()",
        Some(1.0),
    );
    let error = stuck
        .reply
        .error
        .as_ref()
        .unwrap_or_else(|| panic!("{stuck:?}"));
    assert_eq!(error.kind, "KeyboardInterrupt", "{stuck:?}");
    assert!(!error.traceback.contains("_pycell"), "{}", error.traceback);
    assert_eq!(cell("1 + 1", None).reply.value.as_deref(), Some("2"));
}
