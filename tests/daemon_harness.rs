//! A real pycelld for one test: root monitor and unprivileged broker (the
//! `pycell` user, which scripts/setup creates), on a socket in a temp dir,
//! with its own sandbox uids and cgroup parent; killed (by pid) when
//! dropped.

use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use pycell_protocol::client::DaemonClient;

use crate::{as_test_daemon, find_cgroups, pycelld_bin, require_root};

/// A pycelld started for one test, killed (by pid) when dropped.
#[derive(Debug)]
pub struct Daemon {
    child: Option<Child>,
    pub dir: tempfile::TempDir,
    pub cgroup_parent: String,
    /// Sandbox uids of this daemon only (concurrent tests run sandboxes too).
    pub uid_base: u32,
}

pub const UIDS_PER_DAEMON: u32 = 64;

fn uid_base() -> u32 {
    static N: AtomicUsize = AtomicUsize::new(0);
    let n = N.fetch_add(1, Ordering::SeqCst) as u32;
    1_900_000_000 + ((std::process::id() % 1000) * 16 + n) * UIDS_PER_DAEMON
}

impl Daemon {
    /// Waits until the daemon reports `active` runs going and, if given,
    /// `queued` waiting; panics past `within`, saying what it reported.
    pub fn wait_for_runs(&self, active: usize, queued: Option<usize>, within: std::time::Duration) {
        let deadline = std::time::Instant::now() + within;
        loop {
            let d = self.client().info().unwrap().daemon;
            if d.active_runs == active && queued.is_none_or(|q| d.queued_runs == q) {
                return;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "never {active} going and {queued:?} waiting: {d:?}"
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }

    pub fn start(extra_config: &str) -> Daemon {
        Self::start_with(extra_config, false)
    }

    /// A daemon started from a copy of pycelld alone in a directory of its
    /// own, with no `pycell` beside it: whatever it does, it does without
    /// the client (which pycelld once looked for there, else at
    /// /usr/bin/pycell).
    pub fn start_alone(extra_config: &str) -> Daemon {
        Self::start_with(extra_config, true)
    }

    fn start_with(extra_config: &str, alone: bool) -> Daemon {
        require_root();
        let dir = crate::open_tempdir("pycelld-test");
        // Each daemon sweeps its own cgroup parent at start and stop; keep
        // concurrent test daemons apart.
        let cgroup_parent = format!(
            "pycelld-test-{}",
            dir.path()
                .file_name()
                .unwrap()
                .to_string_lossy()
                .replace(|c: char| !c.is_ascii_alphanumeric(), "")
        );
        let uid_base = uid_base();
        let config = format!(
            "socket = \"{}/pycell.sock\"\naudit_log = \"{}/audit.jsonl\"\nshutdown_grace = \"6s\"\ncgroup_parent = \"{cgroup_parent}\"\nuid_range = \"{uid_base}-{}\"\n{extra_config}",
            dir.path().display(),
            dir.path().display(),
            uid_base + UIDS_PER_DAEMON - 1
        );
        // Its own env store (under /tmp, which the daemon refuses for
        // envs: runs with dependencies are refused) unless the test names one.
        // No warm pool unless the test asks for one: most tests count the
        // daemon's jailers and sandbox processes (tests/tests/warm.rs
        // tests the pools).
        let config = match extra_config.contains("warm_pools") {
            true => config,
            false => format!("{config}\nwarm_pools = {{}}\n"),
        };
        let config = match extra_config.contains("session_pools") {
            true => config,
            false => format!("{config}\nsession_pools = {{}}\n"),
        };
        let config = match extra_config.contains("env_store") {
            true => config,
            false => format!("{config}\nenv_store = \"{}/envs\"\n", dir.path().display()),
        };
        std::fs::write(dir.path().join("pycelld.toml"), config).unwrap();
        let bin = match alone {
            false => pycelld_bin(),
            true => {
                let copy = dir.path().join("alone").join("pycelld");
                std::fs::create_dir(copy.parent().unwrap()).unwrap();
                std::fs::copy(pycelld_bin(), &copy).unwrap();
                copy
            }
        };
        let child = as_test_daemon(
            Command::new(&bin)
                .arg("--config")
                .arg(dir.path().join("pycelld.toml")),
            &dir.path().join("pycelld.log"),
        )
        .spawn()
        .unwrap_or_else(|e| {
            panic!(
                "cannot start {}: {e} (build it with cargo build --workspace)",
                bin.display()
            )
        });
        let d = Daemon {
            child: Some(child),
            dir,
            cgroup_parent,
            uid_base,
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        while UnixStream::connect(d.socket()).is_err() {
            assert!(
                Instant::now() < deadline,
                "pycelld did not start listening:\n{}",
                d.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        d
    }

    pub fn socket(&self) -> PathBuf {
        self.dir.path().join("pycell.sock")
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("pycelld.log")).unwrap_or_default()
    }

    pub fn audit(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("audit.jsonl")).unwrap_or_default()
    }

    /// The audit log's lines of `event`, once there are `n` of them (the
    /// monitor writes `run_end` when it reaps the jailer, a moment after
    /// the client has its result).
    pub fn audit_events(&self, event: &str, n: usize) -> Vec<serde_json::Value> {
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            let lines: Vec<serde_json::Value> = self
                .audit()
                .lines()
                .map(|l| serde_json::from_str(l).unwrap())
                .filter(|v: &serde_json::Value| v["event"] == event)
                .collect();
            if lines.len() >= n {
                return lines;
            }
            assert!(
                Instant::now() < deadline,
                "{} {event} lines in the audit log, expected {n}:\n{}",
                lines.len(),
                self.audit()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn pid(&self) -> i32 {
        self.child.as_ref().unwrap().id() as i32
    }

    /// Run `req` until a run of it goes to a warm jail (the pool may still
    /// be filling: those runs go cold); that run's result.
    pub fn warm_run(
        &self,
        req: &pycell_protocol::messages::RunRequest,
    ) -> pycell_protocol::result::RunResult {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let r = self.client().run(req.clone(), |_, _| {}).unwrap();
            if r.warm {
                return r;
            }
            assert!(
                Instant::now() < deadline,
                "no run went warm within 20 s: {r:?}\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    pub fn client(&self) -> DaemonClient {
        DaemonClient::connect(&self.socket()).unwrap_or_else(|e| panic!("{e}\n{}", self.log()))
    }

    pub fn signal(&self, sig: nix::sys::signal::Signal) {
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.pid()), sig).unwrap();
    }

    /// Wait for the daemon to exit; its exit status.
    pub fn wait(&mut self, limit: Duration) -> std::process::ExitStatus {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(s) = self.child.as_mut().unwrap().try_wait().unwrap() {
                return s;
            }
            assert!(
                Instant::now() < deadline,
                "pycelld did not exit within {limit:?}:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The daemon's one warm pool, once `ready` members are ready (and
    /// each has its jailer); fails after 20 s.
    pub fn pool_when_ready(&self, ready: usize) -> pycell_protocol::info::WarmPoolStatus {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let pools = self.client().info().unwrap().daemon.warm_pools;
            assert_eq!(pools.len(), 1, "{pools:?}");
            if pools[0].ready == ready && pools[0].jailer_pids.len() == ready {
                return pools[0].clone();
            }
            assert!(
                Instant::now() < deadline,
                "{ready} members never ready: {pools:?}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// One protocol message (JSON) from a raw client running as `uid`
    /// (python, through setpriv), after its hello: the daemon's reply.
    pub fn ask_as(&self, uid: u32, message: &str) -> serde_json::Value {
        let script = self.dir.path().join("ask_as.py");
        std::fs::write(&script, RAW_CLIENT).unwrap();
        let out = Command::new("setpriv")
            .args([
                &format!("--reuid={uid}"),
                &format!("--regid={uid}"),
                "--clear-groups",
                "/usr/bin/python3",
            ])
            .arg(&script)
            .arg(self.socket())
            .arg(message)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        serde_json::from_str(stdout.trim()).unwrap_or_else(|e| {
            let stderr = String::from_utf8_lossy(&out.stderr);
            panic!("{e}: {stdout}\n{stderr}\n{}", self.log())
        })
    }

    /// Host processes running as one of this daemon's sandbox uids.
    pub fn sandbox_processes(&self) -> Vec<crate::HostProc> {
        crate::host_processes()
            .into_iter()
            .filter(|p| {
                p.uids
                    .iter()
                    .any(|u| (self.uid_base..self.uid_base + UIDS_PER_DAEMON).contains(u))
            })
            .collect()
    }

    /// Wait until none of the daemon's sandbox processes or run cgroups
    /// is left, and no cgroup it keeps for its next runs (on v1) holds a
    /// process; fail after `within`.
    pub fn assert_sandbox_gone(&self, within: Duration) {
        let deadline = Instant::now() + within;
        loop {
            let procs = self.sandbox_processes();
            let cgroups: Vec<PathBuf> = self
                .daemon_cgroups()
                .into_iter()
                .filter(|c| !crate::is_kept_empty(c))
                .collect();
            if procs.is_empty() && cgroups.is_empty() {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "left behind after {within:?}: processes {procs:?}, cgroups {cgroups:?}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The directories of the daemon's cgroup parent, in every hierarchy.
    pub fn cgroup_parent_dirs(&self) -> Vec<PathBuf> {
        crate::find_cgroups_named(&self.cgroup_parent)
            .into_iter()
            .collect()
    }

    pub fn daemon_cgroups(&self) -> Vec<PathBuf> {
        find_cgroups(|name| name.starts_with("pycell-"))
            .into_iter()
            .filter(|p| p.to_string_lossy().contains(&self.cgroup_parent))
            .collect()
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        crate::remove_cgroup_parent(&self.cgroup_parent, Duration::from_secs(5));
    }
}

/// A raw client (argv: socket, message): hello, the message, then the
/// daemon's reply printed.
pub const RAW_CLIENT: &str = r#"
import json, socket, struct, sys
s = socket.socket(socket.AF_UNIX)
s.connect(sys.argv[1])
def send(m):
    b = json.dumps(m).encode()
    s.sendall(struct.pack(">I", len(b)) + b)
def recv():
    n = struct.unpack(">I", s.recv(4, socket.MSG_WAITALL))[0]
    return json.loads(s.recv(n, socket.MSG_WAITALL))
send({"type": "hello", "version": 6, "client": "a raw client"})
recv()
send(json.loads(sys.argv[2]))
print(json.dumps(recv()))
"#;
