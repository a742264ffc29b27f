//! Forks and snapshots of live sessions through pycelld (issue 51): a fork
//! is a copy of its source's Python state and /workspace in a jail, uid
//! and cgroup of its own; each side then goes its own way; random
//! generators are reseeded; what cannot be carried is named; only the
//! owner may fork; state over the bound is refused with the source
//! unharmed; and a pycelld killed mid-fork leaves nothing behind. A
//! snapshot outlives its session and pycelld, restores only for its
//! owner, makes room within its owner's quota, and one cut short by a
//! killed pycelld leaves nothing.

use std::time::{Duration, Instant};

use pycell_protocol::client::{ClientError, DaemonClient};
use pycell_protocol::messages::{ErrorCode, LimitOverrides};
use pycell_protocol::session::{SessionAnswer, SessionCall, SessionInfo, SessionStartRequest};
use pycell_tests::daemon::Daemon;

fn cell(c: &mut DaemonClient, s: &str, code: &str) -> SessionAnswer {
    let a = c
        .session_call(s, SessionCall::Cell { code: code.into() }, None)
        .unwrap_or_else(|e| panic!("cell {code:?}: {e}"));
    assert!(a.reply.error.is_none(), "cell {code:?}: {a:?}");
    a
}

fn value(c: &mut DaemonClient, s: &str, code: &str) -> String {
    cell(c, s, code).reply.value.unwrap_or_default()
}

fn start(d: &Daemon, memory: Option<u64>) -> SessionInfo {
    let req = SessionStartRequest {
        limits: LimitOverrides {
            memory_bytes: memory,
            ..Default::default()
        },
        ..Default::default()
    };
    d.client()
        .session_start(req, |_| {})
        .unwrap_or_else(|e| panic!("session_start: {e}\n{}", d.log()))
}

const SOURCE: &str = r#"
import hashlib, random, threading, time
x = 41
def bump(n=1):
    global x
    x += n
    return x
class Box:
    def __init__(self, v):
        self.v = v
box = Box([1, 2, 3])
also = box
rng = random.Random(7)
big = bytes(range(256)) * (24 << 12)
digest = hashlib.sha256(big).hexdigest()
f = open('/dev/null')
stop = threading.Event()
worker = threading.Thread(target=stop.wait, name='worker', daemon=True)
worker.start()
open('notes.txt', 'w').write('source')
"#;

#[test]
fn a_fork_is_a_copy_that_goes_its_own_way_and_only_its_owner_may_make_one() {
    const OTHER: u32 = 4262;
    let d = Daemon::start(&format!(
        "socket_mode = \"0666\"\nallowed_uids = [{OTHER}]\n"
    ));
    let source = start(&d, None);
    let s = source.session.clone();
    let mut c = d.client();
    cell(&mut c, &s, SOURCE);
    let fork = c
        .session_fork(&s, |_| {})
        .unwrap_or_else(|e| panic!("session_fork: {e}\n{}", d.log()));
    let f = fork.session.session.clone();
    assert_eq!(fork.forked_from, s);
    assert_ne!(f, s);
    assert_ne!(fork.session.sandbox_uid, source.sandbox_uid, "{fork:?}");
    for name in ["x", "bump", "Box", "box", "rng", "big", "digest"] {
        assert!(fork.names.contains(&name.to_string()), "{name}: {fork:?}");
    }
    for name in ["f", "worker"] {
        assert!(fork.dropped.contains_key(name), "{name}: {fork:?}");
    }
    assert!(
        fork.threads_not_carried.contains(&"worker".to_string()),
        "{fork:?}"
    );
    assert_eq!(fork.reseeded, ["Random"], "{fork:?}");
    assert_eq!(fork.files, 1, "{fork:?}");
    // 24 MiB of bytes: more than one chunk each way.
    assert!(fork.state_bytes > 24 << 20, "{fork:?}");

    // The same state on both sides, then each its own.
    let check =
        "hashlib.sha256(big).hexdigest() == digest, also is box, box.v, open('notes.txt').read()";
    let same = "(True, True, [1, 2, 3], 'source')";
    assert_eq!(value(&mut c, &f, check), same);
    assert_eq!(value(&mut c, &f, "bump(), Box(5).v"), "(42, 5)");
    cell(
        &mut c,
        &f,
        "open('notes.txt', 'w').write('fork'); box.v.append(4)",
    );
    assert_eq!(value(&mut c, &s, "bump(10)"), "51");
    assert_eq!(value(&mut c, &s, check), same);
    assert_eq!(
        value(&mut c, &f, "x, box.v, open('notes.txt').read()"),
        "(42, [1, 2, 3, 4], 'fork')"
    );
    // The cells go on numbered after the source's.
    let a = cell(&mut c, &f, "1");
    assert!(a.reply.cell.is_some_and(|n| n >= 5), "{a:?}");
    // The generators differ: the fork was reseeded, and so are draws from
    // the kernel.
    let draw = "rng.random(), __import__('secrets').token_hex(16)";
    let (a, b) = (value(&mut c, &s, draw), value(&mut c, &f, draw));
    assert_ne!(a, b);
    assert_ne!(a.split(',').next(), b.split(',').next(), "{a} {b}");
    // The fork has only its main thread.
    assert_eq!(value(&mut c, &f, "threading.active_count()"), "1");

    // A fork of a fork; every one listed, each the caller's.
    let second = c.session_fork(&f, |_| {}).unwrap();
    assert_eq!(value(&mut c, &second.session.session, "x"), "42");
    assert_eq!(d.client().session_list().unwrap().len(), 3);

    // Another uid gets what an unknown handle gets.
    let fork = format!(r#"{{"type": "session_fork", "id": "1", "session": "{s}"}}"#);
    let other = d.ask_as(OTHER, &fork);
    assert_eq!(other["type"], "error", "{other}");
    assert_eq!(other["code"], "unknown_session", "{other}");
    for h in [&s, &f, &second.session.session] {
        d.client().session_end(h).unwrap();
    }
    d.assert_sandbox_gone(Duration::from_secs(15));
}

#[test]
fn state_over_the_bound_is_refused_and_the_source_lives_on() {
    let d = Daemon::start("");
    // 256 MiB of memory: at most 64 MiB of state.
    let source = start(&d, Some(256 << 20));
    let s = source.session.clone();
    let mut c = d.client();
    cell(&mut c, &s, "x = 1\nbig = bytes(80 << 20)");
    let refused = c.session_fork(&s, |_| {});
    match refused {
        Err(ClientError::Refused { code, message }) => {
            assert_eq!(code, ErrorCode::StateRefused, "{message}");
            assert!(message.contains("more than"), "{message}");
        }
        other => panic!("expected state_refused, got {other:?}"),
    }
    // Only the source is left, as it was.
    assert_eq!(
        value(&mut c, &s, "x, len(big)"),
        format!("(1, {})", 80 << 20)
    );
    let listed = d.client().session_list().unwrap();
    assert_eq!(listed.len(), 1, "{listed:?}");
    // Freed of its bulk, it forks.
    cell(&mut c, &s, "del big");
    let fork = c.session_fork(&s, |_| {}).unwrap();
    assert_eq!(value(&mut c, &fork.session.session, "x"), "1");
}

#[test]
fn a_pycelld_killed_mid_fork_leaves_nothing_behind() {
    let mut d = Daemon::start("");
    let source = start(&d, Some(1 << 30));
    let mut c = d.client();
    // 100 MiB of state (within its bound, 128 MiB: its disk limit): the
    // fork's jail is up well before the state is carried.
    cell(&mut c, &source.session, "big = bytes(100 << 20)");
    let handle = source.session.clone();
    let forking = std::thread::spawn(move || c.session_fork(&handle, |_| {}));
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let mut uids: Vec<u32> = d
            .sandbox_processes()
            .iter()
            .flat_map(|p| p.uids.first().copied())
            .collect();
        uids.sort();
        uids.dedup();
        if uids.len() >= 2 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the fork's jail never came\n{}",
            d.log()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(!forking.is_finished(), "the fork was done before the kill");
    d.signal(nix::sys::signal::Signal::SIGKILL);
    d.wait(Duration::from_secs(10));
    d.assert_sandbox_gone(Duration::from_secs(15));
    let heard = forking.join().unwrap();
    assert!(
        heard.is_err(),
        "the client must hear the fork failed: {heard:?}"
    );
}

/// A store for snapshots that outlives one pycelld: `env_store` in the
/// daemon's configuration.
fn lasting_store() -> (tempfile::TempDir, String) {
    let dir = pycell_tests::open_tempdir("pycell-snapshots");
    let conf = format!("env_store = \"{}/envs\"\n", dir.path().display());
    (dir, conf)
}

fn files_in(dir: &std::path::Path) -> Vec<String> {
    walk(dir)
        .into_iter()
        .map(|p| p.display().to_string())
        .collect()
}

fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        match e.file_type().is_ok_and(|t| t.is_dir()) {
            true => out.extend(walk(&e.path())),
            false => out.push(e.path()),
        }
    }
    out
}

#[test]
fn a_snapshot_outlives_its_session_and_pycelld_and_is_its_owners_alone() {
    const OTHER: u32 = 4263;
    let (store, conf) = lasting_store();
    let conf = format!(
        "{conf}socket_mode = \"0666\"\nallowed_uids = [{OTHER}]\nsnapshots_per_owner = 2\n"
    );
    let d = Daemon::start(&conf);
    let source = start(&d, None);
    let s = source.session.clone();
    let mut c = d.client();
    cell(&mut c, &s, "import random\nx = 41\nrng = random.Random(2)\nf = open('/dev/null')\nopen('kept.txt', 'w').write('yes')");
    let snap = c.session_snapshot(&s).unwrap();
    assert!(snap.snapshot.starts_with("snap-"), "{snap:?}");
    assert!(
        snap.names.contains(&"x".to_string()) && snap.dropped.contains_key("f"),
        "{snap:?}"
    );
    assert_eq!(snap.reseeded, ["Random"]);
    assert!(snap.expires_at > snap.created_at, "{snap:?}");
    // The session goes on unchanged.
    assert_eq!(value(&mut c, &s, "x"), "41");
    // Another uid can neither snapshot the session nor start from its snapshot.
    let other = d.ask_as(
        OTHER,
        &format!(r#"{{"type": "session_snapshot", "id": "1", "session": "{s}"}}"#),
    );
    assert_eq!(other["code"], "unknown_session", "{other}");
    let from = format!(
        r#"{{"type": "session_start", "id": "1", "request": {{"from_snapshot": "{}"}}}}"#,
        snap.snapshot
    );
    let other = d.ask_as(OTHER, &from);
    assert_eq!(other["code"], "unknown_snapshot", "{other}");
    // A restart of pycelld: the session is gone, its snapshot is not.
    drop(c);
    drop(d);
    let d = Daemon::start(&conf);
    let req = SessionStartRequest {
        from_snapshot: Some(snap.snapshot.clone()),
        ..Default::default()
    };
    let again = d.client().session_start(req.clone(), |_| {}).unwrap();
    let restored = again
        .restored
        .clone()
        .unwrap_or_else(|| panic!("{again:?}"));
    assert_eq!(restored.snapshot, snap.snapshot);
    assert_eq!(restored.files, 1);
    let mut c = d.client();
    let h = again.session.clone();
    assert_eq!(
        value(&mut c, &h, "x + 1, open('kept.txt').read()"),
        "(42, 'yes')"
    );
    // A snapshot with other settings is refused, not half obeyed.
    let mixed = SessionStartRequest {
        policy: Some("default".into()),
        ..req
    };
    match d.client().session_start(mixed, |_| {}) {
        Err(ClientError::Refused { code, message }) => {
            assert_eq!(code, ErrorCode::InvalidRequest, "{message}")
        }
        other => panic!("expected invalid_request, got {other:?}"),
    }
    // Two per owner: a third evicts the oldest.
    let second = c.session_snapshot(&h).unwrap();
    assert!(second.evicted.is_empty(), "{second:?}");
    let third = c.session_snapshot(&h).unwrap();
    assert_eq!(third.evicted, std::slice::from_ref(&snap.snapshot));
    let gone = SessionStartRequest {
        from_snapshot: Some(snap.snapshot.clone()),
        ..Default::default()
    };
    match d.client().session_start(gone, |_| {}) {
        Err(ClientError::Refused { code, .. }) => assert_eq!(code, ErrorCode::UnknownSnapshot),
        other => panic!("expected unknown_snapshot, got {other:?}"),
    }
    d.client().session_end(&h).unwrap();
    let kept = files_in(&store.path().join("envs/snapshots"));
    assert_eq!(
        kept.len(),
        4,
        "two snapshots, a bundle and a description each: {kept:?}"
    );
}

#[test]
fn a_pycelld_killed_mid_snapshot_keeps_no_half_of_it() {
    let (store, conf) = lasting_store();
    let mut d = Daemon::start(&conf);
    let source = start(&d, Some(1 << 30));
    let mut c = d.client();
    cell(&mut c, &source.session, "big = bytes(100 << 20)");
    let handle = source.session.clone();
    let taking = std::thread::spawn(move || c.session_snapshot(&handle));
    let snapshots = store.path().join("envs/snapshots");
    let deadline = Instant::now() + Duration::from_secs(60);
    while !files_in(&snapshots).iter().any(|f| f.ends_with(".partial")) {
        assert!(
            Instant::now() < deadline,
            "no snapshot was being written\n{}",
            d.log()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        !taking.is_finished(),
        "the snapshot was done before the kill"
    );
    d.signal(nix::sys::signal::Signal::SIGKILL);
    d.wait(Duration::from_secs(10));
    d.assert_sandbox_gone(Duration::from_secs(15));
    assert!(taking.join().unwrap().is_err());
    // The next pycelld removes the half-written snapshot as it starts
    // (its broker, which answers once it has).
    let d = Daemon::start(&conf);
    d.client().status().unwrap();
    let left = files_in(&snapshots);
    assert!(left.is_empty(), "{left:?}");
}

/// A policy whose sessions pause after a second idle, in a directory of
/// its own: (the directory, pycelld's configuration naming it).
fn pausing_policy() -> (tempfile::TempDir, String) {
    pausing_policy_living("1h")
}

/// [`pausing_policy`], its sessions living `lifetime`.
fn pausing_policy_living(lifetime: &str) -> (tempfile::TempDir, String) {
    let policies = pycell_tests::open_tempdir("pycell-pausing");
    let text = pycell_policy::builtin::source("default")
        .unwrap()
        .replace("name = \"default\"", "name = \"pausing\"")
        .replace(
            "idle_timeout = \"10m\"",
            "idle_timeout = \"1s\"\npause_when_idle = true",
        )
        .replace("lifetime = \"1h\"", &format!("lifetime = \"{lifetime}\""));
    assert!(
        text.contains(&format!("lifetime = \"{lifetime}\"")),
        "{text}"
    );
    assert!(text.contains("pause_when_idle = true"), "{text}");
    std::fs::write(policies.path().join("pausing.toml"), text).unwrap();
    let conf = format!("policy_dir = \"{}\"\n", policies.path().display());
    (policies, conf)
}

fn wait_paused(d: &Daemon, handle: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let listed = d.client().session_list().unwrap();
        if listed.iter().any(|s| s.session == handle && s.paused) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "never paused: {listed:?}\n{}",
            d.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn an_idle_session_pauses_and_its_next_call_resumes_it() {
    let (_policies, conf) = pausing_policy();
    let (store, store_conf) = lasting_store();
    let d = Daemon::start(&format!("{conf}{store_conf}"));
    let req = SessionStartRequest {
        policy: Some("pausing".into()),
        ..Default::default()
    };
    let info = d.client().session_start(req, |_| {}).unwrap();
    let h = info.session.clone();
    let mut c = d.client();
    cell(&mut c, &h, "x = 41\nopen('kept.txt', 'w').write('yes')");
    wait_paused(&d, &h);
    // Paused: its jail is gone (its memory and admission freed).
    d.assert_sandbox_gone(Duration::from_secs(10));
    assert_eq!(d.client().status().unwrap().memory_admitted_bytes, 0);
    // The next call resumes it, under the same handle, and says so.
    let a = c
        .session_call(
            &h,
            SessionCall::Cell {
                code: "x + 1, open('kept.txt').read()".into(),
            },
            None,
        )
        .unwrap();
    assert!(a.resumed, "{a:?}");
    assert_eq!(a.reply.value.as_deref(), Some("(42, 'yes')"), "{a:?}");
    let again = cell(&mut c, &h, "x");
    assert!(!again.resumed);
    // Resumed, it holds its admission again (a busy session never pauses).
    let handle = h.clone();
    let mut c2 = d.client();
    let busy = std::thread::spawn(move || cell(&mut c2, &handle, "import time\ntime.sleep(2)"));
    std::thread::sleep(Duration::from_millis(500));
    let admitted = d.client().status().unwrap().memory_admitted_bytes;
    assert!(admitted >= info.limits.memory.get(), "{admitted}");
    assert!(!busy.join().unwrap().resumed);
    // A second pause and resume loses nothing either (E2B #884).
    wait_paused(&d, &h);
    let a = cell(&mut c, &h, "x + 2, open('kept.txt').read()");
    assert!(a.resumed, "{a:?}");
    assert_eq!(a.reply.value.as_deref(), Some("(43, 'yes')"), "{a:?}");
    // Each pause's snapshot went once it resumed; a third pause, then an
    // end while paused, leaves no snapshot behind.
    wait_paused(&d, &h);
    d.client().session_end(&h).unwrap();
    let left = files_in(&store.path().join("envs/snapshots"));
    assert!(left.is_empty(), "{left:?}");
    let gone = c.session_call(&h, SessionCall::Cell { code: "x".into() }, None);
    match gone {
        Err(ClientError::Refused { code, .. }) => assert_eq!(code, ErrorCode::UnknownSession),
        other => panic!("expected unknown_session, got {other:?}"),
    }
}

#[test]
fn pauses_do_not_stretch_a_sessions_lifetime() {
    let (_policies, conf) = pausing_policy_living("4s");
    let (store, store_conf) = lasting_store();
    let d = Daemon::start(&format!("{conf}{store_conf}"));
    let req = SessionStartRequest {
        policy: Some("pausing".into()),
        ..Default::default()
    };
    let started = Instant::now();
    let info = d.client().session_start(req, |_| {}).unwrap();
    let h = info.session.clone();
    let mut c = d.client();
    cell(&mut c, &h, "x = 1");
    wait_paused(&d, &h);
    // Past its lifetime, counted from its first start, it is over: its
    // next call does not resume it, and its kept state is gone.
    std::thread::sleep(Duration::from_secs(5).saturating_sub(started.elapsed()));
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let listed = d.client().session_list().unwrap();
        if listed.is_empty() {
            break;
        }
        assert!(Instant::now() < deadline, "still listed: {listed:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
    match c.session_call(&h, SessionCall::Cell { code: "x".into() }, None) {
        Err(ClientError::Refused { code, message }) => {
            assert_eq!(code, ErrorCode::SessionGone, "{message}");
            assert!(message.contains("lifetime"), "{message}");
        }
        other => panic!("expected session_gone, got {other:?}"),
    }
    d.assert_sandbox_gone(Duration::from_secs(10));
    let left = files_in(&store.path().join("envs/snapshots"));
    assert!(left.is_empty(), "{left:?}");
}
