#!/usr/bin/env python3
"""A tokenizer-only GGUF file with GPT-4o's o200k vocabulary (Phi-4-mini's, less its chat tokens), for
checking reagent's `gpt-4o` pre-tokenizer and BPE against llama.cpp (and tiktoken) on a real vocabulary.

    o200k_vocab.py RANKS OUT.gguf

RANKS: `dist/ranks/o200k_base.cjs` of the `js-tiktoken` npm package (`npm pack js-tiktoken`), which
carries the o200k ranks. The tokens are written as llama.cpp's converter writes a tiktoken vocabulary:
each token's bytes in GPT-2's byte-to-character mapping, ranked; the merges recovered by running BPE on
each token with the lower ranks only; the special tokens at their ids, the gaps filled with reserved
control tokens, and Phi-4-mini's chat tokens after them. Feed the file to `random_gguf.py phi3` as the
tokenizer source.
"""
import base64
import json
import re
import sys

import gguf


def byte_chars():
    """GPT-2's printable stand-in for each byte."""
    printable = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    chars = printable[:]
    n = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(printable, chars)}


def read_ranks(path):
    text = open(path, encoding="utf-8").read()
    obj = json.loads(re.search(r"=\s*(\{.*\})\s*;?\s*$", text, re.S).group(1))
    ranks = {}
    # `bpe_ranks`: lines of "PREFIX OFFSET TOKEN TOKEN ...", the tokens base64, ranked from OFFSET.
    for line in obj["bpe_ranks"].split("\n"):
        parts = line.split(" ")
        if len(parts) < 2:
            continue
        offset = int(parts[1])
        for i, tok in enumerate(parts[2:]):
            ranks[base64.b64decode(tok)] = offset + i
    return ranks, obj["special_tokens"], obj["pat_str"]


def merge_of(ranks, token, rank):
    """The two parts BPE joins last to make `token`, using only merges ranked below `rank`."""
    parts = [bytes([b]) for b in token]
    while True:
        best, at = None, None
        for i in range(len(parts) - 1):
            r = ranks.get(parts[i] + parts[i + 1])
            if r is not None and r < rank and (best is None or r < best):
                best, at = r, i
        if best is None:
            break
        parts = parts[:at] + [parts[at] + parts[at + 1]] + parts[at + 2:]
    if len(parts) != 2:
        raise SystemExit(f"token {token!r} (rank {rank}) does not come from one merge")
    return parts


def main():
    ranks_path, out = sys.argv[1], sys.argv[2]
    ranks, specials, _ = read_ranks(ranks_path)
    chars = byte_chars()
    enc = lambda b: "".join(chars[x] for x in b)
    size = 200064  # Phi-4-mini's vocabulary (ids past the ranks: special and reserved tokens)
    chat = ["<|assistant|>", "<|end|>", "<|user|>", "<|system|>", "<|tool|>", "<|/tool|>", "<|tool_call|>",
            "<|/tool_call|>", "<|tool_response|>", "<|tag|>"]
    tokens = [None] * size
    types = [gguf.TokenType.CONTROL] * size
    for b, r in ranks.items():
        tokens[r] = enc(b)
        types[r] = gguf.TokenType.NORMAL
    for t, i in specials.items():
        tokens[i] = t
    for k, t in enumerate(chat):
        tokens[200019 + k] = t
    for i in range(size):
        if tokens[i] is None:
            tokens[i] = f"<|reserved_{i}|>"
    merges = []
    for b, r in sorted(ranks.items(), key=lambda kv: kv[1]):
        if len(b) > 1:
            left, right = merge_of(ranks, b, r)
            merges.append(f"{enc(left)} {enc(right)}")
    w = gguf.GGUFWriter(out, "llama")
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt-4o")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(specials["<|endoftext|>"])
    w.add_eos_token_id(200020)
    w.add_add_bos_token(False)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(f"{out}: {len(ranks)} ranked tokens, {len(merges)} merges, {size} ids")


if __name__ == "__main__":
    main()
