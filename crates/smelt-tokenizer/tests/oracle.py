"""llama.cpp's tokenizer (through llama-cpp-python's C bindings) and jinja2, as the oracle for
smelt-tokenizer's tests.

Reads one JSON request on stdin, writes one JSON answer on stdout:
  {"model": path, "texts": [...], "pieces": bool, "builtin": [[name, messages, add_ass]...],
   "jinja": [[messages, add_generation_prompt]...]}
Byte strings are answered as hex.
"""

import ctypes
import json
import sys

import llama_cpp


def silence_logs():
    @llama_cpp.llama_log_callback
    def quiet(level, text, user_data):
        pass

    llama_cpp.llama_log_set(quiet, ctypes.c_void_p(0))
    return quiet  # keep the callback alive


def tokenize(vocab, text: bytes, add_special: bool, parse_special: bool):
    cap = len(text) + 16
    buf = (llama_cpp.llama_token * cap)()
    n = llama_cpp.llama_tokenize(vocab, text, len(text), buf, cap, add_special, parse_special)
    if n < 0:
        cap = -n
        buf = (llama_cpp.llama_token * cap)()
        n = llama_cpp.llama_tokenize(vocab, text, len(text), buf, cap, add_special, parse_special)
    return list(buf[:n])


def piece(vocab, tok: int, special: bool) -> bytes:
    size = 64
    while True:
        buf = (ctypes.c_char * size)()
        n = llama_cpp.llama_token_to_piece(vocab, tok, buf, size, 0, special)
        if n >= 0:
            return bytes(buf[:n])
        size = -n


def detokenize(vocab, ids, remove_special: bool, unparse_special: bool) -> bytes:
    arr = (llama_cpp.llama_token * max(len(ids), 1))(*ids)
    size = 256
    while True:
        buf = (ctypes.c_char * size)()
        n = llama_cpp.llama_detokenize(vocab, arr, len(ids), buf, size, remove_special, unparse_special)
        if n >= 0:
            return bytes(buf[:n])
        size = -n


def builtin_template(name: str, messages, add_ass: bool) -> str:
    msgs = (llama_cpp.llama_chat_message * len(messages))()
    keep = []
    for i, m in enumerate(messages):
        role, content = m["role"].encode(), m["content"].encode()
        keep += [role, content]
        msgs[i].role = role
        msgs[i].content = content
    size = 4096
    while True:
        buf = (ctypes.c_char * size)()
        n = llama_cpp.llama_chat_apply_template(name.encode(), msgs, len(messages), add_ass, buf, size)
        if n < 0:
            raise RuntimeError(f"llama_chat_apply_template({name}) failed")
        if n <= size:
            return bytes(buf[:n]).decode()
        size = n


def jinja_render(template: str, bos: str, eos: str, messages, add_generation_prompt: bool) -> str:
    """As transformers' apply_chat_template renders (trim_blocks, lstrip_blocks, sandboxed)."""
    import datetime

    from jinja2.exceptions import TemplateError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt):
        return datetime.datetime.now(datetime.timezone.utc).strftime(fmt)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env.from_string(template).render(
        messages=messages, add_generation_prompt=add_generation_prompt, bos_token=bos, eos_token=eos
    )


def main():
    req = json.load(sys.stdin)
    _keep = silence_logs()
    llama_cpp.llama_backend_init()
    params = llama_cpp.llama_model_default_params()
    params.vocab_only = True
    model = llama_cpp.llama_model_load_from_file(req["model"].encode(), params)
    if not model:
        raise SystemExit(f"llama.cpp could not load {req['model']}")
    vocab = llama_cpp.llama_model_get_vocab(model)
    out = {"encode": [], "detok": []}
    for text in req.get("texts", []):
        b = text.encode()
        enc = {}
        for add in (False, True):
            for parse in (False, True):
                enc[f"{int(add)}{int(parse)}"] = tokenize(vocab, b, add, parse)
        out["encode"].append(enc)
        ids = enc["11"]
        out["detok"].append({
            f"{int(rs)}{int(us)}": detokenize(vocab, ids, rs, us).hex()
            for rs in (False, True) for us in (False, True)
        })
    if req.get("pieces"):
        n = llama_cpp.llama_vocab_n_tokens(vocab)
        out["pieces"] = [[piece(vocab, t, True).hex(), piece(vocab, t, False).hex()] for t in range(n)]
        out["bos"] = llama_cpp.llama_vocab_bos(vocab)
        out["eos"] = llama_cpp.llama_vocab_eos(vocab)
        out["eot"] = llama_cpp.llama_vocab_eot(vocab)
        out["eog"] = [t for t in range(n) if llama_cpp.llama_vocab_is_eog(vocab, t)]
    out["builtin"] = [builtin_template(name, msgs, add) for name, msgs, add in req.get("builtin", [])]
    if req.get("jinja"):
        tmpl = req["template"]
        out["jinja"] = [jinja_render(tmpl, req["bos"], req["eos"], msgs, add) for msgs, add in req["jinja"]]
    json.dump(out, sys.stdout)
    llama_cpp.llama_model_free(model)


if __name__ == "__main__":
    main()
