# pycell's warm runner. A warm jail starts its python on this file's text
# (`python -s -c RUNNER [MODULE ...]`) before any request exists: it imports
# the MODULEs, says it is ready, and waits on stdin for one piece of work,
# which it runs as `python -s SCRIPT ARG...` would run it. It serves exactly
# one run; the jail dies with it.
#
# stdin carries: a 4-byte big-endian length, that many bytes of JSON
# ({"path": "/workspace/NAME", "argv": [...], "code": "..."}), then the
# run's own stdin to its end. Everything the imports print goes to stdout
# (stderr is pointed there meanwhile) and ends with READY, so that the
# jailer can tell warm-up output from the run's.
#
# Nothing here may run after the run's code but what `python SCRIPT` runs
# too (atexit handlers, flushing, collecting the script's objects; see
# _pycell_exit), and no frame of this file may show in the run's tracebacks.


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


def _pycell_read_exactly(n):
    import os

    chunks = []
    while n > 0:
        chunk = os.read(0, min(n, 1 << 20))
        if not chunk:
            # Nobody will send work any more (the member was retired).
            os._exit(0)
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def _pycell_run():
    import sys

    _pycell_warm_up(sys.argv[1:])
    import gc

    # Everything warm-up made stays (and is never scanned by the collector
    # again); what the run makes is told apart by its generation at exit.
    gc.collect()
    gc.freeze()
    head = _pycell_read_exactly(4)
    status, interrupted = _pycell_main(_pycell_read_exactly(int.from_bytes(head, "big")))
    _pycell_exit(status, interrupted)


def _pycell_main(frame):
    """Run the work as `python -s SCRIPT ARG...` runs a script; its exit
    status, and whether it ended by an uncaught KeyboardInterrupt."""
    import builtins
    import json
    import sys
    import types
    from importlib.machinery import SourceFileLoader

    work = json.loads(frame)
    path, argv, code = work["path"], work["argv"], work["code"].encode()
    with open(path, "wb") as f:
        f.write(code)
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


_pycell_run()
