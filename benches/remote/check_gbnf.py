"""Whether llama.cpp's grammar parser takes every GBNF file in a folder (`cargo run --example gbnf`).

    python benches/remote/check_gbnf.py MODEL.gguf DIR

Needs llama-cpp-python; the model's vocabulary only is loaded. Exits 1 naming each file refused.
"""
import glob
import os
import sys

import llama_cpp


def main():
    model, folder = sys.argv[1], sys.argv[2]
    llm = llama_cpp.Llama(model, vocab_only=True, verbose=False)
    vocab = llm._model.vocab

    def takes(text):
        sampler = llama_cpp.llama_sampler_init_grammar(vocab, text.encode(), b"root")
        if not sampler:
            return False
        llama_cpp.llama_sampler_free(sampler)
        return True

    # The check itself must be able to fail.
    assert takes('root ::= "a"') and not takes("root ::= undefined-rule"), "llama.cpp's parser not reached"
    files = sorted(glob.glob(os.path.join(folder, "*.gbnf")))
    refused = [os.path.basename(p) for p in files if not takes(open(p, encoding="utf-8").read())]
    print(f"{len(files)} grammars, {len(refused)} refused by llama.cpp's parser")
    for name in refused:
        print(f"  refused: {name}")
    sys.exit(1 if refused or not files else 0)


if __name__ == "__main__":
    main()
