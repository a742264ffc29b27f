#!/usr/bin/python3
"""Batch throughput: `pycell batch` running N small programs (each prints a
number it computes), embedded (python started per run, and forked from a
zygote with --zygote) and through pycelld, at --jobs 2, 8 and 16,
against bare python spawns of the same programs at the same concurrency, in
the same run. Standard library only.

Target (issue 30): batch runs per second at concurrency 2 at least 1.0x
bare spawns.
"""
import argparse
import concurrent.futures
import json
import os
import subprocess
import tempfile
import time

PROGRAM = "n = {i}\nprint(sum(k * k for k in range(n)))\n"


def bare_rate(programs, concurrency):
    def one(code):
        subprocess.run(["/usr/bin/python3", "-s", "-c", code], stdout=subprocess.DEVNULL, check=True)

    with concurrent.futures.ThreadPoolExecutor(concurrency) as pool:
        start = time.perf_counter()
        list(pool.map(one, programs))
        return len(programs) / (time.perf_counter() - start)


def batch_rate(cmd, jsonl, n):
    start = time.perf_counter()
    with open(jsonl, "rb") as f:
        out = subprocess.run(cmd, stdin=f, stdout=subprocess.PIPE, check=True).stdout
    elapsed = time.perf_counter() - start
    results = [json.loads(line) for line in out.splitlines()]
    ok = sum(1 for r in results if r["result"]["status"] == "ok")
    if ok != n:
        bad = next(r for r in results if r["result"]["status"] != "ok")
        raise SystemExit(f"{ok} of {n} batch runs ok; e.g. {json.dumps(bad)[:600]}")
    return n / elapsed


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pycell", required=True)
    ap.add_argument("--socket", help="pycelld's socket: also a row through the daemon")
    ap.add_argument("--runs", type=int, default=int(os.environ.get("BENCH_BATCH_RUNS", "200")))
    a = ap.parse_args()
    programs = [PROGRAM.format(i=i) for i in range(a.runs)]
    with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False) as f:
        for i, code in enumerate(programs):
            f.write(json.dumps({"id": i, "code": code}) + "\n")
        jsonl = f.name
    try:
        header = f"{'jobs':>5} {'bare runs/s':>12} {'embedded runs/s':>16} {'ratio':>6}"
        header += f" {'zygote runs/s':>14} {'ratio':>6}"
        if a.socket:
            header += f" {'daemon runs/s':>14} {'ratio':>6}"
        print(header)
        verdicts = []
        for c in (2, 8, 16):
            b = bare_rate(programs, c)
            e = batch_rate([a.pycell, "batch", "--embedded", "--jobs", str(c), "-"], jsonl, a.runs)
            row = f"{c:>5} {b:>12.1f} {e:>16.1f} {e / b:>6.2f}"
            z = batch_rate([a.pycell, "batch", "--embedded", "--zygote", "--jobs", str(c), "-"], jsonl, a.runs)
            row += f" {z:>14.1f} {z / b:>6.2f}"
            if a.socket:
                d = batch_rate([a.pycell, "batch", "--socket", a.socket, "--jobs", str(c), "-"], jsonl, a.runs)
                row += f" {d:>14.1f} {d / b:>6.2f}"
            print(row)
            if c == 2:
                verdicts.append((f"batch at --jobs 2 >= 1.0x bare spawns: {e / b:.2f}x", e / b >= 1.0))
                verdicts.append((f"batch --zygote at --jobs 2 >= 1.0x bare spawns: {z / b:.2f}x", z / b >= 1.0))
        print()
        for text, ok in verdicts:
            print(f"  {'PASS' if ok else 'MISS'}  {text}")
    finally:
        os.unlink(jsonl)


if __name__ == "__main__":
    main()
