"""Dependency benchmark, every row measured in the same run:

1. install: the first run of a script needing one small package (iniconfig,
   from the real index) with an empty env store, against `uv run --with` of
   the same script with an empty uv cache. Both resolve, download and
   install; pycell's does it in its install jail, then copies the env into
   its store.
2. cached: the second run of that script (the env found in the store),
   against the same script without its PEP 723 block under a policy whose
   interpreter is that very env (prebuilt: no lookup at all). Target: the
   cached run adds <= 5 ms.
3. import pandas: `import pandas` in a cached env under pycell, against the
   same env's python on the host (a bare venv).
4. plotting: `import pandas, matplotlib.pyplot` under `data-science` (its
   env cached, byte-compiled, with matplotlib's font cache), against the
   same env's python on the host with its font cache built once. Target:
   at most 1.15x.

  python3 bench/deps.py --pycell PATH [--uv PATH] [--out DIR] [--runs N]

Figures are medians of N runs (default 30; 3 for the installs), the rows of
a pair interleaved. Needs root (embedded pycell) and the package index.
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

BASE = "/var/cache/pycell-bench/deps"
SCRIPT = """# /// script
# dependencies = ["iniconfig"]
# ///
import iniconfig
print(iniconfig.__name__)
"""
PLAIN = "import iniconfig\nprint(iniconfig.__name__)\n"
PANDAS = "# /// script\n# dependencies = [\"pandas\"]\n# ///\nimport pandas\nprint(pandas.__version__)\n"
PLOTTING = "import pandas, matplotlib.pyplot\nprint(matplotlib.get_backend())\n"


def timed(argv, env=None, check=True):
    t0 = time.perf_counter()
    p = subprocess.run(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    elapsed = (time.perf_counter() - t0) * 1000
    if check and p.returncode != 0:
        sys.exit("bench/deps.py: %s failed (%d):\n%s%s" % (" ".join(argv), p.returncode, p.stdout, p.stderr))
    return elapsed, p


def median_pair(a, b, runs):
    xs, ys = [], []
    for _ in range(runs):
        xs.append(a())
        ys.append(b())
    return statistics.median(xs), statistics.median(ys)


def env_with(**kw):
    env = dict(os.environ)
    env.update(kw)
    return env


def venv_policy(env_dir, path):
    """policies/default.toml with its interpreter replaced by the env."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out, skip = [], False
    for line in open(os.path.join(root, "policies", "default.toml")):
        t = line.strip()
        if t.startswith("["):
            skip = t == "[interpreter]"
            if skip:
                out.append("[interpreter]\nvenv = %s\n\n" % json.dumps(env_dir))
                continue
        if skip:
            continue
        out.append('name = "bench-venv"\n' if t.startswith("name =") else line)
    with open(path, "w") as f:
        f.write("".join(out))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pycell", required=True)
    ap.add_argument("--uv", default="/usr/local/lib/pycell/uv")
    ap.add_argument("--out", default=".")
    ap.add_argument("--runs", type=int, default=30)
    a = ap.parse_args()
    shutil.rmtree(BASE, ignore_errors=True)
    os.makedirs(BASE)
    work = tempfile.mkdtemp(prefix="pycell-bench-deps-")
    names = ("with_deps.py", "plain.py", "pandas_.py", "plotting.py")
    script, plain, pandas, plotting = (os.path.join(work, n) for n in names)
    for path, text in ((script, SCRIPT), (plain, PLAIN), (pandas, PANDAS), (plotting, PLOTTING)):
        with open(path, "w") as f:
            f.write(text)
    run = [a.pycell, "run", "--embedded"]

    # 1. installs: fresh store / fresh uv cache each time.
    n = 0

    def pycell_install():
        nonlocal n
        n += 1
        store = os.path.join(BASE, "install-%d" % n)
        return timed(run + [script], env_with(PYCELL_ENV_STORE=store))[0]

    def uv_install():
        cache = tempfile.mkdtemp(prefix="uv-cache-")
        try:
            return timed([a.uv, "run", "--no-project", "--python", "/usr/bin/python3", "--with", "iniconfig", plain],
                         env_with(UV_CACHE_DIR=cache, UV_SYSTEM_CERTS="1"))[0]
        finally:
            shutil.rmtree(cache, ignore_errors=True)

    first, uv_first = median_pair(pycell_install, uv_install, 3)

    # 2. cached vs prebuilt.
    store = os.path.join(BASE, "cached")
    _, p = timed(run + ["--json", script], env_with(PYCELL_ENV_STORE=store))
    key = json.loads(p.stdout)["env"]["key"]
    env_dir = os.path.join(store, "envs", key)
    policy = os.path.join(work, "bench-venv.toml")
    venv_policy(env_dir, policy)
    cached, prebuilt = median_pair(
        lambda: timed(run + [script], env_with(PYCELL_ENV_STORE=store))[0],
        lambda: timed(run + ["--policy", policy, plain], env_with(PYCELL_ENV_STORE=store))[0],
        a.runs,
    )

    # 3. import pandas: cached env under pycell vs the env's python on the host.
    _, p = timed(run + ["--json", pandas], env_with(PYCELL_ENV_STORE=store))
    pkey = json.loads(p.stdout)["env"]["key"]
    host_python = os.path.join(store, "envs", pkey, "bin", "python")
    pd_pycell, pd_bare = median_pair(
        lambda: timed(run + [pandas], env_with(PYCELL_ENV_STORE=store))[0],
        lambda: timed([host_python, "-c", "import pandas\nprint(pandas.__version__)"])[0],
        max(5, a.runs // 3),
    )

    # 4. plotting under data-science vs the env's python with its font cache.
    _, p = timed(run + ["--json", "--policy", "data-science", plotting], env_with(PYCELL_ENV_STORE=store))
    result = json.loads(p.stdout)
    if result["stderr"]:
        sys.exit("bench/deps.py: a data-science plotting run wrote to stderr:\n" + result["stderr"])
    ds_python = os.path.join(store, "envs", result["env"]["key"], "bin", "python")
    mpl = tempfile.mkdtemp(prefix="mplconfig-")
    bare_env = env_with(MPLCONFIGDIR=mpl, MPLBACKEND="Agg")
    timed([ds_python, plotting], bare_env)  # builds the bare side's font cache
    plot_pycell, plot_bare = median_pair(
        lambda: timed(run + ["--policy", "data-science", plotting], env_with(PYCELL_ENV_STORE=store))[0],
        lambda: timed([ds_python, plotting], bare_env)[0],
        max(5, a.runs // 3),
    )
    shutil.rmtree(mpl, ignore_errors=True)

    rows = [
        ("install: uv run --with iniconfig (empty cache)", uv_first, None),
        ("install: pycell run, PEP 723 iniconfig (empty store)", first, first / uv_first),
        ("cached: pycell run, env prebuilt as the policy's venv", prebuilt, None),
        ("cached: pycell run, PEP 723 iniconfig (store hit)", cached, cached / prebuilt),
        ("import pandas: the env's python on the host", pd_bare, None),
        ("import pandas: pycell run, cached env", pd_pycell, pd_pycell / pd_bare),
        ("plotting: the data-science env's python on the host", plot_bare, None),
        ("plotting: pycell run --policy data-science", plot_pycell, plot_pycell / plot_bare),
    ]
    lines = ["", "dependencies (medians, ms; ratio against the row above)"]
    for name, ms, ratio in rows:
        lines.append("  %-56s %9.1f%s" % (name, ms, "" if ratio is None else "  %.2fx" % ratio))
    added = cached - prebuilt
    lines.append("  target: a cached run adds <= 5 ms: %+.1f ms (%s)" % (added, "met" if added <= 5 else "MISSED"))
    ratio = plot_pycell / plot_bare
    lines.append("  target: plotting <= 1.15x bare: %.2fx (%s)" % (ratio, "met" if ratio <= 1.15 else "MISSED"))
    print("\n".join(lines))
    with open(os.path.join(a.out, "deps.json"), "w") as f:
        json.dump({name: {"ms": ms, "ratio": ratio} for name, ms, ratio in rows}, f, indent=1)
    shutil.rmtree(work, ignore_errors=True)
    shutil.rmtree(BASE, ignore_errors=True)


main()
