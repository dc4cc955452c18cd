#!/usr/bin/env python3
"""Scores `reagent eval` result lines of the everyday sets (tests/data/everyday_{tune,check}.jsonl).

A task is right when the behaviour is (an answer-only kind made no call; a call kind's first call is of
the expected tool) and the final answer holds every expected word (case-insensitive). Exact argument
strings are not compared: a calculator written `13*17` or `17 * 13` is as right as `13 * 17`.

    python3 benches/agent/everyday.py TASKS.jsonl RESULTS.jsonl [RESULTS2.jsonl]

With two result files, prints both side by side and the tasks whose verdict changed.
"""
import json
import sys
from collections import defaultdict


def load(path):
    return [json.loads(line) for line in open(path) if line.strip()]


def verdict(task, result):
    calls = result.get("calls") or []
    answer = (result.get("final_answer") or "").lower()
    expected = task.get("expected")
    if task.get("behaviour") == "answer":
        behaviour = not calls
    elif expected:
        behaviour = bool(calls) and calls[0]["name"] == expected[0]["name"]
    else:
        first = task.get("first_call")
        behaviour = bool(calls) and (first is None or calls[0]["name"] == first["name"])
    words = task.get("expected_answer") or []
    words = [words] if isinstance(words, str) else words
    answered = result.get("stop_reason") == "final_answer"
    return behaviour and answered and all(w.lower() in answer for w in words)


def score(tasks, results):
    by_id = {r["id"]: r for r in results}
    per_kind = defaultdict(lambda: [0, 0])
    right = {}
    secs = []
    for t in tasks:
        r = by_id.get(t["id"])
        if r is None:
            continue
        ok = verdict(t, r)
        right[t["id"]] = ok
        per_kind[t["category"]][0] += ok
        per_kind[t["category"]][1] += 1
        secs.append(r.get("seconds", 0.0))
    return per_kind, right, secs


def main():
    tasks = load(sys.argv[1])
    runs = [score(tasks, load(p)) for p in sys.argv[2:]]
    kinds = sorted({k for pk, _, _ in runs for k in pk})
    for k in kinds:
        cells = [f"{pk[k][0]:>3}/{pk[k][1]:<3}" for pk, _, _ in runs]
        print(f"{k:<10} " + "  ".join(cells))
    totals = []
    for pk, right, secs in runs:
        n = sum(v[1] for v in pk.values())
        totals.append(f"{sum(right.values()):>3}/{n:<3} {sum(secs) / max(len(secs), 1):.2f} s/task")
    print(f"{'all':<10} " + "  ".join(totals))
    if len(runs) == 2:
        a, b = runs[0][1], runs[1][1]
        for i in a:
            if i in b and a[i] != b[i]:
                print(f"  {i}: {'right' if a[i] else 'wrong'} -> {'right' if b[i] else 'wrong'}")


if __name__ == "__main__":
    main()
