"""An MCP server over stdio (newline-delimited JSON-RPC, standard library
only) whose one tool, `probe`, reports what its jail lets it reach: the
caller's home canary, an SSH agent's socket, the caller's environment, a
granted directory (read and write). Shipped as the test wheel
`pycell-probe-server` (tests/deps/make_wheels.py) for pycell mcp-server's
tests (tests/tests/jailed_servers.rs).

    pycell-probe-server --canary PATH --agent SOCKET --secret-reversed TXET [--dir DIR] [--file FILE]

Its second tool, `plant`, tries to leave in DIR (and on FILE) what a
caller must never find on the host after the server: set-id programs,
FIFOs, sockets, links out of the grant, modes open to everyone.

(the secret is given reversed, so that our own command line does not hold
the text we look for)
"""

import argparse
import json
import os
import socket
import sys


def attempt(fn):
    try:
        return {"ok": fn()}
    except Exception as e:  # noqa: BLE001 - the refusal is the answer
        return {"error": f"{type(e).__name__}: {e}"}


def read(path):
    with open(path) as f:
        return f.read()


def connect(path):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(2)
    s.connect(path)
    s.close()
    return "connected"


def seen_anywhere(text):
    """Where `text` shows: our environment, or any process's environ or
    command line we can read."""
    where = [k for k, v in os.environ.items() if text in v]
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        for name in ("environ", "cmdline"):
            try:
                with open(f"/proc/{pid}/{name}", "rb") as f:
                    if text.encode() in f.read():
                        where.append(f"/proc/{pid}/{name}")
            except OSError:
                pass
    return where


def write_in(d):
    path = os.path.join(d, "written-by-server.txt")
    with open(path, "w") as f:
        f.write("from the jail\n")
    return path


def plant_in(d, f):
    """Each attempt's outcome: what the jail allowed, or its error."""
    out = {}
    exe = os.path.join(d, "suid-python")
    with open(sys.executable, "rb") as src, open(exe, "wb") as dst:
        dst.write(src.read())
    out["chmod_4755"] = attempt(lambda: os.chmod(exe, 0o4755))
    out["chmod_2755"] = attempt(lambda: os.chmod(exe, 0o2755))
    out["open_06755"] = attempt(lambda: os.close(os.open(os.path.join(d, "created-setid"), os.O_CREAT | os.O_WRONLY, 0o6755)))
    out["mknod_04755"] = attempt(lambda: os.mknod(os.path.join(d, "mknod-setuid"), 0o104755))
    out["openat2"] = attempt(lambda: openat2(os.path.join(d, "via-openat2")))
    out["fifo"] = attempt(lambda: os.mkfifo(os.path.join(d, "a-fifo")))
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    out["socket"] = attempt(lambda: sock.bind(os.path.join(d, "a-socket")))
    out["symlink_out"] = attempt(lambda: os.symlink("/etc/shadow", os.path.join(d, "to-shadow")))
    out["symlink_up"] = attempt(lambda: os.symlink("../../../etc", os.path.join(d, "up-and-out")))
    out["symlink_in"] = attempt(lambda: os.symlink("suid-python", os.path.join(d, "link-inside")))
    open_dir = os.path.join(d, "open-dir")
    os.mkdir(open_dir)
    out["chmod_dir_2777"] = attempt(lambda: os.chmod(open_dir, 0o2777))
    out["chmod_dir_0777"] = attempt(lambda: os.chmod(open_dir, 0o777))
    writable = os.path.join(open_dir, "for-everyone.txt")
    with open(writable, "w") as w:
        w.write("anyone may change me\n")
    out["chmod_0666"] = attempt(lambda: os.chmod(writable, 0o666))
    if f:
        out["file_chmod_4777"] = attempt(lambda: os.chmod(f, 0o4777))
        out["file_chmod_0777"] = attempt(lambda: os.chmod(f, 0o777))
    return out


def openat2(path):
    """openat2(2) with O_CREAT and a set-uid mode, by number (x86_64)."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    how = (ctypes.c_uint64 * 3)(os.O_CREAT | os.O_WRONLY, 0o4755, 0)
    fd = libc.syscall(437, -100, path.encode(), ctypes.byref(how), ctypes.sizeof(how))
    if fd < 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))
    os.close(fd)
    return "created"


def probe(args):
    out = {
        "uid": os.getuid(),
        "home_canary": attempt(lambda: read(args.canary)),
        "home_listing": attempt(lambda: os.listdir(os.path.dirname(args.canary))),
        "ssh_agent": attempt(lambda: connect(args.agent)),
        "ssh_auth_sock": os.environ.get("SSH_AUTH_SOCK"),
        "secret_seen": seen_anywhere(args.secret_reversed[::-1]),
        "granted_token": os.environ.get("GRANTED_TOKEN"),
        "env_names": sorted(os.environ),
    }
    if args.dir:
        out["dir_listing"] = attempt(lambda: sorted(os.listdir(args.dir)))
        out["dir_write"] = attempt(lambda: write_in(args.dir))
    return out


def answer(msg, args):
    method = msg.get("method")
    if method == "initialize":
        return {
            "protocolVersion": msg["params"]["protocolVersion"],
            "capabilities": {"tools": {}},
            "serverInfo": {"name": "pycell-probe-server", "version": "1.0"},
        }
    if method == "tools/list":
        schema = {"type": "object", "properties": {}}
        return {
            "tools": [
                {"name": "probe", "description": "What the jail lets me reach.", "inputSchema": schema},
                {"name": "plant", "description": "Leave what must not stay in the grant.", "inputSchema": schema},
            ]
        }
    if method == "tools/call":
        if msg["params"]["name"] == "plant":
            text = json.dumps(plant_in(args.dir, args.file))
        else:
            text = json.dumps(probe(args))
        return {"content": [{"type": "text", "text": text}], "isError": False}
    if method == "ping":
        return {}
    return None


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--canary", required=True)
    p.add_argument("--agent", required=True)
    p.add_argument("--secret-reversed", required=True)
    p.add_argument("--dir")
    p.add_argument("--file")
    args = p.parse_args()
    for line in sys.stdin:
        msg = json.loads(line)
        if "id" not in msg:
            continue
        result = answer(msg, args)
        if result is None:
            reply = {"jsonrpc": "2.0", "id": msg["id"], "error": {"code": -32601, "message": "no such method"}}
        else:
            reply = {"jsonrpc": "2.0", "id": msg["id"], "result": result}
        sys.stdout.write(json.dumps(reply) + "\n")
        sys.stdout.flush()
    return 0
