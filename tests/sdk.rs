//! Tests that drive a script of the MCP Python SDK (tests/mcp/*.py): the
//! script prints one JSON report, and [`Checks`] collects every failed
//! assertion on it so that one run shows them all.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::Value;

use crate::{compact, output_guarded, pycell_bin, repo_root, require_root};

/// The tools `pycell mcp` lists, in order.
pub const TOOLS: [&str; 10] = [
    "run_python",
    "sandbox_info",
    "session_start",
    "write_file",
    "read_file",
    "list_files",
    "session_end",
    "session_fork",
    "session_snapshot",
    "session_list",
];

pub fn tools_python() -> PathBuf {
    let p = std::env::var_os("PYCELL_TEST_TOOLS_PYTHON")
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| {
        panic!(
            "PYCELL_TEST_TOOLS_PYTHON is not set: it names the python of the tools venv that has the MCP SDK (.cache/tools/bin/python); run the tests with scripts/test, which installs it and sets this"
        )
    });
    let p = PathBuf::from(p);
    assert!(
        p.exists(),
        "PYCELL_TEST_TOOLS_PYTHON={} does not exist: run scripts/setup (or scripts/test)",
        p.display()
    );
    p
}

/// Run the SDK script `tests/mcp/NAME` (within `guard`); its stdout is
/// one JSON report.
pub fn sdk_report(name: &str, guard: Duration) -> Value {
    sdk_report_with(name, &[], guard)
}

/// [`sdk_report`], with `args` after `--pycell PATH`.
pub fn sdk_report_with(name: &str, args: &[&str], guard: Duration) -> Value {
    sdk_report_in(name, args, &[], guard)
}

/// [`sdk_report_with`], the script (and what it starts) with `env` added
/// to ours.
pub fn sdk_report_in(name: &str, args: &[&str], env: &[(&str, &str)], guard: Duration) -> Value {
    require_root();
    let python = tools_python();
    let script = repo_root().join("tests/mcp").join(name);
    let child = Command::new(&python)
        .envs(env.iter().copied())
        .arg(&script)
        .arg("--pycell")
        .arg(pycell_bin())
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("starting {} {}: {e}", python.display(), script.display()));
    let g = output_guarded(child, guard);
    let (status, stdout, stderr) = (g.status, g.stdout, g.stderr);
    let tail = |s: &str| s[s.len().saturating_sub(6000)..].to_string();
    let Some(status) = status else {
        panic!(
            "the SDK client did not finish within {guard:?}\nstderr:\n{}",
            tail(&stderr)
        );
    };
    serde_json::from_str(stdout.trim()).unwrap_or_else(|e| {
        panic!(
            "the SDK client ({status}) did not print one JSON report ({e})\nstdout:\n{}\nstderr:\n{}",
            tail(&stdout),
            tail(&stderr)
        )
    })
}

/// Collects failed checks so that one run reports all of them.
#[derive(Debug)]
pub struct Checks<'a> {
    report: &'a Value,
    pub failures: Vec<String>,
}

impl<'a> Checks<'a> {
    pub fn new(report: &'a Value) -> Checks<'a> {
        Checks {
            report,
            failures: Vec::new(),
        }
    }

    /// The report's entry for a step; a step that raised is one failure.
    pub fn step(&mut self, name: &str) -> Option<&'a Value> {
        let v = self.report.get(name);
        match v {
            None => {
                self.failures
                    .push(format!("{name}: step missing from the report"));
                None
            }
            Some(v) if v.get("exception").is_some() => {
                self.failures.push(format!(
                    "{name}: raised {}\n{}",
                    v["exception"],
                    v["traceback"].as_str().unwrap_or_default()
                ));
                None
            }
            Some(v) => Some(v),
        }
    }

    pub fn check(&mut self, ok: bool, what: impl FnOnce() -> String) {
        if !ok {
            self.failures.push(what());
        }
    }

    pub fn eq(&mut self, step: &str, v: &Value, pointer: &str, want: Value) {
        let got = v.pointer(pointer).cloned().unwrap_or(Value::Null);
        self.check(got == want, || {
            format!(
                "{step}{pointer}: expected {want}, got {got}\n  in {}",
                compact(v, 3000)
            )
        });
    }

    pub fn contains(&mut self, step: &str, v: &Value, pointer: &str, needle: &str) {
        let got = v.pointer(pointer).and_then(Value::as_str).unwrap_or("");
        self.check(got.contains(needle), || {
            let shown: String = got.chars().take(600).collect();
            format!(
                "{step}{pointer}: expected a string containing {needle:?}, got {shown:?}\n  in {}",
                compact(v, 3000)
            )
        });
    }

    /// A run_python result: not a tool error, valid against the outputSchema.
    pub fn run_result(&mut self, step: &str, v: &Value, status: &str) {
        self.eq(step, v, "/is_error", Value::Bool(false));
        self.eq(step, v, "/schema_errors", Value::Array(vec![]));
        self.eq(step, v, "/structured/status", status.into());
        self.contains(step, v, "/text", &format!("status: {status}"));
    }

    /// A bad-arguments call: a tool error whose text says what to fix.
    pub fn tool_error(&mut self, step: &str, v: &Value, needles: &[&str]) {
        self.eq(step, v, "/is_error", Value::Bool(true));
        for n in needles {
            self.contains(step, v, "/text", n);
        }
    }

    pub fn finish(self) {
        assert!(
            self.failures.is_empty(),
            "{} check(s) failed:\n\n{}",
            self.failures.len(),
            self.failures.join("\n\n")
        );
    }
}

pub fn num(v: &Value, pointer: &str) -> f64 {
    v.pointer(pointer)
        .and_then(Value::as_f64)
        .unwrap_or(f64::NAN)
}
