"""llama.cpp (llama-cpp-python's C API) on several GPUs of one machine: one GGUF with
--split-mode none (GPU 0 alone), layer, row, or tensor (llama.cpp's tensor parallelism); pp (one batch of N prompt tokens) and tg
(single-token decodes), as bench/gpu/tp.sh compares with smelt's --tp.
Usage: tp_llamacpp.py MODEL none|layer|row|tensor PP TG [REPS]"""
import ctypes, statistics, sys, time

import llama_cpp as L

path, mode = sys.argv[1], sys.argv[2]
pp, tg = int(sys.argv[3]), int(sys.argv[4])
reps = int(sys.argv[5]) if len(sys.argv) > 5 else 3
L.llama_backend_init()
mp = L.llama_model_default_params()
mp.n_gpu_layers = 999
mp.split_mode = {"none": 0, "layer": 1, "row": 2, "tensor": 3}[mode]
mp.main_gpu = 0
model = L.llama_model_load_from_file(path.encode(), mp)
assert model, "model did not load"
cp = L.llama_context_default_params()
cp.n_ctx = pp + tg + 16
cp.n_batch = pp
cp.n_ubatch = pp
cp.flash_attn_type = 1
ctx = L.llama_init_from_model(model, cp)
mem = L.llama_get_memory(ctx)


def decode(toks):
    arr = (ctypes.c_int32 * len(toks))(*toks)
    assert L.llama_decode(ctx, L.llama_batch_get_one(arr, len(toks))) == 0


pps, tgs = [], []
for r in range(reps + 1):
    L.llama_memory_clear(mem, True)
    toks = [(i * 7919 + r) % 32000 + 1 for i in range(pp)]
    t0 = time.perf_counter()
    decode(toks)
    L.llama_synchronize(ctx)
    t1 = time.perf_counter()
    for i in range(tg):
        decode([(i * 104729) % 32000 + 1])
    L.llama_synchronize(ctx)
    t2 = time.perf_counter()
    if r:
        pps.append(pp / (t1 - t0))
        tgs.append(tg / (t2 - t1))
print(f"RESULT llama.cpp split={mode} pp{pp}: {statistics.median(pps):.1f} tok/s  tg{tg}: {statistics.median(tgs):.1f} tok/s")
