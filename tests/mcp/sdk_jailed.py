"""Drive `pycell mcp-server ...` (a third-party MCP server, jailed) with the
official MCP Python SDK, as an MCP host does, and report what happened as
one JSON object on stdout (tests/tests/jailed_servers.rs makes the
assertions).

    .cache/tools/bin/python tests/mcp/sdk_jailed.py --pycell PATH \\
        --args '["mcp-server", "mcp-server-time"]' \\
        --calls '[["get_current_time", {"timezone": "Etc/UTC"}]]' [--scan-for TEXT] [--errlog FILE]

The server gets this process's whole environment (the SDK would pass only
a few variables). Reported: the handshake, the tool names, each call's
error flag and text, the time to the first answer, and with --scan-for,
the host processes whose command line held TEXT while the server ran.
With --errlog, pycell's stderr goes to FILE instead of ours.
"""

import argparse
import json
import os
import sys
import time
import traceback

import anyio
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.shared.exceptions import MCPError


def cmdlines_with(text):
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if text.encode() in f.read():
                    found.append(int(pid))
        except OSError:
            pass
    return [p for p in found if p != os.getpid()]


async def session(args, report):
    params = StdioServerParameters(command=args.pycell, args=json.loads(args.args), env=dict(os.environ))
    t0 = time.monotonic()
    errlog = open(args.errlog, "w") if args.errlog else sys.stderr  # noqa: SIM115 - open for the session
    async with stdio_client(params, errlog=errlog) as (read, write):
        async with ClientSession(read, write) as s:
            init = await s.initialize()
            report["initialize"] = {"server_name": init.server_info.name, "elapsed_s": time.monotonic() - t0}
            report["tools"] = [t.name for t in (await s.list_tools()).tools]
            report["calls"] = []
            for name, arguments in json.loads(args.calls):
                c0 = time.monotonic()
                try:
                    r = await s.call_tool(name, arguments)
                    text = "".join(getattr(c, "text", "") for c in r.content)
                    report["calls"].append({"is_error": r.is_error, "text": text[:20000], "elapsed_s": time.monotonic() - c0})
                except MCPError as e:
                    report["calls"].append({"protocol_error": e.message})
            if args.scan_for:
                report["cmdlines_with_text"] = cmdlines_with(args.scan_for)
    report["closed_after_s"] = time.monotonic() - t0


async def main():
    p = argparse.ArgumentParser()
    p.add_argument("--pycell", required=True)
    p.add_argument("--args", required=True)
    p.add_argument("--calls", default="[]")
    p.add_argument("--scan-for")
    p.add_argument("--errlog")
    p.add_argument("--timeout", type=float, default=300)
    args = p.parse_args()
    report = {}
    try:
        with anyio.fail_after(args.timeout):
            await session(args, report)
        report["completed"] = True
    except BaseException as e:  # noqa: BLE001 - reported for the Rust test
        report["exception"] = f"{type(e).__name__}: {e}"
        report["traceback"] = traceback.format_exc()[-3000:]
    print(json.dumps(report))


if __name__ == "__main__":
    anyio.run(main)
    sys.exit(0)
