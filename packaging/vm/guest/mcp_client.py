"""Call `pycell mcp`'s run_python tool with the official MCP Python SDK.

Run by checks.py as a member of group pycell, with the SDK (installed on the
host with uv pip --target, scripts/vm-test) on PYTHONPATH. Prints one summary
line; on any mismatch prints the reason on stderr and exits 1.
"""

import asyncio
import json
import sys

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

CODE = "import sys\nprint(6 * 7, sys.version_info[:2])"
WANT = "42 (3, 11)"


def field(obj, snake, camel):
    """SDK 2.x names result fields in snake_case, 1.x in camelCase."""
    return getattr(obj, snake) if hasattr(obj, snake) else getattr(obj, camel, None)


TOOLS_CODE = "import pycell_tools\nprint(pycell_tools.test.add(a=40, b=2)['result'])"


async def tool_call(upstream):
    """Code mode: run_python's code calls `add` of an MCP server this
    client configured (-> (error or None, summary))."""
    import os
    import tempfile

    d = tempfile.mkdtemp()
    servers = os.path.join(d, "servers.json")
    env = {"PYTHONPATH": os.environ.get("PYTHONPATH", ""), "PYTHONDONTWRITEBYTECODE": "1"}
    with open(servers, "w") as f:
        json.dump({"mcpServers": {"test": {"command": sys.executable, "args": [upstream], "env": env}}}, f)
    server = StdioServerParameters(command="pycell", args=["mcp", "--tool-servers", servers])
    async with stdio_client(server) as (read, write):
        async with ClientSession(read, write) as session:
            await session.initialize()
            tools = await session.list_tools()
            run = next(t for t in tools.tools if t.name == "run_python")
            if "pycell_tools.test.add(" not in (run.description or ""):
                return f"run_python's description lists no tool: {run.description[-600:]!r}", ""
            res = await asyncio.wait_for(session.call_tool("run_python", {"code": TOOLS_CODE}), timeout=120)
    structured = field(res, "structured_content", "structuredContent") or {}
    calls = (structured.get("tool_calls") or {}).get("calls")
    if structured.get("status") != "ok" or structured.get("stdout") != "42\n" or calls != 1:
        return f"the tool call failed: {json.dumps(structured)[:1500]}", ""
    return None, f"pycell_tools.test.add(a=40, b=2) from the sandbox -> 42 through pycelld, tool_calls {structured.get('tool_calls')}"


async def session_run():
    """-> (error or None, summary)"""
    server = StdioServerParameters(command="pycell", args=["mcp"])
    async with stdio_client(server) as (read, write):
        async with ClientSession(read, write) as session:
            init = await session.initialize()
            info = field(init, "server_info", "serverInfo")
            tools = await session.list_tools()
            names = sorted(t.name for t in tools.tools)
            if "run_python" not in names:
                return f"no run_python tool; tools: {names}", ""
            res = await asyncio.wait_for(session.call_tool("run_python", {"code": CODE}), timeout=120)
    texts = [c.text for c in res.content if getattr(c, "type", None) == "text"]
    structured = field(res, "structured_content", "structuredContent") or {}
    shown = f"structured {json.dumps(structured)[:1200]}, text {json.dumps(texts)[:1200]}"
    if field(res, "is_error", "isError"):
        return f"run_python returned an error: {shown}", ""
    stdout = structured.get("stdout", "")
    if WANT not in stdout:
        return f"run_python did not print {WANT!r}: {shown}", ""
    if structured.get("status") != "ok":
        return f"run_python status is {structured.get('status')!r}: {shown}", ""
    return None, (f"server {info.name} {info.version}, tools {names}, "
                  f"run_python -> {stdout.strip()!r}, status {structured.get('status')!r}")


def main():
    if sys.argv[1:2] == ["--tools"]:
        error, summary = asyncio.run(tool_call(sys.argv[2]))
    else:
        error, summary = asyncio.run(session_run())
    if error:
        print(f"mcp_client: {error}", file=sys.stderr)
        sys.exit(1)
    print(summary)


main()
