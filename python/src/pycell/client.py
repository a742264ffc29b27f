"""The blocking client: `Client` talks to pycelld over its Unix socket
(one connection per run, one per session), `Session` keeps a python
alive between calls.

    import pycell
    print(pycell.run("print(1 + 1)").stdout)
"""

from __future__ import annotations

import base64
import itertools
import os
import socket
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypedDict, Unpack

from pycell import protocol as p
from pycell.errors import DaemonUnavailable, ProtocolError, PycellError, error_for
from pycell.types import CellResult, DirEntry, Result, SessionForkInfo, SessionInfo, SessionSummary, SnapshotInfo

__all__ = ["Client", "OutputCallback", "ProgressCallback", "RunOptions", "Session", "default_socket"]

#: Called with each chunk of the program's output as it comes: ("stdout"
#: or "stderr", the bytes).
OutputCallback = Callable[[str, bytes], None]
#: Called with each step of a dependency install, or a queue position.
ProgressCallback = Callable[[str], None]

CLIENT_NAME = "pycell-python 0.1.0"
#: How long a session keeps trying to reach pycelld again after its
#: connection broke (a restart takes a moment).
RECONNECT_PATIENCE = 5.0
_ids = itertools.count(1)


def default_socket() -> str:
    """$PYCELL_SOCKET, else the installed pycelld's socket."""
    return os.environ.get("PYCELL_SOCKET") or "/run/pycell/pycell.sock"


def _next_id() -> str:
    return str(next(_ids))


def raise_for(error: p.Error) -> PycellError:
    return error_for(error.code, error.message)


def run_step(m: Any, on_output: OutputCallback | None, on_progress: ProgressCallback | None) -> Result | None:
    """One message of a run: its Result when it is the last, else None
    (output and progress go to the callbacks); an error raises."""
    if isinstance(m, p.RunResult):
        return m.result
    if isinstance(m, p.Error):
        raise raise_for(m)
    if isinstance(m, p.Output) and on_output is not None:
        on_output(m.stream, base64.b64decode(m.data_base64))
    elif isinstance(m, p.Installing) and on_progress is not None:
        on_progress(m.message)
    elif isinstance(m, p.Queued) and on_progress is not None:
        on_progress(f"queued: position {m.position}")
    return None


def checked(result: Result) -> Result:
    """`result`, or the PycellError of a run pycell refused."""
    if result.status == "refused" and result.error is not None:
        e = result.error
        raise error_for(e.code, e.message, hint=e.hint, result=result)
    return result


class RunOptions(TypedDict, total=False):
    """How a run goes; every `run` takes these keywords. `dependencies`:
    packages to install first (PEP 508, wheels only); `policy`: a policy
    name (default `default`); `timeout` (seconds) and `memory` (bytes):
    lower (or, up to the policy's ceiling, raise) its limits; `stdin`; `files`:
    name -> bytes put into /workspace; `args`: sys.argv[1:]; `env`: variables."""

    dependencies: Iterable[str] | None
    policy: str | None
    timeout: float | None
    memory: int | None
    stdin: bytes | str | None
    files: Mapping[str, bytes | str] | None
    args: Iterable[str] | None
    env: Mapping[str, str] | None


def seconds(timeout: float | None) -> float | None:
    """A timeout as the protocol has it (a float), or None."""
    return float(timeout) if timeout is not None else None


def session_request(
    policy: str | None,
    dependencies: Iterable[str] | None,
    memory: int | None,
    timeout: float | None,
    from_snapshot: str | None = None,
) -> p.SessionStartRequest:
    """The request of a session, from `session`'s arguments."""
    limits = p.LimitOverrides(memory_bytes=memory, timeout_s=seconds(timeout))
    return p.SessionStartRequest(
        policy=policy, dependencies=list(dependencies or []), limits=limits, from_snapshot=from_snapshot
    )


def run_request(code: str, **options: Unpack[RunOptions]) -> p.RunRequest:
    """The request of a run, from `run`'s arguments."""
    stdin = options.get("stdin")
    if isinstance(stdin, str):
        stdin = stdin.encode()
    timeout = options.get("timeout")
    return p.RunRequest(
        code=code,
        args=list(options.get("args") or []),
        stdin_base64=base64.b64encode(stdin).decode() if stdin else None,
        policy=options.get("policy"),
        limits=p.LimitOverrides(timeout_s=seconds(timeout), memory_bytes=options.get("memory")),
        dependencies=list(options.get("dependencies") or []),
        files=[
            p.InputFile(name, base64.b64encode(data.encode() if isinstance(data, str) else data).decode())
            for name, data in (options.get("files") or {}).items()
        ],
        env=dict(options.get("env") or {}),
    )


class Connection:
    """One handshaken connection to pycelld."""

    def __init__(self, path: str, timeout: float | None = None) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self.sock.settimeout(timeout)
            self.sock.connect(path)
        except OSError as e:
            self.sock.close()
            raise DaemonUnavailable(
                f"cannot connect to pycelld at {path}: {e.strerror or e}",
                hint="is pycelld running (systemctl status pycelld), and are you in group pycell? "
                "PYCELL_SOCKET names another socket",
            ) from None
        # The handshake is bounded by the same timeout: a socket whose
        # server never answers is not pycelld.
        self.send(p.Hello(version=p.PROTOCOL_VERSION, client=CLIENT_NAME))
        try:
            reply = self.receive()
        except DaemonUnavailable:
            self.close()
            raise DaemonUnavailable(
                f"{path} did not answer pycell's hello within {timeout} s",
                hint="is it pycelld's socket? PYCELL_SOCKET names another socket",
            ) from None
        self.sock.settimeout(None)
        if isinstance(reply, p.Error):
            self.close()
            raise raise_for(reply)
        if not isinstance(reply, p.Welcome):
            self.close()
            raise ProtocolError(f"pycelld answered hello with {reply.TYPE}")

    def send(self, message: p.ClientMessage) -> None:
        try:
            self.sock.sendall(p.frame(message))
        except OSError as e:
            raise DaemonUnavailable(f"pycelld closed the connection: {e}") from None

    def _exactly(self, n: int) -> bytes:
        chunks, left = [], n
        while left:
            chunk = self.sock.recv(min(left, 1 << 20))
            if not chunk:
                raise DaemonUnavailable("pycelld closed the connection (did it restart?)")
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)

    def receive(self) -> Any:
        try:
            return p.parse(self._exactly(p.frame_length(self._exactly(4))))
        except OSError as e:
            raise DaemonUnavailable(f"reading from pycelld: {e}") from None

    def close(self) -> None:
        self.sock.close()


class Client:
    """pycelld at `socket` (default: $PYCELL_SOCKET, else
    /run/pycell/pycell.sock). Safe to share between threads: each run has
    its own connection."""

    def __init__(self, socket: str | None = None, *, connect_timeout: float = 10.0) -> None:
        self.socket = socket or default_socket()
        self.connect_timeout = connect_timeout

    def connect(self) -> Connection:
        """A new handshaken connection (runs and sessions make their own)."""
        return Connection(self.socket, self.connect_timeout)

    def run(
        self,
        code: str,
        *,
        on_output: OutputCallback | None = None,
        on_progress: ProgressCallback | None = None,
        **options: Unpack[RunOptions],
    ) -> Result:
        """Run `code` in a fresh jail and return its Result, whatever the
        program did (`result.status`: ok, error, timeout, oom, killed). A
        run pycell refuses (an unknown policy, dependencies without wheels,
        a busy daemon) raises the PycellError of its code. ^C (or any
        exception in a callback) cancels the run, then re-raises."""
        request = run_request(code, **options)
        conn = self.connect()
        try:
            rid = _next_id()
            conn.send(p.Run(id=rid, request=request))
            try:
                result = self._follow(conn, on_output, on_progress)
            except BaseException:
                self._cancel(conn, rid)
                raise
        finally:
            conn.close()
        return checked(result)

    @staticmethod
    def _follow(conn: Connection, on_output: OutputCallback | None, on_progress: ProgressCallback | None) -> Result:
        while True:
            result = run_step(conn.receive(), on_output, on_progress)
            if result is not None:
                return result

    @staticmethod
    def _cancel(conn: Connection, rid: str) -> None:
        """Cancel run `rid` and wait (briefly) for pycelld to end it."""
        try:
            conn.send(p.Cancel(id=rid))
            conn.sock.settimeout(10)
            while not isinstance(conn.receive(), (p.RunResult, p.Error)):
                pass
        except (PycellError, OSError):
            pass

    def _ask(self, message: p.ClientMessage) -> Any:
        conn = self.connect()
        try:
            conn.send(message)
            reply = conn.receive()
        finally:
            conn.close()
        if isinstance(reply, p.Error):
            raise raise_for(reply)
        return reply

    def info(self) -> dict[str, Any]:
        """What pycelld offers: version, policies, the host's layers, its load."""
        reply = self._ask(p.Info())
        return dict(reply.info)

    def status(self) -> dict[str, Any]:
        """pycelld's load and limits (cheaper than info)."""
        reply = self._ask(p.Status())
        return dict(reply.status)

    def sessions(self) -> list[SessionSummary]:
        """Your open sessions."""
        reply = self._ask(p.SessionList(id=_next_id()))
        return list(reply.sessions)

    def session(
        self,
        *,
        policy: str | None = None,
        dependencies: Iterable[str] | None = None,
        memory: int | None = None,
        timeout: float | None = None,
    ) -> Session:
        """A new session (end it with `.end()`, or use it in a `with`)."""
        return Session(policy=policy, dependencies=dependencies, memory=memory, timeout=timeout, client=self)


class Session:
    """A python that stays alive between calls, in its own jail:

        with pycell.Session() as s:
            s.run("x = 41")
            print(s.run("x + 1").value)   # '42'

    Calls are served in order; one Session may be used from several
    threads. The session belongs to your uid and outlives this object's
    connection, until `end()`, its idle timeout or its lifetime."""

    def __init__(
        self,
        *,
        policy: str | None = None,
        dependencies: Iterable[str] | None = None,
        memory: int | None = None,
        timeout: float | None = None,
        client: Client | None = None,
        from_snapshot: str | None = None,
    ) -> None:
        self.client = client or Client()
        self._lock = threading.Lock()
        self._conn: Connection | None = self.client.connect()
        request = session_request(policy, dependencies, memory, timeout, from_snapshot)
        try:
            reply = self._call(p.SessionStart(id=_next_id(), request=request), p.SessionStarted)
        except BaseException:
            if self._conn is not None:
                self._conn.close()
            raise
        self.info: SessionInfo = reply.session
        self.handle = self.info.session
        self.fork_info: SessionForkInfo | None = None

    @classmethod
    def _adopt(cls, client: Client, fork: SessionForkInfo) -> Session:
        """The session a fork made, on a connection of its own."""
        s = cls.__new__(cls)
        s.client = client
        s._lock = threading.Lock()
        s._conn = client.connect()
        s.info = fork.session
        s.handle = s.info.session
        s.fork_info = fork
        return s

    def snapshot(self) -> SnapshotInfo:
        """Keep this session's variables, imports and /workspace in
        pycelld's store (they outlive the session and pycelld's restarts):
        `Session(from_snapshot=info.snapshot)` starts a session from it."""
        msg = p.SessionSnapshot(id=_next_id(), session=self.handle)
        reply: p.SessionSnapshotted = self._call(msg, p.SessionSnapshotted)
        return reply.snapshot

    def fork(self) -> Session:
        """A new session whose variables, imports and /workspace are a copy
        of this one's, in a jail of its own; this one goes on unchanged.
        Its `fork_info` says what was not carried (open files, sockets,
        threads...) and which random generators were reseeded."""
        msg = p.SessionFork(id=_next_id(), session=self.handle)
        reply = self._call(msg, p.SessionForked)
        return Session._adopt(self.client, reply.fork)

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.end()

    def _call(self, message: Any, want: type) -> Any:
        with self._lock:
            if self._conn is None:
                raise error_for("session_gone", "this session was ended")
            try:
                return self._exchange(message, want)
            except DaemonUnavailable:
                # The connection broke (pycelld restarted?): a session
                # outlives connections, so ask again on a new one, for a
                # while; a restarted pycelld answers that it is gone.
                deadline = time.monotonic() + RECONNECT_PATIENCE
                while True:
                    self._conn.close()
                    try:
                        self._conn = self.client.connect()
                        return self._exchange(message, want)
                    except DaemonUnavailable:
                        if time.monotonic() > deadline:
                            raise
                        time.sleep(0.2)

    def _exchange(self, message: Any, want: type) -> Any:
        assert self._conn is not None
        self._conn.send(message)
        try:
            while True:
                m = self._conn.receive()
                if isinstance(m, want):
                    return m
                if isinstance(m, p.Error):
                    raise raise_for(m)
                if isinstance(m, p.RunResult) and m.result.error is not None:
                    e = m.result.error
                    raise error_for(e.code, e.message, hint=e.hint, result=m.result)
        except KeyboardInterrupt:
            if isinstance(message, p.Session):
                self._interrupt(message.id, want)
            raise

    def _interrupt(self, rid: str, want: type) -> None:
        """^C during a call: interrupt it (KeyboardInterrupt in the cell)
        and take its answer, so that the connection stays in step."""
        assert self._conn is not None
        try:
            self._conn.send(p.Cancel(id=rid))
            while not isinstance(self._conn.receive(), (want, p.Error)):
                pass
        except PycellError:
            pass

    def _op(self, call: p.SessionCall, timeout: float | None = None) -> Any:
        msg = p.Session(id=_next_id(), session=self.handle, call=call, timeout_s=seconds(timeout))
        answer = self._call(msg, p.SessionAnswered).answer
        if answer.reply.refused is not None:
            raise error_for("file_refused", answer.reply.refused)
        return answer

    def run(self, code: str, *, timeout: float | None = None) -> CellResult:
        """Run `code` as the next cell; its output, value, exception,
        files and images."""
        return CellResult.of(self._op(p.SessionCall(op="cell", code=code), timeout))

    def write_file(self, path: str, data: bytes | str) -> int:
        """Write a file under /workspace; its size."""
        raw = data.encode() if isinstance(data, str) else data
        a = self._op(p.SessionCall(op="write", path=path, data_base64=base64.b64encode(raw).decode()))
        return int(a.reply.size or 0)

    def read_file(self, path: str) -> bytes:
        """A file's bytes, from under /workspace."""
        a = self._op(p.SessionCall(op="read", path=path))
        return base64.b64decode(a.reply.data or "")

    def files(self, path: str = "") -> list[DirEntry]:
        """The entries of a directory under /workspace."""
        return list(self._op(p.SessionCall(op="list", path=path)).reply.entries)

    def end(self) -> None:
        """End the session (its jail goes); calling it again does nothing."""
        if self._conn is None:
            return
        try:
            self._call(p.SessionEnd(id=_next_id(), session=self.handle), p.SessionEndedReply)
        except PycellError as e:
            if e.code not in ("session_gone", "unknown_session", "daemon_unavailable"):
                raise
        finally:
            with self._lock:
                if self._conn is not None:
                    self._conn.close()
                    self._conn = None
