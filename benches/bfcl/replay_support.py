#!/usr/bin/env python3
"""Replays the single-decision profile's first-call check offline on BFCL dev-320, by halves.

One run keeps every first call and records both measures a first call can be dropped by:

    reagent eval tasks-dev-320.jsonl --model M --dry-run --parallel-calls 4 \
        --abstain-below 0 --min-support=-1000 --out keep.jsonl

A dropped first call makes the decision an answer in words (no call), which BFCL scores right exactly in
the irrelevance categories; a kept one is the run's own result. So for a measure and a threshold T, each
task's result is the run's where its first call measures at least T (or there is none) and no call
below it: the run `--min-support T` (or `--abstain-below T`) would have made. Runs are batch invariant,
so this is exact.

dev-320 is interleaved in blocks of 8 (one task per category); the tuning half is the even blocks, the
check half the odd ones (20 tasks per category each). Prints, per measure, the best thresholds on the
tuning half with both halves' `overall` (mean over the 8 categories); with --at, that threshold's
per-category figures on each half.

usage: replay_support.py TASKS.jsonl KEEP.jsonl SCORE_PY [--python PY] [--measure M --at T]
"""
import argparse
import json
import os
import sys
from collections import defaultdict

sys.path.insert(0, os.path.dirname(__file__))
from replay_proposals import wrong_ids  # noqa: E402

IRRELEVANCE = ("irrelevance", "live_irrelevance")


def category(task_id):
    return task_id.rsplit("_", 1)[0]


def least(vals):
    return min(v["with"] - v["without"] for v in vals)


# Measures of a first call: None where the run recorded nothing (no call, or not scored).
MEASURES = {
    # The model's own scores: the least supported value's log-ratio (`min_support`).
    "support": lambda r: least(r["support_values"]) if r.get("support_values") else None,
    # Word overlap with the request (`abstain_below`): the word rule this replaces.
    "grounding": lambda r: r.get("grounding"),
}


def overall(results, right, ids):
    per = defaultdict(lambda: [0, 0])
    for i in ids:
        c = per[category(i)]
        c[1] += 1
        c[0] += right(results[i])
    return 100 * sum(a / n for a, n in per.values()) / len(per), per


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("tasks")
    ap.add_argument("keep")
    ap.add_argument("score_py")
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--measure", choices=sorted(MEASURES))
    ap.add_argument("--at", type=float)
    a = ap.parse_args()
    order = [json.loads(l)["id"] for l in open(a.tasks)]
    results = {r["id"]: r for r in map(json.loads, open(a.keep))}
    order = [i for i in order if i in results]
    halves = {
        "tune": [i for n, i in enumerate(order) if (n // 8) % 2 == 0],
        "check": [i for n, i in enumerate(order) if (n // 8) % 2 == 1],
    }
    wrong = wrong_ids(a.python, a.score_py, list(results.values()))
    kept_right = {i: i not in wrong for i in results}

    def right_at(measure, t):
        def right(r):
            m = MEASURES[measure](r) if r.get("calls") else None
            if m is not None and m < t:
                return category(r["id"]) in IRRELEVANCE
            return kept_right[r["id"]]
        return right

    base = lambda r: kept_right[r["id"]]  # noqa: E731
    print(f"every first call kept: tune {overall(results, base, halves['tune'])[0]:.2f}, "
          f"check {overall(results, base, halves['check'])[0]:.2f}, "
          f"all {overall(results, base, order)[0]:.2f}  ({len(order)} tasks)")
    if a.at is not None:
        measure = a.measure or "support"
        right = right_at(measure, a.at)
        for name, ids in [*halves.items(), ("all", order)]:
            score, per = overall(results, right, ids)
            cats = " ".join(f"{c} {100 * x / n:.1f}" for c, (x, n) in sorted(per.items()))
            print(f"{measure} at {a.at}: {name} {score:.2f}  [{cats}]")
        return
    for measure in ([a.measure] if a.measure else MEASURES):
        grid = [x / 20 for x in range(0, 41)] if measure == "grounding" else [x / 4 for x in range(-16, 41)]
        rows = []
        for t in grid:
            right = right_at(measure, t)
            tune, check = overall(results, right, halves["tune"])[0], overall(results, right, halves["check"])[0]
            rows.append((tune, -abs(t), t, check, overall(results, right, order)[0]))
        rows.sort(reverse=True)
        print(f"{measure}: best on the tuning half")
        for tune, _, t, check, whole in rows[:8]:
            print(f"  T {t:>6.2f}: tune {tune:.2f}  check {check:.2f}  all {whole:.2f}")


if __name__ == "__main__":
    main()
