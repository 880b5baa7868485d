#!/usr/bin/env python3
"""Writes a Hugging Face model folder FROM a GGUF (llama, qwen2, qwen3, qwen3moe, or the hybrids
qwen3next, qwen35 and qwen35moe; bf16/f16/f32 or quantized weights), for smelt-load's tests.

The folder is what a user downloads from a hub: bf16 safetensors (single or sharded with
model.safetensors.index.json), config.json, tokenizer.json built with the `tokenizers`
package from the GGUF's vocabulary and merges, tokenizer_config.json with the chat template,
and generation_config.json. Weights are the GGUF's dequantized (gguf-py) values rounded to
bf16 (round to nearest even), with Q/K rows un-permuted to the rotate-half layout HF stores
(the inverse of convert_hf_to_gguf.py's LlamaModel.permute).

usage: hf_folder.py GGUF OUT_DIR [--shards N] [--hf-arch MistralForCausalLM] [--f32-vectors]
                                 [--fused-experts] [--mtp] [--default-mrope]   (hybrids)
       hf_folder.py qwen3moe-gguf GGUF OUT_GGUF [--layers N --experts E --used K --ff-exp F]
                                        (a small random Qwen3-MoE GGUF as convert_hf_to_gguf.py
                                         writes one in bf16: GGUF's tokenizer, embeddings and
                                         first layers' attention, random experts and router)
       hf_folder.py hybrid-gguf {qwen3next,qwen35,qwen35moe} GGUF OUT_GGUF [--layer-types ...]
                                        (a small random hybrid GGUF as convert_hf_to_gguf.py
                                         writes one in bf16 with --no-mtp: hf_hybrid.py)
       hf_folder.py special-vocab DIR   (prints gguf-py's SpecialVocab of DIR as JSON: the
                                         merges, special ids, add flags and chat template
                                         convert_hf_to_gguf.py writes)
"""
import argparse
import json
import os
import shutil
import sys

import numpy as np
from gguf import GGUFReader, GGMLQuantizationType
from gguf.quants import dequantize
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

import hf_hybrid


def field(reader, key):
    f = reader.fields.get(key)
    if f is None:
        return None
    return f.contents()


def to_bf16(x):
    """f32 -> bf16 bits, round to nearest even (finite inputs)."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    r = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    return r.astype(np.uint16)


def permute(w, n_head):
    """convert_hf_to_gguf.py's LlamaModel.permute (HF rotate-half rows -> GGUF interleaved)."""
    return (w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
            .swapaxes(1, 2)
            .reshape(w.shape))


def unpermute(w, n_head):
    """GGUF's interleaved rope rows -> HF's rotate-half rows; checked to be the inverse of
    convert's permute on every tensor it touches."""
    rows = w.shape[0]
    hd = rows // n_head
    out = (w.reshape(n_head, hd // 2, 2, *w.shape[1:])
           .swapaxes(1, 2)
           .reshape(w.shape))
    assert np.array_equal(permute(out, n_head), w)
    if hd > 2:
        assert not np.array_equal(out, w) or np.all(w == w.flat[0])
    return out


HF_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate_inp": "mlp.gate",
}

HF_ARCH = {
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "qwen3moe": "Qwen3MoeForCausalLM",
    **hf_hybrid.HF_ARCH,
}


def hf_name(name):
    if name == "token_embd.weight":
        return "model.embed_tokens.weight"
    if name == "output_norm.weight":
        return "model.norm.weight"
    if name == "output.weight":
        return "lm_head.weight"
    _, bid, part, suffix = name.split(".")
    return f"model.layers.{bid}.{HF_NAMES[part]}.{suffix}"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("gguf")
    ap.add_argument("out")
    ap.add_argument("--shards", type=int, default=1)
    ap.add_argument("--hf-arch", help="config.json architecture (default: from the GGUF's)")
    ap.add_argument("--f32-vectors", action="store_true",
                    help="store 1-D tensors (norms, biases) as F32, not bf16 (mixed dtypes)")
    ap.add_argument("--fused-experts", action="store_true",
                    help="hybrids: experts as transformers 5 stores them (3-D gate_up_proj, down_proj)")
    ap.add_argument("--mtp", action="store_true",
                    help="hybrids: add an MTP head (mtp.*), which convert --no-mtp drops")
    ap.add_argument("--default-mrope", action="store_true",
                    help="qwen35*: no mrope_section in config.json (convert's default applies)")
    args = ap.parse_args()

    r = GGUFReader(args.gguf)
    arch = field(r, "general.architecture")
    if arch not in HF_ARCH:
        sys.exit(f"{args.gguf}: architecture {arch!r}; this script writes {sorted(HF_ARCH)}")
    k = lambda s: field(r, f"{arch}.{s}")
    n_head = int(k("attention.head_count"))
    n_head_kv = int(k("attention.head_count_kv") or n_head)

    tensors = {}
    names = set()
    rope_freqs = None
    hybrid_cfg = None
    hf_arch = args.hf_arch or HF_ARCH[arch]
    conditional = hf_arch.endswith("ForConditionalGeneration")
    if arch in hf_hybrid.ARCHS:
        values = {}
        for t in r.tensors:
            names.add(t.name)
            v = dequantize(t.data, t.tensor_type).astype(np.float32)
            values[t.name] = v.reshape([int(d) for d in reversed(list(t.shape))])
        hf, hybrid_cfg = hf_hybrid.folder_tensors(r, arch, k, values, args)
        hf_hybrid.extra_tensors(hf, hf_hybrid.Dims(k, arch), np.random.default_rng(1),
                                args.mtp, conditional)
        for n, v in hf.items():
            if conditional and n.startswith("model.") and not n.startswith("model.visual."):
                n = "model.language_model." + n.removeprefix("model.")
            tensors[n] = v if args.f32_vectors and v.ndim == 1 else to_bf16(v)
    for t in (r.tensors if hybrid_cfg is None else []):
        names.add(t.name)
        vals = dequantize(t.data, t.tensor_type).astype(np.float32)
        vals = vals.reshape([int(d) for d in reversed(list(t.shape))])
        if t.name == "rope_freqs.weight":
            # Llama 3 rope scaling: HF keeps it in config.json, convert recomputes it.
            rope_freqs = vals
            continue
        # Only Llama-style rope is stored rotate-half in HF and interleaved in GGUF.
        if arch == "llama" and t.name.endswith(("attn_q.weight", "attn_q.bias")):
            vals = unpermute(vals, n_head)
        elif arch == "llama" and t.name.endswith(("attn_k.weight", "attn_k.bias")):
            vals = unpermute(vals, n_head_kv)
        if t.name.endswith("_exps.weight"):
            # convert stacks the experts' matrices; HF keeps one per expert.
            _, bid, part, _ = t.name.split(".")
            proj = part.split("_")[1]
            for e in range(vals.shape[0]):
                tensors[f"model.layers.{bid}.mlp.experts.{e}.{proj}_proj.weight"] = to_bf16(vals[e])
        elif args.f32_vectors and vals.ndim == 1:
            tensors[hf_name(t.name)] = vals
        else:
            tensors[hf_name(t.name)] = to_bf16(vals)

    tmp = args.out + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)

    ordered = sorted(tensors)
    groups = [ordered[i::args.shards] for i in range(args.shards)]
    files = []
    for i, group in enumerate(groups):
        fname = ("model.safetensors" if args.shards == 1
                 else f"model-{i + 1:05d}-of-{args.shards:05d}.safetensors")
        path = os.path.join(tmp, fname)
        save_bf16({n: tensors[n] for n in group}, path)
        files.append((fname, group))
        # The safetensors package must read what was written (bf16 bits as uint16 via numpy
        # is not offered, so check the header and sizes through its loader on a copy).
        check_readable(path)
    if args.shards > 1:
        weight_map = {n: f for f, group in files for n in group}
        total = sum(v.nbytes for v in tensors.values())
        with open(os.path.join(tmp, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)

    tokens = field(r, "tokenizer.ggml.tokens")
    types = field(r, "tokenizer.ggml.token_type")
    merges = field(r, "tokenizer.ggml.merges")
    bos = field(r, "tokenizer.ggml.bos_token_id")
    eos = field(r, "tokenizer.ggml.eos_token_id")
    unk = field(r, "tokenizer.ggml.unknown_token_id")
    pad = field(r, "tokenizer.ggml.padding_token_id")
    pre = field(r, "tokenizer.ggml.pre")
    spm = field(r, "tokenizer.ggml.model") == "llama"
    if not spm and pre != "smollm":
        sys.exit(f"pre-tokenizer {pre!r}: this script builds SmolLM's (digits, then byte level)")

    config = {
        "architectures": [hf_arch],
        "model_type": arch,
        "hidden_size": int(k("embedding_length")),
        "num_attention_heads": n_head,
        "num_key_value_heads": n_head_kv,
        "num_hidden_layers": int(k("block_count")),
        "max_position_embeddings": int(k("context_length")),
        "rms_norm_eps": float(k("attention.layer_norm_rms_epsilon")),
        "rope_theta": float(k("rope.freq_base")),
        "vocab_size": len(tokens),
        "tie_word_embeddings": "output.weight" not in names,
        "bos_token_id": int(bos),
        "eos_token_id": int(eos),
        "hidden_act": "silu",
        "torch_dtype": "bfloat16",
    }
    if k("feed_forward_length") is not None:
        config["intermediate_size"] = int(k("feed_forward_length"))
    if k("attention.key_length") is not None:
        config["head_dim"] = int(k("attention.key_length"))
    if hybrid_cfg is not None:
        config["model_type"] = hf_hybrid.MODEL_TYPE[arch]
        config.update(hybrid_cfg)
        if conditional:
            # Qwen3.5's image-text checkpoints: the text model's keys under text_config.
            top = ("architectures", "tie_word_embeddings", "torch_dtype")
            config = {**{t: config[t] for t in top}, "model_type": "qwen3_5",
                      "text_config": {n: v for n, v in config.items() if n not in top},
                      "vision_config": {"depth": 1, "hidden_size": 16}}
    elif k("expert_count") is not None:
        config.update({
            "model_type": "qwen3_moe",
            "num_experts": int(k("expert_count")),
            "num_experts_per_tok": int(k("expert_used_count")),
            "moe_intermediate_size": int(k("expert_feed_forward_length")),
            "decoder_sparse_step": 1,
            "mlp_only_layers": [],
            "norm_topk_prob": True,
        })
    if rope_freqs is not None:
        config["rope_scaling"] = {
            "rope_type": "llama3",
            "factor": float(rope_freqs.max()),
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings":
                int(k("rope.scaling.original_context_length") or 8192),
        }
    with open(os.path.join(tmp, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    with open(os.path.join(tmp, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": int(bos), "eos_token_id": int(eos)}, f, indent=2)

    if spm:
        # A SentencePiece vocabulary: tokenizer.model with the GGUF's pieces, scores and
        # types; its added tokens (control and user-defined) listed in tokenizer_config.json
        # as HF lists them.
        scores = field(r, "tokenizer.ggml.scores")
        with open(os.path.join(tmp, "tokenizer.model"), "wb") as f:
            f.write(spm_model_proto(tokens, scores, types))
    else:
        vocab = {t: i for i, t in enumerate(tokens)}
        pairs = [tuple(m.split(" ")) for m in merges]
        tok = Tokenizer(models.BPE(vocab=vocab, merges=pairs))
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ])
        tok.decoder = decoders.ByteLevel()
        specials = [AddedToken(t, special=True, normalized=False)
                    for t, ty in zip(tokens, types) if int(ty) == 3]
        tok.add_special_tokens(specials)
        tok.save(os.path.join(tmp, "tokenizer.json"))
    tc = {
        "add_prefix_space": bool(field(r, "tokenizer.ggml.add_space_prefix")),
        "bos_token": tokens[bos],
        "eos_token": tokens[eos],
        "unk_token": tokens[unk],
        "pad_token": tokens[pad],
        "model_max_length": int(k("context_length")),
        "tokenizer_class": "GPT2Tokenizer",
        "chat_template": field(r, "tokenizer.chat_template"),
    }
    if spm:
        tc["tokenizer_class"] = "LlamaTokenizer"
        tc["added_tokens_decoder"] = {
            str(i): {"content": t, "special": int(ty) == 3, "normalized": False}
            for i, (t, ty) in enumerate(zip(tokens, types)) if int(ty) in (3, 4)
        }
    for typ in ("bos", "eos"):
        flag = field(r, f"tokenizer.ggml.add_{typ}_token")
        if flag is not None:
            tc[f"add_{typ}_token"] = bool(flag)
    with open(os.path.join(tmp, "tokenizer_config.json"), "w") as f:
        json.dump(tc, f, indent=2)

    shutil.rmtree(args.out, ignore_errors=True)
    os.rename(tmp, args.out)
    print(args.out)


def spm_model_proto(tokens, scores, types):
    """A SentencePiece ModelProto holding only its pieces (field 1: piece=1 string,
    score=2 float, type=3 enum), in protobuf's wire format."""
    import struct

    def varint(v):
        out = bytearray()
        while v >= 0x80:
            out.append((v & 0x7F) | 0x80)
            v >>= 7
        out.append(v)
        return bytes(out)

    out = bytearray()
    for t, sc, ty in zip(tokens, scores, types):
        text = t.encode("utf-8")
        piece = (b"\x0a" + varint(len(text)) + text + b"\x15" + struct.pack("<f", float(sc))
                 + b"\x18" + varint(int(ty)))
        out += b"\x0a" + varint(len(piece)) + piece
    return bytes(out)


def check_readable(path):
    from safetensors import safe_open
    with safe_open(path, framework="numpy") as f:
        for name in f.keys():
            sl = f.get_slice(name)
            assert sl.get_dtype() in ("BF16", "F32"), (name, sl.get_dtype())


def save_bf16(tensors, path):
    """A safetensors file of bf16 tensors (uint16 bits) and f32 ones: numpy has no bf16
    dtype, so the header is written here, in the format's layout (u64 length, JSON padded
    with spaces to 8 bytes, data in header order)."""
    header = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, v in tensors.items():
        dtype = {np.dtype(np.uint16): "BF16", np.dtype(np.float32): "F32"}[v.dtype]
        header[name] = {"dtype": dtype, "shape": list(v.shape),
                        "data_offsets": [offset, offset + v.nbytes]}
        offset += v.nbytes
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(len(text).to_bytes(8, "little"))
        f.write(text)
        for v in tensors.values():
            f.write(np.ascontiguousarray(v).tobytes())


def qwen3moe_gguf(argv):
    """A small Qwen3-MoE GGUF in the layout convert_hf_to_gguf.py gives a bf16 checkpoint
    (2-D weights BF16; norms and the router F32), built from a GGUF's tokenizer, embeddings
    and first layers' attention, with random Q/K norms, router and experts (all values
    bf16-exact, so an HF folder written from it holds the same numbers)."""
    import gguf
    ap = argparse.ArgumentParser(prog="hf_folder.py qwen3moe-gguf")
    ap.add_argument("gguf")
    ap.add_argument("out")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--experts", type=int, default=4)
    ap.add_argument("--used", type=int, default=2)
    ap.add_argument("--ff-exp", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    r = GGUFReader(a.gguf)
    src = field(r, "general.architecture")
    k = lambda s: field(r, f"{src}.{s}")
    rng = np.random.default_rng(a.seed)
    n_embd = int(k("embedding_length"))
    n_head = int(k("attention.head_count"))
    n_head_kv = int(k("attention.head_count_kv") or n_head)
    hd = n_embd // n_head
    bf = lambda x: to_bf16(x)
    as_f32 = lambda bits: (bits.astype(np.uint32) << 16).view(np.float32)

    w = gguf.GGUFWriter(a.out, "qwen3moe")
    hf_hybrid.copy_tokenizer(r, w)
    a_ = "qwen3moe"
    w.add_uint32(f"{a_}.block_count", a.layers)
    w.add_uint32(f"{a_}.context_length", int(k("context_length")))
    w.add_uint32(f"{a_}.embedding_length", n_embd)
    w.add_uint32(f"{a_}.feed_forward_length", int(k("feed_forward_length")))
    w.add_uint32(f"{a_}.attention.head_count", n_head)
    w.add_uint32(f"{a_}.attention.head_count_kv", n_head_kv)
    w.add_float32(f"{a_}.rope.freq_base", float(k("rope.freq_base")))
    w.add_float32(f"{a_}.attention.layer_norm_rms_epsilon", float(k("attention.layer_norm_rms_epsilon")))
    w.add_uint32(f"{a_}.attention.key_length", hd)
    w.add_uint32(f"{a_}.attention.value_length", hd)
    w.add_uint32(f"{a_}.expert_count", a.experts)
    w.add_uint32(f"{a_}.expert_used_count", a.used)
    w.add_uint32(f"{a_}.expert_feed_forward_length", a.ff_exp)
    w.add_uint32("general.file_type", 32)
    w.add_uint32("general.quantization_version", 2)

    by_name = {t.name: t for t in r.tensors}
    def vals(name):
        t = by_name[name]
        v = dequantize(t.data, t.tensor_type).astype(np.float32)
        return v.reshape([int(d) for d in reversed(list(t.shape))])
    def mat(name, v):
        w.add_tensor(name, bf(v), raw_dtype=GGMLQuantizationType.BF16)
    def vec(name, v):
        w.add_tensor(name, as_f32(bf(v)))
    mat("token_embd.weight", vals("token_embd.weight"))
    vec("output_norm.weight", vals("output_norm.weight"))
    for b in range(a.layers):
        p = f"blk.{b}."
        vec(p + "attn_norm.weight", vals(p + "attn_norm.weight"))
        for part in ("attn_q", "attn_k", "attn_v", "attn_output"):
            mat(p + part + ".weight", vals(p + part + ".weight"))
        vec(p + "attn_q_norm.weight", 1 + 0.1 * rng.standard_normal(hd))
        vec(p + "attn_k_norm.weight", 1 + 0.1 * rng.standard_normal(hd))
        vec(p + "ffn_norm.weight", vals(p + "ffn_norm.weight"))
        vec(p + "ffn_gate_inp.weight", 0.05 * rng.standard_normal((a.experts, n_embd)))
        mat(p + "ffn_gate_exps.weight", 0.05 * rng.standard_normal((a.experts, a.ff_exp, n_embd)))
        mat(p + "ffn_up_exps.weight", 0.05 * rng.standard_normal((a.experts, a.ff_exp, n_embd)))
        mat(p + "ffn_down_exps.weight", 0.05 * rng.standard_normal((a.experts, n_embd, a.ff_exp)))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(a.out)


def special_vocab(path):
    import gguf
    sv = gguf.SpecialVocab(path, load_merges=True)
    print(json.dumps({
        "merges": sv.merges,
        "special_token_ids": sv.special_token_ids,
        "add_special_token": sv.add_special_token,
        "chat_template": sv.chat_template,
    }))


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "special-vocab":
        special_vocab(sys.argv[2])
    elif len(sys.argv) > 1 and sys.argv[1] == "qwen3moe-gguf":
        qwen3moe_gguf(sys.argv[2:])
    elif len(sys.argv) > 1 and sys.argv[1] == "hybrid-gguf":
        hf_hybrid.reference_gguf(sys.argv[2:])
    else:
        main()
