#!/usr/bin/python3
"""Turn a pycell jail spec into a bubblewrap command with the same isolation.

    /usr/bin/python3 bench/bwrap_args.py SPEC.json WORKDIR [ARGV...]

Prints the bwrap command line, one NUL-terminated word per argument, for
`mapfile -d ''`. ARGV, if given, replaces the spec's argv. WORKDIR receives
the files bwrap cannot create itself (the spec's workspace files, a synthetic
/etc); they are bound read-only, which is close enough for a startup benchmark.

What bubblewrap does not get, and pycell does: a cgroup with limits, rlimits,
Landlock and seccomp. The comparison therefore slightly favours bubblewrap.
Standard library only.
"""

import json
import os
import sys

WORKSPACE = "/workspace"
JAIL_UID = 1000
JAIL_GID = 1000


def bwrap_args(spec, workdir, argv):
    args = [
        "bwrap",
        "--unshare-user", "--unshare-pid", "--unshare-net", "--unshare-ipc",
        "--unshare-uts", "--unshare-cgroup",
        "--uid", str(JAIL_UID), "--gid", str(JAIL_GID),
        "--hostname", "pycell",
        "--die-with-parent", "--new-session", "--cap-drop", "ALL",
    ]
    # The spec's read-only binds; a host symlink (e.g. /bin -> usr/bin on a
    # merged-/usr system) is recreated as the same symlink, as the jailer does.
    for m in spec["mounts"]:
        source, target = m["source"], m["target"]
        if os.path.islink(source):
            args += ["--symlink", os.readlink(source), target]
        else:
            args += ["--ro-bind", source, target]
    args += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", "--tmpfs", WORKSPACE]

    etc = os.path.join(workdir, "etc")
    os.makedirs(etc, exist_ok=True)
    for name, text in {
        "passwd": f"root:x:0:0::/:/usr/sbin/nologin\nsandbox:x:{JAIL_UID}:{JAIL_GID}::{WORKSPACE}:/usr/sbin/nologin\n",
        "group": f"root:x:0:\nsandbox:x:{JAIL_GID}:\n",
        "hosts": "127.0.0.1 localhost pycell\n::1 localhost pycell\n",
    }.items():
        with open(os.path.join(etc, name), "w") as f:
            f.write(text)
    args += ["--ro-bind", etc, "/etc"]

    files = os.path.join(workdir, "workspace")
    os.makedirs(files, exist_ok=True)
    for f in spec["files"]:
        path = os.path.join(files, f["name"])
        with open(path, "w") as out:
            out.write(f["contents"])
        args += ["--ro-bind", path, f"{WORKSPACE}/{f['name']}"]

    args += ["--chdir", WORKSPACE, "--clearenv"]
    for key, value in spec["env"]:
        args += ["--setenv", key, value]
    return args + list(argv or spec["argv"])


def main(argv):
    if len(argv) < 3:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    with open(argv[1]) as f:
        spec = json.load(f)
    for word in bwrap_args(spec, argv[2], argv[3:]):
        sys.stdout.write(word + "\0")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
