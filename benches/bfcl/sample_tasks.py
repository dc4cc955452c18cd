#!/usr/bin/env python3
"""Draws a second sample of the BFCL development split, apart from `tasks-dev-320.jsonl`.

Settings tuned on the 320 tasks are checked on another 40 tasks of each of the 8 scored categories,
drawn from `tasks-dev.jsonl` without the 320 (fixed seed), interleaved like the 320 so that a run cut
short stays balanced. The acceptance ids are not in `tasks-dev.jsonl` at all.

usage: sample_tasks.py BFCL_DEV_DIR OUT.jsonl [--per-category 40] [--seed 2026]
"""
import argparse
import collections
import json
import os
import random

CATEGORIES = ["simple_python", "multiple", "parallel", "parallel_multiple", "irrelevance", "live_simple",
              "live_multiple", "live_irrelevance"]


def category(task_id):
    # Longest first: `parallel_multiple_…` is not `parallel_…`, `multiple_…` is not `live_multiple_…`.
    for c in sorted(CATEGORIES, key=len, reverse=True):
        if task_id.startswith(c + "_"):
            return c
    return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("bfcl_dev")
    ap.add_argument("out")
    ap.add_argument("--per-category", type=int, default=40)
    ap.add_argument("--seed", type=int, default=2026)
    a = ap.parse_args()
    taken = {json.loads(l)["id"] for l in open(os.path.join(a.bfcl_dev, "tasks-dev-320.jsonl"))}
    by = collections.defaultdict(list)
    for line in open(os.path.join(a.bfcl_dev, "tasks-dev.jsonl")):
        t = json.loads(line)
        c = category(t["id"])
        if c and t["id"] not in taken:
            by[c].append(t)
    rng = random.Random(a.seed)
    picks = {c: rng.sample(by[c], a.per_category) for c in CATEGORIES}
    with open(a.out, "w") as f:
        for k in range(a.per_category):
            for c in CATEGORIES:
                f.write(json.dumps(picks[c][k]) + "\n")


if __name__ == "__main__":
    main()
