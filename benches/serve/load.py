#!/usr/bin/env python3
"""Load and abuse against an OpenAI-compatible server.

Usage:
  python load.py URL [--clients 8] [--requests 25] [--malformed 200]

1. `clients` threads each send `requests` requests, alternating a plain chat request and one with tools
   (tool_choice required); reports errors, p50/p99 latency and requests per second.
2. `malformed` bad requests (bad JSON, wrong types, a 10 MB body, 5,000 tools, unknown roles, invalid
   schemas), each expected to be answered 400; then one good request, which must succeed.
Exits non-zero on any error.
"""
import argparse
import json
import statistics
import sys
import threading
import time
import urllib.error
import urllib.request

TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Current weather of a city",
          "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]


def post(url, body, timeout=600):
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    req = urllib.request.Request(url + "/chat/completions", data, {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.load(r)
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")
    except Exception as e:
        return None, repr(e)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("url")
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--requests", type=int, default=25)
    ap.add_argument("--malformed", type=int, default=200)
    a = ap.parse_args()
    url = a.url.rstrip("/")
    lat, errors, lock = [], [], threading.Lock()

    def client(k):
        for i in range(a.requests):
            body = {"messages": [{"role": "user", "content": f"Client {k}, request {i}: what is the weather in Paris?"}],
                    "max_tokens": 32, "temperature": 0}
            if i % 2:
                body |= {"tools": TOOLS, "tool_choice": "required"}
            t0 = time.perf_counter()
            status, r = post(url, body)
            dt = time.perf_counter() - t0
            with lock:
                lat.append(dt)
                if status != 200:
                    errors.append((status, str(r)[:200]))
                elif i % 2 and not r["choices"][0]["message"].get("tool_calls"):
                    errors.append(("no tool call", str(r)[:200]))

    t0 = time.perf_counter()
    threads = [threading.Thread(target=client, args=(k,)) for k in range(a.clients)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    wall = time.perf_counter() - t0
    lat.sort()
    p = lambda q: lat[min(len(lat) - 1, int(q * len(lat)))]
    report = {"requests": len(lat), "errors": len(errors), "p50_s": round(p(0.5), 3), "p99_s": round(p(0.99), 3),
              "requests_per_s": round(len(lat) / wall, 2)}

    user = [{"role": "user", "content": "hi"}]
    bad = [
        b"{not json", b"", b"[]", json.dumps({"messages": "hi"}).encode(),
        json.dumps({"messages": [{"role": "wizard", "content": "x"}]}).encode(),
        json.dumps({"messages": user, "temperature": "hot"}).encode(),
        json.dumps({"messages": user, "max_tokens": 0}).encode(),
        json.dumps({"messages": user, "tools": [{"type": "function", "function": {"name": f"t{i}"}} for i in range(5000)]}).encode(),
        json.dumps({"messages": user, "tools": [{"type": "function", "function": {"name": "f",
                    "parameters": {"type": "object", "properties": {"x": {"type": 7}}}}}]}).encode(),
        json.dumps({"messages": user, "tool_choice": "required"}).encode(),
        b" " * (10 << 20),
    ]
    statuses = {}
    for i in range(a.malformed):
        status, _ = post(url, bad[i % len(bad)])
        statuses[str(status)] = statuses.get(str(status), 0) + 1
    report["malformed"] = statuses
    status, _ = post(url, {"messages": user, "max_tokens": 4})
    report["after"] = status
    print(json.dumps(report))
    ok = not errors and statuses == {"400": a.malformed} and status == 200
    for e in errors[:5]:
        print("error:", e, file=sys.stderr)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
