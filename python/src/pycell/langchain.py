"""pycell's sandbox as LangChain tools (`pip install 'pycell[langchain]'`):

    from pycell.langchain import sandbox_tools

    tools = sandbox_tools()
    model = chat_model.bind_tools(tools)

Tools: `run_python` (a fresh jail per call) and `python_session` (a python
kept alive for these tools; `await tools[0].metadata["sandbox"].aclose()`
ends it); `run_python` may be called sync (`invoke`) or async (`ainvoke`),
`python_session` async.
"""

from __future__ import annotations

from langchain_core.tools import StructuredTool

from pycell._agent_tools import PYTHON_SESSION, RUN_PYTHON, SandboxTools
from pycell.aio import AsyncClient

__all__ = ["sandbox_tools"]


def sandbox_tools(
    client: AsyncClient | None = None, *, policy: str | None = None, timeout: float | None = None
) -> list[StructuredTool]:
    """pycell's two tools, sharing one session; each's
    `metadata["sandbox"]` is the SandboxTools behind them."""
    tools = SandboxTools(client, policy=policy, timeout=timeout)

    async def run_python(code: str, dependencies: list[str] | None = None) -> str:
        return await tools.run_python(code, dependencies)

    async def python_session(code: str) -> str:
        return await tools.python_session(code)

    made = [
        StructuredTool.from_function(
            func=tools.run_python_sync, coroutine=run_python, name="run_python", description=RUN_PYTHON
        ),
        # A session's connection belongs to one event loop: python_session
        # is async only (ainvoke).
        StructuredTool.from_function(coroutine=python_session, name="python_session", description=PYTHON_SESSION),
    ]
    for t in made:
        t.metadata = {"sandbox": tools}
    return made
