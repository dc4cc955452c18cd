#!/usr/bin/env python3
"""Replays `min_support` offline on the everyday sets from two `reagent eval` runs of one model.

    python3 benches/agent/support_replay.py TASKS.jsonl KEPT.jsonl DROPPED.jsonl [--at T]

KEPT: a run with `--min-support=-1000` (every first call's support is measured and recorded, with its
values' scores, and the call kept). DROPPED: the same run with `--min-support=1000` (every free first
call dropped, the step answered in words). Runs are batch-invariant, so the two agree up to the first
decision; a threshold T then gives, per task, KEPT's result where the call's measure is at least T and
DROPPED's below it: the run that `--min-support T` would have made. Prints each measure's best
thresholds by the everyday score (benches/agent/everyday.py); with --at, that threshold's per-kind table.
--scores RUN.jsonl takes the values' scores from another run of the same first decisions (a
`--max-steps 1` run of a later build that scores differently).
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
from everyday import load, score  # noqa: E402


def least(vals):
    return min(v["with"] - v["without"] for v in vals)


# Measures of a call's support from its values' scores ({value, with, without}).
MEASURES = {
    # The shipped one: the least supported value's log-ratio.
    "pmi": least,
    # The share of the value's surprisal without the request that the request explains.
    "share": lambda vals: min((v["with"] - v["without"]) / max(-v["without"], 0.5) for v in vals),
    # The least supported value's log-probability with the request, where the request did not lower it.
    "pmi+conf": lambda vals: min(max(v["with"] - v["without"], 2.0 + v["with"] if v["with"] >= v["without"] else -9.0)
                                 for v in vals),
}


def replay(tasks, kept, dropped, measure, t):
    by_kept = {r["id"]: r for r in kept}
    by_dropped = {r["id"]: r for r in dropped}
    out = []
    for task in tasks:
        k = by_kept.get(task["id"])
        if k is None:
            continue
        vals = k.get("support_values") or []
        if vals and MEASURES[measure](vals) < t and task["id"] in by_dropped:
            out.append(by_dropped[task["id"]])
        else:
            out.append(k)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("tasks")
    ap.add_argument("kept")
    ap.add_argument("dropped")
    ap.add_argument("--at", type=float)
    ap.add_argument("--measure", default="pmi", choices=sorted(MEASURES))
    ap.add_argument("--scores")
    a = ap.parse_args()
    tasks, kept, dropped = load(a.tasks), load(a.kept), load(a.dropped)
    if a.scores:
        scores = {r["id"]: r.get("support_values") or [] for r in load(a.scores)}
        kept = [dict(r, support_values=scores.get(r["id"], [])) for r in kept]
    if a.at is not None:
        per_kind, right, _ = score(tasks, replay(tasks, kept, dropped, a.measure, a.at))
        for k in sorted(per_kind):
            print(f"{k:<10} {per_kind[k][0]:>3}/{per_kind[k][1]}")
        print(f"{'all':<10} {sum(right.values()):>3}/{len(right)}")
        return
    for name in MEASURES:
        rows = []
        for t in [x / 4 for x in range(-12, 61)]:
            _, right, _ = score(tasks, replay(tasks, kept, dropped, name, t))
            rows.append((sum(right.values()), -abs(t), t))
        rows.sort(reverse=True)
        print(f"{name:<9} " + "  ".join(f"{r}@{t:g}" for r, _, t in rows[:6]))
    _, never, _ = score(tasks, kept)
    _, always, _ = score(tasks, dropped)
    print(f"never dropped {sum(never.values())}, always dropped {sum(always.values())} (of {len(never)})")


if __name__ == "__main__":
    main()
