//! Code mode with `pycell run --tool-servers FILE`: sandboxed code calls
//! the tools of MCP servers its client started (a server written with the
//! official MCP Python SDK, tests/mcp/tool_upstream.py, and the published
//! `mcp-server-time` from PyPI, both in the tools venv), through the
//! channel handed into the jail. What is checked: listings, calls, the
//! generated wrappers' signatures and docstrings, both allowlists (the
//! client's allowTools and the policy's [tools] allow), schema errors,
//! an upstream that fails, crashes (restarted for the next call) or hangs
//! (call_timeout), the per-run call limit, concurrent calls from threads
//! and asyncio, `tool_calls` in the result, upstream processes gone when
//! pycell exits (SIGKILLed too), and the same through pycelld, audited, with a second
//! uid's run unable to reach the first uid's tools.
//!
//! Needs root (real jails), and PYCELL_TEST_TOOLS_PYTHON (scripts/test).

#![forbid(unsafe_code)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use pycell_tests::daemon::Daemon;
use pycell_tests::sdk::{sdk_report_with, tools_python, Checks};
use pycell_tests::{pycell_bin, repo_root, run_code, status_of, Outcome};
use serde_json::Value;

/// A tool servers file in a temp dir, its servers' start marker, and a
/// marker the forbidden tool would write.
struct Servers {
    dir: tempfile::TempDir,
    file: PathBuf,
}

impl Servers {
    fn new() -> Servers {
        let dir = pycell_tests::open_tempdir("pycell-tools-");
        let python = tools_python();
        let time = python.with_file_name("mcp-server-time");
        let upstream = repo_root().join("tests/mcp/tool_upstream.py");
        let config = serde_json::json!({"mcpServers": {
            "test": {
                "command": python,
                // A restart is slower than the 1 s call_timeout of
                // the_policy_decides_first_and_bounds_every_call: it must
                // not count against the call that waits for it.
                "args": [upstream, "--marker", dir.path().join("starts"), "--restart-delay", "1.5"],
                "env": {"UPSTREAM_SECRET": "s3cret", "FORBIDDEN_MARKER": dir.path().join("forbidden")},
                "allowTools": ["add", "echo", "fail", "hang", "crash", "flood", "whoami", "picture"],
            },
            "time": {"command": time, "args": ["--local-timezone", "UTC"]},
        }});
        let file = dir.path().join("servers.json");
        std::fs::write(&file, config.to_string()).unwrap();
        Servers { dir, file }
    }

    fn opts(&self) -> Vec<String> {
        vec![
            "--tool-servers".into(),
            self.file.to_string_lossy().into_owned(),
        ]
    }

    /// The pids of every start of the test server so far.
    fn started(&self) -> Vec<i32> {
        std::fs::read_to_string(self.dir.path().join("starts"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect()
    }

    fn forbidden_called(&self) -> bool {
        self.dir.path().join("forbidden").exists()
    }

    /// A policy file: the default policy with `[tools]` replaced.
    fn policy(&self, tools: &str) -> PathBuf {
        let default = std::fs::read_to_string(repo_root().join("policies/default.toml")).unwrap();
        let cut = default.find("[tools]").expect("default.toml has [tools]");
        let rest = &default[cut + 7..];
        let after = rest.find("\n[").map(|i| &rest[i..]).unwrap_or("");
        let text = format!(
            "{}[tools]\n{tools}\n{after}",
            &default[..cut].replace("name = \"default\"", "name = \"tools-test\"")
        );
        let path = self.dir.path().join("tools-test.toml");
        std::fs::write(&path, text).unwrap();
        path
    }
}

fn run(servers: &Servers, code: &str, more: &[&str]) -> Outcome {
    let mut opts: Vec<String> = servers.opts();
    opts.extend(more.iter().map(|s| s.to_string()));
    let opts: Vec<&str> = opts.iter().map(String::as_str).collect();
    run_code("main.py", code, &opts, &[])
}

fn stdout_json(out: &Outcome) -> Value {
    let r = out.result();
    assert_eq!(status_of(out), "ok", "{}", out.describe());
    let text = r["stdout"].as_str().unwrap();
    serde_json::from_str(text.lines().last().unwrap_or(""))
        .unwrap_or_else(|e| panic!("{e}: {text}\n{}", out.describe()))
}

/// Every pid gone within a few seconds.
fn assert_gone(pids: &[i32]) {
    let deadline = Instant::now() + Duration::from_secs(10);
    for pid in pids {
        while Path::new(&format!("/proc/{pid}")).exists() {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            if stat.contains(") Z ") {
                break;
            }
            assert!(Instant::now() < deadline, "upstream {pid} outlived pycell");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

const CALLS: &str = r#"
import asyncio, inspect, json, os, threading
import pycell_tools as t
out = {}
out["servers"] = t.list_servers()
out["add"] = t.test.add(a=2, b=3)
out["call"] = t.call("test", "echo", {"text": "ab", "times": 2})
out["time"] = t.time.get_current_time(timezone="Europe/Paris")["timezone"]
out["signature"] = str(inspect.signature(t.test.echo))
out["doc"] = t.test.echo.__doc__
out["who"] = json.loads(t.test.whoami())
out["my_uid"] = os.getuid()
out["env_secret"] = os.environ.get("UPSTREAM_SECRET")
def error(f, *a, **k):
    try:
        f(*a, **k)
    except t.ToolError as e:
        return [e.code, str(e)]
out["failed"] = error(t.test.fail, message="boom")
out["schema"] = error(t.test.add, a="x", b=1)
out["unknown"] = error(t.call, "test", "nope")
out["no_server"] = error(t.call, "nope", "x")
out["denied"] = error(t.call, "test", "forbidden_delete", {"path": "/etc"})
out["listed_forbidden"] = hasattr(t.test, "forbidden_delete")
results = [None] * 8
def worker(i):
    results[i] = t.test.add(a=i, b=i)
threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
[th.start() for th in threads]
[th.join() for th in threads]
out["threads"] = results
async def many():
    return await asyncio.gather(*[t.aio.test.add(a=i, b=1) for i in range(20)])
out["asyncio"] = asyncio.run(many())
out["picture"] = t.test.picture()["images"][0]["mime_type"]
out["fds"] = sorted(os.listdir("/proc/self/fd"))
print(json.dumps(out))
"#;

#[test]
fn code_calls_tools_of_its_clients_servers_and_nothing_else() {
    let servers = Servers::new();
    let out = run(&servers, CALLS, &[]);
    let o = stdout_json(&out);
    let names: Vec<&str> = o["servers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["test", "time"], "{o}");
    assert_eq!(o["add"]["result"], 5, "{o}");
    assert_eq!(o["call"]["result"], "abab", "{o}");
    assert_eq!(o["time"], "Europe/Paris", "{o}");
    assert_eq!(o["signature"], "(*, text: str, times: int = None)", "{o}");
    assert!(
        o["doc"].as_str().unwrap().starts_with("Repeat some text."),
        "{o}"
    );
    // The server runs outside, as the client (root here), with the
    // client's environment; the code has neither.
    assert_eq!(o["who"]["uid"], 0, "{o}");
    assert_eq!(o["who"]["secret"], "s3cret", "{o}");
    assert_ne!(o["my_uid"], 0, "{o}");
    assert_eq!(o["env_secret"], Value::Null, "{o}");
    assert_eq!(o["failed"][0], "tool_failed", "{o}");
    assert!(o["failed"][1].as_str().unwrap().contains("boom"), "{o}");
    assert_eq!(o["schema"][0], "bad_arguments", "{o}");
    assert!(
        o["schema"][1]
            .as_str()
            .unwrap()
            .contains("\"x\" is not of type \"integer\""),
        "{o}"
    );
    assert_eq!(o["unknown"][0], "unknown", "{o}");
    assert_eq!(o["no_server"][0], "unknown", "{o}");
    assert_eq!(o["denied"][0], "denied", "{o}");
    assert!(
        o["denied"][1].as_str().unwrap().contains("allowTools"),
        "{o}"
    );
    assert_eq!(o["listed_forbidden"], false, "{o}");
    assert!(!servers.forbidden_called(), "the forbidden tool ran");
    let sums: Vec<i64> = o["threads"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["result"].as_i64().unwrap())
        .collect();
    assert_eq!(sums, (0..8).map(|i| 2 * i).collect::<Vec<_>>());
    assert_eq!(o["asyncio"].as_array().unwrap().len(), 20, "{o}");
    assert_eq!(o["picture"], "image/png", "{o}");
    // The program's descriptors: 0-2, its tool channel, listdir's own.
    assert_eq!(o["fds"].as_array().unwrap().len(), 5, "{o}");
    let calls = &out.result()["tool_calls"];
    assert_eq!(calls["calls"], 4 + 5 + 8 + 20 + 1, "{calls}");
    assert_eq!(calls["failed"], 5, "{calls}");
    assert_eq!(calls["failures"]["denied"], 1, "{calls}");
    assert_eq!(calls["failures"]["unknown"], 2, "{calls}");
    assert_tool_refusals(&out.result(), 1, 2);
    // Every server this pycell started is gone with it.
    assert_eq!(servers.started().len(), 1);
    assert_gone(&servers.started());
}

/// The result's `tools` refusals: `denied` calls refused by the allow
/// list, `unknown` ones by the catalog, each with its rule.
fn assert_tool_refusals(result: &Value, denied: u64, unknown: u64) {
    let count = |reason: &str, rule: &str| -> u64 {
        let list = result["refusals"].as_array().expect("refusals");
        list.iter()
            .filter(|r| r["layer"] == "tools")
            .filter(|r| {
                r["object"]
                    .as_str()
                    .unwrap()
                    .ends_with(&format!("({reason})"))
            })
            .inspect(|r| assert!(r["rule"].as_str().unwrap().starts_with(rule), "{r}"))
            .map(|r| r["count"].as_u64().unwrap())
            .sum()
    };
    assert_eq!(count("denied", "tools.allow"), denied, "{result}");
    assert_eq!(
        count("unknown", "the run's tool catalog"),
        unknown,
        "{result}"
    );
}

/// Python calling tools: `error(f, ...)` is `["ok", value]` or
/// `[code, message]` of the ToolError it raised.
const CATCHING: &str = r#"import pycell_tools as t
def error(f, *a, **k):
    try:
        return ["ok", f(*a, **k)]
    except t.ToolError as e:
        return [e.code, str(e)]
"#;

#[test]
fn a_result_too_large_for_its_policy_is_refused_unread_and_the_server_goes_on() {
    let servers = Servers::new();
    let policy = servers.policy("allow = [\"test/*\"]\nmax_result = \"1MiB\"");
    let code = format!(
        "import json\n{CATCHING}print(json.dumps({{\"flood\": error(t.test.flood, size=14_000_000), \"after\": error(t.test.add, a=2, b=3)}}))\n"
    );
    let out = run(&servers, &code, &["--policy", policy.to_str().unwrap()]);
    let o = stdout_json(&out);
    // 14 MB is more than a 1 MiB result can be: never parsed (it grew the
    // client by 820 MiB when it was), a limit failure of that call only.
    assert_eq!(o["flood"][0], "limit", "{o}");
    let m = o["flood"][1].as_str().unwrap();
    assert!(
        m.contains("max_result") && m.contains("it was not read"),
        "{o}"
    );
    assert_eq!(o["after"], serde_json::json!(["ok", {"result": 5}]), "{o}");
    assert_eq!(servers.started().len(), 1, "{:?}", servers.started());
    assert_gone(&servers.started());
}

#[test]
fn the_policy_decides_first_and_bounds_every_call() {
    let servers = Servers::new();
    let policy = servers.policy(
        "allow = [\"test/*\"]\nmax_calls = 5\nmax_concurrent = 2\ncall_timeout = \"1s\"\nmax_result = \"1KiB\"",
    );
    let code = CATCHING.to_string()
        + r#"
import json, time
out = {}
out["time_listed"] = [s["tools"] for s in t.list_servers() if s["name"] == "time"]
out["time"] = error(t.call, "time", "get_current_time", {"timezone": "UTC"})
start = time.monotonic()
out["hang"] = error(t.test.hang, seconds=20)
out["hang_s"] = time.monotonic() - start
out["flood"] = error(t.test.flood, size=5000)
out["crash"] = error(t.test.crash)
out["after_crash"] = error(t.test.add, a=1, b=1)
out["fifth"] = error(t.test.add, a=1, b=1)
out["over"] = error(t.test.add, a=1, b=1)
print(json.dumps(out))
"#;
    let out = run(&servers, &code, &["--policy", policy.to_str().unwrap()]);
    let o = stdout_json(&out);
    assert_eq!(o["time_listed"], serde_json::json!([[]]), "{o}");
    assert_eq!(o["time"][0], "denied", "{o}");
    assert!(
        o["time"][1].as_str().unwrap().contains("[tools] allow"),
        "{o}"
    );
    assert_eq!(o["hang"][0], "upstream_failed", "{o}");
    assert!(
        o["hang"][1].as_str().unwrap().contains("call_timeout"),
        "{o}"
    );
    assert!(o["hang_s"].as_f64().unwrap() < 10.0, "{o}");
    assert_eq!(o["flood"][0], "limit", "{o}");
    assert!(
        o["flood"][1].as_str().unwrap().contains("max_result"),
        "{o}"
    );
    assert_eq!(o["crash"][0], "upstream_failed", "{o}");
    assert_eq!(
        o["after_crash"],
        serde_json::json!(["ok", {"result": 2}]),
        "{o}"
    );
    assert_eq!(o["fifth"][0], "ok", "{o}");
    assert_eq!(o["over"][0], "limit", "{o}");
    assert!(o["over"][1].as_str().unwrap().contains("max_calls"), "{o}");
    // Restarted after its crash; both gone now.
    assert_eq!(servers.started().len(), 2, "{:?}", servers.started());
    assert_gone(&servers.started());
    // allow = [] forbids every call, with a reason.
    let none = servers.policy("allow = []");
    let out = run(
        &servers,
        "import pycell_tools as t\ntry:\n    t.call('test', 'add', {'a': 1, 'b': 2})\nexcept t.ToolError as e:\n    print(e.code, e)\n",
        &["--policy", none.to_str().unwrap()],
    );
    let r = out.result();
    assert_eq!(status_of(&out), "ok", "{}", out.describe());
    assert!(
        r["stdout"]
            .as_str()
            .unwrap()
            .starts_with("denied the policy allows no tool calls"),
        "{r}"
    );
}

#[test]
fn a_run_with_calls_in_flight_ends_on_time_and_without_tools_there_is_no_module() {
    let servers = Servers::new();
    let code = "import threading, pycell_tools as t\nfor _ in range(3):\n    threading.Thread(target=t.test.hang, kwargs={'seconds': 60}, daemon=True).start()\nimport time; time.sleep(0.5)\nprint('leaving')\n";
    let start = Instant::now();
    let out = run(&servers, code, &[]);
    assert_eq!(status_of(&out), "ok", "{}", out.describe());
    assert!(
        start.elapsed() < Duration::from_secs(20),
        "{:?}",
        start.elapsed()
    );
    assert_eq!(out.result()["stdout"], "leaving\n");
    assert_gone(&servers.started());
    // No --tool-servers: no channel, no module.
    let out = run_code("main.py", "import pycell_tools\n", &[], &[]);
    assert!(
        out.result()["stderr"]
            .as_str()
            .unwrap()
            .contains("No module named 'pycell_tools'"),
        "{}",
        out.describe()
    );
}

#[test]
fn through_pycelld_calls_go_to_the_runs_own_client_and_are_audited() {
    let d = Daemon::start("socket_mode = \"0666\"\n");
    let servers = Servers::new();
    let code = "import pycell_tools as t\nprint(t.test.add(a=20, b=22)['result'])\nprint(t.time.get_current_time(timezone='UTC')['timezone'])\n";
    let mut opts = servers.opts();
    opts.extend([
        "--socket".to_string(),
        d.socket().to_string_lossy().into_owned(),
    ]);
    let opts: Vec<&str> = opts.iter().map(String::as_str).collect();
    let out = run_code("main.py", code, &opts, &[]);
    assert_eq!(status_of(&out), "ok", "{}\n{}", out.describe(), d.log());
    assert_eq!(out.result()["stdout"], "42\nUTC\n");
    assert_eq!(out.result()["tool_calls"]["calls"], 2);
    let audited = d.audit_events("tool_call", 2);
    assert_eq!(audited[0]["server"], "test");
    assert_eq!(audited[0]["tool"], "add");
    assert_eq!(audited[0]["status"], "ok");
    assert_eq!(audited[0]["arguments_sha256"].as_str().unwrap().len(), 64);
    assert_gone(&servers.started());
    // Another uid (in the pycell group), no servers of its own: its code
    // has no tools, whatever the first client offers.
    let client = d.dir.path().join("pycell");
    std::fs::copy(pycell_bin(), &client).unwrap();
    let pycell_gid = pycell_tests::pycell_gid();
    let script = d.dir.path().join("other.py");
    std::fs::write(&script, "import pycell_tools\n").unwrap();
    let other = Command::new("setpriv")
        .args(["--reuid=4244", "--regid=4244"])
        .arg(format!("--groups={}", pycell_gid.as_raw()))
        .arg(&client)
        .args(["run", "--json", "--socket"])
        .arg(d.socket())
        .arg(&script)
        .output()
        .unwrap();
    let r: Value = serde_json::from_slice(&other.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&other.stderr)));
    assert_eq!(r["status"], "error", "{r}");
    assert!(
        r["stderr"]
            .as_str()
            .unwrap()
            .contains("No module named 'pycell_tools'"),
        "{r}"
    );
    assert_eq!(d.audit_events("tool_call", 2).len(), 2, "{}", d.audit());
}

/// `pycell mcp --tool-servers` driven by the MCP Python SDK
/// (tests/mcp/sdk_tools.py), embedded or through `socket`.
fn check_mcp_code_mode(socket: Option<&Path>) {
    let servers = Servers::new();
    let file = servers.file.to_string_lossy().into_owned();
    let marker = servers.dir.path().join("starts");
    let marker = marker.to_string_lossy().into_owned();
    let mut args = vec!["--servers", &file, "--marker", &marker];
    let socket = socket.map(|s| s.to_string_lossy().into_owned());
    if let Some(s) = &socket {
        args.extend(["--socket", s]);
    }
    let report = sdk_report_with("sdk_tools.py", &args, Duration::from_secs(300));
    let mut c = Checks::new(&report);
    if let Some(f) = c.step("flow") {
        let desc = f["description"].as_str().unwrap_or("");
        c.check(desc.contains("import pycell_tools"), || {
            format!("description: {desc}")
        });
        c.check(
            desc.contains("pycell_tools.test.add(*, a: int, b: int)  # Add two integers."),
            || format!("description lists no signature: {desc}"),
        );
        c.check(!desc.contains("forbidden_delete"), || {
            format!("a denied tool is described: {desc}")
        });
        let callable = &f["info"]["structured"]["tools"]["callable"];
        c.check(
            callable.as_array().is_some_and(|a| {
                a.iter().any(|s| {
                    s.as_str()
                        .unwrap_or("")
                        .starts_with("pycell_tools.time.get_current_time(*, timezone: str)")
                })
            }),
            || format!("sandbox_info: {callable}"),
        );
        c.run_result("run", &f["run"], "ok");
        let printed: Value = serde_json::from_str(
            f["run"]["structured"]["stdout"]
                .as_str()
                .unwrap_or("")
                .trim(),
        )
        .unwrap_or(Value::Null);
        c.check(
            printed == serde_json::json!({"servers": ["test", "time"], "add": 42, "tz": "Asia/Tokyo", "schema": "bad_arguments"}),
            || format!("run printed {printed}"),
        );
        c.eq("run", &f["run"], "/structured/tool_calls/calls", 3.into());
        c.eq("cell1", &f["cell1"], "/structured/cell/value", "3".into());
        c.eq("cell2", &f["cell2"], "/structured/cell/value", "13".into());
        c.eq(
            "cell3",
            &f["cell3"],
            "/structured/cell/value",
            "['0', '1', '2', '3', '4']".into(),
        );
    }
    c.eq(
        "upstreams",
        &report["upstreams"],
        "/alive",
        serde_json::json!([]),
    );
    c.check(
        report["upstreams"]["started"]
            .as_array()
            .is_some_and(|a| a.len() == 1),
        || format!("one start of the test upstream: {}", report["upstreams"]),
    );
    c.finish();
}

#[test]
fn an_mcp_client_calls_tools_from_runs_and_sessions_embedded() {
    check_mcp_code_mode(None);
}

#[test]
fn an_mcp_client_calls_tools_from_runs_and_sessions_through_pycelld() {
    let d = Daemon::start("");
    check_mcp_code_mode(Some(&d.socket()));
}

#[test]
fn a_sigkilled_client_leaves_no_upstream_behind() {
    use std::io::BufRead;
    let servers = Servers::new();
    let script = servers.dir.path().join("wait.py");
    std::fs::write(
        &script,
        "import time, pycell_tools as t\nt.test.add(a=1, b=1)\nprint('ready', flush=True)\ntime.sleep(60)\n",
    )
    .unwrap();
    let mut child = Command::new(pycell_bin())
        .args(["run", "--embedded", "--tool-servers"])
        .arg(&servers.file)
        .arg(&script)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line, "ready\n");
    let started = servers.started();
    assert_eq!(started.len(), 1, "{started:?}");
    child.kill().unwrap();
    child.wait().unwrap();
    assert_gone(&started);
}

/// A server that cannot start is unavailable to the code, which is told
/// why, but not the host path of its command (the client's business,
/// said on pycell's stderr).
#[test]
fn a_server_that_cannot_start_shows_the_code_no_host_path() {
    let dir = pycell_tests::open_tempdir("pycell-tools-");
    let command = dir.path().join("secret-place/no-such-server");
    let config = serde_json::json!({"mcpServers": {"gone": {"command": command}}});
    let file = dir.path().join("servers.json");
    std::fs::write(&file, config.to_string()).unwrap();
    let code = "import pycell_tools as t\ntry:\n    t.call('gone', 'anything', {})\nexcept t.ToolError as e:\n    print(e.code, e)\n";
    let out = run_code(
        "main.py",
        code,
        &["--tool-servers", file.to_str().unwrap()],
        &[],
    );
    let r = out.result();
    assert_eq!(status_of(&out), "ok", "{}", out.describe());
    let stdout = r["stdout"].as_str().unwrap();
    assert!(stdout.contains("No such file"), "{stdout}");
    assert!(!stdout.contains("secret-place"), "{stdout}");
    assert!(out.stderr.contains("secret-place"), "{}", out.describe());
}
