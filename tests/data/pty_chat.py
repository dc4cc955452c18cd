"""Drives `reagent chat` on a pseudo-terminal for tests/cli.rs: a turn whose tool runs long, Ctrl-C
during it, `/tools` after, Ctrl-C then Ctrl-D at the prompt. Prints what went wrong (and the terminal's
output) and exits 1, or exits 0.

usage: python3 pty_chat.py MARKER REAGENT ARGS...   (MARKER: a string in the tool's command line)
"""
import os
import pty
import select
import sys
import time

marker, argv = sys.argv[1], sys.argv[2:]
pid, fd = pty.fork()
if pid == 0:
    os.execv(argv[0], argv)

out = b""


def fail(what):
    print(f"{what}\n--- terminal output ---\n{out.decode(errors='replace')}")
    try:
        os.kill(pid, 9)
    except OSError:
        pass
    sys.exit(1)


def read_until(text, timeout, after=0):
    """Reads the terminal until `text` appears past byte `after`; its end."""
    global out
    end = time.time() + timeout
    while time.time() < end:
        at = out.find(text.encode(), after)
        if at >= 0:
            return at + len(text)
        ready, _, _ = select.select([fd], [], [], 0.1)
        if ready:
            try:
                chunk = os.read(fd, 4096)
            except OSError:
                chunk = b""
            if not chunk:
                break
            out += chunk
    fail(f"`{text}` did not appear within {timeout} s")


def tools_running():
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or entry == str(os.getpid()):
            continue  # this script, whose arguments name the marker
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                line = f.read().replace(b"\0", b" ")
        except OSError:
            continue
        if marker.encode() in line:
            found.append(f"{entry}: {line.decode(errors='replace')}")
    return found


def wait_for(cond, timeout, what):
    end = time.time() + timeout
    while time.time() < end:
        if cond():
            return
        time.sleep(0.05)
    fail(what)


at = read_until("> ", 120)
time.sleep(0.2)
os.write(fd, b"wait for it\r")
wait_for(tools_running, 120, "the turn's tool did not start")
os.write(fd, b"\x03")
at = read_until("[stopped; the turn is not kept]", 30, at)
wait_for(lambda: not tools_running(), 10, f"the tool outlived Ctrl-C: {tools_running()}")
at = read_until("> ", 30, at)
time.sleep(0.2)
os.write(fd, b"/tools\r")
at = read_until("slow: Sleeps for a long time.", 30, at)
at = read_until("> ", 30, at)
time.sleep(0.2)
os.write(fd, b"\x03")
at = read_until("[Ctrl-C again or Ctrl-D to leave]", 30, at)
# The next prompt: the line editor reads keys again (before it, a key can be flushed with the mode change).
at = read_until("> ", 30, at)
time.sleep(0.2)
os.write(fd, b"\x04")
end = time.time() + 30
while time.time() < end:
    # Keep reading so the child never blocks on a full terminal.
    ready, _, _ = select.select([fd], [], [], 0.1)
    if ready:
        try:
            out += os.read(fd, 4096)
        except OSError:
            pass
    done, status = os.waitpid(pid, os.WNOHANG)
    if done:
        if os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0:
            sys.exit(0)
        fail(f"chat ended with status {status}")
fail("chat did not leave at Ctrl-D")
