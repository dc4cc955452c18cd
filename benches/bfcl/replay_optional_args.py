#!/usr/bin/env python3
"""Replays the handling of optional arguments and the abstention signal offline.

The native decision's close bias (`--close-bias`) keeps a small model from inventing optional arguments,
but it also closes calls before optional arguments the request does state ("vegan", "5 players",
"settled"). The alternative is to let the model write them (close bias 0) and leave out the optional
arguments whose values the request does not state (`--drop-unstated-options`,
`grounding::drop_unstated_options`). That filter runs after the decision's calls and proposals, and
abstention looks at the first call as the model wrote it, so one run with the filter and abstention off

    reagent eval TASKS --model M --dry-run --parallel-calls 4 --close-bias 0 --end-list-bias 3 \
        --abstain-below 0 --drop-unstated-options no --out open.jsonl

replays every combination exactly: this script applies abstention on the first call's grounding (words
only, or with numbers as written), then a rule for optional arguments, scores with BFCL's checker and
prints per-category accuracy per combination.

The last variant also drops the later calls the turns do not state (`--drop-unstated-calls`,
`grounding::drop_unstated_calls`), which runs after the rule. On a run with abstention already applied,
pass `--abstain-below 0`.

usage: replay_optional_args.py OPEN.jsonl TASKS.jsonl SCORE_PY [--python PY] [--abstain-below 0.45]
"""
import argparse
import collections
import json

from replay_proposals import leaf_words, leaves, words, written_numbers, wrong_ids

NUMBER_WORDS = {w: i for i, w in enumerate(
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen "
    "seventeen eighteen nineteen twenty".split())}
NUMBER_WORDS.update({"once": 1, "twice": 2, "thrice": 3, "dozen": 12})


FUNCTION_WORDS = set("a an the of in on at to for and or by with from is are be as it its this that my me i you your "
                     "we our".split())


class Evidence:
    """The user and tool turns, as `Evidence` in src/agent/grounding/."""

    def __init__(self, task):
        self.text = "\n".join(m["content"].lower() for m in task["messages"] if m["role"] in ("user", "tool"))
        self.known = set(words(self.text))
        self.numbers = written_numbers(self.text)

    def found(self, w):
        return w in self.known or (not w.isascii() and w in self.text)

    def written(self, l):
        return (isinstance(l, (int, float)) and not isinstance(l, bool)
                and any(abs(l - n) <= 1e-9 * max(abs(n), 1) for n in self.numbers))

    def grounding(self, call, numbers):
        scores = []
        for l in leaves(call["arguments"]):
            ws = leaf_words(l)
            if ws:
                written = numbers and self.written(l)
                scores.append(1.0 if written else sum(map(self.found, ws)) / len(ws))
        return sum(scores) / len(scores) if scores else None

    def grounds(self, l):
        return self.written(l) or all(map(self.found, leaf_words(l)))

    def states(self, l):
        """`Evidence::states`: a word found (or a longer or shorter form of one), a number written."""
        if isinstance(l, (int, float)) and not isinstance(l, bool):
            if self.written(l) or any(NUMBER_WORDS.get(w) == l for w in self.known):
                return True

        def alpha(w):
            return len(w) >= 4 and w.isalpha()

        def stem(w):
            return alpha(w) and any(alpha(k) and (k.startswith(w) or w.startswith(k)) for k in self.known)

        ws = leaf_words(l)
        content = [w for w in ws if w not in FUNCTION_WORDS] or ws
        return any(self.found(w) or stem(w) for w in content)

    def names(self, parameter):
        """`Evidence::names`: a word of the parameter's name, or one sharing its first four letters."""
        return any(self.found(w) or (len(w) >= 4 and any(k.startswith(w[:4]) for k in self.known))
                   for w in words(parameter.lower()))

    def keeps_boolean(self, name, value, schema):
        """An optional boolean is kept at its default, or when the turns name its parameter."""
        default = schema.get("properties", {}).get(name, {}).get("default")
        return (default is not None and default == value) or self.names(name)


RULES = {
    "all kept": lambda ev, k, v, schema: True,
    "kept when every word is grounded": lambda ev, k, v, schema: all(ev.grounds(l) for l in leaves(v)),
    "kept when stated (the rule)": lambda ev, k, v, schema: (
        ev.keeps_boolean(k, v, schema) if isinstance(v, bool) else all(ev.states(l) for l in leaves(v))),
}


def without_booleans(args):
    return {k: v for k, v in args.items() if not isinstance(v, bool)} if isinstance(args, dict) else args


def drop_unstated_calls(ev, calls):
    """`grounding::drop_unstated_calls`: a later call goes when it brings a value the turns do not state, or
    repeats an earlier kept call of the same tool but for booleans."""
    kept = []
    for c in calls:
        if kept:
            earlier = [l for k in kept for l in leaves(k["arguments"])]
            if any(l not in earlier and not ev.states(l) for l in leaves(c["arguments"])):
                continue
            if any(k["name"] == c["name"] and without_booleans(k["arguments"]) == without_booleans(c["arguments"])
                   for k in kept):
                continue
        kept.append(c)
    return kept


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("open")
    ap.add_argument("tasks")
    ap.add_argument("score_py")
    ap.add_argument("--python", default="python3")
    ap.add_argument("--abstain-below", type=float, default=0.45)
    a = ap.parse_args()
    runs = [json.loads(l) for l in open(a.open)]
    tasks = {t["id"]: t for t in map(json.loads, open(a.tasks))}
    variants = [(numbers, name, False) for numbers in (False, True) for name in RULES]
    variants.append((True, "kept when stated (the rule)", True))
    for numbers, name, later in variants:
        rule = RULES[name]
        lines = []
        for r in runs:
            task, calls = tasks[r["id"]], r["calls"]
            ev = Evidence(task)
            g = ev.grounding(calls[0], numbers) if calls else None
            if g is not None and a.abstain_below > 0 and g < a.abstain_below:
                calls = []
            fns = {fn["name"]: fn.get("parameters", {}) for fn in task["functions"]}
            out = []
            for c in calls:
                required = set(fns.get(c["name"], {}).get("required", []))
                args = c["arguments"]
                if isinstance(args, dict):
                    schema = fns.get(c["name"], {})
                    args = {k: v for k, v in args.items() if k in required or rule(ev, k, v, schema)}
                out.append({"name": c["name"], "arguments": args})
            lines.append({**r, "calls": drop_unstated_calls(ev, out) if later else out})
        wrong = wrong_ids(a.python, a.score_py, lines)
        per = collections.defaultdict(list)
        for r in runs:
            per[r["category"]].append(r["id"] not in wrong)
        accs = {c: 100 * sum(v) / len(v) for c, v in sorted(per.items())}
        overall = sum(accs.values()) / len(accs)
        label = f"abstain on {'words+numbers' if numbers else 'words'}, {name}"
        label += ", unstated later calls dropped" if later else ""
        print(f"{label:90} {len(runs)} tasks  overall {overall:5.2f}  " +
              "  ".join(f"{c[:10]} {x:.1f}" for c, x in accs.items()))


if __name__ == "__main__":
    main()
