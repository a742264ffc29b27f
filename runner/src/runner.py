# pycell's runner: every python run and session starts on this file's text.
#
#   python -s -c RUNNER --pycell-run EDGE BYTES CHARS TOTAL COUNT SCRIPT ARG...
#       a cold run: runs SCRIPT (already in /workspace) as `python -s SCRIPT
#       ARG...` would, its stdin the run's own
#   python -s -c RUNNER [MODULE ...]
#       a warm jail: imports the MODULEs, says READY, then waits for one
#       run's work on stdin (see warm.py)
#   python -s -c RUNNER --pycell-session [MODULE ...]
#       a session (see session.py)
#
# When a run's code is done, the figures it left open (matplotlib) and the
# PNG or JPEG files it wrote come back to the jailer as one frame (a 4-byte
# big-endian length, then JSON) on stdin, which is a socket (if the run
# closed or replaced its stdin, they do not), scaled to at most EDGE pixels
# a side and BYTES together, with what it showed through display() (each
# text part at most CHARS characters, all at most TOTAL bytes, at most
# COUNT displays): see _pycell_serve_run. Nothing else of the
# runner runs after the run's code but what `python SCRIPT` runs too
# (atexit handlers, flushing, collecting the script's objects: a cold run
# ends through the interpreter's own exit, a warm one see _pycell_exit),
# and no frame of this file may show in the run's tracebacks.
#
# Only this part is compiled when python starts (a cold run pays about a
# millisecond for it); the parts in _PYCELL_PARTS (warm, images, display,
# session, explain) are compiled when first needed; "tools" (code mode's `pycell_tools`) is
# the text of a module of its own, compiled at its first import.


def _pycell_load(part):
    """Compile and define one of _PYCELL_PARTS, once."""
    code = _PYCELL_PARTS.pop(part, None)
    if code is not None:
        exec(compile(code, "<string>", "exec", dont_inherit=True), globals())


def _pycell_run_cold(argv):
    """A cold run: its script is in the jail already, its stdin is its own.
    It ends as `python SCRIPT` ends: through the interpreter's own exit."""
    edge, budget, chars, total, count, path = argv[:6]
    work = {
        "path": path,
        "argv": argv[6:],
        "images": {"max_edge": int(edge), "max_bytes": int(budget)},
        "displays": {"part_chars": int(chars), "total_bytes": int(total), "count": int(count)},
    }
    with open(path, "rb") as f:
        code = f.read()
    status, interrupted = _pycell_serve_run(work, code)
    if interrupted:
        # python's own end after an uncaught KeyboardInterrupt (shutdown,
        # then death by SIGINT); the traceback was printed already.
        import sys

        sys.excepthook = lambda *exc: None
        raise KeyboardInterrupt
    raise SystemExit(status)


_PYCELL_CLOCK_REALTIME_COARSE = 5


def _pycell_serve_run(work, code):
    """Run the work and send its images back; its exit status, and whether
    it ended by an uncaught KeyboardInterrupt."""
    import time

    # The way back for the images is stdin itself, if the run leaves it
    # there (no descriptor of the runner's own is open while it runs).
    stdin = _pycell_identity(0)
    # The coarse clock, which file systems stamp modification times with
    # (or with a finer, later time): a file written right after this has an
    # mtime at or after it, which the fine clock would not promise.
    started = time.clock_gettime_ns(_PYCELL_CLOCK_REALTIME_COARSE)
    _pycell_offer_display(work.get("displays"))
    status, interrupted = _pycell_main(work, code)
    limits = work.get("images")
    shown = _PYCELL_SHOWN["displays"] or _PYCELL_SHOWN["omitted"]
    try:
        if limits and _pycell_identity(0) == stdin and (shown or _pycell_made_images(started)):
            _pycell_load("images")
            _pycell_send_images(0, limits, started)
    except BaseException:
        # Whatever goes wrong here is the run's own doing (it closed its
        # figures' backend, filled its disk): it is not reported.
        pass
    return status, interrupted


# What display() kept for the result (see display.py).
_PYCELL_SHOWN = {"limits": None, "displays": [], "omitted": 0, "bytes": 0}


def _pycell_offer_display(limits):
    """display(*objs) as a builtin, as IPython has it, when the result
    takes displays (`limits`: see display.py)."""
    import builtins

    if limits:
        _PYCELL_SHOWN["limits"] = limits
        builtins.display = _pycell_display_builtin


def _pycell_display_builtin(*objs, **options):
    """Show each object in the result, as a notebook's display() does:
    its richest form (markdown, HTML, JSON, an image) as well as its text,
    within the policy's [output] bounds. Options are accepted and ignored."""
    _pycell_load("display")
    _pycell_show(objs)


_pycell_display_builtin.__name__ = _pycell_display_builtin.__qualname__ = "display"


def _pycell_identity(fd):
    import os

    try:
        st = os.fstat(fd)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _pycell_main(work, code):
    """Run the work as `python -s SCRIPT ARG...` runs a script; its exit
    status, and whether it ended by an uncaught KeyboardInterrupt."""
    import builtins
    import sys

    # As python has them at start: importing `types` or
    # `importlib.machinery` would cost a cold run most of a millisecond.
    SourceFileLoader = sys.modules["_frozen_importlib_external"].SourceFileLoader
    path, argv = work["path"], work["argv"]
    sys.argv = [path] + argv
    sys.orig_argv = [sys.orig_argv[0], "-s"] + sys.argv
    sys.path[0] = path.rpartition("/")[0]
    main = type(sys)("__main__")
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


def _pycell_walk(suffixes=None):
    """(path, stat) of each regular file under /workspace whose name ends
    with one of `suffixes` (any if None), among its first 10,000 entries;
    symlinks are not followed."""
    import os
    import stat

    stack, seen = [_PYCELL_WORKSPACE], 0
    while stack and seen < _PYCELL_SCAN_LIMIT:
        try:
            entries = list(os.scandir(stack.pop()))
        except OSError:
            continue
        for entry in entries[: _PYCELL_SCAN_LIMIT - seen]:
            seen += 1
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            if stat.S_ISDIR(st.st_mode):
                stack.append(entry.path)
            elif stat.S_ISREG(st.st_mode) and (
                suffixes is None or entry.name.lower().endswith(suffixes)
            ):
                yield entry.path, st


def _pycell_images_since(started):
    """The PNG and JPEG files written since `started` (ns), sorted."""
    found = _pycell_walk(_PYCELL_IMAGE_SUFFIXES)
    return sorted(p for p, st in found if st.st_mtime_ns >= started)


def _pycell_made_images(started):
    """Whether the run left a figure open or wrote an image file."""
    import sys

    plt = sys.modules.get("matplotlib.pyplot")
    return bool(plt is not None and plt.get_fignums()) or bool(_pycell_images_since(started))


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

    tb = _pycell_user_frames(e.__traceback__)
    e.__traceback__ = tb
    sys.last_type, sys.last_value, sys.last_traceback = type(e), e, tb
    sys.last_exc = e
    sys.excepthook(type(e), e, tb)
    _pycell_explain(e, sys.stderr.write)


def _pycell_user_frames(tb):
    """The traceback `tb` without the runner's frames: those before the
    program's (all in "<string>"), and its functions between them
    (display() called by the program)."""
    while tb is not None and tb.tb_frame.f_code.co_filename == "<string>":
        tb = tb.tb_next
    kept = []
    while tb is not None:
        code = tb.tb_frame.f_code
        if not (code.co_filename == "<string>" and code.co_name.startswith("_pycell")):
            kept.append(tb)
        tb = tb.tb_next
    for this, after in zip(kept, kept[1:] + [None]):
        this.tb_next = after
    return kept[0] if kept else None


def _pycell_explain(e, write):
    """After a traceback: the line that names the sandbox layer behind it,
    if one refused what raised it (see explain.py)."""
    try:
        _pycell_load("explain")
        line = _pycell_refusal_line(e)
        if line:
            write(line)
    except BaseException:
        pass


def _pycell_offer_tools():
    """Code mode: `import pycell_tools` serves the tool channel the jail
    gave this process (its number in PYCELL_TOOLS_FD), kept on a
    descriptor no child process inherits; the module's text (the "tools"
    part) is compiled at the first import."""
    import os
    import sys

    fd = os.environ.pop("PYCELL_TOOLS_FD", None)
    if fd is None:
        return
    kept = os.dup(int(fd))
    os.close(int(fd))
    source = _PYCELL_PARTS.pop("tools")
    bootstrap = sys.modules["_frozen_importlib"]

    class PycellTools:
        @staticmethod
        def find_spec(name, path=None, target=None):
            if name == "pycell_tools":
                return bootstrap.ModuleSpec(name, PycellTools, origin="pycell")
            return None

        @staticmethod
        def create_module(spec):
            return None

        @staticmethod
        def exec_module(module):
            exec(compile(source, "<pycell_tools>", "exec", dont_inherit=True), vars(module))
            module._connect(kept)

    sys.meta_path.append(PycellTools)


def _pycell_seed_matplotlib():
    """An env built with matplotlib's font cache has it copied where
    matplotlib looks (MPLCONFIGDIR, which must be writable), so that no run
    rebuilds it (see pycell_deps::fonts)."""
    import os

    cache = os.environ.get("PYCELL_MATPLOTLIB_CACHE")
    config = os.environ.get("MPLCONFIGDIR")
    if not cache or not config:
        return
    try:
        os.makedirs(config, exist_ok=True)
        for name in os.listdir(cache):
            with open(os.path.join(cache, name), "rb") as src:
                with open(os.path.join(config, name), "xb") as dst:
                    dst.write(src.read())
    except OSError:
        pass


def _pycell_start():
    import sys

    _pycell_seed_matplotlib()
    _pycell_offer_tools()
    mode = sys.argv[1:2]
    if mode == ["--pycell-run"]:
        _pycell_run_cold(sys.argv[2:])
        return
    for part in ("warm", "images", "display", "session"):
        _pycell_load(part)
    if mode == ["--pycell-session"]:
        _pycell_session(sys.argv[2:])
    elif mode == ["--pycell-zygote"]:
        _pycell_zygote(sys.argv[2:])
    else:
        _pycell_run_warm(sys.argv[1:])
