//! Sessions of embedded `pycell mcp`, driven by the official MCP Python SDK
//! (tests/mcp/sdk_sessions.py reports; the assertions are here): state
//! across cells, files in and out, plots as images, timeouts, a session
//! killed by a cell that ignores KeyboardInterrupt, isolation between
//! sessions, limits, bad handles and paths, and nothing left behind after
//! session_end or the end of stdin.
//!
//! Needs root (embedded mode builds real jails), the tools venv's python in
//! PYCELL_TEST_TOOLS_PYTHON, and the package index for the data-science
//! env (installed once into the embedded env store).

#![forbid(unsafe_code)]

use std::time::Duration;

use pycell_tests::daemon::Daemon;
use pycell_tests::sdk::{num, sdk_report, sdk_report_with, Checks};
use serde_json::{json, Value};

/// About 15 s with the data-science env cached, a minute or two without.
const GUARD: Duration = Duration::from_secs(720);

fn nothing_left(c: &mut Checks, step: &str, v: &Value, pointer: &str) {
    c.eq(step, v, &format!("{pointer}/processes"), json!([]));
    c.eq(step, v, &format!("{pointer}/cgroups"), json!([]));
}

fn cell_ok(c: &mut Checks, step: &str, v: &Value, value: Option<&str>) {
    c.run_result(step, v, "ok");
    if let Some(want) = value {
        c.eq(step, v, "/structured/cell/value", want.into());
    }
}

fn check_state_and_errors(c: &mut Checks, b: &Value) {
    let s = "basics";
    c.eq(s, &b["start"], "/is_error", Value::Bool(false));
    c.eq(s, &b["start"], "/schema_errors", json!([]));
    c.check(
        b["handle"]
            .as_str()
            .is_some_and(|h| h.len() == 42 && h.starts_with("s-")),
        || {
            format!(
                "basics: the handle is not s- and 40 hex digits: {}",
                b["handle"]
            )
        },
    );
    c.check(num(b, "/uid") > 0.0, || {
        format!("basics: no sandbox uid: {}", b["uid"])
    });
    cell_ok(c, s, &b["assign"], None);
    c.eq(s, &b["assign"], "/structured/cell/number", json!(1));
    cell_ok(c, s, &b["value"], Some("42"));
    c.contains(s, &b["value"], "/text", "Out[2]: 42");
    cell_ok(c, s, &b["import_used"], None);
    c.eq(
        s,
        &b["import_used"],
        "/structured/stdout",
        "{'x': 41}\n".into(),
    );
    c.run_result(s, &b["raises"], "error");
    c.eq(
        s,
        &b["raises"],
        "/structured/cell/exception/type",
        "ZeroDivisionError".into(),
    );
    c.contains(
        s,
        &b["raises"],
        "/structured/cell/exception/traceback",
        "File \"<cell 5>\", line 2, in f",
    );
    c.check(
        !b["raises"]["structured"]["cell"]["exception"]["traceback"]
            .as_str()
            .unwrap_or("")
            .contains("<string>"),
        || "basics: the runner's frames show in the traceback".into(),
    );
    cell_ok(c, s, &b["after_exception"], Some("41"));
    // Output that looks like the runner's frames and markers is output.
    cell_ok(c, s, &b["forged_marker"], Some("41"));
    c.contains(
        s,
        &b["forged_marker"],
        "/structured/stdout",
        "pycell-warm-ready",
    );
    c.run_result(s, &b["timeout"], "timeout");
    c.eq(
        s,
        &b["timeout"],
        "/structured/cell/exception/type",
        "KeyboardInterrupt".into(),
    );
    c.eq(s, &b["timeout"], "/structured/error/code", "timeout".into());
    // The interrupted loop got some way; the session kept its state.
    c.eq(s, &b["after_timeout"], "/is_error", Value::Bool(false));
    c.check(
        b["after_timeout"]["structured"]["cell"]["value"]
            .as_str()
            .and_then(|v| v.parse::<u32>().ok())
            .is_some_and(|i| (1..100).contains(&i)),
        || {
            format!(
                "basics: the loop variable after the interrupt: {}",
                b["after_timeout"]
            )
        },
    );
}

fn check_files(c: &mut Checks, b: &Value) {
    let s = "basics";
    c.eq(s, &b["write_binary"], "/structured/size", json!(10240));
    c.eq(s, &b["read_binary"], "/exact", Value::Bool(true));
    c.eq(s, &b["read_binary"], "/result/schema_errors", json!([]));
    cell_ok(c, s, &b["cell_reads_input"], Some("2"));
    c.eq(s, &b["list"], "/is_error", Value::Bool(false));
    let names: Vec<&str> = b["list"]["structured"]["entries"]
        .as_array()
        .map(|a| a.iter().filter_map(|e| e["name"].as_str()).collect())
        .unwrap_or_default();
    for n in ["data", "in.csv", "state.json"] {
        c.check(names.contains(&n), || {
            format!("basics: {n} not listed: {names:?}")
        });
    }
    for (step, needle) in [
        ("outside", "'..' is not allowed"),
        ("absolute_outside", "outside /workspace"),
        ("symlink", "symlink"),
    ] {
        c.tool_error(s, &b[step], &["file_refused", needle]);
    }
    let changed: Vec<&str> = b["changed_files"]["structured"]["files"]
        .as_array()
        .map(|a| a.iter().filter_map(|f| f["path"].as_str()).collect())
        .unwrap_or_default();
    c.eq(
        s,
        &json!(changed),
        "",
        json!(["/workspace/in.csv", "/workspace/out.txt"]),
    );
    c.tool_error(s, &b["no_args"], &["`dependencies` does not apply"]);
    c.eq(
        s,
        &b["list_sessions"],
        "/structured/sessions/0/session",
        b["handle"].clone(),
    );
    c.eq(s, &b["end"], "/structured/reason", "ended".into());
    nothing_left(c, s, b, "/left_after_end");
    c.tool_error(s, &b["after_end"], &["session_gone"]);
    c.tool_error(s, &b["unknown"], &["unknown_session", "session_start"]);
}

/// The checks both modes share: state, files, isolation, limits, a killed
/// session.
fn check_flow(c: &mut Checks) {
    if let Some(v) = c.step("flow") {
        c.eq("flow", v, "/completed", Value::Bool(true));
    }
    if let Some(b) = c.step("basics") {
        check_state_and_errors(c, b);
        check_files(c, b);
    }
    if let Some(v) = c.step("isolation") {
        c.eq("isolation", v, "/handles_differ", Value::Bool(true));
        c.eq(
            "isolation",
            v,
            "/b_sees/structured/cell/exception/type",
            "NameError".into(),
        );
        c.eq("isolation", v, "/b_files/structured/entries", json!([]));
    }
    if let Some(v) = c.step("input_files") {
        c.run_result("input_files", &v["ok"], "ok");
        c.eq("input_files", v, "/ok/structured/stdout", "2 True\n".into());
        c.tool_error("input_files", &v["nested"], &["not a plain file name"]);
        c.tool_error("input_files", &v["both"], &["exactly one of"]);
    }
    if let Some(v) = c.step("too_many") {
        c.eq("too_many", v, "/started", json!(4));
        c.tool_error(
            "too_many",
            &v["fifth"],
            &["too_many_sessions", "per_uid = 4"],
        );
    }
    if let Some(v) = c.step("stubborn") {
        c.eq("stubborn", v, "/cell/is_error", Value::Bool(true));
        c.eq("stubborn", v, "/cell/schema_errors", json!([]));
        c.eq(
            "stubborn",
            v,
            "/cell/structured/error/code",
            "session_killed".into(),
        );
        c.contains(
            "stubborn",
            v,
            "/cell/structured/error/message",
            "cell_timeout",
        );
        c.tool_error("stubborn", &v["next"], &["session_killed", "cell_timeout"]);
        nothing_left(c, "stubborn", v, "/left");
    }
    if let Some(v) = c.step("fork") {
        check_fork(c, v);
    }
}

/// A fork: the copy's x and file go their own way from its source's, its
/// generator draws differently, what it did not carry is named.
fn check_fork(c: &mut Checks, v: &Value) {
    c.eq("fork", v, "/fork/is_error", Value::Bool(false));
    c.eq("fork", v, "/fork/schema_errors", json!([]));
    c.eq("fork", v, "/fork/structured/reseeded", json!(["Random"]));
    c.contains("fork", v, "/fork/structured/dropped/f", "TextIOWrapper");
    c.eq("fork", v, "/fork/structured/files", json!(1));
    c.contains("fork", v, "/fork/text", "Not carried: f (");
    c.eq("fork", v, "/uids_differ", Value::Bool(true));
    c.eq("fork", v, "/fork_sets/structured/cell/value", "42".into());
    c.eq("fork", v, "/source_sets/structured/cell/value", "51".into());
    c.eq(
        "fork",
        v,
        "/fork_reads/structured/cell/value",
        "(42, 'fork')".into(),
    );
    c.eq(
        "fork",
        v,
        "/source_reads/structured/cell/value",
        "(51, 'source')".into(),
    );
    c.eq("fork", v, "/draws_differ", Value::Bool(true));
    c.tool_error("fork", &v["unknown"], &["unknown_session"]);
    c.eq("fork", v, "/snapshot/is_error", Value::Bool(false));
    c.eq("fork", v, "/snapshot/schema_errors", json!([]));
    c.contains("fork", v, "/snapshot/structured/snapshot", "snap-");
    c.contains("fork", v, "/snapshot/text", "Not kept: f");
    c.eq("fork", v, "/restored/schema_errors", json!([]));
    c.eq("fork", v, "/restored/structured/restored/files", json!(1));
    c.contains("fork", v, "/restored/text", "started from snapshot snap-");
    c.eq(
        "fork",
        v,
        "/restored_reads/structured/cell/value",
        "(51, 'source')".into(),
    );
    c.tool_error("fork", &v["no_snapshot"], &["unknown_snapshot"]);
    nothing_left(c, "fork", v, "/left");
}

/// One-shot runs: the figure left open (1600x1200) and the PNG saved at
/// 3200x2400 both come back at the 1024 px edge, with their paths and the
/// structured result naming them; three noise figures that cannot all fit
/// the 1 MiB budget are partly omitted, and what is sent stays within it.
fn check_plot_run(c: &mut Checks, v: &Value) {
    let s = "plot_run";
    c.eq(s, v, "/shown/structured/status", "ok".into());
    c.eq(s, v, "/shown/structured/stdout", "plotted\n".into());
    // matplotlib found its font cache (built with the env): no rebuild,
    // so no fontconfig error from a jail without /etc/fonts.
    c.eq(s, v, "/shown/structured/stderr", "".into());
    c.eq(
        s,
        v,
        "/shown/structured/images/0/path",
        "/workspace/figures/figure-1.png".into(),
    );
    c.eq(
        s,
        v,
        "/shown/structured/images/1/path",
        "/workspace/big.png".into(),
    );
    c.eq(s, v, "/shown/structured/images/1/width", json!(1024));
    c.eq(s, v, "/shown/schema_errors", json!([]));
    c.eq(s, v, "/content/0/mime", "image/png".into());
    c.eq(s, v, "/content/0/size", json!([1024, 768]));
    c.eq(s, v, "/content/1/size", json!([1024, 768]));
    c.eq(s, v, "/over_budget/status", "ok".into());
    c.check(
        num(v, "/over_budget/omitted") >= 1.0
            && num(v, "/over_budget/sent") + num(v, "/over_budget/omitted") == 3.0,
        || {
            format!(
                "{s}: three figures, some over the budget: {}",
                v["over_budget"]
            )
        },
    );
    c.check(
        num(v, "/over_budget/content_bytes") <= (1 << 20) as f64,
        || format!("{s}: the images sent are over 1 MiB: {}", v["over_budget"]),
    );
}

/// A DataFrame value: its text and markdown say its shape and dtypes and
/// show its first and last rows, and nothing in between; a 2 MB dict: a
/// summary of its shape within `[output] part_chars` (16384), the whole in
/// the file the cell wrote; display() in a run: markdown in the text.
fn check_frames(c: &mut Checks, v: &Value) {
    let s = "frames";
    c.contains(s, v, "/frame/value", "DataFrame: 100,000 rows x 2 columns");
    c.contains(s, v, "/frame/value", "columns: n (int64), sq (int64)");
    c.eq(s, v, "/frame/displays/0/kind", "value".into());
    let markdown = v["frame"]["displays"][0]["markdown"].as_str().unwrap_or("");
    let rows = [
        "| 0 | 0 | 0 |",
        "| 4 | 4 | 16 |",
        "| ... |",
        "| 99999 | 99999 | 9999800001 |",
    ];
    c.check(
        rows.iter().all(|r| markdown.contains(r)) && !markdown.contains("| 5 | 5 |"),
        || format!("{s}: the markdown is not the first and last five rows: {markdown}"),
    );
    c.contains(s, v, "/frame/text", "| 99999 | 99999 | 9999800001 |");
    c.contains(s, v, "/big/value", "<dict of 60,000 items");
    c.contains(s, v, "/big/value", "shape: {str: {'a': int, 'b': [int]}}");
    c.eq(s, v, "/big/value_truncated", Value::Bool(true));
    let value = v["big"]["value"].as_str().unwrap_or("");
    c.check(value.chars().count() <= 16384, || {
        format!("{s}: the value is {} characters", value.chars().count())
    });
    c.check(num(v, "/big/text_chars") < 20_000.0, || {
        format!(
            "{s}: the text content is {} characters",
            v["big"]["text_chars"]
        )
    });
    // The whole value is kept in the workspace, named in the result.
    let kept = "/workspace/outputs/cell-2-value.json";
    c.eq(s, v, "/big/value_file", kept.into());
    c.contains(s, v, "/big/text", &format!("(the whole value: {kept})"));
    c.eq(s, v, "/big/files/0/path", kept.into());
    c.check(num(v, "/big/files/0/size") > 2e6, || {
        format!(
            "{s}: the value's file is not the whole 2 MB: {}",
            v["big"]["files"]
        )
    });
    c.eq(s, v, "/big_file_is_whole", "True".into());
    c.eq(s, v, "/run/status", "ok".into());
    c.eq(s, v, "/run/displays/0/kind", "display".into());
    c.contains(s, v, "/run/text", "DataFrame: 2 rows x 2 columns");
    c.contains(s, v, "/run/text", "| 1 | 2 | y |");
    // An HTML part comes as an embedded resource too.
    c.eq(
        s,
        v,
        "/run/resources",
        json!([{"uri": "pycell://displays/2.html", "mime": "text/html", "text": "<b>ok</b>"}]),
    );
}

#[test]
fn sessions_keep_state_move_files_show_plots_and_leave_nothing_behind() {
    let report = sdk_report("sdk_sessions.py", GUARD);
    let mut c = Checks::new(&report);
    check_flow(&mut c);
    if let Some(v) = c.step("plot") {
        c.eq("plot", v, "/is_error", Value::Bool(false));
        c.eq("plot", v, "/status", "ok".into());
        c.eq("plot", v, "/stderr", "".into());
        c.eq("plot", v, "/value", "np.float64(808.5)".into());
        // A 1600x1200 figure comes back scaled to the 1024 px edge, as PNG,
        // within the 1 MiB budget; its full-size file is readable.
        c.eq("plot", v, "/images/0/mime", "image/png".into());
        c.eq("plot", v, "/images/0/size", json!([1024, 768]));
        c.check(num(v, "/images/0/bytes") < (1 << 20) as f64, || {
            format!("plot: the image is over 1 MiB: {}", v["images"])
        });
        c.contains(
            "plot",
            v,
            "/result_images/0/path",
            "/workspace/figures/cell-1-figure-1.png",
        );
        c.eq("plot", v, "/full_size/mime", "image/png".into());
    }
    if let Some(v) = c.step("plot_run") {
        check_plot_run(&mut c, v);
    }
    if let Some(v) = c.step("frames") {
        check_frames(&mut c, v);
    }
    if let Some(v) = c.step("fork_data") {
        let sum = v["source"]["structured"]["cell"]["value"]
            .as_str()
            .unwrap_or("?");
        let want = format!("({sum}, 1000, 'DataFrame', True, True)");
        c.eq(
            "fork_data",
            v,
            "/fork_check/structured/cell/value",
            want.into(),
        );
        c.eq(
            "fork_data",
            v,
            "/fork/structured/reseeded",
            json!(["Generator"]),
        );
        c.eq("fork_data", v, "/draws_differ", Value::Bool(true));
    }
    for (step, exit) in [("eof", json!(0)), ("killed", json!(-9))] {
        if let Some(v) = c.step(step) {
            c.eq(step, v, "/exit", exit);
            c.check(v["uids"].as_array().is_some_and(|u| u.len() == 2), || {
                format!("{step}: two sessions were not started: {v}")
            });
            for left in v["left"].as_object().into_iter().flatten().map(|(_, l)| l) {
                c.eq(step, left, "/processes", json!([]));
                c.eq(step, left, "/cgroups", json!([]));
            }
        }
    }
    c.finish();
}

/// The same tools through pycelld: the daemon holds the sessions, which
/// outlive the `pycell mcp` process that started them.
#[test]
fn sessions_through_pycelld_work_alike_and_outlive_their_mcp_server() {
    let d = Daemon::start("");
    let socket = d.socket();
    let report = sdk_report_with(
        "sdk_sessions.py",
        &["--socket", socket.to_str().expect("a UTF-8 socket path")],
        GUARD,
    );
    let mut c = Checks::new(&report);
    check_flow(&mut c);
    if let Some(v) = c.step("outlives") {
        c.eq(
            "outlives",
            v,
            "/later/structured/cell/value",
            "'yes'".into(),
        );
        c.eq("outlives", v, "/end/structured/reason", "ended".into());
    }
    if !c.failures.is_empty() {
        c.failures.push(format!("pycelld's log:\n{}", d.log()));
    }
    c.finish();
    d.assert_sandbox_gone(Duration::from_secs(10));
}
