#!/usr/bin/env python3
"""reagent against llama.cpp on random-weight files of every architecture it supports, in F32 and in the
quantization types real files use (what `.ci/run` runs).

    check.py TOKENIZER_SOURCE.gguf [REAGENT_BINARY] [--dir DIR] [--only ARCH,...]

For each architecture, `random_gguf.py` writes an F32 file (with the tokenizer of TOKENIZER_SOURCE, a Qwen
2.5 file), and llama.cpp's own quantizer (llama-cpp-python) makes Q8_0, Q6_K and Q4_K_M copies of it. Then
`compare_llamacpp.py` checks each file: greedy continuations of 64 tokens equal llama.cpp's from every
prompt, or part only at a near tie, and the first step's logits agree.

- F32: logits to 1e-3 relative RMS; a near tie is a margin of 1e-3 (llama.cpp's logits sit about 2e-4
  from the exact product, reagent's about 2e-7).
- Quantized: each implementation quantizes the activations its own way, so each is about 1-1.5% (logits'
  relative RMS) from the exact product of the dequantized weights, in independent directions: logits to
  4%, and a near tie is a margin of 0.08 (logits' RMS is about 1 on these files).

Exit 1 on any failure. Needs numpy, gguf and llama-cpp-python.
"""
import argparse
import json
import os
import subprocess
import sys

import llama_cpp

HERE = os.path.dirname(os.path.abspath(__file__))

# Shapes K-quant blocks (256 values) divide, real head layouts (grouped queries), a few layers.
COMMON = ["--dim", "256", "--ffn", "512", "--heads", "4", "--kv-heads", "2", "--key-length", "64"]
FILES = {
    "llama": ["llama"],
    "llama3": ["llama", "--rope-freqs"],
    "qwen2": ["qwen2"],
    "qwen3": ["qwen3"],
    # Four layers: the fourth has no rotary positions.
    "smollm3": ["smollm3", "--layers", "4"],
    # Fused q/k/v and gate/up, rotary on 48 of 64 dimensions, LongRoPE, the output tied to the embedding.
    "phi3": ["phi3", "--rope-dims", "48"],
}
# Contexts each file runs at: Phi 3 takes its short rotary factors up to the 4096 positions it was
# trained at, its long ones past them.
CONTEXTS = {"phi3": [1024, 8192]}
QUANTS = {"Q8_0": 7, "Q6_K": 18, "Q4_K_M": 15}  # llama_ftype values


def quantize(src, dst, ftype):
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = ftype
    params.nthread = 2
    rc = llama_cpp.llama_model_quantize(src.encode(), dst.encode(), params)
    if rc != 0:
        raise SystemExit(f"llama.cpp could not quantize {src} to {dst} (code {rc})")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("source")
    ap.add_argument("binary", nargs="?", default="target/release/reagent")
    ap.add_argument("--dir", default="/tmp/reagent-families")
    ap.add_argument("--only", default=None, help="architectures to check, separated by commas")
    a = ap.parse_args()
    os.makedirs(a.dir, exist_ok=True)
    names = a.only.split(",") if a.only else list(FILES)
    failed = []
    for name in names:
        f32 = os.path.join(a.dir, f"random-{name}-f32.gguf")
        subprocess.run([sys.executable, os.path.join(HERE, "random_gguf.py"), *FILES[name][:1], a.source, f32,
                        *COMMON, *FILES[name][1:]], check=True)
        files = [(f32, ["--logits-rms", "1e-3", "--tie", "1e-3"])]
        for q, ftype in QUANTS.items():
            out = os.path.join(a.dir, f"random-{name}-{q.lower()}.gguf")
            quantize(f32, out, ftype)
            files.append((out, ["--logits-rms", "0.04", "--tie", "0.08"]))
        runs = [(path, extra + ["--n-ctx", str(c)], c) for path, extra in files for c in CONTEXTS.get(name, [1024])]
        for path, extra, ctx in runs:
            r = subprocess.run([sys.executable, os.path.join(HERE, "compare_llamacpp.py"), path, a.binary, *extra],
                               capture_output=True, text=True)
            lines = [json.loads(l) for l in r.stdout.splitlines() if l.startswith("{")]
            same = sum(1 for l in lines if l.get("same"))
            total = sum(1 for l in lines if "same" in l)
            ties = [l["first_difference"] for l in lines if "same" in l and not l["same"]]
            rms = max((l["logits_rel_rms"] for l in lines if "logits_rel_rms" in l), default=None)
            print(json.dumps({"file": os.path.basename(path), "context": ctx, "same_continuations": f"{same}/{total}",
                              "parted_at_near_ties_at_steps": ties,
                              "max_logits_rel_rms": rms, "ok": r.returncode == 0}), flush=True)
            if r.returncode != 0:
                failed.append(os.path.basename(path))
                sys.stderr.write(r.stdout + r.stderr)
    if failed:
        raise SystemExit(f"differs from llama.cpp: {', '.join(failed)}")


if __name__ == "__main__":
    main()
