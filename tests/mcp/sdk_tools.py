"""Drive `pycell mcp --tool-servers FILE` (code mode) with the official MCP
Python SDK and report what happened (one JSON object on stdout;
tests/tests/tool_calls.rs makes the assertions).

    .cache/tools/bin/python tests/mcp/sdk_tools.py --pycell target/debug/pycell --servers FILE [--socket SOCK]

Steps: the tool list (run_python's description says how to call tools and
lists them); sandbox_info lists their signatures; a run that lists and
calls tools of the test upstream and of mcp-server-time; a session whose
cells call tools, state kept between them; then pycell mcp's end, after
which no upstream process may be left (their pids, from the marker file
the test upstream writes, are reported with whether they still exist).
"""

import argparse
import json
import os
import sys

import anyio
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sdk_client import REPORT, call, step  # noqa: E402

RUN = """
import json, pycell_tools as t
out = {"servers": [s["name"] for s in t.list_servers()]}
out["add"] = t.test.add(a=40, b=2)["result"]
out["tz"] = t.time.convert_time(source_timezone="UTC", time="12:00", target_timezone="Asia/Tokyo")["target"]["timezone"]
try:
    t.test.add(a="forty", b=2)
except t.ToolError as e:
    out["schema"] = e.code
print(json.dumps(out))
"""


def structured(r):
    return (r or {}).get("structured") or {}


async def flow(session, schemas):
    out = {}
    tools = (await session.list_tools()).tools
    for t in tools:
        schemas[t.name] = t.output_schema
    out["description"] = next(t.description for t in tools if t.name == "run_python")
    out["info"] = await call(session, schemas, {}, name="sandbox_info")
    out["run"] = await call(session, schemas, {"code": RUN})
    start = await call(session, schemas, {}, name="session_start")
    h = structured(start).get("session")
    out["session_start"] = start
    out["cell1"] = await call(session, schemas, {"session": h, "code": "import pycell_tools as t\ntotal = t.test.add(a=1, b=2)['result']\ntotal"})
    out["cell2"] = await call(session, schemas, {"session": h, "code": "total = t.test.add(a=total, b=10)['result']\ntotal"})
    out["cell3"] = await call(session, schemas, {"session": h, "code": "import asyncio\nasync def f():\n    return await asyncio.gather(*[t.aio.test.echo(text=str(i)) for i in range(5)])\n[r['result'] for r in asyncio.run(f())]"})
    out["session_end"] = await call(session, schemas, {"session": h}, name="session_end")
    return out


def alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return ") Z " not in f.read()
    except OSError:
        return False


async def main():
    env = dict(os.environ)
    args = ["mcp", "--tool-servers", ARGS.servers]
    if ARGS.socket:
        env["PYCELL_SOCKET"] = ARGS.socket
    else:
        args.insert(1, "--embedded")
    params = StdioServerParameters(command=ARGS.pycell, args=args, env=env)

    async def session_flow():
        schemas = {}
        async with stdio_client(params) as (read, write):
            async with ClientSession(read, write) as session:
                await session.initialize()
                return await flow(session, schemas)

    await step("flow", session_flow, timeout=240)
    # pycell mcp has exited: its upstreams must be gone too.
    pids = []
    if os.path.exists(ARGS.marker):
        pids = [int(line) for line in open(ARGS.marker) if line.strip()]
    await anyio.sleep(0.5)
    deadline = anyio.current_time() + 10
    while any(alive(p) for p in pids) and anyio.current_time() < deadline:
        await anyio.sleep(0.1)
    REPORT["upstreams"] = {"started": pids, "alive": [p for p in pids if alive(p)]}
    print(json.dumps(REPORT))


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--pycell", required=True)
    ap.add_argument("--servers", required=True)
    ap.add_argument("--marker", required=True)
    ap.add_argument("--socket")
    ARGS = ap.parse_args()
    anyio.run(main)
