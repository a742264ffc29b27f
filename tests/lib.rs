//! Shared helpers for pycell's integration and escape tests.
//!
//! Threat model of this crate: none of its own. It drives the real `pycell`
//! binary as root (as CI does), runs hostile scripts in the jail and inspects
//! the host afterwards (processes by uid, cgroup directories). A missing
//! binary, a non-root run or a missing kernel feature fails the test loudly;
//! nothing is skipped.

#![forbid(unsafe_code)]

use std::collections::BTreeSet;
use std::ffi::OsString;
use std::fs;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use serde_json::Value;

#[path = "daemon_harness.rs"]
pub mod daemon;
#[path = "http_harness.rs"]
pub mod http;
#[path = "sdk.rs"]
pub mod sdk;

/// Default host-side guard for one `pycell` invocation: a hang fails the test
/// instead of stalling the suite.
pub const DEFAULT_GUARD: Duration = Duration::from_secs(120);
/// Python that defines `png(w, h)`: the bytes of a `w` x `h` red PNG,
/// made without Pillow (which the jail's python does not have).
pub const PNG_WRITER: &str = r#"
import struct, zlib
def png(w, h):
    raw = b"".join(b"\x00" + b"\xff\x00\x00" * w for _ in range(h))
    def chunk(t, d):
        return struct.pack(">I", len(d)) + t + d + struct.pack(">I", zlib.crc32(t + d))
    ihdr = struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b"")
"#;

/// The root of the cargo workspace (the parent of this crate), or
/// `$PYCELL_TEST_REPO`: where the Debian VM runs these tests against the
/// installed package, a copy of the files they read (the probe, the
/// policies) stands in for the checkout.
pub fn repo_root() -> PathBuf {
    if let Some(p) = std::env::var_os("PYCELL_TEST_REPO") {
        return PathBuf::from(p);
    }
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ has a parent directory")
        .to_path_buf()
}

/// `tests/probe/probe.py`, the program that runs inside the jail.
pub fn probe_path() -> PathBuf {
    repo_root().join("tests/probe/probe.py")
}

/// How the tests' `pycell run`s reach a jailer: `PYCELL_TEST_VIA=embedded`
/// (the default; the runs get `--embedded`, so an installed pycelld is never
/// used by accident) or `daemon` (plain `pycell run`: the installed pycelld,
/// as on the Debian VM, where the escape tests run both ways).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Via {
    Embedded,
    Daemon,
}

pub fn via() -> Via {
    match std::env::var("PYCELL_TEST_VIA").as_deref() {
        Err(_) | Ok("embedded") => Via::Embedded,
        Ok("daemon") => Via::Daemon,
        Ok(other) => panic!("PYCELL_TEST_VIA={other}: want embedded or daemon"),
    }
}

/// `args` with the mode flag of [`via`] after a leading `run`, unless they
/// already choose (`--socket`, `--embedded`).
pub fn with_mode(args: Vec<OsString>) -> Vec<OsString> {
    let chooses = args.iter().any(|a| {
        let a = a.to_string_lossy();
        a == "--embedded" || a == "--socket" || a.starts_with("--socket=")
    });
    if via() == Via::Daemon || chooses || args.first().is_none_or(|a| a != "run") {
        return args;
    }
    let mut out = args;
    out.insert(1, "--embedded".into());
    out
}

/// Locate the `pycell` binary: `$PYCELL_BIN`, else next to the test
/// executable (`target/<profile>/deps/x` -> `target/<profile>/pycell`).
pub fn pycell_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("PYCELL_BIN") {
        let p = PathBuf::from(p);
        assert!(
            p.is_file(),
            "PYCELL_BIN={} does not exist: build it with cargo build; run tests as root with scripts/test",
            p.display()
        );
        return p;
    }
    let exe = std::env::current_exe().expect("current_exe");
    let profile_dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("test executable lives in target/<profile>/deps");
    let p = profile_dir.join("pycell");
    assert!(
        p.is_file(),
        "pycell binary not found at {} (nor PYCELL_BIN set): build it with cargo build; run tests as root with scripts/test",
        p.display()
    );
    p
}

/// Every test here needs root (embedded mode creates cgroups and maps a
/// sandbox uid). Fail, never skip.
/// The pycelld built next to `pycell`.
pub fn pycelld_bin() -> PathBuf {
    pycell_bin().with_file_name("pycelld")
}

/// `cmd` (a pycelld, or a wrapper that execs one) set up as a test daemon:
/// the freshly built jailer, no stdin, stdout and stderr appended to `log`.
pub fn as_test_daemon<'a>(cmd: &'a mut Command, log: &Path) -> &'a mut Command {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .unwrap_or_else(|e| panic!("{}: {e}", log.display()));
    cmd.env(
        "PYCELL_JAILER",
        pycell_bin().with_file_name("pycell-jailer"),
    )
    .stdin(Stdio::null())
    .stdout(log.try_clone().unwrap())
    .stderr(log)
}

pub fn require_root() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "these tests need root (embedded pycell creates cgroups and maps sandbox uids): run tests as root with scripts/test"
    );
}

/// What one `pycell` process did, as seen from the host.
#[derive(Debug, Clone)]
pub struct Outcome {
    pub args: Vec<String>,
    /// pycell's own exit code (None if it died by a signal).
    pub exit_code: Option<i32>,
    pub stdout: Vec<u8>,
    pub stderr: String,
    pub wall: Duration,
}

impl Outcome {
    pub fn stdout_str(&self) -> String {
        String::from_utf8_lossy(&self.stdout).into_owned()
    }

    /// A short account of the run for assertion messages.
    pub fn describe(&self) -> String {
        let out = self.stdout_str();
        let out = truncate_for_message(&out, 6000);
        let err = truncate_for_message(&self.stderr, 4000);
        format!(
            "pycell {:?}\n  exit code: {:?}\n  wall: {:?}\n  stdout: {}\n  stderr: {}",
            self.args, self.exit_code, self.wall, out, err
        )
    }

    /// The `--json` result object printed on stdout.
    pub fn result(&self) -> Value {
        serde_json::from_slice(&self.stdout).unwrap_or_else(|e| {
            panic!(
                "pycell --json did not print one JSON object ({e})\n{}",
                self.describe()
            )
        })
    }
}

fn truncate_for_message(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}... [{} more bytes]", &s[..end], s.len() - end)
}

/// A `pycell` invocation under construction.
#[derive(Debug, Clone)]
pub struct Pycell {
    args: Vec<OsString>,
    stdin: Vec<u8>,
    env: Vec<(OsString, OsString)>,
    guard: Duration,
}

impl Pycell {
    /// `pycell <args...>`.
    pub fn new<I, S>(args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<OsString>,
    {
        Pycell {
            args: args.into_iter().map(Into::into).collect(),
            stdin: Vec::new(),
            env: Vec::new(),
            guard: DEFAULT_GUARD,
        }
    }

    /// Bytes written to pycell's stdin (then closed).
    pub fn stdin(mut self, bytes: impl Into<Vec<u8>>) -> Self {
        self.stdin = bytes.into();
        self
    }

    /// An extra variable in pycell's (host) environment.
    pub fn env(mut self, key: impl Into<OsString>, value: impl Into<OsString>) -> Self {
        self.env.push((key.into(), value.into()));
        self
    }

    /// Host-side limit after which pycell is killed and the test fails.
    pub fn guard(mut self, d: Duration) -> Self {
        self.guard = d;
        self
    }

    pub fn run(self) -> Outcome {
        self.run_watching(|| {})
    }

    /// Run to completion, calling `watch` every ~50 ms while pycell runs
    /// (e.g. to observe host processes and cgroups during the run).
    pub fn run_watching(self, mut watch: impl FnMut()) -> Outcome {
        require_root();
        let bin = pycell_bin();
        let mut cmd = Command::new(&bin);
        let args = with_mode(self.args.clone());
        cmd.args(&args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        for (k, v) in &self.env {
            cmd.env(k, v);
        }
        let args: Vec<String> = args
            .iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        let start = Instant::now();
        let mut child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("spawning {}: {e}", bin.display()));
        let stdin = child.stdin.take().expect("piped stdin");
        let input = self.stdin.clone();
        let writer = thread::spawn(move || {
            let mut stdin = stdin;
            // pycell may not read stdin at all (e.g. a script path and no
            // --input); a broken pipe is not a failure.
            let _ = stdin.write_all(&input);
        });
        let out_buf = Arc::new(Mutex::new(Vec::new()));
        let err_buf = Arc::new(Mutex::new(Vec::new()));
        let out_reader = drain(child.stdout.take().expect("piped stdout"), &out_buf);
        let err_reader = drain(child.stderr.take().expect("piped stderr"), &err_buf);
        let status = wait_guarded(&mut child, self.guard, &mut watch).unwrap_or_else(|| {
            let so_far = Outcome {
                args: args.clone(),
                exit_code: None,
                stdout: out_buf.lock().expect("lock").clone(),
                stderr: String::from_utf8_lossy(&err_buf.lock().expect("lock")).into_owned(),
                wall: start.elapsed(),
            };
            panic!(
                "pycell did not finish within the test's guard of {:?}; killed it\n{}",
                self.guard,
                so_far.describe()
            )
        });
        let wall = start.elapsed();
        let _ = writer.join();
        // The readers end when every holder of the pipes' write ends exits;
        // a jail process that escaped pycell's cleanup would keep them open,
        // so don't wait forever for them.
        join_bounded(out_reader, Duration::from_secs(10), "stdout");
        join_bounded(err_reader, Duration::from_secs(10), "stderr");
        let stdout = out_buf.lock().expect("lock").clone();
        let stderr = String::from_utf8_lossy(&err_buf.lock().expect("lock")).into_owned();
        Outcome {
            args,
            exit_code: status.code(),
            stdout,
            stderr,
            wall,
        }
    }
}

fn drain<R: Read + Send + 'static>(mut r: R, buf: &Arc<Mutex<Vec<u8>>>) -> JoinHandle<()> {
    let buf = Arc::clone(buf);
    thread::spawn(move || {
        let mut chunk = [0u8; 65536];
        loop {
            match r.read(&mut chunk) {
                Ok(0) | Err(_) => break,
                Ok(n) => buf.lock().expect("lock").extend_from_slice(&chunk[..n]),
            }
        }
    })
}

fn join_bounded(h: JoinHandle<()>, limit: Duration, what: &str) {
    let deadline = Instant::now() + limit;
    while !h.is_finished() {
        assert!(
            Instant::now() < deadline,
            "pycell exited but its {what} pipe stayed open for {limit:?}: some process from the run outlived pycell"
        );
        thread::sleep(Duration::from_millis(20));
    }
    let _ = h.join();
}

fn wait_guarded(
    child: &mut Child,
    guard: Duration,
    watch: &mut dyn FnMut(),
) -> Option<std::process::ExitStatus> {
    let deadline = Instant::now() + guard;
    loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            return Some(status);
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        watch();
        thread::sleep(Duration::from_millis(50));
    }
}

/// How a guarded child ended and what it printed.
#[derive(Debug)]
pub struct GuardedOutput {
    /// None: still running at the guard, so it was killed.
    pub status: Option<std::process::ExitStatus>,
    pub stdout: String,
    pub stderr: String,
}

/// Wait at most `guard` for `child` (stdout and stderr piped), killing it
/// then, and collect everything it printed.
pub fn output_guarded(mut child: Child, guard: Duration) -> GuardedOutput {
    let out = Arc::new(Mutex::new(Vec::new()));
    let err = Arc::new(Mutex::new(Vec::new()));
    let readers = [
        drain(child.stdout.take().expect("piped stdout"), &out),
        drain(child.stderr.take().expect("piped stderr"), &err),
    ];
    let status = wait_guarded(&mut child, guard, &mut || {});
    for r in readers {
        let _ = r.join();
    }
    let text =
        |b: &Arc<Mutex<Vec<u8>>>| String::from_utf8_lossy(&b.lock().expect("lock")).into_owned();
    GuardedOutput {
        status,
        stdout: text(&out),
        stderr: text(&err),
    }
}

/// A Python script written to a fresh temp dir (the dir lives as long as
/// this value).
#[derive(Debug)]
pub struct Script {
    _dir: tempfile::TempDir,
    pub path: PathBuf,
}

impl Script {
    pub fn new(name: &str, code: &str) -> Self {
        let dir = tempfile::Builder::new()
            .prefix("pycell-test-")
            .tempdir()
            .expect("tempdir");
        let path = dir.path().join(name);
        fs::write(&path, code).expect("write script");
        Script { _dir: dir, path }
    }
}

/// `pycell run --json <opts...> SCRIPT [-- script_args...]` for `code`.
pub fn run_code(name: &str, code: &str, opts: &[&str], script_args: &[&str]) -> Outcome {
    let script = Script::new(name, code);
    let out = run_file(&script.path, opts, script_args);
    drop(script);
    out
}

/// `pycell run --json <opts...> PATH [-- script_args...]`.
pub fn run_file(path: &Path, opts: &[&str], script_args: &[&str]) -> Outcome {
    Pycell::new(run_args(path, opts, script_args)).run()
}

/// The argv (after the binary) of `pycell run --json <opts...> PATH [-- args...]`.
pub fn run_args(path: &Path, opts: &[&str], script_args: &[&str]) -> Vec<OsString> {
    let mut args: Vec<OsString> = vec!["run".into(), "--json".into()];
    args.extend(opts.iter().map(OsString::from));
    args.push(path.as_os_str().to_owned());
    if !script_args.is_empty() {
        args.push("--".into());
        args.extend(script_args.iter().map(OsString::from));
    }
    args
}

/// The result's `status` field, or a panic naming the run.
pub fn status_of(out: &Outcome) -> String {
    out.result()["status"]
        .as_str()
        .unwrap_or_else(|| panic!("result has no string \"status\"\n{}", out.describe()))
        .to_string()
}

/// The one entry of a result's (or cell's) `refusals` for `layer`,
/// checked to be whole: a count, the `rule` wanted, an object and a
/// remedy that does not say to turn the sandbox off.
pub fn refusal<'a>(result: &'a Value, layer: &str, rule: &str) -> &'a Value {
    let list = result["refusals"]
        .as_array()
        .unwrap_or_else(|| panic!("no refusals list in {}", compact(result, 3000)));
    let of_layer: Vec<&Value> = list.iter().filter(|r| r["layer"] == layer).collect();
    let [entry] = of_layer[..] else {
        panic!("want one {layer} refusal: {}", compact(result, 3000));
    };
    assert!(entry["count"].as_u64().unwrap_or(0) >= 1, "{entry}");
    assert!(
        entry["rule"].as_str().is_some_and(|r| r.starts_with(rule)),
        "rule of {entry}, want {rule}"
    );
    let remedy = entry["remedy"].as_str().unwrap_or_default();
    assert!(!remedy.is_empty() && !remedy.contains("disable"), "{entry}");
    assert!(
        entry["object"].as_str().is_some_and(|o| !o.is_empty()),
        "{entry}"
    );
    entry
}

/// The layers of a result's `refusals`, in order.
pub fn refused_layers(result: &Value) -> Vec<String> {
    result["refusals"]
        .as_array()
        .map(|l| {
            l.iter()
                .filter_map(|r| r["layer"].as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default()
}

/// A result's `termination.reason`.
pub fn termination_of(result: &Value) -> String {
    result["termination"]["reason"]
        .as_str()
        .unwrap_or_else(|| panic!("no termination in {}", compact(result, 3000)))
        .to_string()
}

/// The probe's report: the single JSON object the script printed, taken from
/// the result's `stdout`.
pub fn probe_report(out: &Outcome) -> Value {
    let result = out.result();
    let stdout = result["stdout"]
        .as_str()
        .unwrap_or_else(|| panic!("result has no string \"stdout\"\n{}", out.describe()));
    let line = stdout
        .lines()
        .rev()
        .find(|l| l.trim_start().starts_with('{'))
        .unwrap_or_else(|| panic!("the probe printed no JSON report\n{}", out.describe()));
    serde_json::from_str(line)
        .unwrap_or_else(|e| panic!("the probe's report is not JSON ({e})\n{}", out.describe()))
}

/// A pointer into a JSON value, with a useful panic if absent.
pub fn at<'a>(v: &'a Value, pointer: &str) -> &'a Value {
    v.pointer(pointer)
        .unwrap_or_else(|| panic!("no {pointer} in {}", compact(v, 3000)))
}

/// `v` as compact JSON, cut to `max` bytes for messages.
pub fn compact(v: &Value, max: usize) -> String {
    truncate_for_message(&v.to_string(), max)
}

// ------------------------------------------------------------ host processes

/// One host process and its uids (real, effective, saved, filesystem).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostProc {
    pub pid: u32,
    pub ppid: u32,
    pub name: String,
    pub uids: Vec<u32>,
}

/// Every process on the host, read from /proc/*/status. Processes that exit
/// while being read are skipped.
pub fn host_processes() -> Vec<HostProc> {
    let mut out = Vec::new();
    let Ok(entries) = fs::read_dir("/proc") else {
        return out;
    };
    for e in entries.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(status) = fs::read_to_string(e.path().join("status")) else {
            continue;
        };
        let mut name = String::new();
        let mut uids = Vec::new();
        let mut ppid = 0;
        for line in status.lines() {
            if let Some(v) = line.strip_prefix("Name:") {
                name = v.trim().to_string();
            } else if let Some(v) = line.strip_prefix("PPid:") {
                ppid = v.trim().parse().unwrap_or(0);
            } else if let Some(v) = line.strip_prefix("Uid:") {
                uids = v
                    .split_whitespace()
                    .filter_map(|x| x.parse().ok())
                    .collect();
            }
        }
        out.push(HostProc {
            pid,
            ppid,
            name,
            uids,
        });
    }
    out
}

/// The host processes whose parent is `pid`.
pub fn children_of(pid: u32) -> Vec<HostProc> {
    host_processes()
        .into_iter()
        .filter(|p| p.ppid == pid)
        .collect()
}

/// Every host process below `pid` (children, theirs, and so on), as the
/// host sees them now.
/// Every entry below `dir` with its own metadata (links not followed),
/// handed to `each`.
pub fn walk_tree(dir: &Path, each: &mut dyn FnMut(&Path, &fs::Metadata)) {
    for entry in fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        let meta = fs::symlink_metadata(&path).unwrap();
        each(&path, &meta);
        if meta.is_dir() {
            walk_tree(&path, each);
        }
    }
}

pub fn descendants_of(pid: u32) -> Vec<HostProc> {
    let all = host_processes();
    let mut found: Vec<HostProc> = Vec::new();
    let mut frontier = vec![pid];
    while let Some(parent) = frontier.pop() {
        for p in all.iter().filter(|p| p.ppid == parent) {
            frontier.push(p.pid);
            found.push(p.clone());
        }
    }
    found
}

/// Wait up to `limit` for every process of `procs` to be gone; those
/// still there then.
pub fn still_alive_after(procs: &[HostProc], limit: Duration) -> Vec<HostProc> {
    let deadline = Instant::now() + limit;
    loop {
        let alive: Vec<HostProc> = procs
            .iter()
            .filter(|p| Path::new(&format!("/proc/{}", p.pid)).exists())
            .cloned()
            .collect();
        if alive.is_empty() || Instant::now() >= deadline {
            return alive;
        }
        thread::sleep(Duration::from_millis(50));
    }
}

/// `pycell batch --embedded ARGS... -` under the cgroup parent `parent`
/// with `lines` sleepers (then one quick line) on its stdin, once exactly
/// `pythons` python processes run below it (more fails the test): pycell,
/// and what runs below it.
pub fn batch_of_sleepers(
    args: &[&str],
    parent: &str,
    lines: usize,
    pythons: usize,
) -> (Child, Vec<HostProc>) {
    let sleeper =
        serde_json::json!({"code": "import time; print('up', flush=True); time.sleep(60)"});
    let mut input: String = (0..lines).map(|_| format!("{sleeper}\n")).collect();
    input.push_str(&format!(
        "{}\n",
        serde_json::json!({"code": "print('after')"})
    ));
    let mut child = Command::new(pycell_bin())
        .args(["batch", "--embedded"])
        .args(args)
        .arg("-")
        .env("PYCELL_CGROUP_PARENT", parent)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting pycell batch");
    let mut stdin = child.stdin.take().expect("piped stdin");
    stdin
        .write_all(input.as_bytes())
        .expect("writing the batch");
    drop(stdin);
    let deadline = Instant::now() + Duration::from_secs(20);
    let (running, below) = loop {
        let below = descendants_of(child.id());
        let running = below
            .iter()
            .filter(|p| p.name.starts_with("python"))
            .count();
        if running >= pythons || Instant::now() > deadline {
            break (running, below);
        }
        thread::sleep(Duration::from_millis(50));
    };
    if running != pythons {
        let _ = child.kill();
        let _ = child.wait();
        panic!("{running} python processes below pycell batch, not {pythons}: {below:?}");
    }
    (child, below)
}

/// SIGKILL `pycell batch --embedded ARGS...` of `lines` sleepers once
/// `pythons` python processes run below it (under the cgroup parent
/// `parent`); fail unless every process that was below it, and every
/// cgroup of its runs, is gone within 10 s.
pub fn sigkill_batch_leaves_nothing(args: &[&str], parent: &str, lines: usize, pythons: usize) {
    let (mut child, below) = batch_of_sleepers(args, parent, lines, pythons);
    let pid = nix::unistd::Pid::from_raw(child.id() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL).expect("SIGKILL to pycell");
    let _ = child.wait();
    let left = still_alive_after(&below, Duration::from_secs(10));
    assert!(
        left.is_empty(),
        "left running after pycell was killed: {left:?}"
    );
    // Every run's cgroup is gone (its jailer removed it as it died).
    assert_no_cgroups_under(parent);
}

/// Fail unless every cgroup under the parent `parent` is gone within 10 s;
/// then remove `parent` too.
pub fn assert_no_cgroups_under(parent: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    let left = loop {
        let left: Vec<PathBuf> = find_cgroups_named(parent)
            .iter()
            .flat_map(|d| fs::read_dir(d).into_iter().flatten().flatten())
            .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
            .map(|e| e.path())
            .collect();
        if left.is_empty() || Instant::now() > deadline {
            break left;
        }
        thread::sleep(Duration::from_millis(50));
    };
    remove_cgroup_parent(parent, Duration::from_secs(1));
    assert!(left.is_empty(), "cgroups left behind: {left:?}");
}

/// Host processes any of whose uids is `uid`.
pub fn processes_with_uid(uid: u32) -> Vec<HostProc> {
    host_processes()
        .into_iter()
        .filter(|p| p.uids.contains(&uid))
        .collect()
}

// ------------------------------------------------------------------ cgroups

/// Directories below which pycell may create a sandbox's cgroup: every
/// controller hierarchy under /sys/fs/cgroup, and this process's own cgroup
/// in each hierarchy (on the hybrid hosts here the memory cgroup is nested,
/// see /proc/self/cgroup).
pub fn cgroup_search_roots() -> Vec<PathBuf> {
    let base = Path::new("/sys/fs/cgroup");
    let mut roots: Vec<PathBuf> = Vec::new();
    let pure_v2 = base.join("cgroup.controllers").exists();
    if pure_v2 {
        roots.push(base.to_path_buf());
    } else if let Ok(entries) = fs::read_dir(base) {
        for e in entries.flatten() {
            if e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                roots.push(e.path());
            }
        }
    }
    if let Ok(own) = fs::read_to_string("/proc/self/cgroup") {
        for line in own.lines() {
            let mut parts = line.splitn(3, ':');
            let (_, ctrls, path) = match (parts.next(), parts.next(), parts.next()) {
                (Some(a), Some(b), Some(c)) => (a, b, c),
                _ => continue,
            };
            let rel = path.trim_start_matches('/');
            let hierarchy = if ctrls.is_empty() {
                if pure_v2 {
                    base.to_path_buf()
                } else {
                    base.join("unified")
                }
            } else {
                let first = ctrls.split(',').next().unwrap_or(ctrls);
                let name = first.strip_prefix("name=").unwrap_or(first);
                let dir = base.join(ctrls.strip_prefix("name=").unwrap_or(ctrls));
                if dir.is_dir() {
                    dir
                } else {
                    base.join(name)
                }
            };
            if !rel.is_empty() {
                roots.push(hierarchy.join(rel));
            }
        }
    }
    let mut seen = BTreeSet::new();
    roots
        .into_iter()
        .filter(|r| r.is_dir())
        .filter(|r| seen.insert(fs::canonicalize(r).unwrap_or_else(|_| r.clone())))
        .collect()
}

/// Cgroup directories (at most 3 levels below each search root) whose name
/// satisfies `pred`.
pub fn find_cgroups(pred: impl Fn(&str) -> bool) -> BTreeSet<PathBuf> {
    let mut found = BTreeSet::new();
    for root in cgroup_search_roots() {
        let mut level = vec![root];
        for _depth in 0..3 {
            let mut next = Vec::new();
            for dir in &level {
                let Ok(entries) = fs::read_dir(dir) else {
                    continue;
                };
                for e in entries.flatten() {
                    if !e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                        continue;
                    }
                    if e.file_name().to_str().is_some_and(&pred) {
                        found.insert(e.path());
                    }
                    next.push(e.path());
                }
            }
            level = next;
        }
    }
    found
}

/// Cgroup directories named exactly `name`.
pub fn find_cgroups_named(name: &str) -> BTreeSet<PathBuf> {
    find_cgroups(|n| n == name)
}

/// Whether `dir` is a cgroup pycelld keeps for its next runs
/// (`pycell-kept-N`, v1) and no process is in it.
pub fn is_kept_empty(dir: &Path) -> bool {
    let kept = dir
        .file_name()
        .is_some_and(|n| n.to_string_lossy().starts_with("pycell-kept-"));
    kept && fs::read_to_string(dir.join("cgroup.procs")).is_ok_and(|p| p.trim().is_empty())
}

/// Remove the (empty) cgroup directories named `name` that a test's
/// daemon left when it was SIGKILLed, and the cgroups it kept for its next
/// runs below them (as its next start would), waiting up to `within` for
/// its jailers to remove their runs' cgroups first. Directories still in
/// use stay.
pub fn remove_cgroup_parent(name: &str, within: Duration) {
    let deadline = Instant::now() + within;
    loop {
        let left: Vec<PathBuf> = find_cgroups_named(name)
            .into_iter()
            .filter(|d| {
                let kept = fs::read_dir(d).into_iter().flatten().flatten();
                for k in
                    kept.filter(|k| k.file_name().to_string_lossy().starts_with("pycell-kept-"))
                {
                    let _ = fs::remove_dir(k.path());
                }
                fs::remove_dir(d).is_err()
            })
            .collect();
        if left.is_empty() || Instant::now() >= deadline {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A temp dir every uid may read and enter (0755): for sandbox uids and a
/// second test uid.
pub fn open_tempdir(prefix: &str) -> tempfile::TempDir {
    let dir = tempfile::Builder::new().prefix(prefix).tempdir().unwrap();
    fs::set_permissions(
        dir.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    dir
}

/// The pycell group (scripts/setup creates it).
pub fn pycell_gid() -> nix::unistd::Gid {
    nix::unistd::Group::from_name("pycell")
        .unwrap()
        .expect("the pycell group (scripts/setup creates it)")
        .gid
}

/// This test process's own directory under `base` (`base/PID`), empty:
/// two runs of the suite at once never remove each other's files. Those
/// of processes that are gone are removed first.
pub fn own_dir_under(base: &Path) -> PathBuf {
    for old in fs::read_dir(base).into_iter().flatten().flatten() {
        let pid = old.file_name().to_string_lossy().parse::<u32>().ok();
        if pid.is_some_and(|p| !Path::new(&format!("/proc/{p}")).exists()) {
            let _ = fs::remove_dir_all(old.path());
        }
    }
    let own = base.join(std::process::id().to_string());
    let _ = fs::remove_dir_all(&own);
    fs::create_dir_all(&own).expect("the test's own directory");
    own
}

/// The spec `pycell debug spec` gives for a script of `code` (a uid lease
/// taken and given back, as for a run): what its jailer would read.
pub fn debug_spec(code: &str) -> pycell_wire::spec::JailSpec {
    let script = tempfile::Builder::new().suffix(".py").tempfile().unwrap();
    fs::write(script.path(), code).unwrap();
    let out = Command::new(pycell_bin())
        .args(["debug", "spec"])
        .arg(script.path())
        .output()
        .expect("pycell debug spec");
    assert!(out.status.success(), "{out:?}");
    serde_json::from_slice(&out.stdout).expect("a spec")
}
