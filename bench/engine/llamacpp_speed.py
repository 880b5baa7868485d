"""llama.cpp's CPU speed (llama-cpp-python 0.3.36) on the same prompt ids smelt gets.

usage: llamacpp_speed.py MODEL IDS_FILE N_DECODE THREADS REPS
IDS_FILE holds the prompt's ids, comma-separated. Prefill is one eval of the whole prompt
(n_batch = its length); decode is N_DECODE single-token evals with greedy argmax, timed
around eval only. Prints one JSON line with the best of REPS runs: {"pp": tok/s, "tg": tok/s}.
"""
import json
import sys
import time

import llama_cpp
import numpy as np
from llama_cpp import Llama


def main():
    model, ids_path, n_decode, threads, reps = sys.argv[1:6]
    n_decode, threads, reps = int(n_decode), int(threads), int(reps)
    with open(ids_path) as f:
        ids = [int(x) for x in f.read().strip().split(",")]
    llm = Llama(model_path=model, n_ctx=len(ids) + n_decode + 16, n_batch=len(ids),
                n_ubatch=len(ids), n_threads=threads, n_threads_batch=threads,
                logits_all=False, seed=0, verbose=False)
    best_pp, best_tg = 0.0, 0.0
    for _ in range(reps):
        llm.reset()
        t0 = time.perf_counter()
        llm.eval(ids)
        pp = len(ids) / (time.perf_counter() - t0)
        spent = 0.0
        for _ in range(n_decode - 1):
            logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm._ctx.ctx, -1),
                                           shape=(llm.n_vocab(),))
            tok = int(np.argmax(logits))
            t1 = time.perf_counter()
            llm.eval([tok])
            spent += time.perf_counter() - t1
        tg = (n_decode - 1) / spent
        best_pp, best_tg = max(best_pp, pp), max(best_tg, tg)
    print(json.dumps({"pp": best_pp, "tg": best_tg}))


if __name__ == "__main__":
    main()
