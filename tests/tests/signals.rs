//! Signals to an embedded `pycell run` (which supervises `pycell-jailer`):
//! ^C (SIGINT to the foreground process group) reaches the program, which
//! may handle it; SIGTERM to pycell stops the sandbox and still reports the
//! run as killed, leaving no sandbox process behind.

#![forbid(unsafe_code)]

use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, killpg, Signal};
use nix::unistd::Pid;
use pycell_tests::{pycell_bin, require_root};

/// Start `pycell run -` (streaming, own process group) on `code` and wait
/// until the program has printed "ready".
fn start_until_ready(code: &str) -> Child {
    start_with(code, &["--embedded"], false)
}

/// `pycell run ARGS --timeout 60 -` on `code`, in a process group of its
/// own, started (when `ignoring`) the way a shell starts a background job:
/// with SIGINT and SIGQUIT ignored, which exec keeps.
fn start_with(code: &str, args: &[&str], ignoring: bool) -> Child {
    require_root();
    let mut cmd = match ignoring {
        false => Command::new(pycell_bin()),
        true => {
            let mut c = Command::new("python3");
            c.args(["-c", IGNORING_EXEC]).arg(pycell_bin());
            c
        }
    };
    let mut child = cmd
        .arg("run")
        .args(args)
        .args(["--timeout", "60", "-"])
        .process_group(0)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start pycell");
    std::io::Write::write_all(child.stdin.as_mut().unwrap(), code.as_bytes()).unwrap();
    drop(child.stdin.take());
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while !line.contains("ready") {
        line.clear();
        if out.read_line(&mut line).unwrap_or(0) == 0 || Instant::now() > deadline {
            let _ = child.kill();
            panic!("the program never said ready");
        }
    }
    // Keep draining stdout so the program never blocks on it.
    std::thread::spawn(move || std::io::copy(&mut out, &mut std::io::sink()));
    child
}

/// Wait (at most 60 s, then kill) for pycell; its exit code and stderr.
fn finish(mut child: Child) -> (Option<i32>, String) {
    let mut err = child.stderr.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = std::io::Read::read_to_string(&mut err, &mut s);
        s
    });
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("pycell did not end within 60 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    (status.code(), reader.join().unwrap_or_default())
}

/// "ready" is printed inside the `try`: the interrupt may arrive while
/// `print` is still returning.
const SLEEPER: &str = "import sys, time\ntry:\n    print('ready', flush=True)\n    time.sleep(30)\nexcept KeyboardInterrupt:\n    print('interrupted', file=sys.stderr)\n    sys.exit(3)\n";

#[test]
fn ctrl_c_reaches_the_program_and_pycell_reports_its_exit() {
    let child = start_until_ready(SLEEPER);
    let pgid = Pid::from_raw(child.id() as i32);
    killpg(pgid, Signal::SIGINT).expect("SIGINT to the process group");
    let (code, stderr) = finish(child);
    assert_eq!(code, Some(3), "stderr: {stderr}");
    assert!(stderr.contains("interrupted"), "stderr: {stderr}");
}

/// Exec argv[1:] with SIGINT and SIGQUIT ignored.
const IGNORING_EXEC: &str = "import os, signal, sys\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nsignal.signal(signal.SIGQUIT, signal.SIG_IGN)\nos.execv(sys.argv[1], sys.argv[1:])\n";

/// Says how it found its signals, then waits for ^C like SLEEPER.
const SIGNALS_SEEN: &str = "import signal, sys, time\nprint('int', signal.getsignal(signal.SIGINT) is signal.default_int_handler, 'quit', signal.getsignal(signal.SIGQUIT) == signal.SIG_DFL, 'mask', sorted(signal.pthread_sigmask(signal.SIG_BLOCK, [])), file=sys.stderr, flush=True)\ntry:\n    print('ready', flush=True)\n    time.sleep(30)\nexcept KeyboardInterrupt:\n    print('interrupted', file=sys.stderr)\n    sys.exit(3)\n";

/// ^C to a pycell started with SIGINT and SIGQUIT ignored, `args` its mode.
fn ctrl_c_when_started_ignoring(args: &[&str]) {
    let child = start_with(SIGNALS_SEEN, args, true);
    killpg(Pid::from_raw(child.id() as i32), Signal::SIGINT).expect("SIGINT to the group");
    let (code, stderr) = finish(child);
    assert!(
        stderr.contains("int True quit True mask []"),
        "the program did not start with default signals: {stderr}"
    );
    assert_eq!(code, Some(3), "stderr: {stderr}");
    assert!(stderr.contains("interrupted"), "stderr: {stderr}");
}

#[test]
fn ctrl_c_reaches_the_program_even_when_pycell_was_started_ignoring_it() {
    ctrl_c_when_started_ignoring(&["--embedded"]);
}

#[test]
fn ctrl_c_reaches_a_daemon_run_even_when_pycell_was_started_ignoring_it() {
    let daemon = pycell_tests::daemon::Daemon::start("");
    let socket = daemon.socket();
    ctrl_c_when_started_ignoring(&["--socket", socket.to_str().unwrap()]);
}

#[test]
fn sigterm_to_pycell_kills_the_sandbox_and_reports_killed() {
    let child = start_until_ready(SLEEPER);
    let started = Instant::now();
    kill(Pid::from_raw(child.id() as i32), Signal::SIGTERM).expect("SIGTERM to pycell");
    let (code, stderr) = finish(child);
    // Killed by SIGKILL: 128 + 9, and one line saying so.
    assert_eq!(code, Some(137), "stderr: {stderr}");
    assert!(stderr.contains("pycell: killed"), "stderr: {stderr}");
    assert!(!stderr.contains("interrupted"), "stderr: {stderr}");
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "the 30 s sleep was not cut short"
    );
}
