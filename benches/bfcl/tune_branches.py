#!/usr/bin/env python3
"""Sets the native format's branch biases from one eval run, offline.

Run the eval once with both biases large, so that every task calls and every decision makes as many calls
as `--parallel-calls` allows:

    reagent eval DEV320.jsonl --model M --dry-run --format native \
        --parallel-calls 4 --call-bias 30 --more-calls-bias 30 --out forced.jsonl

(DEV320.jsonl: the 320-task sample of the BFCL development split as a task file; it and BFCL's checker
are not part of this repository.)

Each result line then holds the first decision's calls and its logit margins before the biases: the margin
of the call-starting tokens over the best answer token at the start (`call_margin`), then after each call
the margin of the end of the turn over one more call (`stop_margins`). Under greedy decoding with biases
(c, m), a task answers when `call_margin + c < 0`, and otherwise keeps calls until the first
`stop_margin - m > 0`. Later calls do not
change earlier ones (decoding is left to right), so this replays exactly what a run with (c, m) would record.
A line's `grounding` (the share of its first call's argument values found in the user's words) adds the
third setting, `--abstain-below g`: a task whose first call has grounding below g answers instead.

The script scores every prefix of every task's calls once with BFCL's checker (score.py), then searches
the grid of (call bias, more-calls bias, abstain-below) for the best mean over categories, and prints the
table and a sweep of each setting around the best.

usage: tune_branches.py FORCED.jsonl SCORE_PY [--python PY] [--grid-step 0.5]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
from collections import defaultdict


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("forced")
    ap.add_argument("score_py")
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--grid-step", type=float, default=0.5)
    ap.add_argument("--grid-max", type=float, default=12.0)
    args = ap.parse_args()

    rows = [json.loads(l) for l in open(args.forced) if l.strip()]
    # The agent cuts a decision's calls before the first repeat (Decision::until_repeated_call).
    for r in rows:
        calls = r["calls"]
        for i in range(1, len(calls)):
            if calls[i] in calls[:i]:
                r["calls"] = calls[:i]
                r["stop_margins"] = r.get("stop_margins", [])[: i - 1]
                break
    max_calls = max(len(r["calls"]) for r in rows)
    cat = {r["id"]: r.get("category") or r["id"].rsplit("_", 1)[0] for r in rows}

    # correct[k][id]: whether the first k calls (k = 0: no call) are right.
    correct = []
    with tempfile.TemporaryDirectory() as d:
        for k in range(max_calls + 1):
            res, errs = os.path.join(d, f"k{k}.jsonl"), os.path.join(d, f"e{k}.jsonl")
            with open(res, "w") as f:
                for r in rows:
                    f.write(json.dumps({"id": r["id"], "calls": r["calls"][:k], "final_answer": None}) + "\n")
            subprocess.run([args.python, args.score_py, res, "--partial", "--errors", errs], check=True,
                           stdout=subprocess.DEVNULL)
            wrong = {json.loads(l)["id"] for l in open(errs)}
            correct.append({r["id"]: r["id"] not in wrong for r in rows})

    def outcome(r, c, m, g):
        cm, gr = r.get("call_margin"), r.get("grounding")
        if not r["calls"] or (cm is not None and cm + c < 0) or (gr is not None and gr < g):
            return 0
        k = 1
        for margin in r.get("stop_margins", []):
            if k >= len(r["calls"]) or margin - m > 0:
                break
            k += 1
        return k

    def score(c, m, g=0.0):
        per = defaultdict(lambda: [0, 0])
        for r in rows:
            per[cat[r["id"]]][0] += correct[outcome(r, c, m, g)][r["id"]]
            per[cat[r["id"]]][1] += 1
        accs = {k: v[0] / v[1] for k, v in per.items()}
        return sum(accs.values()) / len(accs), accs

    steps = int(args.grid_max / args.grid_step)
    grid = [i * args.grid_step for i in range(-steps, steps + 1)]
    gs = [0.0]
    if any(r.get("grounding") is not None for r in rows):
        gs = [i / 20 for i in range(20)]
    best = max(
        ((score(c, m, g)[0], c, m, g) for c in grid for m in grid for g in gs),
        key=lambda t: (t[0], -abs(t[1]) - abs(t[2]) - t[3]),
    )
    overall, c, m, g = best
    print(f"best: call_bias {c:+.1f}, more_calls_bias {m:+.1f}, abstain_below {g:.2f}: overall {100 * overall:.2f}")
    base, accs0 = score(0.0, 0.0)
    _, accs = score(c, m, g)
    print(f"{'category':<20}{'bias 0/0':>10}{'best':>10}")
    for k in sorted(accs):
        print(f"{k:<20}{100 * accs0[k]:>10.1f}{100 * accs[k]:>10.1f}")
    print(f"{'overall':<20}{100 * base:>10.2f}{100 * overall:>10.2f}")
    print("\ncall_bias sweep at the best other settings:")
    for cc in grid[::2]:
        print(f"  {cc:+5.1f}: {100 * score(cc, m, g)[0]:.2f}")
    print("more_calls_bias sweep at the best other settings:")
    for mm in grid[::2]:
        print(f"  {mm:+5.1f}: {100 * score(c, mm, g)[0]:.2f}")
    if len(gs) > 1:
        print("abstain_below sweep at the best biases:")
        for gg in gs:
            print(f"  {gg:.2f}: {100 * score(c, m, gg)[0]:.2f}")

if __name__ == "__main__":
    main()
