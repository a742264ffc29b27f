# ---- Images: figures left open, image files written ------------------------
#
# Compiled the first time a run has images, or when a warm jail or session
# starts (see _pycell_load). Figures are saved full size under
# /workspace/figures; what goes back is a PNG of each, and of each PNG or
# JPEG written, scaled to at most `max_edge` pixels a side, while their
# total stays within `max_bytes`; the rest are counted, not sent (their
# files are listed with the result).


def _pycell_write_frame(fd, obj, prefix=b""):
    import json
    import os

    # UTF-8 JSON; a lone surrogate (a file name that is not UTF-8, read
    # with surrogateescape) would make the whole frame unreadable to the
    # host's JSON parser, so it becomes "?".
    text = json.dumps(obj, separators=(",", ":"), ensure_ascii=False)
    body = prefix + text.encode("utf-8", "replace")
    data = len(body).to_bytes(4, "big") + body
    while data:
        data = data[os.write(fd, data):]


def _pycell_send_images(fd, limits, started):
    """Send the jailer a run's images: its open figures (saved as
    figures/figure-N.png), then the image files it wrote since `started`;
    and its displays, if it made any."""
    figures = _pycell_save_figures("figure")
    files = [{"path": p} for p in _pycell_images_since(started)]
    images, omitted = _pycell_images(figures, files, limits)
    frame = {"images": images, "images_omitted": omitted}
    if _PYCELL_SHOWN["displays"] or _PYCELL_SHOWN["omitted"]:
        frame["displays"], frame["displays_omitted"] = _pycell_take_displays()
    _pycell_write_frame(fd, frame)


def _pycell_snapshot():
    """(size, mtime_ns, inode) of every regular file under /workspace."""
    return {p: (st.st_size, st.st_mtime_ns, st.st_ino) for p, st in _pycell_walk()}


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


def _pycell_save_figures(prefix):
    """Save every matplotlib figure left open to
    /workspace/figures/PREFIX-N.png, full size (it is closed once its
    image is made, as a notebook shows a figure once)."""
    import os
    import sys

    plt = sys.modules.get("matplotlib.pyplot")
    if plt is None:
        return []
    saved = []
    for k, num in enumerate(plt.get_fignums(), 1):
        fig = plt.figure(num)
        os.makedirs(_PYCELL_WORKSPACE + "/figures", exist_ok=True)
        path = "%s/figures/%s-%d.png" % (_PYCELL_WORKSPACE, prefix, k)
        try:
            fig.savefig(path, format="png")
            saved.append((path, fig))
        except Exception as e:
            sys.stderr.write("pycell: figure %d could not be saved: %s\n" % (num, e))
    return saved


def _pycell_images(figures, files, limits):
    """PNG images for the caller: each figure left open and each PNG or
    JPEG in `files`, scaled to at most `max_edge` pixels a side, while
    their total stays within `max_bytes`; the rest are counted, not sent."""
    import base64

    edge, budget = limits["max_edge"], limits["max_bytes"]
    images, omitted = [], 0
    figure_paths = set()
    candidates = []
    for path, fig in figures:
        figure_paths.add(path)
        candidates.append((path, lambda fig=fig: _pycell_figure_png(fig, edge)))
    for f in files:
        low = f["path"].lower()
        if f["path"] not in figure_paths and low.endswith(_PYCELL_IMAGE_SUFFIXES):
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
