#!/usr/bin/env python3
"""reagent's tokenization against llama.cpp's (and tiktoken's, for an o200k file) on texts of many kinds.

    compare_tokens.py MODEL.gguf [REAGENT_BIN] [--o200k-ranks RANKS]

MODEL: a GGUF file reagent loads (a random-weight file from `random_gguf.py` whose tokenizer came from a
catalog file or from `o200k_vocab.py`). With `--o200k-ranks` (js-tiktoken's `o200k_base.cjs`) and the
`tiktoken` package, the ids are also checked against tiktoken's own o200k encoder on the same ranks, which
is then the reference (llama.cpp's differences from it are reported). Exits non-zero when a text tokenizes
differently from the reference.
"""
import argparse
import json
import subprocess
import sys

TEXTS = [
    "Hello, world!",
    "I'll go; they're here, we've seen it, DON'T SHOUT, You'RE Welcome.",
    "The year 2024 had 366 days; 1234567890 and 3.14159 and -42 and 1e-9.",
    "   leading spaces, trailing spaces   ",
    "tabs\tand\nnewlines\n\n\nand \r\n windows line ends\r\n",
    "def f(x):\n    return {\"a\": [1, 2, 3], 'b': x ** 2}  # comment\n",
    "fn main() { let v: Vec<u32> = (0..10).map(|i| i * 2).collect(); println!(\"{v:?}\"); }",
    "Ünïcödé façade naïve coöperate Straße ÆØÅ æøå",
    "你好，世界！这是一个测试。日本語のテキストも。한국어 문장도 있습니다.",
    "Привет, мир! Это тест. Ελληνικά κείμενα. עברית. العربية. हिन्दी पाठ।",
    "emoji 😀🎉👍🏽 and flags 🇳🇴🇯🇵 and ZWJ 👨‍👩‍👧‍👦",
    "camelCaseWords PascalCase snake_case SCREAMING_CASE kebab-case HTTPServerError",
    "URL https://example.org/path?query=1&b=2#frag and email someone@example.org",
    "<|endoftext|> stays text here, and so does <tool_call>",
    "mixed 123abc abc123 a1b2c3 ١٢٣ ٤٥٦ Ⅻ ½ ²",
    "a/b//c///d ... ?!?! --- *** ___ ~~~ ``` '''",
    "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\", \"days\": 3}}",
    "",
    " ",
    "\n",
]


def reagent_ids(binary, model, text):
    out = subprocess.run([binary, "tokenize", "--model", model, "--text", text], capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"reagent tokenize failed: {out.stderr.strip()}")
    return json.loads(out.stdout)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("binary", nargs="?", default="target/release/reagent")
    ap.add_argument("--o200k-ranks")
    a = ap.parse_args()
    from llama_cpp import Llama

    llm = Llama(a.model, vocab_only=True, verbose=False)
    tik = None
    if a.o200k_ranks:
        import base64
        import tiktoken

        sys.path.insert(0, __file__.rsplit("/", 1)[0])
        from o200k_vocab import read_ranks

        ranks, _, pattern = read_ranks(a.o200k_ranks)
        tik = tiktoken.Encoding("o200k", pat_str=pattern, mergeable_ranks=ranks, special_tokens={})
    bad = 0
    for text in TEXTS:
        ours = reagent_ids(a.binary, a.model, text)
        theirs = llm.tokenize(text.encode(), add_bos=False, special=False)
        row = {"text": text[:40], "tokens": len(ours), "llama.cpp": ours == theirs}
        if tik is not None:
            row["tiktoken"] = ours == tik.encode(text)
        reference = "tiktoken" if tik is not None else "llama.cpp"
        if not row[reference]:
            bad += 1
        if not all(v for k, v in row.items() if k in ("llama.cpp", "tiktoken")):
            row["reagent"], row["llama.cpp ids"] = ours, theirs
        print(json.dumps(row, ensure_ascii=False))
    reference = "tiktoken" if tik is not None else "llama.cpp"
    print(f"{len(TEXTS) - bad}/{len(TEXTS)} texts tokenize as {reference} does")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
