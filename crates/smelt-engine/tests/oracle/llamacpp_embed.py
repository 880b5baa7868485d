"""llama.cpp's embeddings of a decoder model (llama-cpp-python 0.3.36, embedding mode).

usage: llamacpp_embed.py MODEL POOLING TEXT [TEXT ...]
POOLING is mean, cls or last. Each text is tokenized as llama.cpp's embedding path does
(BOS as the GGUF says, special tokens parsed as text), runs as its own sequence, and its
final-norm rows are pooled by llama.cpp and L2-normalized (llama-cpp-python's
`embed(normalize=True)`, i.e. common_embd_normalize(.., 2)).
Prints one JSON line {"tokens": [[ids], ...], "embeddings": [[floats], ...]}.
"""
import json
import sys

import llama_cpp
from llama_cpp import Llama

POOLING = {
    "mean": llama_cpp.LLAMA_POOLING_TYPE_MEAN,
    "cls": llama_cpp.LLAMA_POOLING_TYPE_CLS,
    "last": llama_cpp.LLAMA_POOLING_TYPE_LAST,
}


def main():
    model, pooling, texts = sys.argv[1], sys.argv[2], sys.argv[3:]
    llm = Llama(model_path=model, embedding=True, pooling_type=POOLING[pooling], n_ctx=512, n_batch=512,
                n_ubatch=512, n_threads=1, n_threads_batch=1, seed=0, verbose=False)
    tokens = [llm.tokenize(t.encode("utf-8"), add_bos=True, special=False) for t in texts]
    # 7 significant digits keep the committed records small; the test's bar is far looser.
    embeddings = [[float(f"{x:.7g}") for x in e] for e in llm.embed(texts, normalize=True)]
    print(json.dumps({"tokens": tokens, "embeddings": embeddings}))


if __name__ == "__main__":
    main()
