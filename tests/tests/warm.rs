//! Warm runs (issue 15): jails whose python waits, started, on pycell's
//! runner until a run's work arrives; pycelld keeps a pool of them.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use pycell_launch::launcher::{Collector, JailerEnd, JailerStderr, Launcher, PolicyChoice};
use pycell_launch::resolve::{self, Extras};
use pycell_protocol::messages::{LimitOverrides, RunRequest};
use pycell_protocol::result::RunResult;
use pycell_runner as runner;
use pycell_tests::daemon::Daemon;
use pycell_tests::{probe_path, probe_report, pycell_bin, require_root, run_file};
use pycell_wire::events::{read_event, Event};
use pycell_wire::report::RunStatus;
use serde_json::Value;

fn launcher() -> Launcher {
    let mut l = Launcher::embedded_from_env().expect("launcher");
    l.jailer = Ok(pycell_bin().with_file_name("pycell-jailer"));
    l
}

fn request(code: &str) -> RunRequest {
    RunRequest {
        code: code.into(),
        ..Default::default()
    }
}

/// Start a warm jail of `policy` (importing json), wait `idle` once it
/// is ready, hand it `request`, and collect its result.
fn warm_jail_run(
    policy: &pycell_policy::Policy,
    idle: Duration,
    request: &RunRequest,
) -> RunResult {
    let l = launcher();
    let prepared = l
        .prepare_warm(policy, &Extras::default(), &["json".to_string()])
        .expect("prepare warm");
    let cold = resolve::resolve(policy, request).expect("resolve").spec;
    let mut launched = prepared.spawn(JailerStderr::Inherit).expect("spawn");
    let first = read_event(&mut launched.events).expect("event");
    assert!(matches!(first, Some(Event::Ready)), "{first:?}");
    std::thread::sleep(idle);
    launched
        .send_work(&runner::work_for(&cold).expect("work"))
        .expect("send work");
    // The run's limits are its work's, not the warm jail's.
    let mut c = Collector::new(
        &launched.run_id,
        &launched.policy,
        Some(cold.limits.clone()),
    );
    while let Some(ev) = read_event(&mut launched.events).expect("events") {
        c.record(ev);
    }
    let status = launched.child.wait();
    c.finish(JailerEnd::Exited {
        status,
        stderr: vec![],
    })
}

fn default_policy() -> pycell_policy::Policy {
    launcher()
        .load_policy(PolicyChoice::Name("default"))
        .expect("policy")
}

#[test]
fn a_warm_jail_runs_its_work_with_clocks_from_arrival() {
    require_root();
    let mut req = request(
        "import sys\nprint('hi', sys.argv, __file__, sys.stdin.read())\nprint('err', file=sys.stderr)\nsys.exit(3)",
    );
    req.args = vec!["a b".into()];
    req.set_stdin(b"input");
    let r = warm_jail_run(&default_policy(), Duration::from_millis(300), &req);
    assert_eq!(
        r.stdout,
        "hi ['/workspace/main.py', 'a b'] /workspace/main.py input\n"
    );
    assert_eq!(r.stderr, "err\n");
    assert_eq!(r.exit_code, Some(3));
    assert!(r.warm);
    let waited = r.warm_waited_ms.unwrap();
    assert!(waited >= 300.0, "{waited}");
    assert!(
        r.wall_ms < 300.0,
        "the wall clock started with the work: {}",
        r.wall_ms
    );
}

#[test]
fn a_warm_jails_timeout_and_cpu_limit_run_from_the_work() {
    require_root();
    // Waiting 1.5 s ready does not count against a 1 s timeout...
    let mut req = request("import time; time.sleep(0.3); print('slept')");
    req.limits = LimitOverrides {
        timeout_s: Some(1.0),
        ..Default::default()
    };
    let r = warm_jail_run(&default_policy(), Duration::from_millis(1500), &req);
    assert_eq!(
        (r.status, r.stdout.as_str()),
        (RunStatus::Ok, "slept\n"),
        "{r:?}"
    );
    // ... and a run that outlives it is stopped at it.
    req.code = "import time; time.sleep(5)".into();
    let t = Instant::now();
    let r = warm_jail_run(&default_policy(), Duration::ZERO, &req);
    assert_eq!(r.status, RunStatus::Timeout, "{r:?}");
    assert!(t.elapsed() < Duration::from_secs(4), "{:?}", t.elapsed());
    let layers = |r: &pycell_protocol::result::RunResult| -> Vec<&'static str> {
        r.refusals.iter().map(|x| x.layer.as_str()).collect()
    };
    assert_eq!(layers(&r), ["wall_timeout"], "{r:?}");
    assert!(r.refusals[0].object.contains("1 s"), "{:?}", r.refusals);
    assert_eq!(r.refusals[0].rule, "limits.wall_timeout");
    let end = r.termination.as_ref().map(|t| t.reason_str());
    assert_eq!(end.as_deref(), Some("wall_timeout"), "{r:?}");
    // The CPU limit (1 s here) counts from the work too, however much
    // CPU the warm-up took.
    let mut req = request("while True: pass");
    req.limits.timeout_s = Some(10.0);
    let mut policy = default_policy();
    policy.limits.cpu_time = Duration::from_secs(1);
    let r = warm_jail_run(&policy, Duration::ZERO, &req);
    let code = r.error.as_ref().map(|e| e.code);
    assert_eq!(
        (r.status, code),
        (
            RunStatus::Killed,
            Some(pycell_wire::codes::FailureCode::CpuTimeLimit)
        ),
        "{r:?}"
    );
    assert!(
        (900.0..3000.0).contains(&r.cpu_ms),
        "about 1 s of CPU, counted from the work: {}",
        r.cpu_ms
    );
    assert_eq!(layers(&r), ["cpu"], "{r:?}");
    assert_eq!(r.refusals[0].rule, "limits.cpu_time");
    let end = r.termination.as_ref().map(|t| t.reason_str());
    assert_eq!(end.as_deref(), Some("cpu_limit"), "{r:?}");
}

#[test]
fn two_runs_never_share_a_jail() {
    let d = Daemon::start("warm_pools = { default = 2 }\n");
    d.warm_run(&request("pass"));
    let first = d.warm_run(&request(
        r#"
import builtins, os, subprocess
open("/workspace/marker", "w").write("first")
open("/tmp/marker", "w").write("first")
builtins.LEFT_BY_FIRST = True
subprocess.Popen(["/bin/sleep", "30"], start_new_session=True)
print(os.readlink("/proc/self/ns/pid"), os.readlink("/proc/self/ns/mnt"))
"#,
    ));
    let second = d.warm_run(&request(
        r#"
import builtins, os
others = [p for p in os.listdir("/proc") if p.isdigit() and int(p) != os.getpid()]
cmds = [open(f"/proc/{p}/cmdline", "rb").read() for p in others]
print(os.readlink("/proc/self/ns/pid"), os.readlink("/proc/self/ns/mnt"))
print(os.path.exists("/workspace/marker"), os.path.exists("/tmp/marker"))
print(hasattr(builtins, "LEFT_BY_FIRST"), any(b"sleep" in c for c in cmds))
"#,
    ));
    assert_eq!(first.status, RunStatus::Ok, "{first:?}");
    assert_eq!(second.status, RunStatus::Ok, "{second:?}");
    let first_ns = first.stdout.trim();
    let mut lines = second.stdout.lines();
    let second_ns = lines.next().unwrap();
    assert_ne!(first_ns, second_ns, "namespaces shared");
    assert_eq!(lines.next(), Some("False False"), "{second:?}");
    assert_eq!(lines.next(), Some("False False"), "{second:?}");
    assert_ne!(first.run_id, second.run_id);
    let uid = |r: &RunResult| r.layers.as_ref().unwrap().sandbox_uid;
    assert_ne!(uid(&first), uid(&second));
    // The first run's background sleep died with its jail.
    let deadline = Instant::now() + Duration::from_secs(10);
    while pycell_tests::processes_with_uid(uid(&first))
        .iter()
        .any(|p| p.name == "sleep")
    {
        assert!(
            Instant::now() < deadline,
            "the first run's sleep outlived it"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let starts = d.audit_events("run_start", 3);
    for r in [&first, &second] {
        let start = starts.iter().find(|s| s["run_id"] == r.run_id.as_str());
        assert_eq!(start.unwrap()["warm"], true, "{}", d.audit());
    }
}

/// The probe's report with what differs from run to run (pipe and socket
/// inodes, a random port) and what a warm run shows differently by design
/// (its python's command line, which is the runner) taken out.
fn comparable(report: &Value) -> BTreeMap<String, Value> {
    fn flat(v: &Value, path: String, out: &mut BTreeMap<String, Value>) {
        match v {
            Value::Object(m) => m
                .iter()
                .for_each(|(k, x)| flat(x, format!("{path}/{k}"), out)),
            Value::Array(a) if a.len() < 64 => a
                .iter()
                .enumerate()
                .for_each(|(i, x)| flat(x, format!("{path}/{i}"), out)),
            other => {
                out.insert(path, other.clone());
            }
        }
    }
    let mut out = BTreeMap::new();
    flat(report, String::new(), &mut out);
    for v in out.values_mut() {
        // `pipe:[123]` → `pipe`: which kind stays compared.
        if let Some((kind, _)) = v.as_str().and_then(|s| s.split_once(":[")) {
            *v = Value::String(kind.to_string());
        }
    }
    out.retain(|k, _| {
        let volatile = k == "/loopback_inside/value/port"
            || k.starts_with("/pids/cmdlines/")
            || k.starts_with("/pids_after/cmdlines/")
            || k == "/read_allowed//proc/self/status/value/bytes";
        !volatile
    });
    out
}

#[test]
fn the_probe_sees_the_same_jail_cold_and_warm() {
    let d = Daemon::start("warm_pools = { default = 1 }\n");
    let cold = run_file(&probe_path(), &[], &[]);
    let cold = comparable(&probe_report(&cold));
    let code = std::fs::read_to_string(probe_path()).unwrap();
    let mut req = request(&code);
    req.filename = Some("probe.py".into());
    let warm = d.warm_run(&req);
    assert_eq!(warm.status, RunStatus::Ok, "{warm:?}");
    let warm = comparable(&serde_json::from_str(&warm.stdout).unwrap());
    assert!(cold.len() > 300, "{} checks", cold.len());
    let differ: Vec<_> = cold
        .iter()
        .filter(|(k, v)| warm.get(*k) != Some(v))
        .map(|(k, v)| format!("{k}: cold {v}, warm {:?}", warm.get(k)))
        .chain(
            warm.keys()
                .filter(|k| !cold.contains_key(*k))
                .map(|k| format!("{k}: only warm")),
        )
        .collect();
    assert!(differ.is_empty(), "{differ:#?}");
}

#[test]
fn a_pools_imports_are_loaded_before_its_runs_and_a_failing_one_goes_cold() {
    let policies = tempfile::tempdir().unwrap();
    let default = pycell_policy::builtin::source("default").unwrap();
    let with_imports = |name: &str, imports: &str| {
        let text = default
            .replace("name = \"default\"", &format!("name = \"{name}\""))
            .replace("imports = []", &format!("imports = {imports}"));
        assert!(
            text.contains(imports),
            "the shipped default has [warm] imports"
        );
        std::fs::write(policies.path().join(format!("{name}.toml")), text).unwrap();
    };
    with_imports("preloaded", "[\"decimal\", \"fractions\"]");
    with_imports("broken", "[\"no_such_module_anywhere\"]");
    let d = Daemon::start(&format!(
        "policy_dir = \"{}\"\nwarm_pools = {{ preloaded = 1, broken = 1 }}\n",
        policies.path().display()
    ));
    let check = "import sys; print('decimal' in sys.modules, 'fractions' in sys.modules)";
    let mut req = request(check);
    req.policy = Some("preloaded".into());
    let warm = d.warm_run(&req);
    assert_eq!(warm.stdout, "True True\n", "{warm:?}");
    // A pool whose import fails never serves: its runs go cold, and work.
    req.policy = Some("broken".into());
    std::thread::sleep(Duration::from_secs(1));
    let r = d.client().run(req, |_, _| {}).unwrap();
    assert_eq!((r.status, r.warm), (RunStatus::Ok, false), "{r:?}");
    assert_eq!(r.stdout, "False False\n");
    let log = d.log();
    assert!(
        log.contains("ModuleNotFoundError") && log.contains("warm jail"),
        "the journal says why: {log}"
    );
}

#[test]
fn killing_pycelld_takes_its_warm_jails_along() {
    let mut d = Daemon::start("warm_pools = { default = 3 }\nzygotes = true\n");
    d.warm_run(&request("pass"));
    // A run in flight in a member forked from the zygote, too.
    let client = d.client();
    std::thread::spawn(move || {
        let mut client = client;
        client.run(request("import time; time.sleep(60)"), |_, _| {})
    });
    let deadline = Instant::now() + Duration::from_secs(20);
    // The zygote, three members and the run: init and python each.
    while d.sandbox_processes().len() < 2 * (1 + 3 + 1) {
        assert!(
            Instant::now() < deadline,
            "the pool never filled: {:?}",
            d.sandbox_processes()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(!d.daemon_cgroups().is_empty());
    d.signal(Signal::SIGKILL);
    d.wait(Duration::from_secs(5));
    d.assert_sandbox_gone(Duration::from_secs(15));
}

/// Whether `pid` descends from one of `ancestors` in `procs`.
fn descends_from(procs: &[pycell_tests::HostProc], mut pid: u32, ancestors: &[i32]) -> bool {
    let parent = |pid: u32| procs.iter().find(|p| p.pid == pid).map(|p| p.ppid);
    loop {
        match parent(pid) {
            Some(p) if ancestors.contains(&(p as i32)) => return true,
            Some(p) if p > 1 => pid = p,
            _ => return false,
        }
    }
}

#[test]
fn pycell_info_shows_each_pool_and_its_members_jailers() {
    let d = Daemon::start("warm_pools = { default = 2 }\nzygotes = false\n");
    let pool = d.pool_when_ready(2);
    assert_eq!(
        (pool.policy.as_str(), pool.size, pool.warming),
        ("default", 2, 0)
    );
    assert_eq!(pool.zygote_jailer_pid, None);
    let procs = pycell_tests::host_processes();
    let parent = |pid: u32| procs.iter().find(|p| p.pid == pid).map(|p| p.ppid);
    for jailer in &pool.jailer_pids {
        assert_eq!(
            parent(*jailer as u32),
            Some(d.pid() as u32),
            "jailer {jailer}"
        );
    }
    // Every sandbox process is an idle member's: a jailer's descendant.
    let sandbox = d.sandbox_processes();
    assert_eq!(
        sandbox.len(),
        2 * 2,
        "init and python per member: {sandbox:?}"
    );
    let in_member = |p: &pycell_tests::HostProc| descends_from(&procs, p.pid, &pool.jailer_pids);
    assert!(sandbox.iter().all(in_member), "{sandbox:?}");
    // A member taken by a run leaves the pool; a new one replaces it.
    d.warm_run(&request("pass"));
    let after = d.pool_when_ready(2);
    let kept = after
        .jailer_pids
        .iter()
        .filter(|p| pool.jailer_pids.contains(p));
    assert_eq!(kept.count(), 1, "before {pool:?}, after {after:?}");
}

/// Every member of `after` is new since `before`.
fn assert_all_members_new(
    before: &pycell_protocol::info::WarmPoolStatus,
    after: &pycell_protocol::info::WarmPoolStatus,
) {
    let kept = after
        .jailer_pids
        .iter()
        .filter(|p| before.jailer_pids.contains(p));
    assert_eq!(kept.count(), 0, "before {before:?}, after {after:?}");
}

/// A daemon with a pool of two `default` members forked from a zygote,
/// once they are ready: the pool, its zygote's jailer, the host's processes.
fn pool_from_a_zygote() -> (
    Daemon,
    pycell_protocol::info::WarmPoolStatus,
    i32,
    Vec<pycell_tests::HostProc>,
) {
    let d = Daemon::start("warm_pools = { default = 2 }\nzygotes = true\n");
    let pool = d.pool_when_ready(2);
    let zygote = pool.zygote_jailer_pid.expect("the pool's zygote");
    (d, pool, zygote, pycell_tests::host_processes())
}

#[test]
fn a_pools_members_are_forked_from_its_zygote_each_with_a_uid_of_its_own() {
    let (d, pool, zygote, procs) = pool_from_a_zygote();
    let parent = |pid: u32| procs.iter().find(|p| p.pid == pid).map(|p| p.ppid);
    for jailer in pool.jailer_pids.iter().chain([&zygote]) {
        assert_eq!(
            parent(*jailer as u32),
            Some(d.pid() as u32),
            "jailer {jailer}"
        );
    }
    // The zygote's init and python, then each member's, forked by the
    // zygote's python: all below the zygote's jailer, not the members'.
    let sandbox = d.sandbox_processes();
    assert_eq!(sandbox.len(), 2 + 2 * 2, "{sandbox:?}");
    // Each program is python by name, as its command line says.
    let names = sandbox.iter().map(|p| p.name.as_str());
    assert!(
        names.filter(|n| n.starts_with("python")).count() == 3,
        "{sandbox:?}"
    );
    assert!(
        sandbox
            .iter()
            .all(|p| descends_from(&procs, p.pid, &[zygote])),
        "{sandbox:?}"
    );
    let mut uids: Vec<u32> = sandbox.iter().map(|p| p.uids[0]).collect();
    uids.sort_unstable();
    uids.dedup();
    assert_eq!(
        uids.len(),
        3,
        "one uid for the zygote and each member: {sandbox:?}"
    );
    // The status names the members' uids: all but the zygote's (its init
    // is its jailer's child).
    let zygote_uid = sandbox
        .iter()
        .find(|p| p.ppid == zygote as u32)
        .map(|p| p.uids[0]);
    uids.retain(|u| Some(*u) != zygote_uid);
    let mut members = pool.member_sandbox_uids.clone();
    members.sort_unstable();
    assert_eq!(uids, members, "{pool:?}\n{sandbox:?}");
    // Runs take members; the pool refills from the zygote, which stays.
    for _ in 0..3 {
        let r = d.warm_run(&request("print(6 * 7)"));
        assert_eq!(r.stdout, "42\n", "{r:?}");
    }
    let after = d.pool_when_ready(2);
    assert_eq!(after.zygote_jailer_pid, Some(zygote), "{after:?}");
    assert_all_members_new(&pool, &after);
}

/// A run through `d` that prints `started`, then runs `rest`: its
/// thread, once its first output has come (it is running, in a member).
fn run_in_flight(
    d: &Daemon,
    rest: &str,
) -> std::thread::JoinHandle<Result<RunResult, pycell_protocol::client::ClientError>> {
    let (started, said) = std::sync::mpsc::channel();
    let mut client = d.client();
    let code = format!("import time; print('started', flush=True); {rest}");
    let in_flight = std::thread::spawn(move || {
        client.run(request(&code), move |_, _| {
            let _ = started.send(());
        })
    });
    said.recv_timeout(Duration::from_secs(30))
        .expect("the run in flight started");
    in_flight
}

#[test]
fn when_a_pools_zygote_dies_its_members_go_and_a_new_zygote_refills_the_pool() {
    let (d, _, _, _) = pool_from_a_zygote();
    // A run in flight in a member, once it has said so.
    let in_flight = run_in_flight(&d, "time.sleep(60)");
    let (pool, zygote, procs) = {
        let pool = d.client().info().unwrap().daemon.warm_pools[0].clone();
        let zygote = pool.zygote_jailer_pid.expect("the pool's zygote");
        (pool, zygote, pycell_tests::host_processes())
    };
    // The zygote's python: its init's child, the init a child of its jailer.
    let init = procs
        .iter()
        .find(|p| p.ppid == zygote as u32)
        .expect("the zygote's init");
    let python = procs
        .iter()
        .find(|p| p.ppid == init.pid && p.name.starts_with("python"))
        .expect("the zygote's python");
    kill(Pid::from_raw(python.pid as i32), Signal::SIGKILL).expect("SIGKILL to the zygote");
    // The run it had forked ends, and says why; its output is kept.
    let r = in_flight.join().unwrap().expect("the run's result");
    assert_eq!(r.status, RunStatus::Killed, "{r:?}");
    let e = r.error.as_ref().expect("an error");
    assert_eq!(e.code, pycell_wire::codes::FailureCode::ZygoteDied, "{r:?}");
    let end = r.termination.as_ref().expect("a termination");
    assert_eq!(end.reason_str(), "zygote_died", "{r:?}");
    assert_eq!(r.stdout, "started\n", "{r:?}");
    // Its members die with it; a new zygote forks new ones.
    let deadline = Instant::now() + Duration::from_secs(20);
    let after = loop {
        let now = d.pool_when_ready(2);
        if now.zygote_jailer_pid.is_some_and(|z| z != zygote) {
            break now;
        }
        assert!(
            Instant::now() < deadline,
            "no new zygote: {now:?}\n{}",
            d.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_all_members_new(&pool, &after);
    assert!(
        d.log().contains("the zygote of policy \"default\""),
        "{}",
        d.log()
    );
    let r = d.warm_run(&request("print(6 * 7)"));
    assert_eq!(r.stdout, "42\n", "{r:?}");
}

#[test]
fn sigterm_lets_a_run_forked_from_the_zygote_finish_then_exits() {
    let (mut d, _, _, _) = pool_from_a_zygote();
    let in_flight = run_in_flight(&d, "time.sleep(2); print('finished')");
    // A drain: idle members go at once, the zygote only once the run it
    // forked is done (its death would kill it).
    d.signal(Signal::SIGTERM);
    let r = in_flight.join().unwrap().expect("the run's result");
    assert_eq!(r.status, RunStatus::Ok, "{r:?}\n{}", d.log());
    assert!(r.warm, "{r:?}");
    assert_eq!(r.stdout, "started\nfinished\n", "{r:?}");
    let status = d.wait(Duration::from_secs(15));
    assert!(status.success(), "pycelld exit: {status:?}\n{}", d.log());
    d.assert_sandbox_gone(Duration::from_secs(10));
    assert!(d.daemon_cgroups().is_empty());
}

#[test]
fn a_policy_whose_runs_cannot_come_from_a_zygote_gets_a_pool_of_cold_jails() {
    // `network` (egress through pycell's proxy): a zygote serves only
    // loopback-only jails, so its pool's members each start their own python.
    let d = Daemon::start("warm_pools = { network = 1 }\nzygotes = true\n");
    let pool = d.pool_when_ready(1);
    assert_eq!(pool.zygote_jailer_pid, None, "{pool:?}");
    assert!(
        d.log().contains("policy \"network\" gets no zygote"),
        "the journal says why: {}",
        d.log()
    );
    let r = d.warm_run(&RunRequest {
        policy: Some("network".into()),
        ..request("print(6 * 7)")
    });
    assert_eq!(r.stdout, "42\n", "{r:?}");
}
