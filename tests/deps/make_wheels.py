"""Make the tests' wheelhouse: tiny pure-Python wheels written by hand
(a wheel is a zip with METADATA, WHEEL and RECORD; no build backend), one
sdist-only package and one big wheel.

    python3 make_wheels.py DIR
"""

import base64
import hashlib
import os
import sys
import zipfile


def digest(data):
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def wheel(out, name, version, deps=(), extra=None, scripts=None):
    dist = name.replace("-", "_")
    files = {dist + "/__init__.py": ("VERSION = %r\n" % version).encode()}
    files.update(extra or {})
    info = "%s-%s.dist-info" % (dist, version)
    if scripts:
        lines = "".join("%s = %s\n" % kv for kv in sorted(scripts.items()))
        files[info + "/entry_points.txt"] = ("[console_scripts]\n" + lines).encode()
    meta = "Metadata-Version: 2.1\nName: %s\nVersion: %s\n" % (name, version)
    meta += "".join("Requires-Dist: %s\n" % d for d in deps)
    files[info + "/METADATA"] = meta.encode()
    files[info + "/WHEEL"] = (
        b"Wheel-Version: 1.0\nGenerator: pycell-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    )
    record = "".join("%s,sha256=%s,%d\n" % (p, digest(c), len(c)) for p, c in files.items())
    files[info + "/RECORD"] = (record + info + "/RECORD,,\n").encode()
    path = os.path.join(out, "%s-%s-py3-none-any.whl" % (dist, version))
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
        for p, c in files.items():
            z.writestr(zipfile.ZipInfo(p, date_time=(2020, 1, 1, 0, 0, 0)), c)


def main(out):
    os.makedirs(out, exist_ok=True)
    wheel(out, "pycell-test-a", "1.0", deps=["pycell-test-b"])
    wheel(out, "pycell-test-b", "1.0")
    wheel(out, "pycell-test-b", "2.0")
    # A stand-in for matplotlib's font cache (pycell_deps::fonts): its
    # font_manager builds MPLCONFIGDIR/fontlist-v0.1.json when it finds
    # none, and says whether it had to.
    font_manager = b"""import json, os
_path = os.path.join(os.environ["MPLCONFIGDIR"], "fontlist-v0.1.json")
try:
    with open(_path) as f:
        fontManager = json.load(f)
    BUILT_NOW = False
except FileNotFoundError:
    os.makedirs(os.path.dirname(_path), exist_ok=True)
    fontManager = {"_version": "0.1", "fonts": ["DejaVu Sans"]}
    with open(_path, "w") as f:
        json.dump(fontManager, f)
    BUILT_NOW = True
"""
    wheel(out, "matplotlib", "0.0.1", extra={"matplotlib/font_manager.py": font_manager})
    # A .pth file runs whenever python starts with `site`: it leaves a
    # marker in the env's prefix, which is writable only while it installs.
    pth = b"import pathlib, sys; pathlib.Path(sys.prefix, 'pth-ran').touch()\n"
    wheel(out, "pycell-test-pth", "1.0", extra={"pycell_test_pth.pth": pth})
    big = {"pycell_test_big/blob.bin": os.urandom(4 << 20)}
    wheel(out, "pycell-test-big", "1.0", extra=big)
    # An MCP server over stdio that probes what its jail lets it reach
    # (pycell mcp-server's tests); one with no console script.
    here = os.path.dirname(os.path.abspath(__file__))
    # Beside this file in the VM test's payload, in tests/mcp/ in the tree.
    beside = [os.path.join(here, "..", "mcp", "probe_server.py"), os.path.join(here, "probe_server.py")]
    with open(next((p for p in beside if os.path.exists(p)), beside[0]), "rb") as f:
        probe = f.read()
    wheel(
        out,
        "pycell-probe-server",
        "1.0",
        extra={"pycell_probe_server/server.py": probe},
        # Two scripts: the one named as the package is the one run.
        scripts={"pycell-probe-server": "pycell_probe_server.server:main", "pycell-probe-other": "pycell_probe_server.server:main"},
    )
    wheel(out, "pycell-test-noscript", "1.0")
    wheel(out, "pycell-test-twoscripts", "1.0", scripts={"a-tool": "pycell_test_twoscripts:a", "b-tool": "pycell_test_twoscripts:b"})
    with open(os.path.join(out, "pycell_test_sdist-1.0.tar.gz"), "wb") as f:
        f.write(b"not built: pycell installs wheels only\n")


if __name__ == "__main__":
    main(sys.argv[1])
