"""Call the MCP tools your client configured, from this sandbox.

    import pycell_tools
    pycell_tools.list_servers()             # [{"name": "time", "tools": [...]}]
    pycell_tools.time.get_current_time(timezone="Europe/Paris")
    await pycell_tools.aio.time.get_current_time(timezone="UTC")
    pycell_tools.call("time", "get_current_time", {"timezone": "UTC"})

Each callable tool is a function `pycell_tools.<server>.<tool>(**arguments)`
(names made valid identifiers; `help()` shows its description and
arguments), and a coroutine function of the same name under
`pycell_tools.aio`. A result is the tool's structured content when it gives
one, else its text (a dict with "text" and "images" when it sent images).
A refused or failed call raises `pycell_tools.ToolError`, whose `.code`
says why: denied, unknown, bad_arguments, tool_failed, upstream_failed,
limit, bad_request. Calls may be made from several threads and asyncio
tasks at once. The servers, and their credentials, run outside the
sandbox; every call is checked, bounded and audited there.
"""

import json as _json
import struct as _struct
import sys as _sys
import threading as _threading

__all__ = ["ToolError", "aio", "call", "list_servers", "list_tools"]

_MAX_REQUEST = 1 << 20
_MAX_REPLY = 16 << 20


class ToolError(Exception):
    """A tool call that was refused or failed: `.code` says why, `.server`
    and `.tool` name the call, `str()` the reason."""

    def __init__(self, message, code="tool_failed", server=None, tool=None):
        super().__init__(message)
        self.code = code
        self.server = server
        self.tool = tool


class _Channel:
    """Requests out, replies back by id, on the descriptor the jail gave
    this process; a reader thread, started with the first request, hands
    each reply to the thread that waits for it."""

    def __init__(self, fd):
        import socket

        self._sock = socket.socket(fileno=fd)
        self._send = _threading.Lock()
        self._lock = _threading.Lock()
        self._waiting = {}
        self._next = 0
        self._reader = None
        self._broken = None

    def request(self, body):
        with self._lock:
            if self._broken is not None:
                raise ToolError(self._broken, "upstream_failed")
            self._next += 1
            rid = body["id"] = self._next
            slot = self._waiting[rid] = [_threading.Event(), None]
            if self._reader is None:
                self._reader = _threading.Thread(
                    target=self._read, name="pycell_tools", daemon=True
                )
                self._reader.start()
        data = _json.dumps(body).encode()
        if len(data) > _MAX_REQUEST:
            self._forget(rid)
            raise ToolError(
                "the request is %d bytes, over the %d allowed" % (len(data), _MAX_REQUEST),
                "bad_request",
            )
        try:
            with self._send:
                self._sock.sendall(_struct.pack(">I", len(data)) + data)
        except OSError as e:
            self._forget(rid)
            raise ToolError("the tool channel is closed: %s" % e, "upstream_failed") from None
        slot[0].wait()
        return slot[1]

    def _forget(self, rid):
        with self._lock:
            self._waiting.pop(rid, None)

    def _read(self):
        reason = "the tool channel closed"
        try:
            while True:
                head = self._exactly(4)
                if head is None:
                    break
                (n,) = _struct.unpack(">I", head)
                if n > _MAX_REPLY:
                    reason = "a reply of %d bytes is over the %d allowed" % (n, _MAX_REPLY)
                    break
                body = self._exactly(n)
                if body is None:
                    break
                reply = _json.loads(body)
                with self._lock:
                    slot = self._waiting.pop(reply.get("id"), None)
                if slot is not None:
                    slot[1] = reply
                    slot[0].set()
        except (OSError, ValueError) as e:
            reason = "the tool channel broke: %s" % e
        with self._lock:
            self._broken = reason
            waiting, self._waiting = self._waiting, {}
        for slot in waiting.values():
            slot[1] = {"error": {"code": "upstream_failed", "message": reason}}
            slot[0].set()

    def _exactly(self, n):
        buf = bytearray()
        while len(buf) < n:
            chunk = self._sock.recv(min(n - len(buf), 1 << 20))
            if not chunk:
                return None
            buf += chunk
        return bytes(buf)


_channel = None


def _ask(body, server=None, tool=None):
    reply = _channel.request(body)
    if "error" in reply:
        e = reply["error"]
        raise ToolError(e.get("message", "failed"), e.get("code", "tool_failed"), server, tool)
    return reply.get("ok")


def list_servers():
    """The servers this run may call: [{"name", "python_name", "tools":
    [tool names]}]."""
    return [
        {"name": s["name"], "python_name": s["python_name"], "tools": [t["name"] for t in s["tools"]]}
        for s in _catalog()
    ]


def list_tools(server):
    """The tools of `server` this run may call: [{"name", "python_name",
    "description", "input_schema"}]."""
    return _ask({"op": "list_tools", "server": server}, server)


def call(server, tool, arguments=None):
    """Call `tool` of `server` with `arguments` (a dict); its result, or
    ToolError."""
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, dict):
        raise ToolError("arguments must be a dict", "bad_arguments", server, tool)
    body = {"op": "call", "server": server, "tool": tool, "arguments": arguments}
    return _ask(body, server, tool)


async def call_async(server, tool, arguments=None):
    """`call`, as a coroutine (the call runs on a worker thread)."""
    import asyncio

    return await asyncio.get_running_loop().run_in_executor(None, call, server, tool, arguments)


_listing = None


def _catalog():
    global _listing
    if _listing is None:
        _listing = _ask({"op": "list_servers"})
    return _listing


class _Namespace:
    def __init__(self, name, doc):
        self.__name__ = name
        self.__doc__ = doc

    def __repr__(self):
        return "<pycell_tools namespace %s: %s>" % (
            self.__name__,
            ", ".join(k for k in vars(self) if not k.startswith("_")),
        )


def _signature(schema):
    """A keyword-only signature for a tool's input schema, and the map of
    Python parameter names to argument names."""
    import inspect

    props = schema.get("properties") or {}
    required = set(schema.get("required") or [])
    params, names = [], {}
    for name in sorted(props, key=lambda n: n not in required):
        py = _identifier(name, names)
        names[py] = name
        default = inspect.Parameter.empty if name in required else None
        annotation = _annotation(props[name])
        params.append(
            inspect.Parameter(py, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=annotation)
        )
    return inspect.Signature(params), names


def _identifier(name, taken):
    import keyword

    out = "".join(c if c.isalnum() or c == "_" else "_" for c in name) or "_"
    if out[0].isdigit() or keyword.iskeyword(out):
        out = "_" + out
    while out in taken:
        out += "_"
    return out


_TYPES = {"string": str, "integer": int, "number": float, "boolean": bool, "array": list, "object": dict}


def _annotation(prop):
    import inspect

    kind = prop.get("type") if isinstance(prop, dict) else None
    return _TYPES.get(kind, inspect.Parameter.empty) if isinstance(kind, str) else inspect.Parameter.empty


def _docstring(server, tool):
    lines = [tool.get("description") or "(no description)", ""]
    schema = tool.get("input_schema") or {}
    props = schema.get("properties") or {}
    required = set(schema.get("required") or [])
    if props:
        lines.append("Arguments:")
        for name, prop in props.items():
            prop = prop if isinstance(prop, dict) else {}
            kind = prop.get("type", "any")
            need = "required" if name in required else "optional"
            text = prop.get("description", "")
            lines.append("    %s (%s, %s)%s" % (name, kind, need, ": " + text if text else ""))
    lines.append("")
    lines.append("MCP tool %r of server %r, called outside the sandbox." % (tool["name"], server))
    return "\n".join(lines)


def _wrappers(server, tool):
    sig, names = _signature(tool.get("input_schema") or {})
    sname, tname = server["name"], tool["name"]

    def arguments(given):
        unknown = [k for k in given if k not in names]
        if unknown:
            raise TypeError("%s() got unexpected arguments: %s" % (tool["python_name"], ", ".join(unknown)))
        return {names[k]: v for k, v in given.items()}

    def sync(**given):
        return call(sname, tname, arguments(given))

    async def coroutine(**given):
        return await call_async(sname, tname, arguments(given))

    for f in (sync, coroutine):
        f.__name__ = f.__qualname__ = tool["python_name"]
        f.__module__ = "pycell_tools." + server["python_name"]
        f.__signature__ = sig
        f.__doc__ = _docstring(sname, tool)
    return sync, coroutine


aio = _Namespace("pycell_tools.aio", "The tools as coroutine functions: await pycell_tools.aio.<server>.<tool>(...).")


def _build(module):
    for server in _catalog():
        doc = "The tools of MCP server %r." % server["name"]
        ns = _Namespace("pycell_tools." + server["python_name"], doc)
        ans = _Namespace("pycell_tools.aio." + server["python_name"], doc)
        for tool in server["tools"]:
            sync, coroutine = _wrappers(server, tool)
            setattr(ns, tool["python_name"], sync)
            setattr(ans, tool["python_name"], coroutine)
        setattr(module, server["python_name"], ns)
        setattr(aio, server["python_name"], ans)


def _connect(fd):
    global _channel
    _channel = _Channel(fd)
    _build(_sys.modules[__name__])
