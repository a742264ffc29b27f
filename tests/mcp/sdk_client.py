"""Drive `pycell mcp` with the official MCP Python SDK and report what happened.

    .cache/tools/bin/python tests/mcp/sdk_client.py --pycell target/debug/pycell

Run by tests/tests/mcp_sdk.rs (as root, like every integration test): this
script only observes and prints ONE JSON object on stdout; the Rust test makes
the assertions. Every step is bounded in time and records an exception instead
of stopping the script, so a failure shows up as a failed assertion with the
step's details, never as a hang.

Steps: the initialize handshake (2025-11-25, what MCP hosts use today) and the
2026-07-28 discover path; tools/list with every schema checked by jsonschema;
real runs (print(1), stdin, an exception, a timeout, OOM, truncation, ten
at once), each result validated against the tool's outputSchema; cancellation through
the SDK (the sandbox's processes and cgroup must be gone afterwards, scanned
in /proc and /sys/fs/cgroup); bad arguments; sandbox_info; and, with raw
JSON-RPC, a clean exit when stdin closes, or SIGTERM comes, in the middle of a
run.
"""

import argparse
import json
import os
import re
import signal
import shutil
import subprocess
import sys
import time
import traceback

import anyio
import jsonschema
from mcp import ClientSession, StdioServerParameters
from mcp.client import Client
from mcp.client.stdio import stdio_client
from mcp.shared.exceptions import MCPError

REPORT = {}
# Embedded mode even if a pycelld happens to listen on this host: the checks
# below (the sandbox uid in progress notes, /proc and cgroup scans) are about
# the sandboxes this server builds itself.
SERVER_ARGS = ["mcp", "--embedded"]


# ------------------------------------------------------------------ host scans


def processes_with_uid(uid):
    """pids of host processes any of whose uids is `uid` (from /proc/*/status)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/status") as f:
                for line in f:
                    if line.startswith("Uid:"):
                        if uid in [int(x) for x in line.split()[1:]]:
                            found.append(int(entry))
                        break
        except OSError:
            continue  # exited while we looked
    return found


def cgroups_of_uid(uid):
    """Cgroup directories a run of this sandbox uid would have (pycell-UID-r-...)."""
    prefix = f"pycell-{uid}-"
    found = []
    for root, dirs, _files in os.walk("/sys/fs/cgroup"):
        if root.count("/") > 9:
            dirs[:] = []
            continue
        for d in dirs:
            if d.startswith(prefix):
                found.append(os.path.join(root, d))
    return found


# ------------------------------------------------------------------ helpers


def short(s, n=400):
    return s if len(s) <= n else s[:n] + f"... [{len(s) - n} more]"


def schema_errors(schema, instance):
    v = jsonschema.Draft202012Validator(schema)
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in v.iter_errors(instance)]


def text_of(result):
    return "".join(getattr(c, "text", "") for c in result.content)


def summarize(result, output_schema):
    """A call result as plain data: flags, text, structured content (long
    output shortened, lengths kept) and its validation against the schema."""
    sc = result.structured_content
    out = {
        "is_error": result.is_error,
        "text": short(text_of(result), 2000),
        "text_tail": text_of(result)[-500:],
        "structured": None,
        "schema_errors": None,
    }
    if isinstance(sc, dict):
        out["schema_errors"] = schema_errors(output_schema, sc) if output_schema else ["no outputSchema"]
        s = dict(sc)
        for k in ("stdout", "stderr"):
            if isinstance(s.get(k), str):
                s[k + "_len"] = len(s[k])
                s[k] = short(s[k])
        out["structured"] = s
    return out


async def call(session, schemas, arguments, name="run_python", **kw):
    """call_tool, recording either the result or the protocol error."""
    t0 = time.monotonic()
    try:
        r = await session.call_tool(name, arguments, **kw)
    except MCPError as e:
        return {"protocol_error": {"code": e.code, "message": e.message}, "elapsed_s": time.monotonic() - t0}
    out = summarize(r, schemas.get(name))
    out["elapsed_s"] = time.monotonic() - t0
    return out


async def until_warm(session, schemas, tries=120):
    """run_python until a run comes forked from the server's zygote
    (started in the background when it starts), at most `tries` calls a
    quarter of a second apart: the first warm result, and the calls it took."""
    for n in range(1, tries + 1):
        out = await call(session, schemas, {"code": "print(6 * 7)"})
        if (out.get("structured") or {}).get("warm"):
            out["calls"] = n
            return out
        await anyio.sleep(0.25)
    return {"never_warm": tries}


async def step(name, fn, timeout=60):
    try:
        with anyio.fail_after(timeout):
            REPORT[name] = await fn()
    except Exception as e:  # noqa: BLE001 - recorded for the Rust test to show
        REPORT[name] = {"exception": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()[-3000:]}


# ------------------------------------------------------------------ steps


async def list_tools(session, schemas):
    tools = (await session.list_tools()).tools
    out = {"names": [t.name for t in tools], "tools": {}}
    for t in tools:
        info = {
            "description": t.description,
            "input_schema": t.input_schema,
            "output_schema": t.output_schema,
            "input_schema_problems": None,
            "output_schema_problems": None,
        }
        for key, schema in (("input_schema_problems", t.input_schema), ("output_schema_problems", t.output_schema)):
            if schema is None:
                info[key] = "absent"
                continue
            try:
                jsonschema.Draft202012Validator.check_schema(schema)
                info[key] = []
            except jsonschema.SchemaError as e:
                info[key] = [str(e)[:1000]]
        schemas[t.name] = t.output_schema
        out["tools"][t.name] = info
    run = out["tools"].get("run_python")
    if run:
        s = run["input_schema"]
        # Arguments the schema must accept and reject.
        run["accepts"] = {
            "minimal": not schema_errors(s, {"code": "print(1)"}),
            "full": not schema_errors(s, {"code": "x", "timeout_s": 2.5, "policy": "default", "stdin": "hi"}),
        }
        run["rejects"] = {
            "no_code": bool(schema_errors(s, {})),
            "negative_timeout": bool(schema_errors(s, {"code": "x", "timeout_s": -1})),
            "unknown_argument": bool(schema_errors(s, {"code": "x", "bogus": 1})),
        }
    return out


async def cancellation(session, schemas):
    notes = []
    state = {"uid": None, "call_outcome": "still running when cancelled"}
    enough = anyio.Event()

    async def on_progress(progress, total, message):
        notes.append({"progress": progress, "total": total, "message": message})
        m = re.search(r"sandbox uid (\d+)", message or "")
        if m:
            state["uid"] = int(m.group(1))
        # The first note comes at sandbox start; wait for one that shows the
        # program's output, so that it surely runs (it prints, then sleeps).
        if state["uid"] is not None and "9 B stdout" in (message or ""):
            enough.set()

    async def long_call():
        try:
            await session.call_tool(
                "run_python",
                {"code": "import time\nprint('sleeping', flush=True)\ntime.sleep(60)\n", "timeout_s": 120},
                progress_callback=on_progress,
            )
            state["call_outcome"] = "returned a result (it should have been cancelled)"
        except MCPError as e:
            state["call_outcome"] = f"protocol error {e.code}: {e.message}"

    t_start = time.monotonic()
    async with anyio.create_task_group() as tg:
        tg.start_soon(long_call)
        with anyio.move_on_after(30) as waited:
            await enough.wait()
        uid = state["uid"]
        state["progress_wait_timed_out"] = waited.cancelled_caught
        state["procs_before_cancel"] = len(processes_with_uid(uid)) if uid else None
        state["cgroups_before_cancel"] = cgroups_of_uid(uid) if uid else None
        state["cancelled_after_s"] = time.monotonic() - t_start
        # The SDK's cancellation path: cancelling the caller's scope sends
        # notifications/cancelled for the in-flight request.
        tg.cancel_scope.cancel()
    t_cancel = time.monotonic()
    uid = state["uid"]
    procs = cgroups = None
    if uid:
        deadline = t_cancel + 15
        while time.monotonic() < deadline:
            procs, cgroups = processes_with_uid(uid), cgroups_of_uid(uid)
            if not procs and not cgroups:
                break
            await anyio.sleep(0.05)
    state["procs_after"] = procs
    state["cgroups_after"] = cgroups
    state["cleanup_s"] = time.monotonic() - t_cancel
    state["progress"] = notes
    # The session must still work after a cancelled call.
    state["next_call"] = await call(session, schemas, {"code": "print(2)"})
    return state


async def parallel(session, schemas, n=10):
    """n calls at once: all must succeed; pycell mcp runs at most 8 sandboxes
    at a time, so 10 one-second sleeps take two rounds, not one or ten."""
    statuses = [None] * n

    async def one(i):
        r = await session.call_tool("run_python", {"code": f"import time\ntime.sleep(1)\nprint({i})"})
        sc = r.structured_content or {}
        statuses[i] = (sc.get("status"), sc.get("stdout"))

    t0 = time.monotonic()
    async with anyio.create_task_group() as tg:
        for i in range(n):
            tg.start_soon(one, i)
    return {
        "calls": n,
        "ok": sum(1 for i, s in enumerate(statuses) if s == ("ok", f"{i}\n")),
        "statuses": statuses,
        "elapsed_s": time.monotonic() - t0,
    }


async def bad_arguments(session, schemas):
    cases = {
        "unknown_policy": {"code": "print(1)", "policy": "no-such-policy"},
        "negative_timeout": {"code": "print(1)", "timeout_s": -1},
        "missing_code": {"timeout_s": 5},
        "code_too_large": {"code": "#" * (5 << 20)},
        "unknown_argument": {"code": "print(1)", "timeout": 5},
    }
    out = {}
    for name, args in cases.items():
        out[name] = await call(session, schemas, args)
    out["unknown_tool"] = await call(session, schemas, {}, name="no_such_tool")
    return out


async def dependencies(session, schemas):
    """A call that installs a package (from the real index) into a fresh
    env store: its progress notes, and its result."""
    notes = []

    async def on_progress(progress, total, message):
        notes.append(message or "")

    code = "import iniconfig\nprint(iniconfig.__name__)"
    out = await call(session, schemas, {"code": code, "dependencies": ["iniconfig"]},
                     progress_callback=on_progress)
    out["progress_messages"] = notes
    return out


# Envs this session installs go to a store of its own (a root-owned place:
# pycell mounts envs only from such paths), so its install is a miss.
ENV_STORE = "/var/cache/pycell-tests/mcp-sdk-envs"


async def main_session(pycell):
    schemas = {}
    shutil.rmtree(ENV_STORE, ignore_errors=True)
    params = StdioServerParameters(command=pycell, args=SERVER_ARGS, env={"PYCELL_ENV_STORE": ENV_STORE})
    t0 = time.monotonic()
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write) as session:
            init = await session.initialize()
            REPORT["initialize"] = {
                "protocol_version": init.protocol_version,
                "server_name": init.server_info.name,
                "server_version": init.server_info.version,
                "tools_capability": init.capabilities.tools is not None,
                "instructions": init.instructions,
                "elapsed_s": time.monotonic() - t0,
            }
            await step("tools", lambda: list_tools(session, schemas))
            await step("print1", lambda: call(session, schemas, {"code": "print(1)"}))
            await step(
                "stdin",
                lambda: call(session, schemas, {"code": "import sys\nprint(sys.stdin.read().upper())", "stdin": "hello"}),
            )
            await step(
                "exception",
                lambda: call(session, schemas, {"code": "raise ValueError('boom')"}),
            )
            await step(
                "timeout",
                lambda: call(session, schemas, {"code": "import time\ntime.sleep(10)", "timeout_s": 1}),
            )
            # The default policy's limit is 512 MiB; bytes * n touches every page.
            await step(
                "oom",
                lambda: call(session, schemas, {"code": "x = b'x' * (1 << 30)\nprint(len(x))"}),
            )
            await step(
                "truncation",
                lambda: call(session, schemas, {"code": "print('x' * 2_000_000)"}),
            )
            await step("zygote", lambda: until_warm(session, schemas))
            await step("sandbox_info", lambda: call(session, schemas, {}, name="sandbox_info"))
            await step("parallel", lambda: parallel(session, schemas))
            await step("cancellation", lambda: cancellation(session, schemas))
            await step("bad_arguments", lambda: bad_arguments(session, schemas))
            await step("dependencies", lambda: dependencies(session, schemas), timeout=180)
    return {"completed": True}


async def modern_session(pycell):
    """The 2026-07-28 path: the SDK's Client probes server/discover."""
    t0 = time.monotonic()
    async with Client(StdioServerParameters(command=pycell, args=SERVER_ARGS), mode="auto") as client:
        r = await client.call_tool("run_python", {"code": "print(1)"})
        return {
            "protocol_version": client.session.protocol_version,
            "status": (r.structured_content or {}).get("status"),
            "stdout": (r.structured_content or {}).get("stdout"),
            "elapsed_s": time.monotonic() - t0,
        }


def end_during_run(pycell, how):
    """Raw JSON-RPC: start a long run with a progress token, end the session
    once the sandbox is up (`how`: "eof" closes stdin, "sigterm" signals the
    server), and watch pycell mcp exit and the sandbox disappear."""
    p = subprocess.Popen([pycell, *SERVER_ARGS], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out = {"uid": None}
    try:

        def send(msg):
            p.stdin.write((json.dumps(msg) + "\n").encode())
            p.stdin.flush()

        send({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "eof-test", "version": "0"}}})
        send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        send({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {
            "name": "run_python", "_meta": {"progressToken": "eof"},
            "arguments": {"code": "import time\ntime.sleep(60)", "timeout_s": 120}}})
        # The first note comes when the sandbox starts, the next a second
        # later, when the program surely runs.
        notes = 0
        deadline = time.monotonic() + 30
        while notes < 2 and time.monotonic() < deadline:
            line = p.stdout.readline()
            if not line:
                break
            msg = json.loads(line)
            if msg.get("method") == "notifications/progress":
                notes += 1
                m = re.search(r"sandbox uid (\d+)", msg["params"].get("message", ""))
                if m:
                    out["uid"] = int(m.group(1))
        out["progress_notes"] = notes
        if out["uid"] is not None:
            out["procs_before_eof"] = len(processes_with_uid(out["uid"]))
        t0 = time.monotonic()
        if how == "eof":
            p.stdin.close()
        else:
            p.send_signal(signal.SIGTERM)
        try:
            out["exit_code"] = p.wait(timeout=20)
        except subprocess.TimeoutExpired:
            out["exit_code"] = f"still running 20 s after {how}"
        out["exit_s"] = time.monotonic() - t0
        # Whatever the server still wrote: after SIGTERM, the killed run's result.
        for line in p.stdout.read().decode(errors="replace").splitlines():
            msg = json.loads(line)
            if msg.get("id") == 2:
                out["result_status"] = ((msg.get("result") or {}).get("structuredContent") or {}).get("status")
        if out["uid"] is not None:
            out["procs_after_exit"] = processes_with_uid(out["uid"])
            out["cgroups_after_exit"] = cgroups_of_uid(out["uid"])
        out["stderr"] = short(p.stderr.read().decode(errors="replace"), 2000)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    return out


async def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pycell", required=True)
    args = ap.parse_args()
    await step("session", lambda: main_session(args.pycell), timeout=240)
    await step("modern", lambda: modern_session(args.pycell), timeout=60)
    await step("eof", lambda: anyio.to_thread.run_sync(end_during_run, args.pycell, "eof"), timeout=90)
    await step("sigterm", lambda: anyio.to_thread.run_sync(end_during_run, args.pycell, "sigterm"), timeout=90)
    print(json.dumps(REPORT))


if __name__ == "__main__":
    anyio.run(main)
