"""A run's cgroup, made and removed against kept and renamed (issue 50), in
the same run: what pycelld's jailer does with a run's v1 cgroups.

  python3 bench/kept_cgroups.py [--cycles N]

Under a parent of its own in each of the five v1 hierarchies pycell uses
(memory, pids, cpu, cpuacct, freezer), N cycles of each, interleaved in
blocks: five `mkdir` then five `rmdir` (a new cgroup per run), against
five renames to a run's name and five back (a kept set). Wall time per
cycle, and the CPU the whole host spent (from /proc/stat: the kernel's
workers that free a removed memory cgroup count too). On cgroup v2 there
is no rename of a cgroup: it says so and measures nothing.
"""
import argparse
import os
import statistics
import time

HIERARCHIES = ["memory", "pids", "cpu", "cpuacct", "freezer"]
ROOT = "/sys/fs/cgroup"
CLK_TCK = os.sysconf("SC_CLK_TCK")


def own_dirs(parent):
    """`parent` under this process's own cgroup in each v1 hierarchy."""
    own = {}
    with open("/proc/self/cgroup") as f:
        for line in f:
            _, controllers, path = line.rstrip("\n").split(":", 2)
            for c in controllers.split(","):
                own[c] = path
    return [os.path.join(ROOT, h, own.get(h, "/").lstrip("/"), parent) for h in HIERARCHIES]


def busy_s():
    """Seconds the host's CPUs spent busy (user, nice, system, irq, softirq)."""
    with open("/proc/stat") as f:
        cpu = f.readline().split()
    return sum(int(cpu[i]) for i in (1, 2, 3, 6, 7)) / CLK_TCK


def made_and_removed(parents, n):
    for _ in range(n):
        for p in parents:
            os.mkdir(os.path.join(p, "run"))
        for p in parents:
            os.rmdir(os.path.join(p, "run"))


def renamed(parents, n):
    for _ in range(n):
        for p in parents:
            os.rename(os.path.join(p, "pycell-kept-0"), os.path.join(p, "run"))
        for p in parents:
            os.rename(os.path.join(p, "run"), os.path.join(p, "pycell-kept-0"))


def timed(f, parents, n):
    """ms of wall and of host CPU per cycle over n cycles (the CPU read
    after a pause, so that deferred kernel work is counted)."""
    b0, t0 = busy_s(), time.perf_counter()
    f(parents, n)
    wall = time.perf_counter() - t0
    time.sleep(0.3)
    return wall / n * 1e3, max(busy_s() - b0, 0.0) / n * 1e3


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cycles", type=int, default=2000)
    args = ap.parse_args()
    if not os.path.isdir(os.path.join(ROOT, "memory")):
        print("cgroup v2: a cgroup cannot be renamed, so pycell makes and removes one directory per run (nothing to measure)")
        return
    parents = own_dirs(f"pycell-bench-kept-{os.getpid()}")
    for p in parents:
        os.makedirs(p, exist_ok=True)
        os.mkdir(os.path.join(p, "pycell-kept-0"))
    blocks, per = 10, max(args.cycles // 10, 1)
    fresh, kept = [], []
    try:
        for _ in range(blocks):
            fresh.append(timed(made_and_removed, parents, per))
            kept.append(timed(renamed, parents, per))
    finally:
        for p in parents:
            for d in ("run", "pycell-kept-0"):
                if os.path.isdir(os.path.join(p, d)):
                    os.rmdir(os.path.join(p, d))
            os.rmdir(p)
    fw, fc = (statistics.median(r[i] for r in fresh) for i in (0, 1))
    kw, kc = (statistics.median(r[i] for r in kept) for i in (0, 1))
    print(f"a run's v1 cgroups (5 hierarchies), medians of {blocks} blocks of {per} cycles")
    print(f"  made and removed (5 mkdir + 5 rmdir)   {fw:6.3f} ms wall  {fc:6.3f} ms host CPU")
    print(f"  kept and renamed (10 renames)          {kw:6.3f} ms wall  {kc:6.3f} ms host CPU")
    print(f"  kept / made: {kw / fw:.2f}x wall, {kc / fc if fc else float('nan'):.2f}x host CPU")


if __name__ == "__main__":
    main()
