"""The Python client's per-call latency (issue 33), against the CLI and
bare python in the same run.

Run by bench/run with a pycelld whose warm pool has `default` members.
Rows, interleaved one-to-one, paced so that the pool refills between runs
(every timed pycelld run is checked to have gone warm), medians:

  - bare: /usr/bin/python3 -c 'print(1)', spawned
  - CLI: `pycell run --socket SOCK --json -` print(1), spawned
  - client: `pycell.Client(SOCK).run('print(1)')` in this process

Targets: the client below the CLI; the client <= 0.3x bare python.
"""

import argparse
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python", "src"))

import pycell  # noqa: E402

BARE = ["/usr/bin/python3", "-c", "print(1)"]


def spawned(cmd, stdin=None):
    t0 = time.perf_counter()
    p = subprocess.run(cmd, input=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    dt = time.perf_counter() - t0
    if p.returncode != 0:
        raise SystemExit(f"bench/python_client.py: {cmd} failed: {p.stderr.decode()[-2000:]}")
    return dt, p.stdout


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pycell", required=True)
    ap.add_argument("--socket", required=True)
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--pace", type=float, default=0.3, help="seconds between pycelld runs (the pool refills)")
    a = ap.parse_args()
    client = pycell.Client(a.socket)
    cli = [a.pycell, "run", "--socket", a.socket, "--json", "-"]
    rows = {"bare": [], "cli": [], "client": []}
    for i in range(a.runs + 3):
        b, _ = spawned(BARE)
        time.sleep(a.pace)
        c, out = spawned(cli, b"print(1)\n")
        if b'"warm":true' not in out:
            raise SystemExit(f"bench/python_client.py: a paced CLI run did not go warm: {out[:300]!r}")
        time.sleep(a.pace)
        t0 = time.perf_counter()
        r = client.run("print(1)")
        d = time.perf_counter() - t0
        if not (r.ok and r.warm and r.stdout == "1\n"):
            raise SystemExit(f"bench/python_client.py: a paced client run did not go warm: {r}")
        time.sleep(a.pace)
        if i >= 3:
            rows["bare"].append(b)
            rows["cli"].append(c)
            rows["client"].append(d)
    med = {k: statistics.median(v) * 1000 for k, v in rows.items()}
    print(f"python client, print(1) through pycelld (warm), medians of {a.runs} interleaved runs:")
    print(f"  bare python3 -c 'print(1)'   {med['bare']:7.2f} ms")
    print(f"  pycell run (CLI)             {med['cli']:7.2f} ms  {med['cli'] / med['bare']:.2f}x bare")
    print(f"  pycell.run (Python client)   {med['client']:7.2f} ms  {med['client'] / med['bare']:.2f}x bare")
    below = "PASS" if med["client"] < med["cli"] else "MISS"
    ratio = med["client"] / med["bare"]
    print(f"  target: client below the CLI: {below} ({med['client'] / med['cli']:.2f}x the CLI)")
    print(f"  target: client <= 0.3x bare python: {'PASS' if ratio <= 0.3 else 'MISS'} ({ratio:.2f}x)")


if __name__ == "__main__":
    main()
