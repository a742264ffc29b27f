//! The sandbox's first process (pid 1 of the new pid namespace): runs the
//! pipeline steps, then stays as a minimal init that forks the program,
//! forwards signals to it, reaps every zombie, and reports how the program
//! ended. When the program ends, init exits and the kernel kills whatever is
//! left in the pid namespace.
//!
//! Everything here runs in a forked copy of the single-threaded jailer.

use std::ffi::CString;
use std::fs::File;
use std::io::Write;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::path::PathBuf;

use nix::fcntl::OFlag;
use nix::sched::{unshare, CloneFlags};
use nix::sys::signal::{kill, sigprocmask, SigSet, SigmaskHow, Signal};
use nix::sys::signalfd::SignalFd;
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::{execve, sethostname, setresgid, setresuid, setsid, Gid, Pid, Uid};
use pycell_seccomp::{CompiledFilter, KernelGap};

use crate::setup::landlock_rules::{self, Grants};
use crate::setup::mounts::{self, PreparedSources, RootfsLayout};
use crate::setup::pipeline::{run_steps, JailSteps, Step, StepError};
use crate::setup::preflight::Checked;
use crate::setup::sources::SourceId;
use crate::setup::status::{ChildMessage, GO_CGROUP, GO_MAPS};
use crate::setup::xattr_check;
use pycell_syscall::{self as syscall, CloneResult};
use pycell_wire::codes::FailureCode;
use pycell_wire::handout::{self, Handout};
use pycell_wire::report::LandlockReport;
use pycell_wire::spec::{
    JailSpec, NetworkSpec, JAIL_GID, JAIL_UID, TOOLS_FD_VAR, WORKSPACE, ZYGOTE_FD_ENV,
    ZYGOTE_LIB_ENV,
};

pub(crate) const HOSTNAME: &str = "pycell";
/// Signals init forwards to the program. SIGCHLD is init's own.
const FORWARDED: &[Signal] = &[
    Signal::SIGINT,
    Signal::SIGTERM,
    Signal::SIGHUP,
    Signal::SIGQUIT,
    Signal::SIGUSR1,
    Signal::SIGUSR2,
];

/// The descriptors the child starts with (all from the jailer's pipes).
#[derive(Debug)]
pub(crate) struct ChildFds {
    pub go_read: OwnedFd,
    pub status_write: OwnedFd,
    pub stdin_read: OwnedFd,
    /// With egress: the jailer's stdin socket, on which the jail sends the
    /// proxy's listener once it has made it on its loopback.
    pub handout_channel: Option<OwnedFd>,
    /// The jailer's end of it takes a descriptor of /workspace, which keeps
    /// the run's disk for measuring after the jail is gone.
    pub disk_channel: Option<OwnedFd>,
    pub stdout_write: OwnedFd,
    pub stderr_write: OwnedFd,
    /// On v1: the run cgroup's `tasks` files, through which the jail moves
    /// itself in (step 6).
    pub cgroup_tasks: Vec<OwnedFd>,
    /// A zygote: its library, a sealed memfd.
    pub zygote_lib: Option<OwnedFd>,
    /// A cold run's compiled runner, opened by the jailer (copied into
    /// the jail's root).
    pub runner_pyc: Option<OwnedFd>,
    /// The caller's grants, idmapped (`crate::setup::grants`).
    pub grants: Vec<crate::setup::grants::GrantedTree>,
}

/// Which jail this process sets up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum JailKind {
    /// Cloned by the jailer; execs its program.
    Run,
    /// A zygote, cloned by the jailer: its program (python on the runner,
    /// warm) forks runs. It keeps CAP_SETUID/CAP_SETGID in its own user
    /// namespace (its children take their slot's ids) and has no Landlock
    /// (which forbids mounting to every process under it), no seccomp
    /// (its children's filters would stack on it) and a whole /proc.
    Zygote,
    /// Forked from a zygote (`crate::zygote`): the same steps; its program
    /// is a fork of the zygote's, which goes on in python.
    FromZygote,
}

impl JailKind {
    pub fn of(spec: &JailSpec) -> JailKind {
        match (&spec.zygote, &spec.from_zygote) {
            (Some(_), _) => JailKind::Zygote,
            (None, Some(_)) => JailKind::FromZygote,
            (None, None) => JailKind::Run,
        }
    }
}

struct RealSteps<'a> {
    kind: JailKind,
    spec: &'a JailSpec,
    filter: &'a CompiledFilter,
    source_ids: &'a [SourceId],
    go_read: Option<OwnedFd>,
    cgroup_tasks: Vec<OwnedFd>,
    handout_channel: Option<OwnedFd>,
    disk_channel: Option<OwnedFd>,
    status: &'a File,
    signal_fd: Option<SignalFd>,
    /// Code mode: the program's end of the tool channel.
    tool_end: Option<OwnedFd>,
    /// A server over stdio: the program's stdin and stdout.
    stdio_end: Option<OwnedFd>,
    /// A zygote: its end of the channel its fork requests come on, and its
    /// library.
    zygote_end: Option<OwnedFd>,
    zygote_lib: Option<OwnedFd>,
    runner_pyc: Option<OwnedFd>,
    sources: Option<PreparedSources>,
    grants: Vec<crate::setup::grants::GrantedTree>,
    landlock: Option<LandlockReport>,
    xattr_writes_refused: bool,
}

pub(crate) fn send(status: &File, msg: &ChildMessage) {
    if let Ok(mut line) = serde_json::to_vec(msg) {
        line.push(b'\n');
        let _ = (&*status).write_all(&line);
    }
}

fn io_step(step: Step) -> impl Fn(std::io::Error) -> StepError {
    move |e| StepError::new(step, e.to_string())
}

fn nix_step(step: Step, what: &'static str) -> impl Fn(nix::Error) -> StepError {
    move |e| StepError::new(step, format!("{what}: {e}"))
}

impl JailSteps for RealSteps<'_> {
    fn finished(&mut self, step: Step) {
        if let Ok(serde_json::Value::String(name)) = serde_json::to_value(step) {
            crate::timings::mark(&format!("jail: {name}"));
        }
    }

    fn wait_for_id_maps(&mut self) -> Result<(), StepError> {
        self.wait_for(GO_MAPS, Step::WaitForParent)
    }

    fn configure_namespaces(&mut self) -> Result<(), StepError> {
        let step = |e: std::io::Error| StepError::new(Step::NamespaceSettings, e.to_string());
        crate::setup::ns_settings::new_time_namespace()
            .map_err(step)
            .map_err(|e| {
                e.with_hint("pycell gives every run its own time namespace: it needs Linux 5.6+ built with CONFIG_TIME_NS")
            })
    }

    fn wait_for_cgroup(&mut self) -> Result<(), StepError> {
        // On v1 we move ourselves in (one thread: no global lock); then the
        // jailer says it is done with its part (on v2 we were born inside).
        let tasks = std::mem::take(&mut self.cgroup_tasks);
        pycell_host::cgroup::sandbox::join_v1(&tasks).map_err(|e| {
            StepError::new(Step::CgroupAttach, format!("joining the run's cgroup: {e}"))
        })?;
        drop(tasks);
        if self.kind == JailKind::FromZygote {
            send(self.status, &ChildMessage::Joined);
        }
        let r = self.wait_for(GO_CGROUP, Step::CgroupAttach);
        // A run from a zygote is not the jailer's child: its init watches
        // the go pipe (EOF: the jailer is gone) instead of a death signal.
        if self.kind != JailKind::FromZygote {
            self.go_read = None;
        }
        r
    }

    fn enter_cgroup_namespace(&mut self) -> Result<(), StepError> {
        // Now that the jailer has moved us into the run's cgroup, a new cgroup
        // namespace makes that cgroup the root of what the code can see.
        unshare(CloneFlags::CLONE_NEWCGROUP)
            .map_err(nix_step(Step::CgroupNamespace, "unshare(CLONE_NEWCGROUP)"))
    }

    fn prepare_mount_sources(&mut self) -> Result<(), StepError> {
        let from = match self.kind {
            JailKind::FromZygote => mounts::SourcesIn::ZygoteRoot,
            _ => mounts::SourcesIn::Host(self.source_ids),
        };
        let fail = |e: mounts::MountError| StepError::new(Step::MountSources, e.to_string());
        let mut s = mounts::prepare_sources(&self.spec.mounts, from).map_err(fail)?;
        for granted in std::mem::take(&mut self.grants) {
            s.add_granted(granted);
        }
        self.sources = Some(s);
        Ok(())
    }

    fn become_jail_user(&mut self) -> Result<(), StepError> {
        // Host uid 0 is not mapped in this namespace, so switching away from
        // it keeps the namespace capabilities we still need for mounting;
        // they are dropped for good in `drop_capabilities`.
        // A zygote is its namespace's root (mapped to its own host uid).
        let (g, u) = match self.kind {
            JailKind::Zygote => (Gid::from_raw(0), Uid::from_raw(0)),
            _ => (Gid::from_raw(JAIL_GID), Uid::from_raw(JAIL_UID)),
        };
        setresgid(g, g, g).map_err(nix_step(Step::Credentials, "setresgid"))?;
        setresuid(u, u, u).map_err(nix_step(Step::Credentials, "setresuid"))?;
        if self.kind == JailKind::FromZygote {
            // Our ids did not change (they were the jail's already), so
            // the kernel did not make us not dumpable as it does a cloned
            // jail's init here: do it, so that the program, the same uid,
            // cannot reach init's memory.
            return nix::sys::prctl::set_dumpable(false)
                .map_err(nix_step(Step::Credentials, "prctl(PR_SET_DUMPABLE)"));
        }
        // The kernel clears the parent-death signal on a credential change:
        // arm it again. Had the jailer died in between, the go pipe is at EOF
        // and the wait for the cgroup, next, ends this process.
        nix::sys::prctl::set_pdeathsig(Signal::SIGKILL)
            .map_err(nix_step(Step::Credentials, "prctl(PR_SET_PDEATHSIG)"))
    }

    fn build_root_and_pivot(&mut self) -> Result<(), StepError> {
        let sources = self
            .sources
            .take()
            .expect("sources prepared before the root");
        let l = &self.spec.limits;
        let layout = RootfsLayout {
            disk_size: l.disk.get(),
            files: &self.spec.files,
            hostname: HOSTNAME,
            cover_proc: self.kind != JailKind::Zygote,
            user_limits: crate::setup::ns_settings::user_limits(l),
            runner_pyc: self.runner_pyc.take().map(File::from),
        };
        mounts::build_root(sources, &layout).map_err(|e| {
            let step = StepError::new(Step::Rootfs, e.to_string());
            match e.hint() {
                Some(h) => step.with_hint(h),
                None => step,
            }
        })?;
        mounts::pivot().map_err(|e| StepError::new(Step::Rootfs, e.to_string()))?;
        self.hand_disk_to_jailer()
    }

    fn set_hostname(&mut self) -> Result<(), StepError> {
        sethostname(HOSTNAME).map_err(nix_step(Step::Hostname, "sethostname"))
    }

    fn bring_up_loopback(&mut self) -> Result<(), StepError> {
        syscall::interface_up("lo")
            .map_err(|e| StepError::new(Step::Loopback, format!("bringing up lo: {e}")))?;
        self.hand_out_workspace()?;
        self.hand_out_stdio()?;
        self.hand_out_tool_channel()?;
        self.hand_out_zygote_channel()?;
        self.hand_out_proxy_listener()
    }

    fn new_session(&mut self) -> Result<(), StepError> {
        setsid()
            .map(|_| ())
            .map_err(nix_step(Step::Setsid, "setsid"))
    }

    fn drop_capabilities(&mut self) -> Result<(), StepError> {
        let dropped = match self.kind {
            JailKind::Zygote => crate::setup::capabilities::keep_only_setid(),
            _ => crate::setup::capabilities::drop_all(),
        };
        dropped.map_err(|e| StepError::new(Step::Capabilities, e.to_string()))
    }

    fn set_no_new_privs(&mut self) -> Result<(), StepError> {
        nix::sys::prctl::set_no_new_privs()
            .map_err(nix_step(Step::NoNewPrivs, "prctl(PR_SET_NO_NEW_PRIVS)"))
    }

    fn close_inherited_fds(&mut self) -> Result<(), StepError> {
        // init keeps its status pipe and its signalfd (both close-on-exec, so
        // the program never sees them); everything else beyond 0/1/2 goes.
        let mask = forwarded_and_child_mask();
        sigprocmask(SigmaskHow::SIG_BLOCK, Some(&mask), None)
            .map_err(nix_step(Step::CloseFds, "sigprocmask"))?;
        let sfd = SignalFd::with_flags(&mask, nix::sys::signalfd::SfdFlags::SFD_CLOEXEC)
            .map_err(nix_step(Step::CloseFds, "signalfd"))?;
        let mut keep = vec![self.status.as_raw_fd(), sfd.as_fd().as_raw_fd()];
        keep.extend(self.tool_end.as_ref().map(AsRawFd::as_raw_fd));
        keep.extend(self.stdio_end.as_ref().map(AsRawFd::as_raw_fd));
        keep.extend(self.zygote_end.as_ref().map(AsRawFd::as_raw_fd));
        keep.extend(self.zygote_lib.as_ref().map(AsRawFd::as_raw_fd));
        keep.extend(self.go_read.as_ref().map(AsRawFd::as_raw_fd));
        keep.extend(self.disk_channel.as_ref().map(AsRawFd::as_raw_fd));
        self.signal_fd = Some(sfd);
        syscall::close_fds_except(&keep).map_err(io_step(Step::CloseFds))
    }

    fn apply_landlock(&mut self) -> Result<(), StepError> {
        if self.kind == JailKind::Zygote {
            return Ok(());
        }
        let targets: Vec<PathBuf> = mounts::tree_targets(&self.spec.mounts);
        let mut grants = Grants::for_jail(&self.spec.landlock, &targets, self.spec.network);
        grants.add_granted(&self.spec.grants);
        if self.spec.runner_pyc.is_some() {
            // The compiled runner python starts on: read, like /etc.
            let pyc = PathBuf::from(pycell_wire::spec::RUNNER_PYC);
            grants.read_only.push(pyc);
        }
        let report =
            landlock_rules::restrict(self.spec.landlock.min_abi, &grants).map_err(|e| {
                let code = match e {
                    landlock_rules::LandlockError::Unavailable(_) => {
                        FailureCode::LandlockUnavailable
                    }
                    landlock_rules::LandlockError::AbiTooOld { .. } => {
                        FailureCode::LandlockAbiTooOld
                    }
                    _ => FailureCode::LandlockFailed,
                };
                StepError::new(Step::Landlock, e.to_string()).with_code(code)
            })?;
        self.landlock = Some(report);
        Ok(())
    }

    fn apply_seccomp(&mut self) -> Result<(), StepError> {
        // The channel to the jailer closes here, whatever happens.
        let channel = self.disk_channel.take();
        if self.kind == JailKind::Zygote {
            return Ok(());
        }
        // Asked now: with no capabilities left, as the program will be,
        // and before the filter could hide the kernel's own answer.
        self.xattr_writes_refused = !xattr_check::kernel_refuses_in(WORKSPACE);
        let refused;
        let filter = if self.xattr_writes_refused {
            refused = self.filter.with_refused(KernelGap::SecurityXattrs);
            &refused
        } else {
            self.filter
        };
        match channel {
            Some(channel) => apply_seccomp_telling(filter, channel.as_fd()),
            None => pycell_seccomp::apply(filter)
                .map_err(|e| StepError::new(Step::Seccomp, e.to_string())),
        }
    }
}

/// Install `filter` so that the calls it refuses with `EPERM` are told
/// to the jailer: with a listener, sent to the jailer on `channel` (see
/// `crate::run::seccomp_watch`). On a kernel without listeners, the
/// filter alone (its refusals are then not counted).
fn apply_seccomp_telling(
    filter: &CompiledFilter,
    channel: BorrowedFd<'_>,
) -> Result<(), StepError> {
    let failed =
        |what: &str, e: std::io::Error| StepError::new(Step::Seccomp, format!("{what}: {e}"));
    match nix::sys::prctl::get_no_new_privs() {
        Ok(true) => {}
        _ => return Err(StepError::new(Step::Seccomp, "no_new_privs is not set")),
    }
    match syscall::seccomp_filter_with_listener(&filter.notifying().kernel_program()) {
        Ok(listener) => handout::send(channel, Handout::SeccompListener, listener.as_fd())
            .map_err(|e| failed("handing the seccomp listener to the jailer", e)),
        // EINVAL: a kernel without listeners; EBUSY: one already listens
        // on a filter pycelld runs under (a container manager's). The
        // filter alone then: refusals are not counted.
        Err(e) if matches!(e.raw_os_error(), Some(libc::EINVAL | libc::EBUSY)) => {
            pycell_seccomp::apply(filter).map_err(|e| StepError::new(Step::Seccomp, e.to_string()))
        }
        Err(e) => Err(failed("installing the seccomp filter with a listener", e)),
    }
}

impl RealSteps<'_> {
    /// Send the jailer a descriptor of /workspace (the run's one writable
    /// tmpfs); our end of the channel stays open for the seccomp
    /// listener (see `apply_seccomp`).
    fn hand_disk_to_jailer(&mut self) -> Result<(), StepError> {
        let Some(channel) = self.disk_channel.as_ref() else {
            return Ok(());
        };
        hand_out_workspace_on(channel.as_fd(), OFlag::O_PATH).map_err(|e| {
            StepError::new(
                Step::Rootfs,
                format!("handing /workspace to the jailer: {e}"),
            )
        })
    }

    /// For a spec that exports its workspace (the install jail): hand a
    /// descriptor of /workspace out on the jailer's stdin socket. It keeps the tmpfs alive after the jail has
    /// ended, so whoever launched the jail can copy out what it built
    /// (with its own credentials, never following a symlink).
    fn hand_out_workspace(&mut self) -> Result<(), StepError> {
        let (true, Some(channel)) = (self.spec.export_workspace, self.handout_channel.as_ref())
        else {
            return Ok(());
        };
        hand_out_workspace_on(channel.as_fd(), OFlag::O_RDONLY)
            .map_err(|e| StepError::new(Step::Loopback, format!("handing out /workspace: {e}")))
    }

    /// Code mode: the tool channel (the launcher serves the program's tool
    /// calls on its end).
    fn hand_out_tool_channel(&mut self) -> Result<(), StepError> {
        if self.spec.tools {
            self.tool_end = self.hand_out_stream_pair(Handout::ToolChannel, "the tool channel")?;
        }
        Ok(())
    }

    /// A server over stdio: the socket of its stdin and stdout (its
    /// launcher relays the client's bytes on its end).
    fn hand_out_stdio(&mut self) -> Result<(), StepError> {
        if self.spec.stdio_socket {
            self.stdio_end = self.hand_out_stream_pair(Handout::Stdio, "the stdio socket")?;
        }
        Ok(())
    }

    /// A stream socketpair: one end handed out as `what` on the jailer's
    /// stdin socket, the other returned for the program (both
    /// close-on-exec until then). None without a handout channel.
    fn hand_out_stream_pair(
        &self,
        what: Handout,
        name: &str,
    ) -> Result<Option<OwnedFd>, StepError> {
        let Some(channel) = self.handout_channel.as_ref() else {
            return Ok(None);
        };
        let fail = |e: std::io::Error| StepError::new(Step::Loopback, format!("{name}: {e}"));
        let (ours, launchers) = std::os::unix::net::UnixStream::pair().map_err(fail)?;
        handout::send(channel.as_fd(), what, launchers.as_fd()).map_err(fail)?;
        Ok(Some(ours.into()))
    }

    /// A zygote: a seqpacket socketpair, one end handed out on the
    /// jailer's stdin socket (the launcher's runs send their fork requests
    /// on it), the other kept for the program (`PYCELL_ZYGOTE_FD`).
    fn hand_out_zygote_channel(&mut self) -> Result<(), StepError> {
        let (JailKind::Zygote, Some(channel)) = (self.kind, self.handout_channel.as_ref()) else {
            return Ok(());
        };
        let fail =
            |e: nix::Error| StepError::new(Step::Loopback, format!("the zygote's channel: {e}"));
        use nix::sys::socket::{socketpair, AddressFamily, SockFlag, SockType};
        let (ours, launchers) = socketpair(
            AddressFamily::Unix,
            SockType::SeqPacket,
            None,
            SockFlag::SOCK_CLOEXEC,
        )
        .map_err(fail)?;
        handout::send(channel.as_fd(), Handout::ZygoteChannel, launchers.as_fd())
            .map_err(|e| StepError::new(Step::Loopback, format!("the zygote's channel: {e}")))?;
        self.zygote_end = Some(ours);
        Ok(())
    }

    /// With egress: listen on 127.0.0.1:PORT of the jail's loopback and hand
    /// the listener out on the jailer's stdin socket; keep no copy (the
    /// program never sees it, and nothing can listen there again).
    fn hand_out_proxy_listener(&mut self) -> Result<(), StepError> {
        let (NetworkSpec::Proxy { port }, Some(channel)) =
            (self.spec.network, self.handout_channel.take())
        else {
            return Ok(());
        };
        let fail = |what: &str, e: std::io::Error| {
            StepError::new(
                Step::Loopback,
                format!("the egress proxy's listener on 127.0.0.1:{port}: {what}: {e}"),
            )
        };
        let listener = std::net::TcpListener::bind((std::net::Ipv4Addr::LOCALHOST, port))
            .map_err(|e| fail("bind", e))?;
        handout::send(channel.as_fd(), Handout::EgressListener, listener.as_fd())
            .map_err(|e| fail("handing it out on the jailer's stdin (a unix socket?)", e))
    }

    /// Block until the jailer sends `expected` on the go pipe. EOF or any
    /// other byte means the jailer died or gave up: stop here.
    fn wait_for(&mut self, expected: u8, step: Step) -> Result<(), StepError> {
        let fd = self
            .go_read
            .as_ref()
            .expect("go pipe open until the cgroup step");
        let mut byte = [0u8; 1];
        match nix::unistd::read(fd, &mut byte) {
            Ok(1) if byte[0] == expected => Ok(()),
            Ok(_) => Err(StepError::new(
                step,
                "the jailer went away before the jail was set up",
            )),
            Err(e) => Err(StepError::new(step, e.to_string())),
        }
    }
}

/// Open /workspace (`mode`: `O_PATH` or `O_RDONLY`) and send it, with one
/// byte, on the unix socket `channel`.
fn hand_out_workspace_on(channel: BorrowedFd<'_>, mode: OFlag) -> std::io::Result<()> {
    let dir = nix::fcntl::open(
        WORKSPACE,
        mode | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::empty(),
    )?;
    handout::send(channel, Handout::Workspace, dir.as_fd())
}

fn forwarded_and_child_mask() -> SigSet {
    let mut mask = SigSet::empty();
    mask.add(Signal::SIGCHLD);
    for s in FORWARDED {
        mask.add(*s);
    }
    mask
}

/// Entry point of the cloned child. Never returns.
pub(crate) fn child_main(spec: &JailSpec, checked: &Checked, fds: ChildFds) -> ! {
    // The jailer's marks stay the jailer's; ours go out with Ready.
    crate::timings::take();
    crate::timings::mark("jail: cloned");
    // If the jailer dies, so does the jail (pid 1 dying kills the namespace).
    // Set before waiting for the go byte, so there is no window: a jailer that
    // died earlier shows up as EOF on the go pipe.
    if nix::sys::prctl::set_pdeathsig(Signal::SIGKILL).is_err() {
        syscall::exit_now(126);
    }
    hide_host_command_line();
    let jail = set_up(spec, &checked.filter, &checked.sources, fds);
    init(spec, jail)
}

/// A jail set up, every step done and Ready sent: what its init needs.
pub(crate) struct SetUp {
    status: File,
    signal_fd: SignalFd,
    tool_end: Option<OwnedFd>,
    stdio_end: Option<OwnedFd>,
    zygote_end: Option<OwnedFd>,
    zygote_lib: Option<OwnedFd>,
    /// A run from a zygote: the jailer's go pipe, watched for its end.
    go_read: Option<OwnedFd>,
}

/// Take the jail's descriptors, run every step, send Ready. Exits on any
/// failure, after saying why on the status pipe.
pub(crate) fn set_up(
    spec: &JailSpec,
    filter: &CompiledFilter,
    source_ids: &[SourceId],
    fds: ChildFds,
) -> SetUp {
    let status = File::from(fds.status_write);
    let redirected = nix::unistd::dup2_stdin(&fds.stdin_read)
        .and_then(|_| nix::unistd::dup2_stdout(&fds.stdout_write))
        .and_then(|_| nix::unistd::dup2_stderr(&fds.stderr_write));
    if let Err(e) = redirected {
        send(
            &status,
            &ChildMessage::SetupFailed(StepError::new(Step::WaitForParent, format!("dup2: {e}"))),
        );
        syscall::exit_now(126);
    }
    drop((fds.stdin_read, fds.stdout_write, fds.stderr_write));

    let mut steps = RealSteps {
        kind: JailKind::of(spec),
        spec,
        filter,
        source_ids,
        go_read: Some(fds.go_read),
        cgroup_tasks: fds.cgroup_tasks,
        handout_channel: fds.handout_channel,
        disk_channel: fds.disk_channel,
        status: &status,
        signal_fd: None,
        tool_end: None,
        stdio_end: None,
        zygote_end: None,
        zygote_lib: fds.zygote_lib,
        runner_pyc: fds.runner_pyc,
        sources: None,
        grants: fds.grants,
        landlock: None,
        xattr_writes_refused: false,
    };
    if let Err(e) = run_steps(&mut steps) {
        send(&status, &ChildMessage::SetupFailed(e));
        syscall::exit_now(126);
    }
    let signal_fd = steps.signal_fd.take().expect("signalfd created");
    let ready = ChildMessage::Ready {
        landlock: steps.landlock.take(),
        xattr_writes_refused: steps.xattr_writes_refused,
        timings: crate::timings::take(),
    };
    let (tool_end, stdio_end, zygote_end, zygote_lib, go_read) = (
        steps.tool_end.take(),
        steps.stdio_end.take(),
        steps.zygote_end.take(),
        steps.zygote_lib.take(),
        steps.go_read.take(),
    );
    drop(steps);
    send(&status, &ready);
    SetUp {
        status,
        signal_fd,
        tool_end,
        stdio_end,
        zygote_end,
        zygote_lib,
        go_read,
    }
}

/// This process is a fork of the jailer, so its
/// /proc/<pid>/cmdline would show the host command line, paths included, to
/// the code in the jail (cmdline is world-readable). Overwrite our own argv
/// area with "pycell-init" and NULs, and rename the thread likewise.
fn hide_host_command_line() {
    let _ = nix::sys::prctl::set_name(c"pycell-init");
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
        return;
    };
    // Fields after the parenthesised comm; arg_start/arg_end are fields 48/49.
    let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r) else {
        return;
    };
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let (Some(start), Some(end)) = (
        fields.get(48 - 3).and_then(|v| v.parse::<u64>().ok()),
        fields.get(49 - 3).and_then(|v| v.parse::<u64>().ok()),
    ) else {
        return;
    };
    if end <= start || end - start > 1 << 20 {
        return;
    }
    let mut area = vec![0u8; (end - start) as usize];
    let name = b"pycell-init";
    let n = name.len().min(area.len().saturating_sub(1));
    area[..n].copy_from_slice(&name[..n]);
    if let Ok(mem) = std::fs::OpenOptions::new()
        .write(true)
        .open("/proc/self/mem")
    {
        use std::os::unix::fs::FileExt;
        let _ = mem.write_all_at(&area, start);
    }
}

fn cstrings(items: impl IntoIterator<Item = String>) -> Vec<CString> {
    // Spec validation rejects NUL bytes, so this never drops anything.
    items
        .into_iter()
        .filter_map(|s| CString::new(s).ok())
        .collect()
}

/// The program's environment: the spec's, and where its ends of the tool
/// channel and of a zygote's channel are.
fn program_env(spec: &JailSpec, jail: &SetUp) -> Vec<CString> {
    let fd_var = |name: &str, fd: &Option<OwnedFd>| {
        fd.as_ref()
            .map(|fd| (name.to_string(), fd.as_raw_fd().to_string()))
    };
    let tools = fd_var(TOOLS_FD_VAR, &jail.tool_end);
    let zygote = fd_var(ZYGOTE_FD_ENV, &jail.zygote_end);
    let lib = jail.zygote_lib.as_ref().map(|fd| {
        let path = format!("/proc/self/fd/{}", fd.as_raw_fd());
        (ZYGOTE_LIB_ENV.to_string(), path)
    });
    let vars = spec
        .env
        .iter()
        .cloned()
        .chain(tools)
        .chain(zygote)
        .chain(lib);
    cstrings(vars.map(|(k, v)| format!("{k}={v}")))
}

/// A server over stdio: `fd` becomes the program's stdin and stdout (the
/// copies survive exec; the original is close-on-exec).
fn serve_on_stdio(fd: &Option<OwnedFd>) -> nix::Result<()> {
    match fd {
        Some(fd) => nix::unistd::dup2_stdin(fd).and_then(|()| nix::unistd::dup2_stdout(fd)),
        None => Ok(()),
    }
}

/// Let the program's `fd` survive exec.
fn keep_across_exec(fd: &Option<OwnedFd>) {
    if let Some(fd) = fd {
        let _ = nix::fcntl::fcntl(
            fd,
            nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::empty()),
        );
    }
}

fn init(spec: &JailSpec, jail: SetUp) -> ! {
    let argv = cstrings(spec.argv.iter().cloned());
    let env = program_env(spec, &jail);
    let status = &jail.status;
    let main = match syscall::clone_fork(0) {
        Ok(CloneResult::Child) => {
            // The program starts with no blocked signals and every
            // disposition at its default, whoever started pycell (ignored
            // signals survive exec), and keeps its end of the tool channel
            // across exec.
            syscall::default_signal_dispositions();
            let _ = sigprocmask(SigmaskHow::SIG_SETMASK, Some(&SigSet::empty()), None);
            keep_across_exec(&jail.tool_end);
            if let Err(e) = serve_on_stdio(&jail.stdio_end) {
                let message = format!("making the stdio socket stdin and stdout: {e}");
                send(status, &ChildMessage::ExecFailed { message });
                syscall::exit_now(127);
            }
            keep_across_exec(&jail.zygote_end);
            keep_across_exec(&jail.zygote_lib);
            let err = execve(&argv[0], &argv, &env).unwrap_err();
            send(
                status,
                &ChildMessage::ExecFailed {
                    message: format!("execve {}: {err}", spec.argv[0]),
                },
            );
            syscall::exit_now(127);
        }
        Ok(CloneResult::Parent(pid)) => pid,
        Err(e) => fork_failed(status, e),
    };
    // Only the program holds them: its end is the launcher's EOF.
    let SetUp {
        status, signal_fd, ..
    } = jail;
    supervise(main, &status, &signal_fd, None)
}

fn fork_failed(status: &File, e: std::io::Error) -> ! {
    send(
        status,
        &ChildMessage::SetupFailed(StepError::new(Step::Exec, format!("fork: {e}"))),
    );
    syscall::exit_now(126);
}

/// A run from a zygote: fork the program, which returns (in the zygote's
/// python, now this jail's program); init never does.
pub(crate) fn init_returning(jail: SetUp) {
    match syscall::clone_fork(0) {
        Ok(CloneResult::Child) => {
            // The program keeps its stdio and nothing of init's; it is
            // dumpable, as an exec'd program is (its /proc/self its own).
            drop(jail);
            let _ = sigprocmask(SigmaskHow::SIG_SETMASK, Some(&SigSet::empty()), None);
            let _ = nix::sys::prctl::set_dumpable(true);
        }
        Ok(CloneResult::Parent(main)) => {
            let SetUp {
                status,
                signal_fd,
                go_read,
                ..
            } = jail;
            supervise(main, &status, &signal_fd, go_read.as_ref())
        }
        Err(e) => fork_failed(&jail.status, e),
    }
}

/// init's loop: forward signals to the program, reap every zombie, and
/// say how the program ended. With `go`, the jailer's go pipe: its end
/// (the jailer is gone) ends the jail.
fn supervise(main: Pid, status: &File, signal_fd: &SignalFd, go: Option<&OwnedFd>) -> ! {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    loop {
        if let Some(go) = go {
            let mut fds = [
                PollFd::new(signal_fd.as_fd(), PollFlags::POLLIN),
                PollFd::new(go.as_fd(), PollFlags::POLLIN),
            ];
            match poll(&mut fds, PollTimeout::NONE) {
                Err(nix::errno::Errno::EINTR) => continue,
                Err(_) => syscall::exit_now(126),
                Ok(_) => {}
            }
            if fds[1].any().unwrap_or(true) {
                // Nothing more ever comes on it: EOF. Dying kills the pid
                // namespace, the program with it.
                syscall::exit_now(125);
            }
            if !fds[0].any().unwrap_or(false) {
                continue;
            }
        }
        let sig = match signal_fd.read_signal() {
            Ok(Some(info)) => info.ssi_signo as i32,
            Ok(None) => continue,
            Err(nix::errno::Errno::EINTR) => continue,
            Err(_) => syscall::exit_now(126),
        };
        if sig == Signal::SIGCHLD as i32 {
            if let Some(msg) = reap(main) {
                send(status, &msg);
                syscall::exit_now(0);
            }
        } else if let Ok(s) = Signal::try_from(sig) {
            let _ = kill(main, s);
        }
    }
}

/// Reap every exited child; report the main program's end if it was among them.
fn reap(main: Pid) -> Option<ChildMessage> {
    let mut ended = None;
    loop {
        match waitpid(None, Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::Exited(pid, code)) if pid == main => {
                ended = Some(ChildMessage::Exited { code })
            }
            Ok(WaitStatus::Signaled(pid, sig, _)) if pid == main => {
                ended = Some(ChildMessage::Signaled { signal: sig as i32 })
            }
            Ok(WaitStatus::StillAlive) | Err(_) => return ended,
            Ok(_) => {}
        }
    }
}
