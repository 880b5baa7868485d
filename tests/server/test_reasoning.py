"""Reasoning models' `<think>` text answers as `reasoning_content`, through the official
`openai` client, streamed and not, against servers started with a Qwen3-style template (the
model writes `<think>...</think>`) and a DeepSeek-R1-style one (the prompt opens the block).
SmolLM2 never thinks by itself, so a regex `response_format` makes it write the block; a
model whose template knows no `<think>` keeps such text as content."""

from __future__ import annotations

import openai
import pytest

from conftest import extra_server, make_client
from test_tools import TEMPLATES

ASK = [{"role": "user", "content": "Is the sky blue? Think first."}]
# Lines of words: newlines inside the reasoning must survive streaming.
WORDS = r"[a-z]{2,8}( [a-z]{2,8}){0,2}(\n[a-z]{2,8}( [a-z]{2,8}){0,2}){1,2}"


def ask(client: openai.OpenAI, model: str, stream: bool, **kw) -> tuple[str | None, str | None, str]:
    """(reasoning_content, content, finish_reason), a stream's deltas added up."""
    r = client.chat.completions.create(model=model, messages=ASK, temperature=0, stream=stream, **kw)
    if not stream:
        msg = r.choices[0].message
        return getattr(msg, "reasoning_content", None), msg.content, r.choices[0].finish_reason
    reasoning, content, finish = None, None, None
    for chunk in r:
        for ch in chunk.choices:
            finish = ch.finish_reason or finish
            rc = getattr(ch.delta, "reasoning_content", None)
            if rc:
                reasoning = (reasoning or "") + rc
            if ch.delta.content:
                content = (content or "") + ch.delta.content
    return reasoning, content, finish


@pytest.fixture(scope="module", params=["qwen3-think.jinja", "r1-think.jinja"])
def think_client(request, smelt_bin: str, model_path: str):
    # Without the prefix cache, a repeated prompt is computed the same way each time: with
    # it, the second request's logits come from cached blocks plus a shorter chunk, which
    # moves near-ties under the regex (0.03 nats here) and so the greedy text.
    with extra_server(smelt_bin, model_path, "--chat-template", str(TEMPLATES / request.param),
                      "--no-prefix-cache") as url:
        c = make_client(url)
        # The R1-style prompt opened the block already: the model writes only its end.
        opened = request.param.startswith("r1")
        yield c, c.models.list().data[0].id, opened


def test_think_block_is_reasoning_content(think_client) -> None:
    client, model, opened = think_client
    # After the R1-style prompt's `<think>\n`, another newline: leading whitespace is trimmed.
    pattern = ("\n" if opened else "<think>\n") + WORDS + r"\n</think>\n\n(Yes|No)\."
    rf = {"response_format": {"type": "regex", "regex": pattern}}
    plain = ask(client, model, False, max_tokens=40, extra_body=rf)
    reasoning, content, finish = plain
    assert finish == "stop", plain
    assert content in ("Yes.", "No."), plain
    assert reasoning and "think>" not in reasoning and reasoning == reasoning.strip(), plain
    assert "\n" in reasoning, plain
    # Streamed: the same two texts, none of the tags in either.
    assert ask(client, model, True, max_tokens=40, extra_body=rf) == plain


def test_a_thought_cut_short_stays_reasoning(think_client) -> None:
    """An answer that ends inside the block (max_tokens) is all reasoning, no content, as
    vLLM's reasoning parsers read it; streamed the same."""
    client, model, opened = think_client
    prefix = "" if opened else "<think>\n"
    rf = {"response_format": {"type": "regex", "regex": prefix + "[a-z]{30,40}"}}
    reasoning, content, finish = ask(client, model, False, max_tokens=6, extra_body=rf)
    assert finish == "length" and reasoning and not content, (reasoning, content, finish)
    assert "<" not in reasoning, reasoning
    assert ask(client, model, True, max_tokens=6, extra_body=rf) == (reasoning, None, "length")


def test_without_think_in_the_template_it_stays_content(client: openai.OpenAI, model_id: str) -> None:
    rf = {"response_format": {"type": "regex", "regex": "<think>\n" + WORDS + r"\n</think>\n\nYes\."}}
    for stream in (False, True):
        reasoning, content, _ = ask(client, model_id, stream, max_tokens=40, extra_body=rf)
        assert reasoning is None
        assert content.startswith("<think>\n") and content.endswith("</think>\n\nYes."), content
