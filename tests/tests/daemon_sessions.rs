//! Sessions through a real pycelld (root monitor, unprivileged broker),
//! over the daemon protocol: state across calls and connections, files,
//! timeouts, ownership by uid, idle expiry, admission, and what is left
//! when a session ends or a pycelld process is SIGKILLed (nothing).

#![forbid(unsafe_code)]

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use base64::Engine;
use pycell_protocol::client::{ClientError, DaemonClient};
use pycell_protocol::messages::ErrorCode;
use pycell_protocol::session::{SessionAnswer, SessionCall, SessionStartRequest};
use pycell_tests::daemon::Daemon;

fn cell(c: &mut DaemonClient, s: &str, code: &str) -> SessionAnswer {
    c.session_call(s, SessionCall::Cell { code: code.into() }, None)
        .unwrap_or_else(|e| panic!("cell {code:?}: {e}"))
}

fn start(d: &Daemon, policy: Option<&str>) -> pycell_protocol::session::SessionInfo {
    let req = SessionStartRequest {
        policy: policy.map(str::to_string),
        ..Default::default()
    };
    d.client()
        .session_start(req, |_| {})
        .unwrap_or_else(|e| panic!("session_start: {e}\n{}", d.log()))
}

fn refused_code(r: Result<SessionAnswer, ClientError>) -> (ErrorCode, String) {
    match r {
        Err(ClientError::Refused { code, message }) => (code, message),
        other => panic!("expected a refusal, got {other:?}"),
    }
}

/// One cell `x` in session `handle`, from a raw client as uid `uid`: the
/// daemon's reply.
fn call_as(d: &Daemon, uid: u32, handle: &str) -> serde_json::Value {
    let call = serde_json::json!({"type": "session", "id": "1", "session": handle, "call": {"op": "cell", "code": "x"}});
    d.ask_as(uid, &call.to_string())
}

#[test]
fn a_session_keeps_state_across_calls_and_connections_and_belongs_to_its_uid() {
    const OTHER: u32 = 4261;
    let d = Daemon::start(&format!(
        "socket_mode = \"0666\"\nallowed_uids = [{OTHER}]\n"
    ));
    let info = start(&d, None);
    let s = info.session.clone();
    assert!(info.sandbox_uid >= d.uid_base, "{info:?}");
    let mut c = d.client();
    assert!(cell(&mut c, &s, "x = 41").reply.error.is_none());
    // A new connection of the same uid: the session is still there.
    let mut c2 = d.client();
    let a = cell(&mut c2, &s, "x + 1");
    assert_eq!(a.reply.value.as_deref(), Some("42"), "{a:?}");
    assert_eq!(a.reply.cell, Some(2));
    let a = cell(&mut c2, &s, "print('out'); 1/0");
    assert_eq!(a.stdout, "out\n");
    assert_eq!(
        a.reply.error.as_ref().map(|e| e.kind.as_str()),
        Some("ZeroDivisionError")
    );
    // Files in and out, exact bytes.
    let bytes: Vec<u8> = (0..=255u8).cycle().take(5000).collect();
    let b64 = base64::engine::general_purpose::STANDARD.encode(&bytes);
    let w = c2
        .session_call(
            &s,
            SessionCall::Write {
                path: "d/b.bin".into(),
                data_base64: b64.clone(),
            },
            None,
        )
        .unwrap();
    assert_eq!(w.reply.size, Some(5000), "{w:?}");
    let r = c2
        .session_call(
            &s,
            SessionCall::Read {
                path: "d/b.bin".into(),
            },
            None,
        )
        .unwrap();
    assert_eq!(r.reply.data.as_deref(), Some(b64.as_str()));
    let r = c2
        .session_call(
            &s,
            SessionCall::Read {
                path: "../etc/passwd".into(),
            },
            None,
        )
        .unwrap();
    assert!(
        r.reply.refused.as_deref().unwrap_or("").contains("'..'"),
        "{r:?}"
    );
    // A cell over its timeout is interrupted; the session goes on.
    let t = c2
        .session_call(
            &s,
            SessionCall::Cell {
                code: "import time\ntime.sleep(30)".into(),
            },
            Some(0.5),
        )
        .unwrap();
    assert!(t.measure.interrupted, "{t:?}");
    assert_eq!(
        t.reply.error.as_ref().map(|e| e.kind.as_str()),
        Some("KeyboardInterrupt")
    );
    assert_eq!(cell(&mut c2, &s, "x").reply.value.as_deref(), Some("41"));
    // Another uid: the answer an unknown handle gets.
    let made_up_handle = format!("{}{}", &s[..10], "0".repeat(32));
    let foreign = call_as(&d, OTHER, &s);
    let made_up = call_as(&d, OTHER, &made_up_handle);
    assert_eq!(foreign["type"], "error", "{foreign}");
    assert_eq!(foreign["code"], "unknown_session", "{foreign}");
    assert_eq!(made_up["code"], "unknown_session", "{made_up}");
    assert_eq!(
        foreign["message"].as_str().unwrap().replace(&s, "H"),
        made_up["message"]
            .as_str()
            .unwrap()
            .replace(&made_up_handle, "H"),
        "a foreign handle and a made-up one must read alike"
    );
    // The session's memory counts in admission while it lives.
    let during = d.client().info().unwrap().daemon;
    assert!(
        during.memory_admitted_bytes >= info.limits.memory.get(),
        "{during:?}"
    );
    let listed = d.client().session_list().unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].session, s);
    let ended = d.client().session_end(&s).unwrap();
    assert_eq!(ended.reason, "ended");
    d.assert_sandbox_gone(Duration::from_secs(10));
    let after = d.client().info().unwrap().daemon;
    assert_eq!(after.memory_admitted_bytes, 0, "{after:?}");
    let (code, message) = refused_code(d.client().session_call(
        &s,
        SessionCall::Cell { code: "x".into() },
        None,
    ));
    assert_eq!(code, ErrorCode::SessionGone, "{message}");
}

#[test]
fn an_idle_session_ends_by_itself_and_says_why() {
    let policies = tempfile::tempdir().unwrap();
    std::fs::set_permissions(
        policies.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let text = pycell_policy::builtin::source("default")
        .unwrap()
        .replace("name = \"default\"", "name = \"quick\"")
        .replace("idle_timeout = \"10m\"", "idle_timeout = \"1s\"")
        .replace("per_uid = 4", "per_uid = 1");
    std::fs::write(policies.path().join("quick.toml"), text).unwrap();
    let d = Daemon::start(&format!("policy_dir = \"{}\"\n", policies.path().display()));
    let info = start(&d, Some("quick"));
    // One session per uid under this policy.
    let second = d.client().session_start(
        SessionStartRequest {
            policy: Some("quick".into()),
            ..Default::default()
        },
        |_| {},
    );
    assert!(
        matches!(
            &second,
            Err(ClientError::Refused {
                code: ErrorCode::TooManySessions,
                ..
            })
        ),
        "{second:?}"
    );
    let t = Instant::now();
    d.assert_sandbox_gone(Duration::from_secs(10));
    assert!(
        t.elapsed() >= Duration::from_millis(500),
        "ended before its idle timeout"
    );
    let (code, message) = refused_code(d.client().session_call(
        &info.session,
        SessionCall::Cell { code: "1".into() },
        None,
    ));
    assert_eq!(code, ErrorCode::SessionGone, "{message}");
    assert!(message.contains("idle"), "{message}");
    // Its slot is free again: a new session starts.
    start(&d, Some("quick"));
}

#[test]
fn a_killed_pycelld_leaves_no_session_behind_and_its_handles_answer_session_gone() {
    let mut d = Daemon::start("");
    let info = start(&d, None);
    let handle = info.session.clone();
    let mut c = d.client();
    // A cell running when the daemon dies.
    let running = std::thread::spawn(move || {
        let code = SessionCall::Cell {
            code: "import time\ntime.sleep(60)".into(),
        };
        c.session_call(&info.session, code, Some(120.0))
    });
    std::thread::sleep(Duration::from_millis(300));
    d.signal(nix::sys::signal::Signal::SIGKILL);
    d.wait(Duration::from_secs(10));
    d.assert_sandbox_gone(Duration::from_secs(10));
    let heard = running.join().unwrap();
    assert!(
        heard.is_err(),
        "the client must hear the daemon failed: {heard:?}"
    );
    // A new pycelld did not make the handle: it answers session_gone.
    let d2 = Daemon::start("");
    let call = SessionCall::Cell { code: "1".into() };
    let (code, message) = refused_code(d2.client().session_call(&handle, call, None));
    assert_eq!(code, ErrorCode::SessionGone, "{message}");
    assert!(message.contains("restarted"), "{message}");
}

#[test]
fn a_killed_broker_ends_its_sessions() {
    let d = Daemon::start("");
    start(&d, None);
    let broker = pycell_tests::children_of(d.pid() as u32)
        .into_iter()
        .find(|p| p.uids.iter().all(|u| *u != 0))
        .unwrap_or_else(|| panic!("no unprivileged broker under the monitor\n{}", d.log()));
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(broker.pid as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    d.assert_sandbox_gone(Duration::from_secs(15));
}

/// The pool's session jail of `policy`: its jailer pids once one is ready.
fn ready_session_pool(d: &Daemon) -> Vec<i32> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let pools = d.client().info().unwrap().daemon.warm_pools;
        if let Some(p) = pools.iter().find(|p| p.sessions && p.ready > 0) {
            return p.jailer_pids.clone();
        }
        assert!(
            Instant::now() < deadline,
            "no session jail got ready: {pools:?}\n{}",
            d.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_session_takes_a_ready_jail_of_the_session_pool() {
    let d = Daemon::start("session_pools = { default = 1 }\n");
    let before = ready_session_pool(&d);
    let info = start(&d, None);
    let mut c = d.client();
    assert_eq!(
        cell(&mut c, &info.session, "x = 6 * 7\nx")
            .reply
            .value
            .as_deref(),
        Some("42")
    );
    // The member was taken (its jailer is the session's now); the pool
    // starts another.
    let after = d.client().info().unwrap().daemon.warm_pools;
    let pool = after.iter().find(|p| p.sessions).unwrap();
    assert!(
        before.iter().all(|pid| !pool.jailer_pids.contains(pid)),
        "the pool still has its member {before:?}: {pool:?}"
    );
    // A session with other limits does not fit the pool's jail: built anew.
    let req = SessionStartRequest {
        limits: pycell_protocol::messages::LimitOverrides {
            memory_bytes: Some(256 << 20),
            ..Default::default()
        },
        ..Default::default()
    };
    let other = d.client().session_start(req, |_| {}).unwrap();
    assert_eq!(other.limits.memory.get(), 256 << 20);
    d.client().session_end(&info.session).unwrap();
    d.client().session_end(&other.session).unwrap();
}

#[test]
fn a_killed_jailer_kills_its_session_and_a_killed_client_does_not() {
    let d = Daemon::start("");
    let info = start(&d, None);
    let h = info.session.clone();
    // A client SIGKILLed in the middle of a cell: the session is its
    // uid's, not the connection's, and goes on.
    let script = d.dir.path().join("client.py");
    std::fs::write(&script, pycell_tests::daemon::RAW_CLIENT).unwrap();
    let asked = serde_json::json!({"type": "session", "id": "1", "session": h,
        "call": {"op": "cell", "code": "import time\ntime.sleep(1.5)\nslept = True"}});
    let mut client = Command::new("/usr/bin/python3")
        .arg(&script)
        .arg(d.socket())
        .arg(asked.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(500));
    client.kill().unwrap();
    client.wait().unwrap();
    let mut c = d.client();
    let a = cell(&mut c, &h, "slept");
    assert_eq!(a.reply.value.as_deref(), Some("True"), "{a:?}");
    // Its jailer SIGKILLed: the session is over, and nothing is left.
    let jailer = pycell_tests::descendants_of(d.pid() as u32)
        .into_iter()
        .find(|p| p.name == "pycell-jailer")
        .unwrap_or_else(|| panic!("no jailer under the monitor\n{}", d.log()));
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(jailer.pid as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    d.assert_sandbox_gone(Duration::from_secs(10));
    let (code, message) = refused_code(d.client().session_call(
        &h,
        SessionCall::Cell { code: "1".into() },
        None,
    ));
    assert_eq!(code, ErrorCode::SessionKilled, "{message}");
}

/// Every bound of a session call is checked by pycelld where the call
/// arrives, not only by the runner in the jail: code over 16 MiB, a cell
/// whose code is within that but over what the session's runner takes
/// once encoded (control characters are escaped six-fold), a path over
/// PATH_MAX, a file one byte over `max_file`. Each is refused, and the
/// session lives on: it answers, it is listed, it still counts against
/// `per_uid`.
#[test]
fn an_oversized_session_call_is_refused_and_the_session_lives_on() {
    let d = Daemon::start("");
    let s = start(&d, None).session;
    let mut c = d.client();
    assert!(cell(&mut c, &s, "x = 41").reply.error.is_none());
    let too_long = "#".repeat(17 << 20);
    let (code, message) =
        refused_code(c.session_call(&s, SessionCall::Cell { code: too_long }, None));
    assert_eq!(code, ErrorCode::InvalidRequest, "{message}");
    assert!(
        message.contains("code") && message.contains("16 MiB"),
        "{message}"
    );
    let escaped = format!("s = '{}'", "\u{1}".repeat(7 << 20));
    let (code, message) =
        refused_code(c.session_call(&s, SessionCall::Cell { code: escaped }, None));
    assert_eq!(code, ErrorCode::InvalidRequest, "{message}");
    assert!(message.contains("once encoded"), "{message}");
    let path = "d/".repeat(2100);
    let (code, message) = refused_code(c.session_call(&s, SessionCall::Read { path }, None));
    assert_eq!(code, ErrorCode::InvalidRequest, "{message}");
    assert!(message.contains("4096"), "{message}");
    let over = base64::engine::general_purpose::STANDARD.encode(vec![7u8; (8 << 20) + 1]);
    let write = SessionCall::Write {
        path: "big.bin".into(),
        data_base64: over,
    };
    let (code, message) = refused_code(c.session_call(&s, write, None));
    assert_eq!(code, ErrorCode::FileRefused, "{message}");
    assert!(message.contains("8388609 bytes"), "{message}");
    // Still there, with its state, and still counted.
    let a = cell(&mut c, &s, "x + 1");
    assert_eq!(a.reply.value.as_deref(), Some("42"), "{a:?}");
    let listed = c.session_list().unwrap();
    assert!(listed.iter().any(|l| l.session == s), "{listed:?}");
    let more: Vec<_> = (0..3).map(|_| start(&d, None).session).collect();
    let req = SessionStartRequest::default();
    let (code, message) = match d.client().session_start(req, |_| {}) {
        Err(ClientError::Refused { code, message }) => (code, message),
        other => panic!("a fifth session of per_uid = 4 started: {other:?}"),
    };
    assert_eq!(code, ErrorCode::TooManySessions, "{message}");
    for h in more.iter().chain([&s]) {
        c.session_end(h).unwrap();
    }
    d.assert_sandbox_gone(Duration::from_secs(10));
}

/// A cell that writes a reply frame of its own on the runner's channel
/// (the socket the runner moved off stdin), as the runner would, with the
/// token of its request (found in the runner's frame: the code can read
/// anything of its own process), as its last act: the runner's own reply
/// follows at once, often in the same read of the jailer's, or after the
/// next request has gone out.
const FORGES_REPLIES: &str = r#"
import json, os, stat, sys
def is_socket(fd):
    try:
        return stat.S_ISSOCK(os.fstat(fd).st_mode)
    except OSError:
        return False
f = sys._getframe()
while f is not None and "token" not in f.f_locals:
    f = f.f_back
frame = f.f_locals["token"] + json.dumps({"value": "666"}).encode()
channel = [fd for fd in range(3, 256) if is_socket(fd)][0]
os.write(channel, len(frame).to_bytes(4, "big") + frame)
"#;

#[test]
fn a_reply_nobody_asked_for_ends_the_session_and_shifts_no_answer() {
    let d = Daemon::start("");
    let s = start(&d, None).session;
    let mut c = d.client();
    assert!(cell(&mut c, &s, "x = 41").reply.error.is_none());
    // The forging cell's own answer is whatever it wrote (its code may
    // say anything about itself); nothing after it may be.
    let forged = c.session_call(
        &s,
        SessionCall::Cell {
            code: FORGES_REPLIES.into(),
        },
        None,
    );
    // It was sent (the code found the channel and the token).
    if let Ok(a) = &forged {
        assert!(a.reply.error.is_none(), "{a:?}");
        assert_eq!(a.reply.value.as_deref(), Some("666"), "{a:?}");
    }
    for code in ["x + 1", "x + 2"] {
        match c.session_call(&s, SessionCall::Cell { code: code.into() }, None) {
            Ok(a) => panic!("{code} was answered after a forged reply: {a:?}"),
            Err(ClientError::Refused { code: e, .. }) => {
                assert!(
                    matches!(e, ErrorCode::SessionGone | ErrorCode::SessionKilled),
                    "{code}: {e:?}"
                );
            }
            Err(e) => panic!("{code}: {e}"),
        }
    }
    d.assert_sandbox_gone(Duration::from_secs(10));
}

/// A cell's answer says what the sandbox refused that cell (the kernel's
/// counts since it began) and how it ended; the next cell starts clean.
#[test]
fn a_cells_refusals_and_end_are_its_own() {
    let d = Daemon::start("");
    let s = start(&d, None).session;
    let mut c = d.client();
    // Bounded: at most 100 forks under the default pids limit (64); the
    // children sleep until they are killed, then reaped.
    let forks = r#"
import os, signal, time
kids, refused = [], 0
for _ in range(100):
    try:
        pid = os.fork()
    except OSError:
        refused += 1
        continue
    if pid == 0:
        time.sleep(30)
        os._exit(0)
    kids.append(pid)
for pid in kids:
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
refused
"#;
    let a = cell(&mut c, &s, forks);
    let refused: u64 = a.reply.value.as_deref().unwrap_or("0").parse().unwrap();
    assert!(refused > 0, "no fork was refused: {a:?}");
    let pids: Vec<_> = a
        .refusals
        .iter()
        .filter(|r| r.layer.as_str() == "pids")
        .collect();
    assert_eq!(pids.len(), 1, "{a:?}");
    assert!(pids[0].count >= refused, "{a:?}");
    assert_eq!(pids[0].rule, "limits.pids");
    let end = a.termination.as_ref().map(|t| t.reason_str());
    assert_eq!(end.as_deref(), Some("finished"), "{a:?}");
    let a = cell(&mut c, &s, "1 / 0");
    assert!(
        a.refusals.is_empty(),
        "the last cell's refusals came along: {a:?}"
    );
    let end = a.termination.as_ref().map(|t| t.reason_str());
    assert_eq!(end.as_deref(), Some("raised"), "{a:?}");
    assert!(a
        .termination
        .as_ref()
        .unwrap()
        .detail
        .contains("ZeroDivisionError"));
    let traceback = |a: &SessionAnswer| a.reply.error.as_ref().unwrap().traceback.clone();
    assert!(!traceback(&a).contains("pycell:"), "{a:?}");
    // A refusal's exception says which layer, after the traceback.
    let a = cell(&mut c, &s, "open('/usr/lib/pycell-cell-test', 'w')");
    let last = traceback(&a).lines().last().unwrap_or_default().to_string();
    assert!(
        last.starts_with("pycell: ") && last.contains("layer landlock"),
        "{a:?}"
    );
}

#[test]
fn a_watched_cell_streams_its_output_while_it_runs() {
    let d = Daemon::start("");
    let s = start(&d, None).session;
    let mut c = d.client();
    let mut canceller = c.canceller().unwrap();
    // The cell waits until interrupted; the test interrupts it when it
    // hears the first line, which it can only do if the line comes while
    // the cell runs (else the cell's 30 s timeout ends it).
    let code = "import time\nprint('first', flush=True)\ntry:\n    time.sleep(600)\nexcept KeyboardInterrupt:\n    print('second')";
    let mut heard = Vec::new();
    let mut interrupted = false;
    let mut sink = |_stream, bytes: &[u8]| {
        heard.extend_from_slice(bytes);
        if !interrupted && heard.starts_with(b"first\n") {
            interrupted = canceller.cancel().is_ok();
        }
    };
    let call = SessionCall::Cell { code: code.into() };
    let a = c
        .session_call_watching(&s, call, None, |_| {}, Some(&mut sink))
        .unwrap();
    assert!(
        interrupted,
        "the first line was not heard while the cell ran: {heard:?}"
    );
    assert_eq!(a.stdout, "first\nsecond\n", "{a:?}");
    // All of it heard before the answer, 'second' too.
    assert_eq!(
        heard,
        b"first\nsecond\n",
        "{}",
        String::from_utf8_lossy(&heard)
    );
}

fn call(c: &mut DaemonClient, s: &str, call: SessionCall, timeout_s: Option<f64>) -> SessionAnswer {
    c.session_call(s, call.clone(), timeout_s)
        .unwrap_or_else(|e| panic!("{call:?}: {e}"))
}

#[test]
fn commands_run_in_the_jails_shell_and_end_with_their_process_group() {
    let d = Daemon::start("");
    let s = start(&d, None).session;
    let mut c = d.client();
    let command = |command: &str| SessionCall::Command {
        command: command.into(),
    };
    let a = call(&mut c, &s, command("pwd; echo err >&2; exit 3"), None);
    assert_eq!(
        (a.stdout.as_str(), a.stderr.as_str()),
        ("/workspace\n", "err\n"),
        "{a:?}"
    );
    assert_eq!(a.reply.exit_code, Some(3), "{a:?}");
    assert_eq!(
        call(&mut c, &s, command("/no/such/program"), None)
            .reply
            .exit_code,
        Some(127)
    );
    // Past the call's clock the shell and what it started are killed.
    let a = call(&mut c, &s, command("sleep 300 & sleep 300"), Some(0.5));
    assert!(a.measure.interrupted, "{a:?}");
    assert_eq!(a.reply.exit_code, Some(-9), "{a:?}");
    let left = "import os\n[open(f'/proc/{p}/cmdline').read() for p in os.listdir('/proc') if p.isdigit() and 'sleep' in open(f'/proc/{p}/cmdline').read()]";
    assert_eq!(cell(&mut c, &s, left).reply.value.as_deref(), Some("[]"));
    // Directories made (once) and trees removed, inside /workspace only.
    let make_dir = |path: &str| SessionCall::MakeDir { path: path.into() };
    let remove = |path: &str| SessionCall::Remove { path: path.into() };
    assert_eq!(
        call(&mut c, &s, make_dir("a/b"), None).reply.created,
        Some(true)
    );
    assert_eq!(
        call(&mut c, &s, make_dir("/workspace/a/b"), None)
            .reply
            .created,
        Some(false)
    );
    call(
        &mut c,
        &s,
        command("touch a/b/f && ln -s /etc a/link"),
        None,
    );
    let gone = call(&mut c, &s, remove("a"), None);
    assert_eq!(gone.reply.refused, None, "{gone:?}");
    assert_eq!(
        cell(
            &mut c,
            &s,
            "import os; os.path.exists('/workspace/a'), os.path.exists('/etc/passwd')"
        )
        .reply
        .value
        .as_deref(),
        Some("(False, True)")
    );
    for (path, why) in [
        ("a", "does not exist"),
        ("", "workspace itself"),
        ("../x", "'..'"),
    ] {
        let r = call(&mut c, &s, remove(path), None);
        assert!(
            r.reply.refused.as_deref().unwrap_or("").contains(why),
            "{path}: {r:?}"
        );
    }
}

#[test]
fn each_cell_gets_its_own_cpu_time_past_what_the_session_used() {
    let d = Daemon::start("");
    let s = start(&d, None).session;
    let mut c = d.client();
    // 2.5 s of CPU a cell, three times: more than the session's first
    // cells could once use in all (a request lowered the hard limit that
    // the next one then could not raise).
    let burn = "import time\nt = time.process_time()\nwhile time.process_time() - t < 2.5: pass\ntime.process_time()";
    for n in 1..=3 {
        let a = cell(&mut c, &s, burn);
        assert!(a.reply.error.is_none(), "cell {n}: {a:?}");
        let used: f64 = a
            .reply
            .value
            .as_deref()
            .unwrap_or("")
            .parse()
            .unwrap_or(0.0);
        assert!(used >= 2.5 * f64::from(n), "cell {n}: {a:?}");
    }
}
