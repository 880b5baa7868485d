"""Greedy generation in llama.cpp (llama-cpp-python) for smelt's integration tests.

usage: greedy.py MODEL N_TOKENS (--prompt TEXT | --ids 1,2,3)
Prints one JSON object: {"tokens": [...], "text": "...", "n_vocab": N}. With --ids the
prompt is token ids (for models whose tokenizer is "none"); the text is then empty.
"""
import argparse
import json
import sys

import numpy as np
from llama_cpp import Llama
import llama_cpp


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("n", type=int)
    g = ap.add_mutually_exclusive_group(required=True)
    g.add_argument("--prompt")
    g.add_argument("--ids")
    a = ap.parse_args()

    llm = Llama(model_path=a.model, n_ctx=256, n_threads=1, n_threads_batch=1, n_batch=64, logits_all=False,
                seed=0, verbose=False)
    if a.prompt is not None:
        prompt = llm.tokenize(a.prompt.encode(), add_bos=True, special=False)
    else:
        prompt = [int(x) for x in a.ids.split(",")]
    out = []
    # temp 0 is llama.cpp's greedy sampler; no penalties, so this is argmax decoding.
    for tok in llm.generate(prompt, top_k=1, top_p=1.0, min_p=0.0, temp=0.0,
                            repeat_penalty=1.0, reset=True):
        out.append(int(tok))
        if len(out) >= a.n:
            break
    # The logits that chose the last token, read from the context itself: with
    # logits_all=False llama-cpp-python leaves `_scores` as zeros, so a check on it could
    # never fail.
    ptr = llama_cpp.llama_get_logits_ith(llm._ctx.ctx, -1)
    last = np.ctypeslib.as_array(ptr, shape=(llm.n_vocab(),)).astype(np.float32)
    if not np.all(np.isfinite(last)):
        print(json.dumps({"error": "non-finite logits", "tokens": out}))
        return 1
    if out and int(np.argmax(last)) != out[-1]:
        print(json.dumps({"error": "last logits do not pick the last greedy token", "tokens": out}))
        return 1
    text = ""
    if a.prompt is not None:
        text = llm.detokenize(out).decode("utf-8", errors="replace")
    print(json.dumps({"tokens": out, "text": text, "n_vocab": llm.n_vocab()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
