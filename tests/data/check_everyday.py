#!/usr/bin/env python3
"""Checks the everyday development set (tests/data/everyday_tune.jsonl, tests/data/everyday_check.jsonl):
valid JSON lines, ids unique across both files, the fields each line needs, every tool named provided
(a built-in or in tests/data/agent_tools.toml), expected calls that can succeed (files that exist in
tests/data/agent_fixture, values tests/data/agent_tools/world.py knows, calculator expressions that give
the expected answer), answers found where the call puts them, and the kinds balanced between the halves.
Exits 1 on any problem. Also prints, as notes, the answer-only requests where reagent's request heuristics
(Tool::needed_for: written arithmetic, a path or fixture name) would require a first call.

Usage: python3 tests/data/check_everyday.py
"""
import ast
import json
import re
import sys
import tomllib
from collections import Counter, defaultdict
from pathlib import Path

DATA = Path(__file__).resolve().parent
REPO = DATA.parent.parent
FILES = ["everyday_tune.jsonl", "everyday_check.jsonl"]
FIXTURE = DATA / "agent_fixture"
BUILTIN = {"calculator", "current_time", "read_file", "list_dir", "search_files"}
KINDS_MIN, PER_KIND_MIN = 11, 20
WORLD_TOOLS = {"get_weather", "stock_price", "local_time"}

problems = []


def bad(where, msg):
    problems.append(f"{where}: {msg}")


# --- What exists -------------------------------------------------------------------------------------

def builtin_names():
    src = (REPO / "src/tools/builtin.rs").read_text()
    found = set(re.findall(r'ToolSpec::new\(\s*"(\w+)"', src)) - {"write_file"}
    if found != BUILTIN:
        bad("src/tools/builtin.rs", f"built-in tools are {sorted(found)}, the checker knows {sorted(BUILTIN)}")
    return found


def program_tools():
    with open(DATA / "agent_tools.toml", "rb") as f:
        return {t["name"]: t for t in tomllib.load(f)["tool"]}


def world_tables():
    tree = ast.parse((DATA / "agent_tools/world.py").read_text())
    tables = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Dict):
            tables[node.targets[0].id] = ast.literal_eval(node.value)
    return tables


WORLD = world_tables()


def world_output(name, args):
    """What world.py prints for a call, or None where it exits with an error."""
    if name == "get_weather":
        key = str(args.get("city", "")).split(",")[0].strip().lower()
        return f"{args['city']}: {WORLD['WEATHER'][key]}" if key in WORLD["WEATHER"] else None
    if name == "stock_price":
        t = str(args.get("ticker", "")).upper()
        return f"{t}: {WORLD['PRICES'][t]}" if t in WORLD["PRICES"] else None
    if name == "local_time":
        z = args.get("timezone", "")
        return f"{z}: {WORLD['TIMES'][z]}" if z in WORLD["TIMES"] else None
    return None


def fixture_tree():
    files, dirs = [], []
    for p in sorted(FIXTURE.rglob("*")):
        rel = p.relative_to(FIXTURE).as_posix()
        if any(part.startswith(".") for part in rel.split("/")):
            continue
        (dirs if p.is_dir() else files).append(rel)
    return files, dirs


FILES_IN, DIRS_IN = fixture_tree()


# --- The calculator, as src/tools/builtin.rs `calculate` -------------------------------------------

def percents(expr):
    out = ""
    for i, c in enumerate(expr):
        rest = expr[i + 1:].lstrip()
        if c != "%" or (rest and (rest[0].isdigit() or rest[0] in "(.")):
            out += c
            continue
        out = out.rstrip()
        m = re.search(r"[0-9.]+$", out)
        out = out[: m.start()] + f"({m.group()}/100)" if m else out + "/100"
    return out


def calculate(expr):
    if any(not (c.isdigit() or c.isspace() or c in "+-*/%^().eE") for c in expr):
        return None
    try:
        v = float(eval(percents(expr).replace("^", "**"), {"__builtins__": {}}))
    except Exception:
        return None
    return str(int(v)) if v == int(v) and abs(v) < 9.0e15 else repr(v)


# --- Request heuristics, as src/tools/builtin.rs `arithmetic_in` and builtin/paths.rs `paths_named_in` --

OPERATOR = re.compile(r"\d+(?:\.\d+)?(?:\s*[+*/×÷^]\s*|\s+-\s+)\(?\d+(?:\.\d+)?")
NUMBER = re.compile(r"[\w.:/-]*\d[\w.:/-]*")
TEXT_EXT = {"txt", "md", "csv", "tsv", "json", "ini", "log", "toml", "yaml", "yml", "cfg", "conf", "xml", "html",
            "py", "rs"}


def arithmetic_in(q):
    m = OPERATOR.search(q)
    if m:
        return m.group()
    nums = [w.rstrip(".:/-") for w in NUMBER.findall(q)]
    nums = [w for w in nums if re.fullmatch(r"[0-9.]*[0-9][0-9.]*", w) and w.count(".") <= 1]
    return ", ".join(nums) if len(nums) >= 2 else None


def path_words(q):
    words = [w.rstrip(".-/") for w in re.findall(r"[\w./~-]+", q)]
    return [w[2:] if w.startswith("./") else w for w in words if w]


def path_shaped(w):
    if not any(c.isalpha() for c in w):
        return False
    stem, dot, ext = w.rpartition(".")
    return ("/" in w and len(w) > 2) or (bool(dot) and bool(stem) and ext.lower() in TEXT_EXT)


def fixture_names():
    names = []
    for p, is_dir in [(f, False) for f in FILES_IN] + [(d, True) for d in DIRS_IN]:
        name = p.rsplit("/", 1)[-1]
        stem = name.rsplit(".", 1)[0] if "." in name else name
        names += [(p.lower(), p, True), (name.lower(), p, True)]
        if stem != name:
            names.append((stem.lower(), p, False))
    return [n for n in names if len(n[0]) >= 3]


NAMES = fixture_names()


def paths_named_in(q):
    """(word, fixture path or None where only path-shaped) for the words reagent reads as paths."""
    def run(whole):
        found = []
        for w in path_words(q):
            hit = next((p for n, p, exact in NAMES if n == w.lower() and exact == whole), None)
            if hit:
                found.append((w, hit))
            elif whole and path_shaped(w):
                found.append((w, None))
        return found
    return run(True) or run(False)


# --- The checks ---------------------------------------------------------------------------------------

def main():
    provided = builtin_names() | set(program_tools())
    seen_ids = {}
    halves = {}
    notes = []
    for fname in FILES:
        path = DATA / fname
        tasks = []
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            where = f"{fname}:{n}"
            if not line.strip():
                continue
            try:
                t = json.loads(line)
            except json.JSONDecodeError as e:
                bad(where, f"not JSON: {e}")
                continue
            tasks.append(t)
            check_task(t, where, provided, seen_ids, notes)
        halves[fname] = tasks
    check_balance(halves)
    for note in notes:
        print("note:", note)
    counts = {f: Counter(t.get("category") for t in ts) for f, ts in halves.items()}
    kinds = sorted(set().union(*counts.values()))
    print(f"{'kind':<10} " + " ".join(f"{f.split('_')[1].split('.')[0]:>6}" for f in FILES) + "  total")
    for k in kinds:
        row = [counts[f][k] for f in FILES]
        print(f"{k:<10} " + " ".join(f"{c:>6}" for c in row) + f"  {sum(row):>5}")
    print(f"{'all':<10} " + " ".join(f"{len(halves[f]):>6}" for f in FILES) + f"  {sum(map(len, halves.values())):>5}")
    if problems:
        print(f"\n{len(problems)} problem(s):")
        for p in problems:
            print("  " + p)
        sys.exit(1)
    print("\nok")


def check_task(t, where, provided, seen_ids, notes):
    tid = t.get("id")
    if not isinstance(tid, str) or not tid:
        return bad(where, "no id")
    where = f"{where} ({tid})"
    if tid in seen_ids:
        bad(where, f"id also on {seen_ids[tid]}")
    seen_ids[tid] = where
    kind = t.get("category")
    if not isinstance(kind, str) or not re.fullmatch(re.escape(kind) + r"-\d{2,}", tid):
        bad(where, "the id is not `<category>-NN`")
    q = t.get("question")
    if not isinstance(q, str) or not q.strip():
        bad(where, "no question")
        q = ""
    if "messages" in t:
        bad(where, "both question and messages")
    tools = t.get("tools")
    if not isinstance(tools, list) or not tools or len(set(tools)) != len(tools):
        bad(where, "tools must be a non-empty list without repeats")
        tools = []
    for name in tools:
        if name not in provided:
            bad(where, f"tool `{name}` is neither a built-in nor in agent_tools.toml")
    behaviour = t.get("behaviour")
    if behaviour not in ("answer", "call"):
        bad(where, "behaviour must be `answer` or `call`")
    ea = t.get("expected_answer")
    if isinstance(ea, str):
        ea = [ea]
    if ea is not None and not (isinstance(ea, list) and all(isinstance(e, str) and e for e in ea)):
        bad(where, "expected_answer must be a string or a list of non-empty strings")
        ea = []
    expected = t.get("expected")
    if "expected" not in t and "expected_answer" not in t:
        bad(where, "neither expected nor expected_answer: nothing is scored")
    calls = []
    if expected is not None:
        if not isinstance(expected, list) or not all(isinstance(c, dict) and set(c) <= {"name", "arguments"}
                                                     and isinstance(c.get("name"), str) for c in expected):
            bad(where, "expected must be a list of {name, arguments}")
            expected = []
        calls += expected
    if behaviour == "answer" and expected != []:
        bad(where, "an answer-only task needs `expected: []` (no call)")
    if behaviour == "call" and not expected and "first_call" not in t:
        bad(where, "a call task needs an expected call or a first_call")
    if "first_call" in t:
        calls.append(t["first_call"])
    for c in calls:
        check_call(c, t, q, tools, ea or [], where)
    if behaviour == "answer":
        need = arithmetic_in(q)
        if need:
            notes.append(f"{tid}: written numbers ({need}) make reagent require a first call")
        paths = paths_named_in(q)
        if paths:
            w, p = paths[0]
            what = f"names fixture entry {p}" if p else "is shaped like a path"
            notes.append(f"{tid}: `{w}` {what}; reagent requires a first call")
        if kind == "filewords":
            for w, p in paths:
                if p:
                    bad(where, f"`{w}` names {p}, a fixture entry: filewords must name no existing file")
    if any(tool in WORLD_TOOLS for tool in tools) and not all(tool in tools for tool in WORLD_TOOLS):
        bad(where, "names some of the program tools but not all three")


def check_call(c, t, q, tools, ea, where):
    name, args = c.get("name"), c.get("arguments", {})
    if name not in tools:
        bad(where, f"expected call `{name}` is not among the task's tools")
    if not isinstance(args, dict):
        return bad(where, "arguments must be an object")
    scored = c in (t.get("expected") or [])
    if name == "read_file":
        p = args.get("path")
        if p not in FILES_IN:
            return bad(where, f"read_file path `{p}` is not a fixture file")
        if scored and t.get("category") in ("content", "named"):
            text = (FIXTURE / p).read_text().lower()
            for e in ea:
                if e.lower() not in text:
                    bad(where, f"answer `{e}` is not in {p}")
    elif name in ("list_dir", "search_files"):
        if args.get("path", ".") not in DIRS_IN + ["."]:
            bad(where, f"{name} path `{args.get('path')}` is not a fixture folder")
    elif name == "current_time":
        if args:
            bad(where, "current_time takes no arguments")
    elif name == "calculator":
        got = calculate(str(args.get("expression", "")))
        if got is None:
            bad(where, f"the calculator refuses `{args.get('expression')}`")
        elif scored and ea != [got]:
            bad(where, f"`{args['expression']}` gives {got}, expected_answer is {ea}")
        if any(e.lower() in q.lower() for e in ea):
            bad(where, "the expected result is written in the question (an echo would pass)")
    elif name in WORLD_TOOLS:
        out = world_output(name, args)
        if out is None:
            return bad(where, f"world.py has no answer for {name} {args}")
        if scored and t.get("category") == "derived":
            for e in ea:
                if e.lower() not in out.lower():
                    bad(where, f"answer `{e}` is not in the tool's output `{out}`")
    else:
        bad(where, f"unknown tool `{name}` in a call")


def check_balance(halves):
    counts = {f: Counter(t.get("category") for t in ts) for f, ts in halves.items()}
    a, b = (counts[f] for f in FILES)
    kinds = set(a) | set(b)
    if len(kinds) < KINDS_MIN:
        bad("set", f"{len(kinds)} kinds, at least {KINDS_MIN} wanted")
    for k in sorted(kinds):
        if a[k] + b[k] < PER_KIND_MIN:
            bad("set", f"kind {k} has {a[k] + b[k]} tasks, at least {PER_KIND_MIN} wanted")
        if abs(a[k] - b[k]) > 1:
            bad("set", f"kind {k} is split {a[k]}/{b[k]}")
    for f, ts in halves.items():
        dup = [q for q, n in Counter(t.get("question", "").strip().lower() for t in ts).items() if n > 1]
        if dup:
            bad(f, f"repeated questions: {dup}")
    questions = defaultdict(list)
    for f, ts in halves.items():
        for t in ts:
            questions[t.get("question", "").strip().lower()].append(t.get("id"))
    for q, ids in questions.items():
        if len(ids) > 1:
            bad("set", f"the same question in {ids}")
    # Not a copy of the agent suite.
    suite = {json.loads(l)["question"].strip().lower()
             for l in (DATA / "agent_tasks.jsonl").read_text().splitlines() if l.strip()}
    for q, ids in questions.items():
        if q in suite:
            bad("set", f"{ids} repeats a question of agent_tasks.jsonl")


if __name__ == "__main__":
    main()
