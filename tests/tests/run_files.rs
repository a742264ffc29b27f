//! A run's result lists the files it created or changed in /workspace
//! (path, size, sha256), not its script as given, without following the
//! links or reading the fifos the run left there; cold embedded and warm
//! through pycelld alike.

#![forbid(unsafe_code)]

use pycell_protocol::messages::RunRequest;
use pycell_tests::daemon::Daemon;
use pycell_tests::{run_code, status_of};
use serde_json::Value;

const CODE: &str = r#"
import os
open("out.txt", "w").write("abc")
os.makedirs("d/e", exist_ok=True)
open("d/e/deep.bin", "wb").write(b"\0" * 10)
os.symlink("/etc/passwd", "link")
os.mkfifo("fifo")
print("done")
"#;

fn paths(files: &Value) -> Vec<String> {
    files
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|f| f["path"].as_str().map(str::to_string))
        .collect()
}

#[test]
fn an_embedded_run_lists_what_it_wrote_and_nothing_it_did_not() {
    let out = run_code("main.py", CODE, &[], &[]);
    assert_eq!(status_of(&out), "ok", "{}", out.describe());
    let r = out.result();
    assert_eq!(
        paths(&r["files"]),
        ["/workspace/d/e/deep.bin", "/workspace/out.txt"],
        "{}",
        out.describe()
    );
    let txt = &r["files"][1];
    assert_eq!(txt["size"], 3);
    assert_eq!(
        txt["sha256"],
        "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    );
    assert_eq!(txt["created"], true);
    assert_eq!(r["files_truncated"], false);
}

#[test]
fn a_warm_run_through_pycelld_lists_them_too_but_not_its_script() {
    let d = Daemon::start("warm_pools = { default = 1 }\n");
    let result = d.warm_run(&RunRequest {
        code: CODE.into(),
        ..RunRequest::default()
    });
    let listed: Vec<&str> = result.files.iter().map(|f| f.path.as_str()).collect();
    assert_eq!(listed, ["/workspace/d/e/deep.bin", "/workspace/out.txt"]);
}
