"""The OpenAI API of `smelt serve` through the official `openai` package: chat and text
completions (stream and not), models, usage, finish reasons, stop strings, seeds, logprobs.
Greedy answers are compared with `smelt run` so the server is held to the engine's own output."""

from __future__ import annotations

import json
import math
import subprocess

import httpx
import openai
import pytest

GREETING = [{"role": "user", "content": "What is the capital of France?"}]


def smelt_run_json(smelt_bin: str, model_path: str, prompt: str, max_tokens: int) -> dict:
    out = subprocess.run(
        [smelt_bin, "run", "--model", model_path, "--chat", "--prompt", prompt,
         "--max-tokens", str(max_tokens), "--json"],
        check=True, capture_output=True, text=True, timeout=300,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_models_list_and_retrieve(client: openai.OpenAI, model_id: str) -> None:
    models = client.models.list()
    ids = [m.id for m in models.data]
    assert model_id in ids
    assert all(m.object == "model" for m in models.data)
    one = client.models.retrieve(model_id)
    assert one.id == model_id


def test_chat_greedy_matches_smelt_run(client, model_id, smelt_bin, model_path) -> None:
    """prompt_tokens, the completion and its token count equal `smelt run --chat --json`'s."""
    prompt = "Name three colours."
    reference = smelt_run_json(smelt_bin, model_path, prompt, 12)
    r = client.chat.completions.create(
        model=model_id, messages=[{"role": "user", "content": prompt}],
        max_tokens=12, temperature=0,
    )
    assert r.object == "chat.completion"
    assert r.usage.prompt_tokens == len(reference["prompt_tokens"])
    assert r.usage.completion_tokens == len(reference["tokens"]) == 12
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    assert r.choices[0].message.role == "assistant"
    assert r.choices[0].message.content == reference["text"]
    assert r.choices[0].finish_reason == "length"


def test_chat_stream_counts_and_text(client, model_id) -> None:
    """Streamed tokens (one logprob entry each) == completion_tokens when max_tokens hits, and
    the streamed text equals the non-streamed greedy text."""
    plain = client.chat.completions.create(
        model=model_id, messages=GREETING, max_tokens=16, temperature=0)
    stream = client.chat.completions.create(
        model=model_id, messages=GREETING, max_tokens=16, temperature=0, stream=True,
        logprobs=True, stream_options={"include_usage": True})
    text, tokens, finish, usage, content_chunks = "", 0, None, None, 0
    for chunk in stream:
        assert chunk.object == "chat.completion.chunk"
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            if choice.delta.content:
                text += choice.delta.content
                content_chunks += 1
            if choice.logprobs is not None and choice.logprobs.content:
                tokens += len(choice.logprobs.content)
            if choice.finish_reason:
                finish = choice.finish_reason
    assert finish == "length"
    assert usage is not None, "stream_options.include_usage gave no usage chunk"
    assert usage.completion_tokens == 16 == tokens
    assert content_chunks >= 2, "the stream did not arrive in pieces"
    assert usage.prompt_tokens == plain.usage.prompt_tokens
    assert text == plain.choices[0].message.content


def test_stream_without_include_usage_has_no_usage(client, model_id) -> None:
    stream = client.chat.completions.create(
        model=model_id, messages=GREETING, max_tokens=4, temperature=0, stream=True)
    chunks = list(stream)
    assert chunks
    assert all(c.usage is None for c in chunks)


def test_finish_reason_stop_on_end_of_generation(client, model_id) -> None:
    r = client.chat.completions.create(
        model=model_id, messages=[{"role": "user", "content": "Say hello."}],
        max_tokens=300, temperature=0)
    assert r.choices[0].finish_reason == "stop"
    assert 0 < r.usage.completion_tokens < 300


def test_max_completion_tokens(client, model_id) -> None:
    r = client.chat.completions.create(
        model=model_id, messages=GREETING, max_completion_tokens=5, temperature=0)
    assert r.usage.completion_tokens == 5
    assert r.choices[0].finish_reason == "length"


def test_stop_strings(client, model_id) -> None:
    full = client.chat.completions.create(
        model=model_id, messages=GREETING, max_tokens=24, temperature=0
    ).choices[0].message.content
    words = full.split()
    assert len(words) >= 4, f"need a longer greedy answer to cut: {full!r}"
    stop = " " + words[3]
    cut = full[: full.index(stop)]
    for stream in (False, True):
        if stream:
            parts = client.chat.completions.create(
                model=model_id, messages=GREETING, max_tokens=24, temperature=0,
                stop=[stop, "never-appears-xyz"], stream=True)
            text, finish = "", None
            for chunk in parts:
                for c in chunk.choices:
                    text += c.delta.content or ""
                    finish = c.finish_reason or finish
        else:
            r = client.chat.completions.create(
                model=model_id, messages=GREETING, max_tokens=24, temperature=0, stop=stop)
            text, finish = r.choices[0].message.content, r.choices[0].finish_reason
        assert text == cut, f"stream={stream}"
        assert finish == "stop", f"stream={stream}"


def test_seed_reproducible(client, model_id) -> None:
    def sample(seed: int) -> str:
        return client.chat.completions.create(
            model=model_id, messages=[{"role": "user", "content": "Write a short poem."}],
            max_tokens=24, temperature=1.0, top_p=0.95, seed=seed,
        ).choices[0].message.content

    first = sample(1234)
    assert sample(1234) == first
    others = {sample(s) for s in (1, 2, 3)}
    assert others - {first}, "different seeds never changed the sampled text"


def test_logprobs_shape(client, model_id) -> None:
    r = client.chat.completions.create(
        model=model_id, messages=GREETING, max_tokens=6, temperature=0,
        logprobs=True, top_logprobs=3)
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens == 6
    assert "".join(t.token for t in content) == r.choices[0].message.content
    for t in content:
        assert t.logprob <= 0 and math.isfinite(t.logprob)
        assert bytes(t.bytes).decode("utf-8", "replace") == t.token
        assert len(t.top_logprobs) == 3
        lps = [a.logprob for a in t.top_logprobs]
        assert lps == sorted(lps, reverse=True)
        # Greedy: the chosen token is the most likely one.
        assert t.top_logprobs[0].token == t.token
        assert t.top_logprobs[0].logprob == pytest.approx(t.logprob, abs=1e-5)


def test_multi_turn_with_system_and_assistant(client, model_id) -> None:
    r = client.chat.completions.create(
        model=model_id, max_tokens=8, temperature=0,
        messages=[
            {"role": "system", "content": "You answer in one word."},
            {"role": "user", "content": "Colour of the sky?"},
            {"role": "assistant", "content": "Blue."},
            {"role": "user", "content": "And grass?"},
        ])
    single = client.chat.completions.create(
        model=model_id, max_tokens=8, temperature=0,
        messages=[{"role": "system", "content": "You answer in one word."},
                  {"role": "user", "content": "And grass?"}])
    # The earlier user and assistant turns are in the prompt, each with its template markers.
    assert r.usage.prompt_tokens >= single.usage.prompt_tokens + 10
    assert r.choices[0].message.content


def test_penalties_accepted_and_unknown_fields_refused(client, model_id) -> None:
    """A field the server does not implement is a 400 naming it, never silently ignored."""
    r = client.chat.completions.create(
        model=model_id, messages=GREETING, max_tokens=4, temperature=0,
        presence_penalty=0.5, frequency_penalty=0.5, user="e2e",
        extra_body={"some_future_field": None})
    assert r.usage.completion_tokens == 4
    for extra in ({"some_future_field": {"x": 1}}, {"functions": []}, {"audio": {"voice": "x"}}):
        with pytest.raises(openai.BadRequestError) as err:
            client.chat.completions.create(
                model=model_id, messages=GREETING, max_tokens=4, extra_body=extra)
        (name,) = extra
        assert err.value.body["param"] == name, err.value.body
        assert name in err.value.body["message"]
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(model=model_id, prompt="a", max_tokens=2, suffix="b")
    assert err.value.body["param"] == "suffix"


def test_completions(client, model_id) -> None:
    r = client.completions.create(
        model=model_id, prompt="The capital of France is", max_tokens=8, temperature=0)
    assert r.object == "text_completion"
    assert r.usage.completion_tokens == 8
    assert r.choices[0].finish_reason == "length"
    text = r.choices[0].text
    stream = client.completions.create(
        model=model_id, prompt="The capital of France is", max_tokens=8, temperature=0,
        stream=True, stream_options={"include_usage": True})
    streamed, usage = "", None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for c in chunk.choices:
            streamed += c.text
    assert streamed == text
    assert usage is not None and usage.completion_tokens == 8
    assert usage.prompt_tokens == r.usage.prompt_tokens


def test_completions_logprobs_and_stop(client, model_id) -> None:
    r = client.completions.create(
        model=model_id, prompt="One, two, three,", max_tokens=5, temperature=0, logprobs=2)
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 5
    assert all(len(alts) == 2 for alts in lp.top_logprobs)
    assert "".join(lp.tokens) == r.choices[0].text
    text = r.choices[0].text
    assert len(text) >= 4, f"need a longer greedy continuation to cut: {text!r}"
    stop = text[len(text) // 2 : len(text) // 2 + 2]
    cut = client.completions.create(
        model=model_id, prompt="One, two, three,", max_tokens=5, temperature=0, stop=[stop])
    assert cut.choices[0].text == text[: text.index(stop)]
    assert cut.choices[0].finish_reason == "stop"


def test_health_metrics_openapi_admin(http: httpx.Client, model_id: str) -> None:
    from conftest import parse_metrics

    assert http.get("/health").status_code == 200
    r = http.get("/metrics")
    assert r.status_code == 200
    names = {n for n, _, _ in parse_metrics(r.text)}
    for want in (
        "smelt_requests_total", "smelt_prompt_tokens_total", "smelt_generated_tokens_total",
        "smelt_time_to_first_token_seconds_bucket", "smelt_time_to_first_token_seconds_sum",
        "smelt_time_to_first_token_seconds_count", "smelt_inter_token_latency_seconds_bucket",
        "smelt_queue_depth", "smelt_running_sequences", "smelt_kv_blocks_used",
        "smelt_kv_blocks_free",
    ):
        assert want in names, f"/metrics lacks {want}"
    statuses = {lab.get("status") for n, lab, _ in parse_metrics(r.text) if n == "smelt_requests_total"}
    assert "200" in statuses
    spec = http.get("/openapi.json")
    assert spec.status_code == 200
    doc = spec.json()
    assert "openapi" in doc
    for path in ("/v1/chat/completions", "/v1/completions", "/v1/models"):
        assert path in doc["paths"], f"/openapi.json lacks {path}"
    admin = http.get("/admin/models")
    assert admin.status_code == 200
    assert model_id in [m["id"] for m in admin.json()["data"]]


def test_admin_load_and_unload(http: httpx.Client, model_path: str, client: openai.OpenAI) -> None:
    r = http.post("/admin/models", json={"action": "load", "model": model_path, "id": "e2e-copy"})
    assert r.status_code == 200, r.text
    try:
        assert "e2e-copy" in [m.id for m in client.models.list().data]
        out = client.chat.completions.create(
            model="e2e-copy", messages=GREETING, max_tokens=3, temperature=0)
        assert out.usage.completion_tokens == 3
    finally:
        r = http.post("/admin/models", json={"action": "unload", "id": "e2e-copy"})
    assert r.status_code == 200, r.text
    assert "e2e-copy" not in [m.id for m in client.models.list().data]
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="e2e-copy", messages=GREETING, max_tokens=1)
