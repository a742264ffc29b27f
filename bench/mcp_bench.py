"""`pycell mcp` through the official MCP Python SDK, against bare python in the
same run:

- per call: `run_python` with `print(1)`, many calls in one session (after a
  warmup, from the first call forked from the server's zygote), each timed
  from the SDK's call_tool to its result; interleaved
  with bare `python3 -c 'print(1)'` spawns (subprocess.run, output
  discarded), so that both see the same machine load, and with
  `pycell run bench/print1.py` (embedded) for reference;
- session start: spawning `pycell mcp` and completing `initialize` (the
  2025-11-25 handshake hosts use today), a new process each time; and, for
  information, the same with the 2026-07-28 `server/discover` path.

    .cache/tools/bin/python bench/mcp_bench.py --pycell target/release/pycell [--runs N] [--json FILE] [--strict]

Run by bench/run (as root: embedded mode builds real jails). Targets (issue 4):
per call at most 1.5x bare python; session start under 50 ms. --strict exits 1
when a target is missed.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import anyio
from mcp import ClientSession, StdioServerParameters
from mcp.client import Client
from mcp.client.stdio import stdio_client

BARE = ["/usr/bin/python3", "-c", "print(1)"]
WARMUP = 5
WARM_WAIT = 30


def spawn_once(cmd):
    t0 = time.perf_counter()
    subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    return time.perf_counter() - t0


async def print1(session):
    """One run_python print(1): its latency and whether it was warm."""
    t0 = time.perf_counter()
    r = await session.call_tool("run_python", {"code": "print(1)"})
    dt = time.perf_counter() - t0
    sc = r.structured_content or {}
    if r.is_error or sc.get("status") != "ok" or sc.get("stdout") != "1\n":
        raise SystemExit(f"bench/mcp_bench.py: run_python(print(1)) did not work: {r}")
    return dt, bool(sc.get("warm"))


async def per_call(params, runs, pycell_run):
    """(call, bare, pycell run latencies), interleaved, in seconds, and how
    many of the timed calls were warm. Timed from the first warm call (the
    server's zygote, started in the background, is ready; at most
    WARM_WAIT seconds), after WARMUP calls at least."""
    calls, bares, cli, warm = [], [], [], 0
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write) as session:
            await session.initialize()
            deadline = time.monotonic() + WARM_WAIT
            for _ in range(WARMUP):
                await print1(session)
            while not (await print1(session))[1] and time.monotonic() < deadline:
                await anyio.sleep(0.1)
            for _ in range(runs):
                dt, was_warm = await print1(session)
                warm += was_warm
                calls.append(dt)
                bares.append(spawn_once(BARE))
                cli.append(spawn_once(pycell_run))
    return calls, bares, cli, warm


async def session_starts(params, runs):
    """Spawn + initialize, a new server each time, in seconds."""
    out = []
    for i in range(WARMUP + runs):
        t0 = time.perf_counter()
        async with stdio_client(params) as (read, write):
            async with ClientSession(read, write) as session:
                await session.initialize()
                dt = time.perf_counter() - t0
        if i >= WARMUP:
            out.append(dt)
    return out


async def discover_starts(params, runs):
    """Spawn + server/discover (the SDK's Client in auto mode), in seconds."""
    out = []
    for i in range(WARMUP + runs):
        t0 = time.perf_counter()
        async with Client(params, mode="auto") as client:
            dt = time.perf_counter() - t0
            if client.session.protocol_version != "2026-07-28":
                raise SystemExit(f"bench/mcp_bench.py: discover negotiated {client.session.protocol_version}")
        if i >= WARMUP:
            out.append(dt)
    return out


def stats(xs):
    ms = sorted(x * 1000 for x in xs)
    return {
        "median": statistics.median(ms),
        "min": ms[0],
        "p90": statistics.quantiles(ms, n=10)[-1] if len(ms) > 1 else ms[0],
        "runs": len(ms),
    }


async def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pycell", required=True)
    ap.add_argument("--runs", type=int, default=int(os.environ.get("BENCH_RUNS", "100")))
    ap.add_argument("--json", help="also write the measurements here")
    ap.add_argument("--strict", action="store_true")
    a = ap.parse_args()
    params = StdioServerParameters(command=a.pycell, args=["mcp"])

    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "print1.py")
    calls, bares, cli, warm = await per_call(params, a.runs, [a.pycell, "run", script])
    starts = await session_starts(params, a.runs)
    discovers = await discover_starts(params, a.runs)
    rows = {
        "bare python3 -c 'print(1)'": stats(bares),
        "run_python print(1), per call": stats(calls),
        "pycell run print1.py (reference)": stats(cli),
        "session start (spawn + initialize)": stats(starts),
        "session start (spawn + discover)": stats(discovers),
    }
    base = rows["bare python3 -c 'print(1)'"]["median"]
    print(f"pycell mcp via the official MCP Python SDK; medians over {a.runs} runs (after {WARMUP} warmup)\n")
    width = max(map(len, rows))
    head = f"{'':<{width}}  {'median ms':>9}  {'min ms':>7}  {'p90 ms':>7}  {'vs bare':>7}"
    print(head)
    print("-" * len(head))
    for name, s in rows.items():
        print(f"{name:<{width}}  {s['median']:>9.2f}  {s['min']:>7.2f}  {s['p90']:>7.2f}  {s['median'] / base:>6.2f}x")
    call = rows["run_python print(1), per call"]["median"]
    start = rows["session start (spawn + initialize)"]["median"]
    verdicts = [
        (f"run_python print(1) per call <= 1.5x bare python: {call / base:.2f}x ({call:.2f} ms vs {base:.2f} ms)",
         call / base <= 1.5),
        (f"session start (spawn + initialize) < 50 ms: {start:.2f} ms", start < 50.0),
    ]
    cli_ms = rows["pycell run print1.py (reference)"]["median"]
    print(f"\nrun_python calls forked from the server's zygote: {warm} of {a.runs}")
    print(f"run_python over pycell run (a cold jail, with its CLI process): {call - cli_ms:+.2f} ms")
    print(f"load average at the end: {open('/proc/loadavg').read().split()[0]} on {os.cpu_count()} cpus")
    print("\ntargets:")
    for text, ok in verdicts:
        print(f"  {'PASS' if ok else 'MISS'}  {text}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"runs": a.runs, "warm_calls": warm, "rows": rows}, f, indent=2)
    return 1 if a.strict and not all(ok for _, ok in verdicts) else 0


if __name__ == "__main__":
    sys.exit(anyio.run(main))
