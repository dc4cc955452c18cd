#!/usr/bin/env python3
"""Per-kind results of `reagent eval` result files side by side: tasks right and seconds per task.

    benches/agent/compare.py NAME=RESULTS.jsonl [NAME=RESULTS.jsonl ...]

The kinds are the task categories (the id without its number). Prints a markdown table.
"""
import json
import sys
from collections import defaultdict


def load(path):
    by = defaultdict(lambda: [0, 0, 0.0])
    for line in open(path):
        r = json.loads(line)
        k = by[r["category"]]
        k[0] += bool(r.get("correct"))
        k[1] += 1
        k[2] += r.get("seconds", 0.0)
    return by


def main():
    runs = [(a.split("=", 1)[0], load(a.split("=", 1)[1])) for a in sys.argv[1:]]
    kinds = sorted({k for _, by in runs for k in by})
    print("| kind | " + " | ".join(f"{n} right | {n} s/task" for n, _ in runs) + " |")
    print("|---|" + "---|---|" * len(runs))
    for k in kinds + ["total"]:
        cells = []
        for _, by in runs:
            if k == "total":
                right, n, s = (sum(v[i] for v in by.values()) for i in range(3))
            else:
                right, n, s = by.get(k, [0, 0, 0.0])
            cells.append(f"{right}/{n} | {s / max(n, 1):.1f}")
        print(f"| {k} | " + " | ".join(cells) + " |")


main()
