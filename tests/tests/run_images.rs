//! A one-shot run's images: the PNG files it writes come back in its
//! result (path, size, PNG in base64), within the policy's `[images]`
//! bounds (the jail's python has no Pillow here, so a PNG over the edge
//! cannot be scaled and is counted as omitted); cold embedded and warm
//! through pycelld alike. The run's stdin is its own: a run that replaces
//! it, or writes on it, gets no images and loses nothing. (Figures and
//! scaling under `data-science` are in mcp_sessions.)

#![forbid(unsafe_code)]

use base64::Engine;
use pycell_protocol::messages::RunRequest;
use pycell_tests::daemon::Daemon;
use pycell_tests::{run_code, status_of, PNG_WRITER};
use serde_json::Value;

/// Writes a 20x10 PNG and a 2000x10 one (over the 1024 px edge).
fn pngs() -> String {
    format!("{PNG_WRITER}open(\"small.png\", \"wb\").write(png(20, 10))\nopen(\"big.png\", \"wb\").write(png(2000, 10))\n")
}

/// The (width, height) a PNG's header says, if it is a PNG.
fn png_size(b64: &str) -> Option<(u32, u32)> {
    let data = base64::engine::general_purpose::STANDARD.decode(b64).ok()?;
    let be = |at: usize| u32::from_be_bytes(data[at..at + 4].try_into().unwrap());
    (data.starts_with(b"\x89PNG\r\n\x1a\n") && data.len() > 24).then(|| (be(16), be(20)))
}

fn check_images(images: &Value, omitted: &Value) {
    let images = images.as_array().expect("images listed");
    assert_eq!(images.len(), 1, "{images:?}");
    assert_eq!(images[0]["path"], "/workspace/small.png");
    assert_eq!(
        (&images[0]["width"], &images[0]["height"]),
        (&20.into(), &10.into())
    );
    assert_eq!(png_size(images[0]["png"].as_str().unwrap()), Some((20, 10)));
    assert_eq!(omitted, 1, "big.png is over the edge and cannot be scaled");
}

#[test]
fn an_embedded_run_sends_back_the_images_it_wrote() {
    let out = run_code("main.py", &format!("{}\nprint('done')", pngs()), &[], &[]);
    assert_eq!(status_of(&out), "ok", "{}", out.describe());
    let r = out.result();
    assert_eq!(r["stdout"], "done\n");
    check_images(&r["images"], &r["images_omitted"]);
    // Listed with the files, too.
    let files: Vec<&str> = r["files"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|f| f["path"].as_str())
        .collect();
    assert_eq!(files, ["/workspace/big.png", "/workspace/small.png"]);
}

#[test]
fn a_warm_run_through_pycelld_sends_them_back_too() {
    let d = Daemon::start("warm_pools = { default = 1 }\n");
    let result = d.warm_run(&RunRequest {
        code: pngs(),
        ..RunRequest::default()
    });
    let v = serde_json::to_value(&result).unwrap();
    check_images(&v["images"], &v["images_omitted"]);
}

#[test]
fn a_run_that_replaces_or_writes_on_its_stdin_gets_no_images_and_loses_nothing() {
    // Its stdin replaced by a file: the images are not written into it.
    let replaced = format!(
        "import os\nfd = os.open('kept.txt', os.O_WRONLY | os.O_CREAT)\nos.dup2(fd, 0)\n{}\nprint('done')",
        pngs()
    );
    // Bytes that look like a frame, and then junk, written on its stdin.
    let forged = format!(
        "import os\nos.write(0, b'\\x00\\x00\\x00\\x05hello')\n{}\nos.write(0, b'junk')\nprint('done')",
        pngs()
    );
    for (code, keeps_file) in [(replaced, true), (forged, false)] {
        let out = run_code("main.py", &code, &[], &[]);
        assert_eq!(status_of(&out), "ok", "{}", out.describe());
        let r = out.result();
        assert_eq!(r["stdout"], "done\n", "{}", out.describe());
        assert!(r.get("images").is_none(), "{}", out.describe());
        let kept = r["files"]
            .as_array()
            .unwrap()
            .iter()
            .find(|f| f["path"] == "/workspace/kept.txt");
        assert_eq!(kept.is_some(), keeps_file, "{}", out.describe());
        if let Some(f) = kept {
            assert_eq!(f["size"], 0, "the runner wrote into the run's file");
        }
    }
}

/// Code that writes an image frame of its own on the runner's way back
/// (its stdin) and closes it, so the runner sends none: the host holds
/// what arrives to the policy's `[images]` (1024 px a side, 1 MiB in
/// all) and to plain paths in /workspace, whatever the jail said.
const FORGED: &str = r#"
import base64, json, os, struct, zlib
def png(w, h, pad=0):
    def chunk(t, d):
        return struct.pack(">I", len(d)) + t + d + struct.pack(">I", zlib.crc32(t + d))
    ihdr = struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"tEXt", b"\0" * pad) + chunk(b"IEND", b"")
def image(path, w, h, claimed=None, pad=0):
    cw, ch = claimed or (w, h)
    return {"path": path, "png": base64.b64encode(png(w, h, pad)).decode(), "width": cw, "height": ch}
frame = {"images": [
    image("/workspace/ok.png", 20, 10),
    image("/workspace/../../etc/shadow", 20, 10),
    image("/workspace/huge.png", 4000, 4000),
    image("/workspace/liar.png", 4000, 4000, claimed=(20, 10)),
    image("/workspace/heavy.png", 20, 10, pad=2 << 20),
], "images_omitted": 0}
body = json.dumps(frame).encode()
os.write(0, len(body).to_bytes(4, "big") + body)
os.close(0)
print("forged")
"#;

fn only_the_honest_image_is_kept(v: &Value) {
    let images = v["images"].as_array().expect("images listed");
    let paths: Vec<&str> = images.iter().filter_map(|i| i["path"].as_str()).collect();
    assert_eq!(paths, ["/workspace/ok.png"], "{v}");
    assert_eq!(v["images_omitted"], 4, "{v}");
}

#[test]
fn images_the_code_forges_are_held_to_the_policy_on_the_host() {
    let out = run_code("main.py", FORGED, &[], &[]);
    assert_eq!(status_of(&out), "ok", "{}", out.describe());
    let r = out.result();
    assert_eq!(r["stdout"], "forged\n", "{}", out.describe());
    only_the_honest_image_is_kept(&r);
    let d = Daemon::start("warm_pools = { default = 1 }\n");
    let result = d.warm_run(&RunRequest {
        code: FORGED.into(),
        ..RunRequest::default()
    });
    only_the_honest_image_is_kept(&serde_json::to_value(&result).unwrap());
}
