# ---- Displays: display() and a cell's value, rendered for a model ---------
#
# Compiled at a run's first display() call, or when a warm jail or session
# starts. A display is a bundle of MIME parts, as Jupyter has them:
# text/plain always, and text/markdown, text/html, application/json,
# image/svg+xml and image/png when the object offers them
# (_repr_mimebundle_, _repr_markdown_, ...). pandas objects and numpy
# arrays get a bounded rendering of pycell's own (shape, dtypes, head and
# tail), and a container whose repr is too long a summary of its shape.
# Each text part is cut to `part_chars` characters (head and tail kept),
# the displays of one result together to `total_bytes`, and past `count`
# of them the rest are counted, not kept. The host checks all of that
# again (pycell_launch::displays): this is a courtesy, not a guarantee.

_PYCELL_MIME_KEYS = {
    "text/plain": "text",
    "text/markdown": "markdown",
    "text/html": "html",
    "application/json": "json",
    "image/svg+xml": "svg",
    "image/png": "png",
}
_PYCELL_REPR_METHODS = (
    ("markdown", "_repr_markdown_"),
    ("html", "_repr_html_"),
    ("json", "_repr_json_"),
    ("svg", "_repr_svg_"),
    ("png", "_repr_png_"),
    ("markdown", "_repr_latex_"),
)
# A table shows its first and last rows (this many each), at most so many
# columns, each cell at most so many characters.
_PYCELL_TABLE_ROWS = 5
_PYCELL_TABLE_COLUMNS = 20
_PYCELL_TABLE_CELL = 40


def _pycell_show(objs):
    """display(*objs): keep a display of each for the result."""
    state = _PYCELL_SHOWN
    for obj in objs:
        _pycell_keep_display(_pycell_bundle(obj, state["limits"]["part_chars"]), "display")


def _pycell_keep_display(bundle, kind):
    """Keep `bundle` in this result's displays, if it fits what is left;
    else without its richer parts, if that fits; else count it."""
    state = _PYCELL_SHOWN
    limits = state["limits"]
    if len(state["displays"]) >= limits["count"]:
        state["omitted"] += 1
        return
    left = limits["total_bytes"] - state["bytes"]
    for candidate in (bundle, {"text": bundle["text"], "truncated": bundle["truncated"]}):
        size = _pycell_bundle_size(candidate)
        if size <= left:
            candidate = dict(candidate, kind=kind)
            state["displays"].append(candidate)
            state["bytes"] += size
            return
    state["omitted"] += 1


def _pycell_bundle_size(bundle):
    """The bytes the bundle's parts take in the frame (as JSON strings)."""
    import json

    parts = (v for v in bundle.values() if isinstance(v, str))
    return sum(len(json.dumps(v, ensure_ascii=False).encode("utf-8", "replace")) for v in parts)


def _pycell_take_displays():
    """This result's displays and how many were left out; starts over."""
    state = _PYCELL_SHOWN
    displays, omitted = state["displays"], state["omitted"]
    state.update(displays=[], omitted=0, bytes=0)
    return displays, omitted


def _pycell_bundle(obj, cap, whole=None):
    """The MIME parts of `obj` (keys as in _PYCELL_MIME_KEYS), each text
    part within `cap` characters, and whether any was cut; the uncut text
    part is appended to the list `whole`, if given."""
    parts = None
    try:
        parts = _pycell_own_parts(obj, cap)
    except Exception:
        parts = None
    if parts is None:
        parts = _pycell_repr_parts(obj)
    if "text" not in parts:
        parts["text"] = _pycell_plain(obj, cap)
    if whole is not None:
        whole.append(parts["text"])
    bundle, cut = {}, False
    for key, value in parts.items():
        if key != "png":
            value, was_cut = _pycell_cut(value, cap)
            cut = cut or was_cut
        bundle[key] = value
    bundle["truncated"] = cut
    return bundle


def _pycell_own_parts(obj, cap):
    """pycell's rendering of a pandas DataFrame or Series or a numpy array;
    None for anything else."""
    t = type(obj)
    module = getattr(t, "__module__", "") or ""
    if module.split(".")[0] == "pandas" and t.__name__ in ("DataFrame", "Series"):
        return _pycell_pandas_parts(obj)
    if module == "numpy" and t.__name__ == "ndarray":
        return _pycell_ndarray_parts(obj)
    return None


def _pycell_pandas_parts(obj):
    """Shape, dtypes, and the first and last rows as a markdown table."""
    rows, cols = _PYCELL_TABLE_ROWS, _PYCELL_TABLE_COLUMNS
    if type(obj).__name__ == "Series":
        header = "Series %r: %s rows, dtype %s" % (obj.name, format(len(obj), ","), obj.dtype)
        frame = obj.to_frame()
        text = obj.to_string(max_rows=2 * rows)
    else:
        frame = obj
        header = "DataFrame: %s rows x %s columns" % (
            format(frame.shape[0], ","),
            format(frame.shape[1], ","),
        )
        shown = ["%s (%s)" % (c, t) for c, t in list(frame.dtypes.items())[:cols]]
        more = frame.shape[1] - len(shown)
        header += "\ncolumns: " + ", ".join(shown) + (", ... %d more" % more if more > 0 else "")
        text = frame.to_string(max_rows=2 * rows, max_cols=cols, max_colwidth=_PYCELL_TABLE_CELL)
    table = _pycell_markdown_table(frame, rows, cols)
    return {"text": header + "\n" + text, "markdown": header.replace("\n", "  \n") + "\n\n" + table}


def _pycell_markdown_table(frame, rows, cols):
    n, m = frame.shape
    picks = list(range(n)) if n <= 2 * rows else list(range(rows)) + [None] + list(range(n - rows, n))
    columns = list(range(min(m, cols)))
    names = [_pycell_cell_text(frame.columns[j]) for j in columns]
    if m > cols:
        names.append("...")
    lines = ["| | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
    for i in picks:
        if i is None:
            lines.append("| ... |" + " ... |" * len(names))
            continue
        cells = [_pycell_cell_text(frame.iat[i, j]) for j in columns]
        if m > cols:
            cells.append("...")
        lines.append("| " + _pycell_cell_text(frame.index[i]) + " | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _pycell_cell_text(value):
    text = str(value).replace("\n", " ").replace("|", "\\|")
    if len(text) > _PYCELL_TABLE_CELL:
        text = text[: _PYCELL_TABLE_CELL - 3] + "..."
    return text


def _pycell_ndarray_parts(a):
    import numpy

    body = numpy.array2string(a, threshold=200, edgeitems=3, max_line_width=120)
    return {"text": "ndarray shape=%s dtype=%s\n%s" % (a.shape, a.dtype, body)}


def _pycell_repr_parts(obj):
    """What the object offers: _repr_mimebundle_ first, then each
    _repr_*_ method; the ones that fail or give nothing are skipped."""
    parts = {}
    data = _pycell_call_repr(obj, "_repr_mimebundle_")
    if isinstance(data, dict):
        for mime, value in data.items():
            key = _PYCELL_MIME_KEYS.get(mime)
            part = _pycell_part(key, value) if key else None
            if part is not None:
                parts[key] = part
    for key, name in _PYCELL_REPR_METHODS:
        if key not in parts:
            part = _pycell_part(key, _pycell_call_repr(obj, name))
            if part is not None:
                parts[key] = part
    return parts


def _pycell_call_repr(obj, name):
    if isinstance(obj, type):
        return None
    try:
        method = getattr(obj, name, None)
        if not callable(method):
            return None
        value = method(include=None, exclude=None) if name == "_repr_mimebundle_" else method()
    except Exception:
        return None
    if isinstance(value, tuple) and value:
        value = value[0]
    return value


def _pycell_part(key, value):
    """One part as a string (PNG as base64), or None."""
    import base64
    import json

    if value is None:
        return None
    try:
        if key == "png":
            if isinstance(value, str):
                value = base64.b64decode(value, validate=True)
            if not isinstance(value, bytes) or not value.startswith(b"\x89PNG\r\n\x1a\n"):
                return None
            return base64.b64encode(value).decode()
        if key == "json":
            return json.dumps(value, ensure_ascii=False, default=repr)
        if isinstance(value, bytes):
            value = value.decode("utf-8", "replace")
        return value if isinstance(value, str) else None
    except Exception:
        return None


def _pycell_plain(obj, cap):
    """repr(obj); for a container whose repr is longer than `cap`, a
    summary of its shape first."""
    text = _pycell_safe_repr(obj)
    if len(text) > cap and isinstance(obj, (dict, list, tuple, set, frozenset)):
        try:
            return _pycell_summary(obj, len(text)) + "\n" + text
        except Exception:
            pass
    return text


def _pycell_summary(obj, chars):
    return "<%s of %s items, %s characters as repr; shape: %s>" % (
        type(obj).__name__,
        format(len(obj), ","),
        format(chars, ","),
        _pycell_shape(obj, 3),
    )


def _pycell_shape(obj, depth):
    """The shape of a JSON-like value, from its first items: {str: [int]}."""
    if isinstance(obj, dict):
        if not obj or depth == 0:
            return "{...}" if obj else "{}"
        if len(obj) <= 8 and all(isinstance(k, str) for k in obj):
            inner = ", ".join("%r: %s" % (k, _pycell_shape(v, depth - 1)) for k, v in obj.items())
            return "{" + inner + "}"
        key, value = next(iter(obj.items()))
        return "{%s: %s}" % (type(key).__name__, _pycell_shape(value, depth - 1))
    if isinstance(obj, (list, tuple, set, frozenset)):
        if not obj:
            return "[]"
        if depth == 0:
            return "[...]"
        return "[%s]" % _pycell_shape(next(iter(obj)), depth - 1)
    return type(obj).__name__


def _pycell_safe_repr(value):
    try:
        return repr(value)
    except BaseException as e:
        return "<repr failed: %s: %s>" % (type(e).__name__, e)


def _pycell_cut(text, cap):
    """`text` within `cap` characters, its head and tail kept around a
    line that says how much was cut; and whether it was cut."""
    if len(text) <= cap:
        return text, False
    mark = "\n[... %d characters cut ...]\n" % (len(text) - cap)
    half = max(0, (cap - len(mark)) // 2)
    return text[:half] + mark + text[len(text) - half:], True


def _pycell_save_value(value, text, number):
    """A cell's value whose text was cut, kept whole in /workspace: as
    JSON (outputs/cell-N-value.json) if it is a dict or list JSON can
    write, else its text (outputs/cell-N-value.txt). The file's kind, or
    None if it could not be written (the disk budget, say). The host names
    the path from the cell's number and the kind (SessionReply's
    value_file)."""
    import json
    import os

    kind, data = "txt", text
    if isinstance(value, (dict, list)):
        try:
            kind, data = "json", json.dumps(value, ensure_ascii=False, indent=1)
        except (TypeError, ValueError, RecursionError):
            pass
    path = "%s/outputs/cell-%d-value.%s" % (_PYCELL_WORKSPACE, number, kind)
    try:
        os.makedirs(_PYCELL_WORKSPACE + "/outputs", exist_ok=True)
        with open(path, "w", encoding="utf-8", errors="replace") as f:
            f.write(data)
    except OSError:
        return None
    return kind
