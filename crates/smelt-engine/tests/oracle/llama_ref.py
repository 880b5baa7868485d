"""Reference outputs from llama.cpp (llama-cpp-python 0.3.36) for smelt-engine's tests.

usage: llama_ref.py MODEL OUT_DIR N_GEN

Writes OUT_DIR/ref.json: for each prompt, the prompt token ids (llama.cpp's own tokenizer,
so the Rust test does not depend on ours), the greedy continuation of N_GEN tokens (argmax
of llama.cpp's logits, fed back one token at a time), and the top-1/top-2 logit gap at each
step (to tell floating-point ties from real divergences). The last prompt position's logits
go to OUT_DIR/logits_<i>.f32 (little-endian f32).
"""
import json
import os
import sys

import numpy as np
from llama_cpp import Llama

RAW = [
    "The capital of France is",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "Once upon a time, in a small village by the sea, there lived",
    "1, 2, 3, 5, 8, 13, 21,",
    "Translate to German: The weather is nice today.\nGerman:",
    "  Whitespace   runs\tand\ttabs\n\n and unicode: café, naïve, 日本語, emoji 🚀.",
    "The three laws of thermodynamics are",
    "SELECT name, COUNT(*) FROM users WHERE age > 30 GROUP BY",
]
CHAT = [
    "What is the boiling point of water at sea level?",
    "Write a haiku about autumn leaves.",
    "Explain recursion to a five-year-old.",
    "List three prime numbers greater than 100.",
]


def chat_text(arch, msg):
    if arch == "gemma3":
        return f"<start_of_turn>user\n{msg}<end_of_turn>\n<start_of_turn>model\n"
    return f"<|im_start|>user\n{msg}<|im_end|>\n<|im_start|>assistant\n"


def last_logits(llm):
    """The last evaluated token's logits (llama-cpp-python keeps `scores` only with
    logits_all, so read the context's buffer)."""
    n = llm.n_vocab()
    return np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(n,)).astype(np.float32).copy()


def main():
    model, out_dir, n_gen = sys.argv[1], sys.argv[2], int(sys.argv[3])
    os.makedirs(out_dir, exist_ok=True)
    llm = Llama(model_path=model, n_ctx=1024, n_batch=512, n_threads=1, n_threads_batch=1, verbose=False)
    arch = llm.metadata.get("general.architecture", "")
    prompts = [(p, False) for p in RAW] + [(chat_text(arch, m), True) for m in CHAT]
    cases = []
    for i, (text, special) in enumerate(prompts):
        ids = llm.tokenize(text.encode("utf-8"), add_bos=True, special=special)
        llm.reset()
        llm.eval(ids)
        logits = last_logits(llm)
        logits.tofile(os.path.join(out_dir, f"logits_{i}.f32"))
        gen, gaps = [], []
        cur = logits
        for _ in range(n_gen):
            top2 = np.argsort(cur)[-2:]
            gaps.append(float(cur[top2[1]] - cur[top2[0]]))
            tok = int(np.argmax(cur))
            gen.append(tok)
            llm.eval([tok])
            cur = last_logits(llm)
        cases.append({"text": text, "chat": special, "ids": ids, "greedy": gen, "gaps": gaps})
    with open(os.path.join(out_dir, "ref.json"), "w") as f:
        json.dump({"n_vocab": llm.n_vocab(), "cases": cases}, f)


if __name__ == "__main__":
    main()
