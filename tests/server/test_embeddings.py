"""`/v1/embeddings` through the official `openai` client: the vectors equal llama.cpp's own
(llama-cpp-python in embedding mode, mean pooling, normalized) for the same model; base64
(the client's default) and float agree; a batch equals its items sent alone; token-id input
equals its text; usage counts tokens; what smelt cannot do is a 400 naming the field."""

from __future__ import annotations

import json
import math
import os
import subprocess
from pathlib import Path

import openai
import pytest

ROOT = Path(__file__).resolve().parents[2]
TEXTS = ["Hello world", "The quick brown fox jumps over the lazy dog."]


def oracle_python() -> str:
    """The llama.cpp oracle venv's python (scripts/oracles.sh builds it once per machine)."""
    py = os.environ.get("SMELT_PYTHON")
    if not py:
        out = subprocess.run([str(ROOT / "scripts/oracles.sh")], check=True,
                             capture_output=True, text=True)
        py = out.stdout.strip().splitlines()[-1]
    assert os.access(py, os.X_OK), f"no oracle python at {py}: run scripts/oracles.sh"
    return py


def cosine(a: list[float], b: list[float]) -> float:
    dot = sum(x * y for x, y in zip(a, b))
    return dot / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))


def test_embeddings_equal_llama_cpp(client, model_id, model_path) -> None:
    out = subprocess.run(
        [oracle_python(), str(ROOT / "crates/smelt-engine/tests/oracle/llamacpp_embed.py"),
         model_path, "mean", *TEXTS],
        check=True, capture_output=True, text=True, timeout=300)
    want = json.loads(out.stdout.strip().splitlines()[-1])
    r = client.embeddings.create(model=model_id, input=TEXTS)
    assert r.object == "list" and r.model == model_id
    assert [d.index for d in r.data] == [0, 1]
    assert r.usage.prompt_tokens == sum(len(t) for t in want["tokens"])
    assert r.usage.total_tokens == r.usage.prompt_tokens
    for got, ref in zip(r.data, want["embeddings"]):
        assert len(got.embedding) == len(ref)
        assert abs(math.sqrt(sum(x * x for x in got.embedding)) - 1) < 1e-5
        assert cosine(got.embedding, ref) > 0.9999
        assert max(abs(x - y) for x, y in zip(got.embedding, ref)) < 2e-3


def test_formats_and_batches_agree(client, model_id, http) -> None:
    as_float = client.embeddings.create(model=model_id, input=TEXTS, encoding_format="float")
    # The client asks for base64 by default and decodes it.
    as_b64 = client.embeddings.create(model=model_id, input=TEXTS)
    raw = http.post("/v1/embeddings", json={"model": model_id, "input": TEXTS[0],
                                            "encoding_format": "base64"}).json()
    assert isinstance(raw["data"][0]["embedding"], str)
    for f, b in zip(as_float.data, as_b64.data):
        # JSON carries the f32 in shortest form, base64 its bits: equal to f32 precision.
        assert f.embedding == pytest.approx(b.embedding, rel=1e-6, abs=1e-9)
    for i, text in enumerate(TEXTS):
        alone = client.embeddings.create(model=model_id, input=text, encoding_format="float")
        assert len(alone.data) == 1 and alone.data[0].index == 0
        assert cosine(alone.data[0].embedding, as_float.data[i].embedding) > 0.99999


def test_token_id_input(client, model_id) -> None:
    text = client.embeddings.create(model=model_id, input="Hello world", encoding_format="float")
    # SmolLM2's tokens for "Hello world" (no BOS: its GGUF adds none).
    by_ids = client.embeddings.create(model=model_id, input=[19556, 905], encoding_format="float")
    lists = client.embeddings.create(model=model_id, input=[[19556, 905], [19556]],
                                     encoding_format="float")
    assert by_ids.usage.prompt_tokens == text.usage.prompt_tokens == 2
    assert cosine(by_ids.data[0].embedding, text.data[0].embedding) > 0.99999
    assert len(lists.data) == 2
    assert cosine(lists.data[0].embedding, text.data[0].embedding) > 0.99999


@pytest.mark.parametrize("body,param", [
    ({"input": "hi", "encoding_format": "int8"}, "encoding_format"),
    ({"input": "hi", "dimensions": 8}, "dimensions"),
    ({"input": "hi", "bogus": 1}, "bogus"),
    ({"input": ""}, "input"),
    ({"input": []}, "input"),
    ({"input": [[]]}, "input"),
    ({"input": [10**9]}, "input"),
])
def test_bad_requests_name_their_field(http, model_id, body, param) -> None:
    r = http.post("/v1/embeddings", json={"model": model_id, **body})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param


def test_unknown_model_is_404(client) -> None:
    with pytest.raises(openai.NotFoundError):
        client.embeddings.create(model="no-such-model", input="hi")


def test_text_plain_is_refused(http, model_id) -> None:
    r = http.post("/v1/embeddings", content=json.dumps({"model": model_id, "input": "hi"}),
                  headers={"content-type": "text/plain"})
    assert r.status_code == 415
