"""The hybrid Qwen architectures for hf_folder.py: Qwen3-Next (GGUF `qwen3next`), Qwen3.5
(`qwen35`) and Qwen3.5-MoE (`qwen35moe`), whose layers mix Gated DeltaNet linear attention
with gated full attention.

Why: smelt-load turns a Hugging Face folder of these models into the GGUF llama.cpp's
convert_hf_to_gguf.py (llama.cpp 0c1e570, the build in llama-cpp-python 0.3.36, run with
--no-mtp) writes for it. Its test needs that GGUF and the folder it comes from, without
torch or a download: `reference_gguf` writes a small random GGUF in convert's layout, and
`folder_tensors` writes the folder's tensors and config.json from it, undoing each of
convert's transforms. `forward`, a numpy port of convert's Qwen3NextModel and
_LinearAttentionVReorderBase.modify_tensors, must turn the folder back into the GGUF's
values exactly, so the inverse is checked against convert's own steps.

convert's transforms (qwen.py): `A_log` -> `ssm_a` = -exp(A_log); `dt_bias` -> `ssm_dt.bias`;
`conv1d` squeezed to [channels, kernel]; +1 on every `*norm.weight` but
`linear_attn.norm.weight`; Qwen3-Next's `in_proj_qkvz` (per key head [q, k, v, z]) split into
`attn_qkv` ([all q, all k, all v]) and `attn_gate` (z); Qwen3.5's value heads reordered from
grouped by key head to tiled (`_reorder_v_heads`) in in_proj_qkv's v rows, in_proj_z,
in_proj_a/b, A_log, dt_bias, conv1d's v channels and out_proj's columns. 1-D tensors, norms,
the conv taps and both routers are F32; other matrices keep the checkpoint's bf16.

-exp is computed in float64 and rounded to float32 (math.exp, as smelt-load computes it):
torch's float32 exp may differ from that by an ulp on some values.
"""
import argparse
import math

import numpy as np

ARCHS = ("qwen3next", "qwen35", "qwen35moe")
HF_ARCH = {
    "qwen3next": "Qwen3NextForCausalLM",
    "qwen35": "Qwen3_5ForCausalLM",
    "qwen35moe": "Qwen3_5MoeForCausalLM",
}
MODEL_TYPE = {"qwen3next": "qwen3_next", "qwen35": "qwen3_5_text", "qwen35moe": "qwen3_5_moe_text"}
DEFAULT_SECTIONS = [11, 11, 10, 0]



def copy_tokenizer(r, w):
    """Copies reader `r`'s tokenizer and chat template (convert wrote those) to writer `w`,
    less what convert writes for Llama vocabularies only (LlamaModel.set_vocab)."""
    import gguf

    for f in r.fields.values():
        if not f.name.startswith("tokenizer.") or f.name == "tokenizer.ggml.add_space_prefix":
            continue
        t0 = f.types[0]
        if t0 == gguf.GGUFValueType.ARRAY:
            w.add_key_value(f.name, f.contents(), t0, sub_type=f.types[1])
        else:
            w.add_key_value(f.name, f.contents(), t0)

def to_bf16(x):
    """f32 -> bf16 bits, round to nearest even (finite inputs)."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def from_bf16(bits):
    return (np.asarray(bits).astype(np.uint32) << 16).view(np.float32)


def bf16_exact(x):
    return from_bf16(to_bf16(x))


def neg_exp(x):
    """convert's -torch.exp(A_log), in float64 rounded to float32."""
    x = np.asarray(x, dtype=np.float32)
    return np.array([-math.exp(float(v)) for v in x.ravel()], dtype=np.float64).astype(np.float32).reshape(x.shape)


def reorder_v(t, dim, nk, r, hd, inverse=False):
    """convert's _reorder_v_heads: along `dim`, heads grouped by key head
    ([K0: v0..v(r-1), K1: ...]) -> tiled ([v0 of K0, K1, ...; v1 of ...]); or back."""
    dim %= t.ndim
    shape = list(t.shape)
    a, b = (r, nk) if inverse else (nk, r)
    t = t.reshape(shape[:dim] + [a, b, hd] + shape[dim + 1:])
    return np.ascontiguousarray(np.swapaxes(t, dim, dim + 1)).reshape(shape)


class Dims:
    """The hybrid's sizes, from a GGUF's metadata."""

    def __init__(self, k, arch):
        self.arch = arch
        self.e = int(k("embedding_length"))
        self.n_head = int(k("attention.head_count"))
        self.n_head_kv = int(k("attention.head_count_kv"))
        self.hd = int(k("attention.key_length"))
        self.K = int(k("ssm.conv_kernel"))
        self.hk = int(k("ssm.state_size"))
        self.nk = int(k("ssm.group_count"))
        self.nv = int(k("ssm.time_step_rank"))
        self.hv = int(k("ssm.inner_size")) // self.nv
        self.r = self.nv // self.nk
        self.kd, self.vd = self.nk * self.hk, self.nv * self.hv
        self.ch = 2 * self.kd + self.vd
        self.tiled = arch != "qwen3next" and self.nk != self.nv


def forward(hf, d):
    """convert_hf_to_gguf.py's modify_tensors for a hybrid, in numpy: HF name -> float32
    values (torch order) to {GGUF name: float32 values}. `hf` holds float32 arrays under
    names with the `model.` prefix (language_model. and mtp./visual. already handled)."""
    out = {}
    experts = {}
    for name, x in hf.items():
        x = np.asarray(x, dtype=np.float32)
        # _LinearAttentionVReorderBase (Qwen3.5) first, then Qwen3NextModel.
        if d.tiled and "linear_attn." in name:
            if ".in_proj_qkv." in name:
                x = np.concatenate([x[:2 * d.kd], reorder_v(x[2 * d.kd:], 0, d.nk, d.r, d.hv)])
            elif ".in_proj_z." in name:
                x = reorder_v(x, 0, d.nk, d.r, d.hv)
            elif ".in_proj_b." in name or ".in_proj_a." in name:
                x = reorder_v(x, 0, d.nk, d.r, 1)
            elif ".A_log" in name or ".dt_bias" in name:
                x = reorder_v(x[:, None], 0, d.nk, d.r, 1)[:, 0]
            elif ".conv1d" in name:
                x = np.squeeze(x)
                x = np.concatenate([x[:2 * d.kd], reorder_v(x[2 * d.kd:], 0, d.nk, d.r, d.hv)])
            elif ".out_proj." in name:
                x = reorder_v(x, 1, d.nk, d.r, d.hv)
        if name.endswith(".A_log"):
            x = neg_exp(x)
        elif name.endswith(".dt_bias"):
            name = name.rpartition(".dt_bias")[0] + ".dt_proj.bias"
        elif "conv1d" in name:
            x = np.squeeze(x)
        elif name.endswith("norm.weight") and not name.endswith("linear_attn.norm.weight"):
            x = x + np.float32(1)
        if "in_proj_qkvz.weight" in name:
            split = [d.hk, d.hk, d.r * d.hv, d.r * d.hv]
            t = x.T.reshape(d.e, d.nk, sum(split))
            q, k, v, z = np.split(t, np.cumsum(split)[:-1], axis=-1)
            qkv = np.concatenate([q.reshape(d.e, -1), k.reshape(d.e, -1), v.reshape(d.e, -1)], axis=-1).T
            bid = name.split(".")[2]
            out[f"blk.{bid}.attn_qkv.weight"] = np.ascontiguousarray(qkv)
            out[f"blk.{bid}.attn_gate.weight"] = np.ascontiguousarray(z.reshape(d.e, -1).T)
            continue
        # Qwen2MoeModel: fused (transformers 5) or per-expert matrices.
        if name.endswith("mlp.experts.down_proj"):
            out[gguf_name(name + ".weight")] = x
            continue
        if name.endswith("mlp.experts.gate_up_proj"):
            n_ff = x.shape[-2] // 2
            base = name.removesuffix(".gate_up_proj")
            out[gguf_name(base + ".gate_proj.weight")] = np.ascontiguousarray(x[..., :n_ff, :])
            out[gguf_name(base + ".up_proj.weight")] = np.ascontiguousarray(x[..., n_ff:, :])
            continue
        if ".mlp.experts." in name:
            _, _, bid, _, _, xid, proj, _ = name.split(".")
            experts.setdefault((bid, proj), {})[int(xid)] = x
            continue
        out[gguf_name(name)] = x
    for (bid, proj), m in experts.items():
        out[gguf_name(f"model.layers.{bid}.mlp.experts.{proj}.weight")] = np.stack([m[i] for i in range(len(m))])
    return out


GGUF_PARTS = {
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "post_attention_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm",
    "linear_attn.in_proj_ba": "ssm_ba",
    "linear_attn.in_proj_qkv": "attn_qkv",
    "linear_attn.in_proj_z": "attn_gate",
    "linear_attn.in_proj_b": "ssm_beta",
    "linear_attn.in_proj_a": "ssm_alpha",
    "linear_attn.conv1d": "ssm_conv1d",
    "linear_attn.dt_proj": "ssm_dt",
    "linear_attn.norm": "ssm_norm",
    "linear_attn.out_proj": "ssm_out",
    "mlp.gate": "ffn_gate_inp",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
    "mlp.experts.gate_proj": "ffn_gate_exps",
    "mlp.experts.up_proj": "ffn_up_exps",
    "mlp.experts.down_proj": "ffn_down_exps",
    "mlp.shared_expert.gate_proj": "ffn_gate_shexp",
    "mlp.shared_expert.up_proj": "ffn_up_shexp",
    "mlp.shared_expert.down_proj": "ffn_down_shexp",
    "mlp.shared_expert_gate": "ffn_gate_inp_shexp",
}


def gguf_name(name):
    """gguf-py's tensor map for these architectures (the names the folder uses)."""
    fixed = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
             "lm_head.weight": "output.weight"}
    if name in fixed:
        return fixed[name]
    rest = name.removeprefix("model.layers.")
    bid, rest = rest.split(".", 1)
    if rest == "linear_attn.A_log":
        return f"blk.{bid}.ssm_a"
    base, suffix = rest.rsplit(".", 1)
    return f"blk.{bid}.{GGUF_PARTS[base]}.{suffix}"


def recurrent(layer_types, interval, n):
    if layer_types is not None:
        return list(layer_types)
    return [(i + 1) % interval != 0 for i in range(n)]


def reference_gguf(argv):
    """A small random hybrid GGUF as convert writes one from a bf16 checkpoint, with a
    GGUF's tokenizer and token embeddings (SmolLM2's: 576 wide)."""
    import gguf
    from gguf import GGUFReader, GGMLQuantizationType
    from gguf.quants import dequantize

    ap = argparse.ArgumentParser(prog="hf_folder.py hybrid-gguf")
    ap.add_argument("arch", choices=ARCHS)
    ap.add_argument("gguf")
    ap.add_argument("out")
    ap.add_argument("--layers", type=int, default=3)
    ap.add_argument("--interval", type=int, default=3, help="full_attention_interval")
    ap.add_argument("--layer-types", action="store_true",
                    help="write attention.recurrent_layers (config.json's layer_types)")
    ap.add_argument("--no-ff", action="store_true",
                    help="no feed_forward_length (a config without intermediate_size)")
    ap.add_argument("--sections", default="11,11,10,0", help="rope.dimension_sections (qwen35*)")
    ap.add_argument("--experts", type=int, default=4)
    ap.add_argument("--used", type=int, default=2)
    ap.add_argument("--ff-exp", type=int, default=64)
    ap.add_argument("--ff-shared", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    r = GGUFReader(a.gguf)

    def field(key):
        f = r.fields.get(key)
        return None if f is None else f.contents()

    src = field("general.architecture")
    rng = np.random.default_rng(a.seed)
    arch = a.arch
    moe = arch != "qwen35"
    e = int(field(f"{src}.embedding_length"))
    n_head, n_head_kv, hd, n_ff = 4, 2, 64, 128
    K, hk, nk, nv = 4, 64, 2, 4
    hv = hk
    kd, vd = nk * hk, nv * hv
    ch = 2 * kd + vd
    n_rot = hd // 4

    w = gguf.GGUFWriter(a.out, arch)
    copy_tokenizer(r, w)
    w.add_block_count(a.layers)
    w.add_context_length(int(field(f"{src}.context_length")))
    w.add_embedding_length(e)
    if not a.no_ff:
        w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head_kv)
    if arch != "qwen3next":
        w.add_rope_dimension_sections([int(s) for s in a.sections.split(",")])
    w.add_rope_freq_base(10_000_000.0)
    w.add_layer_norm_rms_eps(1e-6)
    if moe:
        w.add_expert_count(a.experts)
        w.add_expert_used_count(a.used)
    w.add_key_length(hd)
    w.add_value_length(hd)
    w.add_file_type(32)
    if moe:
        w.add_expert_feed_forward_length(a.ff_exp)
        w.add_expert_shared_feed_forward_length(a.ff_shared)
    w.add_ssm_conv_kernel(K)
    w.add_ssm_state_size(hk)
    w.add_ssm_group_count(nk)
    w.add_ssm_time_step_rank(nv)
    w.add_ssm_inner_size(vd)
    rec = recurrent(None, a.interval, a.layers)
    if a.layer_types:
        # Attention first and last, delta-net between: the flags, not the interval, decide.
        rec = [0 < i < a.layers - 1 for i in range(a.layers)]
        w.add_array(f"{arch}.attention.recurrent_layers", rec)
    w.add_full_attention_interval(a.interval)
    w.add_rope_dimension_count(n_rot)
    w.add_uint32("general.quantization_version", 2)

    tok = next(t for t in r.tensors if t.name == "token_embd.weight")
    embd = dequantize(tok.data, tok.tensor_type).astype(np.float32).reshape(int(tok.shape[1]), e)

    def mat(name, shape, std=0.05):
        w.add_tensor(name, to_bf16(std * rng.standard_normal(shape)), raw_dtype=GGMLQuantizationType.BF16)

    def vec(name, v):
        w.add_tensor(name, np.ascontiguousarray(v, dtype=np.float32))

    def norm(name, n):
        # HF stores w and convert writes 1 + w: w bf16-exact and not tiny, so 1 + w is
        # exact in float32 and w comes back from it.
        x = bf16_exact(0.2 * rng.standard_normal(n))
        x = np.where(np.abs(x) < 2 ** -10, np.float32(2 ** -10), x).astype(np.float32)
        vec(name, x + np.float32(1))

    w.add_tensor("token_embd.weight", to_bf16(embd), raw_dtype=GGMLQuantizationType.BF16)
    norm("output_norm.weight", e)
    for b in range(a.layers):
        p = f"blk.{b}."
        norm(p + "attn_norm.weight", e)
        if rec[b]:
            mat(p + "attn_qkv.weight", (ch, e))
            mat(p + "attn_gate.weight", (vd, e))
            if arch == "qwen3next":
                mat(p + "ssm_ba.weight", (2 * nv, e))
            else:
                mat(p + "ssm_beta.weight", (nv, e))
                mat(p + "ssm_alpha.weight", (nv, e))
            vec(p + "ssm_conv1d.weight", bf16_exact(0.3 * rng.standard_normal((ch, K))))
            vec(p + "ssm_dt.bias", bf16_exact(0.5 * rng.standard_normal(nv)))
            a_log = bf16_exact(rng.uniform(-1.0, 2.0, nv))
            a_log = np.where(np.abs(a_log) < 0.05, np.float32(0.5), a_log)
            vec(p + "ssm_a", neg_exp(a_log))
            vec(p + "ssm_norm.weight", bf16_exact(1 + 0.2 * rng.standard_normal(hv)))
            mat(p + "ssm_out.weight", (e, vd))
        else:
            mat(p + "attn_q.weight", (2 * n_head * hd, e))
            mat(p + "attn_k.weight", (n_head_kv * hd, e))
            mat(p + "attn_v.weight", (n_head_kv * hd, e))
            mat(p + "attn_output.weight", (e, n_head * hd))
            norm(p + "attn_q_norm.weight", hd)
            norm(p + "attn_k_norm.weight", hd)
        norm(p + "post_attention_norm.weight", e)
        if moe:
            vec(p + "ffn_gate_inp.weight", bf16_exact(0.05 * rng.standard_normal((a.experts, e))))
            mat(p + "ffn_gate_exps.weight", (a.experts, a.ff_exp, e))
            mat(p + "ffn_up_exps.weight", (a.experts, a.ff_exp, e))
            mat(p + "ffn_down_exps.weight", (a.experts, e, a.ff_exp))
            # [1, n_embd] in HF: convert writes ggml shape [n_embd, 1].
            vec(p + "ffn_gate_inp_shexp.weight", bf16_exact(0.05 * rng.standard_normal((1, e))))
            mat(p + "ffn_gate_shexp.weight", (a.ff_shared, e))
            mat(p + "ffn_up_shexp.weight", (a.ff_shared, e))
            mat(p + "ffn_down_shexp.weight", (e, a.ff_shared))
        else:
            mat(p + "ffn_gate.weight", (n_ff, e))
            mat(p + "ffn_up.weight", (n_ff, e))
            mat(p + "ffn_down.weight", (e, n_ff))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(a.out)


def folder_tensors(r, arch, k, values, args):
    """The Hugging Face tensors (float32 values, torch order, `model.` names) and the
    config.json keys of a hybrid GGUF: each of convert's transforms undone, then checked by
    running `forward` on the result."""
    d = Dims(k, arch)
    hf = {}
    experts_done = set()
    for name, x in values.items():
        if name in ("token_embd.weight", "output_norm.weight", "output.weight"):
            hf_name = {"token_embd.weight": "model.embed_tokens.weight",
                       "output_norm.weight": "model.norm.weight",
                       "output.weight": "lm_head.weight"}[name]
            hf[hf_name] = x - np.float32(1) if name == "output_norm.weight" else x
            continue
        _, bid, part = name.split(".", 2)
        p = f"model.layers.{bid}."
        part = part.removesuffix(".weight")
        if part in ("attn_norm", "post_attention_norm", "attn_q_norm", "attn_k_norm"):
            hf[p + {"attn_norm": "input_layernorm", "post_attention_norm": "post_attention_layernorm",
                    "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm"}[part]
               + ".weight"] = x - np.float32(1)
        elif part in ("attn_q", "attn_k", "attn_v", "attn_output"):
            hf[p + {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
                    "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj"}[part] + ".weight"] = x
        elif part == "attn_qkv" and arch == "qwen3next":
            z = values[f"blk.{bid}.attn_gate.weight"]
            q = x[:d.kd].T.reshape(d.e, d.nk, d.hk)
            kk = x[d.kd:2 * d.kd].T.reshape(d.e, d.nk, d.hk)
            v = x[2 * d.kd:].T.reshape(d.e, d.nk, d.r * d.hv)
            zz = z.T.reshape(d.e, d.nk, d.r * d.hv)
            hf[p + "linear_attn.in_proj_qkvz.weight"] = np.ascontiguousarray(
                np.concatenate([q, kk, v, zz], axis=-1).reshape(d.e, -1).T)
        elif part == "attn_gate" and arch == "qwen3next":
            pass
        elif part == "attn_qkv":
            v = x[2 * d.kd:]
            if d.tiled:
                v = reorder_v(v, 0, d.nk, d.r, d.hv, inverse=True)
            hf[p + "linear_attn.in_proj_qkv.weight"] = np.concatenate([x[:2 * d.kd], v])
        elif part in ("attn_gate", "ssm_beta", "ssm_alpha"):
            hd = d.hv if part == "attn_gate" else 1
            hf[p + {"attn_gate": "linear_attn.in_proj_z", "ssm_beta": "linear_attn.in_proj_b",
                    "ssm_alpha": "linear_attn.in_proj_a"}[part] + ".weight"] = (
                reorder_v(x, 0, d.nk, d.r, hd, inverse=True) if d.tiled else x)
        elif part == "ssm_ba":
            hf[p + "linear_attn.in_proj_ba.weight"] = x
        elif part == "ssm_conv1d":
            v = x[2 * d.kd:]
            if d.tiled:
                v = reorder_v(v, 0, d.nk, d.r, d.hv, inverse=True)
            hf[p + "linear_attn.conv1d.weight"] = np.concatenate([x[:2 * d.kd], v])[:, None, :]
        elif part in ("ssm_dt.bias", "ssm_a"):
            if part == "ssm_a":
                x = np.log(-x.astype(np.float64)).astype(np.float32)
            if d.tiled:
                x = reorder_v(x[:, None], 0, d.nk, d.r, 1, inverse=True)[:, 0]
            hf[p + ("linear_attn.dt_bias" if part == "ssm_dt.bias" else "linear_attn.A_log")] = x
        elif part == "ssm_norm":
            hf[p + "linear_attn.norm.weight"] = x
        elif part == "ssm_out":
            hf[p + "linear_attn.out_proj.weight"] = (
                reorder_v(x, 1, d.nk, d.r, d.hv, inverse=True) if d.tiled else x)
        elif part in ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"):
            proj = part.split("_")[1]
            if args.fused_experts:
                if proj == "down":
                    hf[p + "mlp.experts.down_proj"] = x
                elif bid not in experts_done:
                    experts_done.add(bid)
                    gate = values[f"blk.{bid}.ffn_gate_exps.weight"]
                    up = values[f"blk.{bid}.ffn_up_exps.weight"]
                    hf[p + "mlp.experts.gate_up_proj"] = np.concatenate([gate, up], axis=-2)
            else:
                for xid in range(x.shape[0]):
                    hf[p + f"mlp.experts.{xid}.{proj}_proj.weight"] = x[xid]
        else:
            hf[p + {"ffn_gate_inp": "mlp.gate", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
                    "ffn_down": "mlp.down_proj", "ffn_gate_shexp": "mlp.shared_expert.gate_proj",
                    "ffn_up_shexp": "mlp.shared_expert.up_proj",
                    "ffn_down_shexp": "mlp.shared_expert.down_proj",
                    "ffn_gate_inp_shexp": "mlp.shared_expert_gate"}[part] + ".weight"] = x
    # What the folder holds is bf16: the values convert reads.
    hf = {n: bf16_exact(v) for n, v in hf.items()}
    back = forward(hf, d)
    assert sorted(back) == sorted(values), (sorted(set(back) ^ set(values)))
    for n, v in values.items():
        assert back[n].shape == v.shape, (n, back[n].shape, v.shape)
        assert np.array_equal(back[n], v), f"{n}: the folder does not convert back to the GGUF"

    n_layer = int(k("block_count"))
    cfg = {
        "head_dim": d.hd,
        "linear_conv_kernel_dim": d.K,
        "linear_key_head_dim": d.hk,
        "linear_value_head_dim": d.hv,
        "linear_num_key_heads": d.nk,
        "linear_num_value_heads": d.nv,
        "full_attention_interval": int(k("full_attention_interval")),
        "attn_output_gate": True,
    }
    rec = k("attention.recurrent_layers")
    if rec is not None:
        cfg["layer_types"] = ["linear_attention" if x else "full_attention" for x in rec]
        assert len(rec) == n_layer
    partial = int(k("rope.dimension_count")) / d.hd
    theta = float(k("rope.freq_base"))
    if arch == "qwen3next":
        cfg.update({"rope_theta": theta, "partial_rotary_factor": partial, "rope_scaling": None})
    else:
        rope = {"rope_type": "default", "rope_theta": theta, "partial_rotary_factor": partial,
                "mrope_interleaved": True}
        sections = [int(s) for s in k("rope.dimension_sections")]
        if args.default_mrope:
            assert sections == DEFAULT_SECTIONS, sections
        else:
            rope["mrope_section"] = sections[:3] if sections[3] == 0 else sections
        cfg["rope_parameters"] = rope
    if k("expert_count") is not None:
        cfg.update({
            "num_experts": int(k("expert_count")),
            "num_experts_per_tok": int(k("expert_used_count")),
            "moe_intermediate_size": int(k("expert_feed_forward_length")),
            "shared_expert_intermediate_size": int(k("expert_shared_feed_forward_length")),
            "decoder_sparse_step": 1,
            "mlp_only_layers": [],
            "norm_topk_prob": True,
        })
    return hf, cfg


def extra_tensors(hf, d, rng, mtp, visual):
    """Tensors convert drops: the MTP head (`mtp.*`, with --no-mtp) and a vision tower."""
    if mtp:
        hf["mtp.fc.weight"] = bf16_exact(rng.standard_normal((d.e, 2 * d.e)))
        hf["mtp.norm.weight"] = bf16_exact(rng.standard_normal(d.e))
        hf["mtp.layers.0.input_layernorm.weight"] = bf16_exact(rng.standard_normal(d.e))
    if visual:
        hf["model.visual.blocks.0.attn.qkv.weight"] = bf16_exact(rng.standard_normal((48, 16)))
