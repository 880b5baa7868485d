"""Hugging Face `tokenizers` as the oracle for how a tokenizer.json's Split pre-tokenizer
encodes text: convert_hf_to_gguf.py identifies a folder's pre-tokenizer by the hash of the
ids `tokenizers` gives its check text, and smelt-load reproduces that hash with
smelt-tokenizer's implementation, so the two must give the same ids.

Reads one JSON request on stdin: {"regexes": {name: Split pattern}, "vocab_from": name,
"vocab_texts": [...], "texts": [...]}. Builds one byte-level BPE vocabulary: the 256 byte
symbols, then merges until every word pattern `vocab_from` splits `vocab_texts` into is one
token (so a pattern that splits them elsewhere gives other ids; merges never cross a word
boundary).
Encodes the texts under each pattern with the pre-tokenizer Qwen-style tokenizer.json files
use (Split(pattern, isolated), then ByteLevel without its own regex) and writes
{"tokens": [...], "merges": ["a b", ...], "ids": {name: [[...], ...]}} on stdout.
"""

import json
import sys

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers


def byte_symbols():
    """GPT-2's byte -> printable-char table, in byte order."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    table = dict(zip(bs, cs))
    return [chr(table[b]) for b in range(256)]


def pre(regex):
    return pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(regex), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
    ])


def bpe(rank, word):
    """`word`'s symbols merged as BPE merges them: the lowest-ranked pair first, leftmost."""
    parts = list(word)
    while len(parts) > 1:
        pairs = [(rank.get((a, b), len(rank)), i) for i, (a, b) in enumerate(zip(parts, parts[1:]))]
        r, i = min(pairs)
        if r == len(rank):
            break
        parts[i:i + 2] = [parts[i] + parts[i + 1]]
    return parts


def main():
    req = json.load(sys.stdin)
    tokens = byte_symbols()
    vocab = {t: i for i, t in enumerate(tokens)}
    merges = []
    rank = {}
    for text in req["vocab_texts"]:
        for word, _ in pre(req["regexes"][req["vocab_from"]]).pre_tokenize_str(text):
            # a merge added last never fires before the older ones, so words already whole stay so
            while len(parts := bpe(rank, word)) > 1:
                pair = (parts[0], parts[1])
                rank[pair] = len(merges)
                merges.append(pair)
                if pair[0] + pair[1] not in vocab:
                    vocab[pair[0] + pair[1]] = len(tokens)
                    tokens.append(pair[0] + pair[1])
    ids = {}
    for name, regex in req["regexes"].items():
        tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
        tok.pre_tokenizer = pre(regex)
        tok.decoder = decoders.ByteLevel()
        ids[name] = [tok.encode(t, add_special_tokens=False).ids for t in req["texts"]]
    json.dump({"tokens": tokens, "merges": [f"{a} {b}" for a, b in merges], "ids": ids},
              sys.stdout)


if __name__ == "__main__":
    main()
