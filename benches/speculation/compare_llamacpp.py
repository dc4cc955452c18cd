#!/usr/bin/env python3
"""Speculative decoding against llama.cpp's own prompt-lookup speculation, on the same prompts.

Usage:
  reagent bench --model M.gguf --speculation --runs 5 --json > spec.json
  python compare_llamacpp.py M.gguf spec.json [--runs 5] [--threads 2]

For each workload of `spec.json` (the prompt as reagent rendered it, and the tokens it generated),
llama-cpp-python decodes the same prompt greedily for the same number of tokens, plainly and with
`LlamaPromptLookupDecoding` (its defaults: 2-token n-grams, 10 drafted tokens), and reports decode
tok/s (first to last generated token, median of the runs) beside reagent's figures. The decision
workload runs without a grammar on llama.cpp (its speculation and grammars are separate paths), so
its row compares speed only, not identical output.
"""
import argparse
import json
import statistics
import time

from llama_cpp import Llama
from llama_cpp.llama_speculative import LlamaPromptLookupDecoding


def decode_rate(llm, tokens, n):
    """Greedy decode of `n` tokens after `tokens`; tok/s between the first and last token."""
    llm.reset()
    stamps = []
    eos = llm.token_eos()
    bias = {eos: -1e9}
    for _ in llm.create_completion(tokens, max_tokens=n, temperature=0.0, top_k=1, stream=True,
                                   logit_bias=bias):
        stamps.append(time.perf_counter())
    if len(stamps) < 2:
        return None
    return (len(stamps) - 1) / (stamps[-1] - stamps[0])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("report")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    rows = json.load(open(a.report))
    common = dict(model_path=a.model, n_ctx=4096, n_threads=a.threads, n_threads_batch=a.threads, verbose=False)
    plain = Llama(**common)
    # Verifying drafts needs the logits of every position of a batch.
    lookup = Llama(**common, logits_all=True, draft_model=LlamaPromptLookupDecoding())
    print("| workload | tokens | reagent drafts tok/s | llama.cpp plain tok/s | llama.cpp prompt lookup tok/s | reagent / llama.cpp lookup |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        toks = plain.tokenize(r["prompt"].encode(), add_bos=False, special=True)
        n = r["tokens"]
        p, s = [], []
        for _ in range(a.runs):
            p.append(decode_rate(plain, toks, n))
            s.append(decode_rate(lookup, toks, n))
        pm, sm = statistics.median(p), statistics.median(s)
        print(f"| {r['workload']} | {n} | {r['drafted_tok_s']:.1f} | {pm:.1f} | {sm:.1f} | {r['drafted_tok_s'] / sm:.2f}x |")


if __name__ == "__main__":
    main()
