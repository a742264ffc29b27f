//! The jailer's raw system calls: those `nix` does not wrap. This is the
//! only code in the workspace allowed to use `unsafe`; every block states
//! what it relies on. It is a crate of its own, not a module of
//! `pycell-jailer`, so that pycelld and the client can use the two calls
//! they need ([`peer_groups`], [`adopt_inherited_fd`]) and `pycell info`
//! its Landlock probe ([`landlock_abi`]) without linking the jail pipeline.
//!
//! A raw `clone` without a new stack is sound only in a single-threaded
//! process (the child gets a copy of the only thread), so the two clone
//! functions check the thread count first and refuse otherwise.
#![allow(unsafe_code)]

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use nix::unistd::Pid;

/// Install the seccomp filter `program` on the calling thread, with a
/// listener (`SECCOMP_FILTER_FLAG_NEW_LISTENER`): the calls the filter
/// returns `SECCOMP_RET_USER_NOTIF` for wait on it for their answer. The
/// listener is close-on-exec, as the kernel makes it. no_new_privs (or
/// CAP_SYS_ADMIN) must be set, as for any filter.
pub fn seccomp_filter_with_listener(program: &[libc::sock_filter]) -> io::Result<OwnedFd> {
    let len = u16::try_from(program.len())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "filter too long"))?;
    let prog = libc::sock_fprog {
        len,
        filter: program.as_ptr().cast_mut(),
    };
    // SAFETY: `prog` describes `program`, which outlives the call; the
    // kernel only reads (and copies) the instructions.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_seccomp,
            libc::SECCOMP_SET_MODE_FILTER as libc::c_ulong,
            libc::SECCOMP_FILTER_FLAG_NEW_LISTENER,
            &prog as *const libc::sock_fprog,
        )
    };
    let fd = check(ret)? as RawFd;
    // SAFETY: `fd` was just returned by the kernel and is owned by no one else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// A call a seccomp filter handed to its listener.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SeccompNotification {
    /// The notification's cookie, for the answer.
    pub id: u64,
    /// The caller, in the listener's pid namespace.
    pub pid: u32,
    pub nr: i32,
    pub arch: u32,
    pub args: [u64; 6],
}

/// Take the next call waiting on `listener`. Call it only when poll says
/// the listener is readable: then it does not block (a call whose caller
/// died meanwhile gives `ENOENT`).
pub fn seccomp_notification(listener: BorrowedFd<'_>) -> io::Result<SeccompNotification> {
    // SAFETY: `seccomp_notif` is plain data, and the kernel wants it zeroed.
    let mut n: libc::seccomp_notif = unsafe { std::mem::zeroed() };
    // SAFETY: `n` is a writable `seccomp_notif`, the type this request's
    // number encodes, alive across the call; `listener` is open.
    let ret = unsafe {
        libc::ioctl(
            listener.as_raw_fd(),
            libc::SECCOMP_IOCTL_NOTIF_RECV,
            &mut n as *mut libc::seccomp_notif,
        )
    };
    check(ret.into())?;
    Ok(SeccompNotification {
        id: n.id,
        pid: n.pid,
        nr: n.data.nr,
        arch: n.data.arch,
        args: n.data.args,
    })
}

/// Answer the call `id` waiting on `listener`: it fails with `errno`.
pub fn seccomp_answer_error(listener: BorrowedFd<'_>, id: u64, errno: i32) -> io::Result<()> {
    let mut resp = libc::seccomp_notif_resp {
        id,
        val: 0,
        error: -errno,
        flags: 0,
    };
    // SAFETY: `resp` is a `seccomp_notif_resp`, the type this request's
    // number encodes, alive across the call; `listener` is open.
    let ret = unsafe {
        libc::ioctl(
            listener.as_raw_fd(),
            libc::SECCOMP_IOCTL_NOTIF_SEND,
            &mut resp as *mut libc::seccomp_notif_resp,
        )
    };
    check(ret.into()).map(drop)
}

/// Which side of a `clone` we are on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CloneResult {
    Parent(Pid),
    Child,
}

fn cstring(path: &Path) -> io::Result<CString> {
    CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path contains a NUL byte"))
}

fn check(ret: libc::c_long) -> io::Result<libc::c_long> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

/// The `num_threads` field of `/proc/self/stat` (the 20th; the command name
/// in parentheses before it may hold spaces).
fn thread_count(stat: &str) -> Option<u64> {
    let rest = stat.rsplit_once(')')?.1;
    rest.split_whitespace().nth(17)?.parse().ok()
}

/// Refuse to clone unless this process has exactly one thread.
fn ensure_single_threaded() -> io::Result<()> {
    let stat = std::fs::read_to_string("/proc/self/stat")?;
    match thread_count(&stat) {
        Some(1) => Ok(()),
        n => Err(io::Error::other(format!(
            "clone without a new stack needs a single-threaded process (threads: {n:?})"
        ))),
    }
}

/// `clone(flags | SIGCHLD)` with fork semantics (child continues on a copy of
/// the stack). `flags` are `CLONE_NEW*` namespace flags, or 0 for a plain fork.
/// Refused in a multi-threaded process.
pub fn clone_fork(namespace_flags: libc::c_int) -> io::Result<CloneResult> {
    clone_with(namespace_flags | libc::SIGCHLD)
}

/// A plain fork whose child is our parent's child, not ours
/// (`CLONE_PARENT`): it is reaped, and its parent-death signal sent, by
/// our parent. Refused in a multi-threaded process.
pub fn fork_as_sibling() -> io::Result<CloneResult> {
    clone_with(libc::CLONE_PARENT | libc::SIGCHLD)
}

/// The raw system call, not glibc's `fork`: no `pthread_atfork`
/// handlers run, and glibc's per-thread record (the tid cached in its
/// thread block) is still the parent's in the child. That is sound only
/// because the caller is single-threaded and holds no lock, and nothing
/// the child does may depend on that record being its own.
fn clone_with(flags: libc::c_int) -> io::Result<CloneResult> {
    ensure_single_threaded()?;
    let flags = flags as libc::c_ulong;
    // SAFETY: with a NULL stack pointer clone behaves like fork: the child runs
    // on a copy-on-write copy of the caller's stack and memory. The caller is
    // single-threaded (checked just above), so no lock or
    // allocator state can be held by a thread that does not exist in the
    // child. No pointers are passed (parent_tid/child_tid/tls are 0).
    let ret = check(unsafe {
        libc::syscall(
            libc::SYS_clone,
            flags,
            0 as libc::c_ulong,
            0 as libc::c_ulong,
            0 as libc::c_ulong,
            0 as libc::c_ulong,
        )
    })?;
    if ret == 0 {
        Ok(CloneResult::Child)
    } else {
        Ok(CloneResult::Parent(Pid::from_raw(ret as libc::pid_t)))
    }
}

const OPEN_TREE_CLONE: libc::c_uint = 1;
const OPEN_TREE_CLOEXEC: libc::c_uint = libc::O_CLOEXEC as libc::c_uint;
const AT_RECURSIVE: libc::c_uint = 0x8000;
const MOVE_MOUNT_F_EMPTY_PATH: libc::c_uint = 0x0000_0004;
pub const MOUNT_ATTR_RDONLY: u64 = 0x0000_0001;
pub const MOUNT_ATTR_NOSUID: u64 = 0x0000_0002;
pub const MOUNT_ATTR_NODEV: u64 = 0x0000_0004;
pub const MOUNT_ATTR_NOEXEC: u64 = 0x0000_0008;
pub const MOUNT_ATTR_IDMAP: u64 = 0x0010_0000;

/// `struct mount_attr` from <linux/mount.h> (MOUNT_ATTR_SIZE_VER0).
#[repr(C)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}

/// `open_tree(path, OPEN_TREE_CLONE [| AT_RECURSIVE])`: a detached copy of the
/// mount at `path` (a bind mount not yet attached anywhere).
pub fn open_tree_clone(path: &Path, recursive: bool) -> io::Result<OwnedFd> {
    open_tree_at(libc::AT_FDCWD, path, recursive, 0)
}

/// `open_tree(fd, "", AT_EMPTY_PATH | OPEN_TREE_CLONE [| AT_RECURSIVE])`: a
/// detached copy of the mount tree at the file `fd` was opened on.
pub fn open_tree_clone_fd(fd: BorrowedFd<'_>, recursive: bool) -> io::Result<OwnedFd> {
    open_tree_at(
        fd.as_raw_fd(),
        Path::new(""),
        recursive,
        libc::AT_EMPTY_PATH as libc::c_uint,
    )
}

fn open_tree_at(
    dirfd: RawFd,
    path: &Path,
    recursive: bool,
    extra: libc::c_uint,
) -> io::Result<OwnedFd> {
    let c = cstring(path)?;
    let mut flags = OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | extra;
    if recursive {
        flags |= AT_RECURSIVE;
    }
    // SAFETY: `c` is a valid NUL-terminated string that outlives the call and
    // `dirfd` is AT_FDCWD or a descriptor the caller keeps open across it; the
    // kernel returns a new file descriptor that nothing else owns, which we
    // wrap in an OwnedFd exactly once.
    let fd = check(unsafe {
        libc::syscall(
            libc::SYS_open_tree,
            dirfd,
            c.as_ptr(),
            flags as libc::c_ulong,
        )
    })?;
    // SAFETY: `fd` was just returned by the kernel and is owned by no one else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// `mount_setattr(fd, "", AT_EMPTY_PATH [| AT_RECURSIVE], {attr_set})`.
/// Only adds flags, so it never trips over flags locked by the kernel.
pub fn mount_setattr_fd(fd: &OwnedFd, attr_set: u64, recursive: bool) -> io::Result<()> {
    let mut flags = libc::AT_EMPTY_PATH as libc::c_uint;
    if recursive {
        flags |= AT_RECURSIVE;
    }
    mount_setattr_raw(fd.as_raw_fd(), c"", flags, attr_set)
}

/// `mount_setattr(AT_FDCWD, path, flags, {attr_set})`.
pub fn mount_setattr_path(path: &Path, attr_set: u64, recursive: bool) -> io::Result<()> {
    let c = cstring(path)?;
    let flags = if recursive { AT_RECURSIVE } else { 0 };
    mount_setattr_raw(libc::AT_FDCWD, &c, flags, attr_set)
}

/// `mount_setattr(fd, "", AT_EMPTY_PATH, {attr_set | MOUNT_ATTR_IDMAP,
/// userns_fd})`: `attr_set`, and the ids of the detached mount `fd` seen
/// through `userns`'s maps (an idmapped mount; not recursive).
pub fn mount_setattr_idmapped(
    fd: &OwnedFd,
    attr_set: u64,
    userns: BorrowedFd<'_>,
) -> io::Result<()> {
    let attr = MountAttr {
        attr_set: attr_set | MOUNT_ATTR_IDMAP,
        attr_clr: 0,
        propagation: 0,
        userns_fd: userns.as_raw_fd() as u64,
    };
    mount_setattr_with(
        fd.as_raw_fd(),
        c"",
        libc::AT_EMPTY_PATH as libc::c_uint,
        &attr,
    )
}

fn mount_setattr_raw(
    dirfd: RawFd,
    path: &std::ffi::CStr,
    flags: libc::c_uint,
    attr_set: u64,
) -> io::Result<()> {
    let attr = MountAttr {
        attr_set,
        attr_clr: 0,
        propagation: 0,
        userns_fd: 0,
    };
    mount_setattr_with(dirfd, path, flags, &attr)
}

fn mount_setattr_with(
    dirfd: RawFd,
    path: &std::ffi::CStr,
    flags: libc::c_uint,
    attr: &MountAttr,
) -> io::Result<()> {
    // SAFETY: `path` is NUL-terminated and `attr` is a properly laid out
    // `struct mount_attr` that lives across the call; its size is passed so the
    // kernel reads exactly that many bytes.
    check(unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            dirfd,
            path.as_ptr(),
            flags as libc::c_ulong,
            attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    })?;
    Ok(())
}

/// `move_mount(fd, "", AT_FDCWD, target, MOVE_MOUNT_F_EMPTY_PATH)`: attach a
/// detached mount (from `open_tree_clone`) at `target`.
pub fn move_mount_to(fd: &OwnedFd, target: &Path) -> io::Result<()> {
    let t = cstring(target)?;
    // SAFETY: both strings are NUL-terminated and outlive the call; `fd` is a
    // valid open descriptor borrowed for the duration of the call.
    check(unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            fd.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_FDCWD,
            t.as_ptr(),
            MOVE_MOUNT_F_EMPTY_PATH as libc::c_ulong,
        )
    })?;
    Ok(())
}

/// Close every descriptor from 3 up except those in `keep`.
pub fn close_fds_except(keep: &[RawFd]) -> io::Result<()> {
    let mut keep: Vec<RawFd> = keep.iter().copied().filter(|k| *k >= 3).collect();
    keep.sort_unstable();
    keep.dedup();
    let mut lo: u32 = 3;
    for k in keep.into_iter().map(|k| k as u32) {
        if k > lo {
            close_range(lo, k - 1)?;
        }
        lo = k + 1;
    }
    close_range(lo, u32::MAX)
}

fn close_range(lo: u32, hi: u32) -> io::Result<()> {
    // SAFETY: close_range only closes descriptors. Its caller (the jail child,
    // single-threaded, before exec) owns every descriptor in the range and
    // holds no Rust owner for any of them that is used afterwards: the ones
    // it keeps are excluded by `close_fds_except`.
    check(unsafe {
        libc::syscall(
            libc::SYS_close_range,
            lo as libc::c_uint,
            hi as libc::c_uint,
            0 as libc::c_uint,
        )
    })?;
    Ok(())
}

/// `prlimit(2)`: set `resource` of process `pid` to `soft`/`hard`.
pub fn prlimit(
    pid: nix::unistd::Pid,
    resource: libc::__rlimit_resource_t,
    soft: u64,
    hard: u64,
) -> io::Result<()> {
    let new = libc::rlimit64 {
        rlim_cur: soft,
        rlim_max: hard,
    };
    // SAFETY: `new` is a valid rlimit64 that lives across the call; the old
    // value pointer is NULL, so the kernel writes nothing of ours.
    let r = unsafe { libc::prlimit64(pid.as_raw(), resource, &new, std::ptr::null_mut()) };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Every signal's disposition back to the default, as a program started
/// by a fresh login shell has them: `execve` resets handlers but keeps
/// ignored signals ignored, so without this a program would inherit
/// whatever its starter ignored (SIGINT and SIGQUIT from a shell's
/// background job). SIGKILL and SIGSTOP cannot be changed; signals the C
/// library keeps for itself are refused by it, which is harmless.
pub fn default_signal_dispositions() {
    for sig in 1..=libc::SIGRTMAX() {
        if sig == libc::SIGKILL || sig == libc::SIGSTOP {
            continue;
        }
        default_disposition(sig);
    }
}

/// Signal `sig`'s disposition back to the default.
pub fn default_disposition(sig: libc::c_int) {
    // SAFETY: SIG_DFL installs no handler of ours, so no code of this
    // process can run in signal context because of it; `signal` only
    // changes the calling process's disposition table.
    unsafe { libc::signal(sig, libc::SIG_DFL) };
}

/// The calling thread's name (`PR_GET_NAME`, at most 15 bytes). Not nix's
/// `prctl::get_name`, which hands the kernel an immutable buffer (the
/// compiler may then read it back as the zeros it started as: an empty
/// name, in release builds).
pub fn thread_name() -> io::Result<std::ffi::CString> {
    let mut buf = [0u8; 16];
    // SAFETY: PR_GET_NAME writes at most 16 bytes (TASK_COMM_LEN, NUL
    // included) into the buffer, which is 16 bytes, mutable and ours.
    let rc = unsafe { libc::prctl(libc::PR_GET_NAME, buf.as_mut_ptr(), 0, 0, 0) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    std::ffi::CStr::from_bytes_until_nul(&buf)
        .map(std::ffi::CStr::to_owned)
        .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
}

/// `_exit(2)`: end the process now, without running exit handlers or
/// unwinding (the right way out of a forked child).
pub fn exit_now(code: i32) -> ! {
    // SAFETY: _exit never returns and touches no memory of ours; it is
    // async-signal-safe and valid in a forked child.
    unsafe { libc::_exit(code) }
}

const LANDLOCK_CREATE_RULESET_VERSION: libc::c_uint = 1;

/// The kernel's Landlock ABI version, or the errno explaining its absence
/// (ENOSYS: not built in; EOPNOTSUPP: built in but disabled at boot).
pub fn landlock_abi() -> io::Result<u32> {
    // SAFETY: with a NULL attr pointer, size 0 and the VERSION flag the call
    // only returns the ABI number; no memory is read or written.
    let v = check(unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<libc::c_void>(),
            0usize,
            LANDLOCK_CREATE_RULESET_VERSION,
        )
    })?;
    Ok(v as u32)
}

const SIOCGIFFLAGS: libc::c_ulong = 0x8913;
const SIOCSIFFLAGS: libc::c_ulong = 0x8914;

/// `struct ifreq` with the `ifr_flags` member of its union (40 bytes).
#[repr(C)]
struct IfreqFlags {
    name: [u8; libc::IFNAMSIZ],
    flags: libc::c_short,
    _pad: [u8; 22],
}

/// Set IFF_UP on the interface named `ifname` of the current network
/// namespace (used for `lo` in a fresh namespace, where it starts down).
pub fn interface_up(ifname: &str) -> io::Result<()> {
    use nix::sys::socket::{socket, AddressFamily, SockFlag, SockType};
    let sock = socket(
        AddressFamily::Inet,
        SockType::Datagram,
        SockFlag::SOCK_CLOEXEC,
        None,
    )
    .map_err(io::Error::from)?;
    let mut req = IfreqFlags {
        name: [0; libc::IFNAMSIZ],
        flags: 0,
        _pad: [0; 22],
    };
    let bytes = ifname.as_bytes();
    if bytes.len() >= libc::IFNAMSIZ {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "interface name too long",
        ));
    }
    req.name[..bytes.len()].copy_from_slice(bytes);
    // SAFETY: `req` is a properly sized and aligned `struct ifreq` (name +
    // flags member of the union, padded to the kernel's 40 bytes) that lives
    // across both calls; `sock` is an open socket we own.
    check(unsafe {
        libc::ioctl(
            sock.as_raw_fd(),
            SIOCGIFFLAGS as _,
            &mut req as *mut IfreqFlags,
        )
    } as libc::c_long)?;
    req.flags |= (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short;
    // SAFETY: as above.
    check(unsafe {
        libc::ioctl(
            sock.as_raw_fd(),
            SIOCSIFFLAGS as _,
            &req as *const IfreqFlags,
        )
    } as libc::c_long)?;
    Ok(())
}

/// SO_PEERGROUPS (asm-generic; the same number on x86_64 and aarch64).
const SO_PEERGROUPS: libc::c_int = 59;

/// Take ownership of descriptor `raw`, inherited across exec from whoever
/// started us (systemd's socket activation passes the listening socket as
/// descriptor 3). Refused unless it is open; made close-on-exec. Call it at
/// most once per descriptor, before anything else in the process could
/// have taken it.
pub fn adopt_inherited_fd(raw: std::os::fd::RawFd) -> io::Result<std::os::fd::OwnedFd> {
    use std::os::fd::FromRawFd;
    // SAFETY: fcntl(F_GETFD) on any integer only reads that descriptor's
    // flags (EBADF if it is not open); it touches no memory of ours.
    if unsafe { libc::fcntl(raw, libc::F_GETFD) } < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `raw` is open (checked above) and, per this function's
    // contract, owned by nothing else in this process: it was inherited
    // across exec and is adopted once, at startup.
    let fd = unsafe { std::os::fd::OwnedFd::from_raw_fd(raw) };
    nix::fcntl::fcntl(
        &fd,
        nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::FD_CLOEXEC),
    )?;
    Ok(fd)
}

/// The supplementary groups of a connected unix socket's peer, as they were
/// when it connected (`SO_PEERGROUPS`, Linux 4.13): unlike reading
/// `/proc/<pid>/status`, no race with the peer exiting and its pid being
/// reused, and no need to see other users' processes.
pub fn peer_groups(sock: std::os::fd::BorrowedFd<'_>) -> io::Result<Vec<u32>> {
    let mut groups: Vec<libc::gid_t> = vec![0; 64];
    loop {
        let mut len = (groups.len() * std::mem::size_of::<libc::gid_t>()) as libc::socklen_t;
        // SAFETY: `groups` is a live, writable buffer of `len` bytes; the
        // kernel writes at most `len` bytes into it and the new length into
        // `len`, a valid socklen_t.
        let rc = unsafe {
            libc::getsockopt(
                sock.as_raw_fd(),
                libc::SOL_SOCKET,
                SO_PEERGROUPS,
                groups.as_mut_ptr().cast(),
                &mut len,
            )
        };
        let count = len as usize / std::mem::size_of::<libc::gid_t>();
        if rc == 0 {
            groups.truncate(count);
            return Ok(groups);
        }
        let err = io::Error::last_os_error();
        // Too small: the kernel said how much it needs (NGROUPS_MAX caps it).
        if err.raw_os_error() == Some(libc::ERANGE) && count > groups.len() {
            groups.resize(count, 0);
            continue;
        }
        return Err(err);
    }
}

/// `struct clone_args` (CLONE_ARGS_SIZE_VER2, 88 bytes).
#[repr(C)]
#[derive(Default)]
struct CloneArgs {
    flags: u64,
    pidfd: u64,
    child_tid: u64,
    parent_tid: u64,
    exit_signal: u64,
    stack: u64,
    stack_size: u64,
    tls: u64,
    set_tid: u64,
    set_tid_size: u64,
    cgroup: u64,
}

const CLONE_INTO_CGROUP: u64 = 0x2_0000_0000;

/// `clone3` with fork semantics that starts the child directly inside the
/// cgroup v2 directory `cgroup_dir` (CLONE_INTO_CGROUP): no later write to
/// cgroup.procs, so no wait for the cgroup attach lock.
pub fn clone_into_cgroup(
    namespace_flags: libc::c_int,
    cgroup_dir: std::os::fd::BorrowedFd<'_>,
) -> io::Result<CloneResult> {
    ensure_single_threaded()?;
    let args = CloneArgs {
        flags: namespace_flags as u32 as u64 | CLONE_INTO_CGROUP,
        exit_signal: libc::SIGCHLD as u64,
        cgroup: cgroup_dir.as_raw_fd() as u64,
        ..CloneArgs::default()
    };
    // SAFETY: `args` is a valid, fully initialised `struct clone_args` whose
    // size is passed; no stack is given, so the child runs on a copy of ours
    // as with fork, which is sound because the caller is single-threaded
    // (checked just above). The cgroup fd is borrowed for the duration of the call.
    let ret = check(unsafe {
        libc::syscall(
            libc::SYS_clone3,
            &args as *const CloneArgs,
            std::mem::size_of::<CloneArgs>(),
        )
    })?;
    if ret == 0 {
        Ok(CloneResult::Child)
    } else {
        Ok(CloneResult::Parent(Pid::from_raw(ret as libc::pid_t)))
    }
}

/// `fsetxattr(fd, name, value, 0)`: set (create or replace) an extended
/// attribute on an open file.
pub fn fsetxattr(fd: BorrowedFd<'_>, name: &str, value: &[u8]) -> io::Result<()> {
    let name = CString::new(name)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "name contains a NUL byte"))?;
    // SAFETY: `fd` is an open descriptor borrowed for the call; `name` is a
    // NUL-terminated string and `value` a slice of `value.len()` readable
    // bytes, both alive until the call returns; the kernel only reads them.
    check(unsafe {
        libc::fsetxattr(
            fd.as_raw_fd(),
            name.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            0,
        ) as libc::c_long
    })
    .map(|_| ())
}

/// Make the program `cmd` starts die (SIGKILL) when the thread that
/// starts it does, so that a helper process (an MCP server a client
/// configured) never outlives its client, even one that is SIGKILLed.
/// Start it from a thread that lives as long as the client (a tokio
/// worker thread, not a blocking-pool one).
pub fn die_with_parent(cmd: &mut std::process::Command) {
    use std::os::unix::process::CommandExt;
    // SAFETY: the closure runs in the forked child before exec and calls
    // only prctl and getppid, both async-signal-safe; it allocates nothing
    // and touches no lock.
    let parent = std::process::id() as libc::pid_t;
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong) != 0 {
                return Err(io::Error::last_os_error());
            }
            // Our parent died before the prctl: nobody would signal us.
            if libc::getppid() != parent {
                return Err(io::Error::other("the client exited"));
            }
            Ok(())
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thread_counts_are_read_past_the_command_name() {
        let stat = "42 (a) b (c) S 1 42 42 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 3 0 99 0 0";
        assert_eq!(thread_count(stat), Some(3));
        assert_eq!(thread_count("garbage"), None);
    }

    #[test]
    fn a_threads_name_is_read_back() {
        let named = std::thread::Builder::new().name("pycell-name".into());
        let got = named.spawn(thread_name).unwrap().join().unwrap().unwrap();
        assert_eq!(got.to_str(), Ok("pycell-name"));
    }

    #[test]
    fn a_multi_threaded_process_may_not_clone() {
        // The test harness runs tests on threads of its own.
        let e = clone_fork(0).unwrap_err();
        assert!(e.to_string().contains("single-threaded"), "{e}");
    }
}
