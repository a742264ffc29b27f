//! Applies the default profile for real (through the pycell-seccomp-try
//! helper) and checks what it lets through: safe Rust probes, and Debian's
//! CPython running threads, asyncio, subprocess and multiprocessing plus raw
//! denied syscalls via ctypes.

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

/// The helper and this crate's directory, as built; the Debian VM, which
/// runs these tests on its own kernel, points them at its copies.
fn try_helper() -> String {
    std::env::var("PYCELL_SECCOMP_TRY")
        .unwrap_or_else(|_| env!("CARGO_BIN_EXE_pycell-seccomp-try").to_string())
}

fn crate_dir() -> String {
    std::env::var("PYCELL_SECCOMP_DIR").unwrap_or_else(|_| env!("CARGO_MANIFEST_DIR").to_string())
}
const PYTHON: &str = "/usr/bin/python3";

const EPERM: i64 = libc::EPERM as i64;
const ENOSYS: i64 = libc::ENOSYS as i64;
const EAFNOSUPPORT: i64 = libc::EAFNOSUPPORT as i64;

/// Runs the helper with a deadline, so a filter that deadlocks the child
/// fails the test instead of hanging it.
fn run(args: &[&str]) -> Output {
    let mut child = Command::new(try_helper())
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn pycell-seccomp-try");
    let deadline = Instant::now() + Duration::from_secs(120);
    while child.try_wait().expect("wait").is_none() {
        if Instant::now() > deadline {
            child.kill().ok();
            panic!("pycell-seccomp-try {args:?} did not finish in 120 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    child.wait_with_output().expect("collect output")
}

fn json_stdout(output: &Output) -> Value {
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "exit {:?}\nstdout: {stdout}\nstderr: {}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_str(stdout.trim()).unwrap_or_else(|e| panic!("bad JSON ({e}): {stdout}"))
}

#[test]
fn probes_see_denials_and_working_basics() {
    let report = json_stdout(&run(&["probe"]));
    assert_eq!(report["profile"], "default");
    let probes = report["probes"].as_object().expect("probes object");

    let denied = [
        ("unshare_newuser", EPERM),
        ("unshare_fs", EPERM),
        ("mount", EPERM),
        ("umount2", EPERM),
        ("chroot", EPERM),
        ("ptrace_traceme", EPERM),
        ("personality_addr_no_randomize", EPERM),
        ("setns_net", EPERM),
        ("socket_packet", EAFNOSUPPORT),
        ("socket_alg", EAFNOSUPPORT),
        ("socket_vsock", EAFNOSUPPORT),
        ("socket_netlink_audit", EPERM),
    ];
    for (name, errno) in denied {
        let probe = &probes[name];
        assert_eq!(probe["ok"], false, "{name} should be denied: {probe}");
        assert_eq!(probe["errno"], errno, "{name}: {probe}");
    }

    let allowed = [
        "personality_query",
        "no_new_privs_set",
        "getpid",
        "pipe",
        "thread",
        "fork_exec_true",
        "tcp_loopback",
        "unix_socketpair",
        "socket_netlink_route",
        "tempfile",
    ];
    for name in allowed {
        assert_eq!(
            probes[name]["ok"], true,
            "{name} should work: {}",
            probes[name]
        );
    }
    assert_eq!(
        probes.len(),
        denied.len() + allowed.len(),
        "unchecked probe in {report}"
    );
}

#[test]
fn apply_refuses_without_no_new_privs() {
    let output = run(&["--skip-no-new-privs", "probe"]);
    assert_eq!(output.status.code(), Some(3));
    assert!(output.stdout.is_empty(), "probes ran without a filter");
    assert_eq!(
        String::from_utf8_lossy(&output.stderr).trim(),
        "pycell-seccomp-try: seccomp filter not applied: no_new_privs is not set on the calling \
         thread; call prctl(PR_SET_NO_NEW_PRIVS, 1) (the jailer's no_new_privs step) before \
         applying seccomp"
    );
}

#[test]
fn unknown_profile_is_refused() {
    let output = run(&["--profile", "nope", "probe"]);
    assert_eq!(output.status.code(), Some(3));
    assert_eq!(
        String::from_utf8_lossy(&output.stderr).trim(),
        "pycell-seccomp-try: unknown seccomp profile \"nope\" (known profiles: default)"
    );
}

#[test]
fn debian_python_runs_under_the_default_profile() {
    assert!(
        Path::new(PYTHON).exists(),
        "{PYTHON} is missing; this test needs Debian's interpreter: apt-get install python3"
    );
    let script = format!("{}/tests/python_workload.py", crate_dir());
    let report = json_stdout(&run(&["--", PYTHON, &script]));

    let workload = &report["workload"];
    assert_eq!(workload["threads"], serde_json::json!([0, 1, 2, 3]));
    assert_eq!(
        workload["asyncio"],
        serde_json::json!(["PING", "child", 49])
    );
    assert_eq!(workload["subprocess"], "hi");
    assert_eq!(workload["pool"], serde_json::json!([1, 4, 9]));
    assert_eq!(workload["ssl"], true);
    assert_eq!(workload["sqlite"], 42);

    let raw = report["raw"].as_object().expect("raw probes");
    let mut expected = vec![
        ("clone3", ENOSYS),
        ("ioctl_tiocsti", EPERM),
        ("ioctl_tiocsti_high_bits", EPERM),
        ("ioctl_tioclinux", EPERM),
        ("ioctl_fionread", 0),
        ("keyctl", EPERM),
        ("bpf", EPERM),
        ("io_uring_setup", EPERM),
        ("userfaultfd", EPERM),
        ("perf_event_open", EPERM),
        ("ptrace_traceme", EPERM),
        ("unshare_newuser", EPERM),
        ("clone_newuser", EPERM),
        ("clone_newnet_high_bits", EPERM),
        ("personality_addr_no_randomize", EPERM),
        ("personality_query", 0),
        ("socket_packet", EAFNOSUPPORT),
        ("socket_packet_high_bits", EAFNOSUPPORT),
        ("unknown_syscall", ENOSYS),
    ];
    if cfg!(target_arch = "x86_64") {
        expected.push(("x32_getpid", ENOSYS));
    }
    for (name, errno) in &expected {
        assert_eq!(raw[*name], *errno, "{name}: got {}", raw[*name]);
    }
    assert_eq!(raw.len(), expected.len(), "unchecked probe in {report}");
}
