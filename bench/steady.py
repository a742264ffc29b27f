"""Steady state, startup subtracted: what a program does once it runs, timed
by the program itself, bare and in a jail, in the same run.

  python3 bench/steady.py --pycell PATH [--runs N]      # the benchmark
  python3 bench/steady.py probe                          # one measurement

Two figures per run: a pure-compute loop of about 0.5 s (arithmetic and
dict work, no system calls) and a fresh import of 40 stdlib modules (path
walks, stat and open calls, unmarshalling). A layer that slows every
system call or path lookup (seccomp, Landlock, mounts) shows in the
second; the cgroup's CPU quota in the first. Medians of N runs each
(default 15), bare and jailed interleaved. Target: each within 3% of bare.
"""
import argparse
import importlib
import json
import statistics
import subprocess
import sys
import time

MODULES = [
    "argparse", "ast", "asyncio", "base64", "bisect", "calendar", "collections",
    "concurrent.futures", "configparser", "contextlib", "csv", "dataclasses",
    "datetime", "decimal", "difflib", "email.message", "enum", "fractions",
    "functools", "gettext", "glob", "gzip", "hashlib", "heapq", "html.parser",
    "http.client", "inspect", "ipaddress", "json", "logging", "pathlib",
    "pickle", "pprint", "queue", "random", "shutil", "statistics", "string",
    "textwrap", "uuid",
]


def compute():
    start = time.perf_counter()
    d, total = {}, 0
    for i in range(6_000_000):
        total += (i * i) % 7
        d[i & 1023] = total
    return time.perf_counter() - start


def imports():
    start = time.perf_counter()
    for name in MODULES:
        importlib.import_module(name)
    return time.perf_counter() - start


def probe():
    print(json.dumps({"imports_s": imports(), "compute_s": compute()}))


def measure(argv):
    p = subprocess.run(argv, capture_output=True, text=True, check=True)
    out = p.stdout
    if argv[1] == "run":
        out = json.loads(out)["stdout"]
    return json.loads(out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", nargs="?", choices=["probe"])
    ap.add_argument("--pycell")
    ap.add_argument("--runs", type=int, default=15)
    a = ap.parse_args()
    if a.mode == "probe":
        return probe()
    here = __file__
    bare_argv = ["/usr/bin/python3", "-s", here, "probe"]
    jail_argv = [a.pycell, "run", "--json", here, "--", "probe"]
    bare, jail = [], []
    for _ in range(a.runs):
        bare.append(measure(bare_argv))
        jail.append(measure(jail_argv))
    print("steady state, timed inside the program (startup subtracted); medians of", a.runs)
    print("targets:")
    for key, what in (("compute_s", "a 0.5 s compute loop"), ("imports_s", "importing 40 stdlib modules")):
        b = statistics.median(r[key] for r in bare) * 1000
        j = statistics.median(r[key] for r in jail) * 1000
        ratio = j / b
        print(f"  {'PASS' if ratio <= 1.03 else 'MISS'}  {what}: {j:.1f} ms in the jail vs {b:.1f} ms bare, {ratio:.3f}x (<= 1.03x)")


sys.exit(main())
