#!/usr/bin/env python3
"""Replays abstention by grounding offline, for variants of the grounding measure and thresholds.

Abstention turns a first decision into an answer when its first call's grounding is below a threshold, so
one run with abstention off gives every task's call. Either run the whole split with `--abstain-below 0`,
or (cheaper) take a run with abstention on and rerun only the tasks it abstained on:

    reagent eval TASKS --model M --dry-run --parallel-calls 4 --out base.jsonl
    (the ids of base.jsonl's lines without calls, as a task file: abstained.jsonl)
    reagent eval abstained.jsonl --model M --dry-run --parallel-calls 4 --abstain-below 0 --out noab.jsonl

Each task's call is then scored once with BFCL's checker; a task that abstains is right exactly in the
irrelevance categories. The grounding is recomputed here from the recorded calls (optional arguments the
request does not state are already left out of them, as the agent does before judging a call) under the
measure's parts, each on or off:

    words     a value's words as written in the user's turns (the base measure)
    numbers   numbers named in words ("zero", "twice") and months ("March" = 3); runs of digits inside
              strings matched against the numbers written or named ("2024-03-07")
    capitals  a word in capitals as the initials of capitalised words ("NY") or the start of a word ("EUR")
    forms     longer or shorter forms of words of four letters or more ("strengths" for "strength")
    empty     a call that kept no value of the ones it had (its grounding before was recorded) scores 0

and prints the mean over categories for each threshold.

usage: replay_grounding.py TASKS.jsonl BASE.jsonl [NOAB.jsonl] SCORE_PY [--python PY]
"""
import argparse
import json
import sys
from collections import defaultdict

from replay_proposals import leaves, words, written_numbers, wrong_ids

NUMBER_WORDS = {w: float(i) for i, w in enumerate(
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen "
    "seventeen eighteen nineteen twenty".split())}
NUMBER_WORDS.update({"once": 1.0, "twice": 2.0, "thrice": 3.0, "dozen": 12.0})
MONTHS = {m: float(i + 1) for i, m in enumerate(
    "january february march april may june july august september october november december".split())}


def grounding(args, text, parts):
    low = text.lower()
    known = set(words(low))
    numbers = written_numbers(low)
    named = [n for w, n in list(NUMBER_WORDS.items()) + list(MONTHS.items()) if w in known] if "numbers" in parts else []
    caps = words(text)
    initials = {"".join(w[0] for w in caps[i:i + n]).lower()
                for n in (2, 3) for i in range(len(caps) - n + 1) if all(w[0].isupper() for w in caps[i:i + n])}
    alpha = lambda w: len(w) >= 4 and w.isalpha()

    def gives(orig):
        w = orig.lower()
        if w in known:
            return True
        if "forms" in parts and alpha(w) and any(alpha(k) and (k.startswith(w) or w.startswith(k)) for k in known):
            return True
        if w.isdigit():
            return "numbers" in parts and float(w) in numbers + named
        if "capitals" in parts and 2 <= len(orig) <= 4 and orig.isascii() and orig.isalpha() and orig.isupper():
            return w in initials or any(len(k) > len(w) and k.startswith(w) and k.isalpha() for k in known)
        return False

    scores = []
    for leaf in leaves(args):
        if isinstance(leaf, (int, float)):
            if any(abs(leaf - n) <= 1e-9 * max(abs(n), 1) for n in numbers) or leaf in named:
                scores.append(1.0)
                continue
        ws = words(leaf if isinstance(leaf, str) else json.dumps(leaf))
        if ws:
            scores.append(sum(gives(w) for w in ws) / len(ws))
    return sum(scores) / len(scores) if scores else None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("tasks")
    ap.add_argument("runs", nargs="+", help="BASE.jsonl [NOAB.jsonl] SCORE_PY")
    ap.add_argument("--python", default=sys.executable)
    a = ap.parse_args()
    *runs, score_py = a.runs
    base = [json.loads(l) for l in open(runs[0]) if l.strip()]
    noab = {}
    if len(runs) > 1:
        noab = {r["id"]: r for r in (json.loads(l) for l in open(runs[1]) if l.strip())}
    rows = []
    for r in base:
        if not r["calls"] and r["id"] in noab:
            n = dict(noab[r["id"]])
            n["grounding"] = r.get("grounding") if n.get("grounding") is None else n["grounding"]
            r = n
        rows.append(r)
    tasks = {}
    for line in open(a.tasks):
        t = json.loads(line)
        tasks[t["id"]] = "\n".join(m["content"] for m in t["messages"] if m["role"] in ("user", "tool"))
    wrong = wrong_ids(a.python, score_py, [{"id": r["id"], "calls": r["calls"], "final_answer": None} for r in rows])
    thresholds = [0.3, 0.35, 0.4, 0.45, 0.5, 0.55, 0.6, 0.65, 0.7, 0.75, 0.8]
    print("parts" + "".join(f"{t:>7.2f}" for t in thresholds))
    variants = [("words",), ("words", "numbers"), ("words", "capitals"), ("words", "forms"),
                ("words", "numbers", "capitals", "forms"), ("words", "numbers", "capitals", "forms", "empty")]
    for parts in variants:
        g = {}
        for r in rows:
            if r["calls"]:
                g[r["id"]] = grounding(r["calls"][0]["arguments"], tasks[r["id"]], parts)
                if g[r["id"]] is None and "empty" in parts and r.get("grounding") is not None:
                    g[r["id"]] = 0.0
        line = "+".join(parts)
        for th in thresholds:
            per = defaultdict(lambda: [0, 0])
            for r in rows:
                abstains = not r["calls"] or (g[r["id"]] is not None and g[r["id"]] < th)
                irrelevant = "irrelevance" in r["category"]
                per[r["category"]][0] += irrelevant if abstains else r["id"] not in wrong
                per[r["category"]][1] += 1
            line += f"{100 * sum(c / n for c, n in per.values()) / len(per):>7.1f}"
        print(line)


if __name__ == "__main__":
    main()
