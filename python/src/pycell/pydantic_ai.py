"""pycell's sandbox as a pydantic-ai toolset (`pip install 'pycell[pydantic-ai]'`):

    from pydantic_ai import Agent
    from pycell.pydantic_ai import sandbox_toolset

    agent = Agent("openai:gpt-5", toolsets=[sandbox_toolset()])

Tools: `run_python(code, dependencies)` (a fresh jail per call) and
`python_session(code)` (a python kept alive for this toolset; end it with
`await toolset.tools_state.aclose()`).
"""

from __future__ import annotations

from pydantic_ai import FunctionToolset

from pycell._agent_tools import PYTHON_SESSION, RUN_PYTHON, SandboxTools
from pycell.aio import AsyncClient

__all__ = ["SandboxToolset", "sandbox_toolset"]


class SandboxToolset(FunctionToolset[None]):
    """A FunctionToolset with pycell's two tools; `tools_state` holds the
    session (`await toolset.tools_state.aclose()` ends it)."""

    def __init__(self, tools: SandboxTools) -> None:
        super().__init__()
        self.tools_state = tools

        async def run_python(code: str, dependencies: list[str] | None = None) -> str:
            return await tools.run_python(code, dependencies)

        async def python_session(code: str) -> str:
            return await tools.python_session(code)

        self.add_function(run_python, name="run_python", description=RUN_PYTHON)
        self.add_function(python_session, name="python_session", description=PYTHON_SESSION)


def sandbox_toolset(
    client: AsyncClient | None = None, *, policy: str | None = None, timeout: float | None = None
) -> SandboxToolset:
    """pycell's tools for a pydantic-ai Agent (`toolsets=[...]`)."""
    return SandboxToolset(SandboxTools(client, policy=policy, timeout=timeout))
