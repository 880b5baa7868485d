"""Tool calling through the official `openai` client, against servers started with a
Qwen-style (Hermes `<tool_call>`), a Llama-3.1-style (JSON `parameters`) and a Mistral-style
(`[TOOL_CALLS] [...]`) chat template:
a forced call (`required` / a named function) comes back as OpenAI `tool_calls` whose
arguments validate against the tool's schema, streamed as OpenAI streams calls and not;
the call and a `tool` message go back through the template for the answer; `none` gives
text; `parallel_tool_calls` lets a forced answer hold one call or more, each valid; a
template without a tool format refuses tools with a 400."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import openai
import pytest

from conftest import extra_server, make_client

TEMPLATES = Path(__file__).resolve().parent / "templates"

WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 20},
        "unit": {"enum": ["celsius", "fahrenheit"]},
    },
    "required": ["city", "unit"],
    "additionalProperties": False,
}
TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "The current weather in a city.", "parameters": WEATHER}},
    {"type": "function", "function": {
        "name": "get_time", "description": "The local time in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}},
                       "required": ["city"], "additionalProperties": False}}},
]
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module", params=["qwen-tools.jinja", "llama3-tools.jinja", "mistral-tools.jinja"])
def tool_client(request, smelt_bin: str, model_path: str):
    with extra_server(smelt_bin, model_path, "--chat-template", str(TEMPLATES / request.param)) as url:
        c = make_client(url)
        yield c, c.models.list().data[0].id, request.param


def streamed_calls(stream) -> tuple[list[dict], str | None, str]:
    """Accumulates streamed tool-call deltas the way OpenAI's docs show."""
    calls: dict[int, dict] = {}
    finish, content = None, ""
    for chunk in stream:
        for ch in chunk.choices:
            finish = ch.finish_reason or finish
            content += ch.delta.content or ""
            for tc in ch.delta.tool_calls or []:
                c = calls.setdefault(tc.index, {"id": None, "name": "", "arguments": ""})
                if tc.id:
                    c["id"] = tc.id
                if tc.function and tc.function.name:
                    c["name"] += tc.function.name
                if tc.function and tc.function.arguments:
                    c["arguments"] += tc.function.arguments
    return [calls[i] for i in sorted(calls)], finish, content


def test_named_call_round_trip(tool_client) -> None:
    client, model, _ = tool_client
    choice = {"type": "function", "function": {"name": "get_weather"}}
    r = client.chat.completions.create(model=model, messages=ASK, tools=TOOLS, tool_choice=choice,
                                       max_tokens=60, temperature=0)
    msg = r.choices[0].message
    assert r.choices[0].finish_reason == "tool_calls", msg
    assert len(msg.tool_calls) == 1
    call = msg.tool_calls[0]
    assert call.type == "function" and call.function.name == "get_weather" and call.id
    args = json.loads(call.function.arguments)
    jsonschema.validate(args, WEATHER)
    # Streamed: the same call, id and name first, then the arguments.
    calls, finish, _ = streamed_calls(client.chat.completions.create(
        model=model, messages=ASK, tools=TOOLS, tool_choice=choice, max_tokens=60, temperature=0,
        stream=True))
    assert finish == "tool_calls"
    assert [c["name"] for c in calls] == ["get_weather"] and calls[0]["id"]
    assert json.loads(calls[0]["arguments"]) == args
    # The call and its result go back through the template; the model answers in text.
    follow = ASK + [
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"temp_c": 21, "sky": "sunny"})},
    ]
    # ignore_eos: the tiny model may end at once after a tool result (it does after
    # Mistral's [/TOOL_RESULTS]); the text, not its length, is the point here.
    r2 = client.chat.completions.create(model=model, messages=follow, tools=TOOLS, tool_choice="none",
                                        max_tokens=8, temperature=0, extra_body={"ignore_eos": True})
    assert r2.choices[0].message.tool_calls is None
    assert r2.choices[0].message.content
    # The tool result reached the prompt: it is longer than the first request's by about it.
    assert r2.usage.prompt_tokens > r.usage.prompt_tokens + 10
    r3 = client.chat.completions.create(model=model, messages=follow, tools=TOOLS, max_tokens=8,
                                        temperature=0, stream=True)
    _, finish, _ = streamed_calls(r3)
    assert finish in ("stop", "length", "tool_calls")


def test_required_picks_a_tool(tool_client) -> None:
    client, model, _ = tool_client
    for stream in (False, True):
        kw = dict(model=model, messages=ASK, tools=TOOLS, tool_choice="required", max_tokens=80,
                  temperature=0, parallel_tool_calls=False)
        if stream:
            calls, finish, _ = streamed_calls(client.chat.completions.create(**kw, stream=True))
        else:
            r = client.chat.completions.create(**kw)
            finish = r.choices[0].finish_reason
            calls = [{"name": c.function.name, "arguments": c.function.arguments, "id": c.id}
                     for c in r.choices[0].message.tool_calls]
        assert finish == "tool_calls"
        assert len(calls) == 1
        assert calls[0]["name"] in ("get_weather", "get_time")
        schema = TOOLS[0 if calls[0]["name"] == "get_weather" else 1]["function"]["parameters"]
        jsonschema.validate(json.loads(calls[0]["arguments"]), schema)


def test_parallel_calls_are_each_valid(tool_client) -> None:
    """With `parallel_tool_calls` (OpenAI's default) a forced answer holds several calls,
    each with its own index and id, each valid, streamed as not. This tiny model goes on
    calling until `max_tokens` cuts it off: the answer then says `length`, keeps its
    complete calls, and never passes an unfinished call off as one."""
    client, model, _ = tool_client
    ask = [{"role": "user", "content": "What are the weather and the local time in Paris and in Rome?"}]
    kw = dict(model=model, messages=ask, tools=TOOLS, tool_choice="required", max_tokens=160,
              temperature=0, parallel_tool_calls=True)
    # Once first, so both answers below start from the same cached prompt blocks (a cold
    # prompt is cut into other chunks, which can move a near-tie).
    client.chat.completions.create(**{**kw, "max_tokens": 1})
    r = client.chat.completions.create(**kw)
    finish = r.choices[0].finish_reason
    assert finish in ("tool_calls", "length"), r.choices[0]
    whole = [{"name": c.function.name, "arguments": c.function.arguments, "id": c.id}
             for c in r.choices[0].message.tool_calls or []]
    # Greedy, this model writes several calls in the Hermes and Llama 3 formats (until cut
    # off) and one in Mistral's, closing its list.
    assert len(whole) >= (2 if finish == "length" else 1), r.choices[0]
    assert len({c["id"] for c in whole}) == len(whole), whole
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
    for c in whole:
        jsonschema.validate(json.loads(c["arguments"]), schemas[c["name"]])
    streamed, streamed_finish, _ = streamed_calls(client.chat.completions.create(**kw, stream=True))
    assert streamed_finish == finish
    pairs = lambda calls: [(c["name"], c["arguments"]) for c in calls]  # noqa: E731
    if finish == "tool_calls":
        assert pairs(streamed) == pairs(whole)
    else:
        # The stream may have begun the call that max_tokens cut off.
        assert pairs(streamed[: len(whole)]) == pairs(whole)
        assert len(streamed) <= len(whole) + 1


# What each template's model writes for a call, as a regex (smelt's extension) can force it:
# with `tool_choice` auto nothing forces a call, so this shows the reading of free text.
CALL_TEXT = {
    "qwen-tools.jinja": r'<tool_call>\n\{"name": "get_weather", "arguments": \{"city": "Paris", "unit": "celsius"\}\}\n</tool_call>',
    "llama3-tools.jinja": r'\{"name": "get_weather", "parameters": \{"city": "Paris", "unit": "celsius"\}\}',
    "mistral-tools.jinja": r'\[TOOL_CALLS\] \[\{"name": "get_weather", "arguments": \{"city": "Paris", "unit": "celsius"\}\}\]',
}


def test_auto_reads_a_call_the_model_writes(tool_client) -> None:
    """`tool_choice` auto (the default with tools): a call the model writes in its
    template's format comes back as `tool_calls`, streamed in pieces as not; plain text
    stays content."""
    client, model, template = tool_client
    kw = dict(model=model, messages=ASK, tools=TOOLS, max_tokens=60, temperature=0,
              extra_body={"response_format": {"type": "regex", "regex": CALL_TEXT[template]}})
    r = client.chat.completions.create(**kw)
    assert r.choices[0].finish_reason == "tool_calls", r.choices[0]
    (call,) = r.choices[0].message.tool_calls
    assert call.function.name == "get_weather" and call.id
    assert json.loads(call.function.arguments) == {"city": "Paris", "unit": "celsius"}
    assert not r.choices[0].message.content
    calls, finish, content = streamed_calls(client.chat.completions.create(**kw, stream=True))
    assert finish == "tool_calls" and content == ""
    assert [(c["name"], c["arguments"]) for c in calls] == [("get_weather", call.function.arguments)]
    # Text that is no call stays text.
    plain = client.chat.completions.create(
        model=model, messages=ASK, tools=TOOLS, max_tokens=20, temperature=0,
        extra_body={"response_format": {"type": "regex", "regex": "It is sunny in Paris\\."}})
    assert plain.choices[0].message.content == "It is sunny in Paris."
    assert plain.choices[0].message.tool_calls is None
    assert plain.choices[0].finish_reason == "stop"


def test_tools_need_a_tool_format(client: openai.OpenAI, model_id: str) -> None:
    """SmolLM2's own template shows no tool-call format: tools are refused, not ignored."""
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model=model_id, messages=ASK, tools=TOOLS, max_tokens=4)
    assert err.value.body["param"] == "tools"
    # tool_choice none with tools is plain chat.
    r = client.chat.completions.create(model=model_id, messages=ASK, tools=TOOLS, tool_choice="none",
                                       max_tokens=4)
    assert r.choices[0].message.content


def test_arguments_stream_in_pieces(tool_client) -> None:
    """Arguments arrive piece by piece, as OpenAI streams them, and the openai client's own
    stream accumulation (`chat.completions.stream`) adds them up to the non-streamed call."""
    client, model, _ = tool_client
    strict = [{"type": "function", "function": {**TOOLS[0]["function"], "strict": True}}]
    choice = {"type": "function", "function": {"name": "get_weather"}}
    kw = dict(model=model, messages=ASK, tools=strict, tool_choice=choice, max_tokens=60,
              temperature=0)
    whole = client.chat.completions.create(**kw).choices[0].message.tool_calls[0]
    pieces = []
    with client.chat.completions.stream(**kw) as stream:
        for event in stream:
            if event.type == "tool_calls.function.arguments.delta":
                pieces.append(event.arguments_delta)
        final = stream.get_final_completion()
    call = final.choices[0].message.tool_calls[0]
    assert len(pieces) >= 3, pieces
    assert "".join(pieces) == whole.function.arguments == call.function.arguments
    assert call.function.name == "get_weather" and call.id
    assert call.function.parsed_arguments == json.loads(whole.function.arguments)
