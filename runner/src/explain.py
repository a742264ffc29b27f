# Naming the sandbox layer behind an exception that ends a run or a cell:
# one line added after its traceback, so that the model reading it can
# tell a refusal from a bug (docs/refusals.md). The runner is inside the
# jail, so this is a courtesy to the reader; the result's `refusals` come
# from the host. Compiled only when an exception ends a run or a cell.


def _pycell_refusal_line(e):
    """`pycell: ...` naming the layer that most likely refused what raised
    `e` (or what caused it), and what to do instead; None if none did."""
    for _ in range(8):
        if e is None or isinstance(e, KeyboardInterrupt):
            return None
        try:
            line = _pycell_refusal_of(e)
        except Exception:
            line = None
        if line:
            return "pycell: %s (docs/refusals.md)\n" % line
        e = e.__cause__ or e.__context__
    return None


def _pycell_refusal_of(e):
    import errno

    if isinstance(e, MemoryError):
        return _PYCELL_REFUSALS["memory"]
    if isinstance(e, RuntimeError) and "can't start new thread" in str(e):
        return _PYCELL_REFUSALS["pids"]
    if not isinstance(e, OSError):
        return None
    if _pycell_is_name_error(e):
        return _pycell_network("the name did not resolve")
    n = e.errno
    if n == errno.EAGAIN and _pycell_in_frames(e, ("fork", "_execute_child", "start_new_thread")):
        return _PYCELL_REFUSALS["pids"]
    if n in (errno.ENETUNREACH, errno.EHOSTUNREACH):
        return _pycell_network("there is no route from here")
    key = {
        errno.EACCES: "landlock",
        errno.EROFS: "read_only",
        errno.EPERM: "seccomp",
        errno.ENOSYS: "enosys",
        errno.ENOSPC: "disk",
        errno.EDQUOT: "disk",
        errno.EFBIG: "file_size",
        errno.EMFILE: "open_files",
    }.get(n)
    if key is None:
        return None
    line = _PYCELL_REFUSALS[key]
    path = getattr(e, "filename", None)
    if isinstance(path, (str, bytes)) and key in ("landlock", "read_only"):
        line = line.replace("this path", repr(path)[:200])
    return line


def _pycell_is_name_error(e):
    import sys

    socket = sys.modules.get("socket")
    return socket is not None and isinstance(e, socket.gaierror)


def _pycell_in_frames(e, names):
    tb = e.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_name in names:
            return True
        tb = tb.tb_next
    return False


def _pycell_network(what):
    import os

    if os.environ.get("HTTPS_PROXY") or os.environ.get("https_proxy"):
        return (
            "the sandbox reaches the network only through pycell's egress proxy (layer egress, rule "
            "network.allow), and %s: use an HTTP client that honours HTTPS_PROXY (requests, httpx "
            "and urllib do) and a host the policy allows" % what
        )
    return (
        "this sandbox has no network (layer egress, rule the policy's network mode), and %s: "
        "work with the files you were given, or ask for a policy whose network allows the host" % what
    )


_PYCELL_REFUSALS = {
    "memory": "the memory limit refused an allocation (layer memory, rule limits.memory): use less "
    "memory (process the data in chunks, free what is done), or ask for a higher memory limit",
    "pids": "the pids limit refused a new process or thread (layer pids, rule limits.pids): start "
    "fewer processes or threads (a smaller pool), or ask for a higher pids limit",
    "landlock": "the sandbox refused access to this path (layer landlock, or the file's own "
    "permissions): it may read the policy's paths and write only /workspace, /tmp and /dev/shm; "
    "work under /workspace, or ask for a policy that grants the path",
    "read_only": "this path is read-only in the sandbox (layer landlock: the policy's mounts are "
    "read-only): write under /workspace, /tmp or /dev/shm instead",
    "seccomp": "the sandbox refused this operation (layer seccomp, rule pycell's fixed profile, or a "
    "capability no sandbox has): it is not available here; do it another way",
    "enosys": "this system call is not available in the sandbox (layer seccomp, rule pycell's fixed "
    "profile): use another API",
    "disk": "the disk budget is full (layer disk, rule limits.disk: /workspace, /tmp and /dev/shm "
    "together): write less, delete temporary files as you go, or ask for a larger disk limit",
    "file_size": "a file grew past the file size limit (layer rlimit, rule limits.file_size): write "
    "smaller files (split or compress them)",
    "open_files": "the process has as many files open as it may (layer rlimit, rule "
    "limits.open_files): close files you are done with",
}
