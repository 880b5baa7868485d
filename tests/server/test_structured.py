"""Structured output through the official `openai` client: `response_format` json_schema
(20 schemas of different shapes, strict, streamed and not) and json_object always give JSON
that parses and validates; `client.beta.chat.completions.parse` fills a pydantic model; the
regex and Lark grammar extensions match. SmolLM2-135M is far too small to follow a schema by itself, so a
valid answer on every try shows the grammar masks at work."""

from __future__ import annotations

import json
import re
from typing import Literal, Optional

import jsonschema
import openai
import pytest
from pydantic import BaseModel, Field

# Strings and arrays are bounded so a tiny model cannot wander forever inside one.
S = {"type": "string", "maxLength": 12}

SCHEMAS: list[tuple[str, dict]] = [
    ("flat", {"type": "object", "properties": {"name": S, "age": {"type": "integer", "minimum": 0, "maximum": 120}},
              "required": ["name", "age"], "additionalProperties": False}),
    ("bool", {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
              "additionalProperties": False}),
    ("enum", {"type": "object", "properties": {"colour": {"enum": ["red", "green", "blue"]}},
              "required": ["colour"], "additionalProperties": False}),
    ("bounded-number", {"type": "object", "properties": {"t": {"type": "number", "minimum": -5, "maximum": 5}},
                        "required": ["t"], "additionalProperties": False}),
    ("int-range", {"type": "object", "properties": {"n": {"type": "integer", "minimum": 10, "maximum": 99}},
                   "required": ["n"], "additionalProperties": False}),
    ("nested", {"type": "object", "properties": {
        "person": {"type": "object", "properties": {"first": S, "last": S},
                   "required": ["first", "last"], "additionalProperties": False}},
                "required": ["person"], "additionalProperties": False}),
    ("array-of-strings", {"type": "object", "properties": {
        "tags": {"type": "array", "items": S, "minItems": 1, "maxItems": 3}},
                          "required": ["tags"], "additionalProperties": False}),
    ("array-of-objects", {"type": "object", "properties": {
        "items": {"type": "array", "maxItems": 2, "items": {
            "type": "object", "properties": {"id": {"type": "integer", "minimum": 0, "maximum": 9}, "label": S},
            "required": ["id", "label"], "additionalProperties": False}}},
                          "required": ["items"], "additionalProperties": False}),
    ("optional-fields", {"type": "object", "properties": {"a": S, "b": {"type": "integer", "minimum": 0, "maximum": 9}},
                         "required": ["a"], "additionalProperties": False}),
    ("nullable", {"type": "object", "properties": {"note": {"anyOf": [S, {"type": "null"}]}},
                  "required": ["note"], "additionalProperties": False}),
    ("const", {"type": "object", "properties": {"kind": {"const": "point"}, "x": {"type": "integer", "minimum": 0, "maximum": 9}},
               "required": ["kind", "x"], "additionalProperties": False}),
    ("anyof-shapes", {"type": "object", "properties": {"shape": {"anyOf": [
        {"type": "object", "properties": {"circle": {"type": "integer", "minimum": 1, "maximum": 9}},
         "required": ["circle"], "additionalProperties": False},
        {"type": "object", "properties": {"square": {"type": "integer", "minimum": 1, "maximum": 9}},
         "required": ["square"], "additionalProperties": False}]}},
                      "required": ["shape"], "additionalProperties": False}),
    ("defs-ref", {"$defs": {"pt": {"type": "object", "properties": {"x": {"type": "integer", "minimum": 0, "maximum": 9},
                                                                     "y": {"type": "integer", "minimum": 0, "maximum": 9}},
                                   "required": ["x", "y"], "additionalProperties": False}},
                  "type": "object", "properties": {"from": {"$ref": "#/$defs/pt"}, "to": {"$ref": "#/$defs/pt"}},
                  "required": ["from", "to"], "additionalProperties": False}),
    ("pattern", {"type": "object", "properties": {"code": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{2}$"}},
                 "required": ["code"], "additionalProperties": False}),
    ("string-lengths", {"type": "object", "properties": {"word": {"type": "string", "minLength": 2, "maxLength": 5}},
                        "required": ["word"], "additionalProperties": False}),
    ("enum-array", {"type": "object", "properties": {"days": {"type": "array", "maxItems": 3,
                                                              "items": {"enum": ["mon", "tue", "wed"]}}},
                    "required": ["days"], "additionalProperties": False}),
    ("deep", {"type": "object", "properties": {"a": {"type": "object", "properties": {"b": {"type": "object", "properties": {
        "c": {"type": "array", "maxItems": 2, "items": {"type": "integer", "minimum": 0, "maximum": 5}}},
        "required": ["c"], "additionalProperties": False}}, "required": ["b"], "additionalProperties": False}},
              "required": ["a"], "additionalProperties": False}),
    ("mixed", {"type": "object", "properties": {
        "title": S, "score": {"type": "number", "minimum": 0, "maximum": 1},
        "done": {"type": "boolean"}, "level": {"enum": ["low", "high"]}},
               "required": ["title", "score", "done", "level"], "additionalProperties": False}),
    ("top-level-array", {"type": "array", "minItems": 1, "maxItems": 3,
                         "items": {"type": "integer", "minimum": 0, "maximum": 50}}),
    ("tuple-like", {"type": "object", "properties": {"pair": {"type": "array", "prefixItems": [
        {"type": "integer", "minimum": 0, "maximum": 9}, S], "minItems": 2, "maxItems": 2}},
                    "required": ["pair"], "additionalProperties": False}),
]
assert len(SCHEMAS) == 20


def ask(name: str) -> list[dict]:
    return [{"role": "user", "content": f"Give an example {name} record as JSON."}]


@pytest.mark.parametrize("name,schema", SCHEMAS, ids=[n for n, _ in SCHEMAS])
def test_json_schema_always_validates(client: openai.OpenAI, model_id: str, name: str, schema: dict) -> None:
    jsonschema.Draft202012Validator.check_schema(schema)
    rf = {"type": "json_schema", "json_schema": {"name": name.replace("-", "_"), "schema": schema, "strict": True}}
    # Greedy, not streamed.
    r = client.chat.completions.create(
        model=model_id, messages=ask(name), response_format=rf, max_tokens=120, temperature=0)
    text = r.choices[0].message.content
    assert r.choices[0].finish_reason == "stop", (text, r.choices[0].finish_reason)
    jsonschema.validate(json.loads(text), schema)
    # Sampled, streamed.
    stream = client.chat.completions.create(
        model=model_id, messages=ask(name), response_format=rf, max_tokens=120,
        temperature=0.8, seed=7, stream=True)
    parts, finish = [], None
    for chunk in stream:
        if chunk.choices:
            parts.append(chunk.choices[0].delta.content or "")
            finish = chunk.choices[0].finish_reason or finish
    text = "".join(parts)
    assert finish == "stop", (text, finish)
    jsonschema.validate(json.loads(text), schema)


def test_json_object(client: openai.OpenAI, model_id: str) -> None:
    # json_object bounds nothing, and this model repeats itself inside a string until the
    # tokens run out: a frequency penalty (a client setting) lets it finish.
    for stream in (False, True):
        r = client.chat.completions.create(
            model=model_id, messages=[{"role": "user", "content": "Describe a cat in JSON."}],
            response_format={"type": "json_object"}, max_tokens=100, temperature=0,
            frequency_penalty=1.0, stream=stream)
        if stream:
            text = "".join(c.choices[0].delta.content or "" for c in r if c.choices)
        else:
            assert r.choices[0].finish_reason == "stop"
            text = r.choices[0].message.content
        assert isinstance(json.loads(text), dict), text


class Step(BaseModel):
    explanation: str = Field(max_length=20)
    output: int = Field(ge=0, le=100)


class Solution(BaseModel):
    steps: list[Step] = Field(max_length=2)
    final_answer: int = Field(ge=0, le=100)
    confidence: Literal["low", "high"]
    note: Optional[str] = Field(default=None, max_length=10)


def test_beta_parse_with_pydantic(client: openai.OpenAI, model_id: str) -> None:
    r = client.beta.chat.completions.parse(
        model=model_id, messages=[{"role": "user", "content": "Solve 8x + 7 = 23 step by step."}],
        response_format=Solution, max_tokens=150, temperature=0)
    parsed = r.choices[0].message.parsed
    assert isinstance(parsed, Solution), r.choices[0].message.content
    assert parsed.confidence in ("low", "high")


def test_regex_extension(client: openai.OpenAI, model_id: str) -> None:
    r = client.chat.completions.create(
        model=model_id, messages=[{"role": "user", "content": "A date?"}], max_tokens=20, temperature=0,
        extra_body={"response_format": {"type": "regex", "regex": r"20[0-9]{2}-(0[1-9]|1[0-2])-[0-2][0-9]"}})
    assert re.fullmatch(r"20[0-9]{2}-(0[1-9]|1[0-2])-[0-2][0-9]", r.choices[0].message.content)


def test_lark_grammar_extension(client: openai.OpenAI, model_id: str) -> None:
    """smelt's `grammar` response format (Lark, as llguidance reads it): the answer is a
    sentence of the grammar, greedy and sampled, streamed and not."""
    lark = 'start: "The answer is " ANSWER "."\nANSWER: "yes" | "no" | /[0-9]{1,3}/\n'
    shape = re.compile(r"The answer is (yes|no|[0-9]{1,3})\.")
    for temperature, stream in ((0, False), (1.0, True)):
        r = client.chat.completions.create(
            model=model_id, messages=[{"role": "user", "content": "Is the sky blue?"}], max_tokens=20,
            temperature=temperature, seed=11, stream=stream,
            extra_body={"response_format": {"type": "grammar", "grammar": lark}})
        if stream:
            text = "".join(c.choices[0].delta.content or "" for c in r if c.choices)
        else:
            assert r.choices[0].finish_reason == "stop", r.choices[0]
            text = r.choices[0].message.content
        assert shape.fullmatch(text), text


def test_bad_response_format_is_400(client: openai.OpenAI, model_id: str) -> None:
    for rf, param in [
        ({"type": "xml"}, "response_format"),
        ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}, "extra": 1}},
         "response_format.json_schema.extra"),
        ({"type": "regex", "regex": "("}, "response_format"),
        ({"type": "grammar", "grammar": "start: ("}, "response_format"),
        # A schema keyword the grammar compiler cannot enforce is refused, not ignored.
        ({"type": "json_schema", "json_schema": {"name": "x", "schema": {
            "type": "array", "items": {"type": "integer"}, "uniqueItems": True}}}, "response_format"),
    ]:
        with pytest.raises(openai.BadRequestError) as err:
            client.chat.completions.create(
                model=model_id, messages=[{"role": "user", "content": "x"}], max_tokens=4,
                extra_body={"response_format": rf})
        assert err.value.body["param"] == param, err.value.body
