"""`pycell mcp --http` (issue 32), against baselines of the same run.

Run by bench/run with the tools venv's python (it needs the MCP SDK), as
root. It starts its own pycelld nodes (like bench/run's, with the front
end's uid in front_end_uids), and front ends that become that uid. Rows,
medians:

  - per call: run_python `print(1)` over stdio (`pycell mcp` on the
    node's socket) and over streamable HTTP on loopback (`pycell mcp
    --http`, a bearer token, one node), target <= +1 ms: through the
    official SDK (with its session_list, which runs nothing, for the SDK's
    own cost per transport), and through a lean client (a pipe; Python's
    http.client) for pycell's own;
  - sessions per second through a front end over three nodes (each behind
    its `pycell gateway`, mutual TLS): session_start, one cell, session_end,
    from --clients concurrent clients; against the same through a front end
    over one node.
"""
import argparse
import asyncio
import http.client
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import httpx2
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client

FRONT_UID = 64981
HERE = os.path.dirname(os.path.abspath(__file__))


def start_node(pycelld, jailer, d, name, uid_base):
    os.makedirs(d, exist_ok=True)
    os.chmod(d, 0o755)
    conf = os.path.join(d, "pycelld.toml")
    with open(conf, "w") as f:
        f.write(
            f'socket = "{d}/pycell.sock"\nsocket_mode = "0666"\naudit_log = "off"\n'
            f'cgroup_parent = "pycelld-bench-http-{name}"\nuid_range = "{uid_base}-{uid_base + 63}"\n'
            f"allowed_uids = [{FRONT_UID}]\nfront_end_uids = [{FRONT_UID}]\n"
            f'warm_pools = {{ default = 2 }}\nsession_pools = {{ default = 2 }}\nenv_store = "{d}/envs"\n'
        )
    p = subprocess.Popen([pycelld, "--config", conf], env=dict(os.environ, PYCELL_JAILER=jailer),
                         stdout=subprocess.DEVNULL, stderr=open(os.path.join(d, "log"), "w"))
    for _ in range(200):
        if os.path.exists(f"{d}/pycell.sock"):
            break
        time.sleep(0.05)
    return p, f"{d}/pycell.sock"


def daemon_binaries(pycell):
    """pycelld and pycell-jailer beside `pycell`."""
    target_dir = os.path.dirname(pycell)
    return os.path.join(target_dir, "pycelld"), os.path.join(target_dir, "pycell-jailer")


def stop_all(procs):
    """SIGTERM each process started, then wait for it (SIGKILL after 20 s)."""
    for p in procs:
        p.terminate()
    for p in procs:
        try:
            p.wait(timeout=20)
        except subprocess.TimeoutExpired:
            p.kill()


def serve(cmd, marker):
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    line = p.stderr.readline()
    if marker not in line:
        raise SystemExit(f"bench/mcp_http.py: {cmd[:3]} did not start: {line}")
    return p, line.split(marker)[1].split(" ")[0]


def token(pycell, d):
    out = subprocess.run([pycell, "mcp-token", "bench"], capture_output=True, text=True, check=True)
    path = os.path.join(d, "tokens.toml")
    with open(path, "w") as f:
        # The bench measures the server, not the default quotas.
        f.write(out.stdout + "max_concurrent_runs = 64\nruns_per_minute = 60000\n")
    return out.stderr.strip().splitlines()[-1], path


# Paced: the node's warm pool refills between runs, so that every run of
# either transport takes a warm jail (unpaced, which calls find the pool
# empty depends on timing, not on the transport).
PACE = 0.05


async def calls(client, n, name="run_python", args=None):
    times = []
    for i in range(n + 10):
        t0 = time.perf_counter()
        r = await client.call_tool(name, args if args is not None else {"code": "print(1)"})
        if r.is_error:
            raise SystemExit(f"bench/mcp_http.py: a call failed: {r}")
        if i >= 10:
            times.append((time.perf_counter() - t0) * 1000)
        await asyncio.sleep(PACE)
    return times


INIT = {"jsonrpc": "2.0", "id": 0, "method": "initialize",
        "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "lean", "version": "1"}}}


def lean(pycell, sock, url, tok, n):
    """The same calls from a lean client (a pipe with one JSON line each
    way; http.client on one kept-alive connection): pycell's own cost per
    transport, without the SDK's."""
    s = subprocess.Popen([pycell, "mcp"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         env=dict(os.environ, PYCELL_SOCKET=sock))

    def stdio(m):
        s.stdin.write((json.dumps(m) + "\n").encode())
        s.stdin.flush()
        return json.loads(s.stdout.readline()) if "id" in m else None

    conn = http.client.HTTPConnection(url.split("//")[1].split("/")[0])
    headers = {"Authorization": f"Bearer {tok}", "Content-Type": "application/json",
               "Accept": "application/json, text/event-stream", "MCP-Protocol-Version": "2025-11-25"}

    def http_(m):
        conn.request("POST", "/mcp", json.dumps(m), headers)
        body = conn.getresponse().read()
        return json.loads(body) if body else None

    try:
        stdio(INIT)
        stdio({"jsonrpc": "2.0", "method": "notifications/initialized"})
        http_(INIT)
        out = {"stdio": [], "http": []}
        for i in range(n + 10):
            for k, send in (("stdio", stdio), ("http", http_)):
                m = {"jsonrpc": "2.0", "id": i + 1, "method": "tools/call",
                     "params": {"name": "run_python", "arguments": {"code": "print(1)"}}}
                t0 = time.perf_counter()
                r = send(m)
                dt = (time.perf_counter() - t0) * 1000
                if "result" not in r or r["result"].get("isError"):
                    raise SystemExit(f"bench/mcp_http.py: a lean call failed: {r}")
                if i >= 10:
                    out[k].append(dt)
                time.sleep(PACE)
        return out
    finally:
        s.terminate()
        s.wait()


def http_client(url, tok):
    http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {tok}"}, timeout=120)
    return Client(streamable_http_client(url, http_client=http), mode="legacy")


async def per_call(pycell, sock, url, tok, n):
    env = dict(os.environ, PYCELL_SOCKET=sock)
    stdio = StdioServerParameters(command=pycell, args=["mcp"], env=env)
    out = {"stdio": [], "http": [], "stdio_floor": [], "http_floor": []}
    # Interleaved rounds, so that drift on the machine hits both alike.
    async with Client(stdio, mode="legacy") as s, http_client(url, tok) as h:
        for _ in range(4):
            out["stdio"] += await calls(s, n // 4)
            out["http"] += await calls(h, n // 4)
            out["stdio_floor"] += await calls(s, n // 4, "session_list", {})
            out["http_floor"] += await calls(h, n // 4, "session_list", {})
    return out


async def sessions_per_second(url, tok, clients, seconds):
    done = 0
    deadline = time.monotonic() + seconds

    async def one():
        nonlocal done
        async with http_client(url, tok) as c:
            while time.monotonic() < deadline:
                s = await c.call_tool("session_start", {})
                if s.is_error:
                    raise SystemExit(f"bench/mcp_http.py: session_start failed: {s.content}")
                h = s.structured_content["session"]
                await c.call_tool("run_python", {"session": h, "code": "x = 1"})
                await c.call_tool("session_end", {"session": h})
                done += 1

    t0 = time.monotonic()
    await asyncio.gather(*(one() for _ in range(clients)))
    return done / (time.monotonic() - t0)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pycell", required=True)
    ap.add_argument("--runs", type=int, default=100)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--seconds", type=float, default=10)
    a = ap.parse_args()
    pycelld, jailer = daemon_binaries(a.pycell)
    procs = []
    with tempfile.TemporaryDirectory(prefix="pycell-bench-http-") as d:
        os.chmod(d, 0o755)
        try:
            subprocess.run([sys.executable, os.path.join(HERE, "..", "tests", "mcp", "sdk_http.py"), "keys", d],
                           check=True, capture_output=True)
            tok, tokens = token(a.pycell, d)
            nodes = []
            for i, name in enumerate("abc"):
                p, sock = start_node(pycelld, jailer, os.path.join(d, name), name, 1_700_000_000 + i * 64)
                procs.append(p)
                nodes.append(sock)
            front = [a.pycell, "mcp", "--http", "127.0.0.1:0", "--user", str(FRONT_UID), "--tokens", tokens]
            p, one = serve(front + ["--socket", nodes[0]], "serving MCP at ")
            procs.append(p)
            gw = []
            for sock in nodes:
                p, at = serve([a.pycell, "gateway", "--listen", "127.0.0.1:0", "--socket", sock,
                               "--tls-cert", f"{d}/gateway-cert.pem", "--tls-key", f"{d}/gateway-key.pem",
                               "--client-ca", f"{d}/ca.pem", "--user", str(FRONT_UID)], "connections on ")
                procs.append(p)
                gw.append(at)
            tls = ["--node-tls-cert", f"{d}/front-cert.pem", "--node-tls-key", f"{d}/front-key.pem", "--node-ca", f"{d}/ca.pem"]
            p, three = serve(front + tls + [f"--node={n}={at}" for n, at in zip("abc", gw)], "serving MCP at ")
            procs.append(p)
            p, single = serve(front + tls + [f"--node=a={gw[0]}"], "serving MCP at ")
            procs.append(p)
            time.sleep(1.5)
            t = asyncio.run(per_call(a.pycell, nodes[0], one, tok, a.runs))
            t_lean = lean(a.pycell, nodes[0], one, tok, a.runs)
            s1 = asyncio.run(sessions_per_second(single, tok, a.clients, a.seconds))
            s3 = asyncio.run(sessions_per_second(three, tok, a.clients, a.seconds))
        finally:
            stop_all(procs)
    med = {k: statistics.median(v) for k, v in {**t, **{f"lean_{k}": v for k, v in t_lean.items()}}.items()}
    stdio, http = med["stdio"], med["http"]
    print(f"pycell mcp over HTTP; medians over {len(t['http'])} calls each (interleaved, paced: every run warm)")
    print(f"  {'run_python print(1), MCP SDK over stdio':<52} {stdio:8.2f} ms    (base)")
    print(f"  {'run_python print(1), MCP SDK over HTTP (token)':<52} {http:8.2f} ms  {http - stdio:+7.2f} ms")
    print(f"  {'session_list (no run), MCP SDK over stdio':<52} {med['stdio_floor']:8.2f} ms    (base)")
    print(f"  {'session_list (no run), MCP SDK over HTTP':<52} {med['http_floor']:8.2f} ms  {med['http_floor'] - med['stdio_floor']:+7.2f} ms")
    print(f"  {'run_python print(1), lean client over stdio':<52} {med['lean_stdio']:8.2f} ms    (base)")
    print(f"  {'run_python print(1), lean client over HTTP':<52} {med['lean_http']:8.2f} ms  {med['lean_http'] - med['lean_stdio']:+7.2f} ms")
    print(f"  sessions/s (start, a cell, end; {a.clients} clients, {a.seconds:.0f} s):"
          f" front end over 1 node {s1:.1f}, over 3 nodes {s3:.1f} ({s3 / s1:.2f}x)")
    print("targets:")
    for label, over in (("MCP SDK", http - stdio), ("lean client", med["lean_http"] - med["lean_stdio"])):
        print(f"  {'PASS' if over <= 1.0 else 'MISS'}  run_python over HTTP <= +1 ms over stdio ({label}): {over:+.2f} ms")
    print(json.dumps({**{f"{k}_ms": v for k, v in med.items()}, "sessions_per_s_1": s1, "sessions_per_s_3": s3}))


if __name__ == "__main__":
    main()
