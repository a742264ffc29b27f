//! pycelld under faults: 2,000 runs at concurrency 32 from 3 uids while the
//! monitor, the broker, jailers and clients are SIGKILLed 10 times and the
//! service restarts. This test plays systemd: it holds the listening socket
//! and passes it to each pycelld it starts (socket activation: LISTEN_FDS),
//! and restarts pycelld whenever it exits, so clients that arrive while the
//! daemon is down wait in the socket's backlog.
//!
//! Every run must end in a correct result or a clear error code, never
//! someone else's output; afterwards no sandbox process, cgroup, uid lease
//! or stray file may be left. Needs root, the `pycell` user and group
//! (scripts/setup) and `setpriv`. One test in this file: it makes the
//! listening socket inheritable while it starts pycelld.

#![forbid(unsafe_code)]

use std::collections::{BTreeMap, HashSet};
use std::io::Write;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use pycell_tests::{
    as_test_daemon, children_of, find_cgroups, host_processes, pycell_bin, pycelld_bin,
    require_root,
};

const TOTAL: usize = 2000;
const CONCURRENCY: usize = 32;
const KILLS: usize = 10;
/// Client uids: root, and two more allowed by uid (no accounts needed).
const UIDS: [u32; 3] = [0, 4251, 4252];
const SANDBOX_UIDS: u32 = 256;

/// The service as systemd would run it.
struct Service {
    dir: PathBuf,
    listener: UnixListener,
    current: Mutex<Option<Child>>,
    stop: AtomicBool,
    starts: AtomicUsize,
}

impl Service {
    fn config(&self) -> PathBuf {
        self.dir.join("pycelld.toml")
    }

    fn socket(&self) -> PathBuf {
        self.dir.join("pycell.sock")
    }

    /// Start pycelld with the listening socket as its descriptor 3.
    fn spawn(&self) -> Child {
        // An inheritable copy, for this spawn only.
        let copy: OwnedFd = nix::unistd::dup(&self.listener).unwrap();
        let n = copy.as_raw_fd();
        assert_ne!(n, 3, "descriptor 3 is free in the test process");
        let script =
            format!("exec 3<&{n} {n}<&-; LISTEN_PID=$$ LISTEN_FDS=1 exec \"$0\" --config \"$1\"");
        // bash, not sh: dash takes only single-digit descriptors in a
        // redirection ("Bad fd number"), and with clients connecting from
        // other threads the copy may well be 10 or more.
        let child = as_test_daemon(
            Command::new("bash")
                .args(["-c", &script])
                .arg(pycelld_bin())
                .arg(self.config()),
            &self.dir.join("pycelld.log"),
        )
        .spawn()
        .unwrap();
        drop(copy);
        self.starts.fetch_add(1, Ordering::SeqCst);
        child
    }

    /// Keep pycelld running until told to stop (Restart=always, 200 ms).
    fn supervise(self: Arc<Self>) -> std::thread::JoinHandle<()> {
        std::thread::spawn(move || {
            while !self.stop.load(Ordering::SeqCst) {
                let child = self.spawn();
                *self.current.lock().unwrap() = Some(child);
                loop {
                    std::thread::sleep(Duration::from_millis(20));
                    let mut cur = self.current.lock().unwrap();
                    let done = cur.as_mut().unwrap().try_wait().unwrap().is_some();
                    if done || self.stop.load(Ordering::SeqCst) {
                        if !done {
                            let c = cur.as_mut().unwrap();
                            let _ = kill(Pid::from_raw(c.id() as i32), Signal::SIGTERM);
                            let _ = c.wait();
                        }
                        break;
                    }
                }
                std::thread::sleep(Duration::from_millis(200));
            }
        })
    }

    fn monitor_pid(&self) -> Option<u32> {
        let cur = self.current.lock().unwrap();
        cur.as_ref().map(|c| c.id())
    }
}

/// How one run ended, as its client reported it.
#[derive(Debug, PartialEq, Eq, PartialOrd, Ord, Clone)]
enum Ended {
    Correct,
    /// A clear error code in the client's JSON result.
    Error(String),
    /// The client itself was one of the processes killed.
    ClientKilled,
    /// Anything else: a wrong result, no result. Each one fails the test.
    Wrong(String),
}

fn classify(token: &str, status: Option<i32>, stdout: &[u8], killed: bool) -> Ended {
    let v: serde_json::Value = match serde_json::from_slice(stdout) {
        Ok(v) => v,
        Err(_) if killed || status.is_none() => return Ended::ClientKilled,
        Err(e) => return Ended::Wrong(format!("no JSON result (exit {status:?}): {e}")),
    };
    let want_out = format!("{token}\n");
    let want_err = format!("{}\n", token.chars().rev().collect::<String>());
    match (v["status"].as_str(), v["error"]["code"].as_str()) {
        (Some("ok"), _) if v["stdout"] == want_out.as_str() && v["stderr"] == want_err.as_str() => {
            Ended::Correct
        }
        (Some("ok"), _) => Ended::Wrong(format!("{token}: someone else's output: {v}")),
        // Output so far must still be this run's own.
        (_, Some(code)) if v["stdout"] == "" || v["stdout"] == want_out.as_str() => {
            Ended::Error(code.to_string())
        }
        _ => Ended::Wrong(format!("{token}: {v}")),
    }
}

/// One run through `pycell run` as `uid`; the client's pid is in `clients`
/// while it runs.
fn one_run(
    client: &Path,
    socket: &Path,
    uid: u32,
    i: usize,
    clients: &Mutex<HashSet<u32>>,
) -> Ended {
    let token = format!("run-{i}-uid{uid}-{}", i * 7919 % 997);
    let pause = (i * 37) % 200;
    let code = format!(
        "import sys, time\ntime.sleep({pause} / 1000)\nprint({token:?})\nprint({token:?}[::-1], file=sys.stderr)\n"
    );
    let mut child = Command::new("setpriv")
        .args([
            &format!("--reuid={uid}"),
            &format!("--regid={uid}"),
            "--clear-groups",
        ])
        .arg(client)
        .args(["run", "--json", "--socket"])
        .arg(socket)
        .arg("-")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let pid = child.id();
    clients.lock().unwrap().insert(pid);
    let _ = child.stdin.take().unwrap().write_all(code.as_bytes());
    let out = child.wait_with_output().unwrap();
    clients.lock().unwrap().remove(&pid);
    let killed = std::os::unix::process::ExitStatusExt::signal(&out.status) == Some(9);
    classify(&token, out.status.code(), &out.stdout, killed)
}

/// A small deterministic generator, seeded from the clock (the seed is in
/// the failure message).
struct Lcg(u64);

impl Lcg {
    fn next(&mut self, n: usize) -> usize {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((self.0 >> 33) % n as u64) as usize
    }
}

/// SIGKILL one pycell process of the kind `what` (or another kind if none
/// runs now); returns what was killed.
fn kill_one(svc: &Service, clients: &Mutex<HashSet<u32>>, what: usize, rng: &mut Lcg) -> String {
    for k in 0..4 {
        let kind = (what + k) % 4;
        let monitor = svc.monitor_pid();
        let candidates: Vec<u32> = match (kind, monitor) {
            (0, Some(m)) => vec![m],
            (1, Some(m)) => children_of(m)
                .into_iter()
                .filter(|p| p.name == "pycelld")
                .map(|p| p.pid)
                .collect(),
            (2, Some(m)) => children_of(m)
                .into_iter()
                .filter(|p| p.name == "pycell-jailer")
                .map(|p| p.pid)
                .collect(),
            (3, _) => clients.lock().unwrap().iter().copied().collect(),
            _ => Vec::new(),
        };
        if let Some(pid) = candidates.get(rng.next(candidates.len().max(1))) {
            if kill(Pid::from_raw(*pid as i32), Signal::SIGKILL).is_ok() {
                return ["monitor", "broker", "jailer", "client"][kind].to_string();
            }
        }
    }
    "nothing".to_string()
}

fn bind_listener(path: &Path) -> UnixListener {
    let l = UnixListener::bind(path).unwrap();
    let gid = pycell_tests::pycell_gid();
    nix::unistd::chown(path, Some(nix::unistd::Uid::from_raw(0)), Some(gid)).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o666)).unwrap();
    l
}

#[test]
fn two_thousand_runs_from_three_uids_survive_ten_sigkills_and_restarts() {
    require_root();
    let tmp = tempfile::Builder::new()
        .prefix("pycelld-rel")
        .tempdir()
        .unwrap();
    let dir = tmp.path().to_path_buf();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let uid_base = 1_950_000_000 + (std::process::id() % 1000) * SANDBOX_UIDS;
    let cgroup_parent = format!("pycelld-rel-{}", std::process::id());
    std::fs::write(
        dir.join("pycelld.toml"),
        format!(
            "socket = \"{}/pycell.sock\"\naudit_log = \"{}/audit.jsonl\"\nshutdown_grace = \"3s\"\ncgroup_parent = \"{cgroup_parent}\"\nuid_range = \"{uid_base}-{}\"\nallowed_uids = [{}, {}]\n",
            dir.display(),
            dir.display(),
            uid_base + SANDBOX_UIDS - 1,
            UIDS[1],
            UIDS[2]
        ),
    )
    .unwrap();
    let client = dir.join("pycell");
    std::fs::copy(pycell_bin(), &client).unwrap();
    let svc = Arc::new(Service {
        listener: bind_listener(&dir.join("pycell.sock")),
        dir: dir.clone(),
        current: Mutex::new(None),
        stop: AtomicBool::new(false),
        starts: AtomicUsize::new(0),
    });
    let supervisor = Arc::clone(&svc).supervise();

    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64;
    let started = Instant::now();
    let next = Arc::new(AtomicUsize::new(0));
    let done = Arc::new(AtomicUsize::new(0));
    let clients = Arc::new(Mutex::new(HashSet::new()));
    let workers: Vec<_> = (0..CONCURRENCY)
        .map(|_| {
            let (next, done, clients) =
                (Arc::clone(&next), Arc::clone(&done), Arc::clone(&clients));
            let (client, socket) = (client.clone(), svc.socket());
            std::thread::spawn(move || {
                let mut ends = Vec::new();
                loop {
                    let i = next.fetch_add(1, Ordering::SeqCst);
                    if i >= TOTAL {
                        return ends;
                    }
                    ends.push(one_run(&client, &socket, UIDS[i % 3], i, &clients));
                    done.fetch_add(1, Ordering::SeqCst);
                }
            })
        })
        .collect();

    // The faults: one kill every TOTAL/(KILLS+2) finished runs.
    let mut rng = Lcg(seed);
    let mut killed = Vec::new();
    let limit = Instant::now() + Duration::from_secs(25 * 60);
    for k in 0..KILLS {
        let at = (k + 1) * TOTAL / (KILLS + 2);
        while done.load(Ordering::SeqCst) < at {
            assert!(
                Instant::now() < limit,
                "runs stalled at {}",
                done.load(Ordering::SeqCst)
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        let what = rng.next(4);
        killed.push(kill_one(&svc, &clients, what, &mut rng));
    }
    let ends: Vec<Ended> = workers
        .into_iter()
        .flat_map(|w| w.join().unwrap())
        .collect();
    let took = started.elapsed();
    svc.stop.store(true, Ordering::SeqCst);
    supervisor.join().unwrap();

    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    for e in &ends {
        let key = match e {
            Ended::Correct => "correct".to_string(),
            Ended::Error(code) => format!("error {code}"),
            Ended::ClientKilled => "client killed".to_string(),
            Ended::Wrong(_) => "WRONG".to_string(),
        };
        *counts.entry(key).or_default() += 1;
    }
    let log = std::fs::read_to_string(dir.join("pycelld.log")).unwrap_or_default();
    let summary = format!(
        "seed {seed}: {} runs in {:.0} s, pycelld started {} times, killed {killed:?}: {counts:?}",
        ends.len(),
        took.as_secs_f64(),
        svc.starts.load(Ordering::SeqCst)
    );
    eprintln!("{summary}");
    let wrong: Vec<&Ended> = ends
        .iter()
        .filter(|e| matches!(e, Ended::Wrong(_)))
        .collect();
    assert_eq!(ends.len(), TOTAL, "{summary}");
    assert!(
        wrong.is_empty(),
        "{summary}\n{:?}\n{}",
        &wrong[..wrong.len().min(5)],
        tail(&log)
    );
    assert_eq!(killed.len(), KILLS);
    assert!(
        counts.get("correct").copied().unwrap_or(0) > TOTAL * 3 / 4,
        "{summary}\n{}",
        tail(&log)
    );

    // Nothing left behind.
    let sandbox = |p: &pycell_tests::HostProc| {
        p.uids
            .iter()
            .any(|u| (uid_base..uid_base + SANDBOX_UIDS).contains(u))
    };
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let procs: Vec<_> = host_processes().into_iter().filter(sandbox).collect();
        let cgroups = find_cgroups(|n| n.starts_with("pycell-"))
            .into_iter()
            .filter(|p| p.to_string_lossy().contains(&cgroup_parent))
            .collect::<Vec<_>>();
        if procs.is_empty() && cgroups.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "left behind: processes {procs:?}, cgroups {cgroups:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // The parent an instance SIGKILLed earlier made (the last instance
    // found it there, so it is not one it removes).
    pycell_tests::remove_cgroup_parent(&cgroup_parent, Duration::ZERO);
    let held: Vec<u32> = (uid_base..uid_base + SANDBOX_UIDS)
        .filter(|uid| lease_held(*uid))
        .collect();
    assert!(held.is_empty(), "uid leases still held: {held:?}");
    let mut files: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    files.sort();
    assert_eq!(
        files,
        [
            "audit.jsonl",
            "pycell",
            "pycell.sock",
            "pycelld.log",
            "pycelld.toml"
        ],
        "stray files"
    );
    // Every run_start in the audit log has its run_end.
    let audit = std::fs::read_to_string(dir.join("audit.jsonl")).unwrap();
    let count = |event: &str| {
        audit
            .lines()
            .filter(|l| l.contains(&format!("\"event\":\"{event}\"")))
            .count()
    };
    eprintln!(
        "audit: {} run_start, {} run_end",
        count("run_start"),
        count("run_end")
    );
}

/// Whether some process holds the lease of `uid` (its lock file is locked).
fn lease_held(uid: u32) -> bool {
    let path = Path::new("/run/pycell/uids").join(uid.to_string());
    let Ok(file) = std::fs::OpenOptions::new().write(true).open(&path) else {
        return false;
    };
    nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusiveNonblock).is_err()
}

fn tail(log: &str) -> String {
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(40)..].join("\n")
}
