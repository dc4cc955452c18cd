#!/usr/bin/env python3
"""Replays proposed calls (`--propose-more-calls`, `AgentConfig::propose_more_calls`) offline.

A proposal is the model continuing its reply with one more call after it chose to stop; the agent keeps it
when it is a new item of the request (src/agent/grounding/, `is_new_requested_item`) and proposes again.
Under greedy decoding that continuation is the same text a run with a large more-calls bias produces, so
one run with the more-calls bias high and abstention off:

    reagent eval DEV320.jsonl --model M --dry-run --parallel-calls 4 \
        --more-calls-bias 40 --abstain-below 0 --out forced.jsonl

(DEV320.jsonl: the 320-task sample of the BFCL development split as a task file; it and BFCL's checker
are not part of this repository.)

holds, for every task, the calls the model makes by itself (those before the first `stop_margin` above the
run's more-calls bias, here 13) followed by its proposals. The script scores every prefix of every task's
calls with BFCL's checker, then prints the per-category accuracy of the defaults without proposals and
with them (abstention at `--abstain-below`, on the first call's grounding, after the proposals).

The test replayed here is the rule's first version, with which it was set (words as written, the call as
the model wrote it). The current rule in src/agent/grounding/ also judges the call as it will run (unstated
optional arguments left out), grounds new values leniently (as `Evidence::grounding`), and keeps a call to
another tool that the request names by a word of its name; it was measured by live runs (README).

usage: replay_proposals.py FORCED.jsonl TASKS.jsonl SCORE_PY [--python PY] [--more-calls-bias 13]
       [--abstain-below 0.45]
"""
import argparse
import collections
import json
import os
import re
import subprocess
import tempfile


def words(s):
    """Runs of digits and runs of other alphanumerics, as `words` in src/agent/grounding/reading.rs."""
    out, cur, kind = [], "", None
    for c in s + " ":
        k = "d" if c.isnumeric() else "l" if c.isalnum() else None
        if k != kind:
            if kind is not None:
                out.append(cur)
            cur, kind = "", k
        if k is not None:
            cur += c
    return out


def leaves(v):
    if isinstance(v, dict):
        return [x for y in v.values() for x in leaves(y)]
    if isinstance(v, list):
        return [x for y in v for x in leaves(y)]
    if v is None or isinstance(v, bool) or v == "":
        return []
    return [v]


def leaf_words(v):
    return words(v.lower() if isinstance(v, str) else json.dumps(v))


NUMBER = re.compile(r"(?<![\w.])(\d+(?:,\d{3}(?!\d))*(?:\.\d+)?)(\s*(?:%|percent))?")


SCALE = re.compile(r"\s*(thousand|million|billion|trillion)(?![a-z0-9])")
SCALES = {"thousand": 1e3, "million": 1e6, "billion": 1e9, "trillion": 1e12}


def written_numbers(text):
    """`written_numbers` in src/agent/grounding/reading.rs: separators, percentages as fractions too, scale words."""
    out = []
    for m in NUMBER.finditer(text):
        x = float(m.group(1).replace(",", ""))
        out.append(x)
        if m.group(2):
            out.append(x / 100)
        scale = SCALE.match(text, m.end(1))
        if scale:
            out.append(x * SCALES[scale.group(1)])
    return out


def is_new_requested_item(call, earlier, text):
    if call in earlier:
        return False
    known, numbers = set(words(text)), written_numbers(text)

    def written(leaf):
        return isinstance(leaf, (int, float)) and any(abs(leaf - n) <= 1e-9 * max(abs(n), 1) for n in numbers)

    def found(leaf):
        """How many of the leaf's words occur in the text, and of how many."""
        ws = leaf_words(leaf)
        return sum(w in known or (not w.isascii() and w in text) for w in ws), len(ws)

    def grounds(leaf):
        hits, words_ = found(leaf)
        return written(leaf) or hits == words_

    def mostly_grounds(leaf):
        hits, words_ = found(leaf)
        return written(leaf) or (hits > 0 and 2 * hits >= words_)

    used = {w for e in earlier for l in leaves(e["arguments"]) for w in leaf_words(l)}
    new = [l for l in leaves(call["arguments"]) if leaf_words(l) and not set(leaf_words(l)) <= used]
    if not new or not all(grounds(l) for l in new):
        return False
    for e in earlier:
        if e["name"] != call["name"]:
            continue
        before, now = e["arguments"], call["arguments"]
        if not isinstance(before, dict) or not isinstance(now, dict):
            return False
        changed = [v for k, v in before.items() if k in now and now[k] != v]
        if not changed or not all(mostly_grounds(l) for v in changed for l in leaves(v)):
            return False
    return True


def grounding(call, text):
    known, scores = set(words(text)), []
    for l in leaves(call["arguments"]):
        ws = leaf_words(l)
        if ws:
            scores.append(sum(w in known or (not w.isascii() and w in text) for w in ws) / len(ws))
    return sum(scores) / len(scores) if scores else None


def wrong_ids(python, score_py, lines):
    """The ids BFCL's checker scores wrong among result `lines` (dicts)."""
    with tempfile.TemporaryDirectory() as d:
        path, errs = os.path.join(d, "r.jsonl"), os.path.join(d, "e.jsonl")
        with open(path, "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in lines)
        subprocess.run([python, score_py, path, "--partial", "--errors", errs], check=True, capture_output=True)
        return {json.loads(l)["id"] for l in open(errs)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("forced")
    ap.add_argument("tasks")
    ap.add_argument("score_py")
    ap.add_argument("--python", default="python3")
    ap.add_argument("--more-calls-bias", type=float, default=13.0)
    ap.add_argument("--abstain-below", type=float, default=0.45)
    a = ap.parse_args()
    runs = [json.loads(l) for l in open(a.forced)]
    texts = {}
    for l in open(a.tasks):
        t = json.loads(l)
        msgs = t.get("messages") or [{"role": "user", "content": t.get("question", "")}]
        texts[t["id"]] = "\n".join(m["content"].lower() for m in msgs if m["role"] in ("user", "tool"))
    # Correctness of every prefix of every task's calls.
    correct = {}
    for k in range(max(len(r["calls"]) for r in runs) + 1):
        wrong = wrong_ids(a.python, a.score_py, [{**r, "calls": r["calls"][:k]} for r in runs])
        correct[k] = {r["id"]: r["id"] not in wrong for r in runs}

    def replay(propose):
        per = collections.defaultdict(list)
        for r in runs:
            calls, text = r["calls"], texts[r["id"]]
            k = 0
            if calls:
                k = next((i + 1 for i, m in enumerate(r["stop_margins"]) if m - a.more_calls_bias > 0), len(calls))
            while propose and 0 < k < len(calls) and is_new_requested_item(calls[k], calls[:k], text):
                k += 1
            g = grounding(calls[0], text) if k else None
            if g is not None and a.abstain_below > 0 and g < a.abstain_below:
                k = 0
            per[r["category"]].append(correct[k][r["id"]])
        return {c: 100 * sum(v) / len(v) for c, v in sorted(per.items())}

    for name, propose in [("defaults", False), ("with proposals", True)]:
        accs = replay(propose)
        overall = sum(accs.values()) / len(accs)
        print(f"{name:15} {len(runs)} tasks  overall {overall:5.2f}  " +
              "  ".join(f"{c} {x:.1f}" for c, x in accs.items()))


if __name__ == "__main__":
    main()
