#!/usr/bin/python3
"""pycell's checks inside the Debian test VM (run by scripts/vm-test).

Runs as root in a fresh Debian 12 with systemd and pure cgroup v2, with no
network. Installs the .deb from the payload disk, then checks the package,
the service and the sandbox limits as an operator and users would meet them.
Prints exactly one line per check on stdout (the serial console):

    RESULT PASS <name>[: note]
    RESULT FAIL <name>: <detail>

followed by indented diagnostics for failures, and `RESULT-END` last. The
host (scripts/vm-test) decides which checks it expects; this script runs the
groups named in payload/groups (base, daemon, mcp, image; image_checks.py
has the image group's).
"""

import json
import os
import pwd
import grp
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import traceback

PAYLOAD = "/mnt/payload"
# Sandbox uids: pycell's default range (host/src/uidalloc.rs DEFAULT_RANGE).
SANDBOX_UIDS = range(1_800_000_000, 1_800_065_536)
MEMBER = "alice"  # in the socket group
OUTSIDER = "mallory"  # not in it
GUARD = 120  # seconds: host-side bound on any single command


class CheckFailed(Exception):
    pass


def log(msg):
    print(f"  | {msg}", flush=True)


# What the runner is doing, for the heartbeat: (check name, its start, the
# command being waited for or None).
CURRENT = {"check": None, "since": 0.0, "command": None}
HEARTBEAT = 30  # seconds between "still running" lines for a slow check


def process_table():
    """Every process with its state and kernel wait channel (for stalls)."""
    rc, out, _ = sh_raw(["ps", "-eo", "pid,ppid,user:12,stat,wchan:24,etimes,args", "--sort", "pid"], 20)
    return [line[:200] for line in out.splitlines() if line.strip()]


def heartbeat():
    """A thread: while a check runs longer than HEARTBEAT, say so, with the
    command and the pycell processes, so a stall shows where it is."""
    while True:
        time.sleep(HEARTBEAT)
        check, since, command = CURRENT["check"], CURRENT["since"], CURRENT["command"]
        if check is None or time.monotonic() - since < HEARTBEAT:
            continue
        log(f"heartbeat: {check} running for {time.monotonic() - since:.0f} s; waiting for {command}")
        try:
            for line in process_table():
                if "pycell" in line or "python" in line or "runuser" in line:
                    log(f"heartbeat:   {line}")
        except Exception as e:  # noqa: BLE001 - diagnostics only
            log(f"heartbeat: ps failed: {e}")


def sh_raw(args, timeout):
    p = subprocess.run(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout)
    return p.returncode, p.stdout.decode(errors="replace"), ""


def sh(args, *, input=None, user=None, env=None, timeout=GUARD, check=False):
    """Run a command (optionally as `user`), capture its output."""
    if user is not None:
        args = ["runuser", "-u", user, "--"] + list(args)
    full_env = dict(os.environ)
    full_env.update(env or {})
    CURRENT["command"] = " ".join(args)[:160]
    try:
        p = subprocess.run(
            args,
            input=input.encode() if isinstance(input, str) else input,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=full_env,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired as e:
        # Where it stuck: the processes and the kernel's last words.
        lines = []
        try:
            lines += [f"ps: {line}" for line in process_table()]
            lines += [f"dmesg: {line}" for line in sh_raw(["dmesg"], 20)[1].splitlines()[-30:]]
        except Exception as diag:  # noqa: BLE001 - diagnostics only
            lines.append(f"diagnostics failed: {diag}")
        raise CheckFailed(f"{' '.join(args)} did not finish within {timeout} s\n" + "\n".join(lines)) from e
    finally:
        CURRENT["command"] = None
    out = p.stdout.decode(errors="replace")
    err = p.stderr.decode(errors="replace")
    if check and p.returncode != 0:
        raise CheckFailed(f"{' '.join(args)} exited {p.returncode}: {err.strip()[-800:]}")
    return p.returncode, out, err


def pycell_json(code, opts=(), user=None, timeout=GUARD):
    """`pycell run --json OPTS -` with `code` on stdin -> (exit, result, stderr)."""
    rc, out, err = sh(["pycell", "run", "--json", *opts, "-"], input=code, user=user, timeout=timeout)
    try:
        result = json.loads(out)
    except ValueError:
        raise CheckFailed(f"pycell run printed no JSON result (exit {rc}); stdout {out[-400:]!r}; stderr {err[-800:]!r}")
    return rc, result, err


def expect(cond, msg):
    if not cond:
        raise CheckFailed(msg)


def brief(result):
    keep = {k: result.get(k) for k in ("status", "exit_code", "signal", "wall_ms", "peak_memory_bytes", "error")}
    keep["stdout"] = (result.get("stdout") or "")[-300:]
    keep["stderr"] = (result.get("stderr") or "")[-300:]
    return json.dumps(keep)


# ------------------------------------------------------------ host inspection

def host_processes():
    """pid -> (ppid, name, uids) for every process on the host."""
    table = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/status") as f:
                status = f.read()
        except OSError:
            continue
        fields = dict(re.findall(r"^(PPid|Name|Uid):\s+(.*)$", status, re.M))
        if len(fields) == 3:
            table[int(pid)] = (int(fields["PPid"]), fields["Name"], [int(u) for u in fields["Uid"].split()])
    return table


def warm_members(table):
    """The processes of pycelld's warm-pool members: the descendants of the
    jailers `pycell info` lists, each of which must be a child of pycelld;
    in a pool with a zygote, the zygote's own processes and, below its
    jailer, those of its members (by their sandbox uids: runs the zygote
    forked earlier are not members). Between runs these, and only these,
    run under sandbox uids. Without an answer from pycelld there are none
    (every sandbox process counts)."""
    try:
        rc, out, _ = sh(["pycell", "info", "--json"])
        pools = json.loads(out)["daemon"]["warm_pools"] if rc == 0 else []
    except (OSError, ValueError, KeyError):  # not installed, no pycelld
        pools = []
    parent_name = lambda pid: table.get(table.get(pid, (0,))[0], (0, ""))[1]
    members = descendants(table, {j for p in pools for j in p["jailer_pids"] if parent_name(j) == "pycelld"})
    for p in pools:
        zygote = p.get("zygote_jailer_pid")
        if not zygote or parent_name(zygote) != "pycelld":
            continue
        below = descendants(table, {zygote})
        # The zygote's init (its jailer's child) has the zygote's uid.
        uids = {table[pid][2][0] for pid in below if table[pid][0] == zygote}
        uids |= set(p.get("member_sandbox_uids", []))
        members |= {zygote} | {pid for pid in below if table[pid][2][0] in uids}
    return members


def descendants(table, roots):
    """`roots` and every process below them in `table`."""
    found = set(roots)
    grown = True
    while grown:
        more = {pid for pid, (ppid, _, _) in table.items() if ppid in found} - found
        found |= more
        grown = bool(more)
    return found


def sandbox_processes():
    """Host processes running under a sandbox uid, other than idle warm-pool
    members."""
    table = host_processes()
    members = warm_members(table)
    return [f"{pid}({name}, uid {uids[0]})" for pid, (_, name, uids) in sorted(table.items())
            if any(u in SANDBOX_UIDS for u in uids) and pid not in members]


def ours(text):
    """Does `text` (a process line, unit or cgroup name) belong to pycell, not
    to this test harness (pycell-vm-payload.service, /mnt/payload)?"""
    return "pycell" in text.replace("pycell-vm-payload", "")


def run_cgroups():
    """Per-run cgroup directories anywhere in the v2 hierarchy
    (pycell-<uid>-<run>), other than those of idle warm-pool members."""
    table = host_processes()
    members = set()
    for pid in warm_members(table):
        try:
            with open(f"/proc/{pid}/cgroup") as f:
                lines = [line.split(":", 2) for line in f.read().splitlines()]
        except OSError:
            continue
        for _, controllers, path in lines:
            for c in controllers.split(",") if controllers else [""]:
                members.add(os.path.normpath(f"/sys/fs/cgroup/{c}/{path}"))
    found = []
    for dirpath, dirnames, _ in os.walk("/sys/fs/cgroup"):
        for d in dirnames:
            path = os.path.join(dirpath, d)
            if re.match(r"pycell-\d+-", d) and not any(m == path or m.startswith(path + "/") for m in members):
                found.append(path)
    return found


def pycell_cgroups():
    """Every cgroup directory whose name mentions pycell (runs, parents, the service)."""
    found = []
    for dirpath, dirnames, _ in os.walk("/sys/fs/cgroup"):
        for d in dirnames:
            if ours(d):
                found.append(os.path.join(dirpath, d))
    return found


def wait_until(pred, seconds, step=0.2):
    deadline = time.monotonic() + seconds
    while True:
        v = pred()
        if v or time.monotonic() >= deadline:
            return v
        time.sleep(step)


def expect_no_leftovers(what):
    procs = wait_until(lambda: not sandbox_processes(), 10) or sandbox_processes()
    expect(procs is True or not procs, f"{what}: sandbox processes left: {procs}")
    cgs = wait_until(lambda: not run_cgroups(), 10) or run_cgroups()
    expect(cgs is True or not cgs, f"{what}: run cgroups left: {cgs}")


# ------------------------------------------------------------------ the code

PRINT_1 = "print(1)\n"
# Writes every page: a calloc'ed bytearray would never be touched.
HOG = "x = 'x' * (512 << 20)\nprint(len(x))\n"
# Forks until the pids limit says no; children wait to be killed.
FORK_UNTIL_REFUSED = """
import errno, os, signal, time
children, err = [], None
try:
    while len(children) < 10000:
        pid = os.fork()
        if pid == 0:
            time.sleep(60)
            os._exit(0)
        children.append(pid)
except OSError as e:
    err = errno.errorcode.get(e.errno, e.errno)
for pid in children:
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
print(len(children), err)
"""
# The classic: fork forever, ignore failures.
FORK_BOMB = """
import os
while True:
    try:
        os.fork()
    except OSError:
        pass
"""
# A tree that tries to outlive its run: a subprocess, a double-forked
# setsid() grandchild, and the main process, all sleeping.
TREE = """
import os, subprocess, sys, time
subprocess.Popen(["sleep", "1000"])
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        time.sleep(1000)
    os._exit(0)
print("tree started", flush=True)
time.sleep(1000)
"""


# ------------------------------------------------------------ check groups

def check_install():
    shutil.copy(f"{PAYLOAD}/pycell.deb", "/tmp/pycell.deb")
    rc, out, err = sh(
        ["apt-get", "install", "-y", "--no-install-recommends", "/tmp/pycell.deb"],
        env={"DEBIAN_FRONTEND": "noninteractive"},
        timeout=300,
    )
    expect(rc == 0, f"apt-get install exited {rc}: {(out + err)[-1500:]}")
    for path in ["/usr/bin/pycell", "/usr/libexec/pycell/pycell-jailer", "/usr/libexec/pycell/libpycell_zygote.so", "/etc/pycell/policies/default.toml",
                 "/etc/pycell/pycelld.toml"]:
        expect(os.path.exists(path), f"{path} is missing after install")
    rc, out, _ = sh(["pycell", "--version"], check=True)
    return out.strip()


def check_accounts():
    try:
        u = pwd.getpwnam("pycell")
        g = grp.getgrnam("pycell")
    except KeyError as e:
        raise CheckFailed(f"no pycell account after install: {e}")
    expect(u.pw_uid < 1000, f"pycell is not a system user (uid {u.pw_uid})")
    expect(u.pw_shell.endswith("nologin"), f"pycell has a login shell: {u.pw_shell}")
    return f"uid {u.pw_uid}, gid {g.gr_gid}"


def check_cgroup_v2():
    expect(os.path.exists("/sys/fs/cgroup/cgroup.controllers"), "/sys/fs/cgroup is not cgroup v2")
    with open("/sys/fs/cgroup/cgroup.controllers") as f:
        ctrls = f.read().split()
    for c in ("memory", "pids", "cpu"):
        expect(c in ctrls, f"cgroup v2 lacks {c}: {ctrls}")
    return " ".join(ctrls)


def landlock_abi():
    """The kernel's Landlock ABI (landlock_create_ruleset(NULL, 0, VERSION))."""
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    abi = libc.syscall(444, None, ctypes.c_size_t(0), ctypes.c_uint32(1))
    return max(abi, 0)


DEFAULT_POLICY = "/etc/pycell/policies/default.toml"


def check_landlock_policy():
    """Fail closed on Landlock: a policy that asks for a newer ABI than the
    kernel has is refused with the stable code. If the shipped default policy
    itself asks for more than this kernel has, take docs/install.md's step
    (lower min_abi in the conffile) so that the other checks can run."""
    abi = landlock_abi()
    expect(abi >= 1, "the guest kernel has no Landlock")
    with open(DEFAULT_POLICY) as f:
        text = f.read()
    m = re.search(r"^min_abi\s*=\s*(\d+)", text, re.M)
    expect(m is not None, f"no min_abi in {DEFAULT_POLICY}")
    shipped = int(m.group(1))
    notes = [f"kernel ABI {abi}, shipped min_abi {shipped}"]
    if abi < 7:
        # The default policy with a higher min_abi (its name must match the file's).
        os.makedirs("/tmp/landlock-too-new", exist_ok=True)
        too_new = "/tmp/landlock-too-new/default.toml"
        with open(too_new, "w") as f:
            f.write(text[:m.start(1)] + str(abi + 1) + text[m.end(1):])
        rc, r, err = pycell_json(PRINT_1, ["--embedded", "--policy", too_new])
        code = (r.get("error") or {}).get("code")
        expect(rc == 125 and r.get("status") == "refused" and code == "landlock_abi_too_old",
               f"a policy with min_abi {abi + 1} on a kernel with ABI {abi} was not refused: exit {rc}, {brief(r)}")
        notes.append(f"min_abi {abi + 1} refused (landlock_abi_too_old)")
    if shipped > abi:
        with open(DEFAULT_POLICY, "w") as f:
            f.write(text[:m.start(1)] + str(abi) + text[m.end(1):])
        sh(["systemctl", "try-restart", "pycelld.service"], check=True)
        notes.append(f"conffile lowered to min_abi = {abi}")
    return "; ".join(notes)


def make_users():
    if subprocess.run(["getent", "passwd", MEMBER], stdout=subprocess.DEVNULL).returncode != 0:
        sh(["useradd", "--create-home", "--groups", "pycell", MEMBER], check=True)
    if subprocess.run(["getent", "passwd", OUTSIDER], stdout=subprocess.DEVNULL).returncode != 0:
        sh(["useradd", "--create-home", OUTSIDER], check=True)
    grant_member_policies()


# The policies the member names through pycelld besides `default` (every
# other one is refused a uid that pycelld.toml's policies_by_uid does not
# grant it).
MEMBER_POLICIES = ["default", "egress-vm", "deps-vm", "vm-probe"]


def grant_member_policies():
    """The operator's step for a user who needs more than `default`."""
    with open("/etc/pycell/pycelld.toml") as f:
        text = f.read()
    if "\npolicies_by_uid" in text:
        return
    names = ", ".join(json.dumps(n) for n in MEMBER_POLICIES)
    with open("/etc/pycell/pycelld.toml", "a") as f:
        f.write(f"\npolicies_by_uid = {{ {MEMBER} = [{names}] }}\n")
    sh(["systemctl", "try-restart", "pycelld.service"], check=True)


def limit_checks(prefix, opts, user):
    """ok / oom / fork bomb / timeout, through whichever path `opts` selects."""

    def ok():
        rc, r, err = pycell_json(PRINT_1, opts, user)
        expect(rc == 0 and r.get("status") == "ok" and r.get("stdout") == "1\n",
               f"print(1): exit {rc}, {brief(r)}, stderr {err[-500:]!r}")
        version = ((r.get("layers") or {}).get("cgroup") or {}).get("version")
        expect(version == "v2", f"layers.cgroup.version is {version!r}, want \"v2\": {json.dumps(r.get('layers'))}")
        expect_no_leftovers("after print(1)")
        return f"{r.get('wall_ms')} ms, cgroup {r['layers']['cgroup'].get('name')}"

    def oom():
        rc, r, err = pycell_json(HOG, [*opts, "--memory", "64M", "--timeout", "60"], user)
        expect(r.get("status") == "oom" and rc == 137,
               f"512 MiB under --memory 64M: exit {rc}, {brief(r)}, stderr {err[-500:]!r}")
        peak = r.get("peak_memory_bytes") or 0
        expect(peak <= 64 << 20, f"peak memory {peak} is above the 64 MiB limit")
        expect_no_leftovers("after the oom run")
        return f"peak {peak >> 20} MiB"

    def forkbomb():
        rc, r, err = pycell_json(FORK_UNTIL_REFUSED, [*opts, "--pids", "16", "--timeout", "60"], user)
        expect(rc == 0 and r.get("status") == "ok", f"fork until refused: exit {rc}, {brief(r)}, stderr {err[-500:]!r}")
        n, errname = (r.get("stdout") or "").split()[:2]
        expect(errname == "EAGAIN" and int(n) < 16, f"forks before refusal: {n}, error {errname} (want < 16, EAGAIN)")
        t0 = time.monotonic()
        rc, r, err = pycell_json(FORK_BOMB, [*opts, "--pids", "32", "--timeout", "5"], user)
        took = time.monotonic() - t0
        expect(r.get("status") == "timeout" and rc == 124,
               f"fork bomb under --pids 32 --timeout 5: exit {rc}, {brief(r)}, stderr {err[-500:]!r}")
        expect(took < 60, f"the fork bomb run took {took:.0f} s")
        expect_no_leftovers("after the fork bomb")
        return f"{n} forks then EAGAIN; bomb stopped by its 5 s timeout after {took:.1f} s"

    def timeout():
        t0 = time.monotonic()
        rc, r, err = pycell_json(TREE, [*opts, "--timeout", "3"], user)
        took = time.monotonic() - t0
        expect(r.get("status") == "timeout" and rc == 124,
               f"tree under --timeout 3: exit {rc}, {brief(r)}, stderr {err[-500:]!r}")
        expect("tree started" in (r.get("stdout") or ""), f"the tree never started: {brief(r)}")
        expect_no_leftovers("after the timeout")
        return f"killed the tree after {took:.1f} s"

    return [(f"{prefix}-ok", ok), (f"{prefix}-oom", oom), (f"{prefix}-forkbomb", forkbomb),
            (f"{prefix}-timeout", timeout)]


ESCAPE = f"{PAYLOAD}/escape"
# Tests that do not apply when the runs go through pycelld, and why.
DAEMON_SKIPS = {
    "hardening": {
        "a_sigkilled_jailer_takes_its_sandbox_and_cgroup_along":
            "kills the jailer that an embedded pycell run started (pycelld's own SIGKILL checks: restart-clean)",
        "bind_sources_a_less_trusted_user_could_change_are_refused":
            "policy files by path are embedded mode's; pycelld runs installed policies only",
        "a_sandbox_pays_for_its_own_inotify_instances_never_host_roots":
            "an embedded run under a policy file of its own (100 inotify instances); pycelld runs installed policies only",
    },
}
TEST_LINE = re.compile(r"^test (\S+) \.\.\. (ok|FAILED|ignored)$", re.M)


def read_file(path):
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def escape_tests(via, binaries, root=ESCAPE, wrap=None, read_report=read_file, label=None):
    """The host's escape tests (the same binaries, scripts/vm-test built
    them) against the installed package on this kernel; `via` says how
    their runs reach a jailer. Every test must pass, as on the host.
    `wrap(env, argv)` makes the command that runs them elsewhere (in a pod,
    where the payload's escape directory is `root`); the probe's report is
    printed as `label`'s."""
    report = f"/tmp/probe-report-{via}.json"
    env = {
        "PYCELL_BIN": "/usr/bin/pycell",
        "PYCELL_TEST_REPO": f"{root}/repo",
        "PYCELL_TEST_VIA": via,
        "PYCELL_TEST_PROBE_REPORT": report,
        "PYCELL_SECCOMP_TRY": f"{root}/bin/pycell-seccomp-try",
        "PYCELL_SECCOMP_DIR": f"{root}/repo/seccomp",
        "RUST_BACKTRACE": "0",
    }
    counts, failed, notes = {}, [], []
    for binary in binaries:
        skips = DAEMON_SKIPS.get(binary, {}) if via == "daemon" else {}
        args = [f"{root}/bin/{binary}", "--test-threads=2"]
        for name in skips:
            args += ["--skip", name]
        if wrap is None:
            rc, out, err = sh(args, env=env, timeout=600)
        else:
            rc, out, err = sh(wrap(env, args), timeout=600)
        results = TEST_LINE.findall(out)
        counts[binary] = sum(1 for _, r in results if r == "ok")
        bad = [name for name, r in results if r != "ok"]
        failed += [f"{binary}::{name}" for name in bad]
        if rc != 0 and not bad:
            failed.append(f"{binary} exited {rc}")
        if rc != 0:
            for line in (out[-6000:] + err[-2000:]).splitlines():
                log(f"{binary}: {line}")
        notes += [f"{binary}::{name} left out ({why})" for name, why in skips.items()]
    text = read_report(report)
    if text:
        print(f"PROBE-REPORT {label or via} {text.strip()}", flush=True)
    expect(not failed, f"{len(failed)} failed on this kernel: {', '.join(failed)}")
    note = ", ".join(f"{b} {n}" for b, n in counts.items())
    return f"{sum(counts.values())} tests passed ({note})" + (f"; {'; '.join(notes)}" if notes else "")


def check_escape_embedded():
    return escape_tests("embedded", ["probe_default", "hardening"])


ZYGOTE_SELF = (
    "import os\n"
    "status = dict(l.split(':', 1) for l in open('/proc/self/status').read().splitlines())\n"
    "print(os.getuid(), status['CapEff'].strip(), status['Seccomp'].strip(), status['NoNewPrivs'].strip(),\n"
    "      open('/proc/self/cgroup').read().strip(), sorted(os.listdir('/workspace')))\n"
)


def check_zygote_embedded():
    """`pycell batch --embedded --zygote`: runs forked from a zygote join
    their cgroup v2 through cgroup.procs (the jailer opened it) and have
    every layer; a run past the memory limit is killed; nothing is left."""
    lines = [json.dumps({"code": ZYGOTE_SELF}) for _ in range(3)]
    lines.append(json.dumps({"code": "x = 'x' * (1 << 30)\nprint(len(x))\n"}))
    rc, out, err = sh(["pycell", "batch", "--embedded", "--zygote", "-j", "2", "-"],
                      input="\n".join(lines) + "\n")
    results = [json.loads(l)["result"] for l in out.splitlines()]
    expect(rc == 0 and len(results) == 4, f"batch exited {rc} with {len(results)} results; stderr {err[-800:]!r}")
    uids = set()
    for r in results[:3]:
        expect(r.get("status") == "ok" and r.get("warm") is True, f"a zygote run: {brief(r)}")
        version = ((r.get("layers") or {}).get("cgroup") or {}).get("version")
        expect(version == "v2", f"layers.cgroup.version is {version!r}: {json.dumps(r.get('layers'))}")
        expect(r["stdout"] == "1000 0000000000000000 2 1 0::/ ['main.py']\n", f"what the run saw: {brief(r)}")
        uids.add(r["layers"]["sandbox_uid"])
    expect(results[3].get("status") == "oom", f"1 GiB under the default 512 MiB: {brief(results[3])}")
    expect_no_leftovers("after the zygote's batch")
    return f"{len(uids)} sandbox uids, {results[0].get('wall_ms')} ms a run"


def check_escape_daemon():
    return escape_tests("daemon", ["probe_default", "hardening"])


def check_seccomp_filter():
    return escape_tests("embedded", ["try_binary"])


def check_security_score():
    rc, out, err = sh(["systemd-analyze", "security", "--no-pager", "pycelld.service"])
    m = re.search(r"Overall exposure level for pycelld\.service:\s*([0-9.]+)\s*(\w+)", out)
    expect(m is not None, f"no exposure level in systemd-analyze output (exit {rc}): {(out + err)[-800:]}")
    for line in out.splitlines():
        if line.startswith("✗"):
            log(line)
    score = float(m.group(1))
    expect(score <= MAX_EXPOSURE, f"exposure {score} {m.group(2)} is above {MAX_EXPOSURE}")
    return f"{score} {m.group(2)}"


# Raise only with a reason in docs/install.md.
MAX_EXPOSURE = 3.6


def check_service_active():
    ok = wait_until(lambda: sh(["systemctl", "is-active", "pycelld.service"])[1].strip() == "active", 30)
    if not ok:
        _, status, _ = sh(["systemctl", "status", "--no-pager", "-l", "pycelld.service"])
        _, journal, _ = sh(["journalctl", "-b", "-u", "pycelld.service", "--no-pager", "-n", "40"])
        raise CheckFailed(f"pycelld.service is not active:\n{status}\n{journal}")
    # Type=notify: "active" means pycelld said READY=1.
    _, typ, _ = sh(["systemctl", "show", "-P", "Type", "pycelld.service"])
    expect(typ.strip() == "notify", f"pycelld.service Type is {typ.strip()}")
    _, enabled, _ = sh(["systemctl", "is-enabled", "pycelld.service"])
    expect(enabled.strip() == "enabled", f"pycelld.service is {enabled.strip()}, not enabled")
    sock = "/run/pycell/pycell.sock"
    expect(os.path.exists(sock), f"{sock} does not exist")
    st = os.stat(sock)
    expect(grp.getgrgid(st.st_gid).gr_name == "pycell" and st.st_mode & 0o777 == 0o660,
           f"{sock} is group {grp.getgrgid(st.st_gid).gr_name}, mode {oct(st.st_mode & 0o777)}")
    # The socket is systemd's (pycelld.socket), the watchdog armed.
    for unit in ("pycelld.socket",):
        _, state, _ = sh(["systemctl", "is-active", unit])
        _, enabled, _ = sh(["systemctl", "is-enabled", unit])
        expect(state.strip() == "active" and enabled.strip() == "enabled",
               f"{unit} is {state.strip()}, {enabled.strip()}")
    _, watchdog, _ = sh(["systemctl", "show", "-P", "WatchdogUSec", "pycelld.service"])
    expect(watchdog.strip() == "30s", f"pycelld.service WatchdogUSec is {watchdog.strip()!r}")
    _, main_pid, _ = sh(["systemctl", "show", "-P", "MainPID", "pycelld.service"])
    return f"ready, main pid {main_pid.strip()}; socket activated; watchdog {watchdog.strip()}"


def runs_in_parallel(n):
    """n `pycell run`s of print(1) as MEMBER at once -> their (exit, status, error code)."""
    results = [None] * n

    def one(i):
        rc, out, err = sh(["pycell", "run", "--json", "-"], input=PRINT_1, user=MEMBER, timeout=120)
        try:
            r = json.loads(out)
            results[i] = (rc, r.get("status"), (r.get("error") or {}).get("code"))
        except ValueError:
            results[i] = (rc, None, f"no JSON: {err[-200:]!r}")

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    return threads, results


def check_socket_activation():
    """Clients that arrive while pycelld restarts wait on systemd's socket
    instead of failing; a stopped service is started by the first client."""
    _, before, _ = sh(["systemctl", "show", "-P", "MainPID", "pycelld.service"])
    rc, _, err = sh(["systemctl", "restart", "--no-block", "pycelld.service"])
    expect(rc == 0, f"systemctl restart: {err}")
    threads, results = runs_in_parallel(12)
    for t in threads:
        t.join()
    bad = [r for r in results if r is None or r[1] != "ok"]
    expect(not bad, f"runs during the restart did not all succeed: {results}")
    _, after, _ = sh(["systemctl", "show", "-P", "MainPID", "pycelld.service"])
    expect(after.strip() != before.strip(), "the service did not restart")
    rc, _, err = sh(["systemctl", "stop", "pycelld.service"])
    expect(rc == 0, f"systemctl stop: {err}")
    expect(os.path.exists("/run/pycell/pycell.sock"), "the socket went with the stopped service")
    rc, r, err = pycell_json(PRINT_1, user=MEMBER)
    expect(rc == 0 and r.get("status") == "ok", f"print(1) with the service stopped: exit {rc}, {brief(r)}, {err[-300:]!r}")
    ok = wait_until(lambda: sh(["systemctl", "is-active", "pycelld.service"])[1].strip() == "active", 30)
    expect(ok, "the first client did not start pycelld.service")
    return f"12 runs during a restart all ok; a client started the stopped service"


def check_hand_start():
    """pycelld started by hand with no configuration file runs on defaults
    and serves (as the README shows), then leaves nothing behind."""
    rc, _, err = sh(["systemctl", "stop", "pycelld.socket", "pycelld.service"])
    expect(rc == 0, f"systemctl stop: {err}")
    os.rename("/etc/pycell/pycelld.toml", "/etc/pycell/pycelld.toml.away")
    hand = None
    try:
        # A cgroup of its own to delegate runs from (docs/install.md).
        hand = subprocess.Popen(["systemd-run", "--scope", "--quiet", "-p", "Delegate=yes", "/usr/sbin/pycelld"],
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        up = wait_until(lambda: os.path.exists("/run/pycell/pycell.sock") or hand.poll() is not None, 30)
        expect(up and hand.poll() is None, f"pycelld did not start: {hand.stdout.read() if hand.poll() is not None else ''}")
        st = os.stat("/run/pycell/pycell.sock")
        expect(grp.getgrgid(st.st_gid).gr_name == "pycell" and st.st_mode & 0o777 == 0o660,
               f"socket group {grp.getgrgid(st.st_gid).gr_name}, mode {oct(st.st_mode & 0o777)}")
        rc, r, err = pycell_json(PRINT_1, user=MEMBER)
        expect(rc == 0 and r.get("status") == "ok", f"print(1) through the hand-started pycelld: exit {rc}, {brief(r)}, {err[-300:]!r}")
        hand.send_signal(signal.SIGTERM)
        hand.wait(timeout=30)
        expect(not os.path.exists("/run/pycell/pycell.sock"), "the hand-started pycelld left its socket")
        expect_no_leftovers("after the hand-started pycelld stopped")
    finally:
        if hand is not None and hand.poll() is None:
            hand.kill()
            hand.wait()
        os.rename("/etc/pycell/pycelld.toml.away", "/etc/pycell/pycelld.toml")
        sh(["systemctl", "start", "pycelld.socket", "pycelld.service"])
    ok = wait_until(lambda: sh(["systemctl", "is-active", "pycelld.service"])[1].strip() == "active", 30)
    expect(ok, "pycelld.service did not come back")
    return "served on defaults, socket root:pycell 0660, removed on exit"


def check_daemon_warm():
    """The installed pycelld serves from its warm pool: a run takes a ready
    member (its CPU clock restarted under the service's hardening, its
    disk measured) once the pool has warmed up."""
    code = "open('/workspace/f', 'wb').write(b'x' * 300000)\nprint(1)\n"
    deadline = time.monotonic() + 90
    tries = 0
    while True:
        tries += 1
        rc, r, err = pycell_json(code, [], MEMBER)
        expect(rc == 0 and r.get("status") == "ok", f"run {tries}: exit {rc}, {brief(r)}, {err[-300:]!r}")
        if r.get("warm"):
            break
        if time.monotonic() >= deadline:
            journal = sh(["journalctl", "-u", "pycelld.service", "--no-pager", "-o", "cat"])[1]
            said = [l for l in journal.splitlines() if '"event":"run_' not in l][-40:]
            raise CheckFailed(f"no run was warm in 90 s ({tries} runs); last {brief(r)}\n" + "\n".join(said))
        time.sleep(2)
    disk = r.get("disk_used_bytes") or 0
    expect(disk >= 300000, f"a warm run's disk_used_bytes is {disk}, want >= 300000")
    return f"warm after {tries} run(s): {r.get('wall_ms'):.0f} ms, waited {r.get('warm_waited_ms') or 0:.0f} ms ready, disk {disk} bytes"


def check_daemon_session():
    """A session through the installed service, as a member of the pycell
    group: state across commands (each its own connection), a file in and
    out, and nothing of it left once it ends."""
    def session(*args, input=None):
        return sh(["pycell", "session", *args], user=MEMBER, input=input)

    rc, handle, err = session("start")
    expect(rc == 0 and handle.startswith("s-"), f"session start: exit {rc}, {handle!r} {err[-400:]!r}")
    handle = handle.strip()
    rc, _, err = session("run", handle, "--code", "x = 41")
    expect(rc == 0, f"the first cell: exit {rc}, {err[-400:]!r}")
    rc, out, err = session("run", handle, "-", input="x + 1\n")
    expect((rc, out) == (0, "42\n"), f"the second cell: exit {rc}, {out!r}, {err[-400:]!r}")
    rc, _, err = session("run", handle, "--code", "open('out.txt', 'w').write('from the sandbox')")
    expect(rc == 0, f"writing a file: exit {rc}, {err[-400:]!r}")
    rc, out, err = session("get", handle, "out.txt")
    expect((rc, out) == (0, "from the sandbox"), f"session get: exit {rc}, {out!r}, {err[-400:]!r}")
    rc, out, err = session("get", handle, "../etc/shadow")
    expect(rc == 125 and "'..'" in err, f"a path outside /workspace: exit {rc}, {err[-400:]!r}")
    rc, _, err = session("end", handle)
    expect(rc == 0, f"session end: exit {rc}, {err[-400:]!r}")
    left = wait_until(lambda: not sandbox_processes(), 15)
    expect(left, f"processes left after session end: {sandbox_processes()}")
    rc, _, err = session("run", handle, "--code", "x")
    expect(rc == 125 and "session_gone" in err, f"a call after the end: exit {rc}, {err[-400:]!r}")
    return f"session {handle[:12]}...: 42, a file out, nothing left after its end"


def check_journal():
    """Under systemd, pycelld's audit lines are journal entries whose fields
    name the run (RUN_ID, PEER_UID, POLICY), and run_end says how the run
    ended (status, exit code)."""
    rc, r, err = pycell_json("import sys; print(1); sys.exit(3)\n", [], MEMBER)
    run_id = r.get("run_id")
    expect(rc == 3 and run_id, f"exit {rc}, {brief(r)}, {err[-300:]!r}")

    def entries():
        out = sh(["journalctl", "-u", "pycelld.service", "--no-pager", "-o", "json", f"RUN_ID={run_id}"])[1]
        return [json.loads(line) for line in out.splitlines() if line.strip()]

    def audit(event):
        for e in entries():
            msg = e.get("MESSAGE")
            if isinstance(msg, str) and f'"event":"{event}"' in msg:
                return e, json.loads(msg)
        return None

    wait_until(lambda: audit("run_end"), 15)
    found = [audit("run_start"), audit("run_end")]
    expect(all(found), f"journal entries with RUN_ID={run_id}: {entries()!r}"[:2000])
    (start, _), (end_entry, end) = found
    uid = str(pwd.getpwnam(MEMBER).pw_uid)
    expect(start.get("PEER_UID") == uid and start.get("POLICY") == "default"
           and start.get("SYSLOG_IDENTIFIER") == "pycelld",
           f"run_start's journal fields: {start!r}"[:2000])
    expect(end.get("status") == "error" and end.get("exit_code") == 3 and end.get("jailer") == "exited 0",
           f"run_end: {end!r}")
    return f"RUN_ID={run_id}: run_start (PEER_UID={uid}, POLICY=default), run_end status error, exit 3"


def check_outsider_refused():
    rc, out, err = sh(["pycell", "run", "--json", "-"], input=PRINT_1, user=OUTSIDER)
    expect(rc != 0, f"{OUTSIDER} (not in group pycell) ran code: exit {rc}, {out[-300:]!r}")
    ran = '"stdout": "1\\n"' in out or '"stdout":"1\\n"' in out
    expect(not ran, f"{OUTSIDER}'s code ran: {out[-300:]!r}")
    return f"exit {rc}: {(err.strip() or out.strip())[-160:]}"


def start_in_flight():
    """A long run as MEMBER, through the daemon, left running."""
    path = "/tmp/tree.py"
    with open(path, "w") as f:
        f.write(TREE)
    os.chmod(path, 0o644)
    return subprocess.Popen(["runuser", "-u", MEMBER, "--", "pycell", "run", "--json", "--timeout", "120", path],
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


SERVICE_CGROUP = "/sys/fs/cgroup/system.slice/pycelld.service"
CAP_DAC_OVERRIDE = 1


def check_cgroups_delegated():
    """Runs live in the service's delegated subtree (Delegate=yes), pycelld
    itself in its `supervisor` leaf, and the service runs without
    CAP_DAC_OVERRIDE. Then the client goes away and its run goes too."""
    p = start_in_flight()
    try:
        cgs = wait_until(run_cgroups, 60)
        expect(cgs, "no run cgroup appeared for a run in flight")
        outside = [c for c in cgs if not c.startswith(f"{SERVICE_CGROUP}/runs/pycell-")]
        expect(not outside, f"run cgroups outside {SERVICE_CGROUP}/runs: {outside}")
        with open(f"{SERVICE_CGROUP}/cgroup.procs") as f:
            inner = f.read().split()
        expect(not inner, f"processes directly in {SERVICE_CGROUP} (not in a leaf): {inner}")
        with open(f"{SERVICE_CGROUP}/cgroup.subtree_control") as f:
            delegated = f.read().split()
        expect({"memory", "pids", "cpu"} <= set(delegated), f"{SERVICE_CGROUP} hands out only {delegated}")
        main_pid = sh(["systemctl", "show", "-P", "MainPID", "pycelld.service"])[1].strip()
        with open(f"/proc/{main_pid}/cgroup") as f:
            main_cg = f.read().strip()
        expect(main_cg == "0::/system.slice/pycelld.service/supervisor", f"pycelld's monitor is in {main_cg!r}")
        with open(f"/proc/{main_pid}/status") as f:
            bnd = int(re.search(r"^CapBnd:\s*([0-9a-f]+)", f.read(), re.M).group(1), 16)
        expect(not bnd & (1 << CAP_DAC_OVERRIDE), f"pycelld's bounding set has CAP_DAC_OVERRIDE ({bnd:#x})")
        expect(not os.path.exists("/sys/fs/cgroup/pycelld"), "a top-level /sys/fs/cgroup/pycelld exists")
        where = cgs[0]
    finally:
        # The client (runuser and pycell, its own session) goes away.
        os.killpg(p.pid, signal.SIGKILL)
        p.wait(timeout=30)
    expect_no_leftovers("after the client was killed")
    return f"run in {where}; monitor in supervisor; CapBnd {bnd:#x}; the run ended with its client"


def check_restart_clean():
    # A run in flight when the service restarts must not survive it.
    p = start_in_flight()
    started = wait_until(lambda: sandbox_processes(), 30)
    expect(started, "the long run never started")
    rc, out, err = sh(["systemctl", "restart", "pycelld.service"], timeout=90)
    expect(rc == 0, f"systemctl restart exited {rc}: {err}")
    try:
        out, _ = p.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        p.kill()
        raise CheckFailed("the client of the interrupted run did not finish")
    try:
        status = json.loads(out).get("status")
    except ValueError:
        status = f"no JSON result ({out[-200:]!r})"
    expect_no_leftovers("after systemctl restart")
    expect(sh(["systemctl", "is-active", "pycelld.service"])[1].strip() == "active", "pycelld is not active after restart")
    rc, r, err = pycell_json(PRINT_1, user=MEMBER)
    expect(rc == 0 and r.get("status") == "ok", f"print(1) after restart: exit {rc}, {brief(r)}, {err[-300:]!r}")
    return f"the run in flight ended with exit {p.returncode}, status {status}"


EGRESS_CODE = r"""
import errno, socket, urllib.request
print(len(urllib.request.urlopen("http://127.0.0.1:8099/", timeout=10).read()) > 0)
try:
    socket.create_connection(("127.0.0.1", 8099), timeout=5)
    print("direct connect succeeded")
except OSError as e:
    print("direct", errno.errorcode.get(e.errno, e.errno))
try:
    socket.getaddrinfo("example.net", 80)
    print("dns succeeded")
except OSError as e:
    print("dns failed")
try:
    urllib.request.urlopen("http://example.net/", timeout=10)
except Exception as e:
    print(str(e)[:200])
"""


def check_egress():
    """The network policy through pycelld on this kernel: egress through the
    proxy to an allowlisted server on the VM's loopback; no direct route
    and no DNS in the jail (with or without Landlock's network rules); a
    host off the list refused before any lookup."""
    with open("/etc/pycell/policies/network.toml") as f:
        text = f.read()
    text = re.sub(r'^name = .*$', 'name = "egress-vm"', text, count=1, flags=re.M)
    text = re.sub(r'^allow = .*$', 'allow = ["http://127.0.0.1:8099"]', text, count=1, flags=re.M)
    m = re.search(r"^min_abi\s*=\s*(\d+)", text, re.M)
    abi = landlock_abi()
    if m and int(m.group(1)) > abi:
        text = text[:m.start(1)] + str(abi) + text[m.end(1):]
    with open("/etc/pycell/policies/egress-vm.toml", "w") as f:
        f.write(text)
    server = subprocess.Popen(["python3", "-m", "http.server", "8099", "--bind", "127.0.0.1"],
                              cwd="/usr/share/doc", stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_until(lambda: subprocess.run(["python3", "-c", "import socket; socket.create_connection(('127.0.0.1', 8099))"],
                                          stderr=subprocess.DEVNULL).returncode == 0, 10)
        rc, r, err = pycell_json(EGRESS_CODE, ["--policy", "egress-vm"], MEMBER)
    finally:
        server.kill()
        server.wait()
        os.remove("/etc/pycell/policies/egress-vm.toml")
    lines = (r.get("stdout") or "").splitlines()
    expect(rc == 0 and r.get("status") == "ok", f"egress run: exit {rc}, {brief(r)}, stderr {err[-500:]!r}")
    expect(lines[:1] == ["True"], f"the allowlisted server was not reached: {brief(r)}")
    expect(lines[1] in ("direct ECONNREFUSED", "direct EACCES"), f"a direct connection: {lines[1]!r}")
    expect(lines[2] == "dns failed", f"DNS in the jail: {lines[2]!r}")
    expect(lines[3].startswith("HTTP Error 403: pycell egress proxy: plain HTTP to example.net:80 denied"), f"denied host: {lines[3]!r}")
    net = r.get("network") or {}
    allowed = [f"{a['host']}:{a['port']}" for a in net.get("allowed", [])]
    denied = [f"{d['host']}:{d['port']}:{d['reason']}" for d in net.get("denied", [])]
    expect(allowed == ["127.0.0.1:8099"] and denied == ["example.net:80:not_allowlisted"], f"network report {net}")
    only = ((r.get("layers") or {}).get("landlock") or {}).get("tcp_connect_only_to")
    return f"{lines[1]}; landlock ABI {abi}, tcp connect limited to {only if only else 'nothing (no network rules on this kernel: the empty namespace is the barrier)'}"


DEPS_CODE = """# /// script
# dependencies = ["pycell-test-a"]
# ///
import pycell_test_a, pycell_test_b
print(pycell_test_b.VERSION)
"""
VM_MOUNTS = "".join('[[mounts]]\nsource = "%s"\n' % m for m in ("/usr", "/bin", "/lib", "/lib64", "/sbin"))


def check_deps():
    """Dependencies through pycelld as installed: a builder under the
    service's hardening (no DAC override, ProtectSystem=strict) installs a
    script's PEP 723 block from a local wheelhouse in the install jail; the
    env is root's in /var/lib/pycell; the next run finds it."""
    wheels = "/var/cache/pycell-vm-wheels"
    rc, out, err = sh(["python3", f"{PAYLOAD}/make_wheels.py", wheels])
    expect(rc == 0, f"make_wheels.py: {out} {err}")
    head = 'description = "vm"\nnamespaces = ["user", "pid", "mount", "net", "ipc", "uts", "cgroup"]\n[interpreter]\npython = "/usr/bin/python3"\n'
    policies = {
        "vm-install": head + '[limits]\nwall_timeout = "5m"\ncpu_time = "5m"\nmemory = "1GiB"\npids = 256\ndisk = "512MiB"\n'
        + f'[install]\nfind_links = ["{wheels}"]\n' + VM_MOUNTS
        + '[env]\nPATH = "/usr/bin:/bin"\nHOME = "/workspace"\nUV_CACHE_DIR = "/tmp/uv-cache"\nUV_PYTHON_DOWNLOADS = "never"\nUV_NO_PROGRESS = "1"\n',
        "deps-vm": head + '[dependencies]\nallow = true\ninstall_policy = "vm-install"\n' + VM_MOUNTS
        + '[env]\nPATH = "/usr/bin:/bin"\nHOME = "/workspace"\n',
    }
    for name, text in policies.items():
        with open(f"/etc/pycell/policies/{name}.toml", "w") as f:
            f.write(f'name = "{name}"\n' + text)
    try:
        first = pycell_json(DEPS_CODE, ["--policy", "deps-vm"], MEMBER, timeout=600)
        again = pycell_json(DEPS_CODE, ["--policy", "deps-vm"], MEMBER)
    finally:
        for name in policies:
            os.remove(f"/etc/pycell/policies/{name}.toml")
    rc, r, err = first
    expect(rc == 0 and r.get("status") == "ok" and r.get("stdout") == "2.0\n", f"first run: exit {rc}, {brief(r)}, stderr {err[-800:]!r}")
    env = r.get("env") or {}
    expect(env.get("cache") == "miss", f"first run's env: {env}")
    expect("installed pycell-test-a 1.0" in err, f"no install steps on stderr: {err[-800:]!r}")
    rc, r2, err = again
    expect(rc == 0 and (r2.get("env") or {}).get("cache") == "hit", f"second run: exit {rc}, {brief(r2)}, env {r2.get('env')}")
    path = f"/var/lib/pycell/envs/{env.get('key')}"
    st = os.stat(path)
    expect(st.st_uid == 0 and st.st_mode & 0o022 == 0, f"{path}: uid {st.st_uid}, mode {st.st_mode:o}")
    rc, out, err = sh(["pycell", "env", "list", "--store", "/var/lib/pycell"])
    expect(rc == 0 and env["key"][:16] in out, f"pycell env list: {out} {err}")
    return f"installed in {env.get('install_ms', 0) / 1000:.1f} s, then found ({r2.get('wall_ms', 0):.0f} ms run)"


PROBE_SESSION = [
    {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "vm", "version": "1"}}},
    {"jsonrpc": "2.0", "method": "notifications/initialized"},
    {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "probe", "arguments": {}}},
]


def check_mcp_server():
    """A third-party MCP server through the installed service: a member's
    `pycell mcp-server` runs the probe server (a wheel of the local
    wheelhouse, staged by the builder) in a jail of the shipped mcp-server
    policy; it reaches nothing of the member's (home, environment) but the
    variable it was given. A grant is refused, saying why (the service has
    its own mount namespace and no CAP_SYS_ADMIN to idmap one), and leaves
    nothing behind."""
    wheels = "/var/cache/pycell-vm-wheels"
    rc, out, err = sh(["python3", f"{PAYLOAD}/make_wheels.py", wheels])
    expect(rc == 0, f"make_wheels.py: {out} {err}")
    with open("/etc/pycell/policies/mcp-server.toml") as f:
        shipped = f.read()
    head = 'description = "vm"\nnamespaces = ["user", "pid", "mount", "net", "ipc", "uts", "cgroup"]\n[interpreter]\npython = "/usr/bin/python3"\n'
    policies = {
        "vm-install": 'name = "vm-install"\n' + head + '[limits]\nwall_timeout = "5m"\ncpu_time = "5m"\nmemory = "1GiB"\npids = 256\ndisk = "512MiB"\n'
        + f'[install]\nfind_links = ["{wheels}"]\n' + VM_MOUNTS
        + '[env]\nPATH = "/usr/bin:/bin"\nHOME = "/workspace"\nUV_CACHE_DIR = "/tmp/uv-cache"\nUV_PYTHON_DOWNLOADS = "never"\nUV_NO_PROGRESS = "1"\n',
        "vm-probe": shipped.replace('name = "mcp-server"', 'name = "vm-probe"').replace(
            'install_policy = "install"', 'install_policy = "vm-install"'),
    }
    home = f"/home/{MEMBER}"
    sh(["sh", "-c", f"mkdir -p {home}/.ssh {home}/granted && echo canary > {home}/.ssh/id_canary && chmod 600 {home}/.ssh/id_canary"],
       user=MEMBER, check=True)
    secret, token = "vm-secret-not-for-the-server", "vm-token-for-the-server"
    probe = ["pycell-probe-server", "--", "--canary", f"{home}/.ssh/id_canary", "--agent", f"{home}/agent.sock",
             "--secret-reversed", secret[::-1]]
    env = {"HOME": home, "CALLER_SECRET": secret, "GRANTED_TOKEN": token}
    lines = "".join(json.dumps(m) + "\n" for m in PROBE_SESSION)
    for name, text in policies.items():
        with open(f"/etc/pycell/policies/{name}.toml", "w") as f:
            f.write(text)
    try:
        served = sh(["pycell", "mcp-server", "--policy", "vm-probe", "--env", "GRANTED_TOKEN"] + probe,
                    input=lines, user=MEMBER, env=env, timeout=600)
        granted = sh(["pycell", "mcp-server", "--policy", "vm-probe", "--rw", f"{home}/granted"] + probe,
                     input=lines, user=MEMBER, env=env)
    finally:
        for name in policies:
            os.remove(f"/etc/pycell/policies/{name}.toml")
    rc, out, err = served
    expect(rc == 0, f"pycell mcp-server exited {rc}: {out[-800:]} {err[-1500:]}")
    answers = {m.get("id"): m for m in map(json.loads, out.splitlines())}
    expect(answers.get(1, {}).get("result", {}).get("serverInfo", {}).get("name") == "pycell-probe-server",
           f"no handshake: {out[-800:]}")
    p = json.loads(answers[2]["result"]["content"][0]["text"])
    expect("error" in p["home_canary"] and "error" in p["home_listing"], f"the caller's home was reachable: {p}")
    expect(p["secret_seen"] == [] and "CALLER_SECRET" not in p["env_names"], f"the caller's environment leaked: {p}")
    expect(p["granted_token"] == token, f"--env GRANTED_TOKEN: {p['granted_token']!r}")
    rc, out, err = granted
    expect(rc == 125 and "mounts_failed" in err and "--embedded" in err, f"a grant through the service: exit {rc}, {err[-800:]!r}")
    expect(wait_until(lambda: not sandbox_processes(), 10), f"left running: {sandbox_processes()}")
    return f"probe server as uid {p['uid']}: home and environment unreachable; a grant refused: {err.strip().splitlines()[-1][:120]}"


def check_mcp():
    client = f"{PAYLOAD}/mcp_client.py"
    env = {"PYTHONPATH": f"{PAYLOAD}/mcp-sdk", "PYTHONDONTWRITEBYTECODE": "1"}
    rc, out, err = sh(["python3", client], user=MEMBER, env=env, timeout=180)
    expect(rc == 0, f"MCP client exited {rc}: {out[-800:]} {err[-1500:]}")
    return out.strip().splitlines()[-1] if out.strip() else ""


def check_mcp_tool_call():
    # Code mode through the installed service: the client's own MCP server
    # (written with the SDK) is called from the sandbox via pycelld.
    client = f"{PAYLOAD}/mcp_client.py"
    env = {"PYTHONPATH": f"{PAYLOAD}/mcp-sdk", "PYTHONDONTWRITEBYTECODE": "1"}
    rc, out, err = sh(["python3", client, "--tools", f"{PAYLOAD}/tool_upstream.py"], user=MEMBER, env=env, timeout=180)
    expect(rc == 0, f"MCP client (code mode) exited {rc}: {out[-800:]} {err[-1500:]}")
    return out.strip().splitlines()[-1] if out.strip() else ""


def check_purge_clean():
    # A run in flight when the package is purged.
    p = start_in_flight()
    started = wait_until(lambda: sandbox_processes(), 30)
    note = purge(p)
    expect(started, "the purge left nothing behind, but the run meant to be in flight never started")
    return f"{note}, with a run in flight"


def check_purge_clean_embedded():
    return purge(None)


def purge(inflight):
    rc, out, err = sh(["apt-get", "purge", "-y", "pycell"], env={"DEBIAN_FRONTEND": "noninteractive"}, timeout=300)
    expect(rc == 0, f"apt-get purge exited {rc}: {(out + err)[-1500:]}")
    if inflight is not None:
        try:
            inflight.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            inflight.kill()
            raise CheckFailed("the client of the run in flight did not finish after the purge")
    problems = []
    procs = wait_until(lambda: not sandbox_processes(), 10) or sandbox_processes()
    if procs is not True and procs:
        problems.append(f"sandbox processes: {procs}")
    pyc = [l for l in sh(["ps", "-eo", "pid,user,args"])[1].splitlines()[1:] if ours(l) and "ps -eo" not in l]
    if pyc:
        problems.append(f"processes: {pyc}")
    cgs = pycell_cgroups()
    if cgs:
        problems.append(f"cgroups: {cgs}")
    for name, db in (("user", "passwd"), ("group", "group")):
        if subprocess.run(["getent", db, "pycell"], stdout=subprocess.DEVNULL).returncode == 0:
            problems.append(f"{name} pycell still exists")
    for path in ["/etc/pycell", "/run/pycell", "/var/lib/pycell", "/var/log/pycell", "/usr/bin/pycell",
                 "/lib/systemd/system/pycelld.service", "/etc/systemd/system/multi-user.target.wants/pycelld.service",
                 "/lib/systemd/system/pycelld.socket", "/etc/systemd/system/sockets.target.wants/pycelld.socket"]:
        if os.path.lexists(path):
            problems.append(f"{path} still exists")
    _, units, _ = sh(["systemctl", "list-units", "--all", "--no-legend", "--plain", "pycell*"])
    units = [u.split()[0] for u in units.splitlines() if u.split() and ours(u.split()[0])]
    if units:
        problems.append(f"units: {units}")
    expect(not problems, "; ".join(problems))
    return "nothing left"


# ------------------------------------------------------------------- runner

def main():
    with open(f"{PAYLOAD}/groups") as f:
        groups = set(f.read().split())
    print(f"RESULT-BEGIN groups={' '.join(sorted(groups))}", flush=True)
    checks = [("install", check_install)]
    if "base" in groups:
        checks += [("accounts", check_accounts), ("cgroup-v2", check_cgroup_v2)]
        checks += [("landlock-policy", check_landlock_policy)]
        checks += limit_checks("embedded", ["--embedded"], None)
        checks += [("escape-embedded", check_escape_embedded), ("seccomp-filter", check_seccomp_filter)]
        checks += [("embedded-zygote", check_zygote_embedded)]
        checks += [("security-score", check_security_score)]
    if "image" in groups:
        # The image's own pycelld in a pod, beside the installed one.
        import image_checks
        checks += image_checks.checks(sys.modules[__name__])
    if "base" in groups and "daemon" in groups:
        checks += [("service-active", lambda: (make_users(), check_service_active())[1])]
        checks += limit_checks("daemon", [], MEMBER)
        checks += [("daemon-journal", check_journal)]
        checks += [("daemon-warm", check_daemon_warm), ("escape-daemon", check_escape_daemon)]
        checks += [("daemon-session", check_daemon_session)]
        checks += [("daemon-outsider-refused", check_outsider_refused)]
        checks += [("daemon-cgroups-delegated", check_cgroups_delegated)]
        checks += [("daemon-egress", check_egress), ("daemon-deps", check_deps)]
        checks += [("daemon-mcp-server", check_mcp_server)]
        checks += [("socket-activation", check_socket_activation), ("hand-start", check_hand_start)]
        if "mcp" in groups:
            checks += [("mcp-run-python", check_mcp), ("mcp-tool-call", check_mcp_tool_call)]
        checks += [("restart-clean", check_restart_clean), ("purge-clean", check_purge_clean)]
    else:
        checks += [("purge-clean", check_purge_clean_embedded)]
    # Once the package is missing, nothing after it can pass: stop there.
    fatal = {"install"}
    threading.Thread(target=heartbeat, daemon=True).start()
    for name, fn in checks:
        t0 = time.monotonic()
        CURRENT["check"], CURRENT["since"] = name, t0
        try:
            note = fn()
            took = time.monotonic() - t0
            print(f"RESULT PASS {name}: {note} [{took:.1f} s]" if note else f"RESULT PASS {name} [{took:.1f} s]",
                  flush=True)
        except Exception as e:  # noqa: BLE001 - every failure becomes a FAIL line
            detail = str(e) if isinstance(e, CheckFailed) else f"{type(e).__name__}: {e}"
            first, _, rest = detail.partition("\n")
            print(f"RESULT FAIL {name}: {first}", flush=True)
            for line in rest.splitlines()[-150:]:
                log(line)
            if not isinstance(e, CheckFailed):
                for line in traceback.format_exc().splitlines()[-12:]:
                    log(line)
            if name in fatal:
                break
    print("RESULT-END", flush=True)


if __name__ == "__main__":
    main()
