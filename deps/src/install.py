"""pycell's install script: runs in the install jail, never in a run's.

argv: UV PYTHON REQUIRES_PYTHON [UV INDEX OPTIONS...]; the requirements are
in requirements.in beside this file. It resolves them with uv (wheels only),
creates a relocatable venv for PYTHON in /workspace/env, installs the
resolved set with hashes checked, compiles it to bytecode, and writes
/workspace/report.json. Each
line on stdout is a progress message; uv's own messages go to stderr.
Exit codes: 10 requires-python not satisfied, 11 resolution failed,
12 venv creation failed, 13 install failed.
"""

import json
import os
import re
import stat
import subprocess
import sys

WORKSPACE = "/workspace"
LOCK = os.path.join(WORKSPACE, "lock.txt")
ENV = os.path.join(WORKSPACE, "env")
PROBE = (
    "import json, sys, sysconfig; print(json.dumps({"
    "'python': '%d.%d.%d' % sys.version_info[:3], "
    "'platform': sysconfig.get_platform()}))"
)


def progress(message):
    print(message, flush=True)


def release(text):
    return tuple(int(p) for p in re.findall(r"\d+", text.split("+")[0])[:3])


def satisfies(version, spec):
    """A version (x, y, z) against PEP 440 clauses on release numbers."""
    for clause in filter(None, (c.strip() for c in spec.split(","))):
        op = re.match(r"(===|~=|==|!=|<=|>=|<|>)", clause)
        if not op:
            return False
        want = clause[op.end():].strip()
        star = want.endswith(".*")
        w = release(want[:-2] if star else want)
        v = version[: len(w)] if star else version
        w = w + (0,) * (3 - len(w)) if not star else w
        ok = {
            "==": v == w,
            "===": v == w,
            "!=": v != w,
            "<=": v <= w,
            ">=": v >= w,
            "<": v < w,
            ">": v > w,
            "~=": version >= w and version[: max(len(release(want)) - 1, 1)]
            == w[: max(len(release(want)) - 1, 1)],
        }[op.group(1)]
        if not ok:
            return False
    return True


def run_uv(args, stream=None):
    """uv with its stderr passed on; `stream` sees each stderr line."""
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    for line in proc.stderr:
        sys.stderr.write(line)
        if stream:
            stream(line.rstrip("\n"))
    return proc.wait()


def readable_by_all(top):
    """Directories searchable and files readable by every uid (symlinks
    are left as they are): pycelld copies the env out of this jail without
    a capability to read what it does not own."""
    for root, _dirs, files in os.walk(top):
        os.chmod(root, 0o755)
        for name in files:
            path = os.path.join(root, name)
            mode = os.lstat(path).st_mode
            if stat.S_ISREG(mode):
                os.chmod(path, 0o755 if mode & 0o100 else 0o644)


def compile_bytecode():
    """Every module of the env to bytecode, hash-based and unchecked: runs
    get the env read-only and write no bytecode, so without this each run
    compiles every module it imports, and unchecked hash-based .pyc files
    neither depend on file times (the same lock gives the same files) nor
    cost a read of the source at import. A file that does not compile
    (some packages ship such templates or tests) is left as it is. Without
    `site` (-S): it would run the packages' .pth files, and an install
    runs no package code."""
    python = os.path.join(ENV, "bin", "python")
    progress("compiling the env to bytecode")
    subprocess.run(
        [python, "-I", "-S", "-m", "compileall", "-q", "-q", "-j", "0",
         "--invalidation-mode", "unchecked-hash", os.path.join(ENV, "lib")],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False,
    )


def main():
    uv, python, requires_python = sys.argv[1:4]
    index = sys.argv[4:]
    if "--index-url" in index:
        # Trust the host's CA store (/etc/ssl/certs, bound into jails with
        # egress) as every other client in pycell's jails does, not uv's
        # own copy: an operator's TLS-inspecting proxy or private index has
        # its CA there.
        os.environ["UV_SYSTEM_CERTS"] = "1"
    probe = json.loads(subprocess.check_output([python, "-I", "-S", "-c", PROBE], text=True))
    if requires_python and not satisfies(release(probe["python"]), requires_python):
        sys.stderr.write(
            "pycell: the script needs Python %s; the policy's interpreter %s is %s\n"
            % (requires_python, python, probe["python"])
        )
        return 10
    with open(os.path.join(WORKSPACE, "requirements.in")) as f:
        wanted = [l.strip() for l in f if l.strip()]
    progress("resolving %s (Python %s, wheels only)" % (", ".join(wanted), probe["python"]))
    common = ["--python", python, "--only-binary", ":all:", "--no-config"] + index
    if run_uv([uv, "pip", "compile", os.path.join(WORKSPACE, "requirements.in"), "-o", LOCK,
               "--generate-hashes", "--no-header", "--no-annotate", "--quiet"] + common):
        return 11
    with open(LOCK) as f:
        packages = re.findall(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s\\;]+)", f.read(), re.M)
    total = len(packages)
    progress("resolved %d package%s: %s" % (
        total, "" if total == 1 else "s", ", ".join("%s %s" % p for p in packages)))
    if run_uv([uv, "venv", ENV, "--python", python, "--relocatable", "--quiet", "--no-config"]):
        return 12
    progress("downloading and installing %d package%s" % (total, "" if total == 1 else "s"))
    done = []

    def installed(line):
        m = re.match(r"^ \+ ([^=\s]+)==(\S+)", line)
        if m:
            done.append(m.groups())
            progress("installed %s %s (%d of %d)" % (m.group(1), m.group(2), len(done), total))

    sync = [uv, "pip", "sync", LOCK, "--require-hashes"] + common
    sync[sync.index("--python") + 1] = os.path.join(ENV, "bin", "python")
    if run_uv(sync, installed):
        return 13
    compile_bytecode()
    report = dict(probe, packages=[{"name": n, "version": v} for n, v in packages])
    with open(os.path.join(WORKSPACE, "report.json"), "w") as f:
        json.dump(report, f)
    readable_by_all(ENV)
    for path in (WORKSPACE, LOCK, os.path.join(WORKSPACE, "report.json")):
        os.chmod(path, 0o755 if path == WORKSPACE else 0o644)
    return 0


if __name__ == "__main__":
    sys.exit(main())
