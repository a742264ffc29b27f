"""Runs under pycell-seccomp-try with the default profile applied.

Part 1 exercises what sandboxed code needs (threads, asyncio, subprocess,
multiprocessing, ssl, sqlite3). Part 2 calls a few denied syscalls directly
through ctypes, with arguments a safe wrapper would not produce (high bits
set on 32-bit arguments), and reports the errno each one got (0 = success).
Prints one JSON object; the Rust integration test asserts on it.
"""

import asyncio
import ctypes
import json
import multiprocessing
import os
import platform
import sqlite3
import ssl
import subprocess
import threading


def square(x):
    return x * x


def threads():
    results = []
    lock = threading.Lock()

    def work(n):
        with lock:
            results.append(n)

    ts = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return sorted(results)


async def echo(reader, writer):
    writer.write((await reader.readline()).upper())
    await writer.drain()
    writer.close()


async def asyncio_main():
    server = await asyncio.start_server(echo, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"ping\n")
    await writer.drain()
    reply = (await reader.readline()).decode().strip()
    writer.close()
    server.close()
    await server.wait_closed()
    proc = await asyncio.create_subprocess_exec(
        "/bin/echo", "child", stdout=asyncio.subprocess.PIPE
    )
    out, _ = await proc.communicate()
    in_thread = await asyncio.get_running_loop().run_in_executor(None, square, 7)
    return [reply, out.decode().strip(), in_thread]


def workload():
    with multiprocessing.Pool(2) as pool:
        pool_result = pool.map(square, [1, 2, 3])
    db = sqlite3.connect(":memory:")
    db.execute("create table t (x)")
    db.execute("insert into t values (42)")
    return {
        "threads": threads(),
        "asyncio": asyncio.run(asyncio_main()),
        "subprocess": subprocess.run(
            ["/bin/sh", "-c", "echo hi"], capture_output=True, text=True
        ).stdout.strip(),
        "pool": pool_result,
        "ssl": ssl.create_default_context().verify_mode == ssl.CERT_REQUIRED,
        "sqlite": db.execute("select x from t").fetchone()[0],
    }


# Syscall numbers per architecture (asm/unistd_64.h, asm-generic/unistd.h).
NR = {
    "x86_64": dict(ioctl=16, socket=41, clone=56, ptrace=101, personality=135,
                   keyctl=250, unshare=272, perf_event_open=298, bpf=321,
                   userfaultfd=323, io_uring_setup=425, clone3=435, getpid=39),
    "aarch64": dict(ioctl=29, socket=198, clone=220, ptrace=117, personality=92,
                    keyctl=219, unshare=97, perf_event_open=241, bpf=280,
                    userfaultfd=282, io_uring_setup=425, clone3=435, getpid=172),
}

CLONE_NEWUSER = 0x10000000
CLONE_NEWNET = 0x40000000
SIGCHLD = 17


def raw_probes():
    machine = platform.machine()
    nr = NR[machine]
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long

    def call(number, *args):
        ctypes.set_errno(0)
        result = libc.syscall(ctypes.c_long(number), *[ctypes.c_long(a) for a in args])
        return 0 if result >= 0 else ctypes.get_errno()

    def clone(flags):
        # If the filter failed to stop it, the child must not run the rest.
        ctypes.set_errno(0)
        result = libc.syscall(ctypes.c_long(nr["clone"]), ctypes.c_long(flags),
                              ctypes.c_long(0), ctypes.c_long(0), ctypes.c_long(0),
                              ctypes.c_long(0))
        if result == 0:
            os._exit(0)
        if result > 0:
            os.waitpid(result, 0)
            return 0
        return ctypes.get_errno()

    read_end, write_end = os.pipe()  # a pipe: TIOCSTI on it is harmless even if allowed
    byte = ctypes.c_char(b"x")
    count = ctypes.c_int(0)
    probes = {
        "clone3": call(nr["clone3"], 0, 0),
        "ioctl_tiocsti": call(nr["ioctl"], read_end, 0x5412, ctypes.addressof(byte)),
        "ioctl_tiocsti_high_bits": call(nr["ioctl"], read_end, 0x1_0000_5412, ctypes.addressof(byte)),
        "ioctl_tioclinux": call(nr["ioctl"], read_end, 0x541C, ctypes.addressof(byte)),
        "ioctl_fionread": call(nr["ioctl"], read_end, 0x541B, ctypes.addressof(count)),
        "keyctl": call(nr["keyctl"], 0, -3, 0),
        "bpf": call(nr["bpf"], 0, 0, 0),
        "io_uring_setup": call(nr["io_uring_setup"], 1, 0),
        "userfaultfd": call(nr["userfaultfd"], 0),
        "perf_event_open": call(nr["perf_event_open"], 0, 0, -1, -1, 0),
        "ptrace_traceme": call(nr["ptrace"], 0, 0, 0, 0),
        "unshare_newuser": call(nr["unshare"], CLONE_NEWUSER),
        "clone_newuser": clone(CLONE_NEWUSER | SIGCHLD),
        "clone_newnet_high_bits": clone(0x1_0000_0000 | CLONE_NEWNET | SIGCHLD),
        "personality_addr_no_randomize": call(nr["personality"], 0x0040000),
        "personality_query": call(nr["personality"], 0xFFFFFFFF),
        "socket_packet": call(nr["socket"], 17, 3, 0),
        "socket_packet_high_bits": call(nr["socket"], 0x1_0000_0011, 3, 0),
        "unknown_syscall": call(1000),
    }
    if machine == "x86_64":
        probes["x32_getpid"] = call(0x40000000 | nr["getpid"])
    os.close(read_end)
    os.close(write_end)
    return probes


if __name__ == "__main__":
    print(json.dumps({"workload": workload(), "raw": raw_probes()}))
