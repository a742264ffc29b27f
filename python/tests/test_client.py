"""The client against a real pycelld (conftest.py starts one per test)."""

from __future__ import annotations

import asyncio
import json
import pathlib
import signal
import socket
import threading
import time
import zlib
from concurrent.futures import ThreadPoolExecutor

import pytest
from conftest import Pycelld

import pycell
from pycell import errors
from pycell.aio import AsyncClient, AsyncSession

# A 1x1 PNG, written by a cell: pycell returns the images a cell writes.
PNG_CELL = (
    "import struct, zlib\n"
    "def chunk(kind, data):\n"
    "    return struct.pack('>I', len(data)) + kind + data + struct.pack('>I', zlib.crc32(kind + data))\n"
    "png = b'\\x89PNG\\r\\n\\x1a\\n' + chunk(b'IHDR', struct.pack('>IIBBBBB', 1, 1, 8, 2, 0, 0, 0))\n"
    "png += chunk(b'IDAT', zlib.compress(b'\\x00\\xff\\x00\\x00')) + chunk(b'IEND', b'')\n"
    "open('dot.png', 'wb').write(png)\n"
)


def test_a_run_prints_and_its_result_is_typed(pycelld: Pycelld) -> None:
    r = pycell.run("import sys\nprint(sys.argv[1:], input())\n", args=["a"], stdin="hi\n", files={"x.txt": "x"})
    assert r.ok and r.stdout == "['a'] hi\n", r
    assert r.exit_code == 0 and r.policy == "default"
    assert r.limits is not None and r.limits.memory_bytes > 0
    assert r.layers is not None and r.layers["no_new_privs"] is True
    failed = pycell.run("raise SystemExit(3)")
    assert failed.status == "error" and failed.exit_code == 3


def test_a_timeout_is_a_result_and_a_refusal_raises_its_code(pycelld: Pycelld) -> None:
    r = pycell.run("import time\ntime.sleep(30)\n", timeout=1)
    assert r.status == "timeout" and r.error is not None and r.error.code == "timeout"
    with pytest.raises(errors.InvalidRequest, match="no-such-policy"):
        pycell.run("print(1)", policy="no-such-policy")
    with pytest.raises(errors.DependencyError) as e:
        pycell.run("print(1)", dependencies=["six"])
    assert e.value.code.startswith("deps_") and e.value.result is not None


def test_output_streams_as_it_is_written(pycelld: Pycelld) -> None:
    seen: list[tuple[str, bytes, float]] = []
    code = "import sys, time\nprint('one', flush=True)\ntime.sleep(1)\nprint('two', file=sys.stderr)\n"
    started = time.monotonic()
    r = pycell.run(code, on_output=lambda stream, data: seen.append((stream, data, time.monotonic() - started)))
    assert r.ok
    # Chunks come as the program writes (print may write in pieces).
    out = b"".join(d for s, d, _ in seen if s == "stdout")
    err = b"".join(d for s, d, _ in seen if s == "stderr")
    assert (out, err) == (b"one\n", b"two\n"), seen
    # stdout's came a second before stderr's: as written, not at the end.
    last_out = max(t for s, _, t in seen if s == "stdout")
    first_err = min(t for s, _, t in seen if s == "stderr")
    assert last_out + 0.5 < first_err, seen


def test_ctrl_c_cancels_the_run(pycelld: Pycelld) -> None:
    # ^C: SIGINT to this (the main) thread, as a terminal sends it.
    main = threading.main_thread().ident
    assert main is not None
    timer = threading.Timer(1.0, lambda: signal.pthread_kill(main, signal.SIGINT))
    timer.start()
    started = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        pycell.run("import time\ntime.sleep(60)\n")
    assert time.monotonic() - started < 20
    # pycelld ended the run: its audit log says so.
    deadline = time.monotonic() + 15
    while '"event":"run_end"' not in pycelld.audit() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert '"status":"killed"' in pycelld.audit(), pycelld.audit()


def test_a_task_cancel_cancels_the_run(pycelld: Pycelld) -> None:
    async def main() -> None:
        task = asyncio.create_task(AsyncClient().run("import time\ntime.sleep(60)\n"))
        await asyncio.sleep(1.0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        r = await AsyncClient().run("print('after')")
        assert r.stdout == "after\n"

    asyncio.run(main())
    assert '"status":"killed"' in pycelld.audit(), pycelld.audit()


def test_a_session_keeps_state_files_and_images(pycelld: Pycelld) -> None:
    with pycell.Session() as s:
        assert s.run("x = 41").ok
        cell = s.run("print('hi')\nx + 1")
        assert (cell.stdout, cell.value) == ("hi\n", "42")
        boom = s.run("1/0")
        assert boom.error is not None and boom.error.type == "ZeroDivisionError"
        assert s.write_file("data/in.csv", b"x,y\n1,2\n") == 8
        assert s.read_file("data/in.csv") == b"x,y\n1,2\n"
        assert [e.name for e in s.files()] == ["data"]
        with pytest.raises(errors.FileRefused):
            s.read_file("../etc/passwd")
        drawn = s.run(PNG_CELL)
        assert [i.path for i in drawn.images] == ["/workspace/dot.png"], drawn
        assert drawn.images[0].data.startswith(b"\x89PNG") and zlib.crc32(drawn.images[0].data)
        handle = s.handle
        assert [x.session for x in pycell.sessions()] == [handle]
    assert pycell.sessions() == []


def test_a_session_forks_into_a_copy_that_goes_its_own_way(pycelld: Pycelld) -> None:
    with pycell.Session() as s:
        s.run("import random\nx = 41\nrng = random.Random(9)\nf = open('/dev/null')")
        s.write_file("notes.txt", "source")
        with s.fork() as fork:
            info = fork.fork_info
            assert info is not None and info.forked_from == s.handle
            assert "x" in info.names and "f" in info.dropped and info.reseeded == ["Random"], info
            assert fork.handle != s.handle and fork.info.sandbox_uid != s.info.sandbox_uid
            assert fork.run("x += 1\nx").value == "42"
            fork.write_file("notes.txt", "fork")
            assert s.run("x").value == "41" and s.read_file("notes.txt") == b"source"
            assert fork.read_file("notes.txt") == b"fork"
            assert s.run("rng.random()").value != fork.run("rng.random()").value
            assert len(pycell.sessions()) == 2
        with pytest.raises(errors.SessionGone):
            fork.run("x")
        assert [x.session for x in pycell.sessions()] == [s.handle]

    async def main() -> None:
        async with await AsyncSession.start() as a:
            await a.run("y = 'kept'")
            async with await a.fork() as b:
                assert (await b.run("y")).value == "'kept'"

    asyncio.run(main())
    assert pycell.sessions() == []


def test_a_snapshot_outlives_its_session_and_starts_another(pycelld: Pycelld) -> None:
    with pycell.Session() as s:
        s.run("x = 41\ndef inc(n):\n    return n + 1")
        s.write_file("kept.txt", "yes")
        snap = s.snapshot()
        assert snap.snapshot.startswith("snap-") and "x" in snap.names and snap.size_bytes > 0, snap
    with pycell.Session(from_snapshot=snap.snapshot) as again:
        assert again.info.restored is not None and again.info.restored.snapshot == snap.snapshot
        assert again.run("inc(x)").value == "42"
        assert again.read_file("kept.txt") == b"yes"
    with pytest.raises(errors.UnknownSnapshot):
        pycell.Session(from_snapshot="snap-" + "0" * 32)
    with pytest.raises(errors.InvalidRequest):
        pycell.Session(from_snapshot=snap.snapshot, policy="default")


# An object with a markdown form, shown by a run and left as a cell's value.
TABLE = "class Table:\n    def _repr_markdown_(self):\n        return '| a |\\n|---|\\n| 1 |'\n"


def test_a_long_stdout_keeps_its_tail(pycelld: Pycelld) -> None:
    r = pycell.run("for i in range(200_000):\n    print('%019d' % i)\nprint('END')\n")
    assert r.ok and r.stdout_truncated and len(r.stdout) == 1 << 20, r.status
    assert r.stdout_tail is not None and r.stdout_tail.tail.endswith("0000000000000199999\nEND\n")
    assert r.stdout_tail.skipped_bytes == 200_000 * 20 + 4 - (1 << 20) - len(r.stdout_tail.tail)
    assert r.stdout_tail.rest_file is None, "a run's workspace ends with it"
    with pycell.Session() as s:
        cell = s.run("for i in range(200_000):\n    print('%019d' % i)\nprint('END')\n")
        tail = cell.measure.stdout_tail
        assert tail is not None and tail.rest_file == "/workspace/outputs/cell-1-stdout.txt", tail
        whole = "".join(f"{i:019d}\n" for i in range(200_000)) + "END\n"
        assert cell.stdout + s.read_file("outputs/cell-1-stdout.txt").decode() == whole
        assert tail.rest_file_bytes == len(whole) - (1 << 20)


def test_displays_come_back_typed(pycelld: Pycelld) -> None:
    r = pycell.run(TABLE + "display(Table(), {'n': 1})\n")
    assert r.ok, r
    assert [(d.kind, d.markdown) for d in r.displays] == [("display", "| a |\n|---|\n| 1 |"), ("display", None)]
    assert r.displays[1].text == "{'n': 1}" and r.displays_omitted == 0
    with pycell.Session() as s:
        cell = s.run(TABLE + "Table()")
        assert cell.value is not None and cell.value.startswith("<__main__.Table object"), cell
        assert [(d.kind, d.markdown) for d in cell.displays] == [("value", "| a |\n|---|\n| 1 |")], cell
        assert s.run("1 + 1").displays == []


def test_a_cut_value_is_kept_whole_in_the_workspace(pycelld: Pycelld) -> None:
    with pycell.Session() as s:
        cell = s.run("big = [{'i': i, 'sq': i * i} for i in range(20_000)]\nbig")
        assert cell.value is not None and cell.value.startswith("<list of 20,000 items"), (cell.value or "")[:200]
        assert cell.value_file == "/workspace/outputs/cell-1-value.json", cell
        kept = json.loads(s.read_file("outputs/cell-1-value.json"))
        assert kept == [{"i": i, "sq": i * i} for i in range(20_000)]
        assert s.run("[1, 2]").value_file is None


def test_runs_go_at_once_from_threads_and_tasks(pycelld: Pycelld) -> None:
    code = "import time\ntime.sleep(1)\nprint('done')\n"
    started = time.monotonic()
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda _: pycell.run(code), range(4)))
    assert all(r.stdout == "done\n" for r in results)
    threaded = time.monotonic() - started

    async def main() -> list[pycell.Result]:
        client = AsyncClient()
        return await asyncio.gather(*(client.run(code) for _ in range(4)))

    started = time.monotonic()
    assert all(r.stdout == "done\n" for r in asyncio.run(main()))
    # Four runs of a second each, at once: well under four seconds each way.
    assert threaded < 3.5 and time.monotonic() - started < 3.5


def test_an_async_session(pycelld: Pycelld) -> None:
    async def main() -> None:
        async with await AsyncSession.start() as s:
            await s.run("import math")
            assert (await s.run("round(math.pi, 2)")).value == "3.14"
            await s.write_file("a.txt", "a")
            assert await s.read_file("a.txt") == b"a"

    asyncio.run(main())


def test_a_daemon_restart_mid_session_says_the_session_is_gone(pycelld: Pycelld) -> None:
    s = pycell.Session()
    assert s.run("x = 1").ok
    pycelld.restart()
    with pytest.raises((errors.SessionGone, errors.UnknownSession)):
        s.run("x")
    s.end()
    assert pycell.run("print(2)").stdout == "2\n"


def test_no_daemon_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYCELL_SOCKET", "/nonexistent/pycell.sock")
    with pytest.raises(errors.DaemonUnavailable, match="cannot connect to pycelld at /nonexistent"):
        pycell.run("print(1)")


def silent_socket(path: str) -> socket.socket:
    """A listening socket whose server accepts and never answers."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(path)
    s.listen(4)
    return s


def test_a_socket_that_never_answers_hello_is_a_clear_error(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = str(tmp_path / "silent.sock")
    with silent_socket(path):
        with pytest.raises(errors.DaemonUnavailable, match=r"did not answer pycell's hello within 0\.5 s"):
            pycell.Client(path, connect_timeout=0.5).run("print(1)")

        async def main() -> None:
            with pytest.raises(errors.DaemonUnavailable, match="did not answer pycell's hello"):
                await AsyncClient(path, connect_timeout=0.5).run("print(1)")

        asyncio.run(main())


def test_a_frame_nested_too_deeply_is_a_protocol_error() -> None:
    from pycell import protocol

    with pytest.raises(errors.ProtocolError, match="nested too deeply"):
        protocol.parse(b"[" * 200_000 + b"]" * 200_000)


def test_dependencies_are_installed_once_and_their_steps_told(pycelld_with_deps: Pycelld) -> None:
    code = "import pycell_test_a, pycell_test_b\nprint(pycell_test_a.VERSION, pycell_test_b.VERSION)\n"
    steps: list[str] = []
    first = pycell.run(code, dependencies=["pycell-test-a"], policy="pytest-deps", on_progress=steps.append)
    assert first.stdout == "1.0 2.0\n", first
    assert first.env is not None and first.env["cache"] == "miss", first.env
    assert steps, "no install steps were told"
    again = pycell.run(code, dependencies=["pycell-test-a"], policy="pytest-deps")
    assert again.env is not None and again.env["cache"] == "hit"
    with pytest.raises(errors.DependencyError) as e:
        pycell.run("print(1)", dependencies=["pycell-test-sdist"], policy="pytest-deps")
    assert e.value.code == "deps_no_wheel", e.value


def test_a_session_pycell_refuses_raises_its_code(pycelld: Pycelld) -> None:
    with pytest.raises(errors.InvalidRequest):
        pycell.Session(policy="no-such-policy")


def test_an_async_session_after_a_restart_is_gone(pycelld: Pycelld) -> None:
    async def main() -> None:
        s = await AsyncSession.start()
        await s.run("x = 1")
        pycelld.restart()
        with pytest.raises((errors.SessionGone, errors.UnknownSession)):
            await s.run("x")
        await s.end()

    asyncio.run(main())
