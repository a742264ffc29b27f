"""pycell: run untrusted Python in a sandbox, from Python.

    import pycell

    result = pycell.run("print(sum(range(10)))")
    print(result.stdout)                      # 45

    with pycell.Session() as s:               # a python kept alive
        s.run("import math")
        print(s.run("math.pi").value)         # '3.141592653589793'

Talks to pycelld over its Unix socket ($PYCELL_SOCKET, else
/run/pycell/pycell.sock); `pycell.aio` is the asyncio client. Runs pycell
refuses raise the `pycell.errors` class of their stable code.
"""

from __future__ import annotations

from typing import Any, Unpack

from pycell import errors
from pycell.client import Client, OutputCallback, ProgressCallback, RunOptions, Session
from pycell.errors import PycellError
from pycell.types import CellResult, ChangedFile, DirEntry, Display, Failure, GrantCleanup, Image, Result

__version__ = "0.1.0"
__all__ = [
    "CellResult",
    "ChangedFile",
    "Client",
    "DirEntry",
    "Display",
    "Failure",
    "GrantCleanup",
    "Image",
    "OutputCallback",
    "ProgressCallback",
    "PycellError",
    "Result",
    "RunOptions",
    "Session",
    "errors",
    "info",
    "run",
    "sessions",
    "status",
]


def run(
    code: str,
    *,
    on_output: OutputCallback | None = None,
    on_progress: ProgressCallback | None = None,
    **options: Unpack[RunOptions],
) -> Result:
    """Run `code` in a fresh jail of pycelld's (see `Client.run`; the
    keywords are `RunOptions`)."""
    return Client().run(code, on_output=on_output, on_progress=on_progress, **options)


def info() -> dict[str, Any]:
    """pycelld's version, policies, the host's isolation layers and its load."""
    return Client().info()


def status() -> dict[str, Any]:
    """pycelld's load and limits."""
    return Client().status()


def sessions() -> list[Any]:
    """Your open sessions."""
    return list(Client().sessions())
