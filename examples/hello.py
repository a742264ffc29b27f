"""Hello from inside pycell: a look around the sandbox.

    sudo ./scripts/pycell run examples/hello.py

Every check here is harmless: it only reads, or writes (and removes) one file
in its working directory.
Run it with plain `python3 examples/hello.py` to see the difference.
"""

import errno
import os
import platform
import socket
import sys


def attempt(action):
    """Run action(); return None if it worked, else a short reason."""
    try:
        action()
    except OSError as err:
        return f"{type(err).__name__}: {err.strerror or err}"
    return None


def read_shadow():
    with open("/etc/shadow", "rb") as f:
        f.read(1)


def reach_internet():
    # A name lookup and a TCP connect to a host on the internet: the usual way
    # out. example.net is reserved for examples (RFC 2606) and resolves, so
    # outside a sandbox this connects.
    socket.create_connection(("example.net", 443), timeout=3).close()


def usr_writable():
    # Asks the mount table instead of writing: outside a sandbox, as root,
    # a write to /usr would succeed and leave a mess.
    if os.statvfs("/usr").f_flag & os.ST_RDONLY:
        raise OSError(errno.EROFS, os.strerror(errno.EROFS))


def write_workspace():
    with open("hello.txt", "w") as f:
        f.write("hello\n")
    os.remove("hello.txt")


def main():
    print("Hello from inside pycell!")
    print()
    print(f"  python      {platform.python_version()} ({sys.executable})")
    print(f"  user        uid={os.getuid()} gid={os.getgid()}")
    print(f"  hostname    {socket.gethostname()}")
    print(f"  cwd         {os.getcwd()}")
    pids = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
    print(f"  processes   {len(pids)} visible, I am pid {os.getpid()}")
    interfaces = [name for _, name in socket.if_nameindex()]
    print(f"  interfaces  {', '.join(interfaces) or 'none'}")
    print()

    checks = [
        ("read /etc/shadow", read_shadow, False),
        ("reach example.net:443", reach_internet, False),
        ("write to /usr", usr_writable, False),
        ("write to the workspace", write_workspace, True),
    ]
    surprises = 0
    for label, action, should_work in checks:
        why_not = attempt(action)
        if why_not is None:
            verdict = "yes"
        else:
            verdict = f"no ({why_not})"
        if (why_not is None) != should_work:
            surprises += 1
            verdict += "  <-- not sandboxed?"
        print(f"  {label + '?':<26}{verdict}")

    print()
    if surprises:
        print(f"{surprises} check(s) look unsandboxed: is this running under pycell?")
        return 1
    print("All good: this code can compute, but it cannot look around or get out.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
