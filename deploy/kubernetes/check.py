"""Check the Kubernetes manifests offline (tests/tests/deploy.rs runs it):

- each validates, strictly, against the API schemas of the two newest
  Kubernetes minor versions the kubernetes-validate package ships (and a
  manifest with a mistake does not: the validator is really looking);
- they agree with each other and with pycell: the node pods' capabilities
  are the systemd unit's bounding set, the gateway's uid is a front end of
  pycelld's config, sandbox uids fit the pod's user namespace, selectors
  and names match, the seccomp profile refuses what the unit refuses and
  allows what a jail needs;
- kustomization.yaml lists every manifest;
- podman.py (the DaemonSet's pycelld container as podman options, which the
  Debian VM test runs) gives exactly the declared privileges and refuses
  what it cannot reproduce.

Prints one JSON object: {"versions": [...], "problems": [...],
"pycelld_toml": "..."} (pycelld's config, which the Rust test parses with
pycelld's own parser). Exit status 0 even with problems.
"""
import copy
import glob
import json
import os
import re
import subprocess
import sys
import tempfile
import tomllib

import kubernetes_validate
import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
ROOT = os.path.join(HERE, "..", "..")
problems = []


def problem(m):
    problems.append(m)


def manifests():
    files = sorted(glob.glob(os.path.join(HERE, "*.yaml")) + glob.glob(os.path.join(HERE, "*", "*.yaml")))
    return [f for f in files if not f.endswith("kustomization.yaml")]


def newest_versions(n=2):
    schemas = os.path.join(os.path.dirname(kubernetes_validate.__file__), "kubernetes-json-schema")
    found = set()
    for d in os.listdir(schemas):
        m = re.match(r"v(\d+)\.(\d+)\.(\d+)-local-strict$", d)
        if m:
            found.add(tuple(int(x) for x in m.groups()))
    minors = {}
    for v in sorted(found):
        minors[v[:2]] = v
    return [".".join(map(str, minors[k])) for k in sorted(minors)[-n:]]


def validate(path, version):
    r = subprocess.run([sys.executable, "-m", "kubernetes_validate", "--strict", "--quiet", "-k", version, path],
                       capture_output=True, text=True)
    return r.returncode == 0, (r.stdout + r.stderr).strip()


def docs():
    out = {}
    for f in manifests():
        for d in yaml.safe_load_all(open(f)):
            out[(d["kind"], d["metadata"]["name"])] = d
    return out


def container(pod, name):
    return next(c for c in pod["spec"]["containers"] if c["name"] == name)


def flag(cmd, name):
    return cmd[cmd.index(name) + 1] if name in cmd else None


def check_nodes(d):
    ds = d[("DaemonSet", "pycelld")]
    pod = ds["spec"]["template"]
    spec = pod["spec"]
    if spec.get("hostUsers") is not False:
        problem("the node pods must have hostUsers: false")
    for host in ("hostPID", "hostNetwork", "hostIPC"):
        if spec.get(host):
            problem(f"the node pods must not use {host}")
    if any("hostPath" in v for v in spec.get("volumes", [])):
        problem("the node pods must not mount host paths")
    p = container(pod, "pycelld")["securityContext"]
    unit = open(os.path.join(ROOT, "packaging", "systemd", "pycelld.service")).read()
    bounding = re.search(r"^CapabilityBoundingSet=(.*)$", unit, re.M).group(1).split()
    if sorted(c.removeprefix("CAP_") for c in bounding) != sorted(p["capabilities"]["add"]):
        problem(f"pycelld's capabilities {p['capabilities']['add']} are not the unit's bounding set {bounding}")
    if p["capabilities"].get("drop") != ["ALL"] or p.get("privileged"):
        problem("pycelld must drop every other capability and not be privileged")
    if p.get("procMount") != "Unmasked" or p.get("allowPrivilegeEscalation") is not False:
        problem("pycelld needs procMount: Unmasked and allowPrivilegeEscalation: false")
    prof = p["seccompProfile"]
    if prof.get("type") != "Localhost" or not os.path.isfile(os.path.join(HERE, "seccomp", os.path.basename(prof["localhostProfile"]))):
        problem(f"pycelld's seccomp profile {prof} is not one of deploy/kubernetes/seccomp")
    cfg_text = d[("ConfigMap", "pycelld")]["data"]["pycelld.toml"]
    cfg = tomllib.loads(cfg_text)
    g = container(pod, "gateway")
    uid = g["securityContext"]["runAsUser"]
    if uid not in cfg.get("front_end_uids", []) or uid not in cfg.get("allowed_uids", []):
        problem(f"the gateway's uid {uid} is not in pycelld's front_end_uids and allowed_uids")
    lo, hi = (int(x) for x in cfg["uid_range"].split("-"))
    if not (0 < lo <= hi < 65536) or lo <= uid <= hi:
        problem(f"uid_range {cfg['uid_range']} must fit the pod's 65536 uids and leave out the gateway's {uid}")
    if g["securityContext"].get("runAsNonRoot") is not True:
        problem("the gateway must run as non-root")
    svc = d[("Service", "pycell-nodes")]
    if svc["spec"].get("clusterIP") != "None" or svc["spec"]["selector"].items() - pod["metadata"]["labels"].items():
        problem("the nodes' Service must be headless and select the node pods")
    return cfg_text, svc


def check_front(d, svc):
    dep = d[("Deployment", "pycell-front")]
    pod = dep["spec"]["template"]
    cmd = container(pod, "front")["command"]
    want = f"{svc['metadata']['name']}.{svc['metadata']['namespace']}.svc.cluster.local:{svc['spec']['ports'][0]['port']}"
    if flag(cmd, "--nodes-dns") != want:
        problem(f"the front end's --nodes-dns {flag(cmd, '--nodes-dns')} is not the nodes' Service {want}")
    if not pod["spec"]["securityContext"].get("runAsNonRoot"):
        problem("the front end must run as non-root")
    np = d[("NetworkPolicy", "pycelld-gateway")]
    peer = np["spec"]["ingress"][0]["from"][0]
    if peer["podSelector"]["matchLabels"].items() - pod["metadata"]["labels"].items():
        problem("the gateways' NetworkPolicy does not let the front end's pods in")
    if peer["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"] != dep["metadata"]["namespace"]:
        problem("the gateways' NetworkPolicy names another namespace than the front end's")


def check_seccomp():
    prof = json.load(open(os.path.join(HERE, "seccomp", "pycelld.json")))
    denied = {n for rule in prof["syscalls"] if rule["action"] != "SCMP_ACT_ALLOW" for n in rule["names"]}
    if prof["defaultAction"] != "SCMP_ACT_ALLOW":
        problem("the seccomp profile must allow by default and refuse the unit's groups")
    for must in ["kexec_load", "init_module", "finit_module", "delete_module", "reboot", "swapon", "settimeofday",
                 "clock_settime", "ptrace", "perf_event_open", "iopl", "ioperm"]:
        if must not in denied:
            problem(f"the seccomp profile lets {must} through")
    for needed in ["unshare", "clone", "clone3", "setns", "mount", "umount2", "pivot_root", "mount_setattr",
                   "open_tree", "move_mount", "seccomp", "landlock_create_ruleset", "landlock_restrict_self"]:
        if needed in denied:
            problem(f"the seccomp profile refuses {needed}, which every jail needs")


def check_kustomization():
    k = yaml.safe_load(open(os.path.join(HERE, "kustomization.yaml")))
    listed = sorted(os.path.normpath(os.path.join(HERE, r)) for r in k["resources"])
    if listed != [os.path.normpath(f) for f in manifests()]:
        problem(f"kustomization.yaml lists {k['resources']}, not every manifest")


def check_podman():
    import podman
    template = docs()[("DaemonSet", "pycelld")]["spec"]["template"]
    pod = template["spec"]
    sc = container(template, "pycelld")["securityContext"]
    host = podman.Host(tempfile.mkdtemp(), "/at", "/seccomp", 65536 * 4)
    run = podman.translate(pod, "pycelld", podman.load_configmaps(os.path.join(HERE, "nodes")), host)["run"]
    opts = [run[i + 1] for i, a in enumerate(run[:-1]) if a == "--security-opt"]
    adds = [run[i + 1] for i, a in enumerate(run[:-1]) if a == "--cap-add"]
    want = {
        "capabilities": adds == sc["capabilities"]["add"] and run[run.index("--cap-drop") + 1] == "all",
        "user namespace": run[run.index("--uidmap") + 1] == f"0:{65536 * 4}:65536",
        "procMount": "unmask=/proc/*" in opts,
        "writable cgroup": "unmask=/sys/fs/cgroup" in opts,
        "seccomp": f"seccomp=/seccomp/{sc['seccompProfile']['localhostProfile']}" in opts,
        "no_new_privs": "no-new-privileges" in opts,
        "read-only root": "--read-only" in run and "--read-only-tmpfs=false" in run,
        "config": "/at/configmap-pycelld/pycelld.toml:/etc/pycell/pycelld.toml:ro" in run,
    }
    for what, ok in want.items():
        if not ok:
            problem(f"podman.py: the pycelld container's {what} is not as declared: {run}")
    looser = [
        ("a hostPath volume", lambda p, c: p["volumes"].append({"name": "run", "hostPath": {"path": "/run"}})),
        ("an unknown securityContext field", lambda p, c: c["securityContext"].update(seLinuxOptions={})),
        ("capabilities not dropped", lambda p, c: c["securityContext"]["capabilities"].pop("drop")),
        ("hostPID", lambda p, c: p.update(hostPID=True)),
        ("a secret", lambda p, c: c["volumeMounts"].append({"name": "s", "mountPath": "/s"})
         or p["volumes"].append({"name": "s", "secret": {"secretName": "s"}})),
    ]
    for what, change in looser:
        spec = copy.deepcopy(template)
        change(spec["spec"], container(spec, "pycelld"))
        try:
            podman.translate(spec["spec"], "pycelld", {"pycelld": {"pycelld.toml": ""}}, host)
            problem(f"podman.py translated a pod with {what} instead of refusing it")
        except podman.Untranslatable:
            pass


def main():
    versions = newest_versions()
    for v in versions:
        for f in manifests():
            ok, out = validate(f, v)
            if not ok:
                problem(f"{os.path.relpath(f, HERE)} does not validate against Kubernetes {v}: {out}")
        broken = copy.deepcopy(docs()[("DaemonSet", "pycelld")])
        broken["spec"]["template"]["spec"]["containers"][0]["securityContext"]["procMnt"] = "Unmasked"
        with tempfile.NamedTemporaryFile("w", suffix=".yaml") as t:
            yaml.safe_dump(broken, t)
            t.flush()
            if validate(t.name, v)[0]:
                problem(f"a DaemonSet with a misspelt field validates against {v}: the validator is not looking")
    d = docs()
    cfg_text, svc = check_nodes(d)
    check_front(d, svc)
    check_seccomp()
    check_kustomization()
    check_podman()
    print(json.dumps({"versions": versions, "problems": problems, "pycelld_toml": cfg_text}))


if __name__ == "__main__":
    main()
