"""Long calls through the official MCP Python SDK, and what happens to them
past the client's patience (one JSON object on stdout;
tests/tests/mcp_tasks.rs makes the assertions).

    .cache/tools/bin/python tests/mcp/sdk_tasks.py --pycell target/debug/pycell

`pycell mcp --hand-off-after 5` is driven by two clients at once:

- a client of the 2026-07-28 revision that declares the tasks extension
  (SEP-2663), with a read timeout of 30 s: a 90-second session cell
  becomes a task, polled with tasks/get (its status messages carry the
  cell's newest output) to its result; a run stopped with tasks/cancel
  (its sandbox uid left with no process); a quick run answered at once;
- a client without tasks (the initialize handshake): a session cell past
  the wait is detached, the next call (new code) is not run while it
  goes, and a later call collects its result; the session then goes on.

The steps run concurrently, each bounded in time.
"""

import argparse
import json
import os
import sys
import time
from typing import Any, Literal

import anyio
from mcp import ClientSession, StdioServerParameters
from mcp.client import Client
from mcp.client.extension import ClientExtension, ResultClaim
from mcp.client.stdio import stdio_client
from mcp_types import Request, RequestParams, Result
from pydantic import ConfigDict, Field

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sdk_client import REPORT, call, processes_with_uid, step  # noqa: E402

HAND_OFF_AFTER = 5
SERVER_ARGS = ["mcp", "--embedded", "--hand-off-after", str(HAND_OFF_AFTER)]
CLIENT_TIMEOUT = 30
TASKS = "io.modelcontextprotocol/tasks"


class TaskCreated(Result):
    """A tools/call answered with a task (only what the test reads is typed)."""

    model_config = ConfigDict(extra="allow")
    result_type: Literal["task"] = Field(alias="resultType")


class TaskIdParams(RequestParams):
    task_id: str = Field(alias="taskId")


class GetTask(Request[TaskIdParams, Literal["tasks/get"]]):
    method: Literal["tasks/get"] = "tasks/get"
    params: TaskIdParams
    name_param = "taskId"


class CancelTask(Request[TaskIdParams, Literal["tasks/cancel"]]):
    method: Literal["tasks/cancel"] = "tasks/cancel"
    params: TaskIdParams
    name_param = "taskId"


class AnyResult(Result):
    model_config = ConfigDict(extra="allow")


async def _unused(result: Any, ctx: Any) -> Any:
    raise AssertionError("the test drives its tasks itself (allow_claimed)")


class Tasks(ClientExtension):
    identifier = TASKS

    def claims(self):
        return [ResultClaim(result_type="task", model=TaskCreated, resolve=_unused)]


def task_fields(result):
    return result.model_dump(by_alias=True, mode="json")


async def get_task(session, task_id):
    r = await session.send_request(GetTask(params=TaskIdParams(taskId=task_id)), AnyResult)
    return r.model_dump(by_alias=True, mode="json")


async def start(session, arguments):
    """A run_python call that may become a task: its first answer."""
    t0 = time.monotonic()
    r = await session.call_tool("run_python", arguments, allow_claimed=True)
    return r, time.monotonic() - t0


async def follow(session, task_id, limit_s):
    """Poll a task to its end: the status messages seen, the last state."""
    messages, last = [], None
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        last = await get_task(session, task_id)
        m = last.get("statusMessage")
        if m and (not messages or messages[-1] != m):
            messages.append(m)
        if last.get("status") in ("completed", "failed", "cancelled"):
            break
        await anyio.sleep((last.get("pollIntervalMs") or 1000) / 1000)
    return messages, last


def result_of(state):
    """A completed task's CallToolResult, in brief."""
    r = (state or {}).get("result") or {}
    s = r.get("structuredContent") or {}
    return {
        "is_error": r.get("isError"),
        "status": s.get("status"),
        "stdout_tail": (s.get("stdout") or "")[-200:],
        "cell": s.get("cell"),
        "text_head": "".join(c.get("text", "") for c in r.get("content") or [])[:300],
    }


async def long_cell(session):
    """A 90-second session cell, past the client's 30 s: a task followed to
    its result, its status showing the cell's newest output."""
    started = await session.call_tool("session_start", {})
    handle = (started.structured_content or {}).get("session")
    code = "import time\nfor i in range(90):\n    print('tick', i, flush=True)\n    time.sleep(1)\nprint('done')\n'finished'"
    t0 = time.monotonic()
    first, answered_s = await start(session, {"session": handle, "code": code, "timeout_s": 150})
    out = {"first_kind": type(first).__name__, "answered_s": answered_s}
    if not isinstance(first, TaskCreated):
        out["first"] = str(first)[:500]
        return out
    created = task_fields(first)
    out["created"] = created
    messages, last = await follow(session, created["taskId"], 170)
    out["elapsed_s"] = time.monotonic() - t0
    out["messages"] = messages[:3] + messages[-3:]
    out["message_count"] = len(messages)
    out["final_status"] = (last or {}).get("status")
    out["result"] = result_of(last)
    await session.call_tool("session_end", {"session": handle})
    return out


async def stopped_run(session):
    code = "import time\ni = 0\nwhile True:\n    print('spin', i, flush=True)\n    i += 1\n    time.sleep(0.5)\n"
    first, answered_s = await start(session, {"code": code, "timeout_s": 120})
    out = {"first_kind": type(first).__name__, "answered_s": answered_s}
    if not isinstance(first, TaskCreated):
        return out
    task_id = task_fields(first)["taskId"]
    # Peek until the status shows the program's output and its sandbox uid.
    peeked, uid = None, None
    for _ in range(60):
        state = await get_task(session, task_id)
        m = state.get("statusMessage") or ""
        if "spin" in m and "sandbox uid" in m:
            peeked = m
            uid = int(m.split("sandbox uid ")[1].split(":")[0])
            break
        await anyio.sleep(0.5)
    out["peeked"] = peeked
    out["uid"] = uid
    await session.send_request(CancelTask(params=TaskIdParams(taskId=task_id)), AnyResult)
    _, last = await follow(session, task_id, 30)
    out["final_status"] = (last or {}).get("status")
    out["processes_after"] = processes_with_uid(uid) if uid is not None else None
    return out


async def quick_run(session):
    first, answered_s = await start(session, {"code": "print(6 * 7)"})
    return {
        "kind": type(first).__name__,
        "answered_s": answered_s,
        "stdout": (getattr(first, "structured_content", None) or {}).get("stdout"),
    }


async def tasks_client(pycell):
    params = StdioServerParameters(command=pycell, args=SERVER_ARGS)
    async with Client(params, mode="2026-07-28", extensions=[Tasks()], read_timeout_seconds=CLIENT_TIMEOUT) as client:
        session = client.session
        await session.list_tools()
        async with anyio.create_task_group() as tg:
            tg.start_soon(step, "long_cell", lambda: long_cell(session), 200)
            tg.start_soon(step, "stopped_run", lambda: stopped_run(session), 90)
            tg.start_soon(step, "quick_run", lambda: quick_run(session), 60)


async def detached_cells(pycell):
    params = StdioServerParameters(command=pycell, args=SERVER_ARGS)
    async with stdio_client(params) as (r, w), ClientSession(r, w) as session:
        await session.initialize()
        schemas = {t.name: t.output_schema for t in (await session.list_tools()).tools}
        started = await call(session, schemas, {}, name="session_start")
        handle = (started.get("structured") or {}).get("session")
        out = {}
        slow = "import time\nfor i in range(15):\n    print('step', i, flush=True)\n    time.sleep(1)\nx = 7\nx"
        notes = []

        async def on_progress(progress, total, message):
            notes.append(message)

        out["slow"] = await call(session, schemas, {"session": handle, "code": slow}, progress_callback=on_progress)
        out["slow_progress"] = notes
        out["while_running"] = await call(session, schemas, {"session": handle, "code": "x * 2"})
        collected, waits = None, 0
        for waits in range(1, 21):
            collected = await call(session, schemas, {"session": handle, "code": ""})
            if (collected.get("structured") or {}).get("status") != "running":
                break
        out["collected"] = collected
        out["collect_calls"] = waits
        out["after"] = await call(session, schemas, {"session": handle, "code": "x * 2"})
        out["end"] = await call(session, schemas, {"session": handle}, name="session_end")
        return out


async def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pycell", required=True)
    args = ap.parse_args()
    async with anyio.create_task_group() as tg:
        tg.start_soon(tasks_client, args.pycell)
        tg.start_soon(step, "detached", lambda: detached_cells(args.pycell), 150)
    print(json.dumps(REPORT))


if __name__ == "__main__":
    anyio.run(main)
