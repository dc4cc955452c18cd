#!/usr/bin/env python3
"""When2Call's development half as a `reagent eval` task file: one user turn and the item's tools, with
BFCL's types mapped to JSON Schema and dots in names made underscores, as `run_w2c.py` sends them to a
server. The id is the item's uuid.

    python3 benches/agent/w2c_tasks.py ../shared/when2call-dev/dev-150.jsonl > /tmp/w2c/tasks.jsonl
"""
import json
import sys

TYPES = {"dict": "object", "float": "number", "tuple": "array", "any": "string", "integer": "integer",
         "number": "number", "string": "string", "boolean": "boolean", "array": "array", "object": "object"}


def fix(node):
    if isinstance(node, dict):
        t = node.get("type")
        if isinstance(t, str):
            node["type"] = TYPES.get(t, "string")
        for k, v in list(node.items()):
            if k == "properties" and isinstance(v, dict):
                for p in v.values():
                    fix(p)
            elif k in ("items", "additionalProperties") and isinstance(v, dict):
                fix(v)
    return node


def function(text):
    f = json.loads(text)
    f["parameters"] = fix(f.get("parameters") or {"type": "object", "properties": {}})
    f["name"] = f["name"].replace(".", "_")
    return f


if __name__ == "__main__":
    for line in open(sys.argv[1]):
        it = json.loads(line)
        print(json.dumps({"id": it["uuid"], "messages": [{"role": "user", "content": it["question"]}],
                          "functions": [function(t) for t in it["tools"]]}))
