"""An MCP server over stdio (newline-delimited JSON-RPC, standard library
only) whose one tool, `probe`, reports what its jail lets it reach: the
caller's home canary, an SSH agent's socket, the caller's environment, a
granted directory (read and write). Shipped as the test wheel
`pycell-probe-server` (tests/deps/make_wheels.py) for pycell mcp-server's
tests (tests/tests/jailed_servers.rs).

    pycell-probe-server --canary PATH --agent SOCKET --secret-reversed TXET [--dir DIR]

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
        return {"tools": [{"name": "probe", "description": "What the jail lets me reach.", "inputSchema": schema}]}
    if method == "tools/call":
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
