//! The jailer's outer half (host root, single-threaded): creates the run's
//! cgroup, clones the jail into new namespaces, writes its uid/gid maps,
//! relays its output as event frames with the output caps applied, enforces
//! the wall-clock timeout by killing the whole pid namespace and cgroup, and
//! reports the result. The cgroup is removed before the result is written.

use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::time::{Duration, Instant};

use nix::fcntl::OFlag;
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::signal::{kill, sigprocmask, SigSet, SigmaskHow, Signal};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use nix::sys::wait::{waitpid, WaitStatus};
use nix::unistd::{pipe2, setgroups, Pid};

use crate::cgroup::{CgroupLayout, CgroupLimits, SandboxCgroup};
use crate::child::{child_main, ChildFds, ChildMessage, GO_CGROUP, GO_MAPS};
use crate::events::{self, KIND_STDERR, KIND_STDOUT};
use crate::report::{CgroupReport, JailFailure, JailReport, Layers, RunStatus, SeccompReport};
use crate::spec::{JailSpec, JAIL_GID, JAIL_UID};
use crate::syscall::{self, CloneResult};

/// The namespaces every jail gets (the cgroup one is entered by the child
/// once it has been moved into its cgroup).
pub const NAMESPACES: &[&str] = &["user", "pid", "mount", "net", "ipc", "uts", "cgroup"];

const CHUNK: usize = 64 * 1024;

/// Which of the program's output streams a chunk came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutputStream {
    Stdout,
    Stderr,
}

/// Receives the program's output as it arrives (already capped).
pub trait OutputSink {
    fn output(&mut self, stream: OutputStream, bytes: &[u8]) -> io::Result<()>;
}

/// Writes output as event frames (what the `pycell-jailer` binary does).
#[derive(Debug)]
pub struct FrameSink<W: Write>(pub W);

impl<W: Write> OutputSink for FrameSink<W> {
    fn output(&mut self, stream: OutputStream, bytes: &[u8]) -> io::Result<()> {
        let kind = match stream {
            OutputStream::Stdout => KIND_STDOUT,
            OutputStream::Stderr => KIND_STDERR,
        };
        events::write_frame(&mut self.0, kind, bytes)
    }
}

/// Run the jail described by `spec`, streaming its output to `sink`, and
/// return the report. Must be called from a single-threaded process: it
/// forks. Blocks SIGINT/SIGTERM/SIGHUP/SIGCHLD in the caller while it runs
/// (SIGINT is passed on to the program; SIGTERM/SIGHUP kill the sandbox).
pub fn run(spec: &JailSpec, sink: &mut dyn OutputSink) -> JailReport {
    match run_inner(spec, sink) {
        Ok(r) => r,
        Err(f) => JailReport::refused(f),
    }
}

/// The cgroup name of a run; starts with the sandbox uid so that the holder
/// of that uid's lease can recognise leftovers of an earlier holder.
pub fn cgroup_name(spec: &JailSpec) -> String {
    format!("{}{}", cgroup_prefix(spec.sandbox_uid), spec.run_id)
}

fn cgroup_prefix(uid: u32) -> String {
    format!("pycell-{uid}-")
}

fn run_inner(spec: &JailSpec, sink: &mut dyn OutputSink) -> Result<JailReport, JailFailure> {
    spec.validate()
        .map_err(|e| JailFailure::new("invalid_spec", "jailer", e.to_string(), None))?;
    if !nix::unistd::geteuid().is_root() {
        return Err(JailFailure::new(
            "not_root",
            "jailer",
            "pycell-jailer must run as root (it creates cgroups and maps a sandbox uid)",
            Some("run pycell as root, or through the pycelld service"),
        ));
    }
    let filter = pycell_seccomp::compile(&spec.seccomp_profile)
        .map_err(|e| JailFailure::new("seccomp_unavailable", "seccomp", e.to_string(), None))?;
    let layout = CgroupLayout::detect()
        .map_err(|e| JailFailure::new("cgroup_unavailable", "cgroup", e.to_string(), None))?;
    let mut cgroup = None;
    let result = supervise(spec, &filter, &layout, &mut cgroup, sink);
    if let Some(cg) = cgroup {
        cg.kill_all();
        cg.remove();
    }
    result
}

fn create_cgroup(spec: &JailSpec, layout: &CgroupLayout) -> Result<SandboxCgroup, JailFailure> {
    layout.remove_stale(&spec.cgroup.parent, &cgroup_prefix(spec.sandbox_uid));
    SandboxCgroup::create(
        layout,
        &spec.cgroup.parent,
        &cgroup_name(spec),
        CgroupLimits {
            memory_bytes: spec.limits.memory_bytes,
            pids: spec.limits.pids,
            cpu_millicores: spec.limits.cpu_millicores,
        },
    )
    .map_err(|e| JailFailure::new("cgroup_unavailable", "cgroup", e.to_string(), None))
}

struct Pipes {
    go: (OwnedFd, OwnedFd),
    status: (OwnedFd, OwnedFd),
    stdin: (OwnedFd, OwnedFd),
    stdout: (OwnedFd, OwnedFd),
    stderr: (OwnedFd, OwnedFd),
}

/// Our ends of the jail's pipes.
struct ParentEnds {
    go_write: OwnedFd,
    status_read: OwnedFd,
    stdin_write: OwnedFd,
    stdout_read: OwnedFd,
    stderr_read: OwnedFd,
}

impl Pipes {
    /// The child's ends and ours; each side drops the other's after clone.
    fn split(self) -> (ChildFds, ParentEnds) {
        let Pipes {
            go,
            status,
            stdin,
            stdout,
            stderr,
        } = self;
        (
            ChildFds {
                go_read: go.0,
                status_write: status.1,
                stdin_read: stdin.0,
                stdout_write: stdout.1,
                stderr_write: stderr.1,
            },
            ParentEnds {
                go_write: go.1,
                status_read: status.0,
                stdin_write: stdin.1,
                stdout_read: stdout.0,
                stderr_read: stderr.0,
            },
        )
    }
}

fn pipes() -> io::Result<Pipes> {
    let p = || pipe2(OFlag::O_CLOEXEC).map_err(io::Error::from);
    Ok(Pipes {
        go: p()?,
        status: p()?,
        stdin: p()?,
        stdout: p()?,
        stderr: p()?,
    })
}

fn write_id_maps(pid: Pid, spec: &JailSpec) -> io::Result<()> {
    let base = format!("/proc/{}", pid.as_raw());
    // Deny setgroups before the gid map: the jail must never regain groups.
    fs::write(format!("{base}/setgroups"), "deny")?;
    fs::write(
        format!("{base}/uid_map"),
        format!("{JAIL_UID} {} 1\n", spec.sandbox_uid),
    )?;
    fs::write(
        format!("{base}/gid_map"),
        format!("{JAIL_GID} {} 1\n", spec.sandbox_gid),
    )?;
    Ok(())
}

fn supervise(
    spec: &JailSpec,
    filter: &pycell_seccomp::CompiledFilter,
    layout: &CgroupLayout,
    cgroup_slot: &mut Option<SandboxCgroup>,
    sink: &mut dyn OutputSink,
) -> Result<JailReport, JailFailure> {
    let io_fail = |what: &str| {
        let what = what.to_string();
        move |e: io::Error| JailFailure::new("jailer_io", "jailer", format!("{what}: {e}"), None)
    };
    // The jail inherits our supplementary groups and could never drop them
    // (setgroups is denied inside); clear them here.
    setgroups(&[]).map_err(|e| {
        JailFailure::new(
            "setgroups_failed",
            "user_namespace",
            format!("setgroups([]): {e}"),
            None,
        )
    })?;
    let (child_fds, ends) = pipes().map_err(io_fail("creating pipes"))?.split();
    // Signals for the jailer itself go through a signalfd in the loop below.
    let mut sigs = SigSet::empty();
    for s in [
        Signal::SIGINT,
        Signal::SIGTERM,
        Signal::SIGHUP,
        Signal::SIGCHLD,
    ] {
        sigs.add(s);
    }
    let mut old_mask = SigSet::empty();
    sigprocmask(SigmaskHow::SIG_BLOCK, Some(&sigs), Some(&mut old_mask))
        .map_err(|e| JailFailure::new("jailer_io", "jailer", format!("sigprocmask: {e}"), None))?;
    let sfd = SignalFd::with_flags(&sigs, SfdFlags::SFD_CLOEXEC | SfdFlags::SFD_NONBLOCK)
        .map_err(|e| JailFailure::new("jailer_io", "jailer", format!("signalfd: {e}"), None))?;

    let ns = libc::CLONE_NEWUSER
        | libc::CLONE_NEWPID
        | libc::CLONE_NEWNS
        | libc::CLONE_NEWNET
        | libc::CLONE_NEWIPC
        | libc::CLONE_NEWUTS;
    // On cgroup v2 the cgroup is made first and the jail is born inside it
    // (CLONE_INTO_CGROUP), which spares the cgroup.procs write and the
    // global lock it takes. On v1 the cgroup is built while the child builds
    // its root, and the child is attached then.
    let born_inside = if layout.version() == crate::cgroup::CgroupVersion::V2 {
        let cg = create_cgroup(spec, layout)?;
        let dir = cg.open_v2_dir();
        *cgroup_slot = Some(cg);
        dir
    } else {
        None
    };
    let start = Instant::now();
    // clone3 may be missing (old kernels) or filtered to ENOSYS (container
    // seccomp profiles): then attach after the clone, as on v1.
    let (cloned, born_in_cgroup) = match &born_inside {
        Some(dir) => match syscall::clone_into_cgroup(ns, dir.as_fd()) {
            Err(e) if e.raw_os_error() == Some(libc::ENOSYS) => (syscall::clone_fork(ns), false),
            other => (other, true),
        },
        None => (syscall::clone_fork(ns), false),
    };
    let pid = match cloned {
        Ok(CloneResult::Child) => {
            drop((sfd, ends));
            let _ = sigprocmask(SigmaskHow::SIG_SETMASK, Some(&old_mask), None);
            child_main(spec, filter, child_fds)
        }
        Ok(CloneResult::Parent(pid)) => pid,
        Err(e) => {
            return Err(JailFailure::new(
                "namespaces_unavailable",
                "namespaces",
                format!("clone(CLONE_NEWUSER|NEWPID|NEWNS|NEWNET|NEWIPC|NEWUTS): {e}"),
                Some("pycell needs unprivileged-capable user namespaces (kernel.unprivileged_userns_clone / user.max_user_namespaces > 0) and pid/net/mount namespaces"),
            ))
        }
    };
    drop(child_fds);
    let mut go = File::from(ends.go_write);
    // Maps first; the child builds its root while we build its cgroup.
    let setup = write_id_maps(pid, spec)
        .map_err(|e| {
            JailFailure::new(
                "user_namespace_failed",
                "user_namespace",
                format!("writing uid/gid maps: {e}"),
                None,
            )
        })
        .and_then(|()| {
            go.write_all(&[GO_MAPS])
                .map_err(io_fail("starting the jail"))
        })
        .and_then(|()| {
            if born_in_cgroup {
                return Ok(());
            }
            if let Some(cg) = cgroup_slot.as_ref() {
                return cg.attach(pid).map_err(|e| {
                    JailFailure::new("cgroup_unavailable", "cgroup", e.to_string(), None)
                });
            }
            let cg = create_cgroup(spec, layout)?;
            let attached = cg
                .attach(pid)
                .map_err(|e| JailFailure::new("cgroup_unavailable", "cgroup", e.to_string(), None));
            *cgroup_slot = Some(cg);
            attached
        })
        .and_then(|()| {
            go.write_all(&[GO_CGROUP])
                .map_err(io_fail("starting the jail"))
        });
    drop(go);
    if let Err(f) = setup {
        let _ = kill(pid, Signal::SIGKILL);
        let _ = waitpid(pid, None);
        return Err(f);
    }
    let cgroup = cgroup_slot.as_ref().expect("cgroup attached above");

    let mut relay = Relay::new(
        spec,
        ends.stdin_write,
        ends.stdout_read,
        ends.stderr_read,
        ends.status_read,
    );
    let deadline = start + Duration::from_millis(spec.limits.wall_timeout_ms);
    let mut timed_out = false;
    let mut cancelled = false;
    let mut init_status: Option<WaitStatus> = None;
    while relay.open() {
        let now = Instant::now();
        if !timed_out && now >= deadline {
            timed_out = true;
            let _ = kill(pid, Signal::SIGKILL);
            cgroup.kill_all();
        }
        let wait = if timed_out {
            PollTimeout::from(100u16)
        } else {
            PollTimeout::try_from(deadline - now).unwrap_or(PollTimeout::MAX)
        };
        let signal = relay
            .poll_once(sink, sfd.as_fd(), wait)
            .map_err(io_fail("relaying output"))?;
        if signal {
            while let Ok(Some(info)) = sfd.read_signal() {
                let sig = info.ssi_signo as i32;
                if sig == Signal::SIGCHLD as i32 {
                    continue;
                }
                if sig == Signal::SIGINT as i32 {
                    // Interactive ^C: let the program see it.
                    let _ = kill(pid, Signal::SIGINT);
                } else {
                    cancelled = true;
                    let _ = kill(pid, Signal::SIGKILL);
                    cgroup.kill_all();
                }
            }
        }
        if init_status.is_none() && relay.status_closed() {
            // init closed its status pipe: it has exited (or is exiting).
            init_status = waitpid(pid, None).ok();
            relay.start_drain();
        }
    }
    if init_status.is_none() {
        init_status = waitpid(pid, None).ok();
    }
    let wall = start.elapsed();
    cgroup.kill_all();
    let usage = cgroup.usage();

    let messages = relay.messages();
    let mut landlock = None;
    let mut ended: Option<&ChildMessage> = None;
    for m in &messages {
        match m {
            ChildMessage::Ready { landlock: l } => landlock = Some(l.clone()),
            ChildMessage::SetupFailed(e) => {
                let mut f = JailFailure::new(&e.code, e.step.layer(), e.message.clone(), None);
                f.hint = e.hint.clone();
                return Err(f);
            }
            _ => ended = Some(m),
        }
    }
    let Some(landlock) = landlock else {
        return Err(JailFailure::new(
            "jail_setup_failed",
            "jailer",
            format!("the jail ended before reporting ready (init: {init_status:?})"),
            None,
        ));
    };
    let (exit_code, signal) = match ended {
        Some(ChildMessage::Exited { code }) => (Some(*code), None),
        Some(ChildMessage::Signaled { signal }) => (None, Some(*signal)),
        _ => (None, Some(Signal::SIGKILL as i32)),
    };
    let mut error = None;
    let status = if timed_out {
        error = Some(JailFailure::new(
            "timeout",
            "limits",
            format!(
                "wall-clock timeout of {:.1}s expired; the sandbox was killed",
                spec.limits.wall_timeout_ms as f64 / 1000.0
            ),
            Some("raise --timeout, or make the code faster"),
        ));
        RunStatus::Timeout
    } else if cancelled {
        RunStatus::Killed
    } else if usage.oom_kills > 0 && signal == Some(Signal::SIGKILL as i32) {
        error = Some(JailFailure::new(
            "oom",
            "limits",
            format!(
                "the memory limit of {} bytes was reached; the kernel killed the program",
                spec.limits.memory_bytes
            ),
            Some("raise --memory, or use less memory"),
        ));
        RunStatus::Oom
    } else if let Some(ChildMessage::ExecFailed { message }) = ended {
        return Err(JailFailure::new(
            "exec_failed",
            "exec",
            message.clone(),
            Some("check the policy's interpreter path"),
        ));
    } else if signal == Some(Signal::SIGXCPU as i32) {
        error = Some(JailFailure::new(
            "cpu_time_limit",
            "limits",
            format!(
                "the CPU time limit of {}s was reached",
                spec.limits.cpu_time_s
            ),
            None,
        ));
        RunStatus::Killed
    } else if exit_code == Some(0) {
        RunStatus::Ok
    } else {
        RunStatus::Error
    };
    Ok(JailReport {
        status,
        exit_code,
        signal,
        stdout_truncated: relay.truncated[0],
        stderr_truncated: relay.truncated[1],
        wall_ms: wall.as_secs_f64() * 1000.0,
        cpu_ms: usage.cpu_ns as f64 / 1e6,
        peak_memory_bytes: usage.peak_memory_bytes,
        layers: Some(Layers {
            namespaces: NAMESPACES.iter().map(|s| s.to_string()).collect(),
            sandbox_uid: spec.sandbox_uid,
            landlock,
            seccomp: SeccompReport {
                profile: spec.seccomp_profile.clone(),
                instructions: filter.instruction_count(),
            },
            cgroup: CgroupReport {
                version: cgroup.version(),
                name: cgroup.name().to_string(),
            },
            no_new_privs: true,
            capabilities: "none".to_string(),
        }),
        error,
    })
}

/// Moves bytes between the jail's pipes and the event stream.
struct Relay {
    stdin: Option<File>,
    stdin_data: Vec<u8>,
    stdin_pos: usize,
    outs: [Option<File>; 2],
    status: Option<File>,
    status_buf: Vec<u8>,
    sent: [u64; 2],
    cap: u64,
    truncated: [bool; 2],
    drain_deadline: Option<Instant>,
}

impl Relay {
    fn new(
        spec: &JailSpec,
        stdin: OwnedFd,
        stdout: OwnedFd,
        stderr: OwnedFd,
        status: OwnedFd,
    ) -> Relay {
        let stdin = if spec.stdin.is_empty() {
            None
        } else {
            let _ = nix::fcntl::fcntl(&stdin, nix::fcntl::FcntlArg::F_SETFL(OFlag::O_NONBLOCK));
            Some(File::from(stdin))
        };
        Relay {
            stdin,
            stdin_data: spec.stdin.clone(),
            stdin_pos: 0,
            outs: [Some(File::from(stdout)), Some(File::from(stderr))],
            status: Some(File::from(status)),
            status_buf: Vec::new(),
            sent: [0, 0],
            cap: spec.limits.max_output_bytes,
            truncated: [false, false],
            drain_deadline: None,
        }
    }

    fn open(&self) -> bool {
        if let Some(d) = self.drain_deadline {
            if Instant::now() >= d {
                return false;
            }
        }
        self.outs.iter().any(Option::is_some) || self.status.is_some()
    }

    fn status_closed(&self) -> bool {
        self.status.is_none()
    }

    /// After init is gone the namespace is being torn down; whatever still
    /// holds the output pipes dies with it, so EOF comes soon. Bound it anyway.
    fn start_drain(&mut self) {
        self.drain_deadline = Some(Instant::now() + Duration::from_secs(2));
        self.stdin = None;
    }

    /// One poll round. Returns true if the signalfd is readable.
    fn poll_once(
        &mut self,
        out: &mut dyn OutputSink,
        sfd: BorrowedFd<'_>,
        wait: PollTimeout,
    ) -> io::Result<bool> {
        let mut fds: Vec<PollFd<'_>> = Vec::with_capacity(5);
        let mut which: Vec<u8> = Vec::with_capacity(5);
        fds.push(PollFd::new(sfd, PollFlags::POLLIN));
        which.push(b's');
        if let Some(f) = &self.status {
            fds.push(PollFd::new(f.as_fd(), PollFlags::POLLIN));
            which.push(b'c');
        }
        for (i, o) in self.outs.iter().enumerate() {
            if let Some(f) = o {
                fds.push(PollFd::new(f.as_fd(), PollFlags::POLLIN));
                which.push(b'0' + i as u8);
            }
        }
        if let Some(f) = &self.stdin {
            fds.push(PollFd::new(f.as_fd(), PollFlags::POLLOUT));
            which.push(b'i');
        }
        let wait = match self.drain_deadline {
            Some(_) => PollTimeout::from(50u16),
            None => wait,
        };
        match poll(&mut fds, wait) {
            Ok(_) => {}
            Err(nix::errno::Errno::EINTR) => return Ok(false),
            Err(e) => return Err(e.into()),
        }
        let ready: Vec<(u8, PollFlags)> = fds
            .iter()
            .zip(&which)
            .map(|(f, w)| (*w, f.revents().unwrap_or(PollFlags::empty())))
            .collect();
        drop(fds);
        let mut signal = false;
        for (w, rev) in ready {
            if rev.is_empty() {
                continue;
            }
            match w {
                b's' => signal = true,
                b'c' => self.read_status(),
                b'0' | b'1' => self.read_output(usize::from(w - b'0'), out)?,
                b'i' => self.write_stdin(),
                _ => {}
            }
        }
        Ok(signal)
    }

    fn read_status(&mut self) {
        let mut buf = [0u8; 4096];
        let Some(f) = self.status.as_mut() else {
            return;
        };
        match f.read(&mut buf) {
            Ok(0) | Err(_) => self.status = None,
            Ok(n) => self.status_buf.extend_from_slice(&buf[..n]),
        }
    }

    fn read_output(&mut self, i: usize, out: &mut dyn OutputSink) -> io::Result<()> {
        let mut buf = vec![0u8; CHUNK];
        let Some(f) = self.outs[i].as_mut() else {
            return Ok(());
        };
        let n = match f.read(&mut buf) {
            Ok(0) | Err(_) => {
                self.outs[i] = None;
                return Ok(());
            }
            Ok(n) => n,
        };
        let room = self.cap.saturating_sub(self.sent[i]) as usize;
        if n > room {
            self.truncated[i] = true;
        }
        let take = n.min(room);
        if take > 0 {
            self.sent[i] += take as u64;
            let stream = if i == 0 {
                OutputStream::Stdout
            } else {
                OutputStream::Stderr
            };
            out.output(stream, &buf[..take])?;
        }
        // Past the cap we keep reading and discarding, so the program is not
        // blocked on a full pipe; the timeout bounds how long that goes on.
        Ok(())
    }

    fn write_stdin(&mut self) {
        let Some(f) = self.stdin.as_mut() else { return };
        match f.write(&self.stdin_data[self.stdin_pos..]) {
            Ok(n) => {
                self.stdin_pos += n;
                if self.stdin_pos >= self.stdin_data.len() {
                    self.stdin = None;
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(_) => self.stdin = None,
        }
    }

    fn messages(&self) -> Vec<ChildMessage> {
        self.status_buf
            .split(|b| *b == b'\n')
            .filter(|l| !l.is_empty())
            .filter_map(|l| serde_json::from_slice(l).ok())
            .collect()
    }
}
