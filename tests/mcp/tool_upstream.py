"""An upstream MCP server for code-mode tests, written with the official MCP
Python SDK (stdio): tools that succeed, fail, hang, crash and return images.

    .cache/tools/bin/python tests/mcp/tool_upstream.py [--marker FILE]

Each start appends a line to FILE (if given), so that a test can count
restarts; its pid is in the line, so that a test can check it is gone.
"""

import argparse
import base64
import os
import struct
import time
import zlib

from mcp.server.mcpserver import Image, MCPServer
from mcp.server.mcpserver.exceptions import ToolError

mcp = MCPServer("pycell-test-upstream")


@mcp.tool()
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@mcp.tool()
def echo(text: str, times: int = 1) -> str:
    """Repeat some text."""
    return text * times


@mcp.tool()
def fail(message: str) -> str:
    """Always fails with `message`."""
    raise ToolError(message)


@mcp.tool()
def hang(seconds: float) -> str:
    """Sleep for `seconds` before answering."""
    time.sleep(seconds)
    return "woke"


@mcp.tool()
def crash() -> str:
    """Kill this server mid-call."""
    os._exit(3)


@mcp.tool()
def flood(size: int) -> str:
    """A text of `size` bytes."""
    return "x" * size


@mcp.tool()
def whoami() -> dict:
    """The server's own pid and uid (it runs as its client, outside the sandbox)."""
    return {"pid": os.getpid(), "uid": os.getuid(), "secret": os.environ.get("UPSTREAM_SECRET", "")}


@mcp.tool()
def forbidden_delete(path: str) -> str:
    """A tool the tests' allowTools leaves out: code must never reach it."""
    with open(os.environ.get("FORBIDDEN_MARKER", "/dev/null"), "a") as f:
        f.write(path + "\n")
    return "deleted"


def _png(width, height):
    raw = b"".join(b"\x00" + b"\xff\x00\x00" * width for _ in range(height))

    def chunk(kind, data):
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b"")


@mcp.tool()
def picture() -> Image:
    """A small red PNG."""
    return Image(data=_png(4, 3), format="png")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--marker")
    parser.add_argument("--restart-delay", type=float, default=0.0, help="seconds a restart takes to serve")
    args = parser.parse_args()
    if args.marker:
        restarted = os.path.exists(args.marker)
        with open(args.marker, "a") as f:
            f.write("%d\n" % os.getpid())
        if restarted:
            time.sleep(args.restart_delay)
    mcp.run()
