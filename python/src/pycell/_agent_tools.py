"""What the framework adapters (pycell.pydantic_ai, pycell.langchain,
pycell.openai_agents) share: the tools' names and descriptions, written
for a model, what they do, and how their results read to a model.

Two tools: `run_python` runs code in a fresh jail (nothing persists), and
`python_session` runs it in a python that this `SandboxTools` keeps alive
between calls (started on first use, ended by `aclose()`).
"""

from __future__ import annotations

from collections.abc import Sequence

from pycell.aio import AsyncClient, AsyncSession
from pycell.client import Client
from pycell.errors import PycellError
from pycell.types import CellResult, Display, Result, StreamTail

__all__ = ["PYTHON_SESSION", "RUN_PYTHON", "SandboxTools"]

RUN_PYTHON = (
    "Run Python 3 code in a fresh, isolated sandbox and get back what it printed. The sandbox has no "
    "network, cannot see the user's files, and is thrown away afterwards: nothing persists between calls "
    "(use python_session for that). Print what you want to see. `dependencies` lists PyPI packages to "
    "install first, e.g. ['pandas'] (wheels only). The answer gives the status (ok, error, timeout, oom), "
    "the exit code, stdout and stderr."
)
PYTHON_SESSION = (
    "Run Python 3 code in a sandboxed Python session that stays alive between calls, like a notebook: "
    "variables, imports and files in /workspace persist from one call to the next. The value of a last "
    "expression is shown, as in a notebook, along with what the code printed and any exception with its "
    "traceback. The session has no network and cannot see the user's files."
)
# What a model gets of each stream, at most (the rest is cut, and said so).
MAX_STREAM_CHARS = 20_000


def _clip(text: str, truncated: bool = False, tail: StreamTail | None = None) -> str:
    """`text`'s head and tail within MAX_STREAM_CHARS, then the stream's
    end past the sandbox's cap (`tail`), if it went over."""
    half = MAX_STREAM_CHARS // 2
    if len(text) > MAX_STREAM_CHARS:
        text = text[:half] + f"\n[... {len(text) - 2 * half} characters cut ...]\n" + text[-half:]
    if tail is not None:
        end = tail.tail[-half:]
        kept = f" (all in {tail.rest_file})" if tail.rest_file else ""
        dropped = f"{tail.skipped_bytes} bytes past the sandbox's output cap not kept here{kept}"
        return text + f"\n[... {dropped} ...]\n" + end
    return text + ("\n[... output truncated by the sandbox's limit]" if truncated else "")


def render_run(result: Result) -> str:
    """A run's result, as a model reads it."""
    head = f"status: {result.status}"
    if result.exit_code is not None:
        head += f" (exit code {result.exit_code})"
    lines = [head]
    if result.error is not None and result.status != "ok":
        lines.append(f"why: {result.error.message}")
    stdout = _clip(result.stdout, result.stdout_truncated, result.stdout_tail)
    lines.append("stdout:\n" + stdout if result.stdout else "stdout: (empty)")
    if result.stderr:
        lines.append("stderr:\n" + _clip(result.stderr, result.stderr_truncated, result.stderr_tail))
    lines.extend(_shown(result.displays))
    return "\n".join(lines)


def _shown(displays: list[Display]) -> list[str]:
    """What display() showed: each one's markdown, else its text."""
    return [f"display:\n{d.markdown or d.text}" for d in displays if d.kind == "display"]


def render_cell(cell: CellResult) -> str:
    """A session cell's outcome, as a model reads it."""
    lines = []
    m = cell.measure
    if cell.stdout:
        lines.append("stdout:\n" + _clip(cell.stdout, m.stdout_truncated, m.stdout_tail))
    if cell.stderr:
        lines.append("stderr:\n" + _clip(cell.stderr, m.stderr_truncated, m.stderr_tail))
    lines.extend(_shown(cell.displays))
    if cell.value is not None:
        rich = next((d.markdown for d in cell.displays if d.kind == "value" and d.markdown), None)
        lines.append(f"value:\n{rich}" if rich else f"value: {_clip(cell.value)}")
        if cell.value_file:
            lines.append(f"(the whole value: {cell.value_file})")
    if cell.error is not None:
        lines.append(f"exception: {cell.error.type}: {cell.error.message}\n{_clip(cell.error.traceback)}")
    if cell.images:
        lines.append("images: " + ", ".join(i.path for i in cell.images))
    if cell.files:
        lines.append("files changed: " + ", ".join(f.path for f in cell.files))
    return "\n".join(lines) or "(no output, no value)"


def render_refusal(e: PycellError) -> str:
    return f"refused ({e.code}): {e}"


class SandboxTools:
    """The tools' behaviour, for any framework. `client` reaches pycelld
    (default: $PYCELL_SOCKET, else the installed one); `policy` and
    `timeout` apply to every call."""

    def __init__(
        self, client: AsyncClient | None = None, *, policy: str | None = None, timeout: float | None = None
    ) -> None:
        self.client = client or AsyncClient()
        self.policy = policy
        self.timeout = timeout
        self._session: AsyncSession | None = None

    async def run_python(self, code: str, dependencies: Sequence[str] | None = None) -> str:
        try:
            result = await self.client.run(code, dependencies=dependencies, policy=self.policy, timeout=self.timeout)
        except PycellError as e:
            return render_refusal(e)
        return render_run(result)

    def run_python_sync(self, code: str, dependencies: Sequence[str] | None = None) -> str:
        """`run_python`, blocking (for frameworks that call tools sync)."""
        try:
            result = Client(self.client.socket).run(
                code, dependencies=dependencies, policy=self.policy, timeout=self.timeout
            )
        except PycellError as e:
            return render_refusal(e)
        return render_run(result)

    async def python_session(self, code: str) -> str:
        try:
            if self._session is None:
                self._session = await self.client.session(policy=self.policy)
            return render_cell(await self._session.run(code, timeout=self.timeout))
        except PycellError as e:
            if e.code in ("session_gone", "session_killed", "unknown_session"):
                self._session = None
                return render_refusal(e) + "\n(the session is over; the next call starts a new, empty one)"
            return render_refusal(e)

    async def aclose(self) -> None:
        """End the session, if one was started."""
        if self._session is not None:
            session, self._session = self._session, None
            await session.end()
