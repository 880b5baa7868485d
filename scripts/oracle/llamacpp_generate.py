"""Greedy generation in llama.cpp (llama-cpp-python 0.3.36) for smelt's generation tests.

usage: llamacpp_generate.py MODEL CASES.json
CASES.json is a list of {"text": str, "special": bool, "ids": [int], "n": int,
"smelt": [int] (optional)}: "ids" are smelt's prompt token ids, fed to llama.cpp as they
are; "text" is the prompt smelt tokenized (raw, or chat-templated with "special" true), which
llama.cpp tokenizes itself so the test can check both tokenizers agree.

Prints one JSON line per case: {"tokenized": [...], "tokens": [...], "flash_attn_tokens":
[...], "divergence": null or {"pos", "llama": id, "smelt": id, "gap": logit[llama] -
logit[smelt]}} where the divergence (when "smelt" tokens were given) is measured on
llama.cpp's own logits at the first position the two disagree, and "flash_attn_tokens" is
llama.cpp's greedy continuation with flash attention on: a test can tell a floating-point
tie (llama.cpp flips too under that exact-in-real-arithmetic change) from a real bug.
"""
import json
import sys

import llama_cpp
import numpy as np
from llama_cpp import Llama


def tokenize(llm, text, special):
    """llama.cpp's tokenization: BOS as the GGUF says; a chat prompt whose template already
    wrote the BOS text keeps one BOS, as llama.cpp's chat path does."""
    add_bos = llm._model.add_bos_token() if hasattr(llm._model, "add_bos_token") else True
    ids = llm.tokenize(text.encode(), add_bos=add_bos, special=special)
    bos = llm.token_bos()
    if special and len(ids) >= 2 and ids[0] == bos and ids[1] == bos:
        ids = ids[1:]
    return ids


def greedy(llm, ids, n):
    """llama.cpp's greedy continuation of ids; with each step's logits."""
    llm.reset()
    llm.eval(list(ids))
    out, steps = [], []
    for _ in range(n):
        # The last token's row (llama-cpp-python keeps no scores without logits_all).
        ptr = llama_cpp.llama_get_logits_ith(llm._ctx.ctx, -1)
        logits = np.ctypeslib.as_array(ptr, shape=(llm.n_vocab(),)).copy()
        tok = int(np.argmax(logits))  # the first maximum: llama.cpp's greedy sampler
        out.append(tok)
        steps.append(logits)
        if is_eog(llm, tok):
            break
        llm.eval([tok])
    return out, steps


def main():
    model, cases_path = sys.argv[1], sys.argv[2]
    with open(cases_path) as f:
        cases = json.load(f)
    longest = max(len(c["ids"]) + c["n"] for c in cases)
    n_ctx = max(256, 1 << (longest - 1).bit_length())
    # One thread: the ids do not depend on it, and ggml's spinning workers crawl when tests
    # run side by side on a 2-core machine. The second context differs only in flash
    # attention, which is exact in real arithmetic: where the two disagree, llama.cpp's own
    # choice is decided by rounding (a floating-point tie).
    def load(flash):
        return Llama(model_path=model, n_ctx=n_ctx, n_batch=512, n_threads=1, n_threads_batch=1, logits_all=False,
                     flash_attn=flash, seed=0, verbose=False)
    llm, alt = load(False), load(True)
    for c in cases:
        tokenized = tokenize(llm, c["text"], c["special"])
        out, steps = greedy(llm, c["ids"], c["n"])
        alt_out, _ = greedy(alt, c["ids"], c["n"])
        divergence = None
        smelt = c.get("smelt")
        if smelt is not None:
            for i, (tok, logits) in enumerate(zip(out, steps)):
                if i < len(smelt) and smelt[i] != tok:
                    divergence = {"pos": i, "llama": tok, "smelt": int(smelt[i]),
                                  "gap": float(logits[tok] - logits[smelt[i]])}
                    break
        print(json.dumps({"tokenized": tokenized, "tokens": out, "flash_attn_tokens": alt_out,
                          "divergence": divergence}), flush=True)


def is_eog(llm, tok):
    """End of generation (eos, eot, <end_of_turn> ...), as llama.cpp's vocab says."""
    return bool(llama_cpp.llama_vocab_is_eog(llama_cpp.llama_model_get_vocab(llm._model.model), tok))


if __name__ == "__main__":
    sys.exit(main())
