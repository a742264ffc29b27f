"""A real pycelld for the client's tests: the one built next to $PYCELL_BIN
(scripts/test sets it; default target/debug), as root, on a socket in a
temporary directory, with sandbox uids and a cgroup parent of its own;
killed by its pid when the test is done."""

from __future__ import annotations

import os
import pathlib
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]


def built(name: str) -> pathlib.Path:
    pycell = pathlib.Path(os.environ.get("PYCELL_BIN") or REPO / "target" / "debug" / "pycell")
    path = pycell.with_name(name)
    if not path.is_file():
        pytest.fail(f"{path} is missing: build pycell first (cargo build --workspace), or set PYCELL_BIN")
    return path


class Pycelld:
    """One pycelld; `restart()` kills it (SIGKILL) and starts another on
    the same socket and config."""

    def __init__(self, directory: pathlib.Path, uid_base: int, extra: str = "") -> None:
        self.dir = directory
        self.socket = str(directory / "pycell.sock")
        self.config = directory / "pycelld.toml"
        self.config.write_text(
            f'socket = "{self.socket}"\n'
            f'audit_log = "{directory}/audit.jsonl"\n'
            f'cgroup_parent = "pycelld-pytest-{directory.name}"\n'
            f'uid_range = "{uid_base}-{uid_base + 63}"\n'
            'shutdown_grace = "5s"\n'
            "warm_pools = { default = 1 }\n"
            "session_pools = {}\n" + (extra or f'env_store = "{directory}/envs"\n')
        )
        self.process: subprocess.Popen[bytes] | None = None
        self.start()

    def start(self) -> None:
        if os.geteuid() != 0:
            pytest.fail("these tests start a real pycelld, which needs root: run them as root (scripts/test does)")
        log = open(self.dir / "pycelld.log", "ab")
        env = dict(os.environ, PYCELL_JAILER=str(built("pycell-jailer")))
        self.process = subprocess.Popen(
            [str(built("pycelld")), "--config", str(self.config)],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            env=env,
        )
        log.close()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                pytest.fail(f"pycelld exited {self.process.returncode}: {self.log()}")
            try:
                with socket.socket(socket.AF_UNIX) as s:
                    s.connect(self.socket)
                return
            except OSError:
                time.sleep(0.05)
        pytest.fail(f"pycelld did not listen within 30 s: {self.log()}")

    def log(self) -> str:
        return (self.dir / "pycelld.log").read_text(errors="replace")[-3000:]

    def audit(self) -> str:
        path = self.dir / "audit.jsonl"
        return path.read_text() if path.exists() else ""

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(30)

    def restart(self) -> None:
        self.kill()
        # The killed monitor's broker goes a moment later: until then it
        # may still accept on the socket. Start the next one once nothing
        # answers there.
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            try:
                with socket.socket(socket.AF_UNIX) as s:
                    s.connect(self.socket)
            except OSError:
                break
            time.sleep(0.05)
        self.start()

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.kill()


_daemons = iter(range(64))


def started(monkeypatch: pytest.MonkeyPatch, extra: str = "") -> Iterator[Pycelld]:
    with tempfile.TemporaryDirectory(prefix="pycelld-pytest-", dir="/tmp") as d:
        os.chmod(d, 0o755)
        base = 1_910_000_000 + (os.getpid() % 1000) * 4096 + next(_daemons) * 64
        daemon = Pycelld(pathlib.Path(d), base, extra)
        monkeypatch.setenv("PYCELL_SOCKET", daemon.socket)
        try:
            yield daemon
        finally:
            daemon.stop()
            remove_cgroup_parent(f"pycelld-pytest-{pathlib.Path(d).name}")


def remove_cgroup_parent(name: str) -> None:
    """Remove this test's cgroup parent (empty once its pycelld stopped) in
    every hierarchy. A pycelld makes it, and removes on stop what it made;
    after a restart (SIGKILL, then a new pycelld) the new one finds it
    there and keeps it, as it keeps a parent an operator made: a name of
    the test's own is the test's to remove."""
    root = pathlib.Path("/sys/fs/cgroup")
    lines = pathlib.Path("/proc/self/cgroup").read_text().splitlines()
    own = {line.split(":", 2)[2].lstrip("/") for line in lines}
    for base in [root, *(p for p in root.iterdir() if p.is_dir())]:
        for path in own:
            try:
                (base / path / name).rmdir()
            except OSError:
                pass


@pytest.fixture
def pycelld(monkeypatch: pytest.MonkeyPatch) -> Iterator[Pycelld]:
    """A pycelld of this test's own; PYCELL_SOCKET names it. Its env store
    is under /tmp, so runs with dependencies are refused."""
    yield from started(monkeypatch)


# Root-owned and not under a world-writable directory: pycelld builds envs
# and mounts wheelhouses only from such places.
DEPS = pathlib.Path("/var/cache/pycell-tests/pytest-deps")
MOUNTS = "".join(f'[[mounts]]\nsource = "{m}"\n' for m in ("/usr", "/bin", "/lib", "/lib64", "/sbin"))
HEAD = (
    'description = "pycell\'s Python client tests"\n'
    'namespaces = ["user", "pid", "mount", "net", "ipc", "uts", "cgroup"]\n'
    '[interpreter]\npython = "/usr/bin/python3"\n'
)


@pytest.fixture
def pycelld_with_deps(monkeypatch: pytest.MonkeyPatch) -> Iterator[Pycelld]:
    """A pycelld whose policy `pytest-deps` installs dependencies from the
    tests' offline wheelhouse (tests/deps/make_wheels.py), into an env
    store of its own."""
    shutil.rmtree(DEPS, ignore_errors=True)
    (DEPS / "policies").mkdir(parents=True)
    subprocess.run([sys.executable, str(REPO / "tests" / "deps" / "make_wheels.py"), str(DEPS / "wheels")], check=True)
    (DEPS / "policies" / "pytest-install.toml").write_text(
        'name = "pytest-install"\n' + HEAD + '[limits]\nwall_timeout = "2m"\ncpu_time = "2m"\nmemory = "1GiB"\n'
        'pids = 256\ncpus = 2.0\nopen_files = 4096\ndisk = "512MiB"\n'
        f'[install]\nfind_links = ["{DEPS}/wheels"]\n' + MOUNTS + '[env]\nPATH = "/usr/bin:/bin"\n'
        'HOME = "/workspace"\nUV_CACHE_DIR = "/tmp/uv-cache"\nUV_PYTHON_DOWNLOADS = "never"\nUV_NO_PROGRESS = "1"\n'
    )
    (DEPS / "policies" / "pytest-deps.toml").write_text(
        'name = "pytest-deps"\n'
        + HEAD
        + '[dependencies]\nallow = true\ninstall_policy = "pytest-install"\n'
        + MOUNTS
        + '[env]\nPATH = "/usr/bin:/bin"\nHOME = "/workspace"\n'
    )
    yield from started(monkeypatch, f'policy_dir = "{DEPS}/policies"\nenv_store = "{DEPS}/envs"\n')
