"""The image check group: pycell's OCI image under podman with exactly the
privileges of the Kubernetes DaemonSet (deploy/kubernetes/podman.py turned
its pycelld container into podman options on the host; see scripts/vm-test).

The guest has what a Kubernetes node with a writable cgroup v2 RuntimeClass
has and this project's build hosts lack: a pure cgroup v2 hierarchy that a
container can be given. The checks: the image loads as built; pycelld starts
in it and has exactly the declared privileges, no more; runs go through it
with their limits; the escape tests and the probe pass through it as on the
host; a pod lacking any one declared privilege makes pycelld refuse to start,
naming it; a drained pod lets its runs finish, and a pod whose pycelld is
SIGKILLed leaves nothing behind.
"""
import json
import os
import re
import threading

IMAGE = "/mnt/payload/image"
REF = "localhost/pycell:pod-test"
POD = "pycelld-pod"
# The escape tests' binaries and files, bound into the pod read-only, and
# tmpfs where they plant their secrets (listed in escape/writable): the
# tests' own additions to the pod, not privileges.
def escape_mounts():
    with open("/mnt/payload/escape/writable") as f:
        dirs = f.read().split()
    return ["--volume", "/mnt/payload/escape:/escape:ro"] + [
        a for d in dirs for a in ("--mount", f"type=tmpfs,destination={d}")]
# The gateway container's uid: pycelld's config lets it (and only it) in.
CLIENT_UID = "65000"
# Capability numbers (linux/capability.h) of the names a pod may add.
CAP_BITS = {"CHOWN": 0, "DAC_OVERRIDE": 1, "FOWNER": 3, "KILL": 5, "SETGID": 6, "SETUID": 7,
            "NET_BIND_SERVICE": 10, "NET_ADMIN": 12, "SYS_CHROOT": 18, "SYS_ADMIN": 21}


def pod(variant=""):
    with open(f"{IMAGE}/pod{'-' + variant if variant else ''}.json") as f:
        return json.load(f)


def option(run, name):
    """The values of `name` in a podman option list."""
    return [run[i + 1] for i, a in enumerate(run[:-1]) if a == name]


class ImageChecks:
    def __init__(self, c):
        self.c = c  # the checks module: sh, expect, CheckFailed, ...

    def podman(self, *args, timeout=120, check=False):
        return self.c.sh(["podman", *args], timeout=timeout, check=check)

    def start(self, name, spec):
        self.podman("rm", "-f", "-v", name)
        rc, out, err = self.podman("run", "-d", "--name", name, *spec["run"], *escape_mounts(), REF, *spec["args"])
        self.c.expect(rc == 0, f"podman run exited {rc}: {err[-800:]}")

    def logs(self, name):
        _, out, err = self.podman("logs", name)
        return out[-1500:] + err[-1500:]

    def runs_started(self):
        """pycelld's audit log (stderr, in the pod's log): runs started."""
        _, out, err = self.podman("logs", POD)
        return (out + err).count('"event":"run_start"')

    def runs_ended(self):
        """The audit log's run_end events, oldest first."""
        _, out, err = self.podman("logs", POD)
        ends = []
        for line in (out + err).splitlines():
            if '"event":"run_end"' in line:
                try:
                    ends.append(json.loads(line[line.index("{"):]))
                except ValueError:
                    pass
        return ends

    def in_flight(self, code):
        """Start `code` in the pod on a thread; return it (its result in
        .result) once pycelld says the run started."""
        before = self.runs_started()

        def run():
            try:
                t.result = self.run_in_pod(code)
            except self.c.CheckFailed as e:
                t.failed = str(e)
        t = threading.Thread(target=run, daemon=True)
        t.result, t.failed = {}, None
        t.start()
        started = self.c.wait_until(lambda: self.runs_started() > before, 60, step=0.5)
        self.c.expect(started is True, f"the run never started; pycelld's log: {self.logs(POD)}")
        return t

    def state(self, name):
        rc, out, _ = self.podman("inspect", "-f", "{{.State.Status}} {{.State.ExitCode}} {{.State.Pid}}", name)
        status, code, pid = (out.split() + ["?", "?", "0"])[:3] if rc == 0 else ("gone", "?", "0")
        return status, code, int(pid) if pid.isdigit() else 0

    def wait_ready(self, name, spec, seconds=180):
        """The DaemonSet's readiness probe, as the kubelet runs it."""
        def ready():
            if self.state(name)[0] != "running":
                return "exited"
            return self.podman("exec", name, *spec["ready"])[0] == 0
        got = self.c.wait_until(ready, seconds, step=1)
        self.c.expect(got is True, f"pycelld never became ready ({self.state(name)}); its log: {self.logs(name)}")

    def pycelld_pid(self, name):
        """pycelld's pid on the guest: the child of the pod's tini."""
        tini = self.state(name)[2]
        table = self.c.host_processes()
        kids = [pid for pid, (ppid, comm, _) in table.items() if ppid == tini and comm == "pycelld"]
        self.c.expect(kids, f"no pycelld below the pod's init (pid {tini})")
        return kids[0]

    def pod_processes(self, base):
        """Guest processes running as any uid of the pod's user namespace."""
        return [f"{pid}({comm}, uid {uids[0]})" for pid, (_, comm, uids) in sorted(self.c.host_processes().items())
                if base <= uids[0] < base + 65536]

    def run_in_pod(self, code, timeout=120):
        rc, out, err = self.c.sh(["podman", "exec", "-i", "--user", CLIENT_UID, POD, "pycell", "run", "--json", "-"],
                                 input=code, timeout=timeout)
        try:
            return json.loads(out)
        except ValueError:
            raise self.c.CheckFailed(f"pycell run in the pod printed no JSON (exit {rc}): {out[-300:]!r} {err[-600:]!r}")

    # ----------------------------------------------------------- checks

    def check_load(self):
        rc, out, err = self.podman("load", "-q", "-i", f"{IMAGE}/pycell.oci.tar", timeout=600)
        self.c.expect(rc == 0, f"podman load exited {rc}: {err[-800:]}")
        loaded = out.strip().rsplit(" ", 1)[-1]
        self.podman("tag", loaded, REF, check=True)
        with open(f"{IMAGE}/config-digest") as f:
            want = f.read().strip()
        rc, got, _ = self.podman("image", "inspect", "-f", "{{.Id}}", REF)
        self.c.expect("sha256:" + got.strip() == want, f"image id {got.strip()} is not the built image's {want}")
        return f"{loaded}, id {want[:19]}"

    def check_privileges(self):
        """pycelld starts, passes its self-check, and has exactly what the
        DaemonSet declares: its pod's user namespace, the four capabilities,
        no_new_privs, a seccomp filter."""
        spec = pod()
        self.start(POD, spec)
        self.wait_ready(POD, spec)
        pid = self.pycelld_pid(POD)
        with open(f"/proc/{pid}/status") as f:
            status = dict(re.findall(r"^(\w+):\s+(.*)$", f.read(), re.M))
        with open(f"/proc/{pid}/uid_map") as f:
            uid_map = f.read().split()
        base = int(option(spec["run"], "--uidmap")[0].split(":")[1])
        caps = sum(1 << CAP_BITS[c] for c in option(spec["run"], "--cap-add"))
        problems = []
        if uid_map != ["0", str(base), "65536"]:
            problems.append(f"uid_map {uid_map}, not 0 {base} 65536")
        if int(status["Uid"].split()[0]) != base:
            problems.append(f"host uid {status['Uid']}, not {base}")
        for field in ("CapEff", "CapPrm", "CapBnd"):
            if int(status[field], 16) != caps:
                problems.append(f"{field} {status[field]}, not {caps:016x}")
        if status.get("NoNewPrivs") != "1" or status.get("Seccomp") != "2":
            problems.append(f"NoNewPrivs {status.get('NoNewPrivs')}, Seccomp {status.get('Seccomp')}")
        self.c.expect(not problems, "; ".join(problems))
        log = self.logs(POD)
        self.c.expect("self-check" in log, f"no self-check line in pycelld's log: {log}")
        return f"host uid {base}, CapEff {caps:016x}, no_new_privs, seccomp filter"

    def check_runs(self):
        """Runs through pycelld in the pod: every layer, their limits."""
        r = self.run_in_pod("import os\nprint(os.getuid())\n")
        layers = r.get("layers") or {}
        ok = r.get("status") == "ok" and (layers.get("cgroup") or {}).get("version") == "v2"
        self.c.expect(ok, f"a run in the pod: {self.c.brief(r)} layers {json.dumps(layers)}")
        self.c.expect(layers.get("no_new_privs") is True and layers.get("capabilities") == "none",
                      f"layers: {json.dumps(layers)}")
        self.c.expect((layers.get("landlock") or {}).get("status") == "fully_enforced", f"landlock: {layers}")
        hog = self.run_in_pod("x = 'x' * (1 << 30)\nprint(len(x))\n")
        self.c.expect(hog.get("status") == "oom", f"1 GiB under the default 512 MiB: {self.c.brief(hog)}")
        return f"sandbox uid {layers.get('sandbox_uid')}, {r.get('wall_ms', 0):.0f} ms; the memory hog: oom"

    def check_escape(self):
        # As the pod's root (an unprivileged uid on the guest), as they run
        # as root elsewhere; pycelld lets root in.
        def in_pod(env, argv):
            flags = [f"--env={k}={v}" for k, v in env.items()]
            return ["podman", "exec", "--user", "0", *flags, POD, *argv]

        def report(path):
            rc, out, _ = self.podman("exec", POD, "cat", path)
            return out if rc == 0 else None
        return self.c.escape_tests("daemon", ["probe_default", "hardening"], root="/escape", wrap=in_pod,
                                   read_report=report, label="image")

    def check_refusals(self):
        """Take away one declared privilege at a time: pycelld refuses to
        start and its log names what is missing; nothing of it is left."""
        wanted = {
            "masked-proc": "procMount",
            "read-only-cgroup": "Read-only file system",
            "runtime-seccomp": "seccomp",
        }
        said = []
        for variant, words in wanted.items():
            spec = pod(variant)
            name = f"pycelld-{variant}"
            self.start(name, spec)
            done = self.c.wait_until(lambda: self.state(name)[0] in ("exited", "stopped"), 120, step=1)
            status, code, _ = self.state(name)
            log = self.logs(name)
            self.podman("rm", "-f", "-v", name)
            self.c.expect(done is True and code not in ("0", "?"),
                          f"{variant}: pycelld did not refuse ({status}, exit {code}): {log}")
            self.c.expect(words in log, f"{variant}: its log does not say {words!r}: {log}")
            said.append(f"{variant}: {next((l for l in log.splitlines() if 'ERROR' in l), log.strip()[-160:])[-160:]}")
        for line in said:
            self.c.log(line)
        return f"{len(said)} weaker pods refused (their reasons below)"

    def check_drain(self):
        """`podman stop` (SIGTERM, then the grace period): the run in flight
        finishes, pycelld exits 0, nothing of the pod is left."""
        spec = pod()
        base = int(option(spec["run"], "--uidmap")[0].split(":")[1])
        ended_before = len(self.runs_ended())
        t = self.in_flight("import time\ntime.sleep(3)\nprint('done')\n")
        rc, _, err = self.podman("stop", "-t", str(spec["stop_timeout"]), POD, timeout=spec["stop_timeout"] + 30)
        t.join(60)
        status, code, _ = self.state(POD)
        self.c.expect(rc == 0 and code == "0", f"podman stop exited {rc} ({err[-300:]}), pycelld {status} {code}")
        # pycelld's word: the run finished, not stopped by the drain.
        ends = self.runs_ended()[ended_before:]
        self.c.expect([(e.get("status"), e.get("exit_code")) for e in ends] == [("ok", 0)],
                      f"the run in flight, as pycelld's audit log ends it: {ends}")
        # The client's: its result, unless the pod's end took it first.
        # This test's client is `podman exec`ed into pycelld's own
        # container, so it dies with the container's pid namespace once
        # pycelld has answered and exited; a real client (the gateway
        # container, any other pod) has a namespace of its own.
        r = t.result
        self.c.expect(t.failed or (r.get("status") == "ok" and r.get("stdout") == "done\n"),
                      f"the run in flight: {self.c.brief(r)}")
        left = self.c.wait_until(lambda: not self.pod_processes(base), 10) or self.pod_processes(base)
        self.c.expect(left is True, f"left after the drain: {left}")
        client = "its client got the result" if not t.failed else "its client in the pod went with the pod"
        return f"the run in flight finished ({client}); pycelld exited 0"

    def check_sigkill(self):
        """SIGKILL of pycelld in a pod with a run in flight: the pod ends
        (tini exits with it), every process and cgroup of it goes."""
        spec = pod()
        base = int(option(spec["run"], "--uidmap")[0].split(":")[1])
        self.podman("start", POD, check=True)
        self.wait_ready(POD, spec)
        self.in_flight("import time\ntime.sleep(60)\n")
        rc, cgroup, _ = self.podman("inspect", "-f", "{{.State.CgroupPath}}", POD)
        cgroup_dir = "/sys/fs/cgroup/" + cgroup.strip().lstrip("/")
        self.c.expect(rc == 0 and cgroup.strip() and os.path.isdir(cgroup_dir), f"no cgroup for the pod: {cgroup!r}")
        os.kill(self.pycelld_pid(POD), 9)
        gone = self.c.wait_until(lambda: self.state(POD)[0] in ("exited", "stopped"), 60, step=0.5)
        status, code, _ = self.state(POD)
        self.c.expect(gone is True, f"the pod did not end when pycelld was killed: {status}")
        left = self.c.wait_until(lambda: not self.pod_processes(base), 10) or self.pod_processes(base)
        self.c.expect(left is True, f"left after pycelld's SIGKILL: {left}")
        self.podman("rm", "-f", "-v", POD, check=True)
        self.c.expect(not os.path.exists(cgroup_dir), f"the pod's cgroup {cgroup_dir} is still there")
        return f"the pod ended (exit {code}) with its run; nothing left"


def checks(c):
    i = ImageChecks(c)
    return [("image-load", i.check_load), ("image-privileges", i.check_privileges), ("image-runs", i.check_runs),
            ("image-escape", i.check_escape), ("image-drain", i.check_drain), ("image-sigkill", i.check_sigkill),
            ("image-refusals", i.check_refusals)]
