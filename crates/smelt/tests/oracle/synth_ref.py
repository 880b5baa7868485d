"""Greedy generation in llama.cpp (llama-cpp-python) for the synthetic-architecture test
(crates/smelt/tests/synth_arch.rs): one model, several prompts, with each step's logit margin.

usage: synth_ref.py MODEL N_TOKENS PROMPTS_JSON
PROMPTS_JSON is a file holding a JSON list of prompt strings. Prints one JSON object per
prompt, one a line, in order:
  {"prompt": [ids], "tokens": [ids], "margins": [top1 - top2 logit, one per token]}
The margins say how far each greedy choice was from a tie, so a mismatch can be told apart
from a rounding flip. One thread, as llama.cpp's result must not depend on the pool.
"""
import json
import sys

import numpy as np
import llama_cpp
from llama_cpp import Llama


def main():
    if len(sys.argv) != 4:
        print(__doc__, file=sys.stderr)
        return 2
    model, n, prompts_path = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    with open(prompts_path, encoding="utf-8") as f:
        prompts = json.load(f)
    llm = Llama(model_path=model, n_ctx=256, n_threads=1, n_threads_batch=1, n_batch=64,
                logits_all=False, seed=0, verbose=False)
    n_vocab = llm.n_vocab()
    for text in prompts:
        prompt = llm.tokenize(text.encode(), add_bos=True, special=False)
        llm.reset()
        llm.eval(prompt)
        tokens, margins = [], []
        for _ in range(n):
            # The last evaluated token's logits, straight from llama.cpp (llama-cpp-python
            # keeps no copy unless logits_all).
            ptr = llama_cpp.llama_get_logits_ith(llm._ctx.ctx, -1)
            logits = np.ctypeslib.as_array(ptr, shape=(n_vocab,)).copy()
            if not np.all(np.isfinite(logits)):
                print(json.dumps({"error": "non-finite logits", "tokens": tokens}))
                return 1
            top2 = np.partition(logits, -2)[-2:]
            tok = int(np.argmax(logits))  # greedy: the first of equal maxima, as llama.cpp
            tokens.append(tok)
            margins.append(float(top2[1] - top2[0]))
            llm.eval([tok])
        print(json.dumps({"prompt": prompt, "tokens": tokens, "margins": margins}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
