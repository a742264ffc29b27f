//! `pycell mcp` under the MCP Inspector's CLI mode (npm
//! `@modelcontextprotocol/inspector`, pinned below; `npx` fetches it from the
//! npm registry on first use): a second, independent client (the TypeScript
//! SDK) lists the tools with its strict schema-portability check and calls
//! run_python, validating the result against the outputSchema with ajv.
//!
//! Needs root (a real sandbox runs) and Node.js with npx on PATH.

#![forbid(unsafe_code)]

use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::Duration;

use pycell_tests::{output_guarded, pycell_bin, require_root};
use serde_json::Value;

const INSPECTOR: &str = "@modelcontextprotocol/inspector@2.12.0";
/// The first run downloads the inspector (~40 s here).
const GUARD: Duration = Duration::from_secs(600);

struct Output {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

/// One npx at a time: two first runs would install the same package into
/// npx's cache concurrently.
static NPX: Mutex<()> = Mutex::new(());

/// `npx --yes INSPECTOR --cli <pycell> mcp ARGS...`, bounded by GUARD.
fn inspector(args: &[&str]) -> Output {
    require_root();
    let _one_at_a_time = NPX.lock().unwrap_or_else(|p| p.into_inner());
    let pycell = pycell_bin();
    let child = Command::new("npx")
        .arg("--yes")
        .arg(INSPECTOR)
        .arg("--cli")
        .arg(&pycell)
        .arg("mcp")
        .args(args)
        .env("npm_config_update_notifier", "false")
        .env("npm_config_fund", "false")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| {
            panic!(
                "cannot run npx ({e}): this test needs Node.js (>= 20) with npm/npx on PATH to fetch {INSPECTOR} from the npm registry"
            )
        });
    let g = output_guarded(child, GUARD);
    let status = g.status;
    let o = Output {
        code: status.and_then(|s| s.code()),
        stdout: g.stdout,
        stderr: g.stderr,
    };
    assert!(
        status.is_some(),
        "the inspector did not finish within {GUARD:?}\n{}",
        o.describe()
    );
    o
}

impl Output {
    /// stderr without npm's own chatter (engine warnings and the like).
    fn stderr_lines(&self) -> Vec<&str> {
        self.stderr
            .lines()
            .filter(|l| !l.starts_with("npm warn") && !l.trim().is_empty())
            .collect()
    }

    fn describe(&self) -> String {
        let tail = |s: &str| s[s.len().saturating_sub(4000)..].to_string();
        format!(
            "exit code {:?}\nstdout:\n{}\nstderr:\n{}",
            self.code,
            tail(&self.stdout),
            tail(&self.stderr)
        )
    }

    fn json(&self) -> Value {
        assert_eq!(
            self.code,
            Some(0),
            "the inspector failed\n{}",
            self.describe()
        );
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("no JSON on stdout ({e})\n{}", self.describe()))
    }
}

#[test]
fn inspector_lists_portable_tool_schemas() {
    let o = inspector(&["--method", "tools/list", "--strict"]);
    let v = o.json();
    let names: Vec<&str> = v["tools"]
        .as_array()
        .map(|a| a.iter().filter_map(|t| t["name"].as_str()).collect())
        .unwrap_or_default();
    assert_eq!(names, pycell_tests::sdk::TOOLS, "{}", o.describe());
    for t in v["tools"].as_array().into_iter().flatten() {
        assert_eq!(t["inputSchema"]["type"], "object", "{t}");
        assert_eq!(t["outputSchema"]["type"], "object", "{t}");
    }
    // --strict prints each portability problem ("Warning: tool ...") and a
    // summary; a portable tool list has neither.
    let all = format!("{}\n{}", o.stdout, o.stderr);
    assert!(
        !all.contains("Warning: tool") && !all.contains("Schema portability"),
        "the inspector found schema portability problems\n{}",
        o.describe()
    );
}

#[test]
fn inspector_runs_python_and_validates_the_result() {
    let o = inspector(&[
        "--method",
        "tools/call",
        "--tool-name",
        "run_python",
        "--tool-arg",
        "code=print(6 * 7)",
    ]);
    let v = o.json();
    assert_eq!(v["isError"], false, "{}", o.describe());
    assert_eq!(v["structuredContent"]["status"], "ok", "{}", o.describe());
    assert_eq!(v["structuredContent"]["stdout"], "42\n", "{}", o.describe());
    // The inspector validates structuredContent against the outputSchema
    // (ajv) and complains on stderr about anything it cannot use.
    let noise = o.stderr_lines();
    assert!(
        noise.is_empty(),
        "the inspector complained: {noise:#?}\n{}",
        o.describe()
    );
}
