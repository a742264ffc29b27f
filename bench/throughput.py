#!/usr/bin/python3
"""Throughput of print(1) runs through pycelld at concurrency 2, 8 and 16, against
bare python process spawns at the same concurrency in the same run; and the
daemon's idle resident memory (monitor + broker). Standard library only.

Targets (issue 3): through the daemon at concurrency 2, at least 0.8x the
bare spawn rate; idle RSS under 30 MB. Issue 12: at concurrency 16 (more
clients than the default config's run slots on small hosts: the excess waits
in pycelld's queue) every run succeeds; the row reports its rate against bare
spawns at the same concurrency.
"""
import argparse
import concurrent.futures
import os
import subprocess
import time


def rate(cmd, n, concurrency):
    def one(_):
        subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)

    with concurrent.futures.ThreadPoolExecutor(concurrency) as pool:
        list(pool.map(one, range(concurrency)))  # warm up
        start = time.perf_counter()
        list(pool.map(one, range(n)))
        return n / (time.perf_counter() - start)


def rss_kb(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def comm(pid):
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return ""


def children(pid):
    out = []
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            with open(f"/proc/{p}/stat") as f:
                if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                    out.append(int(p))
        except (OSError, ValueError, IndexError):
            pass
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pycell", required=True)
    ap.add_argument("--socket", required=True)
    ap.add_argument("--daemon-pid", type=int, required=True)
    ap.add_argument("--runs", type=int, default=int(os.environ.get("BENCH_THROUGHPUT_RUNS", "120")))
    a = ap.parse_args()
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "print1.py")
    bare = ["/usr/bin/python3", "-s", script]
    daemon = [a.pycell, "run", "--socket", a.socket, script]
    # Idle first, before any run has grown the broker's buffers. The
    # monitor and the broker only: the warm pools' jailers (members and
    # zygotes, also the monitor's children) and the fork server that forks
    # them (jailer-forks) are the sandboxes' side.
    broker = [p for p in children(a.daemon_pid) if comm(p) not in ("pycell-jailer", "jailer-forks")]
    idle = rss_kb(a.daemon_pid) + sum(rss_kb(p) for p in broker)
    print(f"{'concurrency':>11} {'bare runs/s':>12} {'daemon runs/s':>14} {'ratio':>6}")
    verdicts = []
    for c in (2, 8, 16):
        b = rate(bare, a.runs, c)
        d = rate(daemon, a.runs, c)
        print(f"{c:>11} {b:>12.1f} {d:>14.1f} {d / b:>6.2f}")
        if c == 2:
            verdicts.append((f"throughput at concurrency 2 >= 0.8x bare spawns: {d / b:.2f}x", d / b >= 0.8))
    verdicts.append((f"daemon idle RSS (monitor + broker) < 30 MB: {idle / 1024:.1f} MB", idle < 30 * 1024))
    print()
    for text, ok in verdicts:
        print(f"  {'PASS' if ok else 'MISS'}  {text}")


if __name__ == "__main__":
    main()
