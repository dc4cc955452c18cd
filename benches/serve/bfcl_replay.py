#!/usr/bin/env python3
"""Replays BFCL task files as chat-completion requests against any OpenAI-compatible server.

Usage:
  python bfcl_replay.py URL TASKS.jsonl OUT.jsonl [--limit N] [--api-key K] [--system TEXT]

Each task's messages and functions become one request (tools, tool_choice auto, temperature 0); the calls
that come back are written as `{"id", "calls": [{"name", "arguments"}], "seconds", "status"}` lines,
with the usage the server reports and any text answer; BFCL's checker reads them (`score.py OUT.jsonl --partial`). A request that fails (HTTP error, a call whose
arguments are not JSON) records no calls and its status. Prints the mean and median seconds per request.
"""
import argparse
import json
import statistics
import time
import urllib.error
import urllib.request


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("url")
    ap.add_argument("tasks")
    ap.add_argument("out")
    ap.add_argument("--limit", type=int, default=None)
    ap.add_argument("--api-key", default=None)
    ap.add_argument("--model", default="local")
    ap.add_argument("--system", default=None,
                    help="a system message put first where a task has none (llama-cpp-python's "
                         "chatml-function-calling lists the tools only inside a system message)")
    a = ap.parse_args()
    tasks = [json.loads(l) for l in open(a.tasks)][: a.limit]
    times, failed = [], 0
    with open(a.out, "w") as out:
        for t in tasks:
            messages = t["messages"]
            if a.system is not None and not any(m["role"] == "system" for m in messages):
                messages = [{"role": "system", "content": a.system}] + messages
            body = {
                "model": a.model,
                "messages": messages,
                "tools": [{"type": "function", "function": f} for f in t["functions"]],
                "tool_choice": "auto",
                "temperature": 0,
                "max_tokens": 512,
            }
            req = urllib.request.Request(a.url.rstrip("/") + "/chat/completions", json.dumps(body).encode(),
                                         {"Content-Type": "application/json"})
            if a.api_key:
                req.add_header("Authorization", "Bearer " + a.api_key)
            t0 = time.perf_counter()
            calls, status, usage, content = [], 200, {}, None
            try:
                with urllib.request.urlopen(req, timeout=600) as r:
                    resp = json.load(r)
                usage = resp.get("usage") or {}
                content = resp["choices"][0]["message"].get("content")
                for c in resp["choices"][0]["message"].get("tool_calls") or []:
                    try:
                        args = json.loads(c["function"]["arguments"])
                    except (ValueError, TypeError):
                        status = "arguments not JSON"
                        continue
                    calls.append({"name": c["function"]["name"], "arguments": args})
            except urllib.error.HTTPError as e:
                status = e.code
            except Exception as e:  # a dropped connection, a server that died
                status = repr(e)
            dt = time.perf_counter() - t0
            times.append(dt)
            failed += status != 200
            out.write(json.dumps({"id": t["id"], "calls": calls, "seconds": round(dt, 3), "status": status,
                                  "prompt_tokens": usage.get("prompt_tokens"),
                                  "completion_tokens": usage.get("completion_tokens"), "content": content}) + "\n")
            out.flush()
    print(json.dumps({"requests": len(tasks), "failed": failed, "mean_s": round(statistics.mean(times), 3),
                      "median_s": round(statistics.median(times), 3)}))


if __name__ == "__main__":
    main()
