"""Writes a tiny random-weight GGUF of an architecture with no small real model on PyPI, with
gguf-py (0.19.0), for the llama.cpp parity tests (tests/moe_arch.rs).

usage: tiny_arch.py ARCH TYPE OUT
  ARCH: qwen3moe | mixtral (a `llama` file with experts)
  TYPE: f32 | f16 | q8_0 (the matrices' type; norms and the router stay f32, as llama.cpp's
        quantizer keeps them)

Three layers, 20 experts of which 4 run per token (a softmax over 20 takes ggml's vector exp
for 16 and libm's for 4), a 512-token SentencePiece vocabulary (byte tokens, so llama.cpp
loads it; the tests feed token ids), weights scaled so logits are peaked (greedy choices are
decided by the architecture, not by rounding). Same seed, same bytes.
"""
import sys

import numpy as np
import gguf

E, HEADS, KV, HD = 64, 4, 2, 32
N_EXPERT, N_USED, FF_EXP, FF_DENSE = 20, 4, 64, 96
LAYERS, VOCAB, CTX = 3, 512, 512


def vocab(w):
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [2, 3, 3] + [6] * 256
    i = 0
    while len(tokens) < VOCAB:
        tokens.append(f"\u2581t{i}")
        types.append(1)
        i += 1
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores([-float(j) for j in range(VOCAB)])
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)


def main():
    arch, ty, out = sys.argv[1], sys.argv[2], sys.argv[3]
    gguf_arch = {"qwen3moe": "qwen3moe", "mixtral": "llama"}[arch]
    qtype = {"f32": gguf.GGMLQuantizationType.F32, "f16": gguf.GGMLQuantizationType.F16,
             "q8_0": gguf.GGMLQuantizationType.Q8_0}[ty]
    rng = np.random.default_rng(16)
    w = gguf.GGUFWriter(out, gguf_arch)
    w.add_name(f"tiny-{arch}")
    w.add_block_count(LAYERS)
    w.add_context_length(CTX)
    w.add_embedding_length(E)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_expert_count(N_EXPERT)
    w.add_expert_used_count(N_USED)
    if arch == "qwen3moe":
        # Real Qwen3-MoE files carry both: the dense size and the (smaller) expert size.
        w.add_feed_forward_length(FF_DENSE)
        w.add_expert_feed_forward_length(FF_EXP)
        w.add_key_length(HD)
        w.add_value_length(HD)
        w.add_rope_freq_base(1000000.0)
        hd = HD
    else:
        w.add_feed_forward_length(FF_EXP)
        w.add_rope_freq_base(1000000.0)
        w.add_rope_dimension_count(E // HEADS)
        hd = E // HEADS
    vocab(w)

    def mat(name, *shape, std, quant=True):
        a = (rng.standard_normal(shape) * std).astype(np.float32)
        if not quant or qtype == gguf.GGMLQuantizationType.F32:
            w.add_tensor(name, a)
        elif qtype == gguf.GGMLQuantizationType.F16:
            w.add_tensor(name, a.astype(np.float16))
        else:
            w.add_tensor(name, gguf.quants.quantize(a, qtype), raw_dtype=qtype)

    def norm(name, n):
        w.add_tensor(name, rng.uniform(0.8, 1.2, n).astype(np.float32))

    mat("token_embd.weight", VOCAB, E, std=1.0)
    norm("output_norm.weight", E)
    mat("output.weight", VOCAB, E, std=0.5)
    for il in range(LAYERS):
        b = f"blk.{il}."
        norm(b + "attn_norm.weight", E)
        mat(b + "attn_q.weight", HEADS * hd, E, std=0.6 / np.sqrt(E))
        mat(b + "attn_k.weight", KV * hd, E, std=0.6 / np.sqrt(E))
        mat(b + "attn_v.weight", KV * hd, E, std=1.0 / np.sqrt(E))
        mat(b + "attn_output.weight", E, HEADS * hd, std=1.0 / np.sqrt(HEADS * hd))
        if arch == "qwen3moe":
            norm(b + "attn_q_norm.weight", hd)
            norm(b + "attn_k_norm.weight", hd)
        norm(b + "ffn_norm.weight", E)
        # Router logits of a few units, so top-k choices are clear-cut.
        mat(b + "ffn_gate_inp.weight", N_EXPERT, E, std=2.0 / np.sqrt(E), quant=False)
        mat(b + "ffn_gate_exps.weight", N_EXPERT, FF_EXP, E, std=1.0 / np.sqrt(E))
        mat(b + "ffn_up_exps.weight", N_EXPERT, FF_EXP, E, std=1.0 / np.sqrt(E))
        mat(b + "ffn_down_exps.weight", N_EXPERT, E, FF_EXP, std=1.5 / np.sqrt(FF_EXP))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    main()
