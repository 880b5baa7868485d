"""llama.cpp's (llama-cpp-python 0.3.36) answers on a tiny model from tiny_arch.py, for
tests/moe_arch.rs: greedy tokens from token-id prompts and perplexity over a fixed sequence.

usage: tiny_ref.py MODEL N_GEN
Prints one JSON object: {"n_vocab", "cases": [{"prompt", "greedy", "margins", "logits"}],
"ppl_tokens", "ppl"}. Prompts of 8, 40 and 100 tokens (BOS, then ids drawn with a fixed
seed), each in one batch, then N_GEN greedy tokens fed back one at a time; "logits" is the
last prompt position's row, "margins" each step's top-1 minus top-2 logit. Perplexity: one
batch of 160 tokens, every position's logits, exp of the mean negative log-likelihood of the
next token. One thread, so the answer does not depend on the pool.
"""
import json
import sys

import numpy as np
import llama_cpp
from llama_cpp import Llama


def main():
    model, n_gen = sys.argv[1], int(sys.argv[2])
    rng = np.random.default_rng(7)
    llm = Llama(model_path=model, n_ctx=512, n_batch=512, n_ubatch=512, n_threads=1,
                n_threads_batch=1, logits_all=True, seed=0, verbose=False)
    n_vocab = llm.n_vocab()

    def row(i):
        ptr = llama_cpp.llama_get_logits_ith(llm._ctx.ctx, i)
        return np.ctypeslib.as_array(ptr, shape=(n_vocab,)).astype(np.float32).copy()

    cases = []
    for n in (8, 40, 100):
        prompt = [1] + [int(t) for t in rng.integers(3, n_vocab, n - 1)]
        llm.reset()
        llm.eval(prompt)
        cur = row(-1)
        first = cur.tolist()
        greedy, margins = [], []
        for _ in range(n_gen):
            if not np.all(np.isfinite(cur)):
                print(json.dumps({"error": "non-finite logits"}))
                return 1
            top2 = np.partition(cur, -2)[-2:]
            tok = int(np.argmax(cur))
            greedy.append(tok)
            margins.append(float(top2[1] - top2[0]))
            llm.eval([tok])
            cur = row(-1)
        cases.append({"prompt": prompt, "greedy": greedy, "margins": margins, "logits": first})

    seq = [1] + [int(t) for t in rng.integers(3, n_vocab, 159)]
    llm.reset()
    llm.eval(seq)
    nll = 0.0
    for i in range(len(seq) - 1):
        x = row(i).astype(np.float64)
        m = x.max()
        nll += (m + np.log(np.exp(x - m).sum())) - x[seq[i + 1]]
    ppl = float(np.exp(nll / (len(seq) - 1)))
    print(json.dumps({"n_vocab": n_vocab, "cases": cases, "ppl_tokens": seq, "ppl": ppl}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
