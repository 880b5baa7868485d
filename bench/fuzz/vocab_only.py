"""Copies a GGUF's metadata (tokenizer, chat template, hyperparameters) without its tensors,
so the tokenize_chat fuzz target can run where the full model file is not carried.

usage: vocab_only.py SRC.gguf DST.gguf     (gguf-py 0.19: the oracle venv of scripts/oracles.sh)
"""
import sys

from gguf import GGUFReader, GGUFValueType, GGUFWriter


def main() -> None:
    src, dst = sys.argv[1], sys.argv[2]
    r = GGUFReader(src)
    arch = r.fields["general.architecture"].contents()
    w = GGUFWriter(dst, arch)
    for name, f in r.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        vtype = f.types[0]
        sub = f.types[1] if vtype == GGUFValueType.ARRAY and len(f.types) > 1 else None
        w.add_key_value(name, f.contents(), vtype, sub_type=sub)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    main()
