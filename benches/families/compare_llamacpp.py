#!/usr/bin/env python3
"""Greedy continuations of reagent and llama.cpp on the same GGUF file, token for token.

    compare_llamacpp.py MODEL.gguf [REAGENT_BINARY] [--tokens N] [--tie T] [--logits-rms R] [--n-ctx C]

Needs llama-cpp-python. For each prompt it compares the greedy token ids of both (N tokens, 64 by
default). They must be the same, or part at a near tie: where llama.cpp's own logits put its pick at
most T (1e-3 by default) ahead of reagent's. Two implementations that round differently break such ties
differently (on random weights with a 150k vocabulary they are common); a real fault parts them by far
more. With --logits-rms, the first step's logits (after the same token ids) must also agree to that
relative RMS, sqrt(mean((a - b)^2)) / sqrt(mean(b^2)). Both run with a context of C tokens (1024 by
default; it picks Phi 3's short or long rotary factors). Exit 1 on any failure.
"""
import argparse
import json
import subprocess
import sys

import llama_cpp
import numpy as np

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a small village,",
    "1, 2, 3, 4, 5,",
    "Quantum computing uses qubits, which",
    # Far positions, where rotary details (frequency factors) change the continuation.
    " ".join(["the quick brown fox jumps over the lazy dog"] * 40),
]


def reagent_ids(binary, model, prompt, n, ctx):
    out = subprocess.run(
        [binary, "generate", "--model", model, "--prompt", prompt, "--temperature", "0", "--max-tokens", str(n),
         "--ids", "--context", str(ctx)], capture_output=True, check=True)
    return json.loads(out.stdout)


def reagent_logits(binary, model, prompt, ctx):
    out = subprocess.run([binary, "tokenize", "--model", model, "--text", prompt, "--logits", "--context", str(ctx)],
                         capture_output=True, check=True)
    v = json.loads(out.stdout)
    return v["ids"], np.array(v["logits"], dtype=np.float64)


def llama_logits(llm, ids):
    llm.reset()
    llm.eval(ids)
    return np.array(llm.scores[len(ids) - 1], dtype=np.float64)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("binary", nargs="?", default="target/release/reagent")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--tie", type=float, default=1e-3)
    ap.add_argument("--logits-rms", type=float, default=None)
    ap.add_argument("--n-ctx", type=int, default=1024)
    a = ap.parse_args()
    llm = llama_cpp.Llama(a.model, n_ctx=a.n_ctx, n_threads=2, verbose=False, logits_all=True)
    bad = 0
    if a.logits_rms is not None:
        for prompt in PROMPTS[:4]:
            ids, ours = reagent_logits(a.binary, a.model, prompt, a.n_ctx)
            theirs = llama_logits(llm, ids)
            rms = float(np.sqrt(np.mean((ours - theirs) ** 2)) / np.sqrt(np.mean(theirs ** 2)))
            ok = rms <= a.logits_rms
            bad += not ok
            print(json.dumps({"prompt": prompt[:30], "logits_rel_rms": rms, "ok": ok}))
    for prompt in PROMPTS:
        ids = llm.tokenize(prompt.encode(), add_bos=False, special=False)
        llm.reset()
        theirs = []
        for t in llm.generate(ids, temp=0.0, top_k=1, reset=True):
            if len(theirs) == a.tokens:
                break
            theirs.append(t)
        ours = reagent_ids(a.binary, a.model, prompt, len(theirs), a.n_ctx)
        same = ours == theirs
        row = {"prompt": prompt[:30], "same": same, "tokens": len(theirs)}
        ok = same
        if not same:
            i = next((k for k, (x, y) in enumerate(zip(ours, theirs)) if x != y), min(len(ours), len(theirs)))
            row["first_difference"] = i
            if i < min(len(ours), len(theirs)):
                # llama.cpp's own logits at that step: how far its pick is ahead of reagent's.
                logits = llm.scores[len(ids) + i - 1]
                row["llama.cpp_margin"] = float(logits[theirs[i]] - logits[ours[i]])
                ok = row["llama.cpp_margin"] <= a.tie
            row["reagent"] = llm.detokenize(ours).decode("utf-8", "replace")
            row["llama.cpp"] = llm.detokenize(theirs).decode("utf-8", "replace")
        row["ok"] = ok
        bad += not ok
        print(json.dumps(row, ensure_ascii=False))
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
