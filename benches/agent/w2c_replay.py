#!/usr/bin/env python3
"""Replays the first decision's call-or-answer settings offline on When2Call's development half.

    python3 benches/agent/w2c_replay.py DEV.jsonl KEEP.jsonl [--bias B] [--at T] [--measure M] [--tool-at U ...]

DEV: `../shared/when2call-dev/dev-150.jsonl`. KEEP: a `reagent eval --dry-run` run of the same items as
task files (`benches/agent/w2c_tasks.py DEV > TASKS`), with every first decision made to call and every call's
support recorded: `--format react --max-thought-chars 0 --call-bias 100 --min-support=-1000
--abstain-below 0`. Each line then has the raw call margin (the model's call-over-answer logit margin)
and each value's scores with and without the request, so a call bias B and a support threshold T give,
per item, the decision the run settings would have made: a call where margin + B > 0 and the call's
support is at least T, else an answer in words. Batch invariance makes this exact. With --tool-at U,
a call whose tool name's support (`tool_support`, recorded in the same passes) is below U is answered
too (`min_tool_support`).

Scored as `score_w2c.py` does: a `tool_call` item is right when its target tool is called, the other two
kinds when nothing is. Balanced = mean of the right-tool rate and the no-call rate. The tuning half is
items 0, 2, 4, … of each kind in file order, the check half the odd ones.
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
from w2c_tasks import function  # noqa: E402


def leaves(v, out):
    if isinstance(v, dict):
        for x in v.values():
            leaves(x, out)
    elif isinstance(v, list):
        for x in v:
            leaves(x, out)
    elif v is None or v == "":
        pass
    else:
        out.append(json.dumps(v, ensure_ascii=False, separators=(",", ":")))


def required_values(call, functions):
    """The JSON texts of the call's values under its tool's required parameters."""
    f = next((f for f in functions if f["name"] == call["name"]), None)
    req = set(((f or {}).get("parameters") or {}).get("required") or [])
    out = []
    for k, v in call["arguments"].items():
        if k in req:
            leaves(v, out)
    return out


def stated_values(call, functions):
    """The JSON texts of the call's values other than optional arguments given their schema's default."""
    f = next((f for f in functions if f["name"] == call["name"]), None)
    params = (f or {}).get("parameters") or {}
    req = set(params.get("required") or [])
    props = params.get("properties") or {}
    out = []
    for k, v in call["arguments"].items():
        p = props.get(k) or {}
        if k not in req and "default" in p and p["default"] == v:
            continue
        leaves(v, out)
    return out


def least(vals):
    return min((v["with"] - v["without"] for v in vals), default=None)


def least_share(vals):
    """The least share of a value's surprisal without the request that the request explains."""
    return min(((v["with"] - v["without"]) / max(-v["without"], 0.5) for v in vals), default=None)


def measures(rec, functions):
    vals = rec.get("support_values") or []
    call = rec["calls"][0] if rec["calls"] else None
    m = {"all": least(vals)}
    if call is not None:
        req = set(required_values(call, functions))
        rv = [v for v in vals if v["value"] in req]
        # A call with no required value is measured by all its values.
        m["required"] = least(rv) if rv else least(vals)
        m["required-share"] = least_share(rv) if rv else least_share(vals)
        st = set(stated_values(call, functions))
        sv = [v for v in vals if v["value"] in st]
        m["non-default"] = least(sv) if sv else least(vals)
    else:
        m["required"] = m["required-share"] = None
    tool = rec.get("tool_support")
    m["tool"] = tool["with"] - tool["without"] if tool else None
    return m


def halves(items):
    """Each item's half: items 0, 2, 4, ... of each kind in file order tune, the others check."""
    half, seen = {}, {}
    for it in items:
        k = it["correct_answer"]
        half[it["uuid"]] = "tune" if seen.get(k, 0) % 2 == 0 else "check"
        seen[k] = seen.get(k, 0) + 1
    return half


def replay_rows(dev, keep):
    """(half, kind, target tool, tool called, call margin, support measures) for each item KEEP ran."""
    items = [json.loads(l) for l in open(dev)]
    runs = {r["id"]: r for r in map(json.loads, open(keep))}
    half = halves(items)
    rows = []
    for it in items:
        r = runs.get(it["uuid"])
        if r is None:
            continue
        kind = it["correct_answer"]
        target = json.loads(it["answers"]["tool_call"])["name"].replace(".", "_") if kind == "tool_call" else None
        called = r["calls"][0]["name"] if r["calls"] else None
        ms = measures(r, [function(t) for t in it["tools"]])
        rows.append((half[it["uuid"]], kind, target, called, r.get("call_margin"), ms))
    return rows


def score(rows, bias, measure, t, which, tool_t=None):
    """Balanced, right tool and no-call counts of the `which` half ("all": both) at a call bias and a
    support threshold `t` on `measure` (`None`: no support check), and a threshold `tool_t` on the
    support of the call's tool name (`None`: none)."""
    tc = tc_n = nc = nc_n = 0
    for h, kind, target, called, margin, ms in rows:
        if which != "all" and h != which:
            continue
        call = called is not None and (margin is None or margin + bias > 0)
        if call and measure and t is not None and ms.get(measure) is not None and ms[measure] < t:
            call = False
        if call and tool_t is not None and ms.get("tool") is not None and ms["tool"] < tool_t:
            call = False
        if kind == "tool_call":
            tc_n += 1
            tc += call and called == target
        else:
            nc_n += 1
            nc += not call
    return 50 * (tc / max(tc_n, 1) + nc / max(nc_n, 1)), tc, tc_n, nc, nc_n


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dev")
    ap.add_argument("keep")
    ap.add_argument("--bias", type=float)
    ap.add_argument("--at", type=float)
    ap.add_argument("--measure", default=None)
    ap.add_argument("--tool-at", type=float, action="append",
                    help="also drop a call whose tool name's support is below this (repeatable: one row each)")
    ap.add_argument("--as-run", action="store_true",
                    help="score KEEP's decisions as they were made (a run with the settings themselves)")
    a = ap.parse_args()
    rows = replay_rows(a.dev, a.keep)

    def show(label, bias, measure, t, tool_t=None):
        parts = []
        for which in ("tune", "check", "all"):
            b, tc, tcn, nc, ncn = score(rows, bias, measure, t, which, tool_t)
            parts.append(f"{which} {b:5.1f} ({tc}/{tcn}, {nc}/{ncn})")
        print(f"{label:38} " + "  ".join(parts))

    print(f"{len(rows)} items replayed")
    if a.as_run:
        rows = [(h, kind, target, called, None, ms) for h, kind, target, called, _, ms in rows]
        show("as run", 0.0, None, None)
        return
    biases = [a.bias] if a.bias is not None else [0.0, -1.0, -2.0, -3.0, -3.75, -4.5, -5.0, -6.0]
    for bias in biases:
        show(f"bias {bias:+.2f}, no support check", bias, None, None)
        for measure in ([a.measure] if a.measure else ["all", "required", "required-share", "non-default"]):
            ts = [a.at] if a.at is not None else [-1.0, 0.0, 0.2, 0.4, 0.5, 0.6, 0.8, 1.0, 1.4, 2.0, 3.0]
            for t in ts:
                show(f"bias {bias:+.2f}, {measure} >= {t}", bias, measure, t)
                for tool_t in a.tool_at or []:
                    show(f"  and tool >= {tool_t}", bias, measure, t, tool_t)


if __name__ == "__main__":
    main()
