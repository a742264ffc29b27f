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
# too (atexit handlers, flushing, finalization), and no frame of this file
# may show in the run's tracebacks.


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
    import builtins
    import json
    import sys
    import types
    from importlib.machinery import SourceFileLoader

    _pycell_warm_up(sys.argv[1:])
    head = _pycell_read_exactly(4)
    work = json.loads(_pycell_read_exactly(int.from_bytes(head, "big")))
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
    except SystemExit:
        raise
    except BaseException as e:
        _pycell_uncaught(e)


def _pycell_uncaught(e):
    """What the interpreter does with an exception that ends `python SCRIPT`:
    the hook prints it (without this file's frames), exit status 1, or
    death by SIGINT for a KeyboardInterrupt, after the usual shutdown."""
    import sys

    tb = e.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename == "<string>":
        tb = tb.tb_next
    e.__traceback__ = tb
    sys.last_type, sys.last_value, sys.last_traceback = type(e), e, tb
    sys.last_exc = e
    sys.excepthook(type(e), e, tb)
    if isinstance(e, KeyboardInterrupt):
        _pycell_die_of_sigint()
    raise SystemExit(1) from None


def _pycell_die_of_sigint():
    """As python does after an uncaught KeyboardInterrupt: shut down (the
    atexit handlers, flushing), then die of SIGINT, so that whoever waits
    sees the signal."""
    import atexit
    import os
    import signal
    import sys

    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGINT)


_pycell_run()
