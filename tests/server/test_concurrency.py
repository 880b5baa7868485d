"""Continuous batching seen from outside: 16 concurrent greedy streams each equal their own
sequential output, and a client that disconnects mid-stream frees its sequence."""

from __future__ import annotations

import concurrent.futures
import json
import time

import httpx
import openai

from conftest import metric

PROMPTS = [
    "Tell me about the sea.", "What is 2 + 2?", "Name a fruit.", "Describe a cat.",
    "Why is the sky blue?", "Write a haiku about snow.", "What is Rust?", "Count to five.",
    "Give me a colour.", "What do bees make?", "Say something kind.", "Who wrote Hamlet?",
    "What is a GPU?", "Describe rain.", "Name a planet.", "What is bread made of?",
]


def stream_text(client: openai.OpenAI, model: str, prompt: str, max_tokens: int) -> tuple[str, int]:
    stream = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": prompt}], max_tokens=max_tokens,
        temperature=0, stream=True, stream_options={"include_usage": True})
    text, tokens = "", None
    for chunk in stream:
        if chunk.usage is not None:
            tokens = chunk.usage.completion_tokens
        for c in chunk.choices:
            text += c.delta.content or ""
    assert tokens is not None
    return text, tokens


def test_16_concurrent_greedy_streams_equal_sequential(client: openai.OpenAI, model_id: str) -> None:
    sequential = [stream_text(client, model_id, p, 20) for p in PROMPTS]
    with concurrent.futures.ThreadPoolExecutor(len(PROMPTS)) as pool:
        concurrent_out = list(pool.map(lambda p: stream_text(client, model_id, p, 20), PROMPTS))
    for prompt, seq, con in zip(PROMPTS, sequential, concurrent_out):
        assert con == seq, f"prompt {prompt!r}: concurrent {con!r} != sequential {seq!r}"


def wait_for(pred, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.1)
    return pred()


def test_disconnect_mid_stream_frees_sequence(http: httpx.Client, base_url: str, model_id: str) -> None:
    running = lambda: metric(http, "smelt_running_sequences", model=model_id)  # noqa: E731
    used = lambda: metric(http, "smelt_kv_blocks_used", model=model_id)  # noqa: E731
    assert wait_for(lambda: running() == 0, 30), "sequences still running before the test"
    body = {"model": model_id, "messages": [{"role": "user", "content": "Tell a long story."}],
            "max_tokens": 3000, "temperature": 0, "stream": True, "ignore_eos": True}
    with httpx.Client(timeout=300) as c:
        with c.stream("POST", base_url + "/v1/chat/completions", json=body) as r:
            assert r.status_code == 200
            seen = 0
            # The iterator is held in a name so that `break` leaves it open: a loop's own
            # generator is closed when the loop ends, and closing it makes httpcore close
            # the connection, which would free the sequence before the checks below.
            lines = r.iter_lines()
            for line in lines:
                if line.startswith("data: ") and line != "data: [DONE]":
                    json.loads(line[6:])
                    seen += 1
                if seen >= 5:
                    break
            assert seen >= 5
            assert running() >= 1, "the streaming request is not counted as running"
            assert used() > 0
        # Leaving the block closes the connection mid-stream.
    assert wait_for(lambda: running() == 0, 15), "running sequences did not drop after disconnect"
    assert wait_for(lambda: used() == 0, 15), "KV blocks were not freed after disconnect"


def test_disconnect_non_stream_frees_sequence(http: httpx.Client, base_url: str, model_id: str) -> None:
    running = lambda: metric(http, "smelt_running_sequences", model=model_id)  # noqa: E731
    assert wait_for(lambda: running() == 0, 30)
    body = {"model": model_id, "messages": [{"role": "user", "content": "Tell a long story."}],
            "max_tokens": 3000, "temperature": 0, "ignore_eos": True}
    try:
        httpx.post(base_url + "/v1/chat/completions", json=body, timeout=1.5)
        raise AssertionError("a 3000-token answer came back within 1.5 s")
    except httpx.TimeoutException:
        pass
    assert wait_for(lambda: running() == 0, 15), "non-stream request kept running after its client left"
