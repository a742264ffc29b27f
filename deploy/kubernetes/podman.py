"""The `podman run` arguments that give one container of a pod template
exactly the privileges the manifest declares, for trying a node pod on one
machine (scripts/vm-test runs pycell's image this way in its Debian guest).

    python3 deploy/kubernetes/podman.py nodes/daemonset.yaml pycelld \\
        --files DIR [--mounted-at PATH] [--seccomp-root DIR] [--uid-base N]

Prints one JSON object: {"run": [podman run options...], "args": [...] (the
container's args, after the image), "ready": [the readiness probe's exec
command], "stop_timeout": seconds}. ConfigMap volumes the container mounts
are written under DIR (from the manifests next to the DaemonSet) and bound
read-only from PATH (DIR by default: where the machine running podman sees
DIR).

Fail closed: a field this script does not know how to reproduce exactly (a
secret, a host path, an env var from a field ref, a pod-level security
context...) is an error naming it, never left out: a pod run looser or
tighter than declared would prove nothing. What it leaves to the cluster by
design: scheduling (nodeSelector, tolerations, requests) and the pod's
network (podman runs it with none: jails make their own).
"""
import argparse
import collections
import glob
import json
import os
import sys

import yaml

# Paths a runtime masks or makes read-only by default that Kubernetes'
# `procMount: Unmasked` leaves whole (the CRI clears both lists; podman's
# unmask= takes globs). /sys/fs/cgroup is the RuntimeClass's, below.
UNMASKED_PROC = ["/proc/*", "/sys/firmware", "/sys/fs/selinux", "/sys/dev/block", "/sys/devices/virtual/powercap"]
# RuntimeClasses whose handler gives the container a writable cgroup v2
# (deploy/kubernetes/nodes/runtimeclass.yaml).
WRITABLE_CGROUP_CLASSES = {"pycell"}
# Fields that only place the pod; they change nothing inside it.
SCHEDULING = {"nodeSelector", "tolerations", "affinity", "priorityClassName", "topologySpreadConstraints"}


# Where the pod's outside lives on the machine running podman: ConfigMap
# files are written to `files` and seen there at `mounted_at`; Localhost
# seccomp profiles are relative to `seccomp_root`; the pod's user namespace
# starts at host uid `uid_base`.
Host = collections.namedtuple("Host", "files mounted_at seccomp_root uid_base")


class Untranslatable(Exception):
    pass


def only(where, obj, known):
    unknown = sorted(set(obj or {}) - set(known))
    if unknown:
        raise Untranslatable(f"{where}: {', '.join(unknown)} cannot be reproduced under podman by this script; "
                             "refusing to run the pod looser or tighter than declared")


def size(quantity):
    """A Kubernetes memory quantity ("16Gi", "512Mi") in podman's units."""
    units = {"Ki": "k", "Mi": "m", "Gi": "g", "Ti": "t"}
    q = str(quantity)
    for k, v in units.items():
        if q.endswith(k):
            return q[: -len(k)] + v
    if q.isdigit():
        return q
    raise Untranslatable(f"memory quantity {q!r}: only plain bytes and Ki/Mi/Gi/Ti are translated")


def security(ctx, pod, host, out):
    only("securityContext", ctx, {"runAsUser", "runAsGroup", "runAsNonRoot", "allowPrivilegeEscalation",
                                   "readOnlyRootFilesystem", "procMount", "capabilities", "seccompProfile",
                                   "appArmorProfile", "privileged"})
    user, group = ctx.get("runAsUser"), ctx.get("runAsGroup")
    if user is None:
        raise Untranslatable("securityContext.runAsUser: say which user (the image's default is not a declaration)")
    if ctx.get("runAsNonRoot") and user == 0:
        raise Untranslatable("securityContext: runAsNonRoot with runAsUser 0 would not start")
    out += ["--user", f"{user}:{group if group is not None else user}"]
    if ctx.get("privileged"):
        out += ["--privileged"]
    if ctx.get("allowPrivilegeEscalation") is False:
        out += ["--security-opt", "no-new-privileges"]
    if ctx.get("readOnlyRootFilesystem"):
        # Without podman's own tmpfs on /run, /tmp and /var/tmp: only the
        # declared volumes are writable.
        out += ["--read-only", "--read-only-tmpfs=false"]
    caps = ctx.get("capabilities") or {}
    only("securityContext.capabilities", caps, {"drop", "add"})
    if caps.get("drop") != ["ALL"]:
        raise Untranslatable("securityContext.capabilities.drop must be [ALL]: runtimes' default sets differ")
    out += ["--cap-drop", "all"] + [a for c in caps.get("add", []) for a in ("--cap-add", c)]
    unmask = []
    if ctx.get("procMount", "Default") == "Unmasked":
        if pod.get("hostUsers", True):
            raise Untranslatable("procMount: Unmasked needs hostUsers: false")
        unmask += UNMASKED_PROC
    if pod.get("runtimeClassName") in WRITABLE_CGROUP_CLASSES:
        unmask.append("/sys/fs/cgroup")
    elif pod.get("runtimeClassName"):
        raise Untranslatable(f"runtimeClassName {pod['runtimeClassName']!r}: unknown handler")
    # One option per path: podman makes the cgroup mount writable only for
    # an unmask entry that is exactly /sys/fs/cgroup.
    out += [a for path in unmask for a in ("--security-opt", f"unmask={path}")]
    out += seccomp(ctx.get("seccompProfile") or {"type": "RuntimeDefault"}, host)
    apparmor = (ctx.get("appArmorProfile") or {"type": "RuntimeDefault"})["type"]
    if apparmor == "Unconfined":
        out += ["--security-opt", "apparmor=unconfined"]
    elif apparmor != "RuntimeDefault":
        raise Untranslatable(f"appArmorProfile {apparmor}: only RuntimeDefault and Unconfined are translated")


def seccomp(profile, host):
    kind = profile["type"]
    if kind == "RuntimeDefault":
        return []
    if kind == "Unconfined":
        return ["--security-opt", "seccomp=unconfined"]
    if kind == "Localhost":
        return ["--security-opt", f"seccomp={os.path.join(host.seccomp_root, profile['localhostProfile'])}"]
    raise Untranslatable(f"seccompProfile type {kind!r}")


def volumes(ctr, pod, configmaps, host, out):
    declared = {v["name"]: v for v in pod.get("volumes", [])}
    for m in ctr.get("volumeMounts", []):
        only(f"volumeMounts[{m['name']}]", m, {"name", "mountPath", "subPath", "readOnly"})
        vol = declared[m["name"]]
        dest = m["mountPath"]
        if "emptyDir" in vol:
            e = vol["emptyDir"] or {}
            if e.get("medium") == "Memory":
                opts = f"type=tmpfs,destination={dest},tmpfs-mode=0777"
                if "sizeLimit" in e:
                    opts += f",tmpfs-size={size(e['sizeLimit'])}"
            else:
                # A directory on the node's disk, mode 0777 as the kubelet
                # makes it; removed with the container (podman rm -v).
                opts = f"type=volume,destination={dest}"
            out += ["--mount", opts]
        elif "configMap" in vol:
            data = configmaps[vol["configMap"]["name"]]
            keys = [m["subPath"]] if "subPath" in m else sorted(data)
            dirname = os.path.join(host.files, "configmap-" + vol["configMap"]["name"])
            os.makedirs(dirname, exist_ok=True)
            for key in keys:
                with open(os.path.join(dirname, key), "w") as f:
                    f.write(data[key])
            seen = os.path.join(host.mounted_at, "configmap-" + vol["configMap"]["name"])
            source = os.path.join(seen, m["subPath"]) if "subPath" in m else seen
            out += ["--volume", f"{source}:{dest}:ro" if m.get("readOnly") else f"{source}:{dest}"]
        else:
            raise Untranslatable(f"volume {m['name']}: only emptyDir and configMap volumes are translated")


def translate(pod, name, configmaps, host):
    """The podman options for container `name` of pod spec `pod`."""
    only("pod spec", pod, SCHEDULING | {"containers", "volumes", "runtimeClassName", "hostUsers",
                                        "automountServiceAccountToken", "enableServiceLinks",
                                        "terminationGracePeriodSeconds", "hostPID", "hostNetwork", "hostIPC"})
    for host_ns in ("hostPID", "hostNetwork", "hostIPC"):
        if pod.get(host_ns):
            raise Untranslatable(f"{host_ns}: true is not translated")
    if pod.get("automountServiceAccountToken", True):
        raise Untranslatable("automountServiceAccountToken must be false: there is no API server to mount a token of")
    [ctr] = [c for c in pod["containers"] if c["name"] == name] or [None]
    if ctr is None:
        raise Untranslatable(f"no container {name!r} in the pod")
    only(f"container {name}", ctr, {"name", "image", "command", "args", "env", "securityContext", "resources",
                                    "readinessProbe", "livenessProbe", "volumeMounts", "ports", "workingDir"})
    out = ["--network", "none"]
    if pod.get("hostUsers", True) is False:
        # The pod's own user namespace: 65536 ids at an unprivileged base,
        # as the kubelet allocates them.
        out += ["--uidmap", f"0:{host.uid_base}:65536", "--gidmap", f"0:{host.uid_base}:65536"]
    security(ctr.get("securityContext") or {}, pod, host, out)
    limits = (ctr.get("resources") or {}).get("limits") or {}
    only("resources.limits", limits, {"memory", "cpu"})
    if "memory" in limits:
        out += ["--memory", size(limits["memory"])]
    if "cpu" in limits:
        out += ["--cpus", str(limits["cpu"])]
    for e in ctr.get("env", []):
        only(f"env[{e['name']}]", e, {"name", "value"})
        out += ["--env", f"{e['name']}={e['value']}"]
    if "workingDir" in ctr:
        out += ["--workdir", ctr["workingDir"]]
    volumes(ctr, pod, configmaps, host, out)
    if "command" in ctr:
        out += ["--entrypoint", json.dumps(ctr["command"])]
    probe = (ctr.get("readinessProbe") or {}).get("exec", {}).get("command")
    return {"run": out, "args": ctr.get("args", []), "ready": probe,
            "stop_timeout": pod.get("terminationGracePeriodSeconds", 30)}


def load_configmaps(directory):
    found = {}
    for path in glob.glob(os.path.join(directory, "*.yaml")):
        for doc in yaml.safe_load_all(open(path)):
            if doc and doc.get("kind") == "ConfigMap":
                found[doc["metadata"]["name"]] = doc.get("data", {})
    return found


def pod_template(path):
    for doc in yaml.safe_load_all(open(path)):
        if doc and doc.get("kind") in ("DaemonSet", "Deployment", "StatefulSet"):
            return doc["spec"]["template"]["spec"]
    raise Untranslatable(f"{path}: no DaemonSet, Deployment or StatefulSet")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("manifest")
    p.add_argument("container")
    p.add_argument("--files", required=True, help="where to write the ConfigMap files the container mounts")
    p.add_argument("--mounted-at", help="where the podman machine sees --files (default: the same path)")
    p.add_argument("--seccomp-root", default="/var/lib/kubelet/seccomp",
                   help="the kubelet's seccomp directory, which Localhost profiles are relative to "
                        "(deploy/kubernetes/seccomp/pycelld.json goes in as pycell/pycelld.json)")
    p.add_argument("--uid-base", type=int, default=65536 * 4, help="first host uid of the pod's user namespace")
    a = p.parse_args()
    manifest = os.path.abspath(a.manifest)
    host = Host(a.files, a.mounted_at or a.files, a.seccomp_root, a.uid_base)
    try:
        pod = pod_template(manifest)
        out = translate(pod, a.container, load_configmaps(os.path.dirname(manifest)), host)
    except Untranslatable as e:
        sys.exit(f"podman.py: {a.manifest}: {e}")
    json.dump(out, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()
