#!/usr/bin/env python3
"""A tiny MCP server over stdio for reagent's tests, well-behaved or not (the first argument says how).

Modes:
  ok           answers like a server should: tools `echo` (a message back), `shout` (upper case), `loose`
               (a schema llguidance cannot compile), `fail` (a result with isError), `slow` (sleeps for
               its `seconds` argument), `die` (exits in the middle of the call), `hang` (never answers)
  exit         exits before answering anything
  hang-init    never answers `initialize`
  garbage      answers `initialize` with a line that is not JSON
  bad-list     answers `tools/list` with a result that is not a tool list
"""

import json
import sys
import time

MODE = sys.argv[1] if len(sys.argv) > 1 else "ok"

TOOLS = [
    {
        "name": "echo",
        "description": "Returns the message.",
        "inputSchema": {
            "type": "object",
            "properties": {"message": {"type": "string"}},
            "required": ["message"],
        },
    },
    {
        "name": "shout",
        "description": "Returns the text in upper case.",
        "inputSchema": {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]},
    },
    {
        "name": "loose",
        "description": "Takes anything; its schema uses a pattern llguidance's regex dialect refuses.",
        "inputSchema": {
            "type": "object",
            "properties": {"word": {"type": "string", "pattern": "^(?=a)\\w+$"}},
            "required": ["word"],
        },
    },
    {"name": "fail", "description": "Always fails.", "inputSchema": {"type": "object", "properties": {}}},
    {
        "name": "slow",
        "description": "Sleeps.",
        "inputSchema": {"type": "object", "properties": {"seconds": {"type": "number"}}, "required": ["seconds"]},
    },
    {"name": "die", "description": "Exits mid-call.", "inputSchema": {"type": "object", "properties": {}}},
    {"name": "hang", "description": "Never answers.", "inputSchema": {"type": "object", "properties": {}}},
]


def send(obj):
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def text(t, error=False):
    return {"content": [{"type": "text", "text": t}], "isError": error}


def main():
    if MODE == "exit":
        sys.exit(3)
    for line in sys.stdin:
        msg = json.loads(line)
        method, mid = msg.get("method"), msg.get("id")
        if mid is None:
            continue  # a notification
        if method == "initialize":
            if MODE == "hang-init":
                time.sleep(3600)
            if MODE == "garbage":
                sys.stdout.write("this is not JSON-RPC\n")
                sys.stdout.flush()
                continue
            send({
                "jsonrpc": "2.0",
                "id": mid,
                "result": {
                    "protocolVersion": msg["params"]["protocolVersion"],
                    "capabilities": {"tools": {}},
                    "serverInfo": {"name": "misbehaving", "version": "0"},
                },
            })
        elif method == "tools/list":
            if MODE == "bad-list":
                send({"jsonrpc": "2.0", "id": mid, "result": {"tools": "none"}})
            else:
                send({"jsonrpc": "2.0", "id": mid, "result": {"tools": TOOLS}})
        elif method == "tools/call":
            name, args = msg["params"]["name"], msg["params"].get("arguments") or {}
            if name == "echo":
                result = text(args["message"])
            elif name == "shout":
                result = text(args["text"].upper())
            elif name == "loose":
                result = text("word: " + str(args.get("word")))
            elif name == "fail":
                result = text("this tool always fails", error=True)
            elif name == "slow":
                time.sleep(float(args["seconds"]))
                result = text("done")
            elif name == "die":
                sys.exit(1)
            elif name == "hang":
                time.sleep(3600)
                continue
            else:
                send({"jsonrpc": "2.0", "id": mid, "error": {"code": -32602, "message": "unknown tool " + name}})
                continue
            send({"jsonrpc": "2.0", "id": mid, "result": result})
        elif method == "ping":
            send({"jsonrpc": "2.0", "id": mid, "result": {}})
        else:
            send({"jsonrpc": "2.0", "id": mid, "error": {"code": -32601, "message": "no method " + method}})


if __name__ == "__main__":
    main()
