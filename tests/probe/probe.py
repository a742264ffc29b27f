"""pycell jail probe: runs INSIDE the sandbox as the user script.

It tries what untrusted code would try (read host secrets, write outside the
workspace, reach the host's loopback, see host processes, call syscalls the
seccomp policy must deny, ...) and reports what happened as one JSON object on
stdout. It asserts nothing itself: the Rust tests in tests/tests/ decide what
is acceptable. Every check is isolated, so an exception in one is recorded and
the others still run. Anything that could change the probe's own state if the
jail were broken (a syscall that would succeed, a namespace change) runs in a
forked child.

Usage: probe.py [--host-port N] [--abstract-socket NAME] [--secret-path P]...
                [--inherited-fd N]...
"""

import argparse
import ctypes
import errno
import json
import os
import socket
import stat
import sys
import time
import traceback

# Record fds and pids before any check opens files or spawns children.
_EARLY = {}


def _list_fds():
    # listdir opens (and closes) one fd of its own; readlink on it then fails
    # with ENOENT, which is how it is told apart from fds that are really open.
    out = {}
    for name in os.listdir("/proc/self/fd"):
        try:
            out[int(name)] = os.readlink("/proc/self/fd/" + name)
        except FileNotFoundError:
            continue
        except OSError as e:
            out[int(name)] = "?" + errno.errorcode.get(e.errno, str(e.errno))
    return out


try:
    _EARLY["fds"] = _list_fds()
except BaseException as e:  # noqa: BLE001 - report, never crash
    _EARLY["fds_error"] = repr(e)


def errname(num):
    if num is None:
        return None
    return errno.errorcode.get(num, str(num))


def attempt(fn):
    """Run fn(); return {"ok": True, "value": ...} or the failure as data."""
    try:
        return {"ok": True, "value": fn()}
    except OSError as e:
        return {"ok": False, "errno": errname(e.errno), "error": str(e)}
    except BaseException as e:  # noqa: BLE001
        return {"ok": False, "errno": None, "error": "%s: %s" % (type(e).__name__, e)}


def in_child(fn, timeout=20.0):
    """Run fn() in a forked child; return its JSON-able result, or how it died.

    A syscall the policy kills with SIGSYS, or one that would change the
    probe's namespaces or personality if allowed, cannot harm the parent.
    """
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            os.close(r)
            try:
                data = json.dumps(fn())
            except BaseException as e:  # noqa: BLE001
                data = json.dumps({"exception": "%s: %s" % (type(e).__name__, e)})
            os.write(w, data.encode())
        except BaseException:  # noqa: BLE001
            code = 1
        finally:
            os._exit(code)
    os.close(w)
    chunks = []
    deadline = time.monotonic() + timeout
    try:
        while True:
            b = os.read(r, 65536)
            if not b:
                break
            chunks.append(b)
    finally:
        os.close(r)
    status = None
    while time.monotonic() < deadline:
        wpid, status = os.waitpid(pid, os.WNOHANG)
        if wpid == pid:
            break
        time.sleep(0.01)
    else:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        return {"child": "timeout"}
    raw = b"".join(chunks)
    if os.WIFSIGNALED(status):
        return {"child_signal": os.WTERMSIG(status), "partial": raw.decode(errors="replace")}
    try:
        return json.loads(raw.decode())
    except ValueError:
        return {"child_exit": os.WEXITSTATUS(status), "raw": raw.decode(errors="replace")}


# ---------------------------------------------------------------- filesystem


def read_path(path):
    def go():
        st = os.stat(path)
        if stat.S_ISDIR(st.st_mode):
            return {"kind": "dir", "entries": sorted(os.listdir(path))[:50]}
        with open(path, "rb") as f:
            data = f.read(4096)
        return {"kind": "file", "bytes": len(data), "head": data[:64].decode(errors="replace")}

    return attempt(go)


def write_path(path, data=b"pycell-probe\n", keep=False):
    def go():
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            n = os.write(fd, data)
        finally:
            os.close(fd)
        with open(path, "rb") as f:
            back = f.read()
        if not keep:
            os.unlink(path)
        return {"written": n, "read_back_equal": back == data}

    return attempt(go)


def write_existing(path, data=b""):
    """Open an existing file for writing (no create, no truncate).

    "ok" means the open succeeded, which is already a hole; `data`, if any,
    is a harmless payload (e.g. the current hostname) whose write result is
    recorded too. An empty payload writes nothing at all.
    """

    def go():
        fd = os.open(path, os.O_WRONLY)
        try:
            if not data:
                return {"opened": True}
            try:
                return {"opened": True, "written": os.write(fd, data)}
            except OSError as e:
                return {"opened": True, "write_errno": errname(e.errno)}
        finally:
            os.close(fd)

    return attempt(go)


def landlock_candidates():
    """Writes that DAC and mount flags would allow but Landlock must deny.

    Measured on a Landlock host: as an unprivileged exec'd process,
    O_WRONLY on /proc/self/comm, /proc/self/attr/current, /proc/self/timerslack_ns
    and /dev/random succeeds without Landlock and fails with EACCES once a
    ruleset grants write only to /tmp and /dev/null. For each candidate we
    record whether DAC (owner/mode vs our uid) and the mount (ST_RDONLY)
    would permit the write, so the test can tell Landlock's EACCES from EROFS
    or a permission bit.
    """
    out = {}
    uid = os.geteuid()
    gids = set(os.getgroups()) | {os.getegid()}
    for path in (
        "/proc/self/comm",
        "/proc/self/attr/current",
        "/proc/self/timerslack_ns",
        "/dev/random",
        "/dev/urandom",
    ):
        entry = {}
        try:
            st = os.stat(path)
            if st.st_uid == uid:
                dac = bool(st.st_mode & stat.S_IWUSR)
            elif st.st_gid in gids:
                dac = bool(st.st_mode & stat.S_IWGRP)
            else:
                dac = bool(st.st_mode & stat.S_IWOTH)
            entry["dac_allows"] = dac
            entry["owner_uid"] = st.st_uid
            entry["mode"] = oct(st.st_mode & 0o7777)
            entry["mount_readonly"] = bool(os.statvfs(path).f_flag & os.ST_RDONLY)
        except OSError as e:
            entry["stat_errno"] = errname(e.errno)
        # Only open for writing, never write: the open is what Landlock checks.
        def go(p=path):
            fd = os.open(p, os.O_WRONLY)
            os.close(fd)
            return "opened"

        entry["open_write"] = attempt(go)
        out[path] = entry
    return out


def xattrs():
    """Extended attributes on files the run made itself, in each writable
    place. security.* (LSM labels, IMA/EVM data) and trusted.* must not be
    settable or removable; user.* should work where the filesystem has it.
    Every attribute syscall is tried: path, fd and no-follow forms."""
    out = {}
    for place in ("/workspace", "/tmp", "/dev/shm"):
        path = os.path.join(place, "probe-xattr")
        with open(path, "wb"):
            pass
        fd = os.open(path, os.O_RDONLY)
        tries = {
            "setxattr security": lambda: os.setxattr(path, "security.pycell", b"1"),
            "fsetxattr security": lambda: os.setxattr(fd, "security.pycell", b"1"),
            "lsetxattr security": lambda: os.setxattr(path, "security.pycell", b"1", follow_symlinks=False),
            "setxattr security.selinux": lambda: os.setxattr(path, "security.selinux", b"unconfined_u:object_r:shadow_t:s0"),
            "setxattr trusted": lambda: os.setxattr(path, "trusted.pycell", b"1"),
            "removexattr security": lambda: os.removexattr(path, "security.pycell"),
            "fremovexattr security": lambda: os.removexattr(fd, "security.pycell"),
            "setxattr user": lambda: os.setxattr(path, "user.pycell", b"probe"),
            "getxattr user": lambda: os.getxattr(path, "user.pycell").decode(),
        }
        out[place] = {name: attempt(fn) for name, fn in tries.items()}
        out[place]["listxattr"] = attempt(lambda: sorted(os.listxattr(path)))
        os.close(fd)
        os.unlink(path)
    return out


# ------------------------------------------------------------------- network


def tcp_connect(host, port, timeout=3.0):
    def go():
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.settimeout(timeout)
        try:
            s.connect((host, port))
            return {"connected": True, "peer": s.getpeername()}
        finally:
            s.close()

    return attempt(go)


def abstract_connect(name):
    def go():
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(3.0)
        try:
            s.connect("\0" + name)
            return {"connected": True}
        finally:
            s.close()

    return attempt(go)


def loopback_inside():
    """Informational: TCP inside the jail's own netns (Landlock ABI 4 may
    refuse bind/connect with EACCES even there)."""

    def go():
        srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            srv.bind(("127.0.0.1", 0))
            srv.listen(1)
            port = srv.getsockname()[1]
            cli = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            cli.settimeout(3.0)
            try:
                cli.connect(("127.0.0.1", port))
            finally:
                cli.close()
            return {"port": port}
        finally:
            srv.close()

    return attempt(go)


def interfaces():
    try:
        return sorted(name for _, name in socket.if_nameindex())
    except OSError as e:
        return {"errno": errname(e.errno)}


# ------------------------------------------------------------------ /proc


def proc_status():
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in (
                "CapEff",
                "CapPrm",
                "CapBnd",
                "CapAmb",
                "CapInh",
                "NoNewPrivs",
                "Seccomp",
                "Seccomp_filters",
                "Uid",
                "Gid",
                "Groups",
                "NSpid",
            ):
                out[key] = value.strip()
    return out


def visible_pids():
    pids = sorted(int(n) for n in os.listdir("/proc") if n.isdigit())
    procs = {}
    for pid in pids:
        try:
            with open("/proc/%d/cmdline" % pid, "rb") as f:
                procs[pid] = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError as e:
            procs[pid] = "?" + errname(e.errno)
    return {"pids": pids, "cmdlines": {str(k): v for k, v in procs.items()}, "self": os.getpid()}


def mounts():
    out = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            parts = line.split()
            sep = parts.index("-")
            out.append({"mount_point": parts[4], "options": parts[5], "fstype": parts[sep + 1]})
    return out


# ---------------------------------------------------------------- syscalls

libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long

# x86_64 syscall numbers (asm/unistd_64.h).
NR = {
    "ioctl": 16,
    "clone": 56,
    "ptrace": 101,
    "personality": 135,
    "pivot_root": 155,
    "mount": 165,
    "umount2": 166,
    "init_module": 175,
    "delete_module": 176,
    "kexec_load": 246,
    "add_key": 248,
    "request_key": 249,
    "keyctl": 250,
    "unshare": 272,
    "perf_event_open": 298,
    "open_by_handle_at": 304,
    "setns": 308,
    "process_vm_readv": 310,
    "process_vm_writev": 311,
    "finit_module": 313,
    "kexec_file_load": 320,
    "bpf": 321,
    "userfaultfd": 323,
    "io_uring_setup": 425,
    "io_uring_enter": 426,
    "io_uring_register": 427,
    "open_tree": 428,
    "move_mount": 429,
    "fsopen": 430,
    "fsconfig": 431,
    "fsmount": 432,
    "fspick": 433,
    "clone3": 435,
    "mount_setattr": 442,
}

CLONE_NEWNS = 0x00020000
CLONE_NEWCGROUP = 0x02000000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
SIGCHLD = 17
TIOCSTI = 0x5412
TIOCLINUX = 0x541C
UFFD_USER_MODE_ONLY = 1
O_CLOEXEC = 0o2000000
AT_FDCWD = -100


def _arg(a):
    if isinstance(a, int):
        # Every argument is a full 64-bit register value, as the kernel and
        # seccomp see it; ctypes would otherwise pass a 32-bit int.
        return ctypes.c_ulong(a) if a >= (1 << 63) else ctypes.c_long(a)
    return a


def raw_syscall(name, *args):
    """Call syscall `name` directly; return {"ret": r, "errno": NAME|None}.

    If the call unexpectedly succeeds and returns an fd, the fd is closed; if
    a clone unexpectedly succeeds, the new child exits at once.
    """
    ctypes.set_errno(0)
    ret = libc.syscall(ctypes.c_long(NR[name]), *[_arg(a) for a in args])
    err = ctypes.get_errno()
    if name in ("clone",) and ret == 0:
        os._exit(0)  # we are the child of an allowed clone: leave now
    out = {"ret": ret, "errno": errname(err) if ret == -1 else None}
    if ret > 2 and name in ("userfaultfd", "io_uring_setup", "fsopen", "open_tree", "perf_event_open", "bpf"):
        try:
            os.close(ret)
        except OSError:
            pass
    if name == "clone" and ret > 0:
        try:
            os.waitpid(ret, 0)
        except OSError:
            pass
    return out


def denied_syscalls():
    """Syscalls the default seccomp policy must deny, with harmless arguments.

    Arguments are chosen so that, if the syscall reached the kernel, it would
    mostly fail with something other than EPERM (EFAULT, EBADF, EINVAL) or
    succeed harmlessly: an EPERM then comes from the filter.
    """
    null = None
    zero_page = ctypes.create_string_buffer(256)
    ch = ctypes.c_char(b"x")
    # TIOCSTI/TIOCLINUX go to /dev/null: if the filter let them through they
    # fail with ENOTTY instead of injecting into anyone's terminal.
    nullfd = os.open("/dev/null", os.O_RDWR)
    calls = {
        "io_uring_setup": ("io_uring_setup", 1, zero_page),
        "io_uring_enter": ("io_uring_enter", -1, 0, 0, 0, null, 0),
        "io_uring_register": ("io_uring_register", -1, 0, null, 0),
        "userfaultfd": ("userfaultfd", O_CLOEXEC | UFFD_USER_MODE_ONLY),
        # KEYCTL_GET_KEYRING_ID(KEY_SPEC_SESSION_KEYRING, create=0)
        "keyctl": ("keyctl", 0, -3, 0),
        "add_key": ("add_key", null, null, null, 0, -2),
        "request_key": ("request_key", null, null, null, 0),
        # BPF_PROG_LOAD with a NULL attr of size 0
        "bpf": ("bpf", 5, null, 0),
        "perf_event_open": ("perf_event_open", null, 0, -1, -1, 0),
        # Unknown flag bit 0x8000: EINVAL even for a real root (never unloads).
        "kexec_load": ("kexec_load", 0, 0, null, 0x8000),
        "kexec_file_load": ("kexec_file_load", -1, -1, 0, null, 0),
        "init_module": ("init_module", null, 0, null),
        "finit_module": ("finit_module", -1, null, 0),
        "delete_module": ("delete_module", null, 0),
        "mount": ("mount", null, null, null, 0, null),
        "umount2": ("umount2", null, 0),
        "pivot_root": ("pivot_root", null, null),
        "fsopen": ("fsopen", null, 0),
        "fsconfig": ("fsconfig", -1, 0, null, null, 0),
        "fsmount": ("fsmount", -1, 0, 0),
        "fspick": ("fspick", -1, null, 0),
        "open_tree": ("open_tree", -1, null, 0),
        "move_mount": ("move_mount", -1, null, -1, null, 0),
        "mount_setattr": ("mount_setattr", -1, null, 0, null, 0),
        "unshare(CLONE_NEWUSER)": ("unshare", CLONE_NEWUSER),
        "unshare(CLONE_NEWNET)": ("unshare", CLONE_NEWNET),
        "unshare(CLONE_NEWNS)": ("unshare", CLONE_NEWNS),
        "unshare(CLONE_NEWPID)": ("unshare", CLONE_NEWPID),
        "unshare(CLONE_NEWIPC)": ("unshare", CLONE_NEWIPC),
        "unshare(CLONE_NEWUTS)": ("unshare", CLONE_NEWUTS),
        "unshare(CLONE_NEWCGROUP)": ("unshare", CLONE_NEWCGROUP),
        "setns": ("setns", -1, 0),
        "clone(CLONE_NEWUSER)": ("clone", CLONE_NEWUSER | SIGCHLD, 0, 0, 0, 0),
        "clone(CLONE_NEWNET)": ("clone", CLONE_NEWNET | SIGCHLD, 0, 0, 0, 0),
        "clone(CLONE_NEWNS)": ("clone", CLONE_NEWNS | SIGCHLD, 0, 0, 0, 0),
        "ptrace(PTRACE_TRACEME)": ("ptrace", 0, 0, 0, 0),
        # PTRACE_SEIZE does not stop the tracee even if it were allowed.
        "ptrace(PTRACE_SEIZE, 1)": ("ptrace", 0x4206, 1, 0, 0),
        "process_vm_readv": ("process_vm_readv", os.getpid(), null, 0, null, 0, 0),
        "process_vm_writev": ("process_vm_writev", os.getpid(), null, 0, null, 0, 0),
        "open_by_handle_at": ("open_by_handle_at", AT_FDCWD, null, 0),
        "personality(PER_LINUX32)": ("personality", 0x0008),
        "personality(READ_IMPLIES_EXEC)": ("personality", 0x0400000),
        "personality(ADDR_NO_RANDOMIZE)": ("personality", 0x0040000),
        "ioctl(TIOCSTI)": ("ioctl", nullfd, TIOCSTI, ctypes.byref(ch)),
        "ioctl(TIOCSTI|1<<32)": ("ioctl", nullfd, TIOCSTI | (1 << 32), ctypes.byref(ch)),
        "ioctl(TIOCLINUX)": ("ioctl", nullfd, TIOCLINUX, ctypes.byref(ch)),
        "ioctl(TIOCLINUX|1<<32)": ("ioctl", nullfd, TIOCLINUX | (1 << 32), ctypes.byref(ch)),
    }
    out = {}
    for label, (name, *args) in calls.items():
        out[label] = in_child(lambda name=name, args=args: raw_syscall(name, *args))
    # clone3 must fail with ENOSYS (not EPERM) so that glibc falls back to
    # clone(2), whose flags the filter can inspect.
    out["clone3"] = in_child(lambda: raw_syscall("clone3", null, 0))
    os.close(nullfd)
    return out


def allowed_syscalls():
    """Calls that are not escapes and that real programs make; informational."""
    return {
        "personality(query)": in_child(lambda: raw_syscall("personality", 0xFFFFFFFF)),
        "ioctl(TCGETS)": in_child(lambda: raw_syscall("ioctl", 1, 0x5401, ctypes.create_string_buffer(64))),
    }


# ---------------------------------------------------- allowed functionality


def square(x):
    return x * x


def check_threads():
    import threading

    results = [0] * 4

    def work(i):
        results[i] = sum(range(i * 1000, (i + 1) * 1000))

    ts = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(10)
    return {"results_ok": results == [sum(range(i * 1000, (i + 1) * 1000)) for i in range(4)]}


def check_subprocess():
    import subprocess

    p = subprocess.run(["/bin/sh", "-c", "echo ok"], capture_output=True, timeout=20)
    return {"returncode": p.returncode, "stdout": p.stdout.decode(errors="replace")}


def check_fork():
    pid = os.fork()
    if pid == 0:
        os._exit(7)
    _, status = os.waitpid(pid, 0)
    return {"exit_status": os.WEXITSTATUS(status) if os.WIFEXITED(status) else None}


def check_asyncio():
    import asyncio

    async def one(i):
        await asyncio.sleep(0.01)
        return i * 2

    async def main():
        return await asyncio.gather(*(one(i) for i in range(5)))

    return {"result": asyncio.run(main())}


def check_multiprocessing():
    import multiprocessing

    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(2) as pool:
        res = pool.map_async(square, range(10)).get(timeout=30)
    return {"result": res}


def check_tty():
    def go():
        fd = os.open("/dev/tty", os.O_RDWR)
        os.close(fd)
        return "opened"

    return attempt(go)


# ------------------------------------------------------------------- main


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--host-port", type=int)
    ap.add_argument("--abstract-socket")
    ap.add_argument("--secret-path", action="append", default=[])
    ap.add_argument("--inherited-fd", type=int, action="append", default=[])
    ap.add_argument("--skip-functional", action="store_true")
    args = ap.parse_args()

    report = {"probe_version": 1}
    checks = []

    def check(name, fn):
        checks.append((name, fn))

    report["fds"] = {str(k): v for k, v in _EARLY.get("fds", {}).items()}
    if "fds_error" in _EARLY:
        report["fds_error"] = _EARLY["fds_error"]

    check("pids", visible_pids)
    check("ids", lambda: {
        "uid": os.getuid(), "euid": os.geteuid(), "gid": os.getgid(),
        "egid": os.getegid(), "groups": os.getgroups(),
    })
    check("status", proc_status)
    check("hostname", socket.gethostname)
    check("cwd", os.getcwd)
    check("environ", lambda: dict(os.environ))
    check("python", lambda: {"executable": sys.executable, "version": sys.version.split()[0]})
    check("inherited_fds", lambda: {
        str(fd): attempt(lambda fd=fd: os.fstat(fd).st_mode) for fd in args.inherited_fd
    })
    check("mounts", mounts)

    reads = ["/etc/shadow", "/root", "/home", "/proc/1/root/etc/shadow",
             "/work", "/work/main", "/etc/pycell", "/var/lib", "/sys/fs/cgroup", "/boot"]
    reads += args.secret_path
    check("read", lambda: {p: read_path(p) for p in reads})
    check("read_allowed", lambda: {p: read_path(p) for p in ("/etc/passwd", "/usr/bin", "/proc/self/status")})

    check("write_denied", lambda: {
        p: write_path(p) for p in ("/usr/pycell-probe", "/pycell-probe", "/etc/pycell-probe",
                                   "/var/pycell-probe", "/dev/pycell-probe", "/proc/pycell-probe",
                                   "/usr/bin/pycell-probe")
    })
    check("write_existing_denied", lambda: {
        "/proc/sys/kernel/hostname": write_existing("/proc/sys/kernel/hostname", b"pycell"),
        "/etc/passwd": write_existing("/etc/passwd"),
        "/etc/hosts": write_existing("/etc/hosts"),
        "/proc/sysrq-trigger": write_existing("/proc/sysrq-trigger"),
        # Covered with /dev/null (the jail's own, which it may write): the
        # cover must not be writable. sysrq-trigger is missing on some kernels.
        "/proc/stat": write_existing("/proc/stat"),
        "/proc/uptime": write_existing("/proc/uptime"),
        "/proc/self/oom_score_adj": write_existing("/proc/self/oom_score_adj"),
        "/usr/bin/python3": write_existing("/usr/bin/python3"),
    })
    check("write_allowed", lambda: {
        p: write_path(p) for p in ("/workspace/probe-write", "/tmp/probe-write", "/dev/shm/probe-write")
    })
    check("dev_null_write", lambda: write_existing("/dev/null", b"x"))
    check("landlock", landlock_candidates)
    check("xattrs", xattrs)

    if args.host_port is not None:
        check("connect_host_loopback", lambda: tcp_connect("127.0.0.1", args.host_port))
    if args.abstract_socket:
        check("connect_host_abstract", lambda: abstract_connect(args.abstract_socket))
    check("dns", lambda: attempt(lambda: socket.getaddrinfo("example.net", 443)[0][4]))
    check("interfaces", interfaces)
    check("loopback_inside", loopback_inside)
    check("signal_init", lambda: attempt(lambda: os.kill(1, 0)))
    check("tty", check_tty)

    check("denied_syscalls", denied_syscalls)
    check("allowed_syscalls", allowed_syscalls)

    if not args.skip_functional:
        check("threads", lambda: attempt(check_threads))
        check("subprocess", lambda: attempt(check_subprocess))
        check("fork", lambda: attempt(check_fork))
        check("asyncio", lambda: attempt(check_asyncio))
        check("multiprocessing", lambda: attempt(check_multiprocessing))
        # After the children above are reaped, the pid view must be back to
        # just the sandbox's own processes.
        check("pids_after", visible_pids)

    errors = {}
    for name, fn in checks:
        try:
            report[name] = fn()
        except BaseException as e:  # noqa: BLE001
            report[name] = None
            errors[name] = "%s: %s\n%s" % (type(e).__name__, e, traceback.format_exc())
    report["check_errors"] = errors

    sys.stdout.write(json.dumps(report, sort_keys=True, default=repr))
    sys.stdout.write("\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
