"""Egress proxy benchmark: a 100 MiB download and the latency of a
connection, through pycell's egress proxy (the client in a jail under an
allowlist policy) against the same client going straight to the server over
loopback (on the host), measured in the same run.

  python3 bench/egress.py --pycell PATH [--out DIR]      # the whole benchmark
  python3 bench/egress.py serve                           # the server alone
  python3 bench/egress.py client PORT [--proxy H:P]       # one measurement

The server speaks a one-line protocol: "bytes N" gets N bytes, "ping" gets
"pong", then it closes. The client goes through the proxy with CONNECT, as
HTTPS clients do (the rule is tcp://127.0.0.1:PORT: the payload is not TLS).

Figures are medians: of 5 downloads, and of 200 connections (connect +
one request/answer). Targets: proxied throughput >= 0.8x direct; a proxied
connection adds <= 1 ms. On a 2-core machine the proxied download is
CPU-bound: server, proxy and client share two cores where the direct one
has them for server and client alone.
"""
import argparse
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import threading
import time

SIZE = 100 << 20
CONNECTIONS = 200
DOWNLOADS = 5
CHUNK = 1 << 20


def serve(ready=None):
    payload = b"x" * CHUNK
    listener = socket.create_server(("127.0.0.1", 0), backlog=256)
    if ready is not None:
        ready(listener.getsockname()[1])
    else:
        print(listener.getsockname()[1], flush=True)

    def one(conn):
        with conn:
            f = conn.makefile("rb")
            line = f.readline().decode().split()
            if line[:1] == ["GET"]:
                while f.readline() not in (b"\r\n", b""):
                    pass
                size = int(line[1].rpartition("/")[2] or 5)
                conn.sendall(f"HTTP/1.1 200 OK\r\nContent-Length: {size}\r\n\r\n".encode())
                while size > 0:
                    n = min(size, CHUNK)
                    conn.sendall(payload[:n])
                    size -= n
            elif line[:1] == ["ping"]:
                conn.sendall(b"pong\n")
            elif line[:1] == ["bytes"]:
                left = int(line[1])
                while left > 0:
                    n = min(left, CHUNK)
                    conn.sendall(payload[:n])
                    left -= n

    while True:
        conn, _ = listener.accept()
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        threading.Thread(target=one, args=(conn,), daemon=True).start()


def connect(port, proxy):
    if proxy is None:
        s = socket.create_connection(("127.0.0.1", port))
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return s
    host, pport = proxy.rsplit(":", 1)
    s = socket.create_connection((host, int(pport)))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    s.sendall(f"CONNECT 127.0.0.1:{port} HTTP/1.1\r\n\r\n".encode())
    # The proxy sends nothing after its answer until the server does, and
    # the server speaks only when asked: reading in blocks takes no more.
    head = b""
    while not head.endswith(b"\r\n\r\n"):
        b = s.recv(4096)
        if not b:
            raise OSError("the proxy closed the connection")
        head += b
    if not head.startswith(b"HTTP/1.1 200"):
        raise OSError(head.decode(errors="replace").splitlines()[0])
    return s


def drain(s):
    """Read `s` to its end and close it: how many bytes came."""
    buf = memoryview(bytearray(CHUNK))
    got = 0
    while n := s.recv_into(buf):
        got += n
    s.close()
    return got


def download(port, proxy):
    s = connect(port, proxy)
    start = time.perf_counter()
    s.sendall(f"bytes {SIZE}\n".encode())
    got = drain(s)
    elapsed = time.perf_counter() - start
    if got != SIZE:
        raise OSError(f"got {got} bytes of {SIZE}")
    return SIZE / elapsed


def ping(port, proxy):
    start = time.perf_counter()
    s = connect(port, proxy)
    s.sendall(b"ping\n")
    answer = s.recv(16)
    elapsed = time.perf_counter() - start
    s.close()
    if answer != b"pong\n":
        raise OSError(f"answer {answer!r}")
    return elapsed


def http_get(port, proxy, size):
    """One plain-HTTP GET of `size` bytes (absolute form through the proxy):
    how long from connecting to the last byte."""
    start = time.perf_counter()
    where = ("127.0.0.1", port) if proxy is None else (proxy.rsplit(":", 1)[0], int(proxy.rsplit(":", 1)[1]))
    s = socket.create_connection(where)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    target = f"/{size}" if proxy is None else f"http://127.0.0.1:{port}/{size}"
    s.sendall(f"GET {target} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode())
    got = drain(s)
    elapsed = time.perf_counter() - start
    if got < size:
        raise OSError(f"got {got} bytes for a body of {size}")
    return elapsed


def client(port, proxy):
    rates = [download(port, proxy) for _ in range(DOWNLOADS)]
    for _ in range(10):
        ping(port, proxy)  # warm up
    latencies = [ping(port, proxy) for _ in range(CONNECTIONS)]
    http_rates = [SIZE / http_get(port, proxy, SIZE) for _ in range(DOWNLOADS)]
    http_latencies = [http_get(port, proxy, 5) for _ in range(CONNECTIONS)]
    print(json.dumps({
        "throughput_bps": statistics.median(rates), "latency_s": statistics.median(latencies),
        "http_throughput_bps": statistics.median(http_rates), "http_latency_s": statistics.median(http_latencies),
    }))


POLICY_EDITS = {
    "name": '"egress-bench"',
    "allow": None,  # set per run
    "max_connections": "1024",
    "max_bytes": '"2GiB"',
}


def bench_policy(port, out):
    text = open(os.path.join(os.path.dirname(__file__), "..", "policies", "network.toml")).read()
    edits = dict(POLICY_EDITS, allow=f'["tcp://127.0.0.1:{port}", "http://127.0.0.1:{port}"]')
    for key, value in edits.items():
        text, n = re.subn(rf"^{key} = .*$", f"{key} = {value}", text, count=1, flags=re.M)
        assert n == 1, key
    path = os.path.join(out, "egress-bench.toml")
    open(path, "w").write(text)
    return path


def whole(pycell, out):
    port = []
    threading.Thread(target=serve, args=(port.append,), daemon=True).start()
    while not port:
        time.sleep(0.01)
    port = port[0]
    here = os.path.abspath(__file__)
    direct = subprocess.run([sys.executable, here, "client", str(port)], capture_output=True, text=True, check=True)
    policy = bench_policy(port, out)
    proxied = subprocess.run(
        [pycell, "run", "--json", "--policy", policy, here, "--", "client", str(port), "--proxy", "127.0.0.1:3128"],
        capture_output=True, text=True,
    )
    result = json.loads(proxied.stdout)
    if result["status"] != "ok":
        sys.exit(f"the proxied client failed: {result['status']}: {result['stderr'] or result.get('error')}")
    d = json.loads(direct.stdout)
    p = json.loads(result["stdout"])
    ratio = p["throughput_bps"] / d["throughput_bps"]
    added_ms = (p["latency_s"] - d["latency_s"]) * 1000
    http_ratio = p["http_throughput_bps"] / d["http_throughput_bps"]
    http_added_ms = (p["http_latency_s"] - d["http_latency_s"]) * 1000
    mib = 1 << 20
    for what, key in (("tunnel", ""), ("http://", "http_")):
        print(f"egress: {what:7} 100 MiB download  direct {d[key + 'throughput_bps'] / mib:8.0f} MiB/s   proxied {p[key + 'throughput_bps'] / mib:8.0f} MiB/s   ratio {p[key + 'throughput_bps'] / d[key + 'throughput_bps']:.2f}x")
        print(f"egress: {what:7} request latency   direct {d[key + 'latency_s'] * 1000:8.3f} ms      proxied {p[key + 'latency_s'] * 1000:8.3f} ms      added {(p[key + 'latency_s'] - d[key + 'latency_s']) * 1000:.3f} ms")
    print("targets:")
    print(f"  {'PASS' if ratio >= 0.8 else 'MISS'}  proxied download >= 0.8x direct: {ratio:.2f}x")
    print(f"  {'PASS' if added_ms <= 1.0 else 'MISS'}  a proxied connection adds <= 1 ms: {added_ms:.3f} ms")
    print(f"  {'PASS' if http_added_ms <= 1.0 else 'MISS'}  a proxied plain-HTTP request adds <= 1 ms: {http_added_ms:.3f} ms")
    print(f"  info  proxied plain-HTTP download: {http_ratio:.2f}x direct (copied through userspace, framed)")
    json.dump({"direct": d, "proxied": p, "ratio": ratio, "added_ms": added_ms,
               "http_ratio": http_ratio, "http_added_ms": http_added_ms},
              open(os.path.join(out, "egress.json"), "w"))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", nargs="?", choices=["serve", "client"])
    ap.add_argument("port", nargs="?", type=int)
    ap.add_argument("--proxy")
    ap.add_argument("--pycell")
    ap.add_argument("--out", default=".")
    a = ap.parse_args()
    if a.mode == "serve":
        serve()
    elif a.mode == "client":
        client(a.port, a.proxy)
    else:
        whole(a.pycell, a.out)


main()
