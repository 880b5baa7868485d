"""llama.cpp's answers (llama-cpp-python 0.3.36) to the requests an lm-eval run sent, read back
from that run's `--log_samples` files, so tests/server/test_lmeval.py can check that lm-eval
scores `smelt serve` as it would score llama.cpp on the same model and samples.

usage: llamacpp_lmeval.py MODEL MC_SAMPLES.jsonl GEN_SAMPLES.jsonl
- multiple choice (lm-eval `local-completions`, log-likelihood): each (context, continuation)
  pair is tokenized as lm-eval's `_encode_pair` does (trailing spaces of the context moved to
  the continuation; whole = encode(context + continuation), context = encode(context), no BOS,
  special-token text parsed, as vLLM's `/tokenize` with add_special_tokens false), evaluated in
  one batch with every position's logits, and scored as lm-eval does: the sum of the
  continuation tokens' log-probabilities, and whether each was the argmax.
- generation (lm-eval `local-chat-completions`): the logged chat messages through the GGUF's
  chat template (llama-cpp-python's own Jinja formatter), greedy, with the logged `until` stop
  strings and `max_gen_toks`.
Prints one JSON line: {"mc": [{"doc_id", "ll": [...], "greedy": [...], "tok": [[[text, ids],
[text, ids]] per choice: the context's and the whole's tokens]}],
"gen": [{"doc_id", "text"}]}.
"""
import json
import sys

import numpy as np
from llama_cpp import Llama


def read(path):
    with open(path) as f:
        return sorted((json.loads(line) for line in f if line.strip()), key=lambda d: d["doc_id"])


def log_softmax_row(row):
    row = row.astype(np.float64)
    m = row.max()
    return row - m - np.log(np.exp(row - m).sum())


def main():
    model, mc_path, gen_path = sys.argv[1:4]
    llm = Llama(model_path=model, n_ctx=512, n_batch=512, n_ubatch=512, n_threads=1,
                n_threads_batch=1, logits_all=True, seed=0, verbose=False)

    def enc(text):
        return list(llm.tokenize(text.encode("utf-8"), add_bos=False, special=True))

    mc = []
    for s in read(mc_path):
        lls, greedy, ids_all = [], [], []
        for k in sorted(s["arguments"], key=lambda k: int(k.rsplit("_", 1)[1])):
            ctx, cont = s["arguments"][k]["arg_0"], s["arguments"][k]["arg_1"]
            n = len(ctx) - len(ctx.rstrip())
            if n:
                cont, ctx = ctx[-n:] + cont, ctx[:-n]
            whole = enc(ctx + cont)
            ctx_ids = enc(ctx)
            cont_ids = whole[len(ctx_ids):]
            if not ctx_ids or not cont_ids:
                sys.exit(f"doc {s['doc_id']}: empty context or continuation after tokenizing")
            ids = ctx_ids + cont_ids
            llm.reset()
            llm.eval(ids)
            logits = np.asarray(llm.scores[: len(ids)], dtype=np.float32)
            ll, g = 0.0, True
            for i in range(len(ctx_ids), len(ids)):
                lp = log_softmax_row(logits[i - 1])
                ll += float(lp[ids[i]])
                g = g and int(np.argmax(logits[i - 1])) == ids[i]
            lls.append(ll)
            greedy.append(g)
            ids_all.append([[ctx, ctx_ids], [ctx + cont, whole]])
        mc.append({"doc_id": s["doc_id"], "ll": lls, "greedy": greedy, "tok": ids_all})

    gen = []
    for s in read(gen_path):
        args = s["arguments"]["gen_args_0"]
        chat = args["arg_0"]
        messages = json.loads(chat[0] if isinstance(chat, list) else chat)
        kw = args["arg_1"]
        until = kw.get("until") or []
        out = llm.create_chat_completion(messages=messages, temperature=0.0,
                                         max_tokens=int(kw["max_gen_toks"]), stop=until, seed=1234)
        gen.append({"doc_id": s["doc_id"], "text": out["choices"][0]["message"]["content"] or ""})
    print(json.dumps({"mc": mc, "gen": gen}))


if __name__ == "__main__":
    main()
