# ---- Warm jails ------------------------------------------------------------
#
# Compiled when a warm jail or session starts (see _pycell_load). A warm
# jail imports its MODULEs (their output goes to stdout, stderr pointed
# there meanwhile) and writes READY, so that the jailer can tell warm-up
# output from the run's; then it waits on stdin for one run's work: a
# 4-byte big-endian length, that many bytes of JSON ({"path":
# "/workspace/NAME", "argv": [...], "code": "...", "images": {...}}), then
# the run's own stdin to its end. It serves exactly one run; the jail dies
# with it.


def _pycell_run_warm(modules):
    _pycell_warm_up(modules)
    import gc

    # Everything warm-up made stays (and is never scanned by the collector
    # again); what the run makes is told apart by its generation at exit.
    gc.collect()
    gc.freeze()
    _pycell_serve_one()


def _pycell_zygote(modules):
    """A zygote: warm up (the jailer sees READY: the zygote is ready),
    then clone one jail per request on the zygote's channel, in
    libpycell_zygote (pycell_jailer::zygote), whose program comes back
    here, every layer applied. The zygote itself never runs a request's
    code: it sees none."""
    import ctypes
    import gc
    import os
    import signal
    import sys

    # PyDLL: the GIL stays held across the calls (the zygote has one
    # thread). The library is a memfd its jailer made: /proc/self/fd/N.
    lib_path = os.environ.pop("PYCELL_ZYGOTE_LIB")
    lib = ctypes.PyDLL(lib_path)
    os.close(int(lib_path.rsplit("/", 1)[1]))
    channel = int(os.environ.pop("PYCELL_ZYGOTE_FD"))
    _pycell_warm_up(modules)
    gc.collect()
    gc.freeze()
    # Each child exits as soon as it has made its run's init: the kernel
    # reaps it (the child puts SIGCHLD back to its default at once).
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)
    while True:
        got = lib.pycell_zygote_receive(channel)
        if got == 0:
            os._exit(0)
        if got < 0:
            continue
        sys.stdout.flush()
        sys.stderr.flush()
        if lib.pycell_zygote_fork() == 1:
            break
    _pycell_reseed()
    _pycell_seed_matplotlib()
    os.write(1, b"\0pycell-warm-ready\0")
    _pycell_serve_one()


def _pycell_reseed():
    """A run must not draw the zygote's random numbers or share its
    secrets: `random`'s and numpy's global generators, seeded when they
    were imported, are reseeded here from the kernel (the clone was not
    python's os.fork, which would have reseeded `random` itself);
    multiprocessing's authkey, drawn when it was imported, is drawn again;
    tempfile's name generator starts over (it would only notice a new pid,
    and the run's pid in its own namespace may be the zygote's). What
    stays shared is listed in docs/threat-model.md."""
    import os
    import sys

    random = sys.modules.get("random")
    if random is not None:
        random.seed()
    np_random = sys.modules.get("numpy.random")
    if np_random is not None:
        np_random.seed()
    mp_process = sys.modules.get("multiprocessing.process")
    if mp_process is not None:
        mp_process.current_process().authkey = os.urandom(32)
    tempfile = sys.modules.get("tempfile")
    if tempfile is not None:
        tempfile._name_sequence = None


def _pycell_serve_one():
    """Wait for one run's work on stdin and run it; never returns."""
    import json

    frame = _pycell_read_frame_bytes(0)
    if frame is None:
        # Nobody will send work any more: the member was retired.
        import os

        os._exit(0)
    work = json.loads(frame)
    code = work["code"].encode()
    with open(work["path"], "wb") as f:
        f.write(code)
    _pycell_exit(*_pycell_serve_run(work, code))


def _pycell_exit(status, interrupted):
    """Python's shutdown, up to what a script can observe: non-daemon
    threads joined, atexit handlers run, the script's objects collected
    (their __del__ run, its unclosed files flushed and closed), every file
    it left open flushed, stdout and stderr flushed (120 if that fails);
    then exit, without tearing down the modules warm-up imported (which
    only costs time), or, after a KeyboardInterrupt, death by SIGINT."""
    import atexit
    import gc
    import io
    import os
    import sys

    threading = sys.modules.get("threading")
    if threading is not None:
        threading._shutdown()
    atexit._run_exitfuncs()
    sys.last_type = sys.last_value = sys.last_traceback = sys.last_exc = None
    sys.modules.pop("__main__", None)
    gc.collect()
    for generation in range(3):
        for obj in gc.get_objects(generation):
            if isinstance(obj, io.IOBase) and not obj.closed and obj.writable():
                try:
                    obj.flush()
                except Exception:
                    pass
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:
                stream.flush()
        except Exception:
            status = 120
    if interrupted:
        import signal

        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    os._exit(status)


def _pycell_warm_up(modules):
    import importlib
    import os

    saved_stderr = os.dup(2)
    os.dup2(1, 2)
    try:
        for name in modules:
            importlib.import_module(name)
    finally:
        import sys

        sys.stderr.flush()
        os.dup2(saved_stderr, 2)
        os.close(saved_stderr)
    # The first json.loads and compile cost a millisecond: pay it now.
    import json

    json.loads('{"a": ["b"]}')
    compile(b"pass\n", "<warm-up>", "exec", dont_inherit=True)
    os.write(1, b"\0pycell-warm-ready\0")


def _pycell_read_exactly(fd, n):
    """`n` bytes from `fd`, or None if it ends first."""
    import os

    chunks = []
    while n > 0:
        chunk = os.read(fd, min(n, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def _pycell_read_frame_bytes(fd):
    """The next frame's bytes on `fd`, or None if it ends first."""
    head = _pycell_read_exactly(fd, 4)
    return head and _pycell_read_exactly(fd, int.from_bytes(head, "big"))
