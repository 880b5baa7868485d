"""llama.cpp's perplexity (the method of tools/perplexity, with llama-cpp-python 0.3.36).

usage: llamacpp_perplexity.py MODEL TEXT_FILE [CTX]
The text is tokenized with BOS as the GGUF says; it is cut into non-overlapping windows of
CTX tokens (a window's first token replaced by BOS when the model adds BOS); only the second
half of each window is scored (logits at positions CTX/2 .. CTX-2 predict the next token).
Prints progress, then one JSON line {"ppl", "windows", "tokens"}.
"""
import json
import math
import sys

import numpy as np
from llama_cpp import Llama


def main():
    model, text_path = sys.argv[1], sys.argv[2]
    n_ctx = int(sys.argv[3]) if len(sys.argv) > 3 else 512
    llm = Llama(model_path=model, n_ctx=n_ctx, n_batch=n_ctx, n_ubatch=n_ctx, n_threads=1, n_threads_batch=1,
                logits_all=True, seed=0, verbose=False)
    add_bos = llm._model.add_bos_token() if hasattr(llm._model, "add_bos_token") else True
    with open(text_path, "rb") as f:
        tokens = llm.tokenize(f.read(), add_bos=add_bos, special=False)
    if len(tokens) < 2 * n_ctx:
        sys.exit(f"need at least {2 * n_ctx} tokens, the text has {len(tokens)}")
    n_chunk = len(tokens) // n_ctx
    first = n_ctx // 2
    nll, count = 0.0, 0
    for i in range(n_chunk):
        window = list(tokens[i * n_ctx:(i + 1) * n_ctx])
        if add_bos:
            window[0] = llm.token_bos()
        llm.reset()
        llm.eval(window)
        logits = np.asarray(llm.scores[:n_ctx], dtype=np.float32)
        for j in range(first, n_ctx - 1):
            row = logits[j]
            m = float(row.max())
            # float exps summed in double, as llama.cpp's log_softmax does
            sum_exp = float(np.exp(row - np.float32(m), dtype=np.float32).astype(np.float64).sum())
            nll -= float(row[window[j + 1]]) - m - math.log(sum_exp)
            count += 1
        print(f"[{i + 1}] {math.exp(nll / count):.4f}", file=sys.stderr, flush=True)
    print(json.dumps({"ppl": math.exp(nll / count), "windows": n_chunk, "tokens": len(tokens)}))


if __name__ == "__main__":
    main()
