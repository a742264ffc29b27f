//! `pycell mcp-server PACKAGE`: third-party MCP servers from the package
//! index, jailed. Published servers (mcp-server-time, mcp-server-fetch,
//! mcp-server-git, installed wheels-only from the real index) driven by the
//! official MCP Python SDK (tests/mcp/sdk_jailed.py) as an MCP host drives
//! them; a probe server from the tests' wheelhouse
//! (tests/mcp/probe_server.py) that tries to reach what is the caller's;
//! refusals; SIGKILLs.
//!
//! Needs root (embedded mode) and the tools venv's python
//! (PYCELL_TEST_TOOLS_PYTHON, which scripts/test exports).

#![forbid(unsafe_code)]

use std::fs;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use pycell_tests::daemon::Daemon;
use pycell_tests::sdk::sdk_report_in;
use pycell_tests::{
    assert_no_cgroups_under, compact, descendants_of, pycell_bin, repo_root, require_root,
    still_alive_after,
};
use serde_json::{json, Value};

/// Root-owned, not under /tmp (which a jail has its own of, so it cannot
/// be granted).
const BASE: &str = "/var/cache/pycell-tests/jailed";

/// An install from the real index, then the calls: well within this.
const GUARD: Duration = Duration::from_secs(300);

/// The base: a store shared by these tests (each server is installed once)
/// and, for the probe server, the tests' wheelhouse and its policies.
/// This test process's own directory under [`BASE`] (two runs of the
/// suite at once must not remove each other's), made anew; those of
/// processes that are gone are removed.
fn base() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        require_root();
        let base = pycell_tests::own_dir_under(Path::new(BASE));
        fs::create_dir_all(base.join("policies")).unwrap();
        let wheels = base.join("wheels");
        let made = Command::new("python3")
            .arg(repo_root().join("tests/deps/make_wheels.py"))
            .arg(&wheels)
            .status()
            .expect("run make_wheels.py");
        assert!(made.success(), "make_wheels.py failed");
        let install = format!(
            "name = \"probe-install\"\ndescription = \"test\"\nnamespaces = [\"user\", \"pid\", \"mount\", \"net\", \"ipc\", \"uts\", \"cgroup\"]\n[interpreter]\npython = \"/usr/bin/python3\"\n[limits]\nwall_timeout = \"2m\"\ncpu_time = \"2m\"\nmemory = \"1GiB\"\npids = 256\ncpus = 2.0\nopen_files = 4096\ndisk = \"512MiB\"\n[install]\nfind_links = [{:?}]\n{MOUNTS}[env]\nPATH = \"/usr/bin:/bin\"\nHOME = \"/workspace\"\nUV_CACHE_DIR = \"/tmp/uv-cache\"\nUV_PYTHON_DOWNLOADS = \"never\"\nUV_NO_PROGRESS = \"1\"\n",
            wheels.display().to_string()
        );
        let probe = pycell_policy::builtin::source("mcp-server")
            .unwrap()
            .replace("name = \"mcp-server\"", "name = \"mcp-probe\"")
            .replace("install_policy = \"install\"", "install_policy = \"probe-install\"");
        fs::write(base.join("policies/probe-install.toml"), install).unwrap();
        fs::write(base.join("policies/mcp-probe.toml"), probe).unwrap();
        base
    })
}

const MOUNTS: &str = "[[mounts]]\nsource = \"/usr\"\n[[mounts]]\nsource = \"/bin\"\n[[mounts]]\nsource = \"/lib\"\n[[mounts]]\nsource = \"/lib64\"\n[[mounts]]\nsource = \"/sbin\"\n";

fn store() -> String {
    base().join("store").display().to_string()
}

fn policies() -> String {
    base().join("policies").display().to_string()
}

/// A directory of this test under the base (made anew).
fn test_dir(name: &str) -> PathBuf {
    let d = base().join(name);
    let _ = fs::remove_dir_all(&d);
    fs::create_dir_all(&d).unwrap();
    d
}

/// The SDK's report of `pycell ARGS` (as an MCP host's config would start
/// it) and `calls` made on it, with `env` added to pycell's environment.
fn session(args: &[&str], calls: Value, env: &[(&str, &str)], scan_for: Option<&str>) -> Value {
    let scan: Vec<&str> = scan_for.map_or(vec![], |text| vec!["--scan-for", text]);
    session_with(args, calls, env, &scan)
}

/// [`session`], with `more` arguments for tests/mcp/sdk_jailed.py.
fn session_with(args: &[&str], calls: Value, env: &[(&str, &str)], more: &[&str]) -> Value {
    let (store, policies) = (store(), policies());
    let mut all_env = vec![
        ("PYCELL_ENV_STORE", store.as_str()),
        ("PYCELL_POLICY_DIR", policies.as_str()),
    ];
    all_env.extend_from_slice(env);
    let args = serde_json::to_string(args).unwrap();
    let calls = calls.to_string();
    let mut script_args = vec!["--args", args.as_str(), "--calls", calls.as_str()];
    script_args.extend_from_slice(more);
    // pycell's stderr, to say why a session failed (unless the caller
    // reads it itself).
    let errlog = tempfile::NamedTempFile::new().unwrap();
    let errlog_path = errlog.path().display().to_string();
    if !more.contains(&"--errlog") {
        script_args.extend(["--errlog", errlog_path.as_str()]);
    }
    let report = sdk_report_in("sdk_jailed.py", &script_args, &all_env, GUARD);
    assert_eq!(
        report["completed"],
        true,
        "the SDK session failed: {}\npycell said: {}",
        compact(&report, 6000),
        fs::read_to_string(errlog.path()).unwrap_or_default()
    );
    report
}

fn call(report: &Value, i: usize) -> &Value {
    &report["calls"][i]
}

/// The session's first call answered with `text` in its answer, its
/// second refused.
fn answered_then_refused(r: &Value, text: &str) {
    assert_eq!(call(r, 0)["is_error"], false, "{r}");
    let answer = call(r, 0)["text"].as_str().unwrap_or("");
    assert!(answer.contains(text), "{text:?} not in the answer: {r}");
    assert_eq!(call(r, 1)["is_error"], true, "{r}");
}

#[test]
fn a_published_server_lists_and_answers_its_tools_through_the_sdk() {
    let r = session(
        &["mcp-server", "mcp-server-time"],
        json!([["get_current_time", {"timezone": "Etc/UTC"}]]),
        &[],
        None,
    );
    assert_eq!(r["initialize"]["server_name"], "mcp-time", "{r}");
    assert_eq!(
        r["tools"],
        json!(["get_current_time", "convert_time"]),
        "{r}"
    );
    let answer = call(&r, 0);
    assert_eq!(answer["is_error"], false, "{r}");
    let text = answer["text"].as_str().unwrap_or("");
    let time: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}: {text}"));
    assert_eq!(time["timezone"], "Etc/UTC", "{r}");
}

/// An HTTP server on loopback answering every request with `body`, for as
/// long as the test process lives; its port.
fn loopback_page(body: &'static str) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for conn in listener.incoming().take(64) {
            let Ok(mut conn) = conn else { continue };
            let mut head = Vec::new();
            let mut byte = [0u8; 1];
            while !head.ends_with(b"\r\n\r\n") && conn.read(&mut byte).is_ok_and(|n| n == 1) {
                head.push(byte[0]);
            }
            let reply = format!(
                "HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            );
            let _ = conn.write_all(reply.as_bytes());
        }
    });
    port
}

#[test]
fn fetch_reaches_the_allowed_loopback_server_only_and_the_refusal_is_in_the_egress_report() {
    let port = loopback_page("pycell-marker-4711 from the loopback server");
    let allow = format!("http://127.0.0.1:{port}");
    let egress = fetch_allowed_then_refused("fetch", &allow, "pycell-marker-4711", &[], &[]);
    assert_eq!(egress["allowed_rules"], json!([allow]), "{egress}");
    let allowed = &egress["network"]["allowed"];
    assert!(
        allowed
            .as_array()
            .unwrap()
            .iter()
            .any(|h| h["host"] == "127.0.0.1" && h["port"] == port),
        "{egress}"
    );
    let denied = egress["network"]["denied"].as_array().unwrap();
    assert!(
        denied
            .iter()
            .any(|d| d["host"] == "example.net" && d["reason"] == "not_allowlisted"),
        "{egress}"
    );
}

/// mcp-server-fetch with `--allow ALLOW` (and `opts`, `env` for pycell):
/// it fetches ALLOW's page (which holds `marker`) and is refused
/// example.net. Its egress report.
fn fetch_allowed_then_refused(
    dir: &str,
    allow: &str,
    marker: &str,
    opts: &[&str],
    env: &[(&str, &str)],
) -> Value {
    let report_file = test_dir(dir).join("egress.json").display().to_string();
    let mut args = vec!["mcp-server"];
    args.extend_from_slice(opts);
    args.extend([
        "--allow",
        allow,
        "--egress-report",
        &report_file,
        "mcp-server-fetch",
    ]);
    args.extend(["--", "--ignore-robots-txt", "--allow-private-ips"]);
    let calls = json!([
        ["fetch", {"url": format!("{allow}/page.txt"), "raw": true}],
        ["fetch", {"url": "http://example.net/", "raw": true}]
    ]);
    let r = session(&args, calls, env, None);
    answered_then_refused(&r, marker);
    serde_json::from_slice(&fs::read(&report_file).unwrap()).unwrap()
}

/// A repository with one commit, in the test's directory `name`.
fn repository(name: &str) -> PathBuf {
    let repo = test_dir(name).join("repo");
    let git = |args: &[&str]| {
        let ok = Command::new("git")
            .args(["-c", "user.email=t@example.net", "-c", "user.name=t"])
            .args(args)
            .current_dir(&repo)
            .status()
            .unwrap()
            .success();
        assert!(ok, "git {args:?}");
    };
    fs::create_dir_all(&repo).unwrap();
    git(&["init", "-q"]);
    fs::write(repo.join("a.txt"), "hi\n").unwrap();
    git(&["add", "a.txt"]);
    git(&["commit", "-qm", "a commit made by the test"]);
    repo
}

/// mcp-server-git on `repo` granted read-only (with `env` for pycell):
/// it reads the log and cannot make a branch.
fn git_reads_but_cannot_change(repo: &Path, env: &[(&str, &str)]) {
    let r_path = repo.display().to_string();
    let r = session(
        &[
            "mcp-server",
            "--ro",
            &r_path,
            "mcp-server-git",
            "--",
            "--repository",
            &r_path,
        ],
        json!([
            ["git_log", {"repo_path": r_path}],
            ["git_create_branch", {"repo_path": r_path, "branch_name": "from-the-jail"}]
        ]),
        env,
        None,
    );
    answered_then_refused(&r, "a commit made by the test");
    assert!(
        !repo.join(".git/refs/heads/from-the-jail").exists(),
        "the server wrote into a read-only grant"
    );
}

#[test]
fn git_reads_a_repository_granted_read_only_and_cannot_change_it() {
    git_reads_but_cannot_change(&repository("git"), &[]);
}

#[test]
fn through_pycelld_a_repository_granted_read_only_is_read_and_not_changed() {
    let d = daemon_allowing(9);
    let socket = d.socket().display().to_string();
    git_reads_but_cannot_change(
        &repository("daemon-git"),
        &[("PYCELL_SOCKET", socket.as_str())],
    );
    d.assert_sandbox_gone(Duration::from_secs(10));
}

#[test]
fn a_server_reaches_nothing_of_the_callers_but_the_variables_and_paths_it_is_given() {
    let dir = test_dir("probe");
    let home = dir.join("home");
    fs::create_dir_all(home.join(".ssh")).unwrap();
    let canary = home.join(".ssh/id_canary");
    fs::write(&canary, "canary: the caller's key\n").unwrap();
    let agent_path = home.join("agent.sock");
    let agent = std::os::unix::net::UnixListener::bind(&agent_path).unwrap();
    let granted = dir.join("granted");
    fs::create_dir_all(&granted).unwrap();
    fs::write(granted.join("given.txt"), "for the server\n").unwrap();
    let secret = format!("secret-{}-not-for-the-server", std::process::id());
    let token = format!("token-{}-for-the-server", std::process::id());
    let reversed: String = secret.chars().rev().collect();
    let (c, a, g, h) = (
        canary.display().to_string(),
        agent_path.display().to_string(),
        granted.display().to_string(),
        home.display().to_string(),
    );
    let r = session(
        &[
            "mcp-server",
            "--policy",
            "mcp-probe",
            "--env",
            "GRANTED_TOKEN",
            "--rw",
            &g,
            "pycell-probe-server",
            "--",
            "--canary",
            &c,
            "--agent",
            &a,
            "--secret-reversed",
            &reversed,
            "--dir",
            &g,
        ],
        json!([["probe", {}]]),
        &[
            ("HOME", h.as_str()),
            ("SSH_AUTH_SOCK", a.as_str()),
            ("CALLER_SECRET", secret.as_str()),
            ("GRANTED_TOKEN", token.as_str()),
        ],
        Some(&token),
    );
    drop(agent);
    let text = call(&r, 0)["text"].as_str().unwrap_or("{}").to_string();
    let p: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {r}"));
    let refused = |key: &str| {
        assert!(p[key]["error"].is_string(), "{key} was reachable: {p}");
    };
    refused("home_canary");
    refused("home_listing");
    refused("ssh_agent");
    assert_eq!(p["ssh_auth_sock"], Value::Null, "{p}");
    assert_eq!(p["secret_seen"], json!([]), "{p}");
    for name in ["CALLER_SECRET", "SSH_AUTH_SOCK"] {
        assert!(
            !p["env_names"].as_array().unwrap().contains(&json!(name)),
            "{p}"
        );
    }
    // What it was given, and nothing on a command line shows the token.
    assert_eq!(p["granted_token"], token.as_str(), "{p}");
    assert_eq!(r["cmdlines_with_text"], json!([]), "{r}");
    assert_eq!(p["dir_listing"]["ok"], json!(["given.txt"]), "{p}");
    let written = PathBuf::from(
        p["dir_write"]["ok"]
            .as_str()
            .unwrap_or_else(|| panic!("{p}")),
    );
    let meta = fs::metadata(&written).unwrap();
    assert_eq!(
        (meta.uid(), meta.gid()),
        (
            fs::metadata(&granted).unwrap().uid(),
            fs::metadata(&granted).unwrap().gid()
        ),
        "a file the server wrote belongs to the granted directory's owner"
    );
}

/// `pycell mcp-server` of the probe server under `mcp-probe` with
/// `grants`, the probe given nothing of the caller's and `probe` more.
fn probe_args(grants: &[&str], probe: &[&str]) -> Vec<String> {
    let mut args = vec!["mcp-server", "--policy", "mcp-probe"];
    args.extend_from_slice(grants);
    args.extend(["pycell-probe-server", "--", "--canary", "/nonexistent"]);
    args.extend(["--agent", "/nonexistent", "--secret-reversed", "x"]);
    args.extend_from_slice(probe);
    args.into_iter().map(String::from).collect()
}

/// The probe server's `plant` in a `--rw` directory and on a `--rw` file,
/// both root's (with `env` for pycell): in the jail every set-id mode is
/// refused; on the host, once the server has ended, nothing set-id, no
/// FIFO, no socket, no link out of the grant and nothing writable by
/// others is left, and pycell said what it undid.
fn nothing_planted_in_a_grant_stays(name: &str, env: &[(&str, &str)]) {
    let dir = test_dir(name);
    let granted = dir.join("granted");
    fs::create_dir_all(&granted).unwrap();
    let file = dir.join("granted-file");
    fs::write(&file, "the caller's\n").unwrap();
    let errlog = dir.join("pycell.stderr");
    let (g, f, e) = (
        granted.display().to_string(),
        file.display().to_string(),
        errlog.display().to_string(),
    );
    let args = probe_args(&["--rw", &g, "--rw", &f], &["--dir", &g, "--file", &f]);
    let r = session_with(
        &args.iter().map(String::as_str).collect::<Vec<_>>(),
        json!([["plant", {}]]),
        env,
        &["--errlog", &e],
    );
    let text = call(&r, 0)["text"].as_str().unwrap_or("{}").to_string();
    let p: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {r}"));
    for key in [
        "chmod_4755",
        "chmod_2755",
        "open_06755",
        "mknod_04755",
        "chmod_dir_2777",
        "file_chmod_4777",
    ] {
        let error = p[key]["error"]
            .as_str()
            .unwrap_or_else(|| panic!("{key} was allowed: {p}"));
        assert!(error.contains("Operation not permitted"), "{key}: {p}");
    }
    let error = p["openat2"]["error"]
        .as_str()
        .unwrap_or_else(|| panic!("openat2 worked: {p}"));
    assert!(error.contains("Function not implemented"), "{p}");
    for key in [
        "fifo",
        "socket",
        "symlink_out",
        "symlink_up",
        "chmod_dir_0777",
        "chmod_0666",
    ] {
        assert!(p[key].get("ok").is_some(), "{key} failed in the jail: {p}");
    }
    // On the host.
    let mut left = Vec::new();
    pycell_tests::walk_tree(&granted, &mut |path, meta| {
        left.push((path.to_path_buf(), meta.clone()))
    });
    for (path, meta) in &left {
        let kind = meta.file_type();
        assert!(
            kind.is_file() || kind.is_dir() || kind.is_symlink(),
            "{} is left: {kind:?}",
            path.display()
        );
        if !kind.is_symlink() {
            assert_eq!(
                meta.mode() & 0o6002,
                0,
                "{} is left with mode {:o}",
                path.display(),
                meta.mode()
            );
        }
    }
    let names: Vec<String> = left
        .iter()
        .map(|(p, _)| p.strip_prefix(&granted).unwrap().display().to_string())
        .collect();
    for gone in ["a-fifo", "a-socket", "to-shadow", "up-and-out"] {
        assert!(
            !names.contains(&gone.to_string()),
            "{gone} is left: {names:?}"
        );
    }
    assert!(names.contains(&"link-inside".to_string()), "{names:?}");
    assert_eq!(
        fs::metadata(&file).unwrap().mode() & 0o7777,
        0o775,
        "the granted file"
    );
    let said = fs::read_to_string(&errlog).unwrap();
    for line in [
        format!("pycell: grant: {g}/a-fifo: removed (a FIFO)"),
        format!("pycell: grant: {g}/a-socket: removed (a socket)"),
        format!("pycell: grant: {g}/to-shadow: removed (a symbolic link out of the grant)"),
        format!("pycell: grant: {g}/open-dir: mode 0777 -> 0775 (writable by others)"),
        format!("pycell: grant: {f}: mode 0777 -> 0775 (writable by others)"),
    ] {
        assert!(said.contains(&line), "{line:?} not in:\n{said}");
    }
}

#[test]
fn embedded_as_root_a_server_leaves_nothing_set_id_nor_unsafe_in_its_grants() {
    nothing_planted_in_a_grant_stays("plant-embedded", &[]);
}

#[test]
fn through_pycelld_a_server_leaves_nothing_set_id_nor_unsafe_in_its_grants() {
    let d = Daemon::start(&format!(
        "policy_dir = {:?}\nenv_store = {:?}\n",
        policies(),
        base().join("plant-store").display().to_string()
    ));
    let socket = d.socket().display().to_string();
    nothing_planted_in_a_grant_stays("plant-daemon", &[("PYCELL_SOCKET", socket.as_str())]);
    d.assert_sandbox_gone(Duration::from_secs(10));
}

/// `--ro` inside `--rw`: the inner grant stays read-only.
#[test]
fn a_read_only_grant_inside_a_writable_one_stays_read_only() {
    let dir = test_dir("nested");
    let project = dir.join("project");
    let git = project.join(".git");
    fs::create_dir_all(&git).unwrap();
    fs::write(git.join("HEAD"), "ref: refs/heads/main\n").unwrap();
    let (p, g) = (project.display().to_string(), git.display().to_string());
    let args = probe_args(&["--ro", &g, "--rw", &p], &["--dir", &g]);
    let r = session(
        &args.iter().map(String::as_str).collect::<Vec<_>>(),
        json!([["probe", {}]]),
        &[],
        None,
    );
    let text = call(&r, 0)["text"].as_str().unwrap_or("{}").to_string();
    let probe: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {r}"));
    assert_eq!(probe["dir_listing"]["ok"], json!(["HEAD"]), "{probe}");
    let error = probe["dir_write"]["error"]
        .as_str()
        .unwrap_or_else(|| panic!("the read-only grant inside was written: {probe}"));
    assert!(error.contains("Read-only file system"), "{probe}");
    assert!(!git.join("written-by-server.txt").exists());
}

/// `pycell mcp-server ARGS` run to its end with nothing on stdin.
fn refused_run(args: &[&str]) -> (i32, String) {
    require_root();
    let out = Command::new(pycell_bin())
        .args(args)
        .env("PYCELL_ENV_STORE", store())
        .env("PYCELL_POLICY_DIR", policies())
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    (out.status.code().unwrap_or(-1), stderr)
}

#[test]
fn packages_and_grants_that_cannot_be_served_are_refused_saying_why() {
    let cases: &[(&[&str], &str)] = &[
        // No wheel: refused as a run's dependencies are, no build run.
        (
            &["mcp-server", "--policy", "mcp-probe", "pycell-test-sdist"],
            "deps_no_wheel",
        ),
        (
            &[
                "mcp-server",
                "--policy",
                "mcp-probe",
                "pycell-test-noscript",
            ],
            "--entry",
        ),
        (
            &[
                "mcp-server",
                "--policy",
                "mcp-probe",
                "pycell-test-twoscripts",
            ],
            "a-tool, b-tool: pick one with --entry",
        ),
        (
            &["mcp-server", "--ro", "/tmp", "mcp-server-time"],
            "grant a path elsewhere",
        ),
        (
            &[
                "mcp-server",
                "--ro",
                "/var/cache/pycell-tests/no-such-path",
                "mcp-server-time",
            ],
            "No such file",
        ),
        (
            &[
                "mcp-server",
                "--env",
                "SURELY_UNSET_VARIABLE_OF_THE_TEST",
                "mcp-server-time",
            ],
            "not set",
        ),
        (
            &[
                "mcp-server",
                "--allow",
                "ftp://example.net",
                "mcp-server-time",
            ],
            "--allow",
        ),
    ];
    for (args, why) in cases {
        let (code, stderr) = refused_run(args);
        assert_eq!(code, 125, "{args:?}: {stderr}");
        assert!(
            stderr.contains(why),
            "{args:?}: wanted {why:?} in: {stderr}"
        );
    }
    // An entry that is not a callable is refused when the server starts.
    let (code, stderr) = refused_run(&[
        "mcp-server",
        "--policy",
        "mcp-probe",
        "--entry",
        "pycell_test_noscript:VERSION",
        "pycell-test-noscript",
    ]);
    assert_ne!(code, 0, "{stderr}");
    assert!(stderr.contains("is not a callable"), "{stderr}");
}

/// Send `child` (a `pycell mcp-server`) MCP's initialize and wait for its
/// answer; its stdin stays open (the server must not see EOF).
fn initialized(child: &mut Child) -> BufReader<std::process::ChildStdout> {
    let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}});
    let mut stdin = child.stdin.take().unwrap();
    writeln!(stdin, "{init}").unwrap();
    std::mem::forget(stdin);
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert!(
        line.contains("\"id\":1"),
        "no answer to initialize: {line:?}"
    );
    out
}

/// `pycell mcp-server mcp-server-time` under the cgroup parent `parent`,
/// answered once (so its jail is up): the child, its stdout, and every
/// process below it.
fn serving(
    parent: &str,
) -> (
    Child,
    BufReader<std::process::ChildStdout>,
    Vec<pycell_tests::HostProc>,
) {
    require_root();
    let mut child = Command::new(pycell_bin())
        .args(["mcp-server", "mcp-server-time"])
        .env("PYCELL_ENV_STORE", store())
        .env("PYCELL_CGROUP_PARENT", parent)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let out = initialized(&mut child);
    let below = descendants_of(child.id());
    assert!(
        below.iter().any(|p| p.name.starts_with("python")),
        "no server below pycell: {below:?}"
    );
    (child, out, below)
}

#[test]
fn sigkill_of_pycell_mcp_server_or_of_its_jailer_leaves_nothing() {
    let parent = format!("pycell-test-jailed-{}", std::process::id());
    let (mut child, _out, below) = serving(&parent);
    kill(Pid::from_raw(child.id() as i32), Signal::SIGKILL).unwrap();
    let _ = child.wait();
    let left = still_alive_after(&below, Duration::from_secs(10));
    assert!(left.is_empty(), "left after pycell was killed: {left:?}");
    assert_no_cgroups_under(&parent);

    let parent = format!("pycell-test-jailed-j{}", std::process::id());
    let (mut child, mut out, below) = serving(&parent);
    let jailer = below
        .iter()
        .find(|p| p.name.starts_with("pycell-jailer"))
        .unwrap_or_else(|| panic!("no jailer: {below:?}"));
    kill(Pid::from_raw(jailer.pid as i32), Signal::SIGKILL).unwrap();
    // The client sees the pipe close, as for any server that dies.
    let mut rest = Vec::new();
    let _ = out.read_to_end(&mut rest);
    let status = child.wait().unwrap();
    assert!(
        !status.success(),
        "pycell exited 0 after its jailer was killed"
    );
    let left = still_alive_after(&below, Duration::from_secs(10));
    assert!(
        left.is_empty(),
        "left after the jailer was killed: {left:?}"
    );
    assert_no_cgroups_under(&parent);
}

// --- through pycelld --------------------------------------------------------

/// A pycelld with the tests' policies (and `mcp-net`, whose allowlist is
/// the loopback server on `port`) and a store of its own.
fn daemon_allowing(port: u16) -> Daemon {
    let network = format!(
        "[network]\nmode = \"allowlist\"\nallow = [\"http://127.0.0.1:{port}\"]\ndeny = []\nmax_connections = 256\nmax_bytes = \"1GiB\"\nconnect_timeout = \"10s\"\n"
    );
    let net = pycell_policy::builtin::source("mcp-server")
        .unwrap()
        .replace("name = \"mcp-server\"", "name = \"mcp-net\"")
        .replace("[network]\nmode = \"none\"\n", &network);
    assert!(
        net.contains("allowlist"),
        "the mcp-server policy's [network] moved"
    );
    fs::write(base().join("policies/mcp-net.toml"), net).unwrap();
    Daemon::start(&format!(
        "policy_dir = {:?}\nenv_store = {:?}\n",
        policies(),
        base().join("daemon-store").display().to_string()
    ))
}

#[test]
fn through_pycelld_a_server_gets_only_what_its_policy_allows_and_its_egress_is_audited() {
    let port = loopback_page("pycell-marker-4712 through pycelld");
    let d = daemon_allowing(port);
    let socket = d.socket().display().to_string();
    let allow = format!("http://127.0.0.1:{port}");
    let egress = fetch_allowed_then_refused(
        "daemon-fetch",
        &allow,
        "pycell-marker-4712",
        &["--policy", "mcp-net"],
        &[("PYCELL_SOCKET", socket.as_str())],
    );
    let denied = egress["network"]["denied"].as_array().unwrap();
    assert!(
        denied.iter().any(|x| x["host"] == "example.net"),
        "{egress}"
    );
    // Each connection, allowed or refused, is in the daemon's audit log.
    let lines = d.audit_events("egress", 2);
    let verdicts: Vec<(String, String)> = lines
        .iter()
        .map(|l| {
            (
                l["host"].as_str().unwrap_or("").into(),
                l["verdict"].as_str().unwrap_or("").into(),
            )
        })
        .collect();
    assert!(
        verdicts.contains(&("127.0.0.1".into(), "allowed".into())),
        "{verdicts:?}"
    );
    assert!(
        verdicts
            .iter()
            .any(|(h, v)| h == "example.net" && v != "allowed"),
        "{verdicts:?}"
    );

    // Hosts beyond the operator's policy, and grants, are refused.
    let through = |args: &[&str]| {
        let out = Command::new(pycell_bin())
            .args(args)
            .env("PYCELL_SOCKET", d.socket())
            .stdin(Stdio::null())
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (code, stderr) = through(&[
        "mcp-server",
        "--policy",
        "mcp-net",
        "--allow",
        "http://example.net",
        "mcp-server-time",
    ]);
    assert_eq!(code, Some(125), "{stderr}");
    assert!(stderr.contains("not on the policy's allowlist"), "{stderr}");
    let (code, stderr) = through(&["mcp-server", "--allow", &allow, "mcp-server-time"]);
    assert_eq!(code, Some(125), "{stderr}");
    assert!(stderr.contains("has no network"), "{stderr}");
    let (code, stderr) = through(&["mcp-server", "--ro", "/tmp", "mcp-server-time"]);
    assert_eq!(code, Some(125), "{stderr}");
    assert!(stderr.contains("grant a path elsewhere"), "{stderr}");
}

/// `pycell mcp-server mcp-server-time` through `d`, answered once: the
/// child and its stdout.
fn serving_through(d: &Daemon) -> (Child, BufReader<std::process::ChildStdout>) {
    let mut child = Command::new(pycell_bin())
        .args(["mcp-server", "mcp-server-time"])
        .env("PYCELL_SOCKET", d.socket())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let out = initialized(&mut child);
    assert!(
        !d.sandbox_processes().is_empty(),
        "no server in the daemon's jails"
    );
    (child, out)
}

#[test]
fn sigkill_of_the_client_or_of_pycelld_ends_the_daemons_server_and_leaves_nothing() {
    let mut d = daemon_allowing(9);
    let (mut client, _out) = serving_through(&d);
    kill(Pid::from_raw(client.id() as i32), Signal::SIGKILL).unwrap();
    let _ = client.wait();
    d.assert_sandbox_gone(Duration::from_secs(10));

    let (mut client, mut out) = serving_through(&d);
    d.signal(Signal::SIGKILL);
    let _ = d.wait(Duration::from_secs(10));
    // The client sees its server's pipe close, and exits saying so.
    let mut rest = Vec::new();
    let _ = out.read_to_end(&mut rest);
    let status = client.wait().unwrap();
    assert!(
        !status.success(),
        "pycell exited 0 after pycelld was killed"
    );
    d.assert_sandbox_gone(Duration::from_secs(10));
}
