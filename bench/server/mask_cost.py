"""What structured output costs in decode speed: one `smelt serve` (SmolLM2 on the CPU),
greedy chat answers streamed with a chunk per token, alternately free and constrained by a
JSON schema long enough that neither finishes before max_tokens. Decode time per token is
the gap between the first and the last token's chunk over the tokens between them; each
round measures both, the table gives the medians and the slowdown, and the server's own
counters (smelt_grammar_masks_total, smelt_grammar_mask_microseconds_total) give the time
spent computing and applying masks per constrained token.

Usage: python bench/server/mask_cost.py BASE_URL [ROUNDS (default 5)] [MAX_TOKENS (default 96)]
(bench/server/mask_cost.sh starts the server and runs this with the test venv.)"""

from __future__ import annotations

import statistics
import sys
import time

import httpx
import openai

SCHEMA = {
    "type": "object",
    "properties": {
        "words": {"type": "array", "minItems": 60,
                  "items": {"type": "string", "maxLength": 8}},
    },
    "required": ["words"],
    "additionalProperties": False,
}
MSG = [{"role": "user", "content": "List many different English words as JSON."}]


def per_token_ms(client: openai.OpenAI, model: str, max_tokens: int, constrained: bool) -> float:
    kw = dict(model=model, messages=MSG, max_tokens=max_tokens, temperature=0, stream=True,
              logprobs=True)
    if constrained:
        kw["response_format"] = {"type": "json_schema",
                                 "json_schema": {"name": "words", "schema": SCHEMA, "strict": True}}
    else:
        kw["extra_body"] = {"ignore_eos": True}
    stamps = []
    for chunk in client.chat.completions.create(**kw):
        if chunk.choices and chunk.choices[0].logprobs and chunk.choices[0].logprobs.content:
            stamps.extend([time.perf_counter()] * len(chunk.choices[0].logprobs.content))
    assert len(stamps) == max_tokens, (constrained, len(stamps))
    return (stamps[-1] - stamps[0]) / (len(stamps) - 1) * 1e3


def counter(base: str, name: str) -> float:
    text = httpx.get(base + "/metrics", timeout=30).text
    return sum(float(line.split()[-1]) for line in text.splitlines()
               if line.startswith(name + "{") or line.startswith(name + " "))


def main() -> None:
    base = sys.argv[1].rstrip("/")
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 5
    max_tokens = int(sys.argv[3]) if len(sys.argv) > 3 else 96
    client = openai.OpenAI(base_url=base + "/v1", api_key="x", max_retries=0, timeout=600)
    model = client.models.list().data[0].id
    per_token_ms(client, model, 16, False)  # warm up
    t0 = time.perf_counter()
    per_token_ms(client, model, 16, True)
    first_compile_s = time.perf_counter() - t0
    free, cons = [], []
    m0, us0 = counter(base, "smelt_grammar_masks_total"), counter(base, "smelt_grammar_mask_microseconds_total")
    for _ in range(rounds):
        free.append(per_token_ms(client, model, max_tokens, False))
        cons.append(per_token_ms(client, model, max_tokens, True))
    m1, us1 = counter(base, "smelt_grammar_masks_total"), counter(base, "smelt_grammar_mask_microseconds_total")
    f, c = statistics.median(free), statistics.median(cons)
    print(f"rounds {rounds}, {max_tokens} tokens each, greedy, one stream at a time")
    print(f"| decode | ms/token (median) | tok/s |")
    print(f"| --- | --- | --- |")
    print(f"| free | {f:.2f} | {1e3 / f:.1f} |")
    print(f"| json_schema | {c:.2f} | {1e3 / c:.1f} |")
    print(f"slowdown: {100 * (c / f - 1):+.1f}%  (per-round free {['%.2f' % x for x in free]}, "
          f"constrained {['%.2f' % x for x in cons]})")
    print(f"mask: {(us1 - us0) / max(1, m1 - m0):.0f} us per constrained token over {m1 - m0:.0f} tokens "
          f"(server counters); first request with the schema (compile included): {first_compile_s:.2f} s")


if __name__ == "__main__":
    main()
