"""What pycelld sends back, typed: a run's `Result`, a session's answers
and its files, and the pieces they are made of. Field names are the
protocol's (docs/protocol.md); `extra` keeps fields a newer pycelld adds.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import Any

from pycell._fields import field

__all__ = [
    "CellError",
    "CellResult",
    "ChangedFile",
    "DirEntry",
    "Display",
    "Failure",
    "Image",
    "Limits",
    "Measure",
    "Refusal",
    "Reply",
    "Restored",
    "Result",
    "SessionAnswer",
    "SessionEnded",
    "SessionForkInfo",
    "SessionInfo",
    "SessionSummary",
    "SnapshotInfo",
    "StreamTail",
    "Termination",
]


@dataclass
class Failure:
    """Why a run was refused or ended other than by itself: `code` is a
    stable failure code (docs/errors.md), `layer` the part concerned."""

    code: str
    layer: str
    message: str
    hint: str | None = field(default=None, omit="none")
    extra: dict[str, Any] = field(factory=dict)


@dataclass
class Limits:
    """The limits a run or session had."""

    wall_timeout_s: float
    cpu_time_s: float
    memory_bytes: int
    pids: int
    cpus: float
    open_files: int
    file_size_bytes: int
    disk_bytes: int
    max_output_bytes: int
    inotify_instances: int | None = field(default=None, omit="none")
    inotify_watches: int | None = field(default=None, omit="none")
    extra: dict[str, Any] = field(factory=dict)


@dataclass
class ChangedFile:
    """A file the run created or changed in /workspace."""

    path: str
    size: int
    sha256: str | None
    created: bool
    extra: dict[str, Any] = field(factory=dict)


@dataclass
class GrantCleanup:
    """What a writable grant held when its jail ended that a grant may not
    leave on the host, and what pycell did about it."""

    path: str
    action: str
    extra: dict[str, Any] = field(factory=dict)


@dataclass
class Image:
    """A figure the code left open, or a PNG/JPEG it wrote, as a PNG."""

    path: str
    png: str
    width: int
    height: int
    extra: dict[str, Any] = field(factory=dict)

    @property
    def data(self) -> bytes:
        """The PNG's bytes."""
        return base64.b64decode(self.png)


@dataclass
class Display:
    """Something the code showed with `display()`, or a cell's value in a
    richer form than its text: its MIME parts, each text part within the
    policy's `[output] part_chars` (`truncated` if one was cut). `kind` is
    `display` or `value`."""

    kind: str
    text: str
    markdown: str | None = field(default=None, omit="none")
    html: str | None = field(default=None, omit="none")
    json: str | None = field(default=None, omit="none")
    svg: str | None = field(default=None, omit="none")
    png: str | None = field(default=None, omit="none")
    truncated: bool = False
    extra: dict[str, Any] = field(factory=dict)

    @property
    def png_data(self) -> bytes | None:
        """The image/png part's bytes, if there is one."""
        return None if self.png is None else base64.b64decode(self.png)


@dataclass
class StreamTail:
    """The end of a stream that went over the output cap: its last bytes
    (`tail`, at most 16 KiB) and how many were dropped between the part
    kept and them (`skipped_bytes`); for a session cell, the file that has
    them all (`rest_file`)."""

    skipped_bytes: int
    tail: str
    # A session cell: the file in its workspace with every byte past the
    # part kept, and how many were written to it.
    rest_file: str | None = field(default=None, omit="none")
    rest_file_bytes: int = field(default=0, omit="zero")
    extra: dict[str, Any] = field(factory=dict)


@dataclass
class Refusal:
    """One thing the sandbox refused (docs/refusals.md): the `layer`
    (memory, pids, cpu, wall_timeout, disk, output, egress, dns, tools,
    rlimit, seccomp, landlock), the `object` refused, how many times, the
    `rule` that decided and a `remedy` to act on."""

    layer: str
    object: str
    count: int
    rule: str
    remedy: str
    extra: dict[str, Any] = field(factory=dict)


@dataclass
class Termination:
    """Why a run or cell ended: `reason` (exited, signaled, pids_limit,
    wall_timeout, cpu_limit, oom_kill, cancelled, session_ended,
    jailer_died, zygote_died, daemon_gone, refused; a cell: finished, raised,
    wall_timeout) and a sentence; at an OOM kill, the memory in use."""

    reason: str
    detail: str
    memory_bytes: int | None = field(default=None, omit="none")
    extra: dict[str, Any] = field(factory=dict)


@dataclass
class Result:
    """A run's outcome, as `pycell run --json` prints it. `status` is
    ok, error (the program failed), timeout, oom, killed or refused."""

    run_id: str
    status: str
    exit_code: int | None
    signal: int | None
    stdout: str
    stderr: str
    stdout_truncated: bool
    stderr_truncated: bool
    wall_ms: float
    cpu_ms: float
    peak_memory_bytes: int
    policy: str
    limits: Limits | None
    layers: dict[str, Any] | None
    error: Failure | None
    disk_used_bytes: int = 0
    stdout_tail: StreamTail | None = field(default=None, omit="none")
    stderr_tail: StreamTail | None = field(default=None, omit="none")
    warm: bool = False
    warm_waited_ms: float | None = field(default=None, omit="none")
    session_end: dict[str, Any] | None = field(default=None, omit="none")
    files: list[ChangedFile] = field(factory=list)
    files_truncated: bool = False
    grant_cleanups: list[GrantCleanup] = field(factory=list, omit="empty")
    images: list[Image] = field(factory=list, omit="empty")
    images_omitted: int = field(default=0, omit="zero")
    displays: list[Display] = field(factory=list, omit="empty")
    displays_omitted: int = field(default=0, omit="zero")
    network: dict[str, Any] | None = field(default=None, omit="none")
    env: dict[str, Any] | None = field(default=None, omit="none")
    tool_calls: dict[str, Any] | None = field(default=None, omit="none")
    timings: list[Any] = field(factory=list, omit="empty")
    refusals: list[Refusal] = field(factory=list)
    termination: Termination | None = field(default=None, omit="none")
    extra: dict[str, Any] = field(factory=dict)

    @property
    def ok(self) -> bool:
        """The program ran and exited 0."""
        return self.status == "ok"


@dataclass
class CellError:
    """The exception a cell ended with."""

    type: str
    message: str
    traceback: str


@dataclass
class DirEntry:
    """One entry of a session's file listing."""

    name: str
    kind: str
    size: int
    mtime: float


@dataclass
class Reply:
    """The session runner's reply to one call (which fields are set
    depends on the call: a cell, a write, a read, a listing)."""

    refused: str | None = None
    cell: int | None = None
    value: str | None = None
    value_truncated: bool = False
    # A cut value kept whole in the workspace (its path there).
    value_file: str | None = field(default=None, omit="none")
    error: CellError | None = None
    files: list[ChangedFile] = field(factory=list)
    files_truncated: bool = False
    images: list[Image] = field(factory=list)
    images_omitted: int = 0
    displays: list[Display] = field(factory=list, omit="empty")
    displays_omitted: int = field(default=0, omit="zero")
    path: str | None = None
    size: int | None = None
    data: str | None = None
    entries: list[DirEntry] = field(factory=list)
    truncated: bool = False
    extra: dict[str, Any] = field(factory=dict)


@dataclass
class Measure:
    """What one session call took."""

    wall_ms: float
    cpu_ms: float
    memory_bytes: int
    peak_memory_bytes: int
    stdout_truncated: bool
    stderr_truncated: bool
    interrupted: bool
    stdout_tail: StreamTail | None = field(default=None, omit="none")
    stderr_tail: StreamTail | None = field(default=None, omit="none")
    limit_events: dict[str, Any] | None = field(default=None, omit="none")
    extra: dict[str, Any] = field(factory=dict)


@dataclass
class SessionAnswer:
    """pycelld's answer to one session call."""

    run_id: str
    policy: str
    timeout_s: float
    reply: Reply
    stdout: str
    stderr: str
    measure: Measure
    refusals: list[Refusal] = field(factory=list, omit="empty")
    termination: Termination | None = field(default=None, omit="none")
    resumed: bool = field(default=False, omit="false")


@dataclass
class CellResult:
    """What a session cell did: its output, its last expression's text
    (`value`: its repr, or a bounded rendering of a DataFrame, array or
    long container), the exception it raised (`error`), the files it
    changed, the images it made (PNG bytes), and what it showed
    (`displays`: display() calls, then the value's richer form)."""

    cell: int | None
    stdout: str
    stderr: str
    value: str | None
    error: CellError | None
    files: list[ChangedFile]
    images: list[Image]
    measure: Measure
    refusals: list[Refusal]
    termination: Termination | None
    displays: list[Display]
    # A cut value kept whole in the workspace (its path there).
    value_file: str | None = None
    # The session had been paused (idle) and this call resumed it.
    resumed: bool = False

    @property
    def ok(self) -> bool:
        """The cell raised nothing."""
        return self.error is None

    @classmethod
    def of(cls, answer: SessionAnswer) -> CellResult:
        """A cell's result, from pycelld's answer."""
        r = answer.reply
        return cls(
            cell=r.cell,
            stdout=answer.stdout,
            stderr=answer.stderr,
            value=r.value,
            error=r.error,
            files=r.files,
            images=r.images,
            measure=answer.measure,
            refusals=answer.refusals,
            termination=answer.termination,
            displays=r.displays,
            value_file=r.value_file,
            resumed=answer.resumed,
        )


@dataclass
class SessionInfo:
    """A started session: its handle and what it may use."""

    session: str
    run_id: str
    policy: str
    sandbox_uid: int
    limits: Limits
    idle_timeout_s: float
    lifetime_s: float
    max_file_bytes: int
    env: dict[str, Any] | None = field(default=None, omit="none")
    restored: Restored | None = field(default=None, omit="none")


@dataclass
class Restored:
    """What a session started from a snapshot loaded."""

    snapshot: str
    names: list[str]
    files: int


@dataclass
class SnapshotInfo:
    """A snapshot of a session's state, kept by pycelld under your uid:
    pass its `snapshot` id as `from_snapshot` to start a session from it."""

    snapshot: str
    session: str
    policy: str
    size_bytes: int
    created_at: int
    expires_at: int
    names: list[str]
    took_ms: float
    dropped: dict[str, str] = field(factory=dict, omit="empty")
    skipped: dict[str, str] = field(factory=dict, omit="empty")
    reseeded: list[str] = field(factory=list, omit="empty")
    threads_not_carried: list[str] = field(factory=list, omit="empty")
    evicted: list[str] = field(factory=list, omit="empty")


@dataclass
class SessionForkInfo:
    """A fork: the new session, and what its state carried from its source
    and left (names and paths with why; generators reseeded; threads)."""

    session: SessionInfo
    forked_from: str
    names: list[str]
    files: int
    state_bytes: int
    took_ms: float
    dropped: dict[str, str] = field(factory=dict, omit="empty")
    skipped: dict[str, str] = field(factory=dict, omit="empty")
    reseeded: list[str] = field(factory=list, omit="empty")
    threads_not_carried: list[str] = field(factory=list, omit="empty")


@dataclass
class SessionEnded:
    """How a session ended."""

    session: str
    reason: str
    message: str
    peak_memory_bytes: int


@dataclass
class SessionSummary:
    """One of the caller's open sessions."""

    session: str
    policy: str
    age_s: float
    idle_s: float
    expires_in_s: float
    paused: bool = field(default=False, omit="false")
