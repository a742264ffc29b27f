"""Drive `pycell repl` on a pseudo-terminal, as a person would, and report
what the screen showed (one JSON object; tests/tests/cli_sessions.rs makes
the assertions). Every read is bounded in time.

    python3 tests/repl/drive.py PYCELL [REPL ARGS...]
"""

import json
import os
import pty
import re
import select
import sys
import time

PYCELL = sys.argv[1]
env = dict(os.environ, HOME=os.environ.get("REPL_HOME", "/tmp"), TERM="xterm")
# pty.fork: the terminal is the repl's controlling terminal, so that ^C
# is a SIGINT to its foreground process group, as in a real terminal.
pid, master = pty.fork()
if pid == 0:
    os.execve(PYCELL, [PYCELL, "repl", *sys.argv[2:]], env)
screen = b""
# Where the last read_until's token ended: what came after it in the same
# read is the next one's.
cursor = 0


def read_until(token, timeout=60):
    """Everything shown after the last token up to `token` (or until the
    timeout)."""
    global screen, cursor
    start = cursor
    deadline = time.monotonic() + timeout
    while token.encode() not in screen[start:]:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        ready, _, _ = select.select([master], [], [], left)
        if not ready:
            continue
        try:
            chunk = os.read(master, 65536)
        except OSError:
            break
        if not chunk:
            break
        screen += chunk
    found = screen.find(token.encode(), start)
    cursor = found + len(token.encode()) if found >= 0 else len(screen)
    shown = screen[start:cursor].decode(errors="replace")
    return re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", shown).replace("\r", "")


def send(text):
    os.write(master, text.encode())


out = {}
out["banner"] = read_until(">>> ")
send("x = 41\r")
read_until(">>> ")
send("x + 1\r")
out["value"] = read_until(">>> ")
send("def f():\r")
out["continuation"] = read_until("... ")
send("    return 7\r")
read_until("... ")
send("\r")
read_until(">>> ")
send("f()\r")
out["block"] = read_until(">>> ")
send("1/0\r")
out["error"] = read_until(">>> ")
send("import time; time.sleep(30)\r")
time.sleep(1.5)
send("\x03")
out["interrupt"] = read_until(">>> ", timeout=20)
send("print('still', x)\r")
out["after_interrupt"] = read_until(">>> ")
send("\x1b[A\r")  # up arrow: the last line again
out["history"] = read_until("still 41")
read_until(">>> ")
send("\x04")


def wait_exit(timeout):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.05)
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    return "hung"


out["exit"] = wait_exit(30)
out["tail"] = read_until("\0", timeout=1)
m = re.search(r"uid (\d+)", out["banner"])
out["uid"] = int(m.group(1)) if m else None
print(json.dumps(out))
