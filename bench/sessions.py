"""Sessions through pycelld (issue 27), against baselines of the same run.

Run by bench/run with the tools venv's python (it needs the MCP SDK), with
bench/run's pycelld. Rows, medians:

  - per cell over the raw protocol: `x += 1` as a `session` message on one
    connection, against a `session_list` round trip on the same connection
    (the protocol's floor: a frame each way through the broker);
  - per cell over MCP: run_python with `session` through `pycell mcp` on
    the daemon, against a `session_list` tool call (MCP's floor);
  - session_start with a session jail of the pool ready (pycelld's
    `session_pools`, paced so that the pool refills), and session_end (its
    jail gone), against `pycell run print(1)` through the same daemon
    (warm, from its run pool);
  - idle memory of a session (its cgroup's, after one cell), under default
    and data-science.

  - session_fork (issue 51) of a bare session and of a data-science one
    (numpy and pandas imported, a 10,000-row frame), and of one with an
    8 MB array too (how the time grows with the state), a pooled jail
    free for the fork, against session_start of the same policy (pooled
    too); session_snapshot of each, and session_start from the snapshot
    (no target: times and sizes).

Targets: a cell <= 1 ms over the raw protocol and <= 2 ms per MCP call;
session_start <= 10 ms with a warm jail free; session_fork <= 20 ms bare
and <= 50 ms data-science.
"""
import argparse
import asyncio
import json
import os
import socket as sk
import statistics
import struct
import subprocess
import sys
import time


class Raw:
    """The daemon protocol, by hand: 4-byte big-endian length, JSON."""

    def __init__(self, path):
        self.s = sk.socket(sk.AF_UNIX)
        self.s.connect(path)
        self.send({"type": "hello", "version": 6, "client": "bench/sessions.py"})
        self.recv()

    def send(self, m):
        b = json.dumps(m).encode()
        self.s.sendall(struct.pack(">I", len(b)) + b)

    def recv(self):
        n = struct.unpack(">I", self.s.recv(4, sk.MSG_WAITALL))[0]
        return json.loads(self.s.recv(n, sk.MSG_WAITALL))

    def ask(self, m):
        self.send(m)
        while True:
            r = self.recv()
            if r["type"] not in ("queued", "installing"):
                return r


def start(raw, policy):
    r = raw.ask({"type": "session_start", "id": "1", "request": {"policy": policy}})
    if r["type"] != "session_started":
        raise SystemExit(f"bench/sessions.py: session_start under {policy}: {r}")
    return r["session"]


def cell(raw, handle, code):
    r = raw.ask({"type": "session", "id": "1", "session": handle, "call": {"op": "cell", "code": code}})
    if r["type"] != "session_answer" or r["answer"]["reply"].get("error"):
        raise SystemExit(f"bench/sessions.py: a cell failed: {r}")
    return r["answer"]


def end(raw, handle):
    r = raw.ask({"type": "session_end", "id": "1", "session": handle})
    if r["type"] != "session_ended":
        raise SystemExit(f"bench/sessions.py: session_end: {r}")


def timed(f):
    t0 = time.perf_counter()
    f()
    return (time.perf_counter() - t0) * 1000


def raw_cells(sock, runs):
    raw = Raw(sock)
    h = start(raw, "default")["session"]
    cell(raw, h, "x = 0")
    floor, cells = [], []
    for i in range(runs + 10):
        f = timed(lambda: raw.ask({"type": "session_list", "id": "1"}))
        c = timed(lambda: cell(raw, h, "x += 1"))
        if i >= 10:
            floor.append(f)
            cells.append(c)
    end(raw, h)
    return floor, cells


def pool_ready(sock, policy="default"):
    """Wait until the daemon's session pool of `policy` has a ready jail."""
    raw = Raw(sock)
    for _ in range(1200):
        info = raw.ask({"type": "info"})["info"]["daemon"]
        pools = info["warm_pools"]
        if any(p.get("sessions") and p["policy"] == policy and p["ready"] > 0 for p in pools):
            return
        time.sleep(0.05)
    raise SystemExit(f"bench/sessions.py: the session pool of {policy} never got a ready jail")


# What a session holds before it forks: a bare one a few names; a
# data-science one numpy and pandas imported, a generator, a 10,000-row
# frame; and the same with an 8 MB array (how the time grows with state).
FORK_SETUP = {
    "default": "import json, random\nx = 41\nrng = random.Random(1)\nopen('notes.txt', 'w').write('x')",
    "data-science": "import numpy as np, pandas as pd\nrng = np.random.default_rng(1)\n"
    "df = pd.DataFrame({'a': rng.normal(size=10_000), 'b': range(10_000)})",
    "data-science, 8 MB array": "import numpy as np, pandas as pd\nrng = np.random.default_rng(1)\n"
    "a = rng.normal(size=1_000_000)\ndf = pd.DataFrame({'a': a[:10_000]})",
}


def forks(sock, setup, runs):
    """session_fork of a session set up as FORK_SETUP[setup] (a pooled
    jail free for the fork: paced), against session_start of the same
    policy, also pooled; and the size of the state carried."""
    policy = setup.split(",")[0]
    raw = Raw(sock)
    pool_ready(sock, policy)
    h = start(raw, policy)["session"]
    cell(raw, h, FORK_SETUP[setup])
    started, forked, size = [], [], 0
    for i in range(runs + 2):
        pool_ready(sock, policy)
        t0 = time.perf_counter()
        s = start(raw, policy)["session"]
        st = (time.perf_counter() - t0) * 1000
        end(raw, s)
        pool_ready(sock, policy)
        t0 = time.perf_counter()
        r = raw.ask({"type": "session_fork", "id": "1", "session": h})
        fk = (time.perf_counter() - t0) * 1000
        if r["type"] != "session_forked":
            raise SystemExit(f"bench/sessions.py: session_fork under {policy}: {r}")
        size = r["fork"]["state_bytes"]
        end(raw, r["fork"]["session"]["session"])
        if i >= 2:
            started.append(st)
            forked.append(fk)
    end(raw, h)
    return started, forked, size


def starts(sock, pycell, runs):
    raw = Raw(sock)
    cold, started, ended = [], [], []
    for i in range(runs + 2):
        t0 = time.perf_counter()
        subprocess.run([pycell, "run", "--socket", sock, "-"], input=b"print(1)\n", stdout=subprocess.DEVNULL, check=True)
        c = (time.perf_counter() - t0) * 1000
        pool_ready(sock)
        t0 = time.perf_counter()
        h = start(raw, "default")["session"]
        s = (time.perf_counter() - t0) * 1000
        e = timed(lambda: end(raw, h))
        if i >= 2:
            cold.append(c)
            started.append(s)
            ended.append(e)
    return cold, started, ended


def snapshots(sock, setup, runs):
    """session_snapshot of a session set up as FORK_SETUP[setup], and
    session_start from that snapshot (a pooled jail free: paced); the
    snapshot's size."""
    policy = setup.split(",")[0]
    raw = Raw(sock)
    pool_ready(sock, policy)
    h = start(raw, policy)["session"]
    cell(raw, h, FORK_SETUP[setup])
    taken, restored, size = [], [], 0
    for i in range(runs + 2):
        t0 = time.perf_counter()
        r = raw.ask({"type": "session_snapshot", "id": "1", "session": h})
        t = (time.perf_counter() - t0) * 1000
        if r["type"] != "session_snapshotted":
            raise SystemExit(f"bench/sessions.py: session_snapshot under {setup}: {r}")
        size = r["snapshot"]["size_bytes"]
        pool_ready(sock, policy)
        req = {"from_snapshot": r["snapshot"]["snapshot"]}
        t0 = time.perf_counter()
        s = raw.ask({"type": "session_start", "id": "1", "request": req})
        rs = (time.perf_counter() - t0) * 1000
        if s["type"] != "session_started":
            raise SystemExit(f"bench/sessions.py: a start from a snapshot under {setup}: {s}")
        end(raw, s["session"]["session"])
        if i >= 2:
            taken.append(t)
            restored.append(rs)
    end(raw, h)
    return taken, restored, size


def idle_memory(sock, policy):
    raw = Raw(sock)
    info = start(raw, policy)
    a = cell(raw, info["session"], "pass")
    end(raw, info["session"])
    return a["measure"]["memory_bytes"]


async def mcp_cells(pycell, sock, runs):
    from mcp import ClientSession, StdioServerParameters
    from mcp.client.stdio import stdio_client

    env = dict(os.environ, PYCELL_SOCKET=sock)
    params = StdioServerParameters(command=pycell, args=["mcp"], env=env)
    floor, cells = [], []
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write) as session:
            await session.initialize()
            r = await session.call_tool("session_start", {})
            h = r.structured_content["session"]
            await session.call_tool("run_python", {"session": h, "code": "x = 0"})
            for i in range(runs + 10):
                t0 = time.perf_counter()
                await session.call_tool("session_list", {})
                f = (time.perf_counter() - t0) * 1000
                t0 = time.perf_counter()
                r = await session.call_tool("run_python", {"session": h, "code": "x += 1"})
                c = (time.perf_counter() - t0) * 1000
                if r.is_error or r.structured_content.get("status") != "ok":
                    raise SystemExit(f"bench/sessions.py: an MCP cell failed: {r}")
                if i >= 10:
                    floor.append(f)
                    cells.append(c)
            await session.call_tool("session_end", {"session": h})
    return floor, cells


def med(xs):
    return statistics.median(xs)


def row(name, ms, base=None):
    ratio = f"{med(ms) / med(base):6.2f}x" if base else "  (base)"
    print(f"  {name:<52} {med(ms):8.2f} ms  {ratio}")


def target(ok, what):
    print(f"  {'PASS' if ok else 'MISS'}  {what}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pycell", required=True)
    ap.add_argument("--socket", required=True)
    ap.add_argument("--runs", type=int, default=100)
    a = ap.parse_args()
    print(f"sessions through pycelld; medians over {a.runs} calls (after 10 warm-up ones)")
    floor, cells = raw_cells(a.socket, a.runs)
    row("raw protocol: session_list round trip", floor)
    row("raw protocol: cell `x += 1`", cells, floor)
    mfloor, mcells = asyncio.run(mcp_cells(a.pycell, a.socket, a.runs))
    row("MCP: session_list call", mfloor)
    row("MCP: run_python `x += 1` in a session", mcells, mfloor)
    n = max(5, a.runs // 10)
    cold, started, ended = starts(a.socket, a.pycell, n)
    row(f"pycell run print(1) through pycelld ({n} runs)", cold)
    row("session_start (a pooled jail taken, clocks started)", started, cold)
    row("session_end (jail gone)", ended, cold)
    fork_ms = {}
    for setup in FORK_SETUP:
        started, forked, size = forks(a.socket, setup, n)
        row(f"session_start under {setup.split(',')[0]} (pooled)", started)
        row(f"session_fork, {setup} ({size / 2**20:.2f} MiB of state)", forked, started)
        fork_ms[setup] = med(forked)
    for setup in FORK_SETUP:
        taken, restored, size = snapshots(a.socket, setup, n)
        row(f"session_snapshot, {setup} ({size / 2**20:.2f} MiB)", taken)
        row("session_start from it (pooled)", restored, taken)
    for policy in ("default", "data-science"):
        print(f"  idle memory of a session under {policy}: {idle_memory(a.socket, policy) / 2**20:.1f} MiB")
    print("targets:")
    target(med(cells) <= 1.0, f"a cell over the raw protocol <= 1 ms: {med(cells):.2f} ms")
    target(med(mcells) <= 2.0, f"a cell per MCP call <= 2 ms: {med(mcells):.2f} ms")
    target(med(started) <= 10.0, f"session_start <= 10 ms with a session jail of the pool free: {med(started):.2f} ms")
    target(fork_ms["default"] <= 20.0, f"session_fork of a bare session <= 20 ms: {fork_ms['default']:.2f} ms")
    target(fork_ms["data-science"] <= 50.0, f"session_fork of a data-science session <= 50 ms: {fork_ms['data-science']:.2f} ms")


if __name__ == "__main__":
    sys.exit(main())
