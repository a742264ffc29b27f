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
    error, summary = asyncio.run(session_run())
    if error:
        print(f"mcp_client: {error}", file=sys.stderr)
        sys.exit(1)
    print(summary)


main()
