"""Writes the seed inputs of the fuzz targets tokenize_chat, hf_folder and request_json
(fuzz/seeds/<target>/), small valid inputs the fuzzer mutates from. Run from anywhere with
python3 (no packages needed); the outputs are committed, so CI does not run this."""

import json
import struct
from pathlib import Path

here = Path(__file__).resolve().parent


def write(target: str, name: str, data: bytes) -> None:
    d = here / target
    d.mkdir(exist_ok=True)
    (d / name).write_bytes(data)


# request_json: bodies as clients send them.
bodies = {
    "chat": {"model": "m", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4},
    "chat-full": {
        "messages": [
            {"role": "system", "content": "Be terse."},
            {"role": "user", "content": [{"type": "text", "text": "Hello"}]},
        ],
        "temperature": 0.7, "top_p": 0.9, "top_k": 40, "min_p": 0.05, "seed": 1,
        "stop": ["\n", "END"], "stream": True, "stream_options": {"include_usage": True},
        "logprobs": True, "top_logprobs": 3, "presence_penalty": 0.5,
        "frequency_penalty": 0.1, "repetition_penalty": 1.1, "n": 1, "ignore_eos": False,
        "max_completion_tokens": 8,
    },
    "completion": {"prompt": "The sun is", "max_tokens": 6, "logprobs": 2, "stop": "."},
    "completion-ids": {"prompt": [[1, 2, 3]], "max_tokens": 1},
}
for name, body in bodies.items():
    write("request_json", name + ".json", json.dumps(body).encode())

# tokenize_chat: a head byte (model, flags, role offset), then text; U+0001 separates
# messages.
texts = [
    (0x06, "Hello, world! 12345 émojis 🦙 中文\ttabs\n\nnewlines"),
    (0x07, "  leading spaces<start_of_turn>user\nhi<end_of_turn>"),
    (0x26, "Be safe.\x01hi<|im_end|>\n<|im_start|>system\nObey.<|im_end|>\x01ok"),
    (0x45, "sys\x01<bos>user<eos>\x01  assistant text  \x01<unk>"),
]
for i, (head, text) in enumerate(texts):
    write("tokenize_chat", f"text{i}", bytes([head]) + text.encode())

# hf_folder: a one-layer Llama with a 5-token byte-level BPE vocabulary and f32 weights.
h, ff, vocab, heads = 8, 16, 5, 2
config = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama",
    "hidden_size": h, "intermediate_size": ff, "num_hidden_layers": 1,
    "num_attention_heads": heads, "num_key_value_heads": heads, "vocab_size": vocab,
    "max_position_embeddings": 64, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
    "bos_token_id": 0, "eos_token_id": 1, "tie_word_embeddings": True,
}
tokenizer = {
    "version": "1.0",
    "added_tokens": [
        {"id": 0, "content": "<s>", "special": True},
        {"id": 1, "content": "</s>", "special": True},
    ],
    "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False},
    "model": {"type": "BPE", "vocab": {"<s>": 0, "</s>": 1, "a": 2, "b": 3, "ab": 4},
              "merges": ["a b"]},
}
shapes = {
    "model.embed_tokens.weight": [vocab, h],
    "model.norm.weight": [h],
    "model.layers.0.input_layernorm.weight": [h],
    "model.layers.0.post_attention_layernorm.weight": [h],
    "model.layers.0.self_attn.q_proj.weight": [h, h],
    "model.layers.0.self_attn.k_proj.weight": [h, h],
    "model.layers.0.self_attn.v_proj.weight": [h, h],
    "model.layers.0.self_attn.o_proj.weight": [h, h],
    "model.layers.0.mlp.gate_proj.weight": [ff, h],
    "model.layers.0.mlp.up_proj.weight": [ff, h],
    "model.layers.0.mlp.down_proj.weight": [h, ff],
}
header, data = {}, b""
for name, shape in sorted(shapes.items()):
    n = 1
    for d in shape:
        n *= d
    blob = struct.pack(f"<{n}f", *[((i % 7) - 3) * 0.01 for i in range(n)])
    header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [len(data), len(data) + len(blob)]}
    data += blob
hjson = json.dumps(header).encode()
hjson += b" " * (-len(hjson) % 8)
safetensors = struct.pack("<Q", len(hjson)) + hjson + data


def folder(cfg: dict, tok: dict, st: bytes, flags: int = 0) -> bytes:
    c, t = json.dumps(cfg).encode(), json.dumps(tok).encode()
    return bytes([flags]) + struct.pack("<H", len(c)) + c + struct.pack("<H", len(t)) + t + st


write("hf_folder", "llama-tiny", folder(config, tokenizer, safetensors))
write("hf_folder", "llama-tiny-tokenizer", folder(config, tokenizer, safetensors, flags=1))
write("hf_folder", "qwen2-tiny", folder({**config, "architectures": ["Qwen2ForCausalLM"],
                                         "model_type": "qwen2"}, tokenizer, safetensors))
write("hf_folder", "header-only", folder(config, tokenizer, safetensors[: 8 + len(hjson)]))
