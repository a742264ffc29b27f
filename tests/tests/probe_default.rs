//! The probe (tests/probe/probe.py) run once under the default policy; each
//! test below checks one aspect of what it could and could not do.

#![forbid(unsafe_code)]

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::net::TcpListener;
use std::os::fd::AsRawFd;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixListener};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::thread;

use nix::fcntl::{fcntl, FcntlArg, FdFlag, OFlag};
use pycell_tests::{at, compact, probe_path, probe_report, repo_root, run_args, Outcome, Pycell};
use serde_json::Value;

struct ProbeRun {
    outcome: Outcome,
    report: Value,
    /// Set if the host's loopback listener ever accepted a connection.
    tcp_accepted: Arc<AtomicBool>,
    /// Set if the host's abstract unix socket ever accepted a connection.
    unix_accepted: Arc<AtomicBool>,
    secret_token: String,
    secret_paths: Vec<PathBuf>,
    /// An fd pycell itself had open, inheritable, that must not reach the
    /// jail; and a value in pycell's environment that must not either.
    leaked_fd: String,
    env_secret: &'static str,
}

const ENV_SECRET: &str = "xyz-pycell-test-secret-value";

/// Host secrets the jail must not read. The files stay on disk (under
/// target/tmp and /var/tmp) for the life of this test process.
fn plant_secrets(token: &str) -> Vec<PathBuf> {
    let dirs = [
        PathBuf::from(env!("CARGO_TARGET_TMPDIR")),
        PathBuf::from("/var/tmp"),
    ];
    dirs.iter()
        .map(|d| {
            std::fs::create_dir_all(d).expect("create secret dir");
            let mut f = tempfile::Builder::new()
                .prefix("pycell-secret-")
                .tempfile_in(d)
                .expect("secret file");
            writeln!(f, "{token}").expect("write secret");
            let (_, path) = f.keep().expect("keep secret file");
            path
        })
        .collect()
}

fn run_probe() -> ProbeRun {
    let token = format!("pycell-host-secret-{}", std::process::id());
    let secret_paths = plant_secrets(&token);

    let listener = TcpListener::bind("127.0.0.1:0").expect("bind host loopback listener");
    let port = listener.local_addr().expect("local_addr").port();
    let tcp_accepted = Arc::new(AtomicBool::new(false));
    {
        let flag = Arc::clone(&tcp_accepted);
        thread::spawn(move || {
            for conn in listener.incoming() {
                if conn.is_ok() {
                    flag.store(true, Ordering::SeqCst);
                }
            }
        });
    }

    let abstract_name = format!("pycell-test-{}", std::process::id());
    let addr = SocketAddr::from_abstract_name(abstract_name.as_bytes()).expect("abstract addr");
    let unix = UnixListener::bind_addr(&addr).expect("bind host abstract socket");
    let unix_accepted = Arc::new(AtomicBool::new(false));
    {
        let flag = Arc::clone(&unix_accepted);
        thread::spawn(move || {
            for conn in unix.incoming() {
                if conn.is_ok() {
                    flag.store(true, Ordering::SeqCst);
                }
            }
        });
    }

    let port_s = port.to_string();
    let mut script_args: Vec<String> = vec![
        "--host-port".into(),
        port_s,
        "--abstract-socket".into(),
        abstract_name,
    ];
    for p in &secret_paths {
        script_args.push("--secret-path".into());
        script_args.push(p.display().to_string());
    }
    // A pipe whose write end is deliberately inheritable (no FD_CLOEXEC):
    // pycell gets it as an extra open fd and must not pass it on.
    let (_read_end, write_end) = nix::unistd::pipe2(OFlag::O_CLOEXEC).expect("pipe2");
    fcntl(&write_end, FcntlArg::F_SETFD(FdFlag::empty())).expect("clear FD_CLOEXEC");
    let leaked_fd = write_end.as_raw_fd().to_string();
    script_args.push("--inherited-fd".into());
    script_args.push(leaked_fd.clone());
    let script_args: Vec<&str> = script_args.iter().map(String::as_str).collect();
    let outcome = Pycell::new(run_args(&probe_path(), &[], &script_args))
        .env("PYCELL_TEST_SECRET", ENV_SECRET)
        .env("PYTHONPATH", "/work")
        .env("LD_PRELOAD", "/nonexistent/pycell-test.so")
        .run();
    drop(write_end);
    let report = probe_report(&outcome);
    if let Some(path) = std::env::var_os("PYCELL_TEST_PROBE_REPORT") {
        // For comparing kernels (scripts/vm-test keeps the guest's).
        let kept = serde_json::json!({
            "kernel": nix::sys::utsname::uname().map(|u| u.release().to_string_lossy().into_owned()).unwrap_or_default(),
            "layers": outcome.result()["layers"],
            "report": report,
        });
        std::fs::write(&path, kept.to_string()).expect("write PYCELL_TEST_PROBE_REPORT");
    }
    for p in &secret_paths {
        let _ = std::fs::remove_file(p);
    }
    ProbeRun {
        outcome,
        report,
        tcp_accepted,
        unix_accepted,
        secret_token: token,
        secret_paths,
        leaked_fd,
        env_secret: ENV_SECRET,
    }
}

fn probe() -> &'static ProbeRun {
    static RUN: OnceLock<ProbeRun> = OnceLock::new();
    RUN.get_or_init(run_probe)
}

fn report() -> &'static Value {
    &probe().report
}

/// Collect "what: detail" failures and panic once with all of them.
#[derive(Default)]
struct Failures(Vec<String>);

impl Failures {
    fn check(&mut self, ok: bool, msg: impl FnOnce() -> String) {
        if !ok {
            self.0.push(msg());
        }
    }

    fn finish(self, what: &str) {
        assert!(
            self.0.is_empty(),
            "{what}: {} problem(s):\n  - {}",
            self.0.len(),
            self.0.join("\n  - ")
        );
    }
}

fn entries(v: &Value) -> Vec<(&String, &Value)> {
    v.as_object()
        .unwrap_or_else(|| panic!("expected an object, got {}", compact(v, 2000)))
        .iter()
        .collect()
}

#[test]
fn probe_run_succeeds_and_every_check_ran() {
    let run = probe();
    let result = run.outcome.result();
    assert_eq!(
        result["status"],
        "ok",
        "probe run status\n{}",
        run.outcome.describe()
    );
    assert_eq!(run.outcome.exit_code, Some(0), "{}", run.outcome.describe());
    let errors = at(report(), "/check_errors");
    assert!(
        errors.as_object().is_some_and(|m| m.is_empty()),
        "probe checks raised exceptions: {}",
        compact(errors, 8000)
    );
}

#[test]
fn host_files_are_unreadable() {
    let run = probe();
    let reads = at(report(), "/read");
    let mut f = Failures::default();
    for (path, r) in entries(reads) {
        f.check(r["ok"] == false, || {
            format!("{path} readable from the jail: {}", compact(r, 500))
        });
    }
    for p in &run.secret_paths {
        let key = p.display().to_string();
        f.check(reads.get(&key).is_some(), || {
            format!("probe did not try to read {key}")
        });
    }
    f.check(
        !run.outcome.stdout_str().contains(&run.secret_token),
        || "the host secret's content appears in the run's output".into(),
    );
    // Sanity: the probe can read what the jail is meant to show, so the
    // failures above are not a broken probe.
    for (path, r) in entries(at(report(), "/read_allowed")) {
        f.check(r["ok"] == true, || {
            format!("{path} should be readable in the jail: {}", compact(r, 500))
        });
    }
    f.finish("host file reads");
}

#[test]
fn writes_outside_workspace_and_tmp_fail() {
    let mut f = Failures::default();
    for section in ["/write_denied", "/write_existing_denied"] {
        for (path, r) in entries(at(report(), section)) {
            f.check(r["ok"] == false, || {
                format!("write to {path} succeeded: {}", compact(r, 500))
            });
        }
    }
    f.finish("writes outside /workspace and /tmp");
}

#[test]
fn workspace_tmp_and_shm_are_writable() {
    let mut f = Failures::default();
    for (path, r) in entries(at(report(), "/write_allowed")) {
        f.check(
            r["ok"] == true && r["value"]["read_back_equal"] == true,
            || format!("write to {path} failed: {}", compact(r, 500)),
        );
    }
    let null = at(report(), "/dev_null_write");
    f.check(null["ok"] == true, || {
        format!("writing /dev/null failed: {}", compact(null, 500))
    });
    f.check(at(report(), "/cwd") == "/workspace", || {
        format!("cwd is {}, not /workspace", at(report(), "/cwd"))
    });
    f.finish("allowed writes");
}

#[test]
fn host_network_is_unreachable() {
    let run = probe();
    let mut f = Failures::default();
    let tcp = at(report(), "/connect_host_loopback");
    f.check(tcp["ok"] == false, || {
        format!(
            "connect to the host's 127.0.0.1 listener succeeded: {}",
            compact(tcp, 500)
        )
    });
    f.check(!run.tcp_accepted.load(Ordering::SeqCst), || {
        "the host's loopback listener accepted a connection during the run".into()
    });
    let unix = at(report(), "/connect_host_abstract");
    f.check(unix["ok"] == false, || {
        format!(
            "connect to the host's abstract unix socket succeeded: {}",
            compact(unix, 500)
        )
    });
    f.check(!run.unix_accepted.load(Ordering::SeqCst), || {
        "the host's abstract unix socket accepted a connection during the run".into()
    });
    let dns = at(report(), "/dns");
    f.check(dns["ok"] == false, || {
        format!("DNS resolution worked in the jail: {}", compact(dns, 500))
    });
    let ifaces = at(report(), "/interfaces");
    let ok_ifaces = ifaces
        .as_array()
        .is_some_and(|a| a.iter().all(|i| i == "lo"));
    f.check(ok_ifaces, || {
        format!("network interfaces other than lo: {}", compact(ifaces, 500))
    });
    f.finish("network isolation");
}

fn pid_list(v: &Value) -> Vec<u64> {
    v["pids"]
        .as_array()
        .unwrap_or_else(|| panic!("no pid list in {}", compact(v, 1000)))
        .iter()
        .filter_map(Value::as_u64)
        .collect()
}

#[test]
fn only_sandbox_pids_are_visible() {
    let mut f = Failures::default();
    for section in ["/pids", "/pids_after"] {
        let v = at(report(), section);
        let pids = pid_list(v);
        let me = v["self"].as_u64().unwrap_or(0);
        f.check(pids.contains(&1), || {
            format!(
                "{section}: no init (pid 1) in the jail's /proc: {}",
                compact(v, 1500)
            )
        });
        f.check(pids.contains(&me), || {
            format!(
                "{section}: the probe's own pid {me} is not in /proc: {}",
                compact(v, 1500)
            )
        });
        // A fresh pid namespace holds init, maybe a runner, and the probe.
        f.check(pids.len() <= 3 && pids.iter().all(|&p| p < 1000), || {
            format!(
                "{section}: more than the sandbox's own processes are visible: {}",
                compact(v, 3000)
            )
        });
    }
    f.finish("pid namespace");
}

#[test]
fn no_capabilities_no_new_privs_seccomp_uid_1000() {
    let st = at(report(), "/status");
    let ids = at(report(), "/ids");
    let mut f = Failures::default();
    for cap in ["CapEff", "CapPrm", "CapBnd", "CapAmb", "CapInh"] {
        f.check(st[cap] == "0000000000000000", || {
            format!("{cap} = {}, want 0000000000000000", st[cap])
        });
    }
    f.check(st["NoNewPrivs"] == "1", || {
        format!("NoNewPrivs = {}, want 1", st["NoNewPrivs"])
    });
    f.check(st["Seccomp"] == "2", || {
        format!("Seccomp = {}, want 2 (filter mode)", st["Seccomp"])
    });
    for k in ["uid", "euid", "gid", "egid"] {
        f.check(ids[k] == 1000, || format!("{k} = {}, want 1000", ids[k]));
    }
    // Supplementary groups must be dropped before the user namespace is
    // entered: an unmapped host gid (e.g. root's 0) shows up as 65534 here
    // and would still grant its host permissions.
    let groups_ok = ids["groups"]
        .as_array()
        .is_some_and(|g| g.iter().all(|x| x == 1000));
    f.check(groups_ok, || {
        format!(
            "supplementary groups {} (Groups line: {}), want none besides 1000",
            ids["groups"], st["Groups"]
        )
    });
    f.check(at(report(), "/hostname") == "pycell", || {
        format!("hostname = {}, want pycell", at(report(), "/hostname"))
    });
    let tty = at(report(), "/tty");
    f.check(tty["ok"] == false, || {
        format!("the jail has a controlling tty: {}", compact(tty, 300))
    });
    let result = probe().outcome.result();
    let layers = &result["layers"];
    f.check(layers["no_new_privs"] == true, || {
        format!("result layers.no_new_privs = {}", layers["no_new_privs"])
    });
    f.check(layers["capabilities"] == "none", || {
        format!("result layers.capabilities = {}", layers["capabilities"])
    });
    let uid = layers["sandbox_uid"].as_u64().unwrap_or(0) as u32;
    // Where pycelld runs in a pod's user namespace, its sandbox uids are
    // inside the pod's 65536 and land on unprivileged host uids.
    let host = host_uid(uid);
    let account = nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid));
    f.check(
        host.is_some_and(|h| h >= 65536) && uid >= 1000 && matches!(account, Ok(None)),
        || {
            format!(
                "result layers.sandbox_uid = {uid} (host uid {host:?}, account {account:?}): want a unique host uid outside the system/user ranges, of no account"
            )
        },
    );
    f.finish("credentials");
}

/// `uid` of this process's user namespace as the host sees it (through
/// /proc/self/uid_map: itself on the host).
fn host_uid(uid: u32) -> Option<u64> {
    let map = std::fs::read_to_string("/proc/self/uid_map").ok()?;
    map.lines().find_map(|line| {
        let f: Vec<u64> = line
            .split_whitespace()
            .filter_map(|x| x.parse().ok())
            .collect();
        let (inside, outside, count) = (*f.first()?, *f.get(1)?, *f.get(2)?);
        let uid = u64::from(uid);
        (inside..inside + count)
            .contains(&uid)
            .then(|| outside + uid - inside)
    })
}

#[test]
fn every_dangerous_syscall_is_denied() {
    let calls = at(report(), "/denied_syscalls");
    let mut f = Failures::default();
    let mut seen = BTreeSet::new();
    for (name, r) in entries(calls) {
        seen.insert(name.as_str());
        let want = if name == "clone3" { "ENOSYS" } else { "EPERM" };
        f.check(r["ret"] == -1 && r["errno"] == want, || {
            format!("{name}: {} (want ret -1, errno {want})", compact(r, 300))
        });
    }
    for required in [
        "io_uring_setup",
        "userfaultfd",
        "keyctl",
        "add_key",
        "request_key",
        "bpf",
        "perf_event_open",
        "kexec_load",
        "init_module",
        "finit_module",
        "delete_module",
        "mount",
        "umount2",
        "pivot_root",
        "fsopen",
        "open_tree",
        "move_mount",
        "unshare(CLONE_NEWUSER)",
        "unshare(CLONE_NEWNET)",
        "setns",
        "clone(CLONE_NEWUSER)",
        "clone3",
        "ptrace(PTRACE_TRACEME)",
        "process_vm_readv",
        "open_by_handle_at",
        "personality(PER_LINUX32)",
        "personality(READ_IMPLIES_EXEC)",
        "ioctl(TIOCSTI)",
        "ioctl(TIOCSTI|1<<32)",
        "ioctl(TIOCLINUX)",
    ] {
        f.check(seen.contains(required), || {
            format!("the probe did not report {required}")
        });
    }
    f.finish("seccomp denials");
}

/// The kernel's Landlock ABI, asked outside pycell:
/// `landlock_create_ruleset(NULL, 0, LANDLOCK_CREATE_RULESET_VERSION)`.
fn kernel_landlock_abi() -> u64 {
    let code = "import ctypes; print(ctypes.CDLL(None, use_errno=True).syscall(444, None, ctypes.c_size_t(0), ctypes.c_uint32(1)))";
    let out = std::process::Command::new("/usr/bin/python3")
        .args(["-c", code])
        .output()
        .expect("python3 asks the kernel's Landlock ABI");
    let text = String::from_utf8_lossy(&out.stdout);
    text.trim()
        .parse()
        .unwrap_or_else(|e| panic!("Landlock ABI {text:?}: {e}"))
}

#[test]
fn landlock_is_enforced() {
    let result = probe().outcome.result();
    let ll = &result["layers"]["landlock"];
    let mut f = Failures::default();
    f.check(ll["status"] == "fully_enforced", || {
        format!("layers.landlock = {}, want status fully_enforced", ll)
    });
    let kernel_abi = kernel_landlock_abi();
    f.check(ll["abi"].as_u64() == Some(kernel_abi), || {
        format!(
            "layers.landlock.abi = {}, but the kernel's Landlock ABI is {kernel_abi}",
            ll["abi"]
        )
    });
    // The shipped policies' min_abi: Debian 12's kernel has 2.
    f.check(kernel_abi >= 2, || {
        format!("the kernel's Landlock ABI {kernel_abi} is below 2, yet the run was not refused")
    });
    // A write that DAC and mount flags allow must still fail with EACCES:
    // only Landlock can be refusing it.
    let mut discriminating = 0;
    for (path, c) in entries(at(report(), "/landlock")) {
        let open = &c["open_write"];
        f.check(open["ok"] == false, || {
            format!(
                "{path} opened for writing (Landlock grants write only to /workspace, /tmp, /dev/null|zero|full): {}",
                compact(c, 400)
            )
        });
        if c["dac_allows"] == true && c["mount_readonly"] == false {
            discriminating += 1;
            f.check(open["errno"] == "EACCES", || {
                format!(
                    "{path}: DAC and mounts allow writing, want Landlock's EACCES: {}",
                    compact(c, 400)
                )
            });
        }
    }
    f.check(discriminating > 0, || {
        format!(
            "no Landlock candidate is writable by DAC on a read-write mount, so Landlock's effect is unproven: {}",
            compact(at(report(), "/landlock"), 2000)
        )
    });
    f.finish("Landlock");
}

#[test]
fn only_stdio_fds_are_open() {
    let fds = at(report(), "/fds");
    let keys: BTreeSet<&str> = fds
        .as_object()
        .expect("fds object")
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(
        keys,
        BTreeSet::from(["0", "1", "2"]),
        "open fds in the jail: {}",
        compact(fds, 2000)
    );
}

#[test]
fn threads_subprocess_fork_asyncio_multiprocessing_work() {
    let r = report();
    let mut f = Failures::default();
    let expect = |name: &str, pointer: &str, want: Value, f: &mut Failures| {
        let v = at(r, name);
        let got = v.pointer(pointer);
        f.check(v["ok"] == true && got == Some(&want), || {
            format!("{name}: {} (want {pointer} = {want})", compact(v, 800))
        });
    };
    expect("/threads", "/value/results_ok", Value::Bool(true), &mut f);
    expect("/subprocess", "/value/stdout", Value::from("ok\n"), &mut f);
    expect("/subprocess", "/value/returncode", Value::from(0), &mut f);
    expect("/fork", "/value/exit_status", Value::from(7), &mut f);
    expect(
        "/asyncio",
        "/value/result",
        serde_json::json!([0, 2, 4, 6, 8]),
        &mut f,
    );
    expect(
        "/multiprocessing",
        "/value/result",
        serde_json::json!([0, 1, 4, 9, 16, 25, 36, 49, 64, 81]),
        &mut f,
    );
    f.finish("allowed functionality");
}

/// The running kernel's (major, minor), from uname.
fn kernel_version() -> (u32, u32) {
    let uts = nix::sys::utsname::uname().expect("uname");
    let release = uts.release().to_string_lossy().into_owned();
    let mut parts = release
        .split(|c: char| !c.is_ascii_digit())
        .map(|p| p.parse::<u32>().unwrap_or(0));
    (parts.next().unwrap_or(0), parts.next().unwrap_or(0))
}

/// Whether this kernel lets an unprivileged process set an LSM's attribute
/// on a file it owns. Measured outside pycell: as nobody, with no
/// capabilities, on a file of the host's /dev/shm (a tmpfs, like the jail's).
fn kernel_lets_owners_set_security_xattrs() -> bool {
    let dir = tempfile::Builder::new()
        .prefix("pycell-xattr-")
        .tempdir_in("/dev/shm")
        .expect("tempdir in /dev/shm");
    let file = dir.path().join("owned-by-nobody");
    std::fs::write(&file, b"").expect("create the file");
    let nobody = nix::unistd::Uid::from_raw(65534);
    nix::unistd::chown(&file, Some(nobody), None).expect("chown to nobody");
    let code = r#"
import os, sys
allowed = []
for name in ["security.selinux", "security.SMACK64", "security.ima", "security.evm", "security.pycell", "trusted.pycell"]:
    try:
        os.setxattr(sys.argv[1], name, b"1")
        allowed.append(name)
    except OSError:
        pass
print(" ".join(allowed))
"#;
    let out = std::process::Command::new("setpriv")
        .args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "--inh-caps=-all",
        ])
        .args(["/usr/bin/python3", "-c", code])
        .arg(&file)
        .output()
        .expect("setpriv runs python3 as nobody");
    assert!(
        out.status.success(),
        "the host-side xattr check failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let allowed = String::from_utf8_lossy(&out.stdout).trim().to_string();
    eprintln!("this kernel lets an unprivileged owner set: [{allowed}]");
    !allowed.is_empty()
}

/// A failed attempt with EOPNOTSUPP (Python names errno 95 ENOTSUP).
fn not_supported(attempt: &Value) -> bool {
    attempt["ok"] == false && (attempt["errno"] == "ENOTSUP" || attempt["errno"] == "EOPNOTSUPP")
}

#[test]
fn security_and_trusted_xattrs_cannot_be_set() {
    let result = probe().outcome.result();
    let refused_for_kernel = &result["layers"]["seccomp"]["refused_on_this_kernel"];
    let filter_refuses = refused_for_kernel
        .as_array()
        .is_some_and(|calls| calls.iter().any(|c| c == "fsetxattr"));
    let kernel_lets = kernel_lets_owners_set_security_xattrs();
    // tmpfs (the jail's /workspace, /tmp and /dev/shm) keeps user.*
    // attributes from Linux 6.6 on; where the kernel does not refuse LSM
    // labels, pycell refuses every xattr write, user.* included.
    let user_xattrs_expected = kernel_version() >= (6, 6) && !kernel_lets;
    let mut f = Failures::default();
    f.check(filter_refuses == kernel_lets, || {
        format!(
            "the kernel {} unprivileged owners set security.* attributes, but the jail's filter refuses {refused_for_kernel}",
            if kernel_lets { "lets" } else { "does not let" }
        )
    });
    let places = entries(at(report(), "/xattrs"));
    f.check(places.len() == 3, || {
        format!("xattrs tried in {} places, want 3", places.len())
    });
    for (place, tried) in places {
        for name in [
            "setxattr security",
            "fsetxattr security",
            "lsetxattr security",
            "setxattr security.selinux",
            "setxattr trusted",
        ] {
            let r = &tried[name];
            f.check(r["ok"] == false, || {
                format!("{place}: {name} succeeded: {}", compact(r, 300))
            });
        }
        // Removing an attribute the file does not have must be refused
        // before the kernel looks (ENODATA would mean it looked).
        for name in ["removexattr security", "fremovexattr security"] {
            let r = &tried[name];
            f.check(r["errno"] == "EPERM" || not_supported(r), || {
                format!(
                    "{place}: {name}: {} (want EPERM or EOPNOTSUPP)",
                    compact(r, 300)
                )
            });
        }
        let (set, get) = (&tried["setxattr user"], &tried["getxattr user"]);
        if user_xattrs_expected {
            f.check(set["ok"] == true && get["value"] == "probe", || {
                format!(
                    "{place}: user.* attributes do not work where tmpfs has them and the kernel refuses security.*: set {}, get {}",
                    compact(set, 300),
                    compact(get, 300)
                )
            });
        } else {
            f.check(not_supported(set), || {
                format!(
                    "{place}: setxattr user.*: {} (want EOPNOTSUPP: tmpfs without user xattrs, or every xattr write refused)",
                    compact(set, 300)
                )
            });
        }
        let listed = &tried["listxattr"];
        f.check(listed["ok"] == true, || {
            format!("{place}: listxattr failed: {}", compact(listed, 300))
        });
    }
    f.finish("extended attributes");
}

/// The jail's whole environment under the shipped default policy: its
/// `[env]` and the thread pools' sizes, read with a plain TOML parser
/// rather than pycell's own policy loader, which the test would then only
/// agree with.
fn default_policy_env() -> BTreeMap<String, String> {
    let path = repo_root().join("policies/default.toml");
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    let doc: toml::Table = text
        .parse()
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let env: BTreeMap<String, String> = doc
        .get("env")
        .cloned()
        .unwrap_or_else(|| panic!("no [env] in {}", path.display()))
        .try_into()
        .unwrap_or_else(|e| panic!("[env] of {}: {e}", path.display()));
    assert!(
        env.contains_key("PATH"),
        "no [env] PATH found in {}",
        path.display()
    );
    // And the thread pools' sizes, from [limits] cpus (1.0 when left out),
    // rounded up, where [env] leaves them out.
    let cpus = doc
        .get("limits")
        .and_then(|l| l.get("cpus"))
        .and_then(|c| c.as_float())
        .unwrap_or(1.0);
    let mut env = env;
    for var in [
        "OMP_NUM_THREADS",
        "OPENBLAS_NUM_THREADS",
        "MKL_NUM_THREADS",
        "NUMEXPR_NUM_THREADS",
    ] {
        env.entry(var.to_string())
            .or_insert_with(|| (cpus.ceil() as u64).to_string());
    }
    env
}

#[test]
fn inherited_fds_and_host_env_do_not_reach_the_jail() {
    let run = probe();
    let leaked_fd = &run.leaked_fd;
    let probe_fd = at(report(), &format!("/inherited_fds/{leaked_fd}"));
    assert_eq!(
        probe_fd["ok"],
        false,
        "fd {leaked_fd}, open in pycell, is usable in the jail: {}",
        compact(probe_fd, 300)
    );
    let env: BTreeMap<String, String> = at(report(), "/environ")
        .as_object()
        .expect("environ object")
        .iter()
        .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_string()))
        .collect();
    assert_eq!(
        env,
        default_policy_env(),
        "the jail's environment must be exactly the default policy's [env] and the thread pools' sizes"
    );
    assert!(
        !run.outcome.stdout_str().contains(run.env_secret),
        "the host env secret appears in the run's output:\n{}",
        run.outcome.describe()
    );
}
