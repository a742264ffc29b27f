//! The `allowlist` network mode end to end: real jails whose only way out is
//! pycell's egress proxy, against servers the test starts on loopback in a
//! network (and mount) namespace of its own, where `tls.example.net` and
//! `plain.example.net` resolve to 127.0.0.1 through a bind-mounted
//! /etc/hosts. Nothing here can reach any other address: the namespace has
//! only loopback.

#![forbid(unsafe_code)]

use std::ffi::OsString;
use std::fs;
use std::io::{BufRead, BufReader};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use pycell_tests::{
    as_test_daemon, output_guarded, pycell_bin, pycelld_bin, repo_root, require_root,
};
use serde_json::Value;

/// The namespace with the test servers (tests/egress/servers.py).
struct TestNet {
    servers: Child,
    dir: tempfile::TempDir,
    ca: String,
}

fn run(cmd: &mut Command) {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A test CA and a certificate for tls.example.net signed by it.
fn make_certificates(dir: &Path) {
    let openssl = |args: &[&str]| run(Command::new("openssl").args(args).current_dir(dir));
    openssl(&[
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "ca.key",
        "-out",
        "ca.pem",
        "-days",
        "3",
        "-subj",
        "/CN=pycell test CA",
    ]);
    openssl(&[
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "server.key",
        "-out",
        "server.csr",
        "-subj",
        "/CN=tls.example.net",
    ]);
    fs::write(dir.join("ext.cnf"), "subjectAltName=DNS:tls.example.net\n").unwrap();
    openssl(&[
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca.pem",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-out",
        "server.pem",
        "-days",
        "3",
        "-extfile",
        "ext.cnf",
    ]);
}

impl TestNet {
    fn start() -> TestNet {
        require_root();
        let dir = tempfile::Builder::new()
            .prefix("pycell-egress-")
            .tempdir()
            .unwrap();
        make_certificates(dir.path());
        fs::write(
            dir.path().join("hosts"),
            "127.0.0.1 localhost tls.example.net plain.example.net\n::1 localhost\n",
        )
        .unwrap();
        let p = |name: &str| dir.path().join(name);
        let mut servers = Command::new("unshare")
            .args([
                "--net",
                "--mount",
                "--propagation",
                "private",
                "--",
                "sh",
                "-c",
            ])
            .arg("ip link set lo up && ip addr add 198.51.100.20/32 dev lo && mount --bind \"$0\" /etc/hosts && exec python3 \"$@\"")
            .arg(p("hosts"))
            .arg(repo_root().join("tests/egress/servers.py"))
            .args([
                p("server.pem"),
                p("server.key"),
                p("dns.log"),
                p("requests.log"),
            ])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("unshare");
        let mut line = String::new();
        BufReader::new(servers.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert_eq!(line.trim(), "ready", "the test servers did not start");
        let ca = fs::read_to_string(p("ca.pem")).unwrap();
        TestNet { servers, dir, ca }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// `command` in the servers' network and mount namespaces.
    fn inside(&self, program: &Path) -> Command {
        let mut cmd = Command::new("nsenter");
        cmd.arg(format!("--target={}", self.servers.id()))
            .args(["--net", "--mount", "--"])
            .arg(program);
        cmd
    }

    /// `pycell run --json` of `code` under `policy` (a file's text), in the
    /// namespace, with `args` before the script.
    fn pycell(&self, policy: &str, code: &str, args: &[&str]) -> Value {
        let file = self.path(&format!("{}.toml", policy_name(policy)));
        fs::write(&file, policy).unwrap();
        let mut all: Vec<OsString> = args.iter().map(OsString::from).collect();
        all.extend(["--policy".into(), file.into_os_string()]);
        self.pycell_with(&all, code)
    }

    /// `pycell run --json ARGS main.py` of `code` (its `@CA@` replaced by
    /// the test CA), in the namespace.
    fn pycell_with(&self, args: &[OsString], code: &str) -> Value {
        fs::write(self.path("main.py"), code.replace("@CA@", &self.ca)).unwrap();
        let child = self
            .inside(&pycell_bin())
            .args(["run", "--json"])
            .args(args)
            .arg(self.path("main.py"))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let out = output_guarded(child, Duration::from_secs(120));
        serde_json::from_str(&out.stdout)
            .unwrap_or_else(|e| panic!("{e}: stdout {:?} stderr {:?}", out.stdout, out.stderr))
    }

    fn dns_queries(&self) -> String {
        fs::read_to_string(self.path("dns.log")).unwrap_or_default()
    }

    /// The requests that reached the test servers: "METHOD PATH BODY-LENGTH".
    fn requests_served(&self) -> Vec<String> {
        let log = fs::read_to_string(self.path("requests.log")).unwrap_or_default();
        log.lines().map(str::to_string).collect()
    }
}

impl Drop for TestNet {
    fn drop(&mut self) {
        drop(self.servers.stdin.take());
        let _ = self.servers.kill();
        let _ = self.servers.wait();
    }
}

fn policy_name(policy: &str) -> String {
    let line = policy.lines().find(|l| l.starts_with("name = ")).unwrap();
    line.trim_start_matches("name = ")
        .trim_matches('"')
        .to_string()
}

/// policies/network.toml named `name`, allowing `allow`, with `edits`
/// (whole lines, replacing the line that starts with their key).
fn policy(name: &str, allow: &[&str], edits: &[&str]) -> String {
    let mut text = fs::read_to_string(repo_root().join("policies/network.toml")).unwrap();
    let allow: Vec<String> = allow.iter().map(|a| format!("{a:?}")).collect();
    let mut lines = vec![
        format!("name = {name:?}"),
        format!("allow = [{}]", allow.join(", ")),
    ];
    lines.extend(edits.iter().map(|e| e.to_string()));
    for line in lines {
        let key = line.split(" = ").next().unwrap().to_string();
        let old = text
            .lines()
            .find(|l| l.starts_with(&format!("{key} = ")))
            .unwrap_or_else(|| panic!("policies/network.toml has no line {key} = ..."))
            .to_string();
        text = text.replacen(&old, &line, 1);
    }
    text
}

/// The same with the test venv (numpy, requests, httpx) as interpreter.
fn venv_policy(name: &str, allow: &[&str]) -> String {
    let venv = std::env::var("PYCELL_TEST_NUMPY_VENV").expect(
        "PYCELL_TEST_NUMPY_VENV is not set: run the tests through scripts/test, which builds the test venv",
    );
    policy(name, allow, &[]).replacen(
        "python = \"/usr/bin/python3\"",
        &format!("venv = {venv:?}"),
        1,
    )
}

fn stdout(r: &Value) -> &str {
    r["stdout"].as_str().unwrap_or_default()
}

fn assert_ok(r: &Value) {
    assert_eq!(r["status"], "ok", "{r:#}");
}

/// The run's `network.allowed` as host:port strings.
fn allowed(r: &Value) -> Vec<String> {
    r["network"]["allowed"]
        .as_array()
        .unwrap_or_else(|| panic!("no network report: {r:#}"))
        .iter()
        .map(|a| format!("{}:{}", a["host"].as_str().unwrap(), a["port"]))
        .collect()
}

/// The run's `network.denied` as host:port:reason strings.
fn denied(r: &Value) -> Vec<String> {
    r["network"]["denied"]
        .as_array()
        .unwrap_or_else(|| panic!("no network report: {r:#}"))
        .iter()
        .map(|a| {
            format!(
                "{}:{}:{}",
                a["host"].as_str().unwrap(),
                a["port"],
                a["reason"].as_str().unwrap()
            )
        })
        .collect()
}

/// What the test servers are reachable as, under rules that name their
/// names and (because those resolve to loopback) their address.
const SERVERS: &[&str] = &[
    "tls.example.net:8443",
    "http://plain.example.net:8099",
    "127.0.0.1:8443",
    "http://127.0.0.1:8099",
];

const URLLIB: &str = r#"
import os, ssl, urllib.request
open("/workspace/ca.pem", "w").write("""@CA@""")
ctx = ssl.create_default_context(cafile="/workspace/ca.pem")
print(urllib.request.urlopen("http://plain.example.net:8099/hello", timeout=10).read().decode())
print(urllib.request.urlopen("https://tls.example.net:8443/hello", timeout=10, context=ctx).read().decode())
print(os.environ["HTTPS_PROXY"], os.environ["no_proxy"] == "")
"#;

#[test]
fn an_allowed_host_is_reached_with_urllib_over_plain_http_and_over_connect_with_tls() {
    let net = TestNet::start();
    let r = net.pycell(
        &policy("egress-urllib", SERVERS, &[]),
        URLLIB,
        &["--embedded"],
    );
    assert_ok(&r);
    assert_eq!(
        stdout(&r),
        "hello from the test server\nhello from the test server\nhttp://127.0.0.1:3128 True\n"
    );
    let mut hosts = allowed(&r);
    hosts.sort();
    assert_eq!(hosts, ["plain.example.net:8099", "tls.example.net:8443"]);
    assert!(r["network"]["bytes_in"].as_u64().unwrap() > 100, "{r:#}");
    assert!(denied(&r).is_empty(), "{r:#}");
    assert_eq!(
        r["layers"]["landlock"]["tcp_connect_only_to"], 3128,
        "{r:#}"
    );
}

#[test]
fn requests_and_httpx_from_a_venv_go_through_the_proxy() {
    let net = TestNet::start();
    let code = r#"
import httpx, requests
open("/workspace/ca.pem", "w").write("""@CA@""")
print(requests.get("https://tls.example.net:8443/hello", verify="/workspace/ca.pem", timeout=10).text)
print(httpx.get("https://tls.example.net:8443/hello", verify="/workspace/ca.pem", timeout=10).text)
print(httpx.get("http://plain.example.net:8099/hello", timeout=10).text)
try:
    requests.get("https://denied.example.net/", timeout=10)
except requests.exceptions.ProxyError as e:
    print("requests:", "403 pycell egress proxy: CONNECT denied.example.net:443 denied" in str(e))
"#;
    let r = net.pycell(
        &venv_policy("egress-clients", SERVERS),
        code,
        &["--embedded"],
    );
    assert_ok(&r);
    assert_eq!(
        stdout(&r),
        "hello from the test server\nhello from the test server\nhello from the test server\nrequests: True\n"
    );
    assert_eq!(allowed(&r).len(), 2, "{r:#}");
    assert_eq!(denied(&r), ["denied.example.net:443:not_allowlisted"]);
    let refused = pycell_tests::refusal(&r, "egress", "network.allow");
    assert_eq!(
        refused["object"],
        "denied.example.net:443 (not_allowlisted)"
    );
}

#[test]
fn a_denied_host_gets_a_403_line_that_says_why_and_what_is_allowed() {
    let net = TestNet::start();
    let code = r#"
import urllib.request
for url in ["https://other.example.net/", "http://tls.example.net:8443/", "https://127.0.0.1:8099/"]:
    try:
        urllib.request.urlopen(url, timeout=10)
    except Exception as e:
        print(e)
"#;
    let r = net.pycell(
        &policy(
            "egress-denied",
            &["tls.example.net:8443", "127.0.0.1:8443"],
            &["deny = [\"127.0.0.1:8099\"]"],
        ),
        code,
        &["--embedded"],
    );
    assert_ok(&r);
    let lines: Vec<&str> = stdout(&r).lines().collect();
    assert_eq!(
        lines[0],
        "<urlopen error Tunnel connection failed: 403 pycell egress proxy: CONNECT other.example.net:443 denied by network policy \"egress-denied\": not on the allowlist. Allowed: tls.example.net:8443, 127.0.0.1:8443>"
    );
    assert!(lines[1].starts_with("HTTP Error 403: pycell egress proxy: plain HTTP to tls.example.net:8443 denied by network policy \"egress-denied\": plain HTTP is not allowed for this host: use https://"), "{}", lines[1]);
    assert!(lines[2].contains("CONNECT 127.0.0.1:8099 denied by network policy \"egress-denied\": deny rule \"127.0.0.1:8099\" matches it"), "{}", lines[2]);
    let mut d = denied(&r);
    d.sort();
    assert_eq!(
        d,
        [
            "127.0.0.1:8099:denied_by_rule",
            "other.example.net:443:not_allowlisted",
            "tls.example.net:8443:plain_http_not_allowed",
        ]
    );
    assert!(allowed(&r).is_empty());
}

#[test]
fn the_jail_has_no_route_and_no_resolver_only_the_proxy() {
    let net = TestNet::start();
    let code = r#"
import errno, socket
def attempt(what, f):
    try:
        f()
        print(what, "succeeded")
    except OSError as e:
        print(what, "failed", errno.errorcode.get(e.errno, e.errno) if e.errno else type(e).__name__)
attempt("dns", lambda: socket.getaddrinfo("tls.example.net", 443))
attempt("tcp 127.0.0.1:8099", lambda: socket.create_connection(("127.0.0.1", 8099), timeout=5))
attempt("tcp 192.0.2.1:443", lambda: socket.create_connection(("192.0.2.1", 443), timeout=5))
def udp(addr):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.settimeout(2)
    s.sendto(b"\x12\x34\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00\x03tls\x07example\x03net\x00\x00\x01\x00\x01", addr)
    s.recvfrom(512)
attempt("udp 127.0.0.1:53", lambda: udp(("127.0.0.1", 53)))
attempt("udp 192.0.2.1:53", lambda: udp(("192.0.2.1", 53)))
attempt("proxy", lambda: socket.create_connection(("127.0.0.1", 3128), timeout=5).close())
"#;
    let r = net.pycell(&policy("egress-route", SERVERS, &[]), code, &["--embedded"]);
    assert_ok(&r);
    let out = stdout(&r);
    let lines: Vec<&str> = out.lines().collect();
    assert!(lines[0].starts_with("dns failed"), "{out}");
    // Landlock (ABI 4+) refuses TCP connects but to the proxy's port; on
    // older kernels the empty namespace refuses them.
    for (i, what) in [(1, "tcp 127.0.0.1:8099"), (2, "tcp 192.0.2.1:443")] {
        assert!(
            ["EACCES", "ECONNREFUSED", "ENETUNREACH"]
                .iter()
                .any(|e| lines[i] == format!("{what} failed {e}")),
            "{out}"
        );
    }
    // UDP is not Landlock's: the namespace itself has nowhere to send it.
    assert_eq!(lines[3], "udp 127.0.0.1:53 failed TimeoutError", "{out}");
    assert_eq!(lines[4], "udp 192.0.2.1:53 failed ENETUNREACH", "{out}");
    assert_eq!(lines[5], "proxy succeeded", "{out}");
    assert_eq!(
        net.dns_queries(),
        "",
        "a datagram from the jail reached the host's loopback"
    );
}

#[test]
fn a_name_that_resolves_to_loopback_is_refused_without_an_address_rule() {
    let net = TestNet::start();
    let code = r#"
import urllib.request
try:
    urllib.request.urlopen("https://tls.example.net:8443/hello", timeout=10)
except Exception as e:
    print(e)
"#;
    let r = net.pycell(
        &policy("egress-rebind", &["tls.example.net:8443"], &[]),
        code,
        &["--embedded"],
    );
    assert_ok(&r);
    assert!(
        stdout(&r).contains("it resolves to 127.0.0.1, a loopback address, which only an address rule (such as \"127.0.0.1\") may allow"),
        "{r:#}"
    );
    assert_eq!(denied(&r), ["tls.example.net:8443:private_address"]);
}

#[test]
fn the_per_run_limits_of_connections_and_bytes_are_enforced() {
    let net = TestNet::start();
    let code = r#"
import urllib.request
for i in range(5):
    try:
        print(len(urllib.request.urlopen("http://plain.example.net:8099/hello", timeout=10).read()))
    except Exception as e:
        print(e)
"#;
    let r = net.pycell(
        &policy("egress-conns", SERVERS, &["max_connections = 3"]),
        code,
        &["--embedded"],
    );
    assert_ok(&r);
    let lines: Vec<&str> = stdout(&r).lines().collect();
    assert_eq!(lines[..3], ["26", "26", "26"], "{r:#}");
    for l in &lines[3..] {
        assert!(l.starts_with("HTTP Error 429: pycell egress proxy: refused: this run has opened its 3 connections"), "{l}");
    }
    assert_eq!(r["network"]["limit_reached"], "max_connections");

    let code = r#"
import urllib.request
try:
    print(len(urllib.request.urlopen("http://plain.example.net:8099/bytes/1000000", timeout=10).read()))
except Exception as e:
    print("cut:", type(e).__name__)
"#;
    let r = net.pycell(
        &policy("egress-bytes", SERVERS, &["max_bytes = \"100KiB\""]),
        code,
        &["--embedded"],
    );
    assert_ok(&r);
    assert!(stdout(&r).starts_with("cut: "), "{r:#}");
    assert_eq!(r["network"]["limit_reached"], "max_bytes");
    let n = &r["network"];
    assert!(
        n["bytes_in"].as_u64().unwrap() + n["bytes_out"].as_u64().unwrap() <= 100 * 1024,
        "{n}"
    );
}

#[test]
fn through_pycelld_the_broker_runs_the_proxy_and_the_monitor_audits_each_connection() {
    let net = TestNet::start();
    let policies = net.path("policies");
    fs::create_dir(&policies).unwrap();
    fs::write(
        policies.join("egress-daemon.toml"),
        policy("egress-daemon", SERVERS, &[]),
    )
    .unwrap();
    let socket = net.path("pycell.sock");
    let config = format!(
        "socket = {:?}\naudit_log = {:?}\npolicy_dir = {:?}\ncgroup_parent = \"pycelld-test-egress\"\nuid_range = \"1900990000-1900990063\"\nshutdown_grace = \"5s\"\n",
        socket, net.path("audit.jsonl"), policies
    );
    fs::write(net.path("pycelld.toml"), config).unwrap();
    // The whole tree is the test's: let the broker (user pycell) reach it.
    fs::set_permissions(
        net.dir.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let mut daemon = as_test_daemon(
        net.inside(&pycelld_bin())
            .arg("--config")
            .arg(net.path("pycelld.toml")),
        &net.path("pycelld.log"),
    )
    .spawn()
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while UnixStream::connect(&socket).is_err() {
        assert!(
            Instant::now() < deadline,
            "pycelld did not start: {}",
            fs::read_to_string(net.path("pycelld.log")).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let code = URLLIB.to_string()
        + "\ntry:\n    urllib.request.urlopen('https://nope.example.net/')\nexcept Exception as e:\n    print('denied')\n";
    let args: Vec<OsString> = vec![
        "--socket".into(),
        socket.into_os_string(),
        "--policy".into(),
        "egress-daemon".into(),
    ];
    let r = net.pycell_with(&args, &code);
    assert_ok(&r);
    assert!(stdout(&r).ends_with("True\ndenied\n"), "{r:#}");
    assert_eq!(allowed(&r).len(), 2, "{r:#}");
    assert_eq!(denied(&r), ["nope.example.net:443:not_allowlisted"]);
    let refused = pycell_tests::refusal(&r, "egress", "network.allow");
    assert_eq!(refused["object"], "nope.example.net:443 (not_allowlisted)");
    // One audit line per connection, written by the monitor.
    let deadline = Instant::now() + Duration::from_secs(10);
    let lines = loop {
        let audit = fs::read_to_string(net.path("audit.jsonl")).unwrap_or_default();
        let lines: Vec<Value> = audit
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .filter(|v: &Value| v["event"] == "egress")
            .collect();
        if lines.len() >= 3 || Instant::now() > deadline {
            break lines;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut seen: Vec<String> = lines
        .iter()
        .map(|l| {
            format!(
                "{} {}:{} {}",
                l["verdict"].as_str().unwrap(),
                l["host"].as_str().unwrap(),
                l["port"],
                l["run_id"] == r["run_id"]
            )
        })
        .collect();
    seen.sort();
    assert_eq!(
        seen,
        [
            "allowed plain.example.net:8099 true",
            "allowed tls.example.net:8443 true",
            "denied nope.example.net:443 true"
        ]
    );
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(daemon.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let _ = daemon.wait();
}

/// Raw requests through the proxy from inside the jail: `send(raw, then)`
/// writes `raw` (and `then` once an answer came) and prints the first line
/// the proxy answered.
const RAW_HTTP: &str = r#"
import socket
H = "plain.example.net:8099"
def send(what, raw, then=None):
    s = socket.create_connection(("127.0.0.1", 3128), timeout=10)
    s.sendall(raw.encode())
    got = b""
    try:
        while True:
            c = s.recv(65536)
            if not c:
                break
            got += c
            if then is not None and b"hello from the test server" in got:
                s.sendall(then.encode())
                then = None
    except OSError:
        pass
    s.close()
    print(what, got.split(b"\r\n", 1)[0].decode(), got.count(b"HTTP/1."))
def req(path, extra="", method="GET"):
    return f"{method} http://{H}{path} HTTP/1.1\r\nHost: {H}\r\n{extra}\r\n"
"#;

#[test]
fn plain_http_carries_exactly_one_judged_request_per_connection() {
    let net = TestNet::start();
    let code = RAW_HTTP.to_string()
        + r#"
send("pipelined", req("/first") + req("/pipelined"))
send("after-answer", req("/second"), then=req("/after-answer"))
send("in-body", req("/third", "Content-Length: 0\r\n", "POST") + req("/hidden-in-body"))
send("chunked", req("/fourth", "Transfer-Encoding: chunked\r\n", "POST") + "4\r\nbody\r\n0\r\n\r\n" + req("/after-chunks"))
send("host", f"GET http://{H}/host HTTP/1.1\r\nHost: denied.example.net\r\n\r\n")
send("bare-lf", f"GET http://{H}/bare-lf HTTP/1.1\r\nHost: {H}\r\nX-A: 1\nX-Injected: 1\r\n\r\n")
send("two-lengths", req("/two-lengths", "Content-Length: 4\r\nContent-Length: 40\r\n", "POST") + "body")
send("length-and-chunked", req("/cl-te", "Content-Length: 4\r\nTransfer-Encoding: chunked\r\n", "POST") + "0\r\n\r\n")
send("folded", f"GET http://{H}/folded HTTP/1.1\r\nHost: {H}\r\nX-A: 1\r\n X-B: 2\r\n\r\n")
send("bad-chunk", req("/bad-chunk", "Transfer-Encoding: chunked\r\n", "POST") + "4\nbody\r\n0\r\n\r\n")
"#;
    let r = net.pycell(
        &policy(
            "egress-one-request",
            &["http://plain.example.net:8099", "http://127.0.0.1:8099"],
            &[],
        ),
        &code,
        &["--embedded"],
    );
    assert_ok(&r);
    let lines: Vec<&str> = stdout(&r).lines().collect();
    for (i, what) in ["pipelined", "after-answer", "in-body", "chunked"]
        .iter()
        .enumerate()
    {
        assert_eq!(lines[i], format!("{what} HTTP/1.1 200 OK 1"), "{r:#}");
    }
    for (i, what) in [
        "host",
        "bare-lf",
        "two-lengths",
        "length-and-chunked",
        "folded",
    ]
    .iter()
    .enumerate()
    {
        assert!(
            lines[4 + i].starts_with(&format!(
                "{what} HTTP/1.1 400 pycell egress proxy: bad request"
            )),
            "{}",
            lines[4 + i]
        );
    }
    // The origin saw exactly the judged requests, each once, with its body;
    // the chunked body cut off at its bad size line never completed.
    let mut served = net.requests_served();
    served.retain(|l| !l.starts_with("POST /bad-chunk"));
    assert_eq!(
        served,
        [
            "GET /first 0",
            "GET /second 0",
            "POST /third 0",
            "POST /fourth 4"
        ],
        "{r:#}"
    );
    assert!(
        denied(&r).iter().any(|d| d.ends_with(":bad_request_body")),
        "{r:#}"
    );
}

#[test]
fn a_host_written_as_a_number_is_an_address_not_a_name() {
    let net = TestNet::start();
    // 198.51.100.20, on the test namespace's loopback, in the spellings
    // inet_aton accepts; under "*" (any name, never an address).
    let code = r#"
import urllib.request
for host in ["3325256724", "0xc6336414", "0xc6.0x33.0x64.0x14", "0306.063.0144.024", "198.51.100.20"]:
    try:
        urllib.request.urlopen(f"http://{host}:8099/hello", timeout=10)
        print(host, "reached")
    except Exception as e:
        print(host, e)
"#;
    let r = net.pycell(
        &policy(
            "egress-numbers",
            &["http://*:8099"],
            &["deny = [\"plain.example.net\"]"],
        ),
        code,
        &["--embedded"],
    );
    assert_ok(&r);
    for line in stdout(&r).lines() {
        assert!(
            line.contains(
                "HTTP Error 403: pycell egress proxy: plain HTTP to 198.51.100.20:8099 denied"
            ),
            "{line}"
        );
    }
    assert_eq!(stdout(&r).lines().count(), 5, "{r:#}");
    assert!(net.requests_served().is_empty(), "{r:#}");
}

#[test]
fn a_client_hello_with_two_server_names_closes_the_tunnel() {
    let net = TestNet::start();
    let code = r#"
import socket, struct
def hello(names, extensions):
    body = b"\x03\x03" + b"\x07" * 32 + b"\x00" + b"\x00\x02\x13\x01" + b"\x01\x00"
    sni = b"".join(b"\x00" + struct.pack(">H", len(n)) + n for n in names)
    ext = (b"\x00\x00" + struct.pack(">HH", len(sni) + 2, len(sni)) + sni) * extensions
    ext += b"\x00\x2b\x00\x03\x02\x03\x04"
    body += struct.pack(">H", len(ext)) + ext
    hs = b"\x01\x00" + struct.pack(">H", len(body)) + body
    return b"\x16\x03\x01" + struct.pack(">H", len(hs)) + hs
for what, names, n in [("two-names", [b"tls.example.net", b"other.example.net"], 1),
                       ("two-extensions", [b"tls.example.net"], 2)]:
    s = socket.create_connection(("127.0.0.1", 3128), timeout=10)
    s.sendall(b"CONNECT tls.example.net:8443 HTTP/1.1\r\n\r\n")
    answer = s.recv(4096)
    s.sendall(hello(names, n))
    got = b""
    try:
        while c := s.recv(4096):
            got += c
    except OSError:
        pass
    print(what, answer.split(b"\r\n")[0].decode(), len(got))
"#;
    let r = net.pycell(
        &policy(
            "egress-hello",
            &["tls.example.net:8443", "127.0.0.1:8443"],
            &[],
        ),
        code,
        &["--embedded"],
    );
    assert_ok(&r);
    assert_eq!(
        stdout(&r),
        "two-names HTTP/1.1 200 Connection established 0\ntwo-extensions HTTP/1.1 200 Connection established 0\n",
        "{r:#}"
    );
    assert_eq!(denied(&r), ["tls.example.net:8443:bad_client_hello"]);
    assert_eq!(r["network"]["denied"][0]["count"], 2, "{r:#}");
}
