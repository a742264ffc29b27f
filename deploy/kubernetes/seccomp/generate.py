"""Write pycelld.json: the Localhost seccomp profile of the pycelld
container. It allows every system call but those the pycelld systemd unit
refuses (its SystemCallFilter=~ groups, expanded by this host's
systemd-analyze), so that the container may make the namespaces, mounts
and pivot_root each jail needs, which a runtime's default profile refuses.

    python3 deploy/kubernetes/seccomp/generate.py   # on a host with systemd
"""
import json
import os
import re
import subprocess

HERE = os.path.dirname(os.path.abspath(__file__))
UNIT = os.path.join(HERE, "..", "..", "..", "packaging", "systemd", "pycelld.service")


def groups():
    text = open(UNIT).read()
    line = re.search(r"^SystemCallFilter=~(.*)$", text, re.M).group(1)
    return line.split()


def expand(group, names):
    out = subprocess.run(["systemd-analyze", "syscall-filter", group], capture_output=True, text=True, check=True).stdout
    for line in out.splitlines()[1:]:
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("@"):
            expand(line, names)
        else:
            names.add(line)


def main():
    names = set()
    for g in groups():
        expand(g, names)
    profile = {
        "defaultAction": "SCMP_ACT_ALLOW",
        "architectures": ["SCMP_ARCH_X86_64", "SCMP_ARCH_X86", "SCMP_ARCH_X32"],
        "syscalls": [{"names": sorted(names), "action": "SCMP_ACT_ERRNO", "errnoRet": 1}],
    }
    with open(os.path.join(HERE, "pycelld.json"), "w") as f:
        f.write(json.dumps(profile, indent=2) + "\n")


if __name__ == "__main__":
    main()
