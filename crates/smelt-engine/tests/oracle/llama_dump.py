"""llama.cpp's intermediate tensors for smelt's per-op tests (llama-cpp-python 0.3.36).

usage: llama_dump.py MODEL PROMPT OUT_DIR

Evaluates the prompt (BOS added, special tokens not parsed) in one batch on one thread
without flash attention, with an eval callback that saves every contiguous f32 tensor of
the graph to OUT_DIR/<name>#<k>.f32 (the k-th tensor of that name, little-endian f32, ggml
order) and the prompt ids to OUT_DIR/ids.i32.
"""
import ctypes
import os
import sys

import numpy as np
import llama_cpp
from llama_cpp import llama_cpp as L


def main():
    model, text, out_dir = sys.argv[1], sys.argv[2], sys.argv[3]
    os.makedirs(out_dir, exist_ok=True)
    lib = os.path.join(os.path.dirname(llama_cpp.__file__), "lib")
    base = ctypes.CDLL(os.path.join(lib, "libggml-base.so"))
    base.ggml_get_name.restype = ctypes.c_char_p
    base.ggml_get_name.argtypes = [ctypes.c_void_p]
    base.ggml_nelements.restype = ctypes.c_int64
    base.ggml_nelements.argtypes = [ctypes.c_void_p]
    base.ggml_is_contiguous.restype = ctypes.c_bool
    base.ggml_is_contiguous.argtypes = [ctypes.c_void_p]
    base.ggml_get_data.restype = ctypes.c_void_p
    base.ggml_get_data.argtypes = [ctypes.c_void_p]
    seen = {}

    @ctypes.CFUNCTYPE(ctypes.c_bool, ctypes.c_void_p, ctypes.c_bool, ctypes.c_void_p)
    def callback(t, ask, _user):
        if ask:
            return True
        name = base.ggml_get_name(t).decode()
        ty = ctypes.c_int.from_address(t).value  # struct ggml_tensor starts with its type
        if ty == 0 and base.ggml_is_contiguous(t):
            n = base.ggml_nelements(t)
            k = seen.get(name, 0)
            seen[name] = k + 1
            arr = np.ctypeslib.as_array((ctypes.c_float * n).from_address(base.ggml_get_data(t)))
            arr.tofile(os.path.join(out_dir, f"{name}#{k}.f32"))
        return True

    L.llama_backend_init()
    m = L.llama_model_load_from_file(model.encode(), L.llama_model_default_params())
    cp = L.llama_context_default_params()
    cp.n_ctx, cp.n_batch, cp.n_threads, cp.n_threads_batch = 1024, 512, 1, 1
    cp.cb_eval = ctypes.cast(callback, type(cp.cb_eval))
    cp.cb_eval_user_data = None
    cp.flash_attn_type = L.LLAMA_FLASH_ATTN_TYPE_DISABLED
    ctx = L.llama_init_from_model(m, cp)
    vocab = L.llama_model_get_vocab(m)
    raw = text.encode()
    buf = (L.llama_token * 4096)()
    n = L.llama_tokenize(vocab, raw, len(raw), buf, 4096, True, False)
    assert n > 0, n
    toks = (L.llama_token * n)(*buf[:n])
    assert L.llama_decode(ctx, L.llama_batch_get_one(toks, n)) == 0
    np.array(list(toks), dtype=np.int32).tofile(os.path.join(out_dir, "ids.i32"))


if __name__ == "__main__":
    main()
