"""Code mode (issue 28): a trivial tool call from inside the sandbox,
against the same upstream called directly, in the same run.

Run by bench/run with the tools venv's python (it needs the MCP SDK), with
bench/run's pycelld. The upstream is tests/mcp/tool_upstream.py (the MCP
Python SDK over stdio); the tool is `add`. Rows, medians:

  - direct: `add` called by an MCP SDK client over stdio (the upstream's
    own latency, the baseline);
  - pycell run, embedded: `pycell_tools.test.add` timed inside the
    sandbox, calls one after another;
  - pycell run, through pycelld: the same;
  - pycell's own part of a round trip: `list_tools`, answered by the tool
    service outside the jail without the upstream;
  - 100 calls from one run, sequential and concurrent (20 threads), both
    ways.

Target: the round trip from inside the sandbox minus the direct one is
<= 1 ms, embedded and through pycelld.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import anyio
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

HERE = os.path.dirname(os.path.abspath(__file__))
UPSTREAM = os.path.join(HERE, "..", "tests", "mcp", "tool_upstream.py")

IN_SANDBOX = """
import json, threading, time
import pycell_tools as t
t.test.add(a=0, b=0)
each = []
for i in range(%(n)d):
    s = time.perf_counter()
    t.test.add(a=i, b=1)
    each.append(time.perf_counter() - s)
listing = []
for i in range(%(n)d):
    s = time.perf_counter()
    t.list_tools("test")
    listing.append(time.perf_counter() - s)
s = time.perf_counter()
for i in range(100):
    t.test.add(a=i, b=1)
seq = time.perf_counter() - s
def work(k):
    for i in range(5):
        t.test.add(a=k, b=i)
threads = [threading.Thread(target=work, args=(k,)) for k in range(20)]
s = time.perf_counter()
[th.start() for th in threads]
[th.join() for th in threads]
conc = time.perf_counter() - s
print(json.dumps({"each": each, "listing": listing, "seq100": seq, "conc100": conc}))
"""


async def direct(n):
    params = StdioServerParameters(command=sys.executable, args=[UPSTREAM])
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write) as session:
            await session.initialize()
            await session.call_tool("add", {"a": 0, "b": 0})
            each = []
            for i in range(n):
                s = time.perf_counter()
                await session.call_tool("add", {"a": i, "b": 1})
                each.append(time.perf_counter() - s)
            return each


def in_sandbox(pycell, servers, n, socket=None):
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(IN_SANDBOX % {"n": n})
    cmd = [pycell, "run", "--json", "--tool-servers", servers, "--timeout", "120"]
    cmd += ["--socket", socket] if socket else ["--embedded"]
    out = subprocess.run(cmd + [f.name], capture_output=True, text=True, timeout=300)
    os.unlink(f.name)
    r = json.loads(out.stdout)
    if r["status"] != "ok":
        sys.exit(f"bench/tool_calls.py: the run failed: {r.get('stderr') or r.get('error')}")
    return json.loads(r["stdout"])


def ms(x):
    return f"{x * 1000:.3f} ms"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pycell", required=True)
    ap.add_argument("--socket")
    ap.add_argument("--runs", type=int, default=200)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        servers = os.path.join(d, "servers.json")
        with open(servers, "w") as f:
            json.dump({"mcpServers": {"test": {"command": sys.executable, "args": [UPSTREAM]}}}, f)
        os.chmod(d, 0o755)
        base = statistics.median(anyio.run(direct, args.runs))
        rows = [("embedded", in_sandbox(args.pycell, servers, args.runs))]
        if args.socket:
            rows.append(("pycelld", in_sandbox(args.pycell, servers, args.runs, args.socket)))
    print(f"tool calls: add() on an MCP SDK stdio server, {args.runs} calls, medians")
    print(f"  direct (MCP SDK client, the baseline)   {ms(base)}")
    for name, r in rows:
        rt = statistics.median(r["each"])
        over = rt - base
        verdict = "meets" if over <= 0.001 else "MISSES"
        print(f"  from the sandbox, {name:<9}            {ms(rt)}  ({rt / base:.2f}x; overhead {ms(over)}: {verdict} <= 1 ms)")
        print(f"    pycell's own part: list_tools answered outside the jail, no upstream: {ms(statistics.median(r['listing']))}")
        print(f"    100 calls from one run: sequential {ms(r['seq100'])}, concurrent (20 threads) {ms(r['conc100'])}")


if __name__ == "__main__":
    main()
