"""Every error status of issue 4, in OpenAI's error shape: 400 (bad JSON, bad types,
out-of-range values, prompt longer than the context), 401 (--api-key), 404 (unknown model),
429 with Retry-After (a tiny --max-queue under load)."""

from __future__ import annotations

import concurrent.futures

import httpx
import openai
import pytest

from conftest import extra_server, make_client

MSG = [{"role": "user", "content": "Hello"}]


def assert_openai_error(r: httpx.Response, status: int) -> dict:
    assert r.status_code == status, f"{r.status_code}: {r.text}"
    body = r.json()
    assert isinstance(body.get("error"), dict), body
    assert isinstance(body["error"].get("message"), str) and body["error"]["message"]
    assert "type" in body["error"]
    return body["error"]


def test_bad_json_is_400(http: httpx.Client) -> None:
    for path in ("/v1/chat/completions", "/v1/completions"):
        r = http.post(path, content=b'{"messages": [', headers={"content-type": "application/json"})
        assert_openai_error(r, 400)


@pytest.mark.parametrize(
    "field",
    [
        {"max_tokens": "ten"},
        {"temperature": "hot"},
        {"messages": "hello"},
        {"stream": "yes"},
        {"stop": 5},
        {"seed": 1.5},
    ],
)
def test_bad_types_are_400(http: httpx.Client, model_id: str, field: dict) -> None:
    body = {"model": model_id, "messages": MSG, "max_tokens": 2, **field}
    assert_openai_error(http.post("/v1/chat/completions", json=body), 400)


@pytest.mark.parametrize(
    "field",
    [
        {"temperature": -1},
        {"temperature": 3},
        {"top_p": 1.5},
        {"top_p": -0.1},
        {"max_tokens": -5},
        {"max_tokens": 0},
        {"presence_penalty": 5},
        {"frequency_penalty": -5},
        {"top_logprobs": 50, "logprobs": True},
        {"n": 0},
        {"n": 17},
        {"logit_bias": {"1": 150}},
        {"logit_bias": {"999999": 1}},
    ],
)
def test_out_of_range_is_400(client: openai.OpenAI, model_id: str, field: dict) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(
            model=model_id, messages=MSG, extra_body={"max_tokens": 2, **field})
    assert err.value.status_code == 400


def test_prompt_longer_than_context_is_400(client: openai.OpenAI, model_id: str) -> None:
    long = "word " * 6000  # > --ctx 4096 tokens
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(
            model=model_id, messages=[{"role": "user", "content": long}], max_tokens=2)
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model=model_id, prompt=long, max_tokens=2)
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model=model_id, prompt=long, max_tokens=2, stream=True)


def test_unknown_model_is_404(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as err:
        client.chat.completions.create(model="no-such-model", messages=MSG, max_tokens=2)
    assert err.value.status_code == 404
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="no-such-model", prompt="x", max_tokens=2)
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("no-such-model")


def test_api_key_401(smelt_bin: str, model_path: str) -> None:
    with extra_server(smelt_bin, model_path, "--api-key", "s3cret") as url:
        with pytest.raises(openai.AuthenticationError) as err:
            make_client(url, api_key="wrong").models.list()
        assert err.value.status_code == 401
        with pytest.raises(openai.AuthenticationError):
            make_client(url, api_key="wrong").chat.completions.create(
                model="x", messages=MSG, max_tokens=1)
        # No Authorization header at all, on the API and on admin.
        assert_openai_error(httpx.post(url + "/v1/chat/completions", json={"messages": MSG}), 401)
        # Without --admin-key, --api-key turns admin off (test_security.py).
        assert_openai_error(httpx.get(url + "/admin/models"), 403)
        good = make_client(url, api_key="s3cret")
        model = good.models.list().data[0].id
        r = good.chat.completions.create(model=model, messages=MSG, max_tokens=2, temperature=0)
        assert r.usage.completion_tokens == 2


def test_overload_429_with_retry_after(smelt_bin: str, model_path: str) -> None:
    """One running sequence and a queue of one: of 8 simultaneous requests some get 429 with
    Retry-After, the others finish normally, and nothing else goes wrong."""
    with extra_server(smelt_bin, model_path, "--max-queue", "1", "--max-batch", "1") as url:
        model = make_client(url).models.list().data[0].id
        body = {"model": model, "messages": MSG, "max_tokens": 24, "temperature": 0,
                "ignore_eos": True}

        def one(_: int) -> httpx.Response:
            return httpx.post(url + "/v1/chat/completions", json=body, timeout=300)

        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            responses = list(pool.map(one, range(8)))
        codes = sorted(r.status_code for r in responses)
        assert set(codes) <= {200, 429}, codes
        assert codes.count(429) >= 1, codes
        assert codes.count(200) >= 2, codes
        for r in responses:
            if r.status_code == 429:
                assert_openai_error(r, 429)
                assert int(r.headers["retry-after"]) >= 1
            else:
                assert r.json()["usage"]["completion_tokens"] == 24
        # The official client reports it as RateLimitError too.
        client = make_client(url)
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            futures = [
                pool.submit(client.chat.completions.create, model=model, messages=MSG,
                            max_tokens=24, temperature=0, extra_body={"ignore_eos": True})
                for _ in range(8)
            ]
            errors = [f.exception() for f in futures]
        assert any(isinstance(e, openai.RateLimitError) for e in errors), errors
        assert all(e is None or isinstance(e, openai.RateLimitError) for e in errors), errors
