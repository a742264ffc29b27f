//! pycelld end to end: a real daemon (root monitor + unprivileged broker as
//! the `pycell` user) on a socket in a temp dir, driven through the client
//! library and raw frames. Needs root and the `pycell` system user (which
//! scripts/setup creates).

#![forbid(unsafe_code)]

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use pycell_protocol::client::{ClientError, DaemonClient, Stage};
use pycell_protocol::messages::{
    ClientMessage, ErrorCode, LimitOverrides, RunRequest, ServerMessage, MAX_FRAME,
    PROTOCOL_VERSION,
};
use pycell_tests::daemon::Daemon;
use pycell_tests::{processes_with_uid, pycell_bin};

fn request(code: &str) -> RunRequest {
    RunRequest {
        code: code.to_string(),
        ..Default::default()
    }
}

fn raw_frame(body: &[u8]) -> Vec<u8> {
    let mut v = (body.len() as u32).to_be_bytes().to_vec();
    v.extend_from_slice(body);
    v
}

fn read_reply(s: &mut UnixStream) -> ServerMessage {
    let mut head = [0u8; 4];
    s.read_exact(&mut head).unwrap();
    let mut body = vec![0u8; u32::from_be_bytes(head) as usize];
    s.read_exact(&mut body).unwrap();
    serde_json::from_slice(&body).unwrap()
}

fn send(s: &mut UnixStream, msg: &ClientMessage) {
    s.write_all(&raw_frame(&serde_json::to_vec(msg).unwrap()))
        .unwrap();
}

/// Run `cmd` with `input` on its stdin; its output.
fn output_with_stdin(cmd: &mut Command, input: &[u8]) -> std::process::Output {
    cmd.stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .and_then(|mut c| {
            c.stdin.take().unwrap().write_all(input)?;
            c.wait_with_output()
        })
        .unwrap()
}

fn error_code(m: &ServerMessage) -> ErrorCode {
    match m {
        ServerMessage::Error { code, .. } => *code,
        other => panic!("expected an error, got {other:?}"),
    }
}

fn hello(s: &mut UnixStream) {
    send(
        s,
        &ClientMessage::Hello {
            version: PROTOCOL_VERSION,
            client: "test".into(),
            identity: None,
        },
    );
    assert!(matches!(read_reply(s), ServerMessage::Welcome { .. }));
}

/// The log's lines once one contains `needle` (pycelld logs a run's end
/// when it reaps the jailer, a moment after the client has its result).
fn log_once_it_has(d: &Daemon, needle: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let log = d.log();
        if log.contains(needle) || Instant::now() > deadline {
            return log;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn pycelld_logs_at_its_configured_level_naming_the_run_in_fields() {
    let verbose = Daemon::start("log_level = \"debug\"\n");
    let r = verbose
        .client()
        .run(request("print(1)"), |_, _| {})
        .unwrap();
    let log = log_once_it_has(&verbose, "run ended");
    let line = |what: &str| {
        log.lines()
            .find(|l| l.contains(what))
            .unwrap_or_else(|| panic!("no {what:?} line in:\n{log}"))
            .to_string()
    };
    let started = line("run started");
    assert!(started.contains(" DEBUG "), "{started}");
    for field in [
        format!("run_id={}", r.run_id),
        "peer_uid=0".into(),
        "policy=default".into(),
    ] {
        assert!(started.contains(&field), "{field} in {started}");
    }
    let ended = line("run ended");
    assert!(ended.contains(&format!("run_id={}", r.run_id)), "{ended}");
    assert!(ended.contains("status=\"ok\""), "{ended}");
    // Its env store is under /tmp, which it refuses: a warning, at info.
    assert!(line("runs with dependencies will be refused").contains(" WARN "));
    let default = Daemon::start("");
    default
        .client()
        .run(request("print(1)"), |_, _| {})
        .unwrap();
    let log = log_once_it_has(&default, "will be refused");
    assert!(log.contains("will be refused"), "{log}");
    assert!(!log.contains("run started"), "{log}");
    let quiet = Daemon::start("log_level = \"error\"\n");
    quiet.client().run(request("print(1)"), |_, _| {}).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    assert!(!quiet.log().contains("will be refused"), "{}", quiet.log());
}

#[test]
fn runs_through_the_daemon_and_audits_them() {
    let d = Daemon::start("");
    let mut out = Vec::new();
    let r = d
        .client()
        .run(request("print('via daemon')"), |_, b| {
            out.extend_from_slice(b)
        })
        .unwrap();
    assert_eq!(serde_json::to_value(r.status).unwrap(), "ok", "{r:?}");
    assert_eq!(r.stdout, "via daemon\n");
    assert_eq!(out, b"via daemon\n", "output is streamed as it comes");
    let layers = r.layers.as_ref().unwrap();
    assert_ne!(layers.sandbox_uid, 0);
    // The CLI uses the same socket.
    let cli = output_with_stdin(
        Command::new(pycell_bin())
            .args(["run", "--json", "--socket"])
            .arg(d.socket())
            .arg("-"),
        b"import sys; print(6*7); sys.exit(4)",
    );
    assert_eq!(cli.status.code(), Some(4));
    let v: serde_json::Value = serde_json::from_slice(&cli.stdout).unwrap();
    assert_eq!(v["stdout"], "42\n");
    assert_eq!(v["status"], "error");
    // The monitor audits each run: its start (the peer, the code's hash,
    // the policy and limits) and how its jailer ended.
    let starts = d.audit_events("run_start", 2);
    let ends = d.audit_events("run_end", 2);
    assert_eq!(starts.len(), 2, "{}", d.audit());
    assert_eq!(starts[0]["peer_uid"], 0);
    assert_eq!(starts[0]["policy"], "default");
    assert_eq!(starts[0]["code_sha256"].as_str().unwrap().len(), 64);
    assert_eq!(starts[0]["limits"]["memory_bytes"], 512u64 << 20);
    assert_eq!(ends.len(), 2, "{}", d.audit());
    assert_eq!(ends[0]["run_id"], starts[0]["run_id"]);
    assert_eq!(ends[0]["jailer"], "exited 0");
    assert_eq!(ends[1]["stopped_by"], serde_json::Value::Null);
    // ... and how the run itself ended, as its jailer told the monitor.
    assert_eq!(ends[0]["status"], "ok", "{}", d.audit());
    assert_eq!(ends[0]["exit_code"], 0);
    assert_eq!(ends[1]["status"], "error", "{}", d.audit());
    assert_eq!(ends[1]["exit_code"], 4);
    assert_eq!(ends[1]["signal"], serde_json::Value::Null);
    // `pycell info` asks the daemon.
    let info = Command::new(pycell_bin())
        .args(["info", "--json"])
        .env("PYCELL_SOCKET", d.socket())
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&info.stdout).unwrap();
    assert_eq!(v["mode"], "daemon", "{v}");
    assert_eq!(v["version"], env!("CARGO_PKG_VERSION"));
    assert!(
        v["policies"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["name"] == "default"),
        "{v}"
    );
    // Defaults sized from the host: 4 runs per core (4 to 256), 64 queued
    // per run slot (at most 4096), 3/4 of the RAM as the memory budget.
    let cores = std::thread::available_parallelism().unwrap().get();
    let concurrent = (cores * 4).clamp(4, 256);
    assert_eq!(v["daemon"]["max_concurrent_runs"], concurrent, "{v}");
    assert_eq!(v["daemon"]["max_queued_runs"], (concurrent * 64).min(4096));
    assert!(v["daemon"]["memory_budget_bytes"].as_u64().unwrap() > 0);
    // The broker runs unprivileged.
    let broker = processes_with_uid(
        nix::unistd::User::from_name("pycell")
            .unwrap()
            .unwrap()
            .uid
            .as_raw(),
    );
    assert!(
        broker.iter().any(|p| p.name == "pycelld"),
        "no pycelld broker running as pycell: {broker:?}"
    );
}

#[test]
fn bad_input_gets_an_error_code_and_the_daemon_keeps_serving() {
    let d = Daemon::start("");
    // Oversized frame: refused before anything is read.
    let mut s = UnixStream::connect(d.socket()).unwrap();
    hello(&mut s);
    s.write_all(&(MAX_FRAME + 1).to_be_bytes()).unwrap();
    assert_eq!(error_code(&read_reply(&mut s)), ErrorCode::FrameTooLarge);
    // Garbage inside a frame: an error, and the connection goes on.
    let mut s = UnixStream::connect(d.socket()).unwrap();
    hello(&mut s);
    s.write_all(&raw_frame(b"\x00\xffnot json at all")).unwrap();
    assert_eq!(error_code(&read_reply(&mut s)), ErrorCode::BadMessage);
    s.write_all(&raw_frame(
        br#"{"type":"run","id":"x","request":{"code":"print(1)","bogus":1}}"#,
    ))
    .unwrap();
    assert_eq!(
        error_code(&read_reply(&mut s)),
        ErrorCode::BadMessage,
        "unknown fields are rejected"
    );
    s.write_all(&raw_frame(br#"{"type":"format_disk"}"#))
        .unwrap();
    assert_eq!(error_code(&read_reply(&mut s)), ErrorCode::BadMessage);
    send(&mut s, &ClientMessage::Info);
    assert!(matches!(read_reply(&mut s), ServerMessage::Info { .. }));
    // Garbage instead of a hello; then a wrong version; then run before hello.
    let mut s = UnixStream::connect(d.socket()).unwrap();
    s.write_all(b"GET / HTTP/1.1\r\n\r\n").unwrap();
    let _ = s.shutdown(std::net::Shutdown::Write);
    let mut rest = Vec::new();
    let _ = s.read_to_end(&mut rest);
    let mut s = UnixStream::connect(d.socket()).unwrap();
    send(
        &mut s,
        &ClientMessage::Hello {
            version: 999,
            client: "future".into(),
            identity: None,
        },
    );
    assert_eq!(error_code(&read_reply(&mut s)), ErrorCode::VersionMismatch);
    let mut s = UnixStream::connect(d.socket()).unwrap();
    send(&mut s, &ClientMessage::Info);
    assert_eq!(
        error_code(&read_reply(&mut s)),
        ErrorCode::HandshakeRequired
    );
    // A truncated frame, then the peer vanishes.
    let mut s = UnixStream::connect(d.socket()).unwrap();
    hello(&mut s);
    s.write_all(&100u32.to_be_bytes()).unwrap();
    s.write_all(b"{\"type\":").unwrap();
    drop(s);
    // Huge code (over the 16 MiB limit, within the frame limit): invalid_request.
    let huge = format!("x = '{}'\n", "a".repeat(17 << 20));
    match d.client().run(request(&huge), |_, _| {}) {
        Err(ClientError::Refused { code, message }) => {
            assert_eq!(code, ErrorCode::InvalidRequest);
            assert!(message.contains("code"), "{message}");
        }
        other => panic!("huge code was not refused: {other:?}"),
    }
    // Invalid limits and unknown policies say what to fix.
    let mut r = request("print(1)");
    r.limits = LimitOverrides {
        memory_bytes: Some(1),
        ..Default::default()
    };
    match d.client().run(r, |_, _| {}) {
        Err(ClientError::Refused { code, message }) => {
            assert_eq!(code, ErrorCode::InvalidRequest);
            assert!(message.contains("memory"), "{message}");
        }
        other => panic!("bad limits were not refused: {other:?}"),
    }
    let mut r = request("print(1)");
    r.policy = Some("../../etc/passwd".into());
    assert!(matches!(
        d.client().run(r, |_, _| {}),
        Err(ClientError::Refused {
            code: ErrorCode::InvalidRequest,
            ..
        })
    ));
    // And after all that it still serves.
    let r = d
        .client()
        .run(request("print('still here')"), |_, _| {})
        .unwrap();
    assert_eq!(r.stdout, "still here\n", "{}", d.log());
}

#[test]
fn unauthorized_uids_are_refused() {
    // The socket is world-connectable here, so the broker's own check is
    // what refuses: uid 4242 is neither root nor in the pycell group.
    let d = Daemon::start("socket_mode = \"0666\"\n");
    // uid 4242 may not be able to reach the build directory (a clone under
    // /root): run a copy of the client from the daemon's 0755 temp dir.
    let client = d.dir.path().join("pycell");
    std::fs::copy(pycell_bin(), &client).unwrap();
    let out = output_with_stdin(
        Command::new(&client)
            .args(["run", "--socket"])
            .arg(d.socket())
            .arg("-")
            .uid(4242)
            .gid(4242),
        b"print(1)",
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(125), "stderr: {stderr}");
    assert!(
        stderr.contains("unauthorized") && stderr.contains("4242"),
        "stderr: {stderr}"
    );
    assert!(out.stdout.is_empty());
    // Root still gets in.
    assert!(d.client().run(request("print(1)"), |_, _| {}).is_ok());
}

#[test]
fn supplementary_group_members_are_let_in() {
    // uid 4243 is only a supplementary member of the pycell group (primary
    // gid 4243): the broker sees that group through SO_PEERGROUPS.
    let d = Daemon::start("socket_mode = \"0666\"\n");
    let client = d.dir.path().join("pycell");
    std::fs::copy(pycell_bin(), &client).unwrap();
    let pycell_gid = pycell_tests::pycell_gid();
    let script = d.dir.path().join("uid.py");
    std::fs::write(&script, "import os; print(os.getuid())\n").unwrap();
    let run_as = |groups: &str| {
        let out = Command::new("setpriv")
            .args(["--reuid=4243", "--regid=4243"])
            .arg(groups)
            .arg(&client)
            .args(["run", "--socket"])
            .arg(d.socket())
            .arg(&script)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (code, stdout, stderr) = run_as(&format!("--groups={pycell_gid}"));
    assert_eq!(code, Some(0), "stderr: {stderr}\n{}", d.log());
    assert_eq!(stdout, "1000\n");
    // The same uid without the group is refused.
    let (code, _, stderr) = run_as("--clear-groups");
    assert_eq!(code, Some(125), "stderr: {stderr}");
    assert!(stderr.contains("unauthorized"), "stderr: {stderr}");
}

/// `pycell` as `uid` through `d`, `args` then `-` (code on stdin):
/// exit code, stdout, stderr.
fn cli_as(d: &Daemon, uid: u32, args: &[&str], code: &str) -> (Option<i32>, String, String) {
    let client = d.dir.path().join("pycell");
    if !client.exists() {
        std::fs::copy(pycell_bin(), &client).unwrap();
    }
    let mut cmd = Command::new(&client);
    cmd.args(args).arg("--socket").arg(d.socket());
    if args[0] == "run" {
        cmd.arg("-");
    }
    let out = output_with_stdin(cmd.uid(uid).gid(uid), code.as_bytes());
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn a_local_user_names_only_the_policies_granted_to_its_uid_and_no_code_borrows_a_server_policy() {
    let d = Daemon::start(
        "socket_mode = \"0666\"\nallowed_uids = [4244, 4245]\npolicies_by_uid = { \"*\" = [\"default\", \"mcp-server\"], \"4244\" = [\"network\"] }\n",
    );
    let (code, out, err) = cli_as(&d, 4244, &["run", "--policy", "network"], "print(1)");
    assert_eq!(
        (code, out.as_str()),
        (Some(0), "1\n"),
        "stderr: {err}\n{}",
        d.log()
    );
    // Another uid gets what "*" lists only, for runs and sessions alike.
    let (code, _, err) = cli_as(&d, 4245, &["run", "--policy", "network"], "print(1)");
    assert_eq!(code, Some(125), "stderr: {err}");
    assert!(
        err.contains("uid 4245 may not use policy \"network\" through pycelld (it may use: default, mcp-server)")
            && err.contains("policies_by_uid"),
        "stderr: {err}"
    );
    let (code, _, err) = cli_as(&d, 4245, &["session", "start", "--policy", "network"], "");
    assert_ne!(code, Some(0), "stderr: {err}");
    assert!(
        err.contains("may not use policy \"network\""),
        "stderr: {err}"
    );
    // A server policy serves stdio only: no code run or session of any
    // uid, root's included, gets its clocks.
    for uid in [4245, 0] {
        let (code, _, err) = cli_as(&d, uid, &["run", "--policy", "mcp-server"], "print(1)");
        assert_eq!(code, Some(125), "uid {uid}: stderr: {err}");
        assert!(
            err.contains("\"mcp-server\" is for MCP servers over stdio"),
            "uid {uid}: {err}"
        );
        let (code, _, err) = cli_as(&d, uid, &["session", "start", "--policy", "mcp-server"], "");
        assert_ne!(code, Some(0), "uid {uid}: stderr: {err}");
        assert!(
            err.contains("is for MCP servers over stdio"),
            "uid {uid}: {err}"
        );
    }
    // Nor does any run get the install jail's network and clocks.
    let (code, _, err) = cli_as(&d, 0, &["run", "--policy", "install"], "print(1)");
    assert_eq!(code, Some(125), "stderr: {err}");
    assert!(err.contains("builds dependency envs"), "stderr: {err}");
}

/// Wait until the daemon reports `active` runs going and `queued` waiting.
fn wait_for_runs(d: &Daemon, active: usize, queued: usize) {
    d.wait_for_runs(active, Some(queued), Duration::from_secs(20));
}

#[test]
fn runs_over_the_limit_wait_their_turn_and_busy_means_a_full_queue() {
    let d = Daemon::start("max_concurrent_runs = 1\nmax_queued_runs = 1\n");
    let socket = d.socket();
    let long = std::thread::spawn(move || {
        let mut c = DaemonClient::connect(&socket).unwrap();
        c.run(
            request("import time; time.sleep(3); print('done')"),
            |_, _| {},
        )
        .unwrap()
    });
    wait_for_runs(&d, 1, 0);
    let socket = d.socket();
    let waiting = std::thread::spawn(move || {
        let mut places = Vec::new();
        let mut c = DaemonClient::connect(&socket).unwrap();
        let r = c.run_queued(
            request("print(2)"),
            |_, _| {},
            |stage| match stage {
                Stage::Queued(p) => places.push(p),
                Stage::Started(_) => places.push(0),
                Stage::Installing(m) => panic!("nothing to install, yet: {m}"),
                Stage::ToolCall { tool, .. } => panic!("no tools were offered, yet: {tool}"),
            },
        );
        (r.unwrap(), places)
    });
    wait_for_runs(&d, 1, 1);
    match d.client().run(request("print(3)"), |_, _| {}) {
        Err(ClientError::Refused {
            code: ErrorCode::Busy,
            message,
        }) => assert!(message.contains("max_queued_runs"), "{message}"),
        other => panic!("expected busy, got {other:?}"),
    }
    assert_eq!(long.join().unwrap().stdout, "done\n");
    let (r, places) = waiting.join().unwrap();
    assert_eq!(
        r.stdout, "2\n",
        "the waiting run ran once the slot was free"
    );
    assert_eq!(places.first(), Some(&1), "{places:?}");
    assert_eq!(places.last(), Some(&0), "{places:?}");
    // A wait that runs out is busy, saying so.
    let d = Daemon::start("max_concurrent_runs = 1\nqueue_wait = \"1s\"\n");
    let socket = d.socket();
    let long = std::thread::spawn(move || {
        let mut c = DaemonClient::connect(&socket).unwrap();
        c.run(request("import time; time.sleep(4)"), |_, _| {})
    });
    wait_for_runs(&d, 1, 0);
    let started = Instant::now();
    match d.client().run(request("print(1)"), |_, _| {}) {
        Err(ClientError::Refused {
            code: ErrorCode::Busy,
            message,
        }) => assert!(message.contains("queue_wait"), "{message}"),
        other => panic!("expected busy, got {other:?}"),
    }
    assert!(started.elapsed() < Duration::from_secs(3));
    assert!(long.join().unwrap().is_ok());
}

/// The issue's figure: with the default configuration (fewer slots than
/// clients on this host), 200 runs at concurrency 16 from one uid all
/// succeed, each with its own output: over the quota means wait, not fail.
#[test]
fn two_hundred_runs_at_concurrency_16_from_one_uid_all_succeed_on_defaults() {
    let d = Daemon::start("");
    let next = Arc::new(AtomicUsize::new(0));
    let total = 200;
    let workers: Vec<_> = (0..16)
        .map(|_| {
            let (socket, next) = (d.socket(), Arc::clone(&next));
            std::thread::spawn(move || {
                let mut failures = Vec::new();
                loop {
                    let i = next.fetch_add(1, Ordering::SeqCst);
                    if i >= total {
                        return failures;
                    }
                    let token = format!("run-{i}-{}", i * 7919 % 1000);
                    let mut streamed = Vec::new();
                    let r = DaemonClient::connect(&socket).and_then(|mut c| {
                        let mut req = request(&format!(
                            "import sys; print({token:?}); print({token:?}[::-1], file=sys.stderr)"
                        ));
                        req.args = vec![token.clone()];
                        c.run(req, |_, b| streamed.extend_from_slice(b))
                    });
                    match r {
                        Ok(r)
                            if r.stdout == format!("{token}\n")
                                && r.stderr
                                    == format!("{}\n", token.chars().rev().collect::<String>())
                                && r.exit_code == Some(0) => {}
                        Ok(r) => failures.push(format!(
                            "{token}: status {:?} stdout {:?} stderr {:?} error {:?}",
                            r.status, r.stdout, r.stderr, r.error
                        )),
                        Err(e) => failures.push(format!("{token}: {e}")),
                    }
                }
            })
        })
        .collect();
    let failures: Vec<String> = workers
        .into_iter()
        .flat_map(|w| w.join().unwrap())
        .collect();
    assert!(
        failures.is_empty(),
        "{} of {total} runs failed or mixed up, e.g. {:?}\n{}",
        failures.len(),
        &failures[..failures.len().min(5)],
        d.log()
    );
}

type RunHandle = std::thread::JoinHandle<Result<pycell_protocol::result::RunResult, ClientError>>;

/// Start a long run on its own connection; return once its output arrived,
/// with a canceller for that connection.
fn start_long_run(d: &Daemon) -> (RunHandle, pycell_protocol::client::Canceller) {
    let mut c = d.client();
    let canceller = c.canceller().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let handle = std::thread::spawn(move || {
        let mut sent = false;
        c.run(
            request("import time\nprint('going', flush=True)\ntime.sleep(60)\n"),
            |_, _| {
                if !sent {
                    sent = true;
                    let _ = tx.send(());
                }
            },
        )
    });
    rx.recv_timeout(Duration::from_secs(20))
        .expect("the long run produced no output");
    assert!(
        !d.sandbox_processes().is_empty(),
        "the run's sandbox processes are visible on the host"
    );
    (handle, canceller)
}

#[test]
fn sigkill_of_the_daemon_leaves_no_sandbox_behind_and_a_restart_serves() {
    let mut d = Daemon::start("");
    let (handle, _c) = start_long_run(&d);
    assert!(
        !d.daemon_cgroups().is_empty(),
        "the run has a cgroup under the daemon's parent"
    );
    d.signal(nix::sys::signal::Signal::SIGKILL);
    d.wait(Duration::from_secs(5));
    d.assert_sandbox_gone(Duration::from_secs(10));
    assert!(
        handle.join().unwrap().is_err(),
        "the client sees the daemon go away"
    );
    // A restart on the same socket serves again.
    let d2 = Daemon::start("");
    assert!(
        d2.client().run(request("print(1)"), |_, _| {}).is_ok(),
        "{}",
        d2.log()
    );
}

#[test]
fn sigterm_lets_running_runs_finish_then_exits() {
    let mut d = Daemon::start("");
    let socket = d.socket();
    let (tx, rx) = std::sync::mpsc::channel();
    let run = std::thread::spawn(move || {
        let mut c = DaemonClient::connect(&socket).unwrap();
        c.run(
            request("import time; print('started', flush=True); time.sleep(2); print('finished')"),
            |_, _| {
                let _ = tx.send(());
            },
        )
    });
    // Once its output shows it is running (not merely admitted), ask the
    // daemon to stop.
    rx.recv_timeout(Duration::from_secs(20))
        .expect("the run started");
    assert!(!d.cgroup_parent_dirs().is_empty(), "no cgroup parent seen");
    d.signal(nix::sys::signal::Signal::SIGTERM);
    std::thread::sleep(Duration::from_millis(300));
    // No new runs while draining.
    match DaemonClient::connect(&d.socket()).and_then(|mut c| c.run(request("print(1)"), |_, _| {}))
    {
        Ok(r) => panic!("a run was accepted while draining: {r:?}"),
        Err(ClientError::Refused { code, .. }) => assert_eq!(code, ErrorCode::ShuttingDown),
        Err(_) => {} // the socket is already closed: also a refusal
    }
    let r = run.join().unwrap().expect("the running run completes");
    assert_eq!(r.stdout, "started\nfinished\n");
    let status = d.wait(Duration::from_secs(15));
    assert!(status.success(), "pycelld exit: {status:?}\n{}", d.log());
    assert!(!Path::new(&d.socket()).exists(), "the socket is removed");
    assert!(d.daemon_cgroups().is_empty());
    let parents = d.cgroup_parent_dirs();
    assert!(
        parents.is_empty(),
        "the cgroup parent it made stays: {parents:?}"
    );
}

#[test]
fn cancel_kills_the_run_and_a_vanished_client_takes_its_run_along() {
    let d = Daemon::start("");
    let (handle, mut canceller) = start_long_run(&d);
    canceller.cancel().unwrap();
    let r = handle.join().unwrap().unwrap();
    assert_eq!(serde_json::to_value(r.status).unwrap(), "killed", "{r:?}");
    d.assert_sandbox_gone(Duration::from_secs(10));
    // A client that just disconnects mid-run.
    let mut s = UnixStream::connect(d.socket()).unwrap();
    hello(&mut s);
    send(
        &mut s,
        &ClientMessage::Run {
            id: "a".into(),
            request: request("import time\nprint('x', flush=True)\ntime.sleep(60)"),
        },
    );
    assert!(matches!(read_reply(&mut s), ServerMessage::Started { .. }));
    assert!(matches!(read_reply(&mut s), ServerMessage::Output { .. }));
    drop(s);
    d.assert_sandbox_gone(Duration::from_secs(10));
    let ends = d.audit_events("run_end", 2);
    assert!(
        ends.iter().all(|e| e["stopped_by"] == "request"),
        "{}",
        d.audit()
    );
}

#[test]
fn a_sigkilled_jailer_takes_its_sandbox_along_and_the_client_hears_of_it() {
    let d = Daemon::start("");
    let (handle, _c) = start_long_run(&d);
    let jailers: Vec<u32> = pycell_tests::children_of(d.pid() as u32)
        .into_iter()
        .filter(|p| p.name == "pycell-jailer")
        .map(|p| p.pid)
        .collect();
    assert_eq!(jailers.len(), 1, "one jailer under the monitor");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(jailers[0] as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    // The run sleeps for 60 s: gone within 5 s means the jailer's death
    // ended it, not its timeout.
    d.assert_sandbox_gone(Duration::from_secs(5));
    let r = handle.join().unwrap().unwrap();
    let error = r.error.as_ref().map(|e| e.code.as_str()).unwrap_or("");
    assert_eq!(error, "jailer_failed", "{r:?}");
    // The daemon goes on serving.
    assert!(d.client().run(request("print(1)"), |_, _| {}).is_ok());
}

#[test]
fn jailers_are_forked_by_a_fork_server_that_is_started_again_if_killed() {
    use pycell_wire::fork_server::{ARG, JAILER_NAME, NAME};
    let d = Daemon::start("");
    let (handle, mut canceller) = start_long_run(&d);
    let children = pycell_tests::children_of(d.pid() as u32);
    let named = |name: &str| children.iter().find(|p| p.name == name).map(|p| p.pid);
    let server = named(NAME).expect("a jailer fork server under the monitor");
    let jailer = named(JAILER_NAME).expect("the run's jailer under the monitor");
    let cmdline = std::fs::read(format!("/proc/{jailer}/cmdline")).unwrap();
    assert!(
        cmdline.split(|b| *b == 0).any(|arg| arg == ARG.as_bytes()),
        "the run's jailer was forked by the server, not executed: {:?}",
        String::from_utf8_lossy(&cmdline)
    );
    let kill9 = |pid: u32| {
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid as i32),
            nix::sys::signal::Signal::SIGKILL,
        )
    };
    kill9(server).unwrap();
    // The run's jailer is the monitor's child, not the server's: it and
    // its run go on.
    let deadline = Instant::now() + Duration::from_secs(10);
    while Path::new(&format!("/proc/{server}")).exists() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        Path::new(&format!("/proc/{jailer}")).exists(),
        "the run's jailer outlives the fork server"
    );
    assert!(!d.sandbox_processes().is_empty(), "and so does its run");
    canceller.cancel().unwrap();
    let r = handle.join().unwrap().unwrap();
    assert_eq!(serde_json::to_value(r.status).unwrap(), "killed", "{r:?}");
    // The next run gets a new server.
    let r = d.client().run(request("print(2)"), |_, _| {}).unwrap();
    assert_eq!(r.stdout, "2\n", "{r:?}\n{}", d.log());
    let again = pycell_tests::children_of(d.pid() as u32)
        .into_iter()
        .find(|p| p.name == NAME)
        .expect("a new jailer fork server under the monitor");
    assert_ne!(again.pid, server, "the server was started again");
}

/// Read replies on a raw connection until the result; every message read.
fn read_until_result(s: &mut UnixStream) -> Vec<ServerMessage> {
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut got = Vec::new();
    loop {
        let m = read_reply(s);
        let done = matches!(
            m,
            ServerMessage::Result { .. } | ServerMessage::Error { .. }
        );
        got.push(m);
        if done {
            return got;
        }
    }
}

/// The issue's case: a client sends a run that floods its output and then
/// never reads. The sandbox still ends at its 2 s timeout (before, the
/// jailer blocked writing output and the deadline never fired); once the
/// client reads, it gets the output it missed and a `timeout` result.
#[test]
fn a_client_that_stops_reading_does_not_keep_its_sandbox_past_the_timeout() {
    let d = Daemon::start("");
    let mut s = UnixStream::connect(d.socket()).unwrap();
    hello(&mut s);
    let mut req =
        request("import sys\nchunk = 'x' * 65536\nwhile True:\n    sys.stdout.write(chunk)\n");
    req.limits = LimitOverrides {
        timeout_s: Some(2.0),
        max_output_bytes: Some(16 << 20),
        ..Default::default()
    };
    send(
        &mut s,
        &ClientMessage::Run {
            id: "flood".into(),
            request: req,
        },
    );
    let deadline = Instant::now() + Duration::from_secs(15);
    while d.sandbox_processes().is_empty() {
        assert!(Instant::now() < deadline, "the sandbox never started");
        std::thread::sleep(Duration::from_millis(20));
    }
    let started = Instant::now();
    // 2 s of timeout, then the kill and cleanup.
    d.assert_sandbox_gone(Duration::from_secs(6));
    let lived = started.elapsed();
    let replies = read_until_result(&mut s);
    let streamed: usize = replies
        .iter()
        .filter_map(|m| match m {
            ServerMessage::Output { data_base64, .. } => Some(
                pycell_protocol::messages::decode_b64(data_base64)
                    .unwrap()
                    .len(),
            ),
            _ => None,
        })
        .sum();
    let Some(ServerMessage::Result { result, .. }) = replies.last() else {
        panic!("no result: {:?}", replies.last());
    };
    assert_eq!(serde_json::to_value(result.status).unwrap(), "timeout");
    assert_eq!(
        streamed,
        result.stdout.len(),
        "the client got exactly the output the result holds"
    );
    assert!(lived < Duration::from_secs(6), "{lived:?}");
}

/// The issue's attempt: through the socket, a client asks the default
/// policy for 64G of memory, 60000 pids, an 80000 s timeout and 8G of
/// output. Refused, naming the ceiling; at the ceiling it runs with it.
#[test]
fn a_request_cannot_raise_limits_above_the_policy_ceilings() {
    let d = Daemon::start("");
    let attempts = [
        (
            LimitOverrides {
                memory_bytes: Some(64 << 30),
                ..Default::default()
            },
            "memory 64GiB is above what policy \"default\" allows (2GiB, its [limits.max] memory)",
        ),
        (
            LimitOverrides {
                pids: Some(60000),
                ..Default::default()
            },
            "pids 60000 is above what policy \"default\" allows (256,",
        ),
        (
            LimitOverrides {
                timeout_s: Some(80000.0),
                ..Default::default()
            },
            "timeout 80000s is above what policy \"default\" allows (10m,",
        ),
        (
            LimitOverrides {
                max_output_bytes: Some(8 << 30),
                ..Default::default()
            },
            "max_output 8GiB is above what policy \"default\" allows (16MiB,",
        ),
    ];
    for (limits, expected) in attempts {
        let mut req = request("print(1)");
        req.limits = limits;
        match d.client().run(req, |_, _| {}) {
            Err(ClientError::Refused {
                code: ErrorCode::InvalidRequest,
                message,
            }) => assert!(message.contains(expected), "{message}"),
            other => panic!("expected invalid_request, got {other:?}"),
        }
    }
    let cli = output_with_stdin(
        Command::new(pycell_bin())
            .args(["run", "--json", "--socket"])
            .arg(d.socket())
            .args(["--memory", "64G", "--pids", "60000", "--timeout", "80000"])
            .args(["--max-output", "8G", "-"]),
        b"print(1)",
    );
    let v: serde_json::Value = serde_json::from_slice(&cli.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&cli.stderr)));
    assert_eq!(v["error"]["code"], "invalid_request", "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("[limits.max]"),
        "{v}"
    );
    let mut req = request("print(1)");
    req.limits = LimitOverrides {
        memory_bytes: Some(2 << 30),
        pids: Some(256),
        ..Default::default()
    };
    let r = d.client().run(req, |_, _| {}).unwrap();
    let limits = r.limits.unwrap();
    assert_eq!((limits.memory.get(), limits.pids), (2 << 30, 256));
}

/// 300 abusive connections from one allowed uid: 100 send garbage frames
/// as fast as they can, 100 start a frame and trickle it a byte every two
/// seconds (slowloris), 100 connect and say nothing.
const ATTACKER: &str = r#"
import os, socket, sys, time
path = sys.argv[1]
conns = []
def connect():
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(path)
        s.setblocking(False)
        return s
    except OSError:
        return None
kinds = ["garbage"] * 100 + ["slow"] * 100 + ["silent"] * 100
for k in kinds:
    conns.append([k, connect()])
frame = (7).to_bytes(4, "big") + b"garbage"
tick = 0
while True:
    tick += 1
    for c in conns:
        kind, s = c
        if s is None:
            c[1] = connect()
            continue
        try:
            if kind == "garbage":
                s.send(frame * 8)
            elif kind == "slow" and tick % 200 == 0:
                s.send(b"\x00")
            try:
                s.recv(65536)
            except BlockingIOError:
                pass
        except OSError:
            s.close()
            c[1] = None
    time.sleep(0.01)
"#;

fn percentile(sorted: &[Duration], p: usize) -> Duration {
    sorted[(sorted.len() * p / 100).min(sorted.len() - 1)]
}

/// The second reliability figure of issue 12: a well-behaved client's run
/// latency (p50/p99), idle and while 300 garbage and slowloris connections
/// hammer the socket. Every one of its runs succeeds; the abuser is held to
/// its per-uid connection cap.
#[test]
fn garbage_and_slowloris_connections_do_not_stop_a_well_behaved_client() {
    const ABUSER: u32 = 4253;
    let d = Daemon::start(&format!(
        "socket_mode = \"0666\"\nallowed_uids = [{ABUSER}]\nmax_connections_per_uid = 64\n"
    ));
    let measure = |n: usize| -> Vec<Duration> {
        let mut times: Vec<Duration> = (0..n)
            .map(|_| {
                let t = Instant::now();
                let r = d.client().run(request("print(1)"), |_, _| {}).unwrap();
                assert_eq!(r.stdout, "1\n", "{r:?}");
                t.elapsed()
            })
            .collect();
        times.sort();
        times
    };
    let idle = measure(30);
    let script = d.dir.path().join("attacker.py");
    std::fs::write(&script, ATTACKER).unwrap();
    let mut attacker = Command::new("setpriv")
        .args([
            &format!("--reuid={ABUSER}"),
            &format!("--regid={ABUSER}"),
            "--clear-groups",
            "/usr/bin/python3",
        ])
        .arg(&script)
        .arg(d.socket())
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_secs(2));
    let attacked = measure(30);
    let during = d.client().info().unwrap().daemon;
    let still_attacking = attacker.try_wait().unwrap().is_none();
    let _ = attacker.kill();
    let _ = attacker.wait();
    let report = format!(
        "well-behaved client, 30 runs each: idle p50 {:?} p99 {:?}; under 300 abusive connections p50 {:?} p99 {:?}; connections open during the attack: {}",
        percentile(&idle, 50),
        percentile(&idle, 99),
        percentile(&attacked, 50),
        percentile(&attacked, 99),
        during.connections
    );
    eprintln!("{report}");
    assert!(still_attacking, "the attacker gave up early\n{}", d.log());
    assert!(
        during.connections <= 64 + 2,
        "the abuser got past its connection cap: {report}"
    );
    assert!(
        percentile(&attacked, 99) < Duration::from_secs(5),
        "{report}"
    );
}

/// `block` (a PEP 723 block) padded with a comment to just
/// under the code size limit.
fn hostile_script(block: &str) -> String {
    let mut code = block.to_string();
    let limit = pycell_protocol::messages::MAX_CODE_BYTES;
    let pad = limit.saturating_sub(code.len() + 4);
    code.push_str("# ");
    code.push_str(&"x".repeat(pad));
    code.push('\n');
    assert!(code.len() <= limit);
    code
}

/// The CPU time `pid` has used, in clock ticks (utime + stime).
fn cpu_ticks(pid: i32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // Fields after the command name, which ends with the last ')'.
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let fields: Vec<&str> = rest.split(' ').collect();
    fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap()
}

/// Send each hostile request; each must be refused as `deps_invalid`.
fn refuse_each(d: &Daemon, hostile: &[RunRequest]) {
    for (i, req) in hostile.iter().enumerate() {
        match d.client().run(req.clone(), |_, _| {}) {
            Ok(r) => {
                let e = r.error.clone();
                let e = e.unwrap_or_else(|| panic!("hostile request {i} ran: {r:?}"));
                assert_eq!(e.code.as_str(), "deps_invalid", "request {i}: {e:?}");
            }
            Err(e) => panic!("hostile request {i}: {e}\n{}", d.log()),
        }
    }
}

/// Parsing a request is the broker's work, not root's: requests at the
/// size limits with hostile PEP 723 blocks and dependency lists are
/// refused with their codes without the root monitor spending CPU on
/// them, and another client's runs, going on meanwhile, all succeed and
/// are the only ones that reach root (its audit log).
#[test]
fn hostile_dependency_requests_stay_in_the_broker_and_disturb_no_other_run() {
    let d = Daemon::start("");
    let names: Vec<String> = (0..1_000_000).map(|i| format!("\"p{i}\"")).collect();
    let block = format!(
        "# /// script\n# dependencies = [{}]\n# ///\n",
        names.join(",")
    );
    let nested = format!(
        "# /// script\n# dependencies = {}{}\n# ///\n",
        "[".repeat(100_000),
        "]".repeat(100_000)
    );
    let hostile = vec![
        request(&hostile_script(&block)),
        request(&hostile_script(&nested)),
        RunRequest {
            dependencies: (0..200_000).map(|i| format!("p{i}")).collect(),
            ..request("print(1)")
        },
        RunRequest {
            dependencies: vec!["x".repeat(1 << 20)],
            ..request("print(1)")
        },
    ];
    // Alone: the monitor does nothing for them (its own loop turns a few
    // times a second; parsing megabytes would take it seconds).
    let before = cpu_ticks(d.pid());
    refuse_each(&d, &hostile);
    let spent = cpu_ticks(d.pid()) - before;
    assert!(
        spent < 20,
        "the root monitor spent {spent} ticks on hostile requests"
    );
    // With another client's runs going on.
    let socket = d.socket();
    let other = std::thread::spawn(move || {
        (0..20)
            .map(|i| {
                let mut c = DaemonClient::connect(&socket).unwrap();
                let r = c
                    .run(request(&format!("print({i} * 2)")), |_, _| {})
                    .unwrap();
                (r.status.as_str().to_string(), r.stdout.trim().to_string())
            })
            .collect::<Vec<_>>()
    });
    refuse_each(&d, &hostile);
    for (i, got) in other.join().unwrap().into_iter().enumerate() {
        assert_eq!(got, ("ok".to_string(), (i * 2).to_string()));
    }
    let starts = d.audit_events("run_start", 20);
    assert_eq!(starts.len(), 20, "only the other client's runs reach root");
}

/// Requests of megabytes, each over one bound (requirements, names, args,
/// files, file names, stdin, a policy name, a tool catalog): refused
/// before any work that grows with them, while other runs go on, and the
/// root monitor never spends more than its budget on a message. How fast
/// is not asserted (a loaded machine may take seconds to move 20 MB
/// through a debug build); the bound below only catches a hang.
#[test]
fn hostile_requests_are_refused_at_once_and_stall_no_one() {
    const HANG: Duration = Duration::from_secs(60);
    let d = Daemon::start("");
    let names: String = (0..100_000).map(|i| format!("#   \"pkg{i}\",\n")).collect();
    let mut hostile: Vec<(&str, RunRequest)> = vec![(
        "a PEP 723 block of 100,000 names",
        request(&format!(
            "# /// script\n# dependencies = [\n{names}# ]\n# ///\nprint(1)\n"
        )),
    )];
    let mut r = request("print(1)");
    r.dependencies = (0..100_000).map(|i| format!("p{i}")).collect();
    hostile.push(("100,000 requirements", r));
    let mut r = request("print(1)");
    r.args = (0..1_000_000).map(|i| format!("a{i}")).collect();
    hostile.push(("a million arguments", r));
    let mut r = request("print(1)");
    r.files = (0..100_000)
        .map(|i| pycell_protocol::messages::InputFile {
            name: format!("f{i}"),
            data_base64: String::new(),
        })
        .collect();
    hostile.push(("100,000 files", r));
    let mut r = request("print(1)");
    r.filename = Some("a".repeat(2 << 20));
    hostile.push(("a file name of 2 MiB", r));
    let mut r = request("print(1)");
    r.stdin_base64 = Some("QUFB".repeat(6 << 20));
    hostile.push(("24 MiB of stdin", r));
    let mut r = request("print(1)");
    r.policy = Some("p".repeat(1 << 20));
    hostile.push(("a policy name of 1 MiB", r));
    let mut r = request("print(1)");
    r.tools = Some(pycell_protocol::tools::ToolCatalog {
        servers: (0..100_000)
            .map(|i| pycell_protocol::tools::ToolServer {
                name: format!("s{i}"),
                tools: Vec::new(),
                unavailable: None,
            })
            .collect(),
    });
    hostile.push(("a catalog of 100,000 servers", r));
    // Meanwhile another client's small runs keep going.
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (probe_stop, socket) = (Arc::clone(&stop), d.socket());
    let probe = std::thread::spawn(move || {
        let mut slowest = Duration::ZERO;
        while !probe_stop.load(Ordering::SeqCst) {
            let began = Instant::now();
            let mut c = DaemonClient::connect(&socket).unwrap();
            let r = c.run(request("print(1)"), |_, _| {}).unwrap();
            assert_eq!(r.stdout, "1\n");
            slowest = slowest.max(began.elapsed());
        }
        slowest
    });
    for (what, r) in hostile {
        let began = Instant::now();
        let answer = d.client().run(r, |_, _| {});
        let took = began.elapsed();
        match answer {
            Err(ClientError::Refused { code, .. }) => {
                assert_eq!(code, ErrorCode::InvalidRequest, "{what}")
            }
            Ok(result) => assert_eq!(
                result.status,
                pycell_wire::report::RunStatus::Refused,
                "{what}: {result:?}"
            ),
            Err(e) => panic!("{what}: {e}"),
        }
        assert!(took < HANG, "{what} took {took:?}");
    }
    stop.store(true, Ordering::SeqCst);
    let slowest = probe.join().unwrap();
    assert!(slowest < HANG, "a small run took {slowest:?}");
    assert!(
        !d.log().contains("over budget"),
        "the monitor went over its budget:\n{}",
        d.log()
    );
}

/// Where a jail cannot be built, pycelld does not start: it says which
/// step failed and what to change, and leaves nothing behind. The host
/// here is a mount namespace whose /proc has a file covered, as a
/// container runtime's masked paths cover them (a fresh /proc cannot then
/// be mounted in a new user namespace).
#[test]
fn pycelld_refuses_to_start_where_it_cannot_build_a_jail() {
    pycell_tests::require_root();
    let dir = pycell_tests::open_tempdir("pycelld-self-check");
    let base = 1_950_000_200 + (std::process::id() % 1000) * 64;
    let cgroup = format!("pycelld-test-self-check-{}", std::process::id());
    let config = dir.path().join("pycelld.toml");
    std::fs::write(
        &config,
        format!(
            "socket = \"{0}/pycell.sock\"\naudit_log = \"off\"\ncgroup_parent = \"{cgroup}\"\nuid_range = \"{base}-{1}\"\nwarm_pools = {{}}\nsession_pools = {{}}\nenv_store = \"{0}/envs\"\n",
            dir.path().display(),
            base + 63
        ),
    )
    .unwrap();
    let script = format!(
        "mount --bind /dev/null /proc/keys && exec {} --config {}",
        pycell_tests::pycelld_bin().display(),
        config.display()
    );
    let out = Command::new("unshare")
        .args(["--mount", "--propagation", "private", "sh", "-c", &script])
        .env(
            "PYCELL_JAILER",
            pycell_bin().with_file_name("pycell-jailer"),
        )
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "pycelld started: {err}");
    assert!(
        err.contains("cannot build a jail here, so it does not start")
            && err.contains("mounting a fresh /proc")
            && err.contains("procMount: Unmasked"),
        "{err}"
    );
    assert!(
        !dir.path().join("pycell.sock").exists(),
        "it made its socket"
    );
    let found = Command::new("find")
        .args(["/sys/fs/cgroup", "-maxdepth", "5", "-name", &cgroup])
        .output()
        .unwrap();
    let found = String::from_utf8_lossy(&found.stdout);
    assert!(found.trim().is_empty(), "left behind: {found}");
    let left: Vec<_> = pycell_tests::host_processes()
        .into_iter()
        .filter(|p| p.uids.iter().any(|u| (base..base + 64).contains(u)))
        .collect();
    assert!(left.is_empty(), "{left:?}");
}
