"""`smelt gateway` through the official `openai` package, in front of one real `smelt serve`
node: chat, streams, completions, models and errors, with every greedy output equal to what
the node itself answers; a client that leaves a stream cancels it on the node."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Iterator

import httpx
import openai
import pytest

from conftest import make_client, metric
from gateway_helpers import Gateway, Node

USER_KEY = "k-user"
MODEL = "smollm2-135m"
CHAT = [{"role": "user", "content": "Name three colours."}]


@pytest.fixture(scope="module")
def cluster(smelt_bin: str, model_path: str) -> Iterator[tuple[Node, Gateway]]:
    node = Node(smelt_bin, str(Path(model_path).parent), models=(MODEL,))
    node.start()
    gw = Gateway(
        smelt_bin, {"a": node},
        [{"name": MODEL, "source": MODEL, "memory_mb": 400},
         {"name": "gemma", "source": "gemma3-270m", "memory_mb": 400}],
        api_keys=[USER_KEY],
    )
    try:
        gw.start()
        yield node, gw
    finally:
        gw.stop()
        node.stop()


@pytest.fixture(scope="module")
def via_gw(cluster) -> openai.OpenAI:
    return make_client(cluster[1].url, USER_KEY)


@pytest.fixture(scope="module")
def direct(cluster) -> openai.OpenAI:
    return make_client(cluster[0].url)


def stream_text(chunks) -> tuple[str, int, str | None]:
    """A chat stream's text, its number of chunks with a choice, and its finish reason."""
    text, n, finish = "", 0, None
    for c in chunks:
        if not c.choices:
            continue
        choice = c.choices[0]
        text += choice.delta.content or ""
        finish = choice.finish_reason or finish
        n += 1
    return text, n, finish


def test_models_list_the_catalogue_with_where_each_is(via_gw) -> None:
    models = {m.id: m for m in via_gw.models.list().data}
    assert set(models) == {MODEL, "gemma"}
    assert all(m.object == "model" for m in models.values())
    smol = models[MODEL].model_dump()
    assert smol["state"] == "loaded" and smol["loaded_on"] == ["a"], smol
    assert models["gemma"].model_dump()["state"] == "unloaded"
    assert via_gw.models.retrieve(MODEL).id == MODEL


def test_chat_equals_the_nodes_own(via_gw, direct) -> None:
    args = dict(model=MODEL, messages=CHAT, max_tokens=12, temperature=0)
    mine, theirs = via_gw.chat.completions.create(**args), direct.chat.completions.create(**args)
    assert mine.choices[0].message.content == theirs.choices[0].message.content
    assert mine.choices[0].message.content
    assert mine.usage == theirs.usage
    assert mine.model == MODEL and mine.object == "chat.completion"


def test_chat_stream_equals_the_nodes_own(via_gw, direct) -> None:
    args = dict(model=MODEL, messages=CHAT, max_tokens=12, temperature=0, stream=True,
                stream_options={"include_usage": True})
    mine = list(via_gw.chat.completions.create(**args))
    theirs = list(direct.chat.completions.create(**args))
    assert stream_text(mine) == stream_text(theirs)
    assert mine[-1].usage == theirs[-1].usage and mine[-1].usage.completion_tokens == 12
    plain = via_gw.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=12,
                                           temperature=0)
    assert stream_text(mine)[0] == plain.choices[0].message.content


def test_completions_equal_the_nodes_own(via_gw, direct) -> None:
    args = dict(model=MODEL, prompt="The capital of France is", max_tokens=8, temperature=0)
    mine, theirs = via_gw.completions.create(**args), direct.completions.create(**args)
    assert mine.choices[0].text == theirs.choices[0].text and mine.choices[0].text
    assert mine.usage == theirs.usage
    streamed = "".join(c.choices[0].text for c in
                       via_gw.completions.create(**args, stream=True) if c.choices)
    assert streamed == mine.choices[0].text


def test_errors_in_openais_shape(cluster, via_gw) -> None:
    node, gw = cluster
    with pytest.raises(openai.NotFoundError) as e:
        via_gw.chat.completions.create(model="no-such-model", messages=CHAT, max_tokens=1)
    assert e.value.code == "model_not_found" and e.value.param == "model"
    with pytest.raises(openai.AuthenticationError):
        make_client(gw.url, "wrong").models.list()
    with pytest.raises(openai.AuthenticationError):
        make_client(gw.url, "wrong").chat.completions.create(model=MODEL, messages=CHAT)
    # The node's own 400s pass through unchanged, and never count against it.
    with pytest.raises(openai.BadRequestError) as e:
        via_gw.chat.completions.create(model=MODEL, messages=[], max_tokens=1)
    assert e.value.param == "messages"
    with pytest.raises(openai.BadRequestError) as e:
        via_gw.completions.create(model=MODEL, prompt="word " * 2000, max_tokens=1)
    assert e.value.code == "context_length_exceeded"
    r = httpx.post(gw.url + "/v1/chat/completions", content=b"{not json",
                   headers={"Authorization": f"Bearer {USER_KEY}",
                            "Content-Type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    r = httpx.post(gw.url + "/v1/chat/completions", json={"messages": CHAT},
                   headers={"Authorization": f"Bearer {USER_KEY}"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "model"
    assert gw.node_states()["a"]["state"] == "up"
    # The gateway's admin takes only its admin key; the node's key is never shown.
    assert httpx.get(gw.url + "/admin/nodes",
                     headers={"Authorization": f"Bearer {USER_KEY}"}).status_code == 401
    assert "k-node" not in gw.admin.get("/admin/nodes").text


def test_health_and_metrics(cluster, via_gw) -> None:
    _, gw = cluster
    via_gw.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=1)
    r = httpx.get(gw.url + "/health")
    assert r.status_code == 200 and r.json()["nodes_up"] == 1
    with httpx.Client(base_url=gw.url) as h:
        assert metric(h, "smelt_gateway_requests_total", model=MODEL, node="a", status="200") >= 1
        assert metric(h, "smelt_gateway_requests_total", model="no-such-model", status="404") >= 1
        assert metric(h, "smelt_gateway_node_up", node="a") == 1


def test_a_client_that_leaves_a_stream_cancels_it_on_the_node(cluster) -> None:
    node, gw = cluster
    running = lambda: metric(h, "smelt_running_sequences", model=MODEL)  # noqa: E731
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Tell a long story."}],
            "max_tokens": 400, "temperature": 0, "stream": True, "ignore_eos": True}
    with httpx.Client(base_url=node.url, timeout=60) as h:
        with httpx.Client(timeout=300) as c:
            with c.stream("POST", gw.url + "/v1/chat/completions", json=body,
                          headers={"Authorization": f"Bearer {USER_KEY}"}) as r:
                assert r.status_code == 200
                lines = r.iter_lines()  # held, so `break` leaves the stream open
                seen = 0
                for line in lines:
                    if line.startswith("data: ") and line != "data: [DONE]":
                        json.loads(line[6:])
                        seen += 1
                    if seen >= 3:
                        break
                assert running() == 1
                assert gw.node_states()["a"]["in_flight"] == 1
        deadline = time.monotonic() + 15
        while running() != 0:
            assert time.monotonic() < deadline, "the node kept generating after the client left"
            time.sleep(0.1)
    deadline = time.monotonic() + 5
    while gw.node_states()["a"]["in_flight"] != 0:
        assert time.monotonic() < deadline, "the gateway still counts the stream in flight"
        time.sleep(0.1)


def test_a_client_that_leaves_a_non_streamed_request_cancels_it_on_the_node(cluster) -> None:
    node, gw = cluster
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Tell a long story."}],
            "max_tokens": 400, "temperature": 0, "ignore_eos": True}
    with httpx.Client(base_url=node.url, timeout=60) as h:
        try:
            httpx.post(gw.url + "/v1/chat/completions", json=body, timeout=1.5,
                       headers={"Authorization": f"Bearer {USER_KEY}"})
            raise AssertionError("a 400-token answer came back within 1.5 s")
        except httpx.TimeoutException:
            pass
        deadline = time.monotonic() + 15
        while metric(h, "smelt_running_sequences", model=MODEL) != 0:
            assert time.monotonic() < deadline, "the node kept generating after the client left"
            time.sleep(0.1)


def test_admin_loads_and_unloads_by_hand(cluster, via_gw) -> None:
    _, gw = cluster
    r = gw.admin.post("/admin/models", json={"action": "load", "model": "gemma", "node": "a"})
    assert r.status_code == 200, r.text
    assert gw.where("gemma") == ["a"]
    assert via_gw.chat.completions.create(model="gemma", messages=CHAT, max_tokens=2).model == "gemma"
    r = gw.admin.post("/admin/models", json={"action": "unload", "model": "gemma", "node": "a"})
    assert r.status_code == 200, r.text
    assert gw.where("gemma") == []
    assert via_gw.models.retrieve("gemma").model_dump()["state"] == "unloaded"
    for bad, param in [({"action": "load", "model": "nope", "node": "a"}, "model"),
                       ({"action": "load", "model": "gemma", "node": "zz"}, "node"),
                       ({"action": "dance", "model": "gemma", "node": "a"}, "action")]:
        r = gw.admin.post("/admin/models", json=bad)
        assert r.status_code in (400, 404), r.text
        assert r.json()["error"]["param"] == param, r.text


def test_embeddings_equal_the_nodes_own(via_gw, direct) -> None:
    args = dict(model=MODEL, input=["Hello world", "Name three colours."], encoding_format="float")
    mine, theirs = via_gw.embeddings.create(**args), direct.embeddings.create(**args)
    assert [d.embedding for d in mine.data] == [d.embedding for d in theirs.data]
    assert mine.usage == theirs.usage and len(mine.data[0].embedding) == 576


def test_the_gateway_refuses_what_serve_refuses(cluster) -> None:
    """The same edge as `smelt serve` (smelt_http): foreign Host names, cross-origin pages and
    non-JSON bodies are refused before any node is asked."""
    _, gw = cluster
    auth = {"Authorization": f"Bearer {USER_KEY}"}
    body = json.dumps({"model": MODEL, "messages": CHAT, "max_tokens": 1})
    r = httpx.get(gw.url + "/v1/models", headers={**auth, "Host": "evil.example"})
    assert r.status_code == 403 and r.json()["error"]["code"] == "host_not_allowed"
    r = httpx.post(gw.url + "/v1/chat/completions", content=body,
                   headers={**auth, "Origin": "http://evil.example", "Content-Type": "text/plain"})
    assert r.status_code == 403 and r.json()["error"]["code"] == "origin_not_allowed"
    r = httpx.post(gw.url + "/v1/chat/completions", content=body,
                   headers={**auth, "Content-Type": "text/plain"})
    assert r.status_code == 415
