# ---- Sessions -------------------------------------------------------------
#
# Compiled when a session's runner starts (see _pycell_load).
#
# `python -s -c RUNNER --pycell-session [MODULE ...]`: after warm-up and
# READY, stdin is the session's channel (a socket to the jailer; the
# program's own stdin becomes /dev/null). On it come requests, one frame
# each (4-byte big-endian length, the jailer's token, JSON), and for each a
# reply goes back the same way, with the same token (a reply with another
# ends the session: a stray frame or a late reply answers no later
# request): cells run in one persistent __main__, as a REPL runs them, and
# files are written, read and listed in /workspace. The program's output
# goes to stdout and stderr as in a run; stdout and stderr are flushed
# before a reply, so a cell's output is in the jailer's pipes before its
# result. SIGINT (the jailer's per-cell timeout) raises KeyboardInterrupt in
# a cell and is ignored between cells.


def _pycell_session(modules):
    import json
    import os
    import signal

    _pycell_warm_up(modules)
    channel = _pycell_take_stdin()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    main = _pycell_session_main()
    state = {"cells": 0}
    while True:
        body = _pycell_read_frame_bytes(channel)
        if body is None:
            os._exit(0)
        # The jailer's token first: the reply brings it back. A frame that
        # is not a request (the cell's code took bytes off the channel)
        # ends the session.
        token = body[:_PYCELL_TOKEN_LEN]
        try:
            request = json.loads(body[_PYCELL_TOKEN_LEN:])
        except ValueError:
            os._exit(1)
        reply = _pycell_serve(main, state, request)
        _pycell_flush_std()
        _pycell_write_frame(channel, reply, token)


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


# The length of the token that starts each request and its reply.
_PYCELL_TOKEN_LEN = 32


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
    if op != "export_chunk":
        # An export is read chunk after chunk: any other request ends it
        # (a fork or snapshot cut short holds no copy of the state).
        state.pop("export", None)
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
        elif op == "make_dir":
            reply = _pycell_make_dir(request)
        elif op == "remove":
            reply = _pycell_remove(request)
        elif op == "command":
            reply = _pycell_command(request)
        elif op in _PYCELL_STATE_OPS:
            reply = _pycell_state_op(main, state, request)
        else:
            reply = {"refused": "unknown request %r" % (op,)}
    except _PycellRefusal as e:
        reply = {"refused": str(e)}
    return reply


def _pycell_state_op(main, state, request):
    """A fork's request, interruptible as a cell is (the jailer's SIGINT at
    its timeout): whatever stops it is the caller's refusal, and the
    session goes on as it was."""
    import signal

    _pycell_load("state")
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        return _PYCELL_STATE_OPS[request["op"]](main, state, request)
    except _PycellRefusal:
        raise
    except BaseException as e:
        state.pop("export", None)
        state.pop("import", None)
        raise _PycellRefusal("the session's state could not be carried: %s: %s" % (type(e).__name__, e))
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)


def _pycell_export_state(main, state, request):
    """Write this session's state bundle (kept here, under a number of its
    own, until its last chunk is read): its number and size, what it
    carries and what it leaves."""
    import threading

    state.pop("export", None)
    bundle, left = _pycell_state_bundle(main, int(request["max_bytes"]))
    state["exports"] = number = state.get("exports", 0) + 1
    state["export"] = (number, bundle)
    main_thread = threading.main_thread()
    left["threads"] = [t.name for t in threading.enumerate() if t is not main_thread]
    left["cells"] = state["cells"]
    left["export"] = number
    return {"size": len(bundle), "state": left}


def _pycell_export_chunk(main, state, request):
    number, bundle = state.get("export", (None, b""))
    if number is None or number != int(request["export"]):
        raise _PycellRefusal("state export %s is not the one being read" % (request["export"],))
    offset, most = int(request["offset"]), int(request["max_bytes"])
    chunk = bundle[offset:offset + most]
    if offset + len(chunk) >= len(bundle):
        del state["export"]
    return {"size": len(bundle), "data": _pycell_b64(chunk)}


def _pycell_import_chunk(main, state, request):
    import base64

    received = state.setdefault("import", bytearray())
    if int(request["offset"]) != len(received):
        raise _PycellRefusal("a state chunk at %s, after %d bytes" % (request["offset"], len(received)))
    received += base64.b64decode(request["data"], validate=True)
    return {"size": len(received)}


def _pycell_import_state(main, state, request):
    bundle = bytes(state.pop("import", b""))
    if len(bundle) != int(request["size"]):
        raise _PycellRefusal("%d bytes of state came, not %s" % (len(bundle), request["size"]))
    loaded = _pycell_state_load(main, bundle)
    state["cells"] = int(request["cells"])
    return {"state": loaded}


def _pycell_b64(data):
    import base64

    return base64.b64encode(data).decode()


# A fork's requests (see state.py): the source writes its state and hands
# it out in chunks, the fork takes them and loads it.
_PYCELL_STATE_OPS = {
    "export_state": _pycell_export_state,
    "export_chunk": _pycell_export_chunk,
    "import_chunk": _pycell_import_chunk,
    "import_state": _pycell_import_state,
}


class _PycellRefusal(Exception):
    """A request the session cannot serve as asked (a path outside the
    workspace, a file too big): told to the caller, the session goes on."""


def _pycell_cell(main, number, request):
    """Run a cell's code in `main`; the value of a last expression (its
    text, and its richer form among the displays: display.py), or the
    exception, as a REPL shows them."""
    import signal

    code = request["code"]
    limits = request.get("limits", {})
    name = "<cell %d>" % number
    before = _pycell_snapshot()
    _pycell_offer_display(limits["displays"])
    _pycell_take_displays()
    bundle, error, whole, saved = None, None, [], None
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGXCPU, _pycell_cpu_allowance_reached)
    try:
        value = _pycell_exec_cell(main, code, name)
        # Rendered while the cell's clocks can still interrupt it: a value's
        # _repr_*_ methods are the cell's code too.
        if value is not None:
            bundle = _pycell_bundle(value, limits["displays"]["part_chars"], whole)
            if bundle["truncated"]:
                saved = _pycell_save_value(value, whole[0], number)
    except BaseException as e:
        error = e
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGXCPU, signal.SIG_IGN)
    _pycell_flush_std()
    reply = {"cell": number}
    if error is not None:
        reply["error"] = _pycell_describe_error(error)
    elif bundle is not None:
        reply["value"], reply["value_truncated"] = bundle["text"], bundle["truncated"]
        reply["value_saved"] = saved
        if set(bundle) - {"text", "truncated"}:
            _pycell_keep_display(bundle, "value")
    reply["displays"], reply["displays_omitted"] = _pycell_take_displays()
    figures = _pycell_save_figures("cell-%d-figure" % number)
    reply.update(_pycell_changes(before, limits))
    reply["images"], reply["images_omitted"] = _pycell_images(
        figures, reply["files"], limits["images"]
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


def _pycell_describe_error(e):
    """The exception with its traceback, without the runner's frames."""
    import traceback

    tb = _pycell_user_frames(e.__traceback__)
    try:
        text = "".join(traceback.format_exception(type(e), e, tb))
    except BaseException:
        text = "<the traceback could not be formatted>"
    lines = []
    _pycell_explain(e, lines.append)
    text += "".join(lines)
    try:
        message = str(e)
    except BaseException:
        message = "<str failed>"
    return {
        "type": type(e).__name__,
        "message": _pycell_cut(message, _PYCELL_ERROR_CHARS)[0],
        "traceback": _pycell_cut(text, _PYCELL_ERROR_CHARS)[0],
    }


# What an error's message and traceback may take of a reply, each.
_PYCELL_ERROR_CHARS = 32768


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
    return {"path": _pycell_workspace_path(request["path"]), "size": len(data)}


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
        "path": _pycell_workspace_path(request["path"]),
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


def _pycell_make_dir(request):
    """Make a directory of /workspace and those above it; `created` is
    false if it was there already."""
    import os

    parts = _pycell_parts(request["path"])
    if not parts:
        return {"path": _PYCELL_WORKSPACE, "created": False}
    fd = _pycell_open_dir(parts[:-1], create=True)
    try:
        os.mkdir(parts[-1], 0o755, dir_fd=fd)
        created = True
    except FileExistsError:
        created = False
    except OSError as e:
        raise _PycellRefusal(_pycell_why(parts[-1], e))
    finally:
        os.close(fd)
    if not created:
        os.close(_pycell_open_dir(parts))
    return {"path": _pycell_workspace_path(request["path"]), "created": created}


def _pycell_remove(request):
    """Remove a file, link or directory tree of /workspace (never what a
    link points to)."""
    import os
    import shutil
    import stat

    parts = _pycell_parts(request["path"])
    if not parts:
        raise _PycellRefusal("the workspace itself cannot be removed")
    fd = _pycell_open_dir(parts[:-1])
    try:
        try:
            st = os.stat(parts[-1], dir_fd=fd, follow_symlinks=False)
        except OSError as e:
            raise _PycellRefusal(_pycell_why(parts[-1], e))
        try:
            if stat.S_ISDIR(st.st_mode):
                shutil.rmtree(parts[-1], dir_fd=fd)
            else:
                os.unlink(parts[-1], dir_fd=fd)
        except OSError as e:
            raise _PycellRefusal("removing %r: %s" % (request["path"], e.strerror))
    finally:
        os.close(fd)
    return {"path": _pycell_workspace_path(request["path"])}


def _pycell_command(request):
    """Run a shell command in /workspace, its output the call's: its exit
    status (negative: the signal that ended it). Interrupted (the call's
    clock), it is killed with its process group."""
    import os
    import signal
    import subprocess

    _pycell_flush_std()
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        proc = subprocess.Popen(
            ["/bin/sh", "-c", request["command"]],
            cwd=_PYCELL_WORKSPACE,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    except OSError as e:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        raise _PycellRefusal("the shell could not be started: %s" % e.strerror)
    try:
        code = proc.wait()
    except KeyboardInterrupt:
        code = None
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        if proc.returncode is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except OSError:
                pass
            code = proc.wait()
    return {"exit_code": code}


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


def _pycell_workspace_path(path):
    return "/".join([_PYCELL_WORKSPACE] + _pycell_parts(path))
