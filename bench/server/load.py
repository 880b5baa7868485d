"""Load generator for bench/server/throughput.sh: C clients, each sending R text completions
one after another (greedy, max_tokens fixed, end-of-generation suppressed so every request
asks for the same number of tokens); prints one JSON line with the aggregate generated
tokens per second, from the servers' own usage counts over the wall time of the round.

Usage: load.py URL CONCURRENCY REQUESTS_PER_CLIENT MAX_TOKENS
"""

from __future__ import annotations

import json
import sys
import threading
import time

import httpx

PROMPTS = [
    "The history of the Roman Empire begins",
    "In a small village at the edge of the forest,",
    "The main components of a modern computer are",
    "Photosynthesis is the process by which",
    "The best way to learn a new language is",
    "On the first day of the expedition, the explorers",
    "A good recipe for bread needs",
    "The theory of relativity explains",
    "When the storm reached the harbour,",
    "The rules of chess are simple:",
    "Rivers shape the landscape by",
    "The invention of the printing press",
    "Every morning the old lighthouse keeper",
    "Bees communicate with each other by",
    "The city council met to discuss",
    "Mountains are formed when",
]


def main() -> None:
    url, concurrency, per_client, max_tokens = sys.argv[1], *map(int, sys.argv[2:5])
    results: list[int] = []
    errors: list[str] = []
    lock = threading.Lock()

    def client(k: int) -> None:
        with httpx.Client(timeout=600) as http:
            for j in range(per_client):
                body = {
                    "prompt": PROMPTS[(k * per_client + j) % len(PROMPTS)],
                    "max_tokens": max_tokens,
                    "temperature": 0,
                    # smelt (vLLM's name) and llama.cpp (bias <|endoftext|>, <|im_end|> away):
                    # both generate exactly max_tokens, so both servers do the same work.
                    "ignore_eos": True,
                    "logit_bias": {"0": -100, "2": -100},
                }
                r = http.post(url + "/v1/completions", json=body)
                with lock:
                    if r.status_code != 200:
                        errors.append(f"{r.status_code}: {r.text[:200]}")
                    else:
                        results.append(r.json()["usage"]["completion_tokens"])

    threads = [threading.Thread(target=client, args=(k,)) for k in range(concurrency)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    if errors:
        sys.exit(f"{len(errors)} requests failed, first: {errors[0]}")
    tokens = sum(results)
    print(json.dumps({"concurrency": concurrency, "requests": len(results), "tokens": tokens,
                      "seconds": round(wall, 3), "tokens_per_s": round(tokens / wall, 2)}))


if __name__ == "__main__":
    main()
