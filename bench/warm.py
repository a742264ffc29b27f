"""Warm runs through pycelld (issue 15), against bare python in the same run.

Run by bench/run with the tools venv's python (it needs the MCP SDK), with
a pycelld whose config has warm pools for `default` and `data-science`
(whose env is built before the daemon starts). Every timed pycelld run is
checked to have gone warm; runs are paced so that the pool has refilled
between them (a latency benchmark; bench/throughput.py measures concurrent
runs, warm or not).

Rows, interleaved one-to-one, medians:
  - print(1): bare /usr/bin/python3 -c 'print(1)' vs `pycell run --socket`
  - print(1) back to back: blocks of bare spawns, then blocks of `pycell
    run` one right after another (the pool refills while they go on; each
    run that found no ready member goes cold and is counted)
  - numpy: the data-science env's own python running
    `import numpy; print(numpy.zeros(3).sum())` bare, vs the same script
    through pycelld under the data-science policy (a warm member has
    numpy, pandas and matplotlib imported)
  - MCP: `run_python` print(1) per call through `pycell mcp` on the daemon
  - idle memory of a warm member, per policy (its cgroup's memory use)
  - the refill: from the moment a run is asked for until the `default`
    pool is full again (polled through the Python client)

Targets (issue 50): warm print(1) paced <= 0.4x bare, back to back <= 0.5x;
warm numpy <= 0.2x bare; MCP per call warm <= 0.5x bare.
"""
import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python", "src"))

import pycell  # noqa: E402

BARE = ["/usr/bin/python3", "-c", "print(1)"]
NUMPY = "import numpy; print(numpy.zeros(3).sum())\n"


def spawn(cmd, env=None):
    t0 = time.perf_counter()
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    dt = time.perf_counter() - t0
    if p.returncode != 0:
        raise SystemExit(f"bench/warm.py: {cmd} failed: {p.stderr.decode()[-2000:]}")
    return dt, p.stdout


def warm_run(cmd):
    """Time a `pycell run --json` through the daemon; insist it went warm."""
    dt, out = spawn(cmd)
    r = json.loads(out)
    if not r.get("warm"):
        raise SystemExit(f"bench/warm.py: a paced run did not go warm: {r}")
    return dt


def paired(runs, pace, base_cmd, warm_cmd):
    bare, warm = [], []
    for i in range(runs + 3):
        b, _ = spawn(base_cmd)
        time.sleep(pace)
        w = warm_run(warm_cmd)
        if i >= 3:
            bare.append(b)
            warm.append(w)
    return bare, warm


def back_to_back(runs, block, base_cmd, run_cmd):
    """Blocks of `block` bare spawns, then `block` pycelld runs one right
    after another: whether the pool keeps up when runs do not wait for it.
    The bare and pycell times, and how many runs went cold."""
    bare, ours, cold = [], [], 0
    for _ in range(max(1, runs // block)):
        for _ in range(block):
            bare.append(spawn(base_cmd)[0])
        for _ in range(block):
            dt, out = spawn(run_cmd)
            ours.append(dt)
            cold += not json.loads(out).get("warm")
    return bare, ours, cold


def pool_full(client, policy):
    for pool in client.info()["daemon"]["warm_pools"]:
        if pool["policy"] == policy and not pool["sessions"]:
            return pool["ready"] == pool["size"]
    raise SystemExit(f"bench/warm.py: pycelld has no run pool of {policy!r}")


def wait_full(client, policy, timeout=30.0):
    deadline = time.perf_counter() + timeout
    while not pool_full(client, policy):
        if time.perf_counter() > deadline:
            raise SystemExit(f"bench/warm.py: the {policy!r} pool did not fill in {timeout} s")
        time.sleep(0.001)


def refills(client, run_cmd, tries):
    """From the moment a run is asked for (its member is taken a few ms
    later) until the `default` pool is full again."""
    out = []
    for _ in range(tries):
        wait_full(client, "default")
        t0 = time.perf_counter()
        warm_run(run_cmd)
        wait_full(client, "default")
        out.append(time.perf_counter() - t0)
    return out


async def mcp_calls(pycell, socket, runs, pace):
    from mcp import ClientSession, StdioServerParameters
    from mcp.client.stdio import stdio_client

    env = dict(os.environ, PYCELL_SOCKET=socket)
    params = StdioServerParameters(command=pycell, args=["mcp"], env=env)
    calls, bares = [], []
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write) as session:
            await session.initialize()
            for i in range(runs + 3):
                await asyncio.sleep(pace)
                t0 = time.perf_counter()
                r = await session.call_tool("run_python", {"code": "print(1)"})
                dt = time.perf_counter() - t0
                sc = r.structured_content or {}
                if sc.get("stdout") != "1\n" or not sc.get("warm"):
                    raise SystemExit(f"bench/warm.py: run_python did not go warm: {sc}")
                b, _ = spawn(BARE)
                if i >= 3:
                    calls.append(dt)
                    bares.append(b)
    return bares, calls


def member_memory(cgroup_parent):
    """Memory in use by each idle warm member: its run cgroup's."""
    out = []
    for root in ("/sys/fs/cgroup/memory", "/sys/fs/cgroup"):
        for dirpath, dirs, _ in os.walk(root):
            if cgroup_parent not in dirpath:
                continue
            for d in dirs:
                if not d.startswith("pycell-"):
                    continue
                for f in ("memory.usage_in_bytes", "memory.current"):
                    try:
                        with open(os.path.join(dirpath, d, f)) as fh:
                            out.append(int(fh.read()))
                        break
                    except OSError:
                        continue
        if out:
            break
    return out


def median_ms(xs):
    return statistics.median(xs) * 1000


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pycell", required=True)
    ap.add_argument("--socket", required=True)
    ap.add_argument("--env-python", required=True, help="the data-science env's python")
    ap.add_argument("--cgroup-parent", required=True)
    ap.add_argument("--runs", type=int, default=50)
    a = ap.parse_args()
    run = [a.pycell, "run", "--json", "--socket", a.socket]
    numpy_py = os.path.join(os.environ.get("BENCH_OUT", "/tmp"), "numpy_sum.py")
    with open(numpy_py, "w") as f:
        f.write(NUMPY)

    time.sleep(3)  # the pools fill (data-science members import for a while)
    idle_all = member_memory(a.cgroup_parent)

    print1 = run + [os.path.join(HERE, "print1.py")]
    bare1, warm1 = paired(a.runs, 0.15, BARE, print1)
    bare_b2b, b2b, went_cold = back_to_back(a.runs, 5, BARE, print1)
    refill = refills(pycell.Client(a.socket), print1, min(a.runs, 20))
    ds_runs = min(a.runs, 15)
    bare_np, warm_np = paired(
        ds_runs, 3.0, [a.env_python, numpy_py], run + ["--policy", "data-science", numpy_py]
    )
    bare_mcp, calls = asyncio.run(mcp_calls(a.pycell, a.socket, a.runs, 0.15))

    rows = [
        ("print(1): bare python3", median_ms(bare1), None),
        ("print(1): pycell run, warm (daemon)", median_ms(warm1), median_ms(bare1)),
        ("print(1) back to back: bare python3", median_ms(bare_b2b), None),
        ("print(1) back to back: pycell run (daemon)", median_ms(b2b), median_ms(bare_b2b)),
        ("numpy sum: bare env python", median_ms(bare_np), None),
        ("numpy sum: pycell run, warm data-science", median_ms(warm_np), median_ms(bare_np)),
        ("MCP: bare python3 (interleaved)", median_ms(bare_mcp), None),
        ("MCP: run_python per call, warm", median_ms(calls), median_ms(bare_mcp)),
    ]
    print(f"warm runs through pycelld; medians, paced (pool refilled between runs); "
          f"{a.runs} runs ({ds_runs} for numpy)\n")
    print(f"{'':<44} {'median ms':>9} {'vs bare':>8}")
    for name, ms, base in rows:
        ratio = f"{ms / base:.2f}x" if base else "(bare)"
        print(f"{name:<44} {ms:>9.2f} {ratio:>8}")
    print(f"\nback to back: {went_cold} of {len(b2b)} runs found no ready member (cold)")
    print(f"refill of the default pool, from a run asked for until full again: "
          f"median {median_ms(refill):.1f} ms, max {max(refill) * 1000:.1f} ms "
          f"({len(refill)} runs); back-to-back runs came every {median_ms(b2b):.1f} ms")
    if idle_all:
        mib = [m / (1 << 20) for m in idle_all]
        print(f"\nidle warm members: {len(mib)}, memory each (MiB): "
              + ", ".join(f"{m:.1f}" for m in sorted(mib)))
    checks = [
        ("warm print(1) through the daemon, paced <= 0.4x bare", rows[1][1] / rows[1][2], 0.4),
        ("warm print(1) through the daemon, back to back <= 0.5x bare", rows[3][1] / rows[3][2], 0.5),
        ("warm data-science numpy <= 0.2x bare", rows[5][1] / rows[5][2], 0.2),
        ("MCP run_python per call warm <= 0.5x bare", rows[7][1] / rows[7][2], 0.5),
    ]
    print("\ntargets:")
    for text, got, limit in checks:
        print(f"  {'PASS' if got <= limit else 'MISS'}  {text}: {got:.2f}x")
    print(f"load average at the end: {open('/proc/loadavg').read().split()[0]} on {os.cpu_count()} cpus")


if __name__ == "__main__":
    main()
