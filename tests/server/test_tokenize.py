"""vLLM's tokenizer endpoints on `smelt serve` (`/tokenize`, `/detokenize`, `/tokenizer_info`):
the shapes vLLM answers and lm-eval's `tokenizer_backend=remote` reads, checked on the real
SmolLM2 model (its chat tokens `<|im_start|>` / `<|im_end|>` are ids 1 and 2)."""

from __future__ import annotations

import httpx


def test_tokenize_detokenize_round_trip(http: httpx.Client, model_id: str) -> None:
    text = "Question: What is the capital of France?\nAnswer: Paris"
    r = http.post("/tokenize", json={"prompt": text, "add_special_tokens": False})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["count"] == len(body["tokens"]) > 5
    assert body["max_model_len"] > 0
    assert all(isinstance(t, int) for t in body["tokens"])
    r = http.post("/detokenize", json={"model": model_id, "tokens": body["tokens"]})
    assert r.status_code == 200, r.text
    assert r.json() == {"prompt": text}
    # The same ids the completions endpoint counts for the same text.
    c = http.post("/v1/completions", json={"prompt": text, "max_tokens": 1, "temperature": 0})
    assert c.status_code == 200, c.text
    assert c.json()["usage"]["prompt_tokens"] == body["count"]


def test_tokenize_special_tokens_and_info(http: httpx.Client, model_id: str) -> None:
    info = http.get("/tokenizer_info")
    assert info.status_code == 200, info.text
    i = info.json()
    assert i["eos_token"] == "<|im_end|>", i
    assert i["model"] == model_id and i["model_max_length"] > 0 and i["vocab_size"] == 49152
    assert "<|im_start|>" in i["chat_template"]
    # Special-token text becomes its token, as a Hugging Face tokenizer (vLLM) parses it.
    r = http.post("/tokenize", json={"prompt": "<|im_end|>", "add_special_tokens": False})
    assert r.json()["tokens"] == [2], r.text
    r = http.post("/tokenize", json={"prompt": "hi", "return_token_strs": True})
    assert r.status_code == 200 and r.json()["token_strs"] == ["hi"], r.text
    r = http.post("/detokenize", json={"tokens": [1, 2]})
    assert r.json()["prompt"] == "<|im_start|><|im_end|>", r.text
    assert http.get("/tokenizer_info", params={"model": model_id}).status_code == 200


def test_tokenize_errors_are_loud(http: httpx.Client) -> None:
    r = http.post("/tokenize", json={"prompt": "x", "bogus": 1})
    assert r.status_code == 400 and "bogus" in r.text, r.text
    r = http.post("/tokenize", json={"messages": [{"role": "user", "content": "x"}]})
    assert r.status_code == 400 and "messages" in r.text, r.text
    r = http.post("/detokenize", json={"tokens": [10**9]})
    assert r.status_code == 400 and "out of range" in r.text, r.text
    r = http.post("/tokenize", json={"model": "no-such-model", "prompt": "x"})
    assert r.status_code == 404, r.text
    assert http.get("/tokenizer_info", params={"model": "no-such-model"}).status_code == 404
