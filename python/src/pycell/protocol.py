"""pycelld's protocol (docs/protocol.md): the messages each way as
dataclasses, and their framing (a 4-byte big-endian length, then UTF-8
JSON). `encode` and `decode` are the whole codec; protocol/vectors.json
holds example frames that this codec and pycell's Rust one must both
decode and encode back unchanged.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from typing import Any, ClassVar

from pycell._codec import from_json, to_json
from pycell._fields import field
from pycell.errors import ProtocolError
from pycell.types import Result, SessionAnswer, SessionEnded, SessionForkInfo, SessionInfo, SessionSummary, SnapshotInfo

PROTOCOL_VERSION = 6
#: Largest frame either side accepts.
MAX_FRAME = 48 << 20
_LENGTH = struct.Struct(">I")


# ---------------------------------------------------------------- requests


@dataclass
class LimitOverrides:
    """Limits a request sets instead of its policy's (None: the policy's)."""

    timeout_s: float | None = field(default=None, omit="none")
    memory_bytes: int | None = field(default=None, omit="none")
    pids: int | None = field(default=None, omit="none")
    disk_bytes: int | None = field(default=None, omit="none")
    max_output_bytes: int | None = field(default=None, omit="none")


@dataclass
class InputFile:
    """A file put into /workspace before the code runs."""

    name: str
    data_base64: str


@dataclass
class PathGrant:
    target: str
    writable: bool = field(default=False, omit="false")


@dataclass
class RunRequest:
    """One run: its code and how to run it."""

    code: str
    filename: str | None = field(default=None, omit="none")
    args: list[str] = field(factory=list, omit="empty")
    stdin_base64: str | None = field(default=None, omit="none")
    policy: str | None = field(default=None, omit="none")
    limits: LimitOverrides = field(factory=LimitOverrides)
    dependencies: list[str] = field(factory=list, omit="empty")
    files: list[InputFile] = field(factory=list, omit="empty")
    tools: dict[str, Any] | None = field(default=None, omit="none")
    serve_stdio: bool = field(default=False, omit="false")
    env: dict[str, str] = field(factory=dict, omit="empty")
    allow: list[str] = field(factory=list, omit="empty")
    grants: list[PathGrant] = field(factory=list, omit="empty")


@dataclass
class SessionStartRequest:
    policy: str | None = field(default=None, omit="none")
    limits: LimitOverrides = field(factory=LimitOverrides)
    dependencies: list[str] = field(factory=list, omit="empty")
    tools: dict[str, Any] | None = field(default=None, omit="none")
    from_snapshot: str | None = field(default=None, omit="none")


@dataclass
class SessionCall:
    """One call in a session: `op` is cell (`code`), write (`path`,
    `data_base64`), read or list (`path`)."""

    op: str
    code: str | None = field(default=None, omit="none")
    path: str | None = field(default=None, omit="none")
    data_base64: str | None = field(default=None, omit="none")


# --------------------------------------------------------- client → daemon


@dataclass
class Hello:
    TYPE: ClassVar[str] = "hello"
    version: int
    client: str
    identity: str | None = field(default=None, omit="none")


@dataclass
class Run:
    TYPE: ClassVar[str] = "run"
    id: str
    request: RunRequest


@dataclass
class Cancel:
    TYPE: ClassVar[str] = "cancel"
    id: str


@dataclass
class Interrupt:
    TYPE: ClassVar[str] = "interrupt"
    id: str


@dataclass
class Info:
    TYPE: ClassVar[str] = "info"


@dataclass
class Status:
    TYPE: ClassVar[str] = "status"


@dataclass
class SessionStart:
    TYPE: ClassVar[str] = "session_start"
    id: str
    request: SessionStartRequest


@dataclass
class Session:
    TYPE: ClassVar[str] = "session"
    id: str
    session: str
    call: SessionCall
    timeout_s: float | None = field(default=None, omit="none")


@dataclass
class SessionEnd:
    TYPE: ClassVar[str] = "session_end"
    id: str
    session: str


@dataclass
class SessionList:
    TYPE: ClassVar[str] = "session_list"
    id: str


@dataclass
class SessionFork:
    TYPE: ClassVar[str] = "session_fork"
    id: str
    session: str


@dataclass
class SessionSnapshot:
    TYPE: ClassVar[str] = "session_snapshot"
    id: str
    session: str


@dataclass
class ToolAnswer:
    TYPE: ClassVar[str] = "tool_answer"
    id: str
    call: int
    outcome: dict[str, Any]


ClientMessage = (
    Hello
    | Run
    | Cancel
    | Interrupt
    | Info
    | Status
    | SessionStart
    | Session
    | SessionEnd
    | SessionList
    | SessionFork
    | SessionSnapshot
    | ToolAnswer
)


# --------------------------------------------------------- daemon → client


@dataclass
class Welcome:
    TYPE: ClassVar[str] = "welcome"
    version: int
    server: str


@dataclass
class Queued:
    TYPE: ClassVar[str] = "queued"
    id: str
    position: int


@dataclass
class Installing:
    TYPE: ClassVar[str] = "installing"
    id: str
    message: str


@dataclass
class Started:
    TYPE: ClassVar[str] = "started"
    id: str
    run_id: str


@dataclass
class Output:
    TYPE: ClassVar[str] = "output"
    id: str
    stream: str
    data_base64: str


@dataclass
class RunResult:
    TYPE: ClassVar[str] = "result"
    id: str
    result: Result


@dataclass
class Stdio:
    TYPE: ClassVar[str] = "stdio"
    id: str


@dataclass
class InfoReply:
    TYPE: ClassVar[str] = "info"
    info: dict[str, Any]


@dataclass
class StatusReply:
    TYPE: ClassVar[str] = "status"
    status: dict[str, Any]


@dataclass
class SessionStarted:
    TYPE: ClassVar[str] = "session_started"
    id: str
    session: SessionInfo


@dataclass
class SessionAnswered:
    TYPE: ClassVar[str] = "session_answer"
    id: str
    answer: SessionAnswer


@dataclass
class SessionEndedReply:
    TYPE: ClassVar[str] = "session_ended"
    id: str
    ended: SessionEnded


@dataclass
class SessionForked:
    TYPE: ClassVar[str] = "session_forked"
    id: str
    fork: SessionForkInfo


@dataclass
class SessionSnapshotted:
    TYPE: ClassVar[str] = "session_snapshotted"
    id: str
    snapshot: SnapshotInfo


@dataclass
class Sessions:
    TYPE: ClassVar[str] = "sessions"
    id: str
    sessions: list[SessionSummary]


@dataclass
class ToolCall:
    TYPE: ClassVar[str] = "tool_call"
    id: str
    call: int
    server: str
    tool: str
    arguments: dict[str, Any]
    timeout_ms: int | None = field(default=None, omit="none")
    max_result_bytes: int | None = field(default=None, omit="none")


@dataclass
class Error:
    TYPE: ClassVar[str] = "error"
    code: str
    message: str
    id: str | None = field(default=None, omit="none")


DaemonMessage = (
    Welcome
    | Queued
    | Installing
    | Started
    | Output
    | RunResult
    | Stdio
    | InfoReply
    | StatusReply
    | SessionStarted
    | SessionAnswered
    | SessionEndedReply
    | SessionForked
    | SessionSnapshotted
    | Sessions
    | ToolCall
    | Error
)

CLIENT_MESSAGES: dict[str, type] = {c.TYPE: c for c in ClientMessage.__args__}
DAEMON_MESSAGES: dict[str, type] = {c.TYPE: c for c in DaemonMessage.__args__}


# ------------------------------------------------------------------ codec


def encode(message: ClientMessage | DaemonMessage) -> dict[str, Any]:
    """A message as its JSON object (`type` first)."""
    return {"type": message.TYPE, **to_json(message)}


def decode(data: Any, *, sent_by: str = "daemon", strict: bool = False) -> Any:
    """A JSON object as the message it is (`sent_by` "daemon" or
    "client"). ProtocolError names what does not fit; unknown fields are
    one only when `strict`."""
    table = DAEMON_MESSAGES if sent_by == "daemon" else CLIENT_MESSAGES
    if not isinstance(data, dict) or not isinstance(data.get("type"), str):
        raise ProtocolError(f"a message must be an object with a type, not {str(data)[:80]!r}")
    cls = table.get(data["type"])
    if cls is None:
        raise ProtocolError(f"unknown message type {data['type']!r}")
    body = {k: v for k, v in data.items() if k != "type"}
    return from_json(cls, body, strict=strict, where=data["type"])


def frame(message: ClientMessage) -> bytes:
    """The frame of a message: its length, then its JSON."""
    body = json.dumps(encode(message), separators=(",", ":")).encode()
    if len(body) > MAX_FRAME:
        raise ProtocolError(f"the message is {len(body)} bytes, more than a frame may hold ({MAX_FRAME})")
    return _LENGTH.pack(len(body)) + body


def frame_length(header: bytes) -> int:
    """The length a frame header announces, checked against MAX_FRAME."""
    (n,) = _LENGTH.unpack(header)
    if n > MAX_FRAME:
        raise ProtocolError(f"pycelld sent a frame of {n} bytes, more than {MAX_FRAME}")
    return int(n)


def parse(body: bytes) -> Any:
    """A frame's JSON body as a daemon message."""
    try:
        data = json.loads(body)
    except ValueError as e:
        raise ProtocolError(f"pycelld sent a frame that is not JSON: {e}") from None
    except RecursionError:
        raise ProtocolError("pycelld sent a frame nested too deeply to read") from None
    return decode(data)
