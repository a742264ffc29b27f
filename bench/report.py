#!/usr/bin/python3
"""Summarise a hyperfine --export-json file written by bench/run.

    /usr/bin/python3 bench/report.py target/bench/hyperfine.json [--strict]

Rows are named "GROUP: what" by bench/run. The first row of each group is that
group's baseline: every other row of the group is shown as a ratio to it and as
an overhead in ms over it. The targets below name rows; a target whose rows are
absent is reported as n/a. With --strict, a MISS makes the exit status 1.

Standard library only.
"""

import json
import statistics
import sys

# (description, row, baseline row, kind, limit)
#   kind "ratio":    median(row) / median(baseline) <= limit
#   kind "faster":   median(row) < median(baseline)            (limit unused)
#   kind "overhead": median(row) - median(baseline) < limit ms
TARGETS = [
    ("pycell print(1) <= 1.25x bare python",
     "print1: pycell run", "print1: python3", "ratio", 1.25),
    ("pycell print(1) faster than bubblewrap",
     "print1: pycell run", "print1: bwrap", "faster", None),
    ("sandbox setup (pycell-jailer running /bin/true) < 3 ms",
     "setup: pycell-jailer", "setup: /bin/true", "overhead", 3.0),
    ("through pycelld, print(1) <= 1.3x bare python",
     "print1: pycell run (daemon)", "print1: python3", "ratio", 1.3),
]


def load(path):
    with open(path) as f:
        results = json.load(f)["results"]
    rows = {}
    for r in results:
        times_ms = [t * 1000 for t in r["times"]]
        rows[r["command"]] = {
            "median": statistics.median(times_ms),
            "min": min(times_ms),
            "p90": statistics.quantiles(times_ms, n=10)[-1] if len(times_ms) > 1 else times_ms[0],
            "runs": len(times_ms),
        }
    return [r["command"] for r in results], rows


def group_of(name):
    return name.split(":", 1)[0] if ":" in name else name


def table(order, rows):
    baselines = {}
    for name in order:
        baselines.setdefault(group_of(name), name)
    width = max(len(n) for n in order)
    head = f"{'command':<{width}}  {'median ms':>9}  {'min ms':>7}  {'p90 ms':>7}  {'ratio':>6}  {'overhead ms':>11}"
    lines = [head, "-" * len(head)]
    last_group = None
    for name in order:
        group = group_of(name)
        if last_group is not None and group != last_group:
            lines.append("")
        last_group = group
        row, base = rows[name], rows[baselines[group]]
        if name == baselines[group]:
            ratio, overhead = "1.00x", "(baseline)"
        else:
            ratio = f"{row['median'] / base['median']:.2f}x"
            overhead = f"{row['median'] - base['median']:+.2f}"
        lines.append(
            f"{name:<{width}}  {row['median']:>9.2f}  {row['min']:>7.2f}  {row['p90']:>7.2f}  {ratio:>6}  {overhead:>11}"
        )
    return "\n".join(lines)


def check(rows, row, base, kind, limit):
    """Return (passed or None, measured text)."""
    if row not in rows or base not in rows:
        return None, "rows not measured"
    m, b = rows[row]["median"], rows[base]["median"]
    if kind == "ratio":
        return m / b <= limit, f"{m / b:.2f}x ({m:.2f} ms vs {b:.2f} ms)"
    if kind == "faster":
        return m < b, f"{m:.2f} ms vs {b:.2f} ms"
    if kind == "overhead":
        return m - b < limit, f"{m - b:+.2f} ms ({m:.2f} ms vs {b:.2f} ms)"
    raise ValueError(f"unknown target kind {kind!r}")


def main(argv):
    args = [a for a in argv[1:] if a != "--strict"]
    if len(args) != 1:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    order, rows = load(args[0])
    runs = sorted({r["runs"] for r in rows.values()})
    print(f"medians over {'/'.join(map(str, runs))} runs; ratio and overhead are against the first row of each group\n")
    print(table(order, rows))
    print("\ntargets:")
    missed = 0
    for desc, row, base, kind, limit in TARGETS:
        ok, measured = check(rows, row, base, kind, limit)
        verdict = "n/a " if ok is None else ("PASS" if ok else "MISS")
        missed += ok is False
        print(f"  {verdict}  {desc}: {measured}")
    return 1 if missed and "--strict" in argv else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
