"""A GGUF holding only the tokenizer of another (its `tokenizer.*` keys, no tensors), for
`bench/gpu/serve.sh` (`smelt synth --tokenizer-from` reads it; a real model is too large to
carry). Usage: python bench/gpu/tok_gguf.py IN.gguf OUT.gguf (needs the `gguf` package,
as in the venv of scripts/oracles.sh)."""
import sys, gguf
r = gguf.GGUFReader(sys.argv[1])
w = gguf.GGUFWriter(sys.argv[2], arch=r.fields["general.architecture"].contents())
for k, f in r.fields.items():
    if not k.startswith("tokenizer.") or k.startswith("GGUF."): continue
    t = f.types[0]
    if t == gguf.GGUFValueType.ARRAY:
        w.add_key_value(k, f.contents(), t, sub_type=f.types[1])
    else:
        w.add_key_value(k, f.contents(), t)
w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
