# ---- A session's state, carried to another session ------------------------
#
# Compiled when a session's state is written or loaded (see _pycell_load).
#
# A state bundle is what a session's runner writes of itself for another
# session's runner to load (a fork, a snapshot): the names in __main__,
# pickled (what cannot be is named, with why), and /workspace (directories
# and regular files; no symlink is followed or carried). Only runners read
# a bundle, each in its own jail, and the two are the same owner's: the
# host moves its bytes and parses none of them.
#
# What cells define is carried by value: functions by their code (the same
# interpreter loads it), closures and defaults; classes by their bases and
# dict; modules by name (imported again). Generators of random numbers are
# reseeded, never carried (`random.Random`, numpy's `Generator` and
# `RandomState`): a fork never draws what its source draws. One pickler
# writes every name, so an object two names share is one object again.

_PYCELL_STATE_VERSION = 1


def _pycell_state_module():
    """The module the bundle's reconstructors are found in by name, made
    once: pickle names a function by its module and name, and the runner's
    own module is not the session's __main__."""
    import sys
    import types

    module = sys.modules.get("_pycell_state")
    if module is not None:
        return module
    module = types.ModuleType("_pycell_state")
    for f in (
        _pycell_state_function,
        _pycell_state_class,
        _pycell_state_import,
        _pycell_state_main_dict,
        _pycell_state_cell,
        _pycell_state_fresh,
    ):
        name = f.__name__
        f.__module__, f.__qualname__ = "_pycell_state", name
        setattr(module, name, f)
    sys.modules["_pycell_state"] = module
    return module


def _pycell_state_import(name):
    import importlib

    return importlib.import_module(name)


def _pycell_state_main_dict():
    import sys

    return sys.modules["__main__"].__dict__


def _pycell_state_cell(value):
    return (lambda: value).__closure__[0]


def _pycell_state_function(code, name, defaults, kwdefaults, closure, attrs):
    import marshal
    import types

    cells = tuple(_pycell_state_cell(v) for v in closure) or None
    f = types.FunctionType(marshal.loads(code), _pycell_state_main_dict(), name, defaults, cells)
    f.__kwdefaults__ = kwdefaults
    if attrs:
        f.__dict__.update(attrs)
    return f


def _pycell_state_class(name, bases, namespace):
    return type(name, bases, namespace)


def _pycell_state_fresh(kind):
    """A generator of random numbers of `kind`, seeded anew."""
    import random

    if kind == "random":
        return random.Random()
    import numpy

    if kind == "numpy_generator":
        return numpy.random.default_rng()
    return numpy.random.RandomState()


def _pycell_state_pickler(out, main, reseeded):
    import marshal
    import pickle
    import random
    import sys
    import types

    module = _pycell_state_module()

    class Pickler(pickle.Pickler):
        def reducer_override(self, obj):
            if isinstance(obj, types.ModuleType):
                if obj is main:
                    return (module._pycell_state_import, ("__main__",))
                return (module._pycell_state_import, (obj.__name__,))
            if isinstance(obj, types.FunctionType) and obj.__module__ == "__main__":
                closure = tuple(c.cell_contents for c in obj.__closure__ or ())
                return (
                    module._pycell_state_function,
                    (
                        marshal.dumps(obj.__code__),
                        obj.__name__,
                        obj.__defaults__,
                        obj.__kwdefaults__,
                        closure,
                        dict(obj.__dict__) or None,
                    ),
                )
            if isinstance(obj, type) and obj.__module__ == "__main__":
                skip = ("__dict__", "__weakref__")
                namespace = {k: v for k, v in obj.__dict__.items() if k not in skip}
                return (module._pycell_state_class, (obj.__name__, obj.__bases__, namespace))
            kind = _pycell_state_generator_kind(obj, random, sys.modules.get("numpy"))
            if kind is not None:
                reseeded.append(type(obj).__name__)
                return (module._pycell_state_fresh, (kind,))
            return NotImplemented

    return Pickler(out, protocol=5)


def _pycell_state_generator_kind(obj, random, numpy):
    """Which generator of random numbers `obj` is, if it is one that keeps
    a state (`random.SystemRandom` keeps none)."""
    if isinstance(obj, random.Random) and not isinstance(obj, random.SystemRandom):
        return "random"
    if numpy is not None:
        if isinstance(obj, numpy.random.Generator):
            return "numpy_generator"
        if isinstance(obj, numpy.random.RandomState):
            return "numpy_random_state"
    return None


def _pycell_state_names(main):
    """`main`'s names, pickled one after another by one pickler (the bytes,
    the names in order, and what was reseeded), and those that could not
    be, with why: a name that fails leaves nothing of itself behind."""
    import io

    out = io.BytesIO()
    reseeded = []
    pickler = _pycell_state_pickler(out, main, reseeded)
    kept, dropped = [], {}
    for name, value in list(main.__dict__.items()):
        if name.startswith("__") and name.endswith("__"):
            continue
        at, memo, seeded = out.tell(), pickler.memo.copy(), len(reseeded)
        try:
            pickler.dump(value)
            kept.append(name)
        except Exception as e:
            out.seek(at)
            out.truncate()
            pickler.memo = memo
            del reseeded[seeded:]
            dropped[name] = "%s: %s" % (type(value).__name__, e)
    return out.getvalue(), kept, dropped, reseeded


def _pycell_state_files(max_bytes):
    """/workspace's directories and regular files (relative paths, modes,
    bytes), at most `max_bytes` of them; and what was left out, with why."""
    import os
    import stat

    dirs, files, skipped, total = [], [], {}, 0
    pending = [""]
    while pending:
        rel = pending.pop()
        fd = _pycell_open_dir(_pycell_parts(rel))
        try:
            for name in sorted(os.listdir(fd)):
                path = rel + "/" + name if rel else name
                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
                if stat.S_ISDIR(st.st_mode):
                    dirs.append((path, stat.S_IMODE(st.st_mode)))
                    pending.append(path)
                elif not stat.S_ISREG(st.st_mode):
                    skipped[path] = "not a regular file (%s)" % _pycell_kind(st.st_mode)
                elif total + st.st_size > max_bytes:
                    raise _PycellRefusal(
                        "the workspace holds more than the %d bytes a session's state may carry"
                        % max_bytes
                    )
                else:
                    data = _pycell_state_read(fd, name)
                    total += len(data)
                    files.append((path, stat.S_IMODE(st.st_mode), data))
        finally:
            os.close(fd)
    return dirs, files, skipped


def _pycell_state_read(dir_fd, name):
    import os

    fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, dir_fd=dir_fd)
    try:
        chunks = []
        while True:
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)
    finally:
        os.close(fd)


def _pycell_state_bundle(main, max_bytes):
    """The bundle of `main` and /workspace (bytes), refused past
    `max_bytes`; and what it does not carry: names and files left out,
    generators reseeded."""
    import pickle

    names, kept, dropped, reseeded = _pycell_state_names(main)
    dirs, files, skipped = _pycell_state_files(max_bytes)
    bundle = pickle.dumps(
        {
            "version": _PYCELL_STATE_VERSION,
            "names": names,
            "kept": kept,
            "dirs": dirs,
            "files": files,
        },
        protocol=5,
    )
    if len(bundle) > max_bytes:
        raise _PycellRefusal(
            "the session's state is %d bytes, more than the %d it may carry"
            % (len(bundle), max_bytes)
        )
    left = {"names": kept, "dropped": dropped, "skipped": skipped, "reseeded": reseeded}
    return bundle, left


def _pycell_state_load(main, bundle):
    """Load `bundle` (from _pycell_state_bundle) into `main` and
    /workspace: the names it set and the files it wrote."""
    import io
    import os
    import pickle

    _pycell_state_module()
    state = pickle.loads(bundle)
    if state.get("version") != _PYCELL_STATE_VERSION:
        raise _PycellRefusal("a state bundle of version %r" % (state.get("version"),))
    for path, mode in state["dirs"]:
        os.close(_pycell_open_dir(_pycell_parts(path), create=True))
    for path, mode, data in state["files"]:
        fd = _pycell_open_file(path, write=True)
        try:
            os.fchmod(fd, mode & 0o755)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
        finally:
            os.close(fd)
    loader = pickle.Unpickler(io.BytesIO(state["names"]))
    for name in state["kept"]:
        main.__dict__[name] = loader.load()
    return {"names": list(state["kept"]), "files": len(state["files"])}
