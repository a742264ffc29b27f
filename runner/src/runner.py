# pycell's warm runner. A warm jail starts its python on this file's text
# (`python -s -c RUNNER [MODULE ...]`) before any request exists: it imports
# the MODULEs, says it is ready, and waits on stdin for one piece of work,
# which it runs as `python -s SCRIPT ARG...` would run it. It serves exactly
# one run; the jail dies with it. A session's jail starts it as
# `python -s -c RUNNER --pycell-session [MODULE ...]` instead: see Sessions
# below.
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


def _pycell_read_work_frame():
    """The work frame on stdin; exit if it never comes (nobody will send
    work any more: the member was retired)."""
    import os

    head = _pycell_read_exactly(0, 4)
    frame = head and _pycell_read_exactly(0, int.from_bytes(head, "big"))
    if frame is None:
        os._exit(0)
    return frame


def _pycell_run():
    import sys

    _pycell_warm_up(sys.argv[1:])
    import gc

    # Everything warm-up made stays (and is never scanned by the collector
    # again); what the run makes is told apart by its generation at exit.
    gc.collect()
    gc.freeze()
    status, interrupted = _pycell_main(_pycell_read_work_frame())
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


# ---- Sessions -------------------------------------------------------------
#
# `python -s -c RUNNER --pycell-session [MODULE ...]`: after warm-up and
# READY, stdin is the session's channel (a socket to the jailer; the
# program's own stdin becomes /dev/null). On it come requests, one frame
# each (4-byte big-endian length, JSON), and for each a reply goes back the
# same way: cells run in one persistent __main__, as a REPL runs them, and
# files are written, read and listed in /workspace. The program's output
# goes to stdout and stderr as in a run; stdout and stderr are flushed
# before a reply, so a cell's output is in the jailer's pipes before its
# result. SIGINT (the jailer's per-cell timeout) raises KeyboardInterrupt in
# a cell and is ignored between cells.

_PYCELL_WORKSPACE = "/workspace"


def _pycell_session(modules):
    import os
    import signal

    _pycell_warm_up(modules)
    channel = _pycell_take_stdin()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    main = _pycell_session_main()
    state = {"cells": 0}
    while True:
        request = _pycell_read_frame(channel)
        if request is None:
            os._exit(0)
        reply = _pycell_serve(main, state, request)
        _pycell_flush_std()
        _pycell_write_frame(channel, reply)


def _pycell_take_stdin():
    """The channel, moved off fd 0 to a descriptor closed on exec; fd 0
    becomes /dev/null, so that code reading stdin sees its end."""
    import fcntl
    import os

    channel = fcntl.fcntl(0, fcntl.F_DUPFD_CLOEXEC, 100)
    null = os.open("/dev/null", os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    return channel


def _pycell_session_main():
    """A fresh __main__, as the interactive interpreter has it."""
    import builtins
    import sys
    import types

    main = types.ModuleType("__main__")
    main.__builtins__ = builtins
    sys.modules["__main__"] = main
    sys.argv = [""]
    sys.path[0] = ""
    return main


def _pycell_read_frame(fd):
    """The next request on the session's channel (JSON), or None at its end."""
    import json

    head = _pycell_read_exactly(fd, 4)
    body = head and _pycell_read_exactly(fd, int.from_bytes(head, "big"))
    return None if body is None else json.loads(body)


def _pycell_write_frame(fd, obj):
    import json
    import os

    body = json.dumps(obj, separators=(",", ":")).encode()
    data = len(body).to_bytes(4, "big") + body
    while data:
        data = data[os.write(fd, data):]


def _pycell_flush_std():
    import sys

    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:
                stream.flush()
        except Exception:
            pass


def _pycell_serve(main, state, request):
    op = request.get("op")
    try:
        if op == "cell":
            state["cells"] += 1
            reply = _pycell_cell(main, state["cells"], request)
        elif op == "write":
            reply = _pycell_write_file(request)
        elif op == "read":
            reply = _pycell_read_file(request)
        elif op == "list":
            reply = _pycell_list_files(request)
        else:
            reply = {"refused": "unknown request %r" % (op,)}
    except _PycellRefusal as e:
        reply = {"refused": str(e)}
    return reply


class _PycellRefusal(Exception):
    """A request the session cannot serve as asked (a path outside the
    workspace, a file too big): told to the caller, the session goes on."""


def _pycell_cell(main, number, request):
    """Run a cell's code in `main`; the value of a last expression, or the
    exception, as a REPL shows them."""
    import signal

    code = request["code"]
    limits = request.get("limits", {})
    name = "<cell %d>" % number
    before = _pycell_snapshot()
    value, error = None, None
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGXCPU, _pycell_cpu_allowance_reached)
    try:
        value = _pycell_exec_cell(main, code, name)
    except BaseException as e:
        error = e
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGXCPU, signal.SIG_IGN)
    _pycell_flush_std()
    reply = {"cell": number}
    if error is not None:
        reply["error"] = _pycell_describe_error(error)
    elif value is not None:
        text = _pycell_repr(value)
        cap = limits.get("value_chars", 16384)
        reply["value"] = text[:cap]
        reply["value_truncated"] = len(text) > cap
    figures = _pycell_save_figures(number)
    reply.update(_pycell_changes(before, limits))
    reply["images"], reply["images_omitted"] = _pycell_images(
        figures, reply["files"], limits
    )
    return reply


def _pycell_cpu_allowance_reached(signum, frame):
    raise KeyboardInterrupt("the cell used up its CPU time allowance")


def _pycell_exec_cell(main, code, name):
    import ast
    import linecache

    linecache.cache[name] = (len(code), None, code.splitlines(True), name)
    try:
        tree = ast.parse(code, name, "exec")
    except SyntaxError as e:
        # Shown as python shows one: the cell's line, not the parser's frames.
        raise e.with_traceback(None) from None
    last = None
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        last = ast.Expression(tree.body.pop().value)
    exec(compile(tree, name, "exec", dont_inherit=True), main.__dict__)
    if last is None:
        return None
    value = eval(compile(last, name, "eval", dont_inherit=True), main.__dict__)
    if value is not None:
        main.__dict__["_"] = value
    return value


def _pycell_repr(value):
    try:
        return repr(value)
    except BaseException as e:
        return "<repr failed: %s: %s>" % (type(e).__name__, e)


def _pycell_describe_error(e):
    """The exception with its traceback, without the runner's frames."""
    import traceback

    tb = e.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename == "<string>":
        tb = tb.tb_next
    try:
        text = "".join(traceback.format_exception(type(e), e, tb))
    except BaseException:
        text = "<the traceback could not be formatted>"
    try:
        message = str(e)
    except BaseException:
        message = "<str failed>"
    return {
        "type": type(e).__name__,
        "message": _pycell_clip(message, _PYCELL_ERROR_CHARS),
        "traceback": _pycell_clip(text, _PYCELL_ERROR_CHARS),
    }


# What an error's message and traceback may take of a reply, each.
_PYCELL_ERROR_CHARS = 32768


def _pycell_clip(text, cap):
    if len(text) <= cap:
        return text
    half = cap // 2
    return text[:half] + "\n[... %d characters cut ...]\n" % (len(text) - cap) + text[-half:]


# ---- Files in /workspace ----------------------------------------------------


def _pycell_parts(path):
    """The components of `path` below /workspace; refused if it leaves it."""
    if not isinstance(path, str) or "\0" in path:
        raise _PycellRefusal("a path must be a string without NUL bytes")
    rel = path
    if path.startswith("/"):
        prefix = _PYCELL_WORKSPACE + "/"
        if path == _PYCELL_WORKSPACE:
            rel = ""
        elif path.startswith(prefix):
            rel = path[len(prefix):]
        else:
            raise _PycellRefusal(
                "%r is outside /workspace: give a path relative to it, or under it" % path
            )
    parts = [p for p in rel.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise _PycellRefusal("%r: '..' is not allowed; paths stay inside /workspace" % path)
    return parts


def _pycell_open_dir(parts, create=False):
    """A descriptor of /workspace/<parts...>, no component a symlink."""
    import os

    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(_PYCELL_WORKSPACE, flags)
    try:
        for part in parts:
            if create:
                try:
                    os.mkdir(part, 0o755, dir_fd=fd)
                except FileExistsError:
                    pass
            try:
                child = os.open(part, flags, dir_fd=fd)
            except OSError as e:
                raise _PycellRefusal(_pycell_why(part, e))
            os.close(fd)
            fd = child
        return fd
    except BaseException:
        os.close(fd)
        raise


def _pycell_why(part, e):
    import errno

    if e.errno in (errno.ELOOP, errno.ENOTDIR):
        return "%r is a symlink or not a directory (paths stay inside /workspace)" % part
    if e.errno == errno.ENOENT:
        return "%r does not exist" % part
    return "%r: %s" % (part, e.strerror)


def _pycell_open_file(path, write):
    import os
    import stat

    parts = _pycell_parts(path)
    if not parts:
        raise _PycellRefusal("%r is the workspace itself, not a file" % path)
    dir_fd = _pycell_open_dir(parts[:-1], create=write)
    try:
        flags = os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
        flags |= (os.O_WRONLY | os.O_CREAT | os.O_TRUNC) if write else os.O_RDONLY
        try:
            fd = os.open(parts[-1], flags, 0o644, dir_fd=dir_fd)
        except OSError as e:
            raise _PycellRefusal(_pycell_why(parts[-1], e))
    finally:
        os.close(dir_fd)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise _PycellRefusal("%r is not a regular file" % path)
    return fd


def _pycell_write_file(request):
    import base64
    import os

    data = base64.b64decode(request["data"], validate=True)
    fd = _pycell_open_file(request["path"], write=True)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    except OSError as e:
        raise _PycellRefusal("writing %r: %s" % (request["path"], e.strerror))
    finally:
        os.close(fd)
    return {"path": _pycell_display(request["path"]), "size": len(data)}


def _pycell_read_file(request):
    import base64
    import os

    cap = int(request["max_bytes"])
    fd = _pycell_open_file(request["path"], write=False)
    try:
        size = os.fstat(fd).st_size
        if size > cap:
            raise _PycellRefusal(
                "%r is %d bytes, more than the %d a read may return" % (request["path"], size, cap)
            )
        chunks, left = [], cap + 1
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
    finally:
        os.close(fd)
    data = b"".join(chunks)
    if len(data) > cap:
        raise _PycellRefusal("%r grew past %d bytes while read" % (request["path"], cap))
    return {
        "path": _pycell_display(request["path"]),
        "size": len(data),
        "data": base64.b64encode(data).decode(),
    }


def _pycell_list_files(request):
    import os
    import stat

    cap = int(request.get("max_entries", 1000))
    parts = _pycell_parts(request.get("path", ""))
    fd = _pycell_open_dir(parts)
    entries = []
    try:
        names = sorted(os.listdir(fd))
        for name in names[:cap]:
            st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            entries.append(
                {
                    "name": name,
                    "kind": _pycell_kind(st.st_mode),
                    "size": st.st_size,
                    "mtime": st.st_mtime,
                }
            )
    finally:
        os.close(fd)
    path = "/".join([_PYCELL_WORKSPACE] + parts)
    return {"path": path, "entries": entries, "truncated": len(names) > cap}


def _pycell_kind(mode):
    import stat

    for test, kind in (
        (stat.S_ISREG, "file"),
        (stat.S_ISDIR, "directory"),
        (stat.S_ISLNK, "symlink"),
    ):
        if test(mode):
            return kind
    return "other"


def _pycell_display(path):
    return "/".join([_PYCELL_WORKSPACE] + _pycell_parts(path))


# ---- What a cell changed, and the images it made ----------------------------

_PYCELL_SCAN_LIMIT = 10000


def _pycell_snapshot():
    """(size, mtime_ns, inode) of every regular file under /workspace, up to
    a bound; symlinks are not followed."""
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
            elif stat.S_ISREG(st.st_mode):
                seen[entry.path] = (st.st_size, st.st_mtime_ns, st.st_ino)
    return seen


def _pycell_changes(before, limits):
    """The files created or changed since `before`, with their sha256,
    at most `limits["files"]` of them."""
    import hashlib

    cap = limits.get("files", 100)
    after = _pycell_snapshot()
    changed = sorted(p for p, s in after.items() if before.get(p) != s)
    files = []
    for path in changed[:cap]:
        digest = hashlib.sha256()
        try:
            with open(path, "rb") as f:
                for block in iter(lambda: f.read(1 << 20), b""):
                    digest.update(block)
        except OSError:
            continue
        files.append(
            {
                "path": path,
                "size": after[path][0],
                "sha256": digest.hexdigest(),
                "created": path not in before,
            }
        )
    return {"files": files, "files_truncated": len(changed) > cap}


def _pycell_save_figures(number):
    """Save every matplotlib figure left open to /workspace/figures, full
    size, and close it (as a notebook shows a figure once)."""
    import os
    import sys

    plt = sys.modules.get("matplotlib.pyplot")
    if plt is None:
        return []
    saved = []
    for k, num in enumerate(plt.get_fignums(), 1):
        fig = plt.figure(num)
        os.makedirs(_PYCELL_WORKSPACE + "/figures", exist_ok=True)
        path = "%s/figures/cell-%d-figure-%d.png" % (_PYCELL_WORKSPACE, number, k)
        try:
            fig.savefig(path, format="png")
            saved.append((path, fig))
        except Exception as e:
            sys.stderr.write("pycell: figure %d could not be saved: %s\n" % (num, e))
    return saved


def _pycell_images(figures, files, limits):
    """PNG images for the caller: each figure left open and each PNG or
    JPEG the cell wrote, scaled to at most `image_edge` pixels a side, while
    their total stays within `image_bytes`; the rest are counted, not sent
    (their paths are in `files`)."""
    import base64

    edge = limits.get("image_edge", 1024)
    budget = limits.get("image_bytes", 1 << 20)
    images, omitted = [], 0
    figure_paths = set()
    candidates = []
    for path, fig in figures:
        figure_paths.add(path)
        candidates.append((path, lambda fig=fig: _pycell_figure_png(fig, edge)))
    for f in files:
        low = f["path"].lower()
        if f["path"] not in figure_paths and low.endswith((".png", ".jpg", ".jpeg")):
            candidates.append((f["path"], lambda p=f["path"]: _pycell_file_png(p, edge)))
    for path, render in candidates:
        png = render() if budget > 0 else None
        if png is None or len(png[0]) > budget:
            omitted += 1
            continue
        budget -= len(png[0])
        images.append(
            {
                "path": path,
                "png": base64.b64encode(png[0]).decode(),
                "width": png[1],
                "height": png[2],
            }
        )
    _pycell_close_figures(figures)
    return images, omitted


def _pycell_figure_png(fig, edge):
    import io

    width, height = fig.get_size_inches() * fig.dpi
    scale = min(1.0, edge / max(width, height, 1))
    buf = io.BytesIO()
    try:
        fig.savefig(buf, format="png", dpi=fig.dpi * scale)
    except Exception:
        return None
    return buf.getvalue(), int(width * scale), int(height * scale)


def _pycell_file_png(path, edge):
    """A PNG of the image file at `path`, scaled down with Pillow if it is
    larger than `edge`; without Pillow, only a PNG already small enough."""
    import io

    try:
        from PIL import Image
    except ImportError:
        return _pycell_small_png(path, edge)
    try:
        with Image.open(path) as im:
            im.thumbnail((edge, edge))
            buf = io.BytesIO()
            im.save(buf, format="PNG")
            return buf.getvalue(), im.width, im.height
    except Exception:
        return None


def _pycell_small_png(path, edge):
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return None
    if data[:8] != b"\x89PNG\r\n\x1a\n" or len(data) < 24:
        return None
    width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    if max(width, height) > edge:
        return None
    return data, width, height


def _pycell_close_figures(figures):
    import sys

    plt = sys.modules.get("matplotlib.pyplot")
    for _, fig in figures:
        try:
            plt.close(fig)
        except Exception:
            pass


def _pycell_start():
    import sys

    if sys.argv[1:2] == ["--pycell-session"]:
        _pycell_session(sys.argv[2:])
    else:
        _pycell_run()


_pycell_start()
