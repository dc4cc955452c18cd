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


def as_run(r, functions, required_only):
    """The scored values that the first call still has as it runs (unstated optional arguments are left
    out after the check), of its required parameters only where `required_only`."""
    call = r["calls"][0]
    args = call.get("arguments") or {}
    if isinstance(args, str):
        args = json.loads(args)
    spec = next((f for f in functions.get(r["id"], []) if f.get("name") == call.get("name")), {})
    required = set((spec.get("parameters") or {}).get("required") or [])
    texts = set()
    for name, v in args.items():
        if required_only and name not in required:
            continue
        stack = [v]
        while stack:
            x = stack.pop()
            if isinstance(x, dict):
                stack.extend(x.values())
            elif isinstance(x, list):
                stack.extend(x)
            elif x is not None and x != "":
                texts.add(json.dumps(x, ensure_ascii=False))
    vals = [v for v in r["support_values"] if v["value"] in texts]
    return least(vals) if vals else None


# Measures of a first call: None where the run recorded nothing (no call, or not scored).
MEASURES = {
    # The model's own scores: the least supported value's log-ratio (`min_support`).
    "support": lambda r, f: least(r["support_values"]) if r.get("support_values") else None,
    # The least share of a value's surprisal without the request that the request explains.
    "share": lambda r, f: min((v["with"] - v["without"]) / max(-v["without"], 0.5) for v in r["support_values"])
    if r.get("support_values") else None,
    # The same over the values the call keeps as it runs.
    "support_kept": lambda r, f: as_run(r, f, False) if r.get("support_values") else None,
    # The same over its required parameters' values.
    "support_required": lambda r, f: as_run(r, f, True) if r.get("support_values") else None,
    # The model's margin for calling at the start of its reply, before the call bias.
    "margin": lambda r, f: r.get("call_margin"),
    # Word overlap with the request (`abstain_below`): the word rule this replaces.
    "grounding": lambda r, f: r.get("grounding"),
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
    ap.add_argument("--pair", nargs=2, choices=sorted(MEASURES), help="drop where either is below its threshold")
    a = ap.parse_args()
    tasks = [json.loads(l) for l in open(a.tasks)]
    order = [t["id"] for t in tasks]
    functions = {t["id"]: t.get("functions") or [] for t in tasks}
    results = {r["id"]: r for r in map(json.loads, open(a.keep))}
    order = [i for i in order if i in results]
    halves = {
        "tune": [i for n, i in enumerate(order) if (n // 8) % 2 == 0],
        "check": [i for n, i in enumerate(order) if (n // 8) % 2 == 1],
    }
    wrong = wrong_ids(a.python, a.score_py, list(results.values()))
    kept_right = {i: i not in wrong for i in results}

    def right_at(measure, t, second=None):
        def right(r):
            below = False
            for name, at in [(measure, t), *([second] if second else [])]:
                m = MEASURES[name](r, functions) if r.get("calls") else None
                below |= m is not None and m < at
            if below:
                return category(r["id"]) in IRRELEVANCE
            return kept_right[r["id"]]
        return right

    def grid(measure):
        if measure == "grounding":
            return [x / 20 for x in range(0, 41)]
        if measure == "share":
            return [x / 20 for x in range(-10, 21)]
        if measure == "margin":
            return [x / 4 for x in range(-8, 25)]
        return [x / 4 for x in range(-16, 41)]

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
    if a.pair:
        x, y = a.pair
        rows = []
        for tx in grid(x):
            for ty in grid(y):
                right = right_at(x, tx, (y, ty))
                tune, check = overall(results, right, halves["tune"])[0], overall(results, right, halves["check"])[0]
                rows.append((tune, check, tx, ty))
        rows.sort(reverse=True)
        print(f"{x} and {y}: best on the tuning half")
        for tune, check, tx, ty in rows[:10]:
            print(f"  {x} {tx:>6.2f}, {y} {ty:>6.2f}: tune {tune:.2f}  check {check:.2f}")
        return
    for measure in ([a.measure] if a.measure else MEASURES):
        rows = []
        for t in grid(measure):
            right = right_at(measure, t)
            tune, check = overall(results, right, halves["tune"])[0], overall(results, right, halves["check"])[0]
            rows.append((tune, -abs(t), t, check, overall(results, right, order)[0]))
        rows.sort(reverse=True)
        print(f"{measure}: best on the tuning half")
        for tune, _, t, check, whole in rows[:8]:
            print(f"  T {t:>6.2f}: tune {tune:.2f}  check {check:.2f}  all {whole:.2f}")


if __name__ == "__main__":
    main()
