//! Runs forked from a zygote: the jailer of such a run sends the zygote
//! one request (the run's spec and descriptors); the zygote (python on
//! pycell's runner, warm, single-threaded, in a jail of its own) forks,
//! and its child, here, becomes the run's jail:
//!
//! ```text
//! zygote (uid 0 of its user namespace; CAP_SETUID/CAP_SETGID only)
//!   └─ fork_run(): clone into new user/pid/mount/net/ipc/uts namespaces,
//!      the zygote writes the child's maps (jail uid 1000 = the slot's id,
//!      ZYGOTE_SLOT_BASE + slot, mapped to the slot's host uid)
//!        init (pid 1): the pipeline's steps, in their order
//!              (`crate::setup::pipeline`), the mounts cloned from the zygote's
//!              root; it moves itself into the run's cgroup and tells the
//!              jailer, which reads its pid there, pins its rlimits and
//!              says go
//!          └─ fork: the program, which returns from fork_run() into python
//! ```
//!
//! The jailer is not this jail's parent: it watches init through a pidfd
//! and the cgroup, and init watches the jailer's go pipe (its end ends the
//! jail) instead of a parent-death signal.
//!
//! The functions here that the zygote calls ([`receive`], [`fork_run`])
//! keep the request between them in a static: nothing but integers crosses
//! into python (`libpycell_zygote.so`).

use std::fs::File;
use std::io::{self, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::{Mutex, OnceLock};

use nix::sched::CloneFlags;
use pycell_seccomp::CompiledFilter;
use pycell_syscall::{self as syscall, CloneResult};
use pycell_wire::named_fds::NamedFdsError;
use pycell_wire::spec::{JailSpec, SlotIds, ZYGOTE_SLOT_BASE};
use serde::{Deserialize, Serialize};

use crate::setup::child::{self, ChildFds};
use crate::setup::ns_owner::AsOwner;
use crate::setup::pipeline::{Step, StepError};
use crate::setup::status::ChildMessage;
use pycell_wire::codes::{FailureCode, Layer};
use pycell_wire::report::JailFailure;

/// The largest request (a warm run's spec: no files, no stdin).
const MAX_REQUEST: usize = 256 << 10;
const NAMESPACES: CloneFlags = CloneFlags::CLONE_NEWUSER
    .union(CloneFlags::CLONE_NEWPID)
    .union(CloneFlags::CLONE_NEWNS)
    .union(CloneFlags::CLONE_NEWNET)
    .union(CloneFlags::CLONE_NEWIPC)
    .union(CloneFlags::CLONE_NEWUTS);

/// One run, as its jailer asks the zygote for it.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ForkRequest {
    pub spec: JailSpec,
    /// What each descriptor that comes with the request is, in order.
    #[serde(default)]
    pub descriptors: Vec<ChildFd>,
}

/// What a descriptor that comes with a [`ForkRequest`] is: the run's
/// child's ends of its jailer's pipes, and its cgroup's join files.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum ChildFd {
    Go,
    Status,
    Stdin,
    Stdout,
    Stderr,
    Disk,
    /// One of the run cgroup's files the jail writes itself into (v1:
    /// one `tasks` file per controller).
    CgroupJoin,
}

impl ForkRequest {
    /// The request for `spec`, with `fds` to go with it.
    pub(crate) fn new(
        spec: JailSpec,
        fds: &ChildFds,
    ) -> io::Result<(ForkRequest, Vec<BorrowedFd<'_>>)> {
        let disk = fds
            .disk_channel
            .as_ref()
            .ok_or_else(|| io::Error::other("no disk channel"))?;
        let mut named = vec![
            (ChildFd::Go, fds.go_read.as_fd()),
            (ChildFd::Status, fds.status_write.as_fd()),
            (ChildFd::Stdin, fds.stdin_read.as_fd()),
            (ChildFd::Stdout, fds.stdout_write.as_fd()),
            (ChildFd::Stderr, fds.stderr_write.as_fd()),
            (ChildFd::Disk, disk.as_fd()),
        ];
        named.extend(
            fds.cgroup_tasks
                .iter()
                .map(|f| (ChildFd::CgroupJoin, f.as_fd())),
        );
        let (descriptors, fds) = pycell_wire::named_fds::split(named);
        Ok((ForkRequest { spec, descriptors }, fds))
    }
}

/// The jailer's side: send `request` with its descriptors on the
/// zygote's `channel` (one seqpacket message).
pub(crate) fn send_request(
    channel: BorrowedFd<'_>,
    request: &ForkRequest,
    fds: &[BorrowedFd<'_>],
) -> io::Result<()> {
    let body = serde_json::to_vec(request).map_err(io::Error::other)?;
    if body.len() > MAX_REQUEST {
        return Err(io::Error::other("the run's spec is too large for a zygote"));
    }
    pycell_wire::fdpass::send_with_fds(channel, &body, fds)
}

/// How long a zygote may take to fork a run into its cgroup.
const JOIN_TIMEOUT_MS: u16 = 10_000;

/// The jailer's side, once the request is sent: wait for the jail's first
/// status line (it has joined its cgroup, or failed) and find its pid in
/// the cgroup, where it is the only process.
pub(crate) fn joined(
    status: &OwnedFd,
    cgroup: &pycell_host::cgroup::SandboxCgroup,
) -> Result<nix::unistd::Pid, JailFailure> {
    let gone = |why: String| failure("forking the run from its zygote")(io::Error::other(why));
    let line = read_line(status.as_fd(), JOIN_TIMEOUT_MS).map_err(|e| gone(e.to_string()))?;
    match serde_json::from_slice::<ChildMessage>(&line) {
        Ok(ChildMessage::Joined) => cgroup
            .only_member()
            .ok_or_else(|| gone("the jail is not alone in its cgroup".into())),
        Ok(ChildMessage::SetupFailed(e)) => Err(e.failure()),
        Ok(other) => Err(gone(format!(
            "the jail said {other:?} before joining its cgroup"
        ))),
        Err(_) if line.is_empty() => Err(gone("the zygote closed the run's status pipe".into())),
        Err(e) => Err(gone(format!("the jail's first status line: {e}"))),
    }
}

/// One line from `fd` (a pipe), a byte at a time so that nothing after it
/// is taken from the relay; empty at EOF.
fn read_line(fd: BorrowedFd<'_>, timeout_ms: u16) -> io::Result<Vec<u8>> {
    use nix::poll::{poll, PollFd, PollFlags};
    let deadline = std::time::Instant::now() + std::time::Duration::from_millis(timeout_ms.into());
    let mut line = Vec::new();
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        let wait = nix::poll::PollTimeout::try_from(left).unwrap_or(nix::poll::PollTimeout::ZERO);
        let mut fds = [PollFd::new(fd, PollFlags::POLLIN)];
        match poll(&mut fds, wait) {
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(e.into()),
            Ok(0) => return Err(io::Error::new(io::ErrorKind::TimedOut, "no answer in 10 s")),
            Ok(_) => {}
        }
        let mut byte = [0u8; 1];
        match nix::unistd::read(fd, &mut byte)? {
            0 => return Ok(Vec::new()),
            _ if byte[0] == b'\n' => return Ok(line),
            _ if line.len() > 64 << 10 => return Err(io::Error::other("an overlong status line")),
            _ => line.push(byte[0]),
        }
    }
}

/// A request the zygote took, until it forks.
struct Received {
    request: ForkRequest,
    fds: ChildFds,
    filter: CompiledFilter,
}

static CHANNEL: OnceLock<OwnedFd> = OnceLock::new();
static PENDING: Mutex<Option<Received>> = Mutex::new(None);

/// The zygote's side: wait for the next request on its channel (the
/// descriptor `raw`, adopted on the first call). 1: one is pending (then
/// [`fork_run`]); 0: the
/// channel's end (no run will come); -1: a request that was refused
/// (said on stderr; its descriptors closed, which its jailer sees).
pub fn receive(raw: i32) -> i32 {
    let channel = match CHANNEL.get() {
        Some(c) => c,
        None => match syscall::adopt_inherited_fd(raw) {
            Ok(fd) => CHANNEL.get_or_init(|| fd),
            Err(e) => return refused(&format!("the channel {raw}: {e}")),
        },
    };
    let mut buf = vec![0u8; MAX_REQUEST];
    let (n, fds) = loop {
        match pycell_wire::fdpass::recv_with_fds(channel.as_fd(), &mut buf) {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return refused(&format!("reading a request: {e}")),
            Ok(got) => break got,
        }
    };
    if n == 0 && fds.is_empty() {
        return 0;
    }
    match take_request(&buf[..n], fds) {
        Ok(r) => {
            *PENDING.lock().unwrap_or_else(|e| e.into_inner()) = Some(r);
            1
        }
        Err(why) => refused(&why.to_string()),
    }
}

fn refused(why: &str) -> i32 {
    let _ = writeln!(io::stderr(), "pycell zygote: {why}");
    -1
}

/// A fork request the zygote refuses (said on its stderr; our own
/// launcher never sends one).
#[derive(Debug, thiserror::Error)]
enum BadForkRequest {
    #[error("a request: {0}")]
    Decode(#[from] serde_json::Error),
    #[error("a request's spec: {0}")]
    Spec(#[from] pycell_wire::spec::SpecError),
    #[error("a request for a jail that is not from a zygote")]
    NotFromZygote,
    #[error("{0}")]
    Filter(#[from] pycell_seccomp::SeccompError),
    #[error("a request's descriptors: {0}")]
    Descriptors(#[from] NamedFdsError),
}

fn take_request(body: &[u8], fds: Vec<OwnedFd>) -> Result<Received, BadForkRequest> {
    let mut request: ForkRequest = serde_json::from_slice(body)?;
    request.spec.validate()?;
    if request.spec.from_zygote.is_none() {
        return Err(BadForkRequest::NotFromZygote);
    }
    let filter = filter_for(&request)?;
    let fds = child_fds(std::mem::take(&mut request.descriptors), fds)?;
    Ok(Received {
        request,
        fds,
        filter,
    })
}

/// The run's seccomp filter, compiled once per profile in the zygote.
fn filter_for(request: &ForkRequest) -> Result<CompiledFilter, pycell_seccomp::SeccompError> {
    static COMPILED: Mutex<Vec<(String, CompiledFilter)>> = Mutex::new(Vec::new());
    let mut compiled = COMPILED.lock().unwrap_or_else(|e| e.into_inner());
    let profile = &request.spec.seccomp_profile;
    Ok(match compiled.iter().find(|(p, _)| p == profile) {
        Some((_, f)) => f.clone(),
        None => {
            let f = pycell_seccomp::compile(profile)?;
            compiled.push((profile.clone(), f.clone()));
            f
        }
    })
}

fn child_fds(names: Vec<ChildFd>, fds: Vec<OwnedFd>) -> Result<ChildFds, NamedFdsError> {
    let mut named = pycell_wire::named_fds::Named::pair(names, fds)?;
    let child = ChildFds {
        go_read: named.one(&ChildFd::Go)?,
        status_write: named.one(&ChildFd::Status)?,
        stdin_read: named.one(&ChildFd::Stdin)?,
        stdout_write: named.one(&ChildFd::Stdout)?,
        stderr_write: named.one(&ChildFd::Stderr)?,
        disk_channel: Some(named.one(&ChildFd::Disk)?),
        handout_channel: None,
        cgroup_tasks: named.all(&ChildFd::CgroupJoin),
        zygote_lib: None,
        runner_pyc: None,
        grants: Vec::new(),
    };
    named.done()?;
    if child.cgroup_tasks.is_empty() {
        return Err(NamedFdsError::Missing(format!("{:?}", ChildFd::CgroupJoin)));
    }
    Ok(child)
}

/// The zygote's side, after [`receive`]: clone the run's init into new
/// user, pid, mount, network, IPC and UTS namespaces (as the jailer clones
/// a cold jail's), write its id maps (the zygote has CAP_SETUID and
/// CAP_SETGID in its own namespace: the jail uid is the slot's id there)
/// and let it go on. Returns 0 in the zygote, 1 only in the run's program,
/// every layer applied; -1 if no request was pending or the clone failed
/// (said on the run's status pipe). Every other process this makes exits
/// here.
pub fn fork_run() -> i32 {
    let taken = PENDING.lock().unwrap_or_else(|e| e.into_inner()).take();
    let Some(Received {
        request,
        fds,
        filter,
    }) = taken
    else {
        return -1;
    };
    let spec = &request.spec;
    let forked_us = pycell_wire::timings::now_us();
    let (maps_read, maps_write) = match nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC) {
        Ok(p) => p,
        Err(e) => return failed(&fds, format!("pipe2: {e}")),
    };
    // The run's namespace is its slot's: created as the slot's ids, so
    // that what the run holds (processes under RLIMIT_NPROC, inotify
    // instances, ...) is charged to its slot, not to the zygote that every
    // run shares (see `crate::setup::ns_owner`).
    let slot = spec.from_zygote.as_ref().map_or(0, |z| z.slot);
    let id = ZYGOTE_SLOT_BASE + slot;
    let owner = match AsOwner::enter(id, Some(id), false) {
        Ok(o) => o,
        Err(e) => return failed(&fds, format!("switching to the slot's ids: {e}")),
    };
    match syscall::clone_fork(NAMESPACES.bits()) {
        Ok(CloneResult::Child) => {
            owner.stay();
            drop(maps_write);
            run_jail(spec, &filter, fds, maps_read, forked_us)
        }
        Ok(CloneResult::Parent(pid)) => {
            drop(maps_read);
            let opened = owner.open_maps(pid);
            let left = owner.leave();
            let maps = crate::setup::ns_owner::jail_id_maps(id, id);
            let written = left
                .and(opened)
                .and_then(|files| files.write(&maps))
                .and_then(|()| nix::unistd::write(&maps_write, b"M").map_err(io::Error::from));
            if let Err(e) = written {
                let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
                failed(&fds, format!("writing the run's uid/gid maps: {e}"));
            }
            0
        }
        Err(e) => {
            drop(owner);
            failed(&fds, format!("clone(user, pid, mount, net, ipc, uts): {e}"))
        }
    }
}

/// Say on the run's status pipe that its jail could not be made.
fn failed(fds: &ChildFds, why: String) -> i32 {
    if let Ok(status) = fds.status_write.try_clone() {
        let msg = ChildMessage::SetupFailed(StepError::new(Step::WaitForParent, why));
        child::send(&File::from(status), &msg);
    }
    -1
}

/// The run's init, cloned by the zygote: once the zygote has written its
/// maps, the pipeline's steps; returns 1 in the program, which init forks.
fn run_jail(
    spec: &JailSpec,
    filter: &CompiledFilter,
    fds: ChildFds,
    maps: OwnedFd,
    forked_us: u64,
) -> i32 {
    // The zygote ignores SIGCHLD (the kernel reaps what it clones); the
    // jail's init and program must not.
    syscall::default_disposition(libc::SIGCHLD);
    let mut byte = [0u8; 1];
    if !matches!(nix::unistd::read(&maps, &mut byte), Ok(1)) {
        syscall::exit_now(126);
    }
    drop(maps);
    crate::timings::take();
    if spec.timings {
        crate::timings::keep("jail: cloned by the zygote", forked_us);
        crate::timings::mark("jail: id maps written");
    }
    // init's name, as in a cloned jail; its command line is the zygote's
    // (python's, no host path in it), which the program shares.
    let name = syscall::thread_name().ok();
    let _ = nix::sys::prctl::set_name(c"pycell-init");
    let jail = child::set_up(spec, filter, &[], fds);
    child::init_returning(jail);
    // The program: python's name again, not init's.
    if let Some(name) = name {
        let _ = nix::sys::prctl::set_name(&name);
    }
    1
}

/// A zygote's library, copied from `path` into a memfd sealed against
/// every change: the zygote's python loads it from there, so no host path
/// is bound into its jail or shows in its maps.
pub(crate) fn library_memfd(path: &std::path::Path) -> io::Result<OwnedFd> {
    use nix::fcntl::{fcntl, FcntlArg, SealFlag};
    use nix::sys::memfd::{memfd_create, MFdFlags};
    let mut lib = File::open(path)?;
    let memfd = memfd_create(
        c"libpycell_zygote.so",
        MFdFlags::MFD_CLOEXEC | MFdFlags::MFD_ALLOW_SEALING,
    )?;
    io::copy(&mut lib, &mut File::from(memfd.try_clone()?))?;
    let seals = SealFlag::F_SEAL_SEAL
        | SealFlag::F_SEAL_SHRINK
        | SealFlag::F_SEAL_GROW
        | SealFlag::F_SEAL_WRITE;
    fcntl(&memfd, FcntlArg::F_ADD_SEALS(seals))?;
    Ok(memfd)
}

/// The id map lines of a zygote's user namespace: itself as 0, each slot
/// as `ZYGOTE_SLOT_BASE + i`.
pub(crate) fn id_maps(own: SlotIds, slots: &[SlotIds]) -> (String, String) {
    let mut uid_map = format!("0 {} 1\n", own.uid);
    let mut gid_map = format!("0 {} 1\n", own.gid);
    for (i, s) in slots.iter().enumerate() {
        let inside = ZYGOTE_SLOT_BASE + i as u32;
        uid_map.push_str(&format!("{inside} {} 1\n", s.uid));
        gid_map.push_str(&format!("{inside} {} 1\n", s.gid));
    }
    (uid_map, gid_map)
}

/// How long a run whose jail ended unexplained waits to hear that its
/// zygote is gone: the zygote's jail dies as a whole, but the run's init
/// may be reaped a moment before the zygote's python.
pub(crate) const DEATH_GRACE: std::time::Duration = std::time::Duration::from_millis(500);

/// Whether the zygote behind our end of its `channel` is gone: its own
/// end closes when the last process of its jail dies. Waits at most
/// `wait` for that.
pub(crate) fn gone(channel: BorrowedFd<'_>, wait: std::time::Duration) -> bool {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    let deadline = std::time::Instant::now() + wait;
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        let mut fds = [PollFd::new(channel, PollFlags::empty())];
        match poll(
            &mut fds,
            PollTimeout::try_from(left).unwrap_or(PollTimeout::ZERO),
        ) {
            Err(nix::errno::Errno::EINTR) => continue,
            Ok(n) if n > 0 => {
                // A hang-up is reported whatever was asked for.
                return fds[0]
                    .revents()
                    .is_some_and(|r| r.contains(PollFlags::POLLHUP));
            }
            _ => return false,
        }
    }
}

/// A run from a zygote whose channel did not come with its spec.
pub(crate) fn no_channel() -> JailFailure {
    failure("finding the zygote")(io::Error::other("no zygote channel came with the spec"))
}

pub(crate) fn failure(what: &'static str) -> impl Fn(io::Error) -> JailFailure {
    move |e| {
        JailFailure::new(
            FailureCode::JailSetupFailed,
            Layer::Jailer,
            format!("{what}: {e}"),
        )
        .with_hint(
            "the zygote this run was sent to is gone or refused it; its launcher starts another",
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_zygote_maps_itself_as_root_and_each_slot_apart() {
        let own = SlotIds {
            uid: 500_000,
            gid: 500_000,
        };
        let slots = [
            SlotIds {
                uid: 600_001,
                gid: 600_001,
            },
            SlotIds {
                uid: 600_007,
                gid: 600_008,
            },
        ];
        let (u, g) = id_maps(own, &slots);
        assert_eq!(u, "0 500000 1\n2000 600001 1\n2001 600007 1\n");
        assert_eq!(g, "0 500000 1\n2000 600001 1\n2001 600008 1\n");
    }

    fn null() -> OwnedFd {
        File::open("/dev/null").unwrap().into()
    }

    const PIPES: [ChildFd; 6] = [
        ChildFd::Go,
        ChildFd::Status,
        ChildFd::Stdin,
        ChildFd::Stdout,
        ChildFd::Stderr,
        ChildFd::Disk,
    ];

    #[test]
    fn a_request_takes_its_descriptors_by_name_in_any_order() {
        let mut names = vec![ChildFd::CgroupJoin];
        names.extend(PIPES.iter().rev());
        let fds = names.iter().map(|_| null()).collect();
        let child = child_fds(names, fds).unwrap();
        assert_eq!(child.cgroup_tasks.len(), 1);
        assert!(child.disk_channel.is_some());
    }

    #[test]
    fn a_request_without_a_named_descriptor_is_refused() {
        let fds = PIPES.iter().map(|_| null()).collect();
        let e = child_fds(PIPES.to_vec(), fds).unwrap_err();
        assert_eq!(e, NamedFdsError::Missing("CgroupJoin".into()));
        let names = vec![ChildFd::Go, ChildFd::CgroupJoin];
        let e = child_fds(names, vec![null(), null()]).unwrap_err();
        assert_eq!(e, NamedFdsError::Missing("Status".into()));
        let e = child_fds(PIPES.to_vec(), vec![null()]).unwrap_err();
        assert_eq!(e, NamedFdsError::Count { names: 6, came: 1 });
    }
}
