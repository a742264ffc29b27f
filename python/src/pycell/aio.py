"""The asyncio client: the same as `pycell.Client` and `pycell.Session`,
awaited. Cancelling the task cancels the run (or interrupts the cell).

    from pycell.aio import AsyncClient
    result = await AsyncClient().run("print(1)")
"""

from __future__ import annotations

import asyncio
import base64
import time
from collections.abc import Iterable
from typing import Any, Unpack

from pycell import protocol as p
from pycell.client import (
    CLIENT_NAME,
    RECONNECT_PATIENCE,
    OutputCallback,
    ProgressCallback,
    RunOptions,
    _next_id,
    checked,
    default_socket,
    raise_for,
    run_request,
    run_step,
    seconds,
    session_request,
)
from pycell.errors import DaemonUnavailable, ProtocolError, PycellError, error_for
from pycell.types import CellResult, DirEntry, Result, SessionForkInfo, SessionInfo, SessionSummary, SnapshotInfo

__all__ = ["AsyncClient", "AsyncSession"]

#: How long a cancelled run may take to end before the connection is dropped
#: (which ends it too).
CANCEL_GRACE = 10.0


class AsyncConnection:
    """One handshaken connection to pycelld."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    @classmethod
    async def open(cls, path: str, timeout: float) -> AsyncConnection:
        try:
            reader, writer = await asyncio.wait_for(asyncio.open_unix_connection(path, limit=p.MAX_FRAME), timeout)
        except (TimeoutError, OSError) as e:
            raise DaemonUnavailable(
                f"cannot connect to pycelld at {path}: {getattr(e, 'strerror', None) or e or 'timed out'}",
                hint="is pycelld running (systemctl status pycelld), and are you in group pycell? "
                "PYCELL_SOCKET names another socket",
            ) from None
        conn = cls(reader, writer)
        await conn.send(p.Hello(version=p.PROTOCOL_VERSION, client=CLIENT_NAME))
        try:
            reply = await asyncio.wait_for(conn.receive(), timeout)
        except TimeoutError:
            conn.close()
            raise DaemonUnavailable(
                f"{path} did not answer pycell's hello within {timeout} s",
                hint="is it pycelld's socket? PYCELL_SOCKET names another socket",
            ) from None
        if isinstance(reply, p.Error):
            conn.close()
            raise raise_for(reply)
        if not isinstance(reply, p.Welcome):
            conn.close()
            raise ProtocolError(f"pycelld answered hello with {reply.TYPE}")
        return conn

    async def send(self, message: p.ClientMessage) -> None:
        try:
            self.writer.write(p.frame(message))
            await self.writer.drain()
        except OSError as e:
            raise DaemonUnavailable(f"pycelld closed the connection: {e}") from None

    async def receive(self) -> Any:
        try:
            header = await self.reader.readexactly(4)
            return p.parse(await self.reader.readexactly(p.frame_length(header)))
        except (asyncio.IncompleteReadError, OSError):
            raise DaemonUnavailable("pycelld closed the connection (did it restart?)") from None

    def close(self) -> None:
        self.writer.close()


class AsyncClient:
    """pycelld at `socket` (default: $PYCELL_SOCKET, else
    /run/pycell/pycell.sock); any number of runs may go at once."""

    def __init__(self, socket: str | None = None, *, connect_timeout: float = 10.0) -> None:
        self.socket = socket or default_socket()
        self.connect_timeout = connect_timeout

    async def connect(self) -> AsyncConnection:
        """A new handshaken connection (runs and sessions make their own)."""
        return await AsyncConnection.open(self.socket, self.connect_timeout)

    async def run(
        self,
        code: str,
        *,
        on_output: OutputCallback | None = None,
        on_progress: ProgressCallback | None = None,
        **options: Unpack[RunOptions],
    ) -> Result:
        """As `pycell.Client.run`; cancelling the task cancels the run."""
        request = run_request(code, **options)
        conn = await self.connect()
        rid = _next_id()
        try:
            await conn.send(p.Run(id=rid, request=request))
            try:
                while True:
                    result = run_step(await conn.receive(), on_output, on_progress)
                    if result is not None:
                        break
            except BaseException:
                await asyncio.shield(_cancel(conn, rid, (p.RunResult, p.Error)))
                raise
        finally:
            conn.close()
        return checked(result)

    async def _ask(self, message: p.ClientMessage) -> Any:
        conn = await self.connect()
        try:
            await conn.send(message)
            reply = await conn.receive()
        finally:
            conn.close()
        if isinstance(reply, p.Error):
            raise raise_for(reply)
        return reply

    async def info(self) -> dict[str, Any]:
        """What pycelld offers: version, policies, the host's layers, its load."""
        return dict((await self._ask(p.Info())).info)

    async def status(self) -> dict[str, Any]:
        """pycelld's load and limits (cheaper than info)."""
        return dict((await self._ask(p.Status())).status)

    async def sessions(self) -> list[SessionSummary]:
        """Your open sessions."""
        return list((await self._ask(p.SessionList(id=_next_id()))).sessions)

    async def session(
        self,
        *,
        policy: str | None = None,
        dependencies: Iterable[str] | None = None,
        memory: int | None = None,
        timeout: float | None = None,
    ) -> AsyncSession:
        """A new session (end it with `await .end()`, or `async with`)."""
        return await AsyncSession.start(self, policy=policy, dependencies=dependencies, memory=memory, timeout=timeout)


async def _cancel(conn: AsyncConnection, rid: str, until: tuple[type, ...]) -> None:
    """Cancel `rid` and take what pycelld sends until it ends it."""
    try:
        await conn.send(p.Cancel(id=rid))
        async with asyncio.timeout(CANCEL_GRACE):
            while not isinstance(await conn.receive(), until):
                pass
    except (PycellError, TimeoutError):
        pass


class AsyncSession:
    """`pycell.Session`, awaited; make one with `await AsyncSession.start()`
    or `await client.session()`, and use it in `async with`."""

    def __init__(self, client: AsyncClient, conn: AsyncConnection, info: SessionInfo) -> None:
        self.client = client
        self._conn: AsyncConnection | None = conn
        self._lock = asyncio.Lock()
        self.info = info
        self.handle = info.session
        self.fork_info: SessionForkInfo | None = None

    async def snapshot(self) -> SnapshotInfo:
        """Keep this session's state (see `pycell.Session.snapshot`)."""
        msg = p.SessionSnapshot(id=_next_id(), session=self.handle)
        reply: p.SessionSnapshotted = await self._call(msg, p.SessionSnapshotted)
        return reply.snapshot

    async def fork(self) -> AsyncSession:
        """A copy of this session in a jail of its own (see
        `pycell.Session.fork`)."""
        msg = p.SessionFork(id=_next_id(), session=self.handle)
        fork = (await self._call(msg, p.SessionForked)).fork
        forked = AsyncSession(self.client, await self.client.connect(), fork.session)
        forked.fork_info = fork
        return forked

    @classmethod
    async def start(
        cls,
        client: AsyncClient | None = None,
        *,
        policy: str | None = None,
        dependencies: Iterable[str] | None = None,
        memory: int | None = None,
        timeout: float | None = None,
        from_snapshot: str | None = None,
    ) -> AsyncSession:
        client = client or AsyncClient()
        conn = await client.connect()
        request = session_request(policy, dependencies, memory, timeout, from_snapshot)
        try:
            await conn.send(p.SessionStart(id=_next_id(), request=request))
            while True:
                m = await conn.receive()
                if isinstance(m, p.SessionStarted):
                    return cls(client, conn, m.session)
                if isinstance(m, p.Error):
                    raise raise_for(m)
                if isinstance(m, p.RunResult):
                    checked(m.result)
        except BaseException:
            conn.close()
            raise

    async def __aenter__(self) -> AsyncSession:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.end()

    async def _call(self, message: Any, want: type) -> Any:
        async with self._lock:
            if self._conn is None:
                raise error_for("session_gone", "this session was ended")
            try:
                return await self._exchange(message, want)
            except DaemonUnavailable:
                # As pycell.Session: ask again on a new connection, for a while.
                deadline = time.monotonic() + RECONNECT_PATIENCE
                while True:
                    self._conn.close()
                    try:
                        self._conn = await self.client.connect()
                        return await self._exchange(message, want)
                    except DaemonUnavailable:
                        if time.monotonic() > deadline:
                            raise
                        await asyncio.sleep(0.2)

    async def _exchange(self, message: Any, want: type) -> Any:
        assert self._conn is not None
        conn = self._conn
        await conn.send(message)
        try:
            while True:
                m = await conn.receive()
                if isinstance(m, want):
                    return m
                if isinstance(m, p.Error):
                    raise raise_for(m)
        except asyncio.CancelledError:
            if isinstance(message, p.Session):
                await asyncio.shield(_cancel(conn, message.id, (want, p.Error)))
            raise

    async def _op(self, call: p.SessionCall, timeout: float | None = None) -> Any:
        msg = p.Session(id=_next_id(), session=self.handle, call=call, timeout_s=seconds(timeout))
        answer = (await self._call(msg, p.SessionAnswered)).answer
        if answer.reply.refused is not None:
            raise error_for("file_refused", answer.reply.refused)
        return answer

    async def run(self, code: str, *, timeout: float | None = None) -> CellResult:
        """Run `code` as the next cell (see `pycell.Session.run`)."""
        return CellResult.of(await self._op(p.SessionCall(op="cell", code=code), timeout))

    async def write_file(self, path: str, data: bytes | str) -> int:
        """Write a file under /workspace; its size."""
        raw = data.encode() if isinstance(data, str) else data
        a = await self._op(p.SessionCall(op="write", path=path, data_base64=base64.b64encode(raw).decode()))
        return int(a.reply.size or 0)

    async def read_file(self, path: str) -> bytes:
        """A file's bytes, from under /workspace."""
        a = await self._op(p.SessionCall(op="read", path=path))
        return base64.b64decode(a.reply.data or "")

    async def files(self, path: str = "") -> list[DirEntry]:
        """The entries of a directory under /workspace."""
        return list((await self._op(p.SessionCall(op="list", path=path))).reply.entries)

    async def end(self) -> None:
        """End the session (its jail goes); calling it again does nothing."""
        if self._conn is None:
            return
        try:
            await self._call(p.SessionEnd(id=_next_id(), session=self.handle), p.SessionEndedReply)
        except PycellError as e:
            if e.code not in ("session_gone", "unknown_session", "daemon_unavailable"):
                raise
        finally:
            if self._conn is not None:
                self._conn.close()
                self._conn = None
