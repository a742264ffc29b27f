//! The jail's hardening (issue 11): a sandbox never outlives its jailer,
//! and the kernel doors a run could use against the host or its co-tenants
//! stay shut. Each test runs hostile code only inside a jail with limits,
//! bounded in count and time.

#![forbid(unsafe_code)]

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use pycell_tests::{
    children_of, find_cgroups, probe_report, processes_with_uid, pycell_bin, require_root,
    run_code, status_of, Script,
};
use serde_json::Value;

/// errno ENOSPC, as Python reports it.
const ENOSPC: u64 = 28;

/// An embedded `pycell run` of `code`, started; returns once the code
/// printed its first line.
fn start_embedded(code: &str, opts: &[&str]) -> (Child, Script) {
    let (child, script, _) = start_embedded_line(code, opts);
    (child, script)
}

/// [`start_embedded`], with the first line the code printed.
fn start_embedded_line(code: &str, opts: &[&str]) -> (Child, Script, String) {
    require_root();
    let script = Script::new("long.py", code);
    let mut child = Command::new(pycell_bin())
        .args(["run", "--embedded"])
        .args(opts)
        .arg(&script.path)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn pycell run");
    let mut first = String::new();
    BufReader::new(child.stdout.as_mut().expect("piped stdout"))
        .read_line(&mut first)
        .expect("read the run's first line");
    assert!(!first.is_empty(), "the run printed nothing");
    (child, script, first)
}

/// The only child of `pid` called `name`.
fn only_child(pid: u32, name: &str) -> u32 {
    let kids: Vec<u32> = children_of(pid)
        .into_iter()
        .filter(|p| p.name == name)
        .map(|p| p.pid)
        .collect();
    assert_eq!(kids.len(), 1, "children of {pid} named {name}: {kids:?}");
    kids[0]
}

/// The sandbox uid of a running jail: the uid of its init.
fn sandbox_uid_under(jailer: u32) -> u32 {
    let init = only_child(jailer, "pycell-init");
    let procs = pycell_tests::host_processes();
    let p = procs.iter().find(|p| p.pid == init).expect("init listed");
    p.uids[0]
}

fn wait_until_gone(uid: u32, within: Duration) {
    let deadline = Instant::now() + within;
    let prefix = format!("pycell-{uid}-");
    loop {
        let procs = processes_with_uid(uid);
        let cgroups = find_cgroups(|n| n.starts_with(&prefix));
        if procs.is_empty() && cgroups.is_empty() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "left behind {within:?} after the jailer died: processes {procs:?}, cgroups {cgroups:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_sigkilled_jailer_takes_its_sandbox_and_cgroup_along() {
    let code = "import time\nprint('ready', flush=True)\ntime.sleep(60)\n";
    let (mut child, _script) = start_embedded(code, &["--timeout", "60"]);
    let jailer = only_child(child.id(), "pycell-jailer");
    let uid = sandbox_uid_under(jailer);
    assert!(!processes_with_uid(uid).is_empty(), "the sandbox runs");
    kill(Pid::from_raw(jailer as i32), Signal::SIGKILL).expect("kill -9 the jailer");
    wait_until_gone(uid, Duration::from_secs(5));
    let status = child.wait().expect("pycell run ends");
    assert!(
        !status.success(),
        "pycell run reports the dead jailer: {status}"
    );
}

#[test]
fn one_disk_budget_bounds_workspace_tmp_and_shm_together() {
    let code = r#"
import json
stored = {}
for place in ["/workspace/a", "/tmp/b", "/dev/shm/c"]:
    n = 0
    try:
        with open(place, "wb") as f:
            for _ in range(30):
                f.write(b"\1" * (1 << 20))
                f.flush()
                n += 1
    except OSError as e:
        stored[place + " error"] = e.errno
    stored[place] = n
print(json.dumps(stored))
"#;
    let out = run_code("disk.py", code, &["--disk", "64M"], &[]);
    assert_eq!(status_of(&out), "ok", "{}", out.describe());
    let r = probe_report(&out);
    let total: u64 = ["/workspace/a", "/tmp/b", "/dev/shm/c"]
        .iter()
        .map(|k| r[*k].as_u64().unwrap())
        .sum();
    assert!(
        total < 64,
        "{total} MiB stored under a 64 MiB disk limit: {r}"
    );
    assert_eq!(r["/dev/shm/c error"], ENOSPC, "{r}");
    let used = out.result()["disk_used_bytes"].as_u64().unwrap();
    assert!(
        used > 60 << 20 && used <= 64 << 20,
        "disk_used_bytes {used}"
    );
}

#[test]
fn socket_buffers_count_against_the_memory_limit() {
    // 60 loopback connections that are never read, each written to until
    // the kernel stops taking data: the queued bytes are kernel memory the
    // host holds for the run.
    let code = r#"
import json, socket, time
srv = socket.socket()
srv.bind(("127.0.0.1", 0))
srv.listen(100)
pairs, queued, deadline = [], 0, time.monotonic() + 20
for _ in range(60):
    c = socket.create_connection(srv.getsockname())
    s, _ = srv.accept()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 32 << 20)
    c.setblocking(False)
    pairs.append((c, s))
    chunk = b"\0" * (1 << 20)
    while time.monotonic() < deadline:
        try:
            queued += c.send(chunk)
        except (BlockingIOError, OSError):
            break
print(json.dumps({"queued_mib": queued >> 20}))
"#;
    let out = run_code("sockets.py", code, &["--memory", "64M"], &[]);
    let result = out.result();
    if result["status"] == "oom" {
        // cgroup v2 charges the buffers to memory.max itself: filling them
        // ends in the OOM killer. (v1's separate TCP limit makes the sends
        // stop instead.) The network stack charges some socket memory even
        // past the limit rather than drop it (seen on Debian 12's 6.1: 40
        // KiB over), so a little slack; unaccounted buffers would have let
        // the sends go far beyond it.
        assert_eq!(
            result["layers"]["cgroup"]["version"],
            "v2",
            "{}",
            out.describe()
        );
        let peak = result["peak_memory_bytes"].as_u64().unwrap_or(u64::MAX);
        assert!(
            peak <= (64 << 20) + (1 << 20),
            "peak {peak}: more than 1 MiB above the 64 MiB limit"
        );
        return;
    }
    let r = probe_report(&out);
    let queued = r["queued_mib"].as_u64().unwrap();
    assert!(
        queued < 64,
        "{queued} MiB queued in socket buffers under a 64 MiB memory limit\n{}",
        out.describe()
    );
}

#[test]
fn inet_sockets_other_than_tcp_and_udp_are_refused() {
    let code = r#"
import json, socket
tried = {}
for name, args in {
    "tcp": (socket.AF_INET, socket.SOCK_STREAM, 0),
    "udp6": (socket.AF_INET6, socket.SOCK_DGRAM, socket.IPPROTO_UDP),
    "sctp": (socket.AF_INET, socket.SOCK_SEQPACKET, 132),
    "sctp_stream": (socket.AF_INET, socket.SOCK_STREAM, 132),
    "mptcp": (socket.AF_INET, socket.SOCK_STREAM, 262),
    "udplite": (socket.AF_INET6, socket.SOCK_DGRAM, 136),
    "l2tp": (socket.AF_INET, socket.SOCK_DGRAM, 115),
    "dccp": (socket.AF_INET, 6, 33),
    "smc": (socket.AF_INET, socket.SOCK_STREAM, 256),
}.items():
    try:
        socket.socket(*args).close()
        tried[name] = "ok"
    except OSError as e:
        tried[name] = e.errno
print(json.dumps(tried))
"#;
    let out = run_code("sockets.py", code, &[], &[]);
    let r = probe_report(&out);
    assert_eq!(r["tcp"], "ok", "{r}");
    assert_eq!(r["udp6"], "ok", "{r}");
    for name in ["sctp_stream", "mptcp", "udplite", "l2tp", "dccp", "smc"] {
        assert_eq!(r[name], 93, "{name}: EPROTONOSUPPORT expected: {r}");
    }
    assert_eq!(r["sctp"], 93, "{r}");
}

#[test]
fn code_written_to_a_memfd_cannot_be_executed() {
    let code = r#"
import os
try:
    fd = os.memfd_create("payload")
    os.write(fd, open("/usr/bin/true", "rb").read())
    os.execv(f"/proc/self/fd/{fd}", ["payload"])
except OSError as e:
    print("refused", e.errno)
import ctypes, glob, shutil
lib = sorted(glob.glob("/usr/lib/*/libz.so.1*"))[0]
shutil.copy(lib, "/workspace/written.so")
try:
    ctypes.CDLL("/workspace/written.so")
    print("loaded a library it wrote")
except OSError:
    print("library refused")
"#;
    let out = run_code("memfd.py", code, &[], &[]);
    let stdout = out.result()["stdout"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(
        stdout.starts_with("refused"),
        "a memfd was executed\n{}",
        out.describe()
    );
    assert!(
        stdout.contains("library refused"),
        "a library the run wrote was loaded\n{}",
        out.describe()
    );
}

#[test]
fn the_jail_cannot_fingerprint_the_host() {
    let code = r#"
import json, os, time
seen = {"monotonic": time.monotonic(), "boottime": time.clock_gettime(time.CLOCK_BOOTTIME),
        "cpus": os.cpu_count()}
for f in ["stat", "interrupts", "diskstats", "cmdline", "uptime", "sys/kernel/random/boot_id"]:
    try:
        seen[f] = open("/proc/" + f).read()
    except OSError as e:
        seen[f] = e.errno
seen["acpi"] = os.listdir("/proc/acpi") if os.path.isdir("/proc/acpi") else []
print(json.dumps(seen))
"#;
    // The host's clocks before the run: a jail's count from its own start
    // (its time namespace), which is later. A warm jail may have waited in
    // its pool a while, so its clocks are not near zero, but they are
    // behind the host's.
    let host = |id| {
        let t = nix::time::clock_gettime(id).unwrap();
        t.tv_sec() as f64 + t.tv_nsec() as f64 * 1e-9
    };
    let before = [
        ("monotonic", host(nix::time::ClockId::CLOCK_MONOTONIC)),
        ("boottime", host(nix::time::ClockId::CLOCK_BOOTTIME)),
    ];
    let out = run_code("fingerprint.py", code, &[], &[]);
    let r = probe_report(&out);
    for (clock, host_then) in before {
        let v = r[clock].as_f64().unwrap();
        assert!(
            v + 1.0 < host_then,
            "{clock} reads {v} in the jail, the host's read {host_then} before it started: the host's uptime shows"
        );
    }
    for f in [
        "stat",
        "interrupts",
        "diskstats",
        "cmdline",
        "uptime",
        "sys/kernel/random/boot_id",
    ] {
        assert_eq!(r[f], "", "/proc/{f} is readable in the jail: {r}");
    }
    assert_eq!(r["acpi"], serde_json::json!([]), "{r}");
    assert!(
        r["cpus"].as_u64().unwrap() >= 1,
        "cpu count still known: {r}"
    );
}

#[test]
fn every_rlimit_is_pinned_whatever_the_caller_had() {
    let code = r#"
import json, os, resource
r = {n: resource.getrlimit(getattr(resource, n)) for n in
     ["RLIMIT_RTPRIO", "RLIMIT_CORE", "RLIMIT_STACK", "RLIMIT_MEMLOCK", "RLIMIT_NOFILE", "RLIMIT_NICE"]}
try:
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    r["core_lowered"] = True
except (OSError, ValueError):
    r["core_lowered"] = False
try:
    os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))
    os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
    r["fifo"] = True
except OSError:
    r["fifo"] = False
print(json.dumps(r))
"#;
    require_root();
    let script = Script::new("rlimits.py", code);
    let out = Command::new("prlimit")
        .args([
            // Raising the real-time priority limit would need
            // CAP_SYS_RESOURCE, which root lacks on these hosts; the test
            // shows the values are set, not inherited, with the others.
            "--core=unlimited:unlimited",
            "--stack=unlimited:unlimited",
            "--memlock=8388608:8388608",
            "--nofile=1024:1024",
            "--",
        ])
        .arg(pycell_bin())
        .args(pycell_tests::with_mode(vec!["run".into(), "--json".into()]))
        .arg(&script.path)
        .stdin(Stdio::null())
        .output()
        .expect("prlimit runs pycell");
    let result: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stderr)));
    let stdout = result["stdout"].as_str().unwrap_or_default();
    let r: Value = serde_json::from_str(stdout.trim()).unwrap_or_else(|e| panic!("{e}: {result}"));
    assert_eq!(r["RLIMIT_RTPRIO"], serde_json::json!([0, 0]), "{r}");
    assert_eq!(r["RLIMIT_NICE"], serde_json::json!([0, 0]), "{r}");
    assert_eq!(r["RLIMIT_CORE"], serde_json::json!([1, 1]), "{r}");
    assert_eq!(
        r["RLIMIT_STACK"],
        serde_json::json!([8 << 20, 8 << 20]),
        "{r}"
    );
    assert_eq!(
        r["RLIMIT_MEMLOCK"],
        serde_json::json!([64 << 10, 64 << 10]),
        "{r}"
    );
    assert_eq!(
        r["RLIMIT_NOFILE"],
        serde_json::json!([256, 256]),
        "above the caller's 64: {r}"
    );
    assert_eq!(r["core_lowered"], false, "{r}");
    assert_eq!(r["fifo"], false, "{r}");
}

#[test]
fn bind_sources_a_less_trusted_user_could_change_are_refused() {
    require_root();
    // A directory under /var/tmp (world-writable): anyone could have put it
    // there, or swap it for a symlink to /root.
    let dir = tempfile::Builder::new()
        .prefix("pycell-untrusted-")
        .tempdir_in("/var/tmp")
        .expect("tempdir");
    let data = dir.path().join("data");
    std::fs::create_dir(&data).unwrap();
    let policy_dir = tempfile::tempdir().expect("policy dir");
    let default = std::fs::read_to_string(pycell_tests::repo_root().join("policies/default.toml"))
        .expect("default policy");
    let policy = default.replace("name = \"default\"", "name = \"untrusted\"")
        + &format!("\n[[mounts]]\nsource = \"{}\"\n", data.display());
    // [[mounts]] must come before [landlock]; append it as the last mount.
    let policy = reorder_mounts_last(&policy);
    let policy_file = policy_dir.path().join("untrusted.toml");
    std::fs::write(&policy_file, policy).unwrap();
    let policy_arg = policy_file.to_string_lossy().into_owned();
    let out = pycell_tests::Pycell::new(["run", "--json", "--policy", &policy_arg, "-"])
        .stdin("print('ran')")
        .run();
    assert_eq!(status_of(&out), "refused", "{}", out.describe());
    let error = &out.result()["error"];
    assert_eq!(error["code"], "mounts_failed", "{error}");
    let message = error["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("writable by others") && message.contains("/var/tmp"),
        "{message}"
    );
}

/// The default policy with an extra [[mounts]] entry moved next to the others.
fn reorder_mounts_last(policy: &str) -> String {
    let (head, extra) = policy
        .rsplit_once("\n[[mounts]]\n")
        .expect("appended mount");
    let at = head.find("\n[landlock]").expect("[landlock] table");
    format!("{}\n[[mounts]]\n{}{}", &head[..at], extra, &head[at..])
}

#[test]
fn programs_get_pseudo_terminals_of_their_own_but_no_input_injection() {
    let code = r#"
import fcntl, json, os, pty, sys, termios
seen = {}
master, slave = os.openpty()
seen["ttyname"] = os.ttyname(slave)
os.write(master, b"typed\n")
seen["read"] = os.read(slave, 100).decode()
try:
    fcntl.ioctl(slave, termios.TIOCSTI, b"x")
    seen["tiocsti"] = "allowed"
except OSError as e:
    seen["tiocsti"] = e.errno
try:
    fcntl.ioctl(slave, termios.TIOCLINUX, b"\x02")
    seen["tioclinux"] = "allowed"
except OSError as e:
    seen["tioclinux"] = e.errno
stdout = os.dup(1)
os.dup2(os.open("/tmp/spawned", os.O_WRONLY | os.O_CREAT), 1)
seen["spawn"] = pty.spawn([sys.executable, "-c", "import os; print('a tty:', os.isatty(0))"])
os.dup2(stdout, 1)
seen["spawned"] = open("/tmp/spawned").read()
seen["pts"] = sorted(os.listdir("/dev/pts"))
print(json.dumps(seen))
"#;
    let out = run_code("terminals.py", code, &[], &[]);
    let r = probe_report(&out);
    assert_eq!(r["ttyname"], "/dev/pts/0", "{r}");
    assert_eq!(r["read"], "typed\n", "{r}");
    // EPERM from the seccomp filter.
    assert_eq!(r["tiocsti"], 1, "{r}");
    assert_eq!(r["tioclinux"], 1, "{r}");
    assert_eq!(r["spawn"], 0, "{r}");
    assert!(
        r["spawned"].as_str().unwrap().contains("a tty: True"),
        "{r}"
    );
    // Its own instance: none of the host's terminals, only its own.
    assert_eq!(r["pts"], serde_json::json!(["0", "ptmx"]), "{r}");
}

/// How many more inotify instances this process (host root) can open
/// now: the kernel's per-user count against fs.inotify.max_user_instances.
fn free_inotify_instances() -> usize {
    use nix::sys::inotify::{InitFlags, Inotify};
    let mut held = Vec::new();
    while held.len() < 1 << 20 {
        match Inotify::init(InitFlags::IN_CLOEXEC) {
            Ok(i) => held.push(i),
            Err(_) => break,
        }
    }
    held.len()
}

#[test]
fn a_sandbox_pays_for_its_own_inotify_instances_never_host_roots() {
    require_root();
    // A policy that lets the run hold 100 instances (of the host's 128
    // per user): when the jail's user namespace was host root's, what it
    // held was taken from root's budget, from every service of root's.
    let default = std::fs::read_to_string(pycell_tests::repo_root().join("policies/default.toml"))
        .expect("default policy");
    let policy = default
        .replace("name = \"default\"", "name = \"watcher\"")
        .replace("inotify_instances = 16", "inotify_instances = 100");
    assert!(policy.contains("inotify_instances = 100"), "{policy}");
    let dir = tempfile::tempdir().expect("policy dir");
    let file = dir.path().join("watcher.toml");
    std::fs::write(&file, policy).unwrap();
    let code = r#"
import ctypes, time
libc = ctypes.CDLL(None, use_errno=True)
fds = []
while len(fds) < 1000:
    fd = libc.inotify_init1(0)
    if fd < 0:
        break
    fds.append(fd)
print(len(fds), ctypes.get_errno(), flush=True)
time.sleep(60)
"#;
    let before = free_inotify_instances();
    let (mut child, _script, held) =
        start_embedded_line(code, &["--policy", &file.to_string_lossy()]);
    let during = free_inotify_instances();
    let _ = child.kill();
    let _ = child.wait();
    // The run's own limit stopped it (EMFILE), at exactly its policy's 100.
    assert!(held.starts_with("100 24"), "the run held: {held:?}");
    // Other tests may open a few meanwhile; 100 is far outside that.
    assert!(
        during + 8 >= before,
        "host root could open {before} inotify instances before the run and {during} while it held 100"
    );
}
