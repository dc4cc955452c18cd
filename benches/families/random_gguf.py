#!/usr/bin/env python3
"""A small random-weight GGUF file of an architecture reagent supports, with the tokenizer of a real file,
to check reagent against llama.cpp token for token where no real weights can be had.

    random_gguf.py ARCH TOKENIZER_SOURCE.gguf OUT.gguf [--key-length N] [--seed S]

ARCH: qwen3 (q/k head norms, no q/k/v biases), qwen2, llama (with --rope-freqs, Llama 3.x's rotary
frequency factors, as a `rope_freqs.weight` tensor), smollm3, or phi3 (fused q/k/v and gate/up tensors,
rotary on the first --rope-dims of each head, LongRoPE short and long factors with their attention factor,
the output tied to the embedding, as Phi-4-mini). The tokenizer (every `tokenizer.*` key) is copied
from TOKENIZER_SOURCE (a Qwen 2.5 file: the same BPE as Qwen 3). Weights are f32, drawn from a seeded
normal distribution scaled like a trained model's, so greedy continuations are not degenerate.
"""
import argparse

import numpy as np
import gguf


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("arch", choices=["llama", "qwen2", "qwen3", "smollm3", "phi3"])
    ap.add_argument("source")
    ap.add_argument("out")
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--key-length", type=int, default=0, help="head size (default dim / heads)")
    ap.add_argument("--ffn", type=int, default=256)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--name", default="", help="general.name (default random-ARCH; llama.cpp keys some token "
                    "attributes on it: a phi3 name wants Phi 3's `</s>` token)")
    ap.add_argument("--rope-freqs", action="store_true", help="llama: Llama 3.x rotary frequency factors")
    ap.add_argument("--rope-dims", type=int, default=0, help="rotary dimensions per head (default: all)")
    a = ap.parse_args()
    rng = np.random.default_rng(a.seed)
    hd = a.key_length or a.dim // a.heads
    src = gguf.GGUFReader(a.source)
    vocab = len(src.fields["tokenizer.ggml.tokens"].data)

    w = gguf.GGUFWriter(a.out, a.arch)
    w.add_name(a.name or f"random-{a.arch}")
    w.add_context_length(4096 * 32 if a.arch == "phi3" else 4096)
    w.add_embedding_length(a.dim)
    w.add_block_count(a.layers)
    w.add_feed_forward_length(a.ffn)
    w.add_head_count(a.heads)
    w.add_head_count_kv(a.kv_heads)
    w.add_key_length(hd)
    w.add_value_length(hd)
    w.add_rope_freq_base({"llama": 500_000.0, "smollm3": 500_000.0, "phi3": 10_000.0}.get(a.arch, 1_000_000.0))
    rot = a.rope_dims or hd
    w.add_rope_dimension_count(rot)
    if a.arch == "phi3":
        # Phi-4-mini's LongRoPE: trained at 4096 positions, stretched to the file's context; llama.cpp takes
        # the short factors for a context up to the original one, the long ones past it.
        w.add_rope_scaling_orig_ctx_len(4096)
        w.add_rope_scaling_attn_factors(float(np.sqrt(1 + np.log(4096 * 32 / 4096) / np.log(4096))))
        w.add_sliding_window(0)
    w.add_layer_norm_rms_eps(1e-6)
    for name, field in src.fields.items():
        if not name.startswith("tokenizer."):
            continue
        t = field.types[0]
        if t == gguf.GGUFValueType.ARRAY:
            sub = field.types[-1]
            if sub == gguf.GGUFValueType.STRING:
                vals = [bytes(field.parts[i]).decode("utf-8", "surrogateescape") for i in field.data]
            else:
                vals = [field.parts[i].tolist()[0] for i in field.data]
            w.add_array(name, vals)
        elif t == gguf.GGUFValueType.STRING:
            w.add_string(name, bytes(field.parts[field.data[0]]).decode("utf-8"))
        elif t == gguf.GGUFValueType.BOOL:
            w.add_bool(name, bool(field.parts[field.data[0]][0]))
        else:
            w.add_uint32(name, int(field.parts[field.data[0]][0]))

    def mat(rows, cols):
        return (rng.standard_normal((rows, cols)) / np.sqrt(cols)).astype(np.float32)

    def norm(n):
        return (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)

    # A tied embedding is also the output: small, as trained ones are, or every step repeats its input.
    embed_scale = 0.05 if a.arch == "phi3" else 1.0
    w.add_tensor("token_embd.weight", (embed_scale * rng.standard_normal((vocab, a.dim))).astype(np.float32))
    for i in range(a.layers):
        p = f"blk.{i}."
        w.add_tensor(p + "attn_norm.weight", norm(a.dim))
        if a.arch == "phi3":
            # One matrix: the query rows, then the key rows, then the value rows.
            w.add_tensor(p + "attn_qkv.weight", np.concatenate(
                [mat(a.heads * hd, a.dim), mat(a.kv_heads * hd, a.dim), mat(a.kv_heads * hd, a.dim)]))
        else:
            w.add_tensor(p + "attn_q.weight", mat(a.heads * hd, a.dim))
            w.add_tensor(p + "attn_k.weight", mat(a.kv_heads * hd, a.dim))
            w.add_tensor(p + "attn_v.weight", mat(a.kv_heads * hd, a.dim))
        w.add_tensor(p + "attn_output.weight", mat(a.dim, a.heads * hd))
        if a.arch == "qwen2":
            w.add_tensor(p + "attn_q.bias", (0.1 * rng.standard_normal(a.heads * hd)).astype(np.float32))
            w.add_tensor(p + "attn_k.bias", (0.1 * rng.standard_normal(a.kv_heads * hd)).astype(np.float32))
            w.add_tensor(p + "attn_v.bias", (0.1 * rng.standard_normal(a.kv_heads * hd)).astype(np.float32))
        elif a.arch == "qwen3":
            w.add_tensor(p + "attn_q_norm.weight", norm(hd))
            w.add_tensor(p + "attn_k_norm.weight", norm(hd))
        w.add_tensor(p + "ffn_norm.weight", norm(a.dim))
        if a.arch == "phi3":
            # One matrix: the gate rows (through SiLU), then the up rows.
            w.add_tensor(p + "ffn_up.weight", np.concatenate([mat(a.ffn, a.dim), mat(a.ffn, a.dim)]))
        else:
            w.add_tensor(p + "ffn_gate.weight", mat(a.ffn, a.dim))
            w.add_tensor(p + "ffn_up.weight", mat(a.ffn, a.dim))
        w.add_tensor(p + "ffn_down.weight", mat(a.dim, a.ffn))
    if a.rope_freqs:
        # Llama 3's shape: the slow frequencies slowed 8x, the fast ones kept, a ramp between.
        n = hd // 2
        w.add_tensor("rope_freqs.weight", np.array([1.0 + 7.0 * min(1.0, max(0.0, (i - n / 4) / (n / 2)))
                                                     for i in range(n)], dtype=np.float32))
    if a.arch == "phi3":
        n = rot // 2
        w.add_tensor("rope_factors_short.weight", (1.0 + 0.5 * rng.random(n)).astype(np.float32))
        w.add_tensor("rope_factors_long.weight", (1.0 + 30.0 * np.linspace(0, 1, n) ** 2).astype(np.float32))
    w.add_tensor("output_norm.weight", norm(a.dim))
    if a.arch != "phi3":  # Phi-4-mini ties its output to the embedding
        w.add_tensor("output.weight", mat(vocab, a.dim))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    main()
