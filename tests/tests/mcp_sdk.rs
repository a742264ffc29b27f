//! `pycell mcp` driven by the official MCP Python SDK (PyPI `mcp`, pinned in
//! scripts/tools-requirements.txt): tests/mcp/sdk_client.py connects over
//! stdio exactly as an agent's MCP host does, runs real sandboxes, and
//! reports what it saw as one JSON object; the assertions are here.
//!
//! Needs root (embedded mode builds real jails) and the tools venv's python
//! in PYCELL_TEST_TOOLS_PYTHON, which scripts/test exports.

#![forbid(unsafe_code)]

use std::time::Duration;

use pycell_tests::compact;
use pycell_tests::sdk::{num, sdk_report, Checks, TOOLS};
use serde_json::Value;

/// The whole script takes ~10 s here; a hang must fail, not stall CI.
const GUARD: Duration = Duration::from_secs(420);

#[test]
fn the_official_python_sdk_drives_pycell_mcp() {
    let report = sdk_report("sdk_client.py", GUARD);
    let mut c = Checks::new(&report);
    let r = &report;

    // The session as a whole (a failure here explains missing steps below).
    c.step("session");

    // Handshake: the newest protocol version that has `initialize`, and the
    // 2026-07-28 discover path the SDK's Client probes first.
    if let Some(v) = r.get("initialize") {
        c.eq("initialize", v, "/protocol_version", "2025-11-25".into());
        c.eq("initialize", v, "/server_name", "pycell".into());
        c.eq("initialize", v, "/tools_capability", Value::Bool(true));
        c.contains("initialize", v, "/instructions", "run_python");
    } else {
        c.failures.push("initialize: no handshake happened".into());
    }
    if let Some(v) = c.step("modern") {
        c.eq("modern", v, "/protocol_version", "2026-07-28".into());
        c.eq("modern", v, "/status", "ok".into());
        c.eq("modern", v, "/stdout", "1\n".into());
    }

    // A call with dependencies: installed (wheels only) into an env, the
    // install steps sent as progress notes, the env in the result.
    if let Some(v) = c.step("dependencies") {
        c.run_result("dependencies", v, "ok");
        c.eq(
            "dependencies",
            v,
            "/structured/stdout",
            "iniconfig\n".into(),
        );
        c.eq("dependencies", v, "/structured/env/cache", "miss".into());
        c.contains(
            "dependencies",
            v,
            "/structured/env/packages/0/name",
            "iniconfig",
        );
        let notes = v["progress_messages"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        c.check(
            notes.iter().any(|n| {
                n.as_str()
                    .is_some_and(|n| n.starts_with("installing dependencies: "))
            }),
            || format!("dependencies: no progress note of the install: {notes:?}"),
        );
    }

    // Tools and their schemas.
    if let Some(v) = c.step("tools") {
        c.eq("tools", v, "/names", serde_json::json!(TOOLS));
        for tool in TOOLS {
            for key in ["input_schema_problems", "output_schema_problems"] {
                c.eq(
                    "tools",
                    v,
                    &format!("/tools/{tool}/{key}"),
                    Value::Array(vec![]),
                );
            }
            c.contains("tools", v, &format!("/tools/{tool}/description"), "Example");
        }
        for p in ["minimal", "full"] {
            c.eq(
                "tools",
                v,
                &format!("/tools/run_python/accepts/{p}"),
                Value::Bool(true),
            );
        }
        for p in ["no_code", "negative_timeout", "unknown_argument"] {
            c.eq(
                "tools",
                v,
                &format!("/tools/run_python/rejects/{p}"),
                Value::Bool(true),
            );
        }
        for d in [
            "Limits when no policy is given (policy default)",
            "512 MiB of memory",
            "timeout_s",
        ] {
            c.contains("tools", v, "/tools/run_python/description", d);
        }
    }

    // Real runs.
    if let Some(v) = c.step("print1") {
        c.run_result("print1", v, "ok");
        c.eq("print1", v, "/structured/stdout", "1\n".into());
        c.eq("print1", v, "/structured/exit_code", 0.into());
        c.eq("print1", v, "/structured/policy", "default".into());
        c.eq(
            "print1",
            v,
            "/structured/layers/no_new_privs",
            Value::Bool(true),
        );
        c.eq(
            "print1",
            v,
            "/structured/layers/capabilities",
            "none".into(),
        );
        c.check(num(v, "/structured/layers/sandbox_uid") >= 1000.0, || {
            format!("print1: no plausible sandbox uid: {}", compact(v, 2000))
        });
        c.eq("print1", v, "/structured/refusals", Value::Array(vec![]));
        c.eq(
            "print1",
            v,
            "/structured/termination/reason",
            "exited".into(),
        );
    }
    if let Some(v) = c.step("stdin") {
        c.run_result("stdin", v, "ok");
        c.eq("stdin", v, "/structured/stdout", "HELLO\n".into());
    }
    if let Some(v) = c.step("exception") {
        c.run_result("exception", v, "error");
        c.eq("exception", v, "/structured/exit_code", 1.into());
        c.contains("exception", v, "/structured/stderr", "ValueError: boom");
    }
    if let Some(v) = c.step("timeout") {
        c.run_result("timeout", v, "timeout");
        c.eq("timeout", v, "/structured/error/code", "timeout".into());
        c.contains("timeout", v, "/structured/error/hint", "timeout_s");
        c.eq(
            "timeout",
            v,
            "/structured/refusals/0/layer",
            "wall_timeout".into(),
        );
        c.eq(
            "timeout",
            v,
            "/structured/refusals/0/rule",
            "limits.wall_timeout".into(),
        );
        c.eq(
            "timeout",
            v,
            "/structured/termination/reason",
            "wall_timeout".into(),
        );
        c.contains(
            "timeout",
            v,
            "/text",
            "refused by wall_timeout: wall-clock time of 1 s",
        );
        c.check(num(v, "/elapsed_s") < 10.0, || {
            format!("timeout: a 1 s timeout took {} s", num(v, "/elapsed_s"))
        });
    }
    if let Some(v) = c.step("oom") {
        c.run_result("oom", v, "oom");
        c.eq("oom", v, "/structured/error/code", "oom".into());
        c.eq(
            "oom",
            v,
            "/structured/limits/memory_bytes",
            (512u64 << 20).into(),
        );
        c.eq("oom", v, "/structured/refusals/0/layer", "memory".into());
        c.eq(
            "oom",
            v,
            "/structured/refusals/0/rule",
            "limits.memory".into(),
        );
        c.contains("oom", v, "/structured/refusals/0/object", "512 MiB");
        c.eq(
            "oom",
            v,
            "/structured/termination/reason",
            "oom_kill".into(),
        );
        c.check(
            num(v, "/structured/termination/memory_bytes") > 256.0 * 1048576.0,
            || format!("oom: the memory at the kill: {}", compact(v, 2000)),
        );
        c.contains(
            "oom",
            v,
            "/text",
            "refused by memory: memory limit of 512 MiB",
        );
    }
    if let Some(v) = c.step("truncation") {
        c.run_result("truncation", v, "ok");
        c.eq(
            "truncation",
            v,
            "/structured/stdout_truncated",
            Value::Bool(true),
        );
        c.eq(
            "truncation",
            v,
            "/structured/refusals/0/layer",
            "output".into(),
        );
        c.eq(
            "truncation",
            v,
            "/structured/stdout_len",
            (1u64 << 20).into(),
        );
        c.contains("truncation", v, "/text_tail", "[stdout truncated");
    }
    // The server keeps a zygote of its policy: runs come forked from it
    // once it is ready (started in the background), jailed all the same.
    if let Some(v) = c.step("zygote") {
        c.run_result("zygote", v, "ok");
        c.eq("zygote", v, "/structured/warm", Value::Bool(true));
        c.eq("zygote", v, "/structured/stdout", "42\n".into());
    }
    if let Some(v) = c.step("sandbox_info") {
        c.eq("sandbox_info", v, "/is_error", Value::Bool(false));
        c.eq("sandbox_info", v, "/schema_errors", Value::Array(vec![]));
        c.eq("sandbox_info", v, "/structured/mode", "embedded".into());
        // Listed by name: the shipped data-science, default, install,
        // mcp-server, network.
        let names: Vec<&str> = v
            .pointer("/structured/policies")
            .and_then(Value::as_array)
            .map(|a| a.iter().filter_map(|p| p["name"].as_str()).collect())
            .unwrap_or_default();
        c.check(
            names.starts_with(&[
                "data-science",
                "default",
                "install",
                "mcp-server",
                "network",
            ]),
            || format!("sandbox_info: policies {names:?}"),
        );
        c.eq(
            "sandbox_info",
            v,
            "/structured/policies/1/network",
            "none".into(),
        );
        c.eq(
            "sandbox_info",
            v,
            "/structured/policies/1/limits/memory_bytes",
            (512u64 << 20).into(),
        );
        let layers: Vec<&str> = v
            .pointer("/structured/layers")
            .and_then(Value::as_array)
            .map(|a| a.iter().filter_map(|l| l["layer"].as_str()).collect())
            .unwrap_or_default();
        for l in ["user_namespaces", "landlock", "seccomp", "cgroups", "root"] {
            c.check(layers.contains(&l), || {
                format!("sandbox_info: layer {l} missing from {layers:?}")
            });
        }
    }

    // Ten calls at once: all succeed, at most 8 sandboxes at a time.
    if let Some(v) = c.step("parallel") {
        c.eq("parallel", v, "/ok", 10.into());
        let t = num(v, "/elapsed_s");
        c.check((2.0..8.0).contains(&t), || {
            format!(
                "parallel: ten 1 s runs took {t} s; expected two rounds of at most 8 (2 s to 8 s): {}",
                compact(v, 2000)
            )
        });
    }

    // Cancellation through the SDK: the sandbox must be gone.
    if let Some(v) = c.step("cancellation") {
        c.eq(
            "cancellation",
            v,
            "/progress_wait_timed_out",
            Value::Bool(false),
        );
        c.eq(
            "cancellation",
            v,
            "/call_outcome",
            "still running when cancelled".into(),
        );
        c.check(num(v, "/uid") >= 1000.0, || {
            format!(
                "cancellation: no progress note named the sandbox uid: {}",
                compact(v, 3000)
            )
        });
        // Proof that the scans can see this sandbox at all.
        c.check(num(v, "/procs_before_cancel") >= 1.0, || {
            format!(
                "cancellation: no host process ran as the sandbox uid before the cancel, so the scan proves nothing: {}",
                compact(v, 3000)
            )
        });
        c.check(
            v["cgroups_before_cancel"]
                .as_array()
                .is_some_and(|a| !a.is_empty()),
            || {
                format!(
                    "cancellation: the run's cgroup was not found before the cancel: {}",
                    compact(v, 3000)
                )
            },
        );
        c.eq("cancellation", v, "/procs_after", Value::Array(vec![]));
        c.eq("cancellation", v, "/cgroups_after", Value::Array(vec![]));
        c.check(num(v, "/cleanup_s") < 10.0, || {
            format!("cancellation: cleanup took {} s", num(v, "/cleanup_s"))
        });
        let notes = v["progress"].as_array().cloned().unwrap_or_default();
        c.check(notes.len() >= 2, || {
            format!("cancellation: expected >= 2 progress notes, got {notes:?}")
        });
        let increasing = notes
            .windows(2)
            .all(|w| w[1]["progress"].as_f64() > w[0]["progress"].as_f64());
        c.check(increasing, || {
            format!("cancellation: progress must increase: {notes:?}")
        });
        c.check(
            notes
                .iter()
                .any(|n| n["message"].as_str().unwrap_or("").contains("9 B stdout")),
            || format!("cancellation: no progress note counted the 9 bytes printed: {notes:?}"),
        );
        c.check(
            notes.iter().any(|n| {
                let m = n["message"].as_str().unwrap_or("");
                m.ends_with("; latest output: \"sleeping\"")
            }),
            || format!("cancellation: no progress note showed the output printed: {notes:?}"),
        );
        if let Some(next) = v.get("next_call") {
            c.run_result("cancellation/next_call", next, "ok");
            c.eq(
                "cancellation/next_call",
                next,
                "/structured/stdout",
                "2\n".into(),
            );
        }
    }

    // Bad arguments: errors that say what to fix.
    if let Some(v) = c.step("bad_arguments") {
        let case = |name: &str| v.get(name).cloned().unwrap_or(Value::Null);
        c.tool_error(
            "bad_arguments/unknown_policy",
            &case("unknown_policy"),
            &[
                "no policy named \"no-such-policy\"",
                "available: data-science, default",
            ],
        );
        c.tool_error(
            "bad_arguments/negative_timeout",
            &case("negative_timeout"),
            &["`timeout_s` must be more than 0", "got -1"],
        );
        c.tool_error(
            "bad_arguments/missing_code",
            &case("missing_code"),
            &["missing required argument `code`", "{\"code\": "],
        );
        c.tool_error(
            "bad_arguments/code_too_large",
            &case("code_too_large"),
            &["`code` is 5242880 bytes", "4 MiB"],
        );
        c.tool_error(
            "bad_arguments/unknown_argument",
            &case("unknown_argument"),
            &["unknown field `timeout`", "timeout_s"],
        );
        let unknown_tool = case("unknown_tool");
        c.eq(
            "bad_arguments/unknown_tool",
            &unknown_tool,
            "/protocol_error/code",
            (-32602).into(),
        );
        c.contains(
            "bad_arguments/unknown_tool",
            &unknown_tool,
            "/protocol_error/message",
            "no tool named \"no_such_tool\"",
        );
    }

    // stdin closed or SIGTERM mid-run: the sandbox is killed and pycell mcp
    // exits 0, fast (MCP clients kill a server that lingers after EOF).
    for how in ["eof", "sigterm"] {
        if let Some(v) = c.step(how) {
            c.check(num(v, "/procs_before_eof") >= 1.0, || {
                format!(
                    "{how}: no process ran as the sandbox uid before the end, so the scan proves nothing: {}",
                    compact(v, 3000)
                )
            });
            c.eq(how, v, "/exit_code", 0.into());
            c.check(num(v, "/exit_s") < 2.0, || {
                format!("{how}: pycell mcp took {} s to exit", num(v, "/exit_s"))
            });
            c.eq(how, v, "/procs_after_exit", Value::Array(vec![]));
            c.eq(how, v, "/cgroups_after_exit", Value::Array(vec![]));
        }
    }
    if let Some(v) = r.get("sigterm") {
        c.eq("sigterm", v, "/result_status", "killed".into());
    }

    c.finish();
}
