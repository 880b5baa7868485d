"""The request fields SDKs and evaluation harnesses send, each shown to take effect through
the official `openai` client: `logit_bias` (-100 bans a token, +100 forces one), `n` > 1,
`seed`, `echo` with prompt log-probabilities equal to `smelt perplexity --per-token`'s values,
`max_tokens` 0 with echo (scoring only), `max_completion_tokens`, `stream_options` with n."""

from __future__ import annotations

import json
import subprocess
import tempfile
from pathlib import Path

import openai

PROMPT = "Write one word."
MSG = [{"role": "user", "content": PROMPT}]


def first_token_id(smelt_bin: str, model_path: str, prompt: str) -> int:
    """The greedy first token of `prompt` under the chat template, from `smelt run --json`."""
    out = subprocess.run(
        [smelt_bin, "run", "--model", model_path, "--chat", "--prompt", prompt,
         "--max-tokens", "1", "--json"],
        check=True, capture_output=True, text=True, timeout=300,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])["tokens"][0]


def token_text(client: openai.OpenAI, model_id: str, tid: int) -> str:
    """A token's text: a token-id prompt echoed back without generating."""
    r = client.completions.create(model=model_id, prompt=[tid], max_tokens=0, echo=True)
    assert r.usage.completion_tokens == 0
    return r.choices[0].text


def test_logit_bias_bans_and_forces(client, model_id, smelt_bin, model_path) -> None:
    tid = first_token_id(smelt_bin, model_path, PROMPT)
    text = token_text(client, model_id, tid)
    greedy = client.chat.completions.create(
        model=model_id, messages=MSG, max_tokens=1, temperature=0, logprobs=True)
    assert greedy.choices[0].logprobs.content[0].token == text
    banned = client.chat.completions.create(
        model=model_id, messages=MSG, max_tokens=1, temperature=0, logprobs=True,
        logit_bias={str(tid): -100})
    assert banned.choices[0].logprobs.content[0].token != text
    # Never drawn when sampling hot either.
    sampled = client.chat.completions.create(
        model=model_id, messages=MSG, max_tokens=1, temperature=1.5, seed=3, n=8,
        logprobs=True, logit_bias={str(tid): -100})
    assert len(sampled.choices) == 8
    assert all(c.logprobs.content[0].token != text for c in sampled.choices)
    # +100 makes a token win.
    forced = client.chat.completions.create(
        model=model_id, messages=MSG, max_tokens=2, temperature=0, logit_bias={"1000": 100})
    assert forced.choices[0].message.content == token_text(client, model_id, 1000) * 2


def test_n_and_seed(client, model_id) -> None:
    kw = dict(model=model_id, messages=MSG, max_tokens=8, temperature=1.0, seed=1234, n=3)
    a = client.chat.completions.create(**kw)
    b = client.chat.completions.create(**kw)
    assert [c.index for c in a.choices] == [0, 1, 2]
    texts = [c.message.content for c in a.choices]
    assert texts == [c.message.content for c in b.choices], "same seed, same texts"
    assert len(set(texts)) > 1, f"the choices should differ: {texts}"
    assert 3 <= a.usage.completion_tokens <= 24
    # Streamed: every index gets its text and a finish reason, and usage counts all of them.
    stream = client.chat.completions.create(**kw, stream=True, stream_options={"include_usage": True})
    got, finish, usage = {}, {}, None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for ch in chunk.choices:
            got[ch.index] = got.get(ch.index, "") + (ch.delta.content or "")
            if ch.finish_reason:
                finish[ch.index] = ch.finish_reason
    assert [got[i] for i in range(3)] == texts
    assert set(finish) == {0, 1, 2}
    assert usage is not None and usage.completion_tokens == a.usage.completion_tokens
    # Completions too.
    c = client.completions.create(model=model_id, prompt="Once upon a time", max_tokens=6,
                                  temperature=0.9, seed=5, n=2)
    assert [x.index for x in c.choices] == [0, 1]


def test_max_completion_tokens(client, model_id) -> None:
    r = client.chat.completions.create(
        model=model_id, messages=MSG, max_completion_tokens=3, temperature=0, extra_body={"ignore_eos": True})
    assert r.usage.completion_tokens == 3
    assert r.choices[0].finish_reason == "length"


def test_echo_logprobs_equal_perplexity(client, model_id, smelt_bin, model_path) -> None:
    """Each prompt token's log-probability from `echo` + `logprobs` is the number `smelt
    perplexity --per-token` computes for it (the window's tokens, sent as ids)."""
    text = ("The quick brown fox jumps over the lazy dog. " * 6)
    with tempfile.TemporaryDirectory() as d:
        f = Path(d) / "text.txt"
        f.write_text(text)
        out = Path(d) / "per-token.jsonl"
        subprocess.run([smelt_bin, "perplexity", "--model", model_path, "--file", str(f),
                        "--ctx", "24", "--per-token", str(out)],
                       check=True, capture_output=True, text=True, timeout=300)
        windows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(windows) >= 2
    for w in windows[:2]:
        r = client.completions.create(model=model_id, prompt=w["tokens"], max_tokens=0,
                                      echo=True, logprobs=1)
        lp = r.choices[0].logprobs
        assert len(lp.token_logprobs) == len(w["tokens"])
        assert lp.token_logprobs[0] is None
        assert r.choices[0].text.startswith(lp.tokens[0])
        for pos, want in w["scored"]:
            got = lp.token_logprobs[pos]
            assert abs(got - want) <= 1e-5 * max(1.0, abs(want)), (pos, got, want)
            assert len(lp.top_logprobs[pos]) == 1
    # With generation after the prompt, streamed: the echo comes first, then new tokens.
    stream = client.completions.create(model=model_id, prompt="Hello there", max_tokens=3,
                                       echo=True, logprobs=0, temperature=0, stream=True)
    chunks = [c for c in stream if c.choices]
    assert chunks[0].choices[0].text == "Hello there"
    assert chunks[0].choices[0].logprobs.token_logprobs[0] is None
    plain = client.completions.create(model=model_id, prompt="Hello there", max_tokens=3, temperature=0)
    assert "".join(c.choices[0].text for c in chunks) == "Hello there" + plain.choices[0].text
