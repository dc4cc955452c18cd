#!/usr/bin/env python3
"""The first decision's call-or-answer choice of an everyday set, replayed at other call biases from the
margins `reagent eval` records (`call_margin`: the best call token's logit minus the best answer token's,
before the bias; a call is made where margin + bias > 0). Right: a call where the task's behaviour is
`call`, an answer where it is `answer`. Tasks whose first decision was forced (no margin) are left out.

    python3 benches/agent/call_bias.py TASKS.jsonl RESULTS.jsonl [BIAS ...]
"""
import json
import sys


def main():
    tasks = {json.loads(l)["id"]: json.loads(l) for l in open(sys.argv[1]) if l.strip()}
    results = [json.loads(l) for l in open(sys.argv[2]) if l.strip()]
    pairs = [(r["call_margin"], tasks[r["id"]]["behaviour"] == "call", tasks[r["id"]]["category"])
             for r in results if r.get("call_margin") is not None and r["id"] in tasks]
    biases = [float(b) for b in sys.argv[3:]] or [x / 4 for x in range(-24, 9)]
    print(f"{len(pairs)} free first decisions ({sum(c for _, c, _ in pairs)} should call)")
    for b in biases:
        right = sum((m + b > 0) == c for m, c, _ in pairs)
        calls_right = sum((m + b > 0) and c for m, c, _ in pairs)
        answers_right = sum((m + b <= 0) and not c for m, c, _ in pairs)
        print(f"bias {b:+6.2f}: {right:>3}/{len(pairs)}  (calls {calls_right}, answers {answers_right})")


if __name__ == "__main__":
    main()
