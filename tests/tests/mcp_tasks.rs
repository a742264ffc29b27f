//! Calls that outlive the client's patience, driven by the official MCP
//! Python SDK (tests/mcp/sdk_tasks.py reports; the assertions are here):
//! to a client that declares the tasks extension a 90-second session cell
//! becomes a task it polls past its own 30-second timeout, with the cell's
//! newest output in the status; tasks/cancel stops a run and leaves its
//! sandbox uid without a process; a quick run is answered at once; and for
//! a client without tasks a session cell is detached, its progress showing
//! its output, and collected by a later call.
//!
//! Needs root (embedded mode builds real jails) and the tools venv's python
//! in PYCELL_TEST_TOOLS_PYTHON.

#![forbid(unsafe_code)]

use std::time::Duration;

use pycell_tests::sdk::{num, sdk_report, Checks};
use serde_json::{json, Value};

/// The 90-second run and its company, concurrently.
const GUARD: Duration = Duration::from_secs(300);

/// `--hand-off-after` in the script.
const HAND_OFF_AFTER: f64 = 5.0;

fn check_long_cell(c: &mut Checks, v: &Value) {
    let s = "long_cell";
    c.eq(s, v, "/first_kind", "TaskCreated".into());
    c.eq(s, v, "/created/status", "working".into());
    c.check(num(v, "/answered_s") >= HAND_OFF_AFTER, || {
        format!("{s}: the task came before the wait: {v}")
    });
    // timeout_s 150 s plus the 30 minutes a task may spend queued or installing.
    c.eq(s, v, "/created/ttlMs", json!(1_950_000));
    c.check(num(v, "/elapsed_s") > 90.0, || {
        format!("{s}: the cell did not outlive the client's 30 s: {v}")
    });
    c.eq(s, v, "/final_status", "completed".into());
    c.eq(s, v, "/result/status", "ok".into());
    c.eq(s, v, "/result/cell/value", "'finished'".into());
    c.contains(s, v, "/result/stdout_tail", "tick 89\ndone\n");
    c.check(num(v, "/message_count") >= 10.0, || {
        format!("{s}: the status message was not kept up to date: {v}")
    });
    c.contains(s, v, "/messages/0", "cell in session s-");
    c.contains(s, v, "/messages/0", "latest output: \"tick ");
    let last = v["messages"].as_array().and_then(|m| m.last()).cloned();
    let last = last.unwrap_or(Value::Null);
    c.check(last.as_str().is_some_and(|m| m.contains("tick 8")), || {
        format!("{s}: the last status does not show the newest output: {last}")
    });
}

fn check_stopped_run(c: &mut Checks, v: &Value) {
    let s = "stopped_run";
    c.eq(s, v, "/first_kind", "TaskCreated".into());
    c.contains(s, v, "/peeked", "latest output: \"spin 0");
    c.eq(s, v, "/final_status", "cancelled".into());
    c.check(v["uid"].is_u64(), || format!("{s}: no sandbox uid: {v}"));
    c.eq(s, v, "/processes_after", json!([]));
}

fn check_detached(c: &mut Checks, v: &Value) {
    let s = "detached";
    c.run_result(s, &v["slow"], "running");
    c.eq(
        s,
        v,
        "/slow/structured/detached/code_run",
        Value::Bool(true),
    );
    c.contains(s, v, "/slow/text", "still running after 5 s, detached");
    // Progress notifications carry the cell's newest output.
    let notes = v["slow_progress"].as_array().into_iter().flatten();
    let live = notes
        .filter_map(Value::as_str)
        .any(|m| m.contains("cell in session s-") && m.contains("latest output: \"step"));
    c.check(live, || {
        format!(
            "{s}: no progress showed the cell's output: {}",
            v["slow_progress"]
        )
    });
    // Five to ten seconds into a 15-second cell: the new code is not run.
    c.run_result(s, &v["while_running"], "running");
    c.eq(
        s,
        v,
        "/while_running/structured/detached/code_run",
        Value::Bool(false),
    );
    c.contains(s, v, "/while_running/text", "was NOT run");
    c.run_result(s, &v["collected"], "ok");
    c.eq(s, v, "/collected/structured/cell/value", "7".into());
    c.eq(
        s,
        v,
        "/collected/structured/detached/code_run",
        Value::Bool(false),
    );
    c.contains(s, v, "/collected/text", "the cell detached earlier");
    c.check(
        num(v, "/collected/structured/duration_ms") >= 15000.0,
        || format!("{s}: the collected cell did not run its 15 s: {v}"),
    );
    // The session goes on, with what the detached cell left.
    c.run_result(s, &v["after"], "ok");
    c.eq(s, v, "/after/structured/cell/value", "14".into());
    c.eq(s, v, "/after/structured/cell/number", json!(2));
}

#[test]
fn long_calls_become_tasks_or_detached_cells_and_lose_nothing() {
    let report = sdk_report("sdk_tasks.py", GUARD);
    let mut c = Checks::new(&report);
    if let Some(v) = c.step("long_cell") {
        check_long_cell(&mut c, v);
    }
    if let Some(v) = c.step("stopped_run") {
        check_stopped_run(&mut c, v);
    }
    if let Some(v) = c.step("quick_run") {
        c.eq("quick_run", v, "/kind", "CallToolResult".into());
        c.eq("quick_run", v, "/stdout", "42\n".into());
    }
    if let Some(v) = c.step("detached") {
        check_detached(&mut c, v);
    }
    c.finish();
}
