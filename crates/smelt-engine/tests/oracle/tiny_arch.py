"""Writes a tiny random-weight GGUF of an architecture with no small real model on PyPI, with
gguf-py (0.19.0), for the llama.cpp parity tests (tests/moe_arch.rs).

usage: tiny_arch.py ARCH TYPE OUT
  ARCH: qwen3moe | mixtral (a `llama` file with experts) | qwen35 (Gated DeltaNet hybrid)
        | qwen35moe (the hybrid with 20 routed experts in fused ffn_gate_up_exps, 4 per
        token, and a gated shared expert)
        | qwen3next (Qwen3-Next: the MoE hybrid with NeoX rope, split attn_qkv/attn_gate
        and fused ssm_ba) | qwen3next-fused (the same with the older fused ssm_in)
  TYPE: f32 | f16 | q8_0 (the matrices' type; norms and the router stay f32, as llama.cpp's
        quantizer keeps them)

MoE files: three layers, 20 experts of which 4 run per token (a softmax over 20 takes ggml's vector exp
for 16 and libm's for 4), a 512-token SentencePiece vocabulary (byte tokens, so llama.cpp
loads it; the tests feed token ids). qwen35: four layers, attention every third
(`full_attention_interval` 3: delta, delta, attention, delta), 2 key heads and 4 value
heads of 16, heads of 32 with 16 rotated dimensions in M-RoPE sections [3, 3, 2, 0].
Weights scaled so logits are peaked (greedy choices are
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


QTYPES = {"f32": gguf.GGMLQuantizationType.F32, "f16": gguf.GGMLQuantizationType.F16,
          "q8_0": gguf.GGMLQuantizationType.Q8_0}


def tensor_writer(w, rng, qtype):
    def mat(name, *shape, std, quant=True):
        a = (rng.standard_normal(shape) * std).astype(np.float32)
        if not quant or qtype == gguf.GGMLQuantizationType.F32:
            w.add_tensor(name, a)
        elif qtype == gguf.GGMLQuantizationType.F16:
            w.add_tensor(name, a.astype(np.float16))
        else:
            w.add_tensor(name, gguf.quants.quantize(a, qtype), raw_dtype=qtype)

    def vec(name, n, lo, hi):
        w.add_tensor(name, rng.uniform(lo, hi, n).astype(np.float32))

    return mat, vec


def hybrid(gguf_arch, ty, out, moe=False, fused=False):
    nxt = gguf_arch == "qwen3next"
    S, HK, HV, KERNEL, LAYERS_H, EVERY, FF = 16, 2, 4, 4, 4, 3, 96
    rng = np.random.default_rng(35)
    w = gguf.GGUFWriter(out, gguf_arch)
    w.add_name("tiny-qwen35")
    w.add_block_count(LAYERS_H)
    w.add_context_length(CTX)
    w.add_embedding_length(E)
    w.add_feed_forward_length(FF)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV)
    w.add_key_length(HD)
    w.add_value_length(HD)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_freq_base(10000000.0)
    w.add_rope_dimension_count(16)
    if not nxt:
        w.add_rope_dimension_sections([3, 3, 2, 0])
    w.add_ssm_conv_kernel(KERNEL)
    w.add_ssm_inner_size(HV * S)
    w.add_ssm_state_size(S)
    w.add_ssm_time_step_rank(HV)
    w.add_ssm_group_count(HK)
    w.add_full_attention_interval(EVERY)
    if moe:
        w.add_expert_count(N_EXPERT)
        w.add_expert_used_count(N_USED)
        w.add_expert_feed_forward_length(FF_EXP)
        w.add_expert_shared_feed_forward_length(FF)
    vocab(w)
    mat, vec = tensor_writer(w, rng, QTYPES[ty])
    mat("token_embd.weight", VOCAB, E, std=1.0)
    vec("output_norm.weight", E, 0.8, 1.2)
    mat("output.weight", VOCAB, E, std=0.5)
    conv_ch = (2 * HK + HV) * S
    for il in range(LAYERS_H):
        b = f"blk.{il}."
        vec(b + "attn_norm.weight", E, 0.8, 1.2)
        vec(b + "post_attention_norm.weight", E, 0.8, 1.2)
        if (il + 1) % EVERY == 0:
            # Gated attention: [q, gate] per head.
            mat(b + "attn_q.weight", 2 * HEADS * HD, E, std=0.6 / np.sqrt(E))
            mat(b + "attn_k.weight", KV * HD, E, std=0.6 / np.sqrt(E))
            mat(b + "attn_v.weight", KV * HD, E, std=1.0 / np.sqrt(E))
            mat(b + "attn_output.weight", E, HEADS * HD, std=1.0 / np.sqrt(HEADS * HD))
            vec(b + "attn_q_norm.weight", HD, 0.8, 1.2)
            vec(b + "attn_k_norm.weight", HD, 0.8, 1.2)
        else:
            if fused:
                # Per key head: q, k, its value heads, their z.
                mat(b + "ssm_in.weight", conv_ch + HV * S, E, std=1.0 / np.sqrt(E))
            else:
                mat(b + "attn_qkv.weight", conv_ch, E, std=1.0 / np.sqrt(E))
                mat(b + "attn_gate.weight", HV * S, E, std=1.0 / np.sqrt(E))
            mat(b + "ssm_conv1d.weight", conv_ch, KERNEL, std=0.5, quant=False)
            vec(b + "ssm_dt.bias", HV, -1.0, 1.0)
            # -exp(A_log): slow decays, so the state carries across many tokens.
            vec(b + "ssm_a", HV, -0.5, -0.05)
            if nxt:
                mat(b + "ssm_ba.weight", 2 * HV, E, std=1.0 / np.sqrt(E), quant=False)
            else:
                mat(b + "ssm_beta.weight", HV, E, std=1.0 / np.sqrt(E), quant=False)
                mat(b + "ssm_alpha.weight", HV, E, std=1.0 / np.sqrt(E), quant=False)
            vec(b + "ssm_norm.weight", S, 0.8, 1.2)
            mat(b + "ssm_out.weight", E, HV * S, std=1.0 / np.sqrt(HV * S))
        if moe:
            mat(b + "ffn_gate_inp.weight", N_EXPERT, E, std=2.0 / np.sqrt(E), quant=False)
            if nxt:
                mat(b + "ffn_gate_exps.weight", N_EXPERT, FF_EXP, E, std=1.0 / np.sqrt(E))
                mat(b + "ffn_up_exps.weight", N_EXPERT, FF_EXP, E, std=1.0 / np.sqrt(E))
            else:
                # Gate rows then up rows of each expert in one tensor.
                mat(b + "ffn_gate_up_exps.weight", N_EXPERT, 2 * FF_EXP, E, std=1.0 / np.sqrt(E))
            mat(b + "ffn_down_exps.weight", N_EXPERT, E, FF_EXP, std=1.5 / np.sqrt(FF_EXP))
            vec(b + "ffn_gate_inp_shexp.weight", E, -0.3, 0.3)
            mat(b + "ffn_gate_shexp.weight", FF, E, std=1.0 / np.sqrt(E))
            mat(b + "ffn_up_shexp.weight", FF, E, std=1.0 / np.sqrt(E))
            mat(b + "ffn_down_shexp.weight", E, FF, std=1.0 / np.sqrt(FF))
        else:
            mat(b + "ffn_gate.weight", FF, E, std=1.0 / np.sqrt(E))
            mat(b + "ffn_up.weight", FF, E, std=1.0 / np.sqrt(E))
            mat(b + "ffn_down.weight", E, FF, std=1.0 / np.sqrt(FF))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main():
    arch, ty, out = sys.argv[1], sys.argv[2], sys.argv[3]
    gguf_arch = {"qwen3moe": "qwen3moe", "mixtral": "llama", "qwen35": "qwen35",
                 "qwen35moe": "qwen35moe", "qwen3next": "qwen3next",
                 "qwen3next-fused": "qwen3next"}[arch]
    if arch.startswith("qwen35") or arch.startswith("qwen3next"):
        return hybrid(gguf_arch, ty, out, moe=arch != "qwen35", fused=arch.endswith("-fused"))
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
