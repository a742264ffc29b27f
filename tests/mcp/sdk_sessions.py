"""Drive `pycell mcp`'s sessions with the official MCP Python SDK and report
what happened (one JSON object on stdout; tests/tests/mcp_sessions.rs makes
the assertions).

    .cache/tools/bin/python tests/mcp/sdk_sessions.py --pycell target/debug/pycell

Steps: state across cells (x = 41, then x + 1), imports and files; an
exception; a cell over its timeout (KeyboardInterrupt, the session goes
on); a binary file round trip; input files for cells; path refusals; a
pandas + matplotlib plot under data-science as a PNG within the edge and
size limits, in a cell and in one-shot runs (over the budget too); a
DataFrame and a 2 MB value as a model sees them, and display();
session_list; a fork (each side its own x, file and random draws; what
was not carried named), and of a data-science session (numpy and pandas
not imported again); a cell that ignores
KeyboardInterrupt (the session is killed, the next call says so); another
session's state kept apart; session_end freeing the sandbox uid's processes
and cgroups; too many sessions; unknown handles; stdin closing with
sessions open. Every step is bounded in time; host scans are as in
sdk_client.py.
"""

import argparse
import base64
import json
import os
import struct
import subprocess
import sys
import time

import anyio
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sdk_client import REPORT, call, cgroups_of_uid, processes_with_uid, step, summarize  # noqa: E402

SERVER_ARGS = ["mcp", "--embedded"]


def structured(r):
    return (r or {}).get("structured") or {}


def png_size(data):
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        return None
    return struct.unpack(">II", data[16:24])


async def basics(session, schemas):
    out = {}
    start = await call(session, schemas, {}, name="session_start")
    out["start"] = start
    h = structured(start).get("session")
    out["handle"] = h
    out["uid"] = structured(start).get("sandbox_uid")
    out["assign"] = await call(session, schemas, {"session": h, "code": "x = 41"})
    out["value"] = await call(session, schemas, {"session": h, "code": "x + 1"})
    out["import"] = await call(session, schemas, {"session": h, "code": "import json\nopen('state.json', 'w').write(json.dumps({'x': x}))"})
    out["import_used"] = await call(session, schemas, {"session": h, "code": "print(json.load(open('state.json')))"})
    out["raises"] = await call(session, schemas, {"session": h, "code": "def f():\n    return 1 / 0\nf()"})
    out["after_exception"] = await call(session, schemas, {"session": h, "code": "x"})
    out["forged_marker"] = await call(
        session,
        schemas,
        {"session": h, "code": "import sys\nsys.stdout.buffer.write(b'\\x00\\x00\\x00\\x10{\"cell\": 999}\\x00pycell-warm-ready\\x00')\nx"},
    )
    out["timeout"] = await call(session, schemas, {"session": h, "code": "import time\nfor i in range(100):\n    time.sleep(0.1)", "timeout_s": 1})
    out["after_timeout"] = await call(session, schemas, {"session": h, "code": "i"})
    blob = bytes(range(256)) * 40
    out["write_binary"] = await call(session, schemas, {"session": h, "path": "data/blob.bin", "content_base64": base64.b64encode(blob).decode()}, name="write_file")
    rb = await call(session, schemas, {"session": h, "path": "data/blob.bin"}, name="read_file")
    got = base64.b64decode(structured(rb).get("content_base64") or "")
    out["read_binary"] = {"result": rb, "exact": got == blob, "len": len(got)}
    out["write_text"] = await call(session, schemas, {"session": h, "path": "in.csv", "content": "a,b\n1,2\n3,4\n"}, name="write_file")
    out["cell_reads_input"] = await call(session, schemas, {"session": h, "code": "import csv\nrows = list(csv.DictReader(open('in.csv')))\nlen(rows)"})
    out["list"] = await call(session, schemas, {"session": h}, name="list_files")
    out["outside"] = await call(session, schemas, {"session": h, "path": "../etc/passwd"}, name="read_file")
    out["absolute_outside"] = await call(session, schemas, {"session": h, "path": "/etc/passwd"}, name="read_file")
    await call(session, schemas, {"session": h, "code": "import os\nos.symlink('/etc/passwd', 'link')"})
    out["symlink"] = await call(session, schemas, {"session": h, "path": "link"}, name="read_file")
    out["changed_files"] = await call(session, schemas, {"session": h, "code": "open('out.txt', 'w').write('hello')\nopen('in.csv', 'a').write('5,6\\n')"})
    out["no_args"] = await call(session, schemas, {"session": h, "code": "1", "dependencies": ["x"]})
    out["list_sessions"] = await call(session, schemas, {}, name="session_list")
    out["end"] = await call(session, schemas, {"session": h}, name="session_end")
    time.sleep(0.2)
    uid = out["uid"]
    out["left_after_end"] = {
        "processes": processes_with_uid(uid) if uid else "no uid",
        "cgroups": cgroups_of_uid(uid) if uid else "no uid",
    }
    out["after_end"] = await call(session, schemas, {"session": h, "code": "x"})
    out["unknown"] = await call(session, schemas, {"session": "s-" + "0" * 32, "code": "x"})
    return out


async def input_files(session, schemas):
    """A one-shot run_python with input files: text and bytes, read by name."""
    blob = bytes(range(256))
    files = [
        {"path": "in.csv", "content": "a,b\n1,2\n3,4\n"},
        {"path": "blob.bin", "content_base64": base64.b64encode(blob).decode()},
    ]
    code = "import csv\nrows = list(csv.DictReader(open('in.csv')))\nprint(len(rows), open('blob.bin', 'rb').read() == bytes(range(256)))"
    out = {"ok": await call(session, schemas, {"code": code, "files": files})}
    out["nested"] = await call(session, schemas, {"code": "1", "files": [{"path": "d/x.csv", "content": ""}]})
    out["both"] = await call(session, schemas, {"code": "1", "files": [{"path": "x", "content": "a", "content_base64": "YQ=="}]})
    return out


async def isolation(session, schemas):
    a = structured(await call(session, schemas, {}, name="session_start")).get("session")
    b = structured(await call(session, schemas, {}, name="session_start")).get("session")
    await call(session, schemas, {"session": a, "code": "secret = 'a'"})
    out = {"handles_differ": a != b}
    out["b_sees"] = await call(session, schemas, {"session": b, "code": "secret"})
    out["b_files"] = await call(session, schemas, {"session": b}, name="list_files")
    await call(session, schemas, {"session": a}, name="session_end")
    await call(session, schemas, {"session": b}, name="session_end")
    return out


async def fork(session, schemas):
    """A session forks: each side then changes its own x, file and
    generator; the fork's report names what it did not carry."""
    started = structured(await call(session, schemas, {}, name="session_start"))
    h = started.get("session")
    await call(session, schemas, {"session": h, "code": "import random\nx = 41\nrng = random.Random(3)\nf = open('/dev/null')\nopen('f.txt', 'w').write('source')"})
    out = {"fork": await call(session, schemas, {"session": h}, name="session_fork")}
    forked = structured(out["fork"]).get("session") or {}
    k = forked.get("session")
    out["uids_differ"] = forked.get("sandbox_uid") not in (None, started.get("sandbox_uid"))
    out["fork_sets"] = await call(session, schemas, {"session": k, "code": "x += 1\nopen('f.txt', 'w').write('fork')\nx"})
    out["source_sets"] = await call(session, schemas, {"session": h, "code": "x += 10\nx"})
    out["fork_reads"] = await call(session, schemas, {"session": k, "code": "x, open('f.txt').read()"})
    out["source_reads"] = await call(session, schemas, {"session": h, "code": "x, open('f.txt').read()"})
    draws = []
    for s in (h, k):
        draws.append(structured(await call(session, schemas, {"session": s, "code": "rng.random()"})).get("cell", {}).get("value"))
    out["draws_differ"] = draws[0] is not None and draws[0] != draws[1]
    out["unknown"] = await call(session, schemas, {"session": "s-unknown"}, name="session_fork")
    # A snapshot of the source, and a session from it.
    out["snapshot"] = await call(session, schemas, {"session": h}, name="session_snapshot")
    snap = structured(out["snapshot"]).get("snapshot")
    out["restored"] = await call(session, schemas, {"from_snapshot": snap}, name="session_start")
    r = structured(out["restored"]).get("session")
    out["restored_reads"] = await call(session, schemas, {"session": r, "code": "x, open('f.txt').read()"})
    out["no_snapshot"] = await call(session, schemas, {"from_snapshot": "snap-" + "0" * 32}, name="session_start")
    for s in (h, k, r):
        await call(session, schemas, {"session": s}, name="session_end")
    # Embedded, the snapshot is in this machine's store: not left there.
    for ext in ("bundle", "json"):
        try:
            os.remove(f"/var/cache/pycell/snapshots/uid-0/{snap}.{ext}")
        except (OSError, TypeError):
            pass
    uid = forked.get("sandbox_uid")
    time.sleep(0.2)
    out["left"] = {"processes": processes_with_uid(uid) if uid else "no uid", "cgroups": cgroups_of_uid(uid) if uid else "no uid"}
    return out


async def fork_data(session, schemas, policy):
    """A data-science session forks with numpy and pandas imported and a
    generator drawn from: the fork has them without importing again."""
    h = structured(await call(session, schemas, {"policy": policy}, name="session_start")).get("session")
    setup = "import numpy as np, pandas as pd, sys\nrng = np.random.default_rng(5)\na = rng.normal(size=1_000_000)\ndf = pd.DataFrame({'a': a[:1000]})\nfloat(a.sum())"
    out = {"source": await call(session, schemas, {"session": h, "code": setup})}
    out["fork"] = await call(session, schemas, {"session": h}, name="session_fork")
    k = (structured(out["fork"]).get("session") or {}).get("session")
    check = "import time\nt = time.perf_counter()\nimport numpy\nimported_ms = (time.perf_counter() - t) * 1e3\n(float(a.sum()), len(df), type(df).__name__, 'pandas' in sys.modules, imported_ms < 5)"
    out["fork_check"] = await call(session, schemas, {"session": k, "code": check})
    draws = []
    for s in (h, k):
        draws.append(structured(await call(session, schemas, {"session": s, "code": "float(rng.random())"})).get("cell", {}).get("value"))
    out["draws_differ"] = draws[0] is not None and draws[0] != draws[1]
    for s in (h, k):
        await call(session, schemas, {"session": s}, name="session_end")
    return out


async def too_many(session, schemas):
    handles = []
    results = []
    for _ in range(5):
        r = await call(session, schemas, {}, name="session_start")
        results.append(r)
        h = structured(r).get("session")
        if h:
            handles.append(h)
    out = {"started": len(handles), "fifth": results[-1]}
    for h in handles:
        await call(session, schemas, {"session": h}, name="session_end")
    return out


async def stubborn(session, schemas):
    started = structured(await call(session, schemas, {}, name="session_start"))
    h, uid = started.get("session"), started.get("sandbox_uid")
    out = {"uid": uid}
    out["cell"] = await call(
        session,
        schemas,
        {"session": h, "code": "import time\nwhile True:\n    try:\n        time.sleep(10)\n    except KeyboardInterrupt:\n        pass", "timeout_s": 1},
    )
    out["next"] = await call(session, schemas, {"session": h, "code": "1"})
    time.sleep(0.2)
    out["left"] = {"processes": processes_with_uid(uid) if uid else "no uid", "cgroups": cgroups_of_uid(uid) if uid else "no uid"}
    return out


async def plot(session, schemas, policy):
    start = await call(session, schemas, {"policy": policy}, name="session_start")
    h = structured(start).get("session")
    code = (
        "import pandas as pd\nimport matplotlib.pyplot as plt\n"
        "df = pd.DataFrame({'x': range(50), 'y': [i * i for i in range(50)]})\n"
        "fig, ax = plt.subplots(figsize=(16, 12), dpi=100)\nax.plot(df.x, df.y)\n"
        "df.describe().loc['mean', 'y']"
    )
    r = await session.call_tool("run_python", {"session": h, "code": code, "timeout_s": 120})
    images = [c for c in r.content if getattr(c, "type", "") == "image"]
    sizes = []
    for im in images:
        data = base64.b64decode(im.data)
        sizes.append({"mime": im.mime_type, "bytes": len(data), "size": png_size(data)})
    sc = r.structured_content or {}
    out = {
        "start": start,
        "is_error": r.is_error,
        "status": sc.get("status"),
        "value": (sc.get("cell") or {}).get("value"),
        "result_images": sc.get("images"),
        "images": sizes,
        "stderr": (sc.get("stderr") or "")[-2000:],
        "text": "".join(getattr(c, "text", "") for c in r.content)[-2000:],
    }
    full = await call(session, schemas, {"session": h, "path": (sc.get("images") or [{}])[0].get("path", "none")}, name="read_file")
    out["full_size"] = {"is_error": full.get("is_error"), "mime": structured(full).get("mime_type"), "size": structured(full).get("size")}
    await call(session, schemas, {"session": h}, name="session_end")
    return out


async def plot_run(session, schemas, policy):
    """One-shot runs: a figure left open and a large PNG saved come back
    scaled down, with their paths; figures over the budget are counted."""
    code = (
        "import matplotlib.pyplot as plt\n"
        "fig, ax = plt.subplots(figsize=(16, 12), dpi=100)\nax.plot([1, 2, 3], [3, 1, 2])\n"
        "plt.savefig('big.png', dpi=200)\n"
        "print('plotted')"
    )
    r = await session.call_tool("run_python", {"code": code, "policy": policy, "timeout_s": 120})
    out = {"shown": summarize(r, schemas.get("run_python"))}
    out["content"] = [
        {"mime": c.mime_type, "size": png_size(base64.b64decode(c.data)), "bytes": len(base64.b64decode(c.data))}
        for c in r.content
        if getattr(c, "type", "") == "image"
    ]
    noise = (
        "import numpy as np\nimport matplotlib.pyplot as plt\nrng = np.random.default_rng(1)\n"
        "for _ in range(3):\n    plt.figure(figsize=(10, 10), dpi=100)\n    plt.imshow(rng.random((1000, 1000, 3)))\n"
    )
    r = await session.call_tool("run_python", {"code": noise, "policy": policy, "timeout_s": 120})
    sc = r.structured_content or {}
    out["over_budget"] = {
        "status": sc.get("status"),
        "sent": len(sc.get("images") or []),
        "omitted": sc.get("images_omitted"),
        "content_bytes": sum(len(base64.b64decode(c.data)) for c in r.content if getattr(c, "type", "") == "image"),
    }
    return out


def texts(r):
    return "".join(getattr(c, "text", "") for c in r.content if getattr(c, "type", "") == "text")


async def frames(session, schemas, policy):
    """What a model sees of a DataFrame and of a 2 MB value: a cell's
    DataFrame as a bounded markdown table (shape, dtypes, first and last
    rows), a dict too long for the context as a summary of its shape (the
    whole written to /workspace by the cell), and display() in a one-shot
    run as markdown in the text."""
    start = await call(session, schemas, {"policy": policy}, name="session_start")
    h = structured(start).get("session")
    code = "import pandas as pd\ndf = pd.DataFrame({'n': range(100000), 'sq': [i * i for i in range(100000)]})\ndf"
    r = await session.call_tool("run_python", {"session": h, "code": code, "timeout_s": 120})
    sc = r.structured_content or {}
    out = {"frame": {"value": (sc.get("cell") or {}).get("value"), "displays": sc.get("displays"), "text": texts(r)}}
    code = "big = {'k%d' % i: {'a': i, 'b': [1, 2, 3]} for i in range(60000)}\nbig"
    r = await session.call_tool("run_python", {"session": h, "code": code, "timeout_s": 120})
    sc = r.structured_content or {}
    cell = sc.get("cell") or {}
    out["big"] = {
        "value": cell.get("value"),
        "value_truncated": cell.get("value_truncated"),
        "value_file": cell.get("value_file"),
        "files": sc.get("files"),
        "text": texts(r)[-300:],
        "text_chars": len(texts(r)),
    }
    # The file pycell kept is the whole value.
    code = "import json\njson.load(open(%r)) == big" % (cell.get("value_file") or "")
    r = await session.call_tool("run_python", {"session": h, "code": code, "timeout_s": 120})
    out["big_file_is_whole"] = ((r.structured_content or {}).get("cell") or {}).get("value")
    await call(session, schemas, {"session": h}, name="session_end")
    code = (
        "import pandas as pd\ndisplay(pd.DataFrame({'a': [1, 2], 'b': ['x', 'y']}))\n"
        "class Badge:\n    def _repr_html_(self):\n        return '<b>ok</b>'\n"
        "display(Badge())\nprint('shown')"
    )
    r = await session.call_tool("run_python", {"code": code, "policy": policy, "timeout_s": 120})
    sc = r.structured_content or {}
    out["run"] = {
        "status": sc.get("status"),
        "displays": sc.get("displays"),
        "text": texts(r),
        "resources": [
            {"uri": str(c.resource.uri), "mime": c.resource.mime_type, "text": getattr(c.resource, "text", None)}
            for c in r.content
            if getattr(c, "type", "") == "resource"
        ],
    }
    return out


def server_params(pycell):
    """`pycell mcp`: embedded, or through the pycelld at --socket."""
    env = dict(os.environ)
    if ARGS.socket:
        env["PYCELL_SOCKET"] = ARGS.socket
        return StdioServerParameters(command=pycell, args=["mcp"], env=env)
    return StdioServerParameters(command=pycell, args=SERVER_ARGS, env=env)


async def session_flow(pycell):
    schemas = {}
    params = server_params(pycell)
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write) as session:
            await session.initialize()
            for t in (await session.list_tools()).tools:
                schemas[t.name] = t.output_schema
            await step("basics", lambda: basics(session, schemas), timeout=120)
            await step("isolation", lambda: isolation(session, schemas))
            await step("input_files", lambda: input_files(session, schemas))
            await step("too_many", lambda: too_many(session, schemas))
            await step("stubborn", lambda: stubborn(session, schemas))
            await step("fork", lambda: fork(session, schemas))
            # data-science's packages (numpy, pandas, matplotlib) come from
            # the package index into the embedded env store, once.
            if not ARGS.socket:
                await step("plot", lambda: plot(session, schemas, "data-science"), timeout=300)
                await step("plot_run", lambda: plot_run(session, schemas, "data-science"), timeout=300)
                await step("frames", lambda: frames(session, schemas, "data-science"), timeout=300)
                await step("fork_data", lambda: fork_data(session, schemas, "data-science"), timeout=300)
    return {"completed": True}


def eof_with_sessions(pycell, kill=False):
    """Open two sessions over raw JSON-RPC, note their uids, close stdin
    (or SIGKILL the server): it must exit and leave nothing of them."""
    p = subprocess.Popen([pycell, *SERVER_ARGS], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    n = [0]

    def send(method, params=None, notify=False):
        msg = {"jsonrpc": "2.0", "method": method}
        if params is not None:
            msg["params"] = params
        if not notify:
            n[0] += 1
            msg["id"] = n[0]
        p.stdin.write((json.dumps(msg) + "\n").encode())
        p.stdin.flush()
        if notify:
            return None
        while True:
            line = p.stdout.readline()
            if not line:
                return None
            m = json.loads(line)
            if m.get("id") == n[0]:
                return m

    send("initialize", {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}})
    send("notifications/initialized", notify=True)
    uids = []
    for _ in range(2):
        r = send("tools/call", {"name": "session_start", "arguments": {}})
        h = r["result"]["structuredContent"]["session"]
        uids.append(r["result"]["structuredContent"]["sandbox_uid"])
        send("tools/call", {"name": "run_python", "arguments": {"session": h, "code": "x = 1"}})
    t0 = time.monotonic()
    if kill:
        p.kill()
    else:
        p.stdin.close()
    try:
        rc = p.wait(timeout=30)
    except subprocess.TimeoutExpired:
        p.kill()
        rc = "hung"
    # The jailers stop their jails when their parent goes: give them time.
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(processes_with_uid(u) or cgroups_of_uid(u) for u in uids):
        time.sleep(0.1)
    return {
        "uids": uids,
        "exit": rc,
        "exit_s": time.monotonic() - t0,
        "left": {str(u): {"processes": processes_with_uid(u), "cgroups": cgroups_of_uid(u)} for u in uids},
    }


async def outlives(pycell):
    """Through pycelld a session outlives the pycell mcp that started it:
    another pycell mcp process (the same uid) finds its state."""
    schemas = {}
    async with stdio_client(server_params(pycell)) as (read, write):
        async with ClientSession(read, write) as session:
            await session.initialize()
            h = structured(await call(session, schemas, {}, name="session_start")).get("session")
            await call(session, schemas, {"session": h, "code": "kept = 'yes'"})
    async with stdio_client(server_params(pycell)) as (read, write):
        async with ClientSession(read, write) as session:
            await session.initialize()
            later = await call(session, schemas, {"session": h, "code": "kept"})
            listed = await call(session, schemas, {}, name="session_list")
            end = await call(session, schemas, {"session": h}, name="session_end")
    return {"later": later, "listed": listed, "end": end}


async def main():
    await step("flow", lambda: session_flow(ARGS.pycell), timeout=600)
    if ARGS.socket:
        await step("outlives", lambda: outlives(ARGS.pycell), timeout=120)
        print(json.dumps(REPORT))
        return
    await step("eof", lambda: anyio.to_thread.run_sync(eof_with_sessions, ARGS.pycell), timeout=90)
    await step("killed", lambda: anyio.to_thread.run_sync(eof_with_sessions, ARGS.pycell, True), timeout=90)
    print(json.dumps(REPORT))


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--pycell", required=True)
    ap.add_argument("--socket", help="a pycelld socket: pycell mcp goes through it")
    ARGS = ap.parse_args()
    anyio.run(main)
