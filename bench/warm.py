"""Warm runs through pycelld (issue 15), against bare python in the same run.

Run by bench/run with the tools venv's python (it needs the MCP SDK), with
a pycelld whose config has warm pools for `default` and `data-science`
(whose env is built before the daemon starts). Every timed pycelld run is
checked to have gone warm; runs are paced so that the pool has refilled
between them (a latency benchmark; bench/throughput.py measures back-to-back
runs, warm or not).

Rows, interleaved one-to-one, medians:
  - print(1): bare /usr/bin/python3 -c 'print(1)' vs `pycell run --socket`
  - numpy: the data-science env's own python running
    `import numpy; print(numpy.zeros(3).sum())` bare, vs the same script
    through pycelld under the data-science policy (a warm member has
    numpy, pandas and matplotlib imported)
  - MCP: `run_python` print(1) per call through `pycell mcp` on the daemon
  - idle memory of a warm member, per policy (its cgroup's memory use)

Targets: warm print(1) <= 0.3x bare; warm numpy <= 0.2x bare; MCP per call
warm <= 0.5x bare.
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

    bare1, warm1 = paired(a.runs, 0.15, BARE, run + [os.path.join(HERE, "print1.py")])
    ds_runs = min(a.runs, 15)
    bare_np, warm_np = paired(
        ds_runs, 3.0, [a.env_python, numpy_py], run + ["--policy", "data-science", numpy_py]
    )
    bare_mcp, calls = asyncio.run(mcp_calls(a.pycell, a.socket, a.runs, 0.15))

    rows = [
        ("print(1): bare python3", median_ms(bare1), None),
        ("print(1): pycell run, warm (daemon)", median_ms(warm1), median_ms(bare1)),
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
    if idle_all:
        mib = [m / (1 << 20) for m in idle_all]
        print(f"\nidle warm members: {len(mib)}, memory each (MiB): "
              + ", ".join(f"{m:.1f}" for m in sorted(mib)))
    checks = [
        ("warm print(1) through the daemon <= 0.3x bare", rows[1][1] / rows[1][2], 0.3),
        ("warm data-science numpy <= 0.2x bare", rows[3][1] / rows[3][2], 0.2),
        ("MCP run_python per call warm <= 0.5x bare", rows[5][1] / rows[5][2], 0.5),
    ]
    print("\ntargets:")
    for text, got, limit in checks:
        print(f"  {'PASS' if got <= limit else 'MISS'}  {text}: {got:.2f}x")
    print(f"load average at the end: {open('/proc/loadavg').read().split()[0]} on {os.cpu_count()} cpus")


if __name__ == "__main__":
    main()
