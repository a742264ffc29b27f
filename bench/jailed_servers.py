"""Third-party MCP servers (issue 31): mcp-server-time run by
`pycell mcp-server` (embedded, and through bench/run's pycelld) against the
same server run bare by uvx with a warm cache, in the same run.

Rows (raw JSON-RPC over the server's stdio, one client for all rows):

  - start: from spawning the command to the answer of `initialize`, a
    cached server (its env in pycell's store, its packages in uv's cache);
    median of --starts sessions each;
  - tool call: one `tools/call` of get_current_time, after --warmup calls,
    median of --calls round trips in one session.

`uvx --offline` (no revalidation of uv's cache against the index) is
shown for information; the baseline is uvx as MCP hosts run it.

Targets: a tool call through the jailed server at most 1 ms above uvx's;
start at most 1.2x uvx's.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

INIT = {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
    "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "bench", "version": "1"}}}
INITIALIZED = {"jsonrpc": "2.0", "method": "notifications/initialized"}


def call(i):
    return {"jsonrpc": "2.0", "id": i, "method": "tools/call",
            "params": {"name": "get_current_time", "arguments": {"timezone": "Etc/UTC"}}}


def send(p, msg):
    p.stdin.write((json.dumps(msg) + "\n").encode())
    p.stdin.flush()


def answer(p, want_id):
    while True:
        line = p.stdout.readline()
        if not line:
            raise SystemExit(f"the server ended before answering {want_id}")
        msg = json.loads(line)
        if msg.get("id") == want_id:
            if "error" in msg or msg.get("result", {}).get("isError"):
                raise SystemExit(f"the server refused {want_id}: {line[:300]!r}")
            return msg


def session(cmd, calls, warmup):
    """(seconds to the initialize answer, each call's round trip)."""
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    try:
        send(p, INIT)
        answer(p, 0)
        start = time.perf_counter() - t0
        send(p, INITIALIZED)
        trips = []
        for i in range(1, warmup + calls + 1):
            s = time.perf_counter()
            send(p, call(i))
            answer(p, i)
            if i > warmup:
                trips.append(time.perf_counter() - s)
        return start, trips
    finally:
        p.stdin.close()
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def ms(x):
    return f"{x * 1000:8.2f} ms"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pycell", required=True)
    ap.add_argument("--socket", required=True)
    ap.add_argument("--uv", required=True)
    ap.add_argument("--starts", type=int, default=10)
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--warmup", type=int, default=10)
    a = ap.parse_args()
    rows = {
        "uvx (bare)": [a.uv, "tool", "run", "mcp-server-time"],
        # For information: uvx without revalidating its cache on the index.
        "uvx --offline (bare)": [a.uv, "tool", "run", "--offline", "mcp-server-time"],
        "pycell mcp-server": [a.pycell, "mcp-server", "--embedded", "mcp-server-time"],
        "pycell mcp-server (daemon)": [a.pycell, "mcp-server", "--socket", a.socket, "mcp-server-time"],
    }
    # Warm every cache: uv's, and the env in both stores.
    for cmd in rows.values():
        session(cmd, 1, 0)
    starts = {name: [] for name in rows}
    for _ in range(a.starts):
        for name, cmd in rows.items():
            starts[name].append(session(cmd, 0, 0)[0])
    trips = {name: session(cmd, a.calls, a.warmup)[1] for name, cmd in rows.items()}
    base_start = statistics.median(starts["uvx (bare)"])
    base_trip = statistics.median(trips["uvx (bare)"])
    print(f"{'mcp-server-time':28} {'start (median)':>16} {'ratio':>7} {'tool call (median)':>20} {'over uvx':>10}")
    for name in rows:
        s, t = statistics.median(starts[name]), statistics.median(trips[name])
        print(f"{name:28} {ms(s):>16} {s / base_start:6.2f}x {ms(t):>20} {(t - base_trip) * 1000:+8.3f} ms")
    ok = True
    for name in ("pycell mcp-server", "pycell mcp-server (daemon)"):
        s, t = statistics.median(starts[name]), statistics.median(trips[name])
        over = (t - base_trip) * 1000
        ok_call, ok_start = over <= 1.0, s / base_start <= 1.2
        ok = ok and ok_call and ok_start
        print(f"target: {name}: tool call <= +1 ms over uvx: {over:+.3f} ms {'PASS' if ok_call else 'MISS'}; "
              f"start <= 1.2x uvx: {s / base_start:.2f}x {'PASS' if ok_start else 'MISS'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
