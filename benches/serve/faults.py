#!/usr/bin/env python3
"""Hostile clients against a running `reagent serve`, on loopback, bounded in count and time.

    python3 benches/serve/faults.py http://127.0.0.1:PORT --pid PID --client-timeout SECS

The server is started with `--client-timeout SECS` (the same number). Each fault is run several times
at once: heads and bodies trickled a byte at a time, hundreds of idle connections, streamed answers
the client stops reading, clients that leave at every stage of a request. After each: the server
answers /health and a chat request. At the end: its queue is empty, its resident memory is within
1.5x of what it was idle after a first request, and it is still running. Exits 1 naming what failed.
Standard library only.
"""
import argparse
import json
import os
import select
import socket
import sys
import threading
import time
import urllib.request

ap = argparse.ArgumentParser()
ap.add_argument("base", help="http://127.0.0.1:PORT")
ap.add_argument("--pid", type=int, required=True, help="the server's process id (for its memory)")
ap.add_argument("--client-timeout", type=float, required=True, help="the server's --client-timeout")
ap.add_argument("--idle", type=int, default=300, help="idle connections held at once")
args = ap.parse_args()

host, port = args.base.split("//", 1)[1].split(":")
port = int(port.rstrip("/"))
T = args.client_timeout
SLACK = 10.0  # seconds past the server's timeout before a fault counts as not bounded
failures = []


def fail(what):
    print(f"FAIL {what}", flush=True)
    failures.append(what)


def rss_kib():
    with open(f"/proc/{args.pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def connect(rcvbuf=None):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if rcvbuf:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    s.settimeout(T + SLACK)
    s.connect((host, port))
    return s


def request(path, body=None, timeout=120):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(args.base.rstrip("/") + path, data=data,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


CHAT = {"messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 8, "temperature": 0}
LONG = {"messages": [{"role": "user", "content": "Count from one to one thousand in words."}],
        "max_tokens": 1500, "temperature": 0, "stream": True}


def healthy(after):
    t = time.time()
    try:
        status, _ = request("/health", timeout=T + SLACK)
    except OSError as e:
        return fail(f"{after}: /health did not answer ({e})")
    if status != 200:
        return fail(f"{after}: /health answered {status}")
    for _ in range(200):  # a 429 while the model finishes a cancelled generation is fine; then 200
        status, body = request("/v1/chat/completions", CHAT)
        if status != 429:
            break
        time.sleep(0.1)
    if status != 200:
        return fail(f"{after}: a chat request answered {status}: {body[:200]}")
    print(f"ok   {after}: healthy ({time.time() - t:.1f} s)", flush=True)


def closed_within(s, limit):
    """Reads until the server closes: (what arrived, seconds) or (what arrived, None) if it did not."""
    t = time.time()
    got = b""
    s.settimeout(0.5)
    while time.time() - t < limit:
        try:
            chunk = s.recv(65536)
        except socket.timeout:
            continue
        except OSError:
            return got, time.time() - t
        if not chunk:
            return got, time.time() - t
        got += chunk
    return got, None


def together(n, fn):
    out = [None] * n
    def run(i):
        try:
            out[i] = fn(i)
        except Exception as e:  # a fault script reports, it does not stop
            out[i] = e
    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    return out


def trickled_head(_):
    s = connect()
    head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n" + b"X-Pad: " + b"a" * 4000
    t = time.time()
    try:
        for b in head:
            s.send(bytes([b]))
            time.sleep(0.1)
            if time.time() - t > T + SLACK:
                return None
    except OSError:
        return time.time() - t  # closed while we were still sending
    _, secs = closed_within(s, T + SLACK)
    return secs


def trickled_body(_):
    s = connect()
    body = json.dumps(CHAT).encode()
    s.send(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
           + f"Content-Length: {len(body)}\r\n\r\n".encode())
    t = time.time()
    try:
        for b in body:
            if select.select([s], [], [], 0)[0]:
                break  # the server answered before the body ended: read it
            s.send(bytes([b]))
            time.sleep(0.5)
            if time.time() - t > T + SLACK:
                return None, b""
    except OSError:
        return time.time() - t, b""
    got, secs = closed_within(s, T + SLACK)
    return (None if secs is None else time.time() - t), got


def stalled_reader(_):
    s = connect(rcvbuf=4096)
    body = json.dumps(LONG).encode()
    s.send(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
           + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
    first = s.recv(512)  # the head and maybe a chunk; then nothing more is read
    time.sleep(T + SLACK)
    return first


def leave_at(stage):
    def go(_):
        s = connect()
        body = json.dumps(LONG if stage == "mid-stream" else dict(CHAT, max_tokens=200)).encode()
        head = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                + f"Content-Length: {len(body)}\r\n\r\n".encode())
        if stage == "in the head":
            s.send(head[:20])
        elif stage == "after the head":
            s.send(head)
        elif stage == "in the body":
            s.send(head + body[: len(body) // 2])
        elif stage == "before the answer":
            s.send(head + body)
        elif stage == "mid-stream":
            s.send(head + body)
            s.recv(4096)
        time.sleep(0.05)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")  # reset
        s.close()
    return go


# Warm up: the first request loads what a request needs; then the idle memory is read.
status, body = request("/v1/chat/completions", CHAT)
if status != 200:
    sys.exit(f"the server does not answer a chat request: {status} {body[:200]}")
idle_rss = rss_kib()
print(f"idle after a first request: {idle_rss / 1024:.0f} MiB", flush=True)

secs = together(20, trickled_head)
bad = [s for s in secs if not isinstance(s, float)]
if bad:
    fail(f"trickled heads: {len(bad)}/20 kept open past {T + SLACK:.0f} s ({bad[:3]})")
else:
    print(f"ok   trickled heads: 20/20 closed, at most {max(secs):.1f} s", flush=True)
healthy("trickled heads")

res = together(20, trickled_body)
bad = [r for r in res if not isinstance(r, tuple) or r[0] is None]
if bad:
    fail(f"trickled bodies: {len(bad)}/20 kept open past {T + SLACK:.0f} s ({bad[:3]})")
else:
    answered = sum(1 for _, got in res if got.startswith(b"HTTP/1.1 408"))
    print(f"ok   trickled bodies: 20/20 closed ({answered} with 408), at most {max(r[0] for r in res):.1f} s",
          flush=True)
healthy("trickled bodies")

idle = []
try:
    for _ in range(args.idle):
        idle.append(connect())
except OSError as e:
    fail(f"idle connections: only {len(idle)} opened ({e})")
healthy(f"{len(idle)} idle connections open")
open_after = 0
for s in idle:
    _, secs = closed_within(s, T + SLACK)
    open_after += secs is None
    s.close()
if open_after:
    fail(f"idle connections: {open_after}/{len(idle)} still open past {T + SLACK:.0f} s")
else:
    print(f"ok   idle connections: {len(idle)}/{len(idle)} closed by the server", flush=True)

firsts = together(3, stalled_reader)
bad = [f for f in firsts if not isinstance(f, bytes)]
if bad:
    fail(f"stalled readers: {bad[:3]}")
healthy("3 clients that stopped reading streamed answers")

for stage in ["in the head", "after the head", "in the body", "before the answer", "mid-stream"]:
    res = together(5, leave_at(stage))
    errors = [r for r in res if isinstance(r, Exception)]
    if errors:
        print(f"note clients leaving {stage}: {errors[:2]}", flush=True)
    healthy(f"5 clients leaving {stage}")

# The queue drains, memory is bounded, the process runs.
for _ in range(120):
    _, metrics = request("/metrics")
    depth = [l for l in metrics.splitlines() if l.startswith("reagent_queue_depth")]
    if depth and depth[0].split()[-1] == "0":
        break
    time.sleep(0.5)
else:
    fail(f"the queue did not drain: {depth}")
rss = rss_kib()
print(f"resident memory: {rss / 1024:.0f} MiB (idle {idle_rss / 1024:.0f} MiB, {rss / idle_rss:.2f}x)", flush=True)
if rss > 1.5 * idle_rss:
    fail(f"resident memory {rss / 1024:.0f} MiB is over 1.5x the idle {idle_rss / 1024:.0f} MiB")
if not os.path.exists(f"/proc/{args.pid}"):
    fail("the server exited")
if failures:
    sys.exit(f"{len(failures)} fault(s) failed: " + "; ".join(failures))
print("all faults bounded; the server is healthy")
