"""pycell's sandbox as OpenAI Agents SDK function tools
(`pip install 'pycell[openai-agents]'`):

    from agents import Agent
    from pycell.openai_agents import sandbox_tools

    agent = Agent(name="analyst", tools=sandbox_tools())

Tools: `run_python` (a fresh jail per call) and `python_session` (a python
kept alive for these tools).
"""

from __future__ import annotations

from agents import Tool, function_tool

from pycell._agent_tools import PYTHON_SESSION, RUN_PYTHON, SandboxTools
from pycell.aio import AsyncClient

__all__ = ["sandbox_tools"]


def sandbox_tools(
    client: AsyncClient | None = None,
    *,
    policy: str | None = None,
    timeout: float | None = None,
    tools: SandboxTools | None = None,
) -> list[Tool]:
    """pycell's two tools for an Agent (`tools=[...]`), sharing one
    session; pass `tools` to keep (and later `aclose()`) it yourself."""
    state = tools or SandboxTools(client, policy=policy, timeout=timeout)

    async def run_python(code: str, dependencies: list[str] | None = None) -> str:
        return await state.run_python(code, dependencies)

    async def python_session(code: str) -> str:
        return await state.python_session(code)

    return [
        function_tool(
            run_python, name_override="run_python", description_override=RUN_PYTHON, use_docstring_info=False
        ),
        function_tool(
            python_session,
            name_override="python_session",
            description_override=PYTHON_SESSION,
            use_docstring_info=False,
        ),
    ]
