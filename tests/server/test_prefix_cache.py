"""Prefix caching against a real `smelt serve`: a second request that shares a ~2,000-token
system prompt with the first gets its first token at least 5x sooner (its KV blocks are
reused, not computed), /metrics counts the hits and gives the hit rate, and an answer
computed on cached blocks is the same tokens as computed cold."""

from __future__ import annotations

import time
import uuid

import openai

from conftest import metric


def system_prompt() -> str:
    # A fresh nonce first, so no earlier test's blocks match.
    facts = " ".join(f"Fact {i}: the box numbered {i} holds {i * 7 % 97} red marbles." for i in range(120))
    return f"Session {uuid.uuid4()}. Remember these facts. {facts}"


def first_token_seconds(client: openai.OpenAI, model: str, messages: list[dict]) -> tuple[float, str]:
    t0 = time.perf_counter()
    stream = client.chat.completions.create(model=model, messages=messages, max_tokens=6,
                                            temperature=0, stream=True)
    first, text = None, ""
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            if first is None:
                first = time.perf_counter() - t0
            text += chunk.choices[0].delta.content
    assert first is not None
    return first, text


def test_shared_system_prompt_is_computed_once(client, model_id, http) -> None:
    system = system_prompt()
    ask = lambda q: [{"role": "system", "content": system}, {"role": "user", "content": q}]  # noqa: E731
    queried0 = metric(http, "smelt_prefix_cache_query_tokens_total")
    hits0 = metric(http, "smelt_prefix_cache_hit_tokens_total")
    cold, cold_text = first_token_seconds(client, model_id, ask("How many marbles are in box 3?"))
    hits1 = metric(http, "smelt_prefix_cache_hit_tokens_total")
    warm, _ = first_token_seconds(client, model_id, ask("How many marbles are in box 5?"))
    hits2 = metric(http, "smelt_prefix_cache_hit_tokens_total")
    probe = client.chat.completions.create(model=model_id, messages=ask("x"), max_tokens=1)
    assert probe.usage.prompt_tokens >= 2000, probe.usage.prompt_tokens
    print(f"first token: {cold:.3f} s cold, {warm:.3f} s with the prefix cached")
    assert hits1 - hits0 < 100, "the nonce keeps the first request cold"
    assert hits2 - hits1 >= 1900, (hits1, hits2)
    assert metric(http, "smelt_prefix_cache_query_tokens_total") - queried0 >= 2 * 1900
    # The hit rate as a figure of its own (hits over lookups since load), and the cache on.
    rate = metric(http, "smelt_prefix_cache_hit_rate")
    hits, queried = (metric(http, f"smelt_prefix_cache_{k}_tokens_total") for k in ("hit", "query"))
    assert 0 < rate <= 1 and abs(rate - hits / queried) < 1e-9, (rate, hits, queried)
    assert metric(http, "smelt_prefix_cache_enabled") == 1
    assert cold >= 5 * warm, f"first token: {cold:.3f} s cold, {warm:.3f} s with the prefix cached"
    # Computed from cached blocks, the first question's answer is the same tokens again.
    _, again = first_token_seconds(client, model_id, ask("How many marbles are in box 3?"))
    assert again == cold_text, (again, cold_text)
