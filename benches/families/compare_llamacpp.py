#!/usr/bin/env python3
"""Greedy continuations of reagent and llama.cpp on the same GGUF file, token for token.

    compare_llamacpp.py MODEL.gguf [REAGENT_BINARY] [--tokens N]

Needs llama-cpp-python (see ../../../shared/peers/README.md for the install). For each prompt it prints
both continuations (the text of the same number of tokens); exit 1 if any prompt differs.
"""
import argparse
import json
import subprocess
import sys

import llama_cpp

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a small village,",
    "1, 2, 3, 4, 5,",
    "Quantum computing uses qubits, which",
    # Far positions, where rotary details (frequency factors) change the continuation.
    " ".join(["the quick brown fox jumps over the lazy dog"] * 40),
]


def reagent_text(binary, model, prompt, n):
    out = subprocess.run(
        [binary, "generate", "--model", model, "--prompt", prompt, "--temperature", "0", "--max-tokens", str(n)],
        capture_output=True, check=True)
    return out.stdout.decode("utf-8", "replace").removesuffix("\n")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("binary", nargs="?", default="target/release/reagent")
    ap.add_argument("--tokens", type=int, default=16)
    a = ap.parse_args()
    llm = llama_cpp.Llama(a.model, n_ctx=1024, n_threads=2, verbose=False)
    bad = 0
    for prompt in PROMPTS:
        ids = llm.tokenize(prompt.encode(), add_bos=False, special=False)
        llm.reset()
        theirs = []
        for t in llm.generate(ids, temp=0.0, top_k=1, reset=True):
            if len(theirs) == a.tokens:
                break
            theirs.append(t)
        text = llm.detokenize(theirs).decode("utf-8", "replace")
        ours = reagent_text(a.binary, a.model, prompt, len(theirs))
        same = ours == text
        bad += not same
        print(json.dumps({"prompt": prompt[:30], "same": same, "reagent": ours, "llama.cpp": text},
                         ensure_ascii=False))
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
