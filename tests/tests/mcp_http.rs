//! `pycell mcp --http`: the MCP tools over streamable HTTP for remote
//! agents, driven by the official MCP Python SDK's HTTP client
//! (tests/mcp/sdk_http.py) against a real pycelld started here. The front
//! end starts as root and becomes an unused uid (FRONT_UID), which the
//! daemon lists in `front_end_uids`; callers authenticate with tokens made
//! by `pycell mcp-token` and with JWTs of a test issuer whose keys the
//! script makes.
//!
//! Needs root and the tools venv's python (PYCELL_TEST_TOOLS_PYTHON).

#![forbid(unsafe_code)]

use std::process::{Command, Stdio};
use std::time::Duration;

use pycell_tests::daemon::Daemon;
use pycell_tests::http::{credentials, get, make_token, start_front, text, FRONT_UID, ISSUER};
use pycell_tests::sdk::sdk_report_with;
use pycell_tests::{pycell_bin, require_root};
use serde_json::Value;

const GUARD: Duration = Duration::from_secs(240);

fn daemon_for_front_ends() -> Daemon {
    Daemon::start(&format!(
        "socket_mode = \"0666\"\nallowed_uids = [{FRONT_UID}]\nfront_end_uids = [{FRONT_UID}]\n"
    ))
}

/// A pycelld, credentials in a directory, and a front end for the daemon
/// with the tokens file and `files` (flag, file in the directory) more.
struct Setup {
    daemon: Daemon,
    dir: tempfile::TempDir,
    tokens: serde_json::Map<String, Value>,
    front: pycell_tests::http::Served,
}

fn set_up(files: &[(&str, &str)]) -> Setup {
    require_root();
    let daemon = daemon_for_front_ends();
    let dir = tempfile::tempdir().unwrap();
    let tokens = credentials(dir.path());
    let p = |f: &str| dir.path().join(f).to_string_lossy().to_string();
    let mut args = vec![
        "--socket".to_string(),
        daemon.socket().to_string_lossy().to_string(),
        "--tokens".into(),
        p("tokens.toml"),
        // A run still going after 2 s becomes a task (for clients of tasks).
        "--hand-off-after".into(),
        "2".into(),
    ];
    for (flag, file) in files {
        args.extend([flag.to_string(), p(file)]);
    }
    let front = start_front(&args.iter().map(String::as_str).collect::<Vec<_>>());
    Setup {
        daemon,
        dir,
        tokens,
        front,
    }
}

#[test]
fn remote_callers_are_authenticated_limited_and_kept_apart() {
    let Setup {
        daemon,
        dir,
        tokens,
        front,
    } = set_up(&[("--oauth", "oauth.toml")]);
    let keys = dir.path().to_str().unwrap();
    let tokens = Value::Object(tokens).to_string();
    let r = sdk_report_with(
        "sdk_http.py",
        &[
            "check", "--url", &front.at, "--keys", keys, "--issuer", ISSUER, "--tokens", &tokens,
        ],
        GUARD,
    );
    let show = || serde_json::to_string_pretty(&r).unwrap();
    let meta = format!(
        "resource_metadata=\"{}",
        front
            .at
            .replace("/mcp", "/.well-known/oauth-protected-resource/mcp")
    );

    // Refusals: 401 with the challenge RFC 6750 and RFC 9728 describe.
    assert_eq!(get(&r, "/no_token/status"), 401, "{}", show());
    let challenge = text(&r, "/no_token/www_authenticate");
    assert!(
        challenge.starts_with("Bearer ")
            && challenge.contains(&meta)
            && !challenge.contains("error="),
        "{challenge}"
    );
    for (step, why) in [
        ("wrong_token", "not valid here"),
        ("jwt_expired", "expired"),
        ("jwt_wrong_audience", "another audience"),
        ("jwt_wrong_issuer", "another issuer"),
        ("jwt_wrong_key", "signature does not verify"),
    ] {
        assert_eq!(
            get(&r, &format!("/{step}/status")),
            401,
            "{step}: {}",
            show()
        );
        let c = text(&r, &format!("/{step}/www_authenticate"));
        assert!(
            c.contains("error=\"invalid_token\"") && c.contains(why) && c.contains(&meta),
            "{step}: {c}"
        );
    }
    assert_eq!(get(&r, "/metadata/status"), 200, "{}", show());
    assert_eq!(
        get(&r, "/metadata/json/resource").as_str(),
        Some(front.at.as_str())
    );
    assert_eq!(
        get(&r, "/metadata/json/authorization_servers/0").as_str(),
        Some(ISSUER)
    );
    assert_eq!(get(&r, "/metadata/healthz"), 200);
    // A Host that is not this server's (DNS rebinding), and GET (no
    // protocol sessions, so no stream to resume).
    assert_eq!(get(&r, "/rebinding/status"), 403, "{}", show());
    assert_eq!(get(&r, "/get/status"), 405, "{}", show());

    // A token's caller runs code and owns a session (handshake era).
    assert_eq!(get(&r, "/alice/run/is_error"), false, "{}", show());
    assert!(text(&r, "/alice/run/text").contains("42"), "{}", show());
    let handle = text(&r, "/alice/handle");
    assert!(handle.starts_with("s-"), "{}", show());
    assert!(text(&r, "/alice/list/text").contains(&handle), "{}", show());
    // Both eras: alice and bob by the initialize handshake, carol by the
    // 2026-07-28 per-request envelope (no protocol session either way).
    assert_eq!(
        text(&r, "/alice/protocol_version"),
        "2025-11-25",
        "{}",
        show()
    );
    assert_eq!(
        text(&r, "/bob/protocol_version"),
        "2025-11-25",
        "{}",
        show()
    );
    assert_eq!(
        text(&r, "/carol/protocol_version"),
        "2026-07-28",
        "{}",
        show()
    );
    // Another token's caller, and an OAuth caller (2026-07-28), cannot
    // use it, nor see it; they run their own code.
    for who in ["bob", "carol"] {
        for op in ["cell", "read", "end"] {
            assert_eq!(
                get(&r, &format!("/{who}/{op}/is_error")),
                true,
                "{who} {op}: {}",
                show()
            );
            assert!(
                text(&r, &format!("/{who}/{op}/text")).contains("there is no session"),
                "{who} {op}: {}",
                show()
            );
        }
        assert!(
            !text(&r, &format!("/{who}/list/text")).contains(&handle),
            "{who}: {}",
            show()
        );
        assert!(
            text(&r, &format!("/{who}/own_run/text")).contains("mine"),
            "{who}: {}",
            show()
        );
    }
    // ... while its owner's state is intact, on a new connection.
    assert!(
        text(&r, "/alice_again/value/text").contains("42"),
        "{}",
        show()
    );
    assert_eq!(get(&r, "/alice_again/end/is_error"), false, "{}", show());

    // Without the run scope: 403 insufficient_scope; sandbox_info works.
    assert_eq!(get(&r, "/viewer/run_raw/status"), 403, "{}", show());
    let c = text(&r, "/viewer/run_raw/www_authenticate");
    assert!(
        c.contains("error=\"insufficient_scope\"") && c.contains("scope=\"pycell:run\""),
        "{c}"
    );
    assert_eq!(get(&r, "/viewer/info/is_error"), false, "{}", show());
    assert!(get(&r, "/viewer/run/exception").is_string(), "{}", show());

    // One run at once, three a minute, for `limited`.
    let concurrent = get(&r, "/limited/concurrent")
        .as_array()
        .cloned()
        .unwrap_or_default();
    let refused: Vec<_> = concurrent
        .iter()
        .filter(|c| c["is_error"] == true)
        .collect();
    assert_eq!(refused.len(), 1, "{}", show());
    assert!(
        refused[0]["text"]
            .as_str()
            .unwrap()
            .contains("max_concurrent_runs = 1"),
        "{}",
        show()
    );
    let sequential = get(&r, "/limited/sequential")
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert!(
        sequential.iter().any(|c| c["text"]
            .as_str()
            .unwrap_or("")
            .contains("runs_per_minute = 3")),
        "{}",
        show()
    );

    // A task is its caller's: another caller gets "no task" for its id.
    assert_eq!(text(&r, "/tasks/kind"), "TaskCreated", "{}", show());
    for step in ["get", "cancel"] {
        let refused = get(&r, &format!("/tasks/stranger_{step}"));
        assert_eq!(refused["code"], -32602, "{step}: {}", show());
        assert!(
            refused["message"]
                .as_str()
                .unwrap_or("")
                .contains("no task"),
            "{step}: {}",
            show()
        );
    }
    assert_eq!(text(&r, "/tasks/final_status"), "completed", "{}", show());
    assert_eq!(text(&r, "/tasks/stdout"), "started\ndone\n", "{}", show());

    // pycelld ran them as the identities, and says so.
    let audit = daemon.audit();
    for identity in [
        "\"identity\":\"alice\"",
        "\"identity\":\"bob\"",
        "\"identity\":\"oauth:carol\"",
    ] {
        assert!(
            audit.contains(identity),
            "{identity} not in the audit log:\n{audit}"
        );
    }
}

#[test]
fn https_by_rustls_and_nothing_in_clear() {
    let s = set_up(&[("--tls-cert", "tls-cert.pem"), ("--tls-key", "tls-key.pem")]);
    let (front, tokens) = (&s.front, &s.tokens);
    let p = |f: &str| s.dir.path().join(f).to_str().unwrap().to_string();
    assert!(front.at.starts_with("https://127.0.0.1:"), "{}", front.at);
    let token = tokens["alice"].as_str().unwrap();
    let r = sdk_report_with(
        "sdk_http.py",
        &[
            "tls",
            "--url",
            &front.at,
            "--keys",
            &p(""),
            "--token",
            token,
        ],
        GUARD,
    );
    let show = || serde_json::to_string_pretty(&r).unwrap();
    assert_eq!(get(&r, "/tls_run/is_error"), false, "{}", show());
    assert!(text(&r, "/tls_run/text").contains("over tls"), "{}", show());
    assert_eq!(get(&r, "/tls_unverified/refused"), true, "{}", show());
    assert!(get(&r, "/tls_plain/exception").is_string(), "{}", show());
}

/// `pycell mcp --http ARGS` that must refuse to start: its exit status and stderr.
fn refused(args: &[&str]) -> String {
    let out = Command::new(pycell_bin())
        .args(["mcp", "--http"])
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
    err
}

#[test]
fn what_cannot_be_served_safely_is_refused_at_start() {
    require_root();
    let dir = tempfile::tempdir().unwrap();
    let (_, entry) = make_token("alice", &[]);
    let tokens = dir.path().join("tokens.toml");
    std::fs::write(&tokens, &entry).unwrap();
    let tokens = tokens.to_str().unwrap();
    let user = FRONT_UID.to_string();
    let e = refused(&["127.0.0.1:0", "--tokens", tokens]);
    assert!(e.contains("does not run as root: give --user"), "{e}");
    let e = refused(&["0.0.0.0:0", "--no-auth", "--user", &user]);
    assert!(e.contains("only a loopback address"), "{e}");
    let e = refused(&["127.0.0.1:0", "--user", &user]);
    assert!(e.contains("say how callers authenticate"), "{e}");
    let e = refused(&[
        "0.0.0.0:0",
        "--tokens",
        tokens,
        "--user",
        &user,
        "--public-url",
        "https://pycell.example.net/mcp",
    ]);
    assert!(e.contains("in clear"), "{e}");
    let e = refused(&[
        "0.0.0.0:0",
        "--tokens",
        tokens,
        "--user",
        &user,
        "--behind-proxy",
    ]);
    assert!(e.contains("--public-url"), "{e}");
    let e = refused(&["127.0.0.1:0", "--tokens", tokens, "--user", "0"]);
    assert!(e.contains("that is root"), "{e}");
    std::fs::write(
        dir.path().join("bad.toml"),
        "[[token]]\nname = \"x\"\nsha256 = \"zz\"\n",
    )
    .unwrap();
    let bad = dir.path().join("bad.toml");
    let e = refused(&[
        "127.0.0.1:0",
        "--tokens",
        bad.to_str().unwrap(),
        "--user",
        &user,
    ]);
    assert!(e.contains("bad.toml: token 1 (\"x\"): sha256"), "{e}");
    // A pycelld that does not list the uid in front_end_uids.
    let daemon = Daemon::start(&format!(
        "socket_mode = \"0666\"\nallowed_uids = [{FRONT_UID}]\n"
    ));
    let socket = daemon.socket();
    let e = refused(&[
        "127.0.0.1:0",
        "--tokens",
        tokens,
        "--user",
        &user,
        "--socket",
        socket.to_str().unwrap(),
    ]);
    assert!(
        e.contains("refuses this front end") && e.contains("front_end_uids"),
        "{e}"
    );
}

#[test]
fn only_a_trusted_front_end_may_name_an_identity() {
    require_root();
    let daemon = daemon_for_front_ends();
    // Root is no front end (a front end never runs as root).
    let e = pycell_protocol::client::DaemonClient::connect_as(&daemon.socket(), Some("alice"))
        .expect_err("root may not speak for an identity");
    assert!(e.to_string().contains("only trusted front ends may"), "{e}");
    // Without an identity, the same connection is fine.
    assert!(pycell_protocol::client::DaemonClient::connect(&daemon.socket()).is_ok());
}

/// One HTTP/1.1 POST of `body` to the front end at `url` (plain HTTP on
/// loopback) with `headers`; the status and the body of the answer.
fn post(url: &str, headers: &[(&str, &str)], body: &[u8]) -> (u16, String) {
    use std::io::{Read, Write};
    let rest = url.strip_prefix("http://").expect("a plain http URL");
    let (authority, path) = rest.split_once('/').expect("a path");
    let mut s = std::net::TcpStream::connect(authority).expect("connect to the front end");
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let mut head = format!(
        "POST /{path} HTTP/1.1\r\nHost: {authority}\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\nContent-Length: {}\r\nConnection: close\r\n",
        body.len()
    );
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    s.write_all(head.as_bytes()).unwrap();
    // The front end may answer (and close) before it has read it all.
    let _ = s.write_all(body);
    let mut answer = Vec::new();
    let _ = s.read_to_end(&mut answer);
    let answer = String::from_utf8_lossy(&answer).into_owned();
    let status = answer
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("no HTTP answer: {answer:?}"));
    (status, answer)
}

/// The front end's peak resident memory, in KiB.
fn peak_rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .expect("VmHWM")
}

const TOOLS_LIST: &str = r#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#;

#[test]
fn idle_half_sent_foreign_or_oversized_requests_never_lock_callers_out() {
    let Setup { front, tokens, .. } = set_up(&[]);
    let bearer = |name: &str| format!("Bearer {}", tokens[name].as_str().unwrap());
    let alice = bearer("alice");
    let authorized = [("Authorization", alice.as_str())];
    let (status, answer) = post(&front.at, &authorized, TOOLS_LIST.as_bytes());
    assert_eq!(status, 200, "{answer}");

    // 600 connections that say nothing or half a request head, more than
    // the front end serves at once: callers still get in at once.
    let authority = front.at["http://".len()..]
        .split('/')
        .next()
        .unwrap()
        .to_string();
    let mut idle = Vec::new();
    for i in 0..600 {
        use std::io::Write;
        let mut s = std::net::TcpStream::connect(&authority).expect("connect");
        if i % 2 == 1 {
            let _ = s.write_all(b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\n");
        }
        idle.push(s);
    }
    let (status, answer) = post(&front.at, &authorized, TOOLS_LIST.as_bytes());
    assert_eq!(
        status, 200,
        "a caller was locked out by idle connections: {answer}"
    );
    // And they do not stay: the front end closes every one of them.
    let deadline = std::time::Instant::now() + Duration::from_secs(90);
    for mut s in idle {
        use std::io::Read;
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        s.set_read_timeout(Some(left.max(Duration::from_millis(1))))
            .unwrap();
        let mut buf = [0u8; 64];
        let closed = matches!(s.read(&mut buf), Ok(0))
            || matches!(s.read(&mut buf), Err(ref e) if e.kind() == std::io::ErrorKind::ConnectionReset);
        assert!(closed, "an idle connection was still open after 90 s");
    }

    // A page of another site may not call it (DNS rebinding).
    let foreign = [
        ("Authorization", alice.as_str()),
        ("Origin", "https://evil.example.org"),
    ];
    let (status, answer) = post(&front.at, &foreign, TOOLS_LIST.as_bytes());
    assert_eq!(status, 403, "{answer}");
    assert!(answer.contains("Origin"), "{answer}");
    let own = format!("http://{authority}");
    let same = [("Authorization", alice.as_str()), ("Origin", own.as_str())];
    assert_eq!(post(&front.at, &same, TOOLS_LIST.as_bytes()).0, 200);

    // 30 MB of small values, from a token that may not even run code:
    // refused before any tree of it is built.
    let before = peak_rss_kib(front.child.id());
    let zeros = vec!["0"; 15 << 20].join(",");
    let big =
        format!(r#"{{"jsonrpc":"2.0","id":2,"method":"tools/list","params":{{"x":[{zeros}]}}}}"#);
    let viewer = bearer("viewer");
    let (status, answer) = post(&front.at, &[("Authorization", &viewer)], big.as_bytes());
    assert_eq!(status, 400, "{}", &answer[..answer.len().min(400)]);
    assert!(
        answer.contains("JSON values"),
        "{}",
        &answer[..answer.len().min(400)]
    );
    let grown = peak_rss_kib(front.child.id()).saturating_sub(before);
    assert!(
        grown < 200 << 10,
        "the front end grew by {grown} KiB for one 30 MB request"
    );
}

#[test]
fn a_caller_names_only_the_policies_its_token_was_given() {
    let Setup {
        front,
        tokens,
        daemon: _daemon,
        ..
    } = set_up(&[]);
    let alice = format!("Bearer {}", tokens["alice"].as_str().unwrap());
    let call = |tool: &str, args: &str| {
        let body = format!(
            r#"{{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{{"name":"{tool}","arguments":{args}}}}}"#
        );
        let (status, answer) = post(&front.at, &[("Authorization", &alice)], body.as_bytes());
        assert_eq!(status, 200, "{answer}");
        answer
    };
    // mcp-server's 24 h clocks, or another policy alice's token does not
    // name: refused, saying what she may use; default: runs.
    for (tool, args) in [
        ("run_python", r#"{"code":"print(1)","policy":"mcp-server"}"#),
        ("session_start", r#"{"policy":"network"}"#),
    ] {
        let answer = call(tool, args);
        assert!(
            answer.contains("\"isError\":true")
                && answer.contains("is not one this caller may use (it may use: default)"),
            "{tool}: {answer}"
        );
    }
    let answer = call("run_python", r#"{"code":"print(6 * 7)"}"#);
    assert!(answer.contains("42"), "{answer}");
}

/// The error object of a JSON-RPC answer in `answer` (an HTTP response or
/// a line): its id and code.
fn error_of(answer: &str) -> (Value, i64) {
    let start = answer
        .find('{')
        .unwrap_or_else(|| panic!("no JSON in {answer:?}"));
    let v: Value = serde_json::Deserializer::from_str(&answer[start..])
        .into_iter()
        .next()
        .and_then(Result::ok)
        .unwrap_or_else(|| panic!("no JSON in {answer:?}"));
    let obj = v.as_object().unwrap_or_else(|| panic!("{v}"));
    assert!(obj.contains_key("id"), "an error without id: {v}");
    (
        v["id"].clone(),
        v["error"]["code"].as_i64().unwrap_or_else(|| panic!("{v}")),
    )
}

#[test]
fn every_malformed_message_gets_a_json_rpc_error_over_http_and_stdio() {
    let Setup { front, tokens, .. } = set_up(&[]);
    let alice = format!("Bearer {}", tokens["alice"].as_str().unwrap());
    let bad_params = r#"{"jsonrpc":"2.0","id":8,"method":"tools/call","params":{"name":5}}"#;
    let cases: [(&str, u16, Value, i64); 3] = [
        ("this is not json", 400, Value::Null, -32700),
        (
            r#"{"jsonrpc":"2.0","id":7,"method":5}"#,
            400,
            7.into(),
            -32600,
        ),
        (bad_params, 200, 8.into(), -32602),
    ];
    for (body, status, id, code) in &cases {
        let (got, answer) = post(&front.at, &[("Authorization", &alice)], body.as_bytes());
        assert_eq!(got, *status, "{body}: {answer}");
        assert_eq!(error_of(&answer), (id.clone(), *code), "{body}: {answer}");
    }

    // Over stdio, the same, and a message over 32 MiB answered to its id.
    let mut mcp = Command::new(pycell_bin())
        .args(["mcp", "--embedded"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = mcp.stdin.take().unwrap();
    let huge = format!(
        r#"{{"jsonrpc":"2.0","id":9,"method":"tools/call","params":{{"name":"run_python","arguments":{{"code":"{}"}}}}}}"#,
        "#".repeat(33 << 20)
    );
    let lines: Vec<String> = cases.iter().map(|c| c.0.to_string()).collect();
    let writer = std::thread::spawn(move || {
        use std::io::Write;
        for line in &lines {
            writeln!(stdin, "{line}").unwrap();
        }
        writeln!(stdin, "{huge}").unwrap();
        // The end of input ends the server once it has answered.
        drop(stdin);
    });
    let out = pycell_tests::output_guarded(mcp, GUARD);
    writer.join().unwrap();
    assert!(
        out.status.is_some(),
        "pycell mcp did not end: {}",
        out.stderr
    );
    // Answers may come in any order (JSON-RPC pairs them by id).
    let mut answers: Vec<(Value, i64)> = out.stdout.lines().map(error_of).collect();
    let mut want: Vec<(Value, i64)> = cases.iter().map(|(_, _, id, c)| (id.clone(), *c)).collect();
    want.push((9.into(), -32600));
    answers.sort_by_key(|(id, code)| (id.to_string(), *code));
    want.sort_by_key(|(id, code)| (id.to_string(), *code));
    assert_eq!(answers, want, "stderr: {}", out.stderr);
}

#[test]
fn a_callers_cancel_notification_stops_its_own_call_and_no_one_elses() {
    let Setup {
        front,
        tokens,
        daemon,
        ..
    } = set_up(&[]);
    let bearer = |name: &str| format!("Bearer {}", tokens[name].as_str().unwrap());
    let (alice, bob) = (bearer("alice"), bearer("bob"));
    let at = front.at.clone();
    let long = r#"{"jsonrpc":"2.0","id":"long-1","method":"tools/call","params":{"name":"run_python","arguments":{"code":"import time\ntime.sleep(600)","timeout_s":600}}}"#;
    let alice_call = alice.clone();
    let call =
        std::thread::spawn(move || post(&at, &[("Authorization", &alice_call)], long.as_bytes()));
    daemon.wait_for_runs(1, None, GUARD);
    let cancel = br#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":"long-1","reason":"test"}}"#;
    // Bob's cancel of the same id is his own business: alice's run goes on.
    let (status, answer) = post(&front.at, &[("Authorization", &bob)], cancel);
    assert_eq!(status, 202, "{answer}");
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(daemon.client().info().unwrap().daemon.active_runs, 1);
    assert!(!call.is_finished());
    let (status, answer) = post(&front.at, &[("Authorization", &alice)], cancel);
    assert_eq!(status, 202, "{answer}");
    // Her run ends long before its 600 s: the sandbox is gone.
    daemon.wait_for_runs(0, None, GUARD);
    let (status, _) = call.join().unwrap();
    assert!(
        status == 200 || status == 202 || status == 204,
        "status {status}"
    );
}
