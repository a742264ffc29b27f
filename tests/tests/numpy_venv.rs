//! A real package with native code and threads: numpy from a uv-made venv,
//! under a policy whose interpreter is that venv.

#![forbid(unsafe_code)]

use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

use pycell_tests::{repo_root, run_args, Pycell, Script};
use serde_json::Value;

fn numpy_venv() -> PathBuf {
    let venv = std::env::var_os("PYCELL_TEST_NUMPY_VENV").unwrap_or_else(|| {
        panic!(
            "PYCELL_TEST_NUMPY_VENV is not set: run the tests through scripts/test, which builds the numpy venv with uv"
        )
    });
    let venv = PathBuf::from(venv);
    assert!(
        venv.is_absolute() && venv.join("bin/python").exists(),
        "PYCELL_TEST_NUMPY_VENV={} is not an absolute path to a venv (no bin/python)",
        venv.display()
    );
    venv
}

/// policies/default.toml with `[interpreter]` replaced by `venv = ...`,
/// named `name`. pycell mounts the venv itself, read-only at /venv
/// (docs/policies.md).
fn venv_policy(venv: &Path, name: &str) -> String {
    let original = fs::read_to_string(repo_root().join("policies/default.toml"))
        .expect("read policies/default.toml");
    let mut out = String::new();
    let mut skipping = false;
    let mut replaced = false;
    for line in original.lines() {
        let t = line.trim();
        if t.starts_with('[') {
            skipping = t == "[interpreter]";
            if skipping {
                replaced = true;
                out.push_str(&format!(
                    "[interpreter]\nvenv = {:?}\n\n",
                    venv.display().to_string()
                ));
                continue;
            }
        }
        if skipping {
            continue;
        }
        if t.starts_with("name =") {
            out.push_str(&format!("name = {name:?}\n"));
            continue;
        }
        out.push_str(line);
        out.push('\n');
    }
    assert!(replaced, "policies/default.toml has no [interpreter] table");
    out
}

const NUMPY: &str = r#"
import json, os, threading
import numpy as np

rng = np.random.default_rng(12345)
a = rng.standard_normal((512, 512))
b = rng.standard_normal((512, 512))
c = a @ b
# One entry computed by hand, independent of BLAS.
i, j = 17, 301
by_hand = sum(float(a[i, k]) * float(b[k, j]) for k in range(512))
matmul_ok = abs(float(c[i, j]) - by_hand) < 1e-8 * max(1.0, abs(by_hand))

u, s, vt = np.linalg.svd(a)
svd_ok = bool(np.allclose((u * s) @ vt, a, atol=1e-8)) and bool(np.all(s[:-1] >= s[1:]))

# numpy releases the GIL in matmul: run four products on Python threads too.
results = [None] * 4
def work(n):
    results[n] = float(np.trace((a + n) @ b))
threads = [threading.Thread(target=work, args=(n,)) for n in range(4)]
for t in threads:
    t.start()
for t in threads:
    t.join()
threads_ok = all(
    abs(results[n] - float(np.trace((a + n) @ b))) < 1e-6 * max(1.0, abs(results[n]))
    for n in range(4)
)

print(json.dumps({
    "numpy": np.__version__,
    "numpy_file": np.__file__,
    "matmul_ok": bool(matmul_ok),
    "svd_ok": svd_ok,
    "threads_ok": bool(threads_ok),
    "os_threads": len(os.listdir("/proc/self/task")),
}))
"#;

#[test]
fn numpy_in_a_uv_venv_runs_multithreaded() {
    let venv = numpy_venv();
    let dir = tempfile::tempdir().expect("tempdir");
    let policy = dir.path().join("numpy-test.toml");
    fs::write(&policy, venv_policy(&venv, "numpy-test")).expect("write policy");
    let script = Script::new("np_check.py", NUMPY);
    let out = Pycell::new(run_args(
        &script.path,
        &["--policy", policy.to_str().expect("utf-8 path")],
        &[],
    ))
    .guard(Duration::from_secs(180))
    .run();
    let r = out.result();
    assert_eq!(r["status"], "ok", "{}", out.describe());
    let v: Value = serde_json::from_str(r["stdout"].as_str().unwrap_or_default().trim())
        .unwrap_or_else(|e| panic!("script output is not JSON ({e})\n{}", out.describe()));
    assert!(
        v["numpy_file"]
            .as_str()
            .is_some_and(|f| f.starts_with("/venv/lib/")),
        "numpy was not imported from the venv (mounted at /venv) made from {}: {v}",
        venv.display()
    );
    for k in ["matmul_ok", "svd_ok", "threads_ok"] {
        assert_eq!(v[k], true, "{k} failed: {v}");
    }
}
