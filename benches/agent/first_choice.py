#!/usr/bin/env python3
"""Replays the run profile's first call-or-answer choice (call bias and support threshold together) on the
everyday halves and When2Call's development halves, from runs that made every free first decision call.

    python3 benches/agent/first_choice.py [--everyday HALF=KEEP ...] [--w2c KEEP] [--bias B ...] [--support T ...]

Everyday KEEP: `reagent eval tests/data/everyday_HALF.jsonl --model M --root tests/data/agent_fixture
--tools tests/data/agent_tools.toml --call-bias 100 --min-support=-1000 --out KEEP` (a real run: the file
tools' paths are decoded from what exists, which a dry run does not do). When2Call KEEP: the dry run
`benches/agent/w2c_replay.py` describes. Each line of a KEEP has the first decision's raw call margin and
its call's support, so a bias B and a threshold T give the decision the run settings would have made: a
call where margin + B > 0 and support >= T, else an answer in words. Batch invariance makes this exact.

Everyday: the first choice is right when an answer-kind task made no call and a call-kind task's first
call is of the expected tool (the answer itself is not scored here: run the set with the chosen settings
for that). When2Call: balanced, as `w2c_replay.py` scores it.
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
from w2c_replay import replay_rows, score  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))


def everyday_rows(half, keep):
    tasks = {}
    for line in open(os.path.join(REPO, "tests", "data", f"everyday_{half}.jsonl")):
        if line.strip():
            t = json.loads(line)
            tasks[t["id"]] = t
    rows = []
    for line in open(keep):
        if not line.strip():
            continue
        r = json.loads(line)
        t = tasks[r["id"]]
        expected = (t.get("expected") or [None])[0] or t.get("first_call")
        called = r["calls"][0]["name"] if r["calls"] else None
        rows.append((t["behaviour"], expected and expected["name"], called, r.get("call_margin"), r.get("support")))
    return rows


def everyday_score(rows, bias, support):
    right = 0
    for behaviour, expected, called, margin, sup in rows:
        # A forced first call (no margin) stands whatever the settings.
        if margin is not None and called is not None:
            if margin + bias <= 0 or (sup is not None and sup < support):
                called = None
        if behaviour == "answer":
            right += called is None
        else:
            right += called is not None and (expected is None or called == expected)
    return right


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--everyday", action="append", default=[], metavar="HALF=KEEP")
    ap.add_argument("--w2c", metavar="KEEP")
    ap.add_argument("--w2c-dev", default=os.path.join(REPO, "..", "shared", "when2call-dev", "dev-150.jsonl"))
    ap.add_argument("--bias", type=float, action="append")
    ap.add_argument("--support", type=float, action="append")
    a = ap.parse_args()
    everyday = {}
    for spec in a.everyday:
        half, keep = spec.split("=", 1)
        everyday[half] = everyday_rows(half, keep)
    w2c = replay_rows(a.w2c_dev, a.w2c) if a.w2c else []
    biases = a.bias or [0.0, -1.0, -2.0, -3.0, -3.75]
    supports = a.support or [0.4, 0.6, 0.8, 1.0, 1.2, 1.4, 1.6, 2.0]
    w2c_halves = ["tune", "check"] if w2c else []
    head = [f"everyday {h} (/{len(r)})" for h, r in everyday.items()] + [f"w2c {h}" for h in w2c_halves]
    print("bias   support  " + "  ".join(head))
    for b in biases:
        for s in supports:
            cells = [f"{everyday_score(r, b, s):>{len(h)}}" for (h, r) in zip(head, everyday.values())]
            cells += [f"{score(w2c, b, 'non-default', s, h)[0]:>{len(f'w2c {h}')}.1f}" for h in w2c_halves]
            print(f"{b:+6.2f} {s:7.2f}  " + "  ".join(cells))


if __name__ == "__main__":
    main()
