//! Warm runs (issue 15): a jail whose python waits, started, on pycell's
//! runner until its run's work arrives.

use std::time::{Duration, Instant};

use pycell_core::events::{read_event, Event};
use pycell_core::launch::{Collector, JailerEnd, JailerStderr, Launcher, PolicyChoice};
use pycell_core::protocol::RunRequest;
use pycell_core::resolve::{self, Extras};
use pycell_core::result::RunResult;
use pycell_core::runner;
use pycell_tests::{pycell_bin, require_root};

fn launcher() -> Launcher {
    let mut l = Launcher::embedded_from_env().expect("launcher");
    l.jailer = Ok(pycell_bin().with_file_name("pycell-jailer"));
    l
}

/// Start a warm jail of `policy` importing `modules`, wait `idle` once it
/// is ready, hand it `request`, and collect its result.
fn warm_run(policy: &str, modules: &[&str], idle: Duration, request: &RunRequest) -> RunResult {
    let l = launcher();
    let policy = l.load_policy(PolicyChoice::Name(policy)).expect("policy");
    let modules: Vec<String> = modules.iter().map(|m| m.to_string()).collect();
    let prepared = l
        .prepare_warm(&policy, &Extras::default(), &modules)
        .expect("prepare warm");
    let cold = resolve::resolve(&policy, request).expect("resolve").spec;
    assert!(
        runner::fits(prepared.spec(), &cold),
        "a default request fits"
    );
    let mut launched = prepared.spawn(JailerStderr::Inherit).expect("spawn");
    let first = read_event(&mut launched.events).expect("event");
    assert!(matches!(first, Some(Event::Ready)), "{first:?}");
    std::thread::sleep(idle);
    launched
        .send_work(&runner::work_for(&cold).expect("work"))
        .expect("send work");
    let mut c = Collector::new(&launched.run_id, &launched.policy, Some(launched.limits));
    while let Some(ev) = read_event(&mut launched.events).expect("events") {
        c.record(ev);
    }
    let status = launched.child.wait();
    c.finish(JailerEnd::Exited {
        status,
        stderr: vec![],
    })
}

fn request(code: &str) -> RunRequest {
    RunRequest {
        code: code.into(),
        ..Default::default()
    }
}

#[test]
fn a_warm_jail_runs_its_work_with_clocks_from_arrival() {
    require_root();
    let t = Instant::now();
    let r = warm_run(
        "default",
        &["json"],
        Duration::from_millis(300),
        &request("import sys\nprint('hi', sys.argv, __file__)\nprint('err', file=sys.stderr)\nsys.exit(3)"),
    );
    eprintln!("{r:?} in {:?}", t.elapsed());
    assert_eq!(r.stdout, "hi ['/workspace/main.py'] /workspace/main.py\n");
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
