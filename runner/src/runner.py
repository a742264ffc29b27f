# pycell's runner: every python run and session starts on this file's text.
#
#   python -s -c RUNNER --pycell-run          a cold run: its work is on stdin
#   python -s -c RUNNER [MODULE ...]          a warm jail: imports the MODULEs,
#                                             says READY, then waits for work
#   python -s -c RUNNER --pycell-session ...  a session (see session.py)
#
# A run's stdin carries a 4-byte big-endian length, that many bytes of JSON
# ({"path": "/workspace/NAME", "argv": [...], "code": "...", "images": {...}};
# code null: the script is at path already), then the run's own stdin to its
# end. The runner runs the code as
# `python -s SCRIPT ARG...` would run it. Everything a warm jail's imports
# print goes to stdout (stderr is pointed there meanwhile) and ends with
# READY, so that the jailer can tell warm-up output from the run's.
#
# When the code is done, the figures it left open (matplotlib) and the PNG
# or JPEG files it wrote come back to the jailer as one frame (the same
# framing, JSON) on stdin, which is then a socket (if the run closed or
# replaced its stdin, they do not): see _pycell_send_images.
# Nothing else of the runner runs after the run's code but what
# `python SCRIPT` runs too (atexit handlers, flushing, collecting the
# script's objects; see _pycell_exit), and no frame of this file may show
# in the run's tracebacks.
#
# Only this part is compiled when python starts (it costs a cold run about
# a millisecond); the parts in _PYCELL_PARTS (images, sessions) are
# compiled the first time they are needed.


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
    _pycell_load("images")
    os.write(1, b"\0pycell-warm-ready\0")


def _pycell_load(part):
    """Compile and define one of _PYCELL_PARTS, once."""
    code = _PYCELL_PARTS.pop(part, None)
    if code is not None:
        exec(compile(code, "<string>", "exec", dont_inherit=True), globals())


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


def _pycell_write_frame(fd, obj):
    import json
    import os

    body = json.dumps(obj, separators=(",", ":")).encode()
    data = len(body).to_bytes(4, "big") + body
    while data:
        data = data[os.write(fd, data):]


def _pycell_run(warm_modules):
    """Serve one run: after warming up, if this is a warm jail."""
    if warm_modules is not None:
        _pycell_warm_up(warm_modules)
        import gc

        # Everything warm-up made stays (and is never scanned by the
        # collector again); what the run makes is told apart by its
        # generation at exit.
        gc.collect()
        gc.freeze()
    frame = _pycell_read_frame_bytes(0)
    if frame is None:
        # Nobody will send work any more: the member was retired.
        import os

        os._exit(0)
    # The way back for the images is stdin itself, if the run leaves it
    # there (no descriptor of the runner's own is open while it runs).
    stdin = _pycell_identity(0)
    work, code, before = _pycell_begin(frame)
    status, interrupted = _pycell_main(work, code)
    if _pycell_identity(0) == stdin:
        _pycell_send_images(0, work, before)
    _pycell_exit(status, interrupted)


def _pycell_identity(fd):
    import os

    try:
        st = os.fstat(fd)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _pycell_begin(frame):
    """The work, and its script's text: written to its path, or there
    already (a cold run's, written with the jail); and the image files
    there before it runs, if images are asked for."""
    import json

    work = json.loads(frame)
    if work["code"] is None:
        with open(work["path"], "rb") as f:
            code = f.read()
    else:
        code = work["code"].encode()
        with open(work["path"], "wb") as f:
            f.write(code)
    return work, code, work.get("images") and _pycell_image_files()


def _pycell_main(work, code):
    """Run the work as `python -s SCRIPT ARG...` runs a script; its exit
    status, and whether it ended by an uncaught KeyboardInterrupt."""
    import builtins
    import sys
    import types
    from importlib.machinery import SourceFileLoader

    path, argv = work["path"], work["argv"]
    sys.argv = [path] + argv
    sys.orig_argv = [sys.orig_argv[0], "-s"] + sys.argv
    sys.path[0] = path.rpartition("/")[0]
    main = types.ModuleType("__main__")
    if "__annotations__" in vars(sys.modules["__main__"]):
        main.__annotations__ = {}
    main.__file__ = path
    main.__cached__ = None
    main.__builtins__ = builtins
    main.__loader__ = SourceFileLoader("__main__", path)
    sys.modules["__main__"] = main
    try:
        exec(compile(code, path, "exec", dont_inherit=True), main.__dict__)
    except SystemExit as e:
        return _pycell_exit_status(e.code), False
    except BaseException as e:
        _pycell_uncaught(e)
        return 1, isinstance(e, KeyboardInterrupt)
    return 0, False


_PYCELL_WORKSPACE = "/workspace"
_PYCELL_IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg")
_PYCELL_SCAN_LIMIT = 10000


def _pycell_snapshot(only=None):
    """(size, mtime_ns, inode) of every regular file under /workspace whose
    name ends with one of `only` (all if None), up to a bound; symlinks are
    not followed."""
    import os
    import stat

    seen = {}
    stack = [_PYCELL_WORKSPACE]
    while stack and len(seen) < _PYCELL_SCAN_LIMIT:
        top = stack.pop()
        try:
            entries = list(os.scandir(top))
        except OSError:
            continue
        for entry in entries:
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            if stat.S_ISDIR(st.st_mode):
                stack.append(entry.path)
            elif stat.S_ISREG(st.st_mode) and (
                only is None or entry.name.lower().endswith(only)
            ):
                seen[entry.path] = (st.st_size, st.st_mtime_ns, st.st_ino)
    return seen


def _pycell_image_files():
    return _pycell_snapshot(_PYCELL_IMAGE_SUFFIXES)


def _pycell_send_images(fd, work, before):
    """Send the jailer the figures the run left open and the image files it
    wrote, scaled down (nothing if there are none, or images were not
    asked for). Whatever goes wrong here is the run's own doing: it is
    not reported."""
    import sys

    limits = work.get("images")
    if limits is None:
        return
    try:
        plt = sys.modules.get("matplotlib.pyplot")
        figures = plt is not None and plt.get_fignums()
        after = _pycell_image_files()
        written = sorted(p for p, s in after.items() if before.get(p) != s)
        if not figures and not written:
            return
        _pycell_load("images")
        _pycell_write_frame(fd, _pycell_run_images(written, limits))
    except BaseException:
        pass


def _pycell_exit_status(code):
    """The status of `raise SystemExit(code)`, as python computes it."""
    import sys

    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    try:
        sys.stderr.write(str(code) + "\n")
    except Exception:
        pass
    return 1


def _pycell_uncaught(e):
    """Print an exception that ends the script as python does: through
    sys.excepthook, without this file's frames."""
    import sys

    tb = e.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename == "<string>":
        tb = tb.tb_next
    e.__traceback__ = tb
    sys.last_type, sys.last_value, sys.last_traceback = type(e), e, tb
    sys.last_exc = e
    sys.excepthook(type(e), e, tb)


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


def _pycell_start():
    import sys

    mode = sys.argv[1:2]
    if mode == ["--pycell-session"]:
        _pycell_load("images")
        _pycell_load("session")
        _pycell_session(sys.argv[2:])
    elif mode == ["--pycell-run"]:
        _pycell_run(None)
    else:
        _pycell_run(sys.argv[1:])
