"""`smelt gateway` over three real `smelt serve` nodes (CPU, started empty): models load
where there is room and evict the least recently used unpinned idle model, pinned models stay,
503 when only pinned models are left; and `kill -9` of a node under 16 clients loses no
request, its models load elsewhere on demand, and the node restarted comes back; two
gateways side by side over the same nodes route by what the nodes say, load nothing twice
and keep every node within its room."""

from __future__ import annotations

import concurrent.futures
import threading
import time
from pathlib import Path

import httpx
import openai
import pytest

from conftest import make_client, metric, parse_metrics
from gateway_helpers import ADMIN_KEY, NODE_KEY, Gateway, Node, wait_for

MB_NODE = 700  # two 300 MB models per node, not three
CHAT = [{"role": "user", "content": "Say hi."}]


def models_dir(model_path: str) -> str:
    d = Path(model_path).parent
    if not (d / "gemma-3-270m-q4_k_m.gguf").is_file():
        pytest.fail(f"{d} has no gemma-3-270m-q4_k_m.gguf: run scripts/fetch-models.sh all",
                    pytrace=False)
    return str(d)


def ask(client: openai.OpenAI, model: str, tokens: int = 2) -> str:
    r = client.chat.completions.create(model=model, messages=CHAT, max_tokens=tokens,
                                       temperature=0)
    assert r.model == model
    return r.choices[0].message.content


def test_loads_evict_the_lru_keep_pins_and_503_when_all_pinned(smelt_bin, model_path) -> None:
    d = models_dir(model_path)
    nodes = {n: Node(smelt_bin, d) for n in "abc"}
    catalogue = [
        {"name": "smol-a", "source": "smollm2-135m", "memory_mb": 300},
        {"name": "smol-b", "source": "smollm2-135m", "memory_mb": 300},
        {"name": "gemma-a", "source": "gemma3-270m", "memory_mb": 300,
         "pinned_on": ["a", "b", "c"]},
        {"name": "gemma-b", "source": "gemma3-270m", "memory_mb": 300, "pinned_on": ["a", "b"]},
    ]
    gw = Gateway(smelt_bin, nodes, catalogue, node_mb=MB_NODE)
    try:
        for n in nodes.values():
            n.start()
        gw.start()
        # Pins load at start: a and b are full of pins, c keeps one slot.
        wait_for("the pinned models loaded",
                 lambda: gw.placement() == {"a": {"gemma-a": "loaded", "gemma-b": "loaded"},
                                            "b": {"gemma-a": "loaded", "gemma-b": "loaded"},
                                            "c": {"gemma-a": "loaded"}},
                 120, gw.log)
        client = make_client(gw.url)

        # smol-a is loaded nowhere: it loads on c (the most free room) while the request
        # waits, and /v1/models shows it loading meanwhile.
        assert client.models.retrieve("smol-a").model_dump()["state"] == "unloaded"
        seen: set[str] = set()
        loading_on: set[str] = set()
        on_c: set[str] = set()  # smol-a's state on c as /admin/nodes says
        stop = threading.Event()

        watching = threading.Event()

        def watch() -> None:
            with httpx.Client(timeout=10) as h:
                admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
                while not stop.is_set():
                    m = h.get(gw.url + "/v1/models/smol-a").json()
                    seen.add(m["state"])
                    loading_on.update(m["loading_on"])
                    nodes_now = h.get(gw.url + "/admin/nodes", headers=admin).json()["data"]
                    c = next(n for n in nodes_now if n["name"] == "c")
                    on_c.update(x["state"] for x in c["models"] if x["id"] == "smol-a")
                    watching.set()
                    time.sleep(0.005)

        watcher = threading.Thread(target=watch)
        watcher.start()
        assert watching.wait(30), "the watcher got no answer"
        try:
            assert ask(client, "smol-a")
        finally:
            stop.set()
            watcher.join()
        assert {"loading", "loaded"} <= seen, seen
        assert loading_on == {"c"}, loading_on
        assert {"loading", "loaded"} <= on_c, on_c
        assert gw.where("smol-a") == ["c"]

        # smol-b: no node has room; only c has an unpinned idle model (smol-a): evicted.
        ask(client, "smol-b")
        gw.settle()
        assert gw.placement()["c"] == {"gemma-a": "loaded", "smol-b": "loaded"}
        # Pinned models serve where they are, loading nothing.
        ask(client, "gemma-a")
        ask(client, "gemma-b")
        ask(client, "smol-a")
        gw.settle()
        p = gw.placement()
        assert p["c"] == {"gemma-a": "loaded", "smol-a": "loaded"}, p
        assert p["a"] == p["b"] == {"gemma-a": "loaded", "gemma-b": "loaded"}, p
        with httpx.Client(base_url=gw.url) as h:
            assert metric(h, "smelt_gateway_evictions_total", node="c") == 2
            assert metric(h, "smelt_gateway_loads_total", model="smol-a", node="c",
                          outcome="ok") == 2
        # Every node's memory stays within its room.
        for n in gw.node_states().values():
            assert n["used_bytes"] <= n["room_bytes"], n

        # Pin smol-a on c by hand: now every slot is pinned and smol-b has nowhere to go.
        r = gw.admin.post("/admin/models",
                          json={"action": "pin", "model": "smol-a", "node": "c"})
        assert r.status_code == 200, r.text
        with pytest.raises(openai.InternalServerError) as e:
            ask(client, "smol-b")
        assert e.value.status_code == 503
        assert "pinned or serving" in e.value.message, e.value.message
        assert gw.placement()["c"] == {"gemma-a": "loaded", "smol-a": "loaded"}
        # Unpinned again, smol-b evicts it as before.
        r = gw.admin.post("/admin/models",
                          json={"action": "unpin", "model": "smol-a", "node": "c"})
        assert r.status_code == 200, r.text
        ask(client, "smol-b")
    finally:
        gw.stop()
        for n in nodes.values():
            n.stop()


def test_kill_9_of_a_node_under_16_clients_loses_no_request(smelt_bin, model_path) -> None:
    d = models_dir(model_path)
    nodes = {n: Node(smelt_bin, d) for n in "abc"}
    catalogue = [
        {"name": "smol", "source": "smollm2-135m", "memory_mb": 300, "pinned_on": ["b", "c"]},
        {"name": "gemma", "source": "gemma3-270m", "memory_mb": 300, "pinned_on": ["a"]},
    ]
    gw = Gateway(smelt_bin, nodes, catalogue, node_mb=MB_NODE)
    try:
        for n in nodes.values():
            n.start()
        gw.start()
        wait_for("the pinned models loaded",
                 lambda: gw.where("smol") == ["b", "c"] and gw.where("gemma") == ["a"],
                 120, gw.log)
        client = make_client(gw.url)
        done = 0
        lock = threading.Lock()

        def one_client(i: int) -> list[str]:
            nonlocal done
            out = []
            for k in range(3):
                model = "gemma" if (i + k) % 2 else "smol"
                # Any failure (status or exception) is a lost request.
                out.append(ask(client, model, tokens=4))
                with lock:
                    done += 1
            return out

        def killer() -> None:
            # Mid-run, with requests on a (sent there and not answered yet).
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                if done >= 4 and gw.node_states()["a"]["in_flight"] >= 2:
                    break
                time.sleep(0.01)
            nodes["a"].kill9()

        k = threading.Thread(target=killer)
        k.start()
        with concurrent.futures.ThreadPoolExecutor(16) as pool:
            results = list(pool.map(one_client, range(16)))
        k.join()
        assert not nodes["a"].alive()
        assert sum(len(r) for r in results) == 48
        # gemma lived only on a: it was loaded elsewhere on demand.
        loaded = gw.where("gemma")
        assert loaded and "a" not in loaded, loaded
        assert gw.node_states()["a"]["state"] == "down"
        with httpx.Client(base_url=gw.url) as h:
            # Requests were on a when it died (gemma lived only there) and went elsewhere.
            assert metric(h, "smelt_gateway_retries_total", model="gemma", node="a") >= 1

        # Restarted, a comes back: up again, its pin reloaded, and it takes requests.
        nodes["a"].start()
        wait_for("node a back up with its pinned model",
                 lambda: "a" in gw.where("gemma"), 60, gw.log)
        with httpx.Client(base_url=gw.url) as h:
            # a may have answered no gemma request before it died: no sample yet is 0.
            before = sum(v for n, lab, v in parse_metrics(h.get("/metrics").text)
                         if n == "smelt_gateway_requests_total"
                         and lab.get("model") == "gemma" and lab.get("node") == "a")
            with concurrent.futures.ThreadPoolExecutor(8) as pool:
                list(pool.map(lambda _: ask(client, "gemma", 2), range(8)))
            after = metric(h, "smelt_gateway_requests_total", model="gemma", node="a")
            assert after > before, "the restarted node got no requests"
    finally:
        gw.stop()
        for n in nodes.values():
            n.stop()


def test_a_node_joins_by_itself_and_rejoins_a_restarted_gateway(smelt_bin, model_path) -> None:
    """`smelt serve --gateway URL --name NAME --gateway-key K`: registration and heartbeats."""
    gw = Gateway(smelt_bin, {}, [{"name": "smol", "source": "smollm2-135m"}])
    node = None
    try:
        gw.start()
        assert gw.node_states() == {}
        node = Node(smelt_bin, models_dir(model_path), "--gateway", gw.url, "--name", "n1",
                    "--gateway-key", ADMIN_KEY)
        node.start()
        wait_for("the node registered and is up",
                 lambda: gw.node_states().get("n1", {}).get("state") == "up", 30, gw.log)
        n1 = gw.node_states()["n1"]
        assert n1["origin"] == "registered" and n1["url"] == node.url, n1
        # Its room is what it reports; the model loads there on demand (no memory_mb given:
        # the gateway learns the model's size from the node).
        assert n1["room_bytes"] > 0
        assert ask(make_client(gw.url), "smol")
        assert gw.where("smol") == ["n1"]
        assert gw.node_states()["n1"]["models"][0]["bytes"] > 0
        # A gateway that restarts keeps nothing: the next heartbeat brings the node back.
        gw.stop()
        gw.start()
        wait_for("the node rejoined the restarted gateway",
                 lambda: gw.node_states().get("n1", {}).get("state") == "up", 30, gw.log)
        assert gw.where("smol") == ["n1"], "what is loaded is rebuilt from the node"
        # A wrong gateway key is refused (and the node says so in its log).
        bad = Node(smelt_bin, models_dir(model_path), "--gateway", gw.url, "--name", "n2",
                   "--gateway-key", "wrong")
        bad.start()
        try:
            wait_for("the node logged its refused registration",
                     lambda: "cannot register with the gateway" in bad.log(), 30, bad.log)
            assert "n2" not in gw.node_states()
        finally:
            bad.stop()
    finally:
        gw.stop()
        if node:
            node.stop()


def loads(gw: Gateway, model: str) -> float:
    """Loads of `model` this gateway asked for, successful or not (0 before the first)."""
    with httpx.Client(base_url=gw.url) as h:
        return sum(v for n, lab, v in parse_metrics(h.get("/metrics").text)
                   if n == "smelt_gateway_loads_total" and lab.get("model") == model)


def on_node(node: Node) -> list[str]:
    """The models a node itself says it has loaded (its own /admin/models)."""
    r = httpx.get(node.url + "/admin/models", timeout=10,
                  headers={"Authorization": f"Bearer {NODE_KEY}"})
    assert r.status_code == 200, r.text
    return sorted(m["id"] for m in r.json()["data"])


def test_two_gateways_side_by_side_share_the_nodes(smelt_bin, model_path) -> None:
    """Two gateways, the same nodes and catalogue, no link between them (as behind a load
    balancer): each routes to where a model is, whichever gateway loaded it; neither loads a
    second copy of what the other loaded; an eviction by one is seen by the other; and no
    node ever holds more than its room (one 300 MB model in 400 MB here), even when both
    load into the same room at once."""
    d = models_dir(model_path)
    nodes = {n: Node(smelt_bin, d) for n in "ab"}
    catalogue = [
        {"name": "smol", "source": "smollm2-135m", "memory_mb": 300},
        {"name": "gemma", "source": "gemma3-270m", "memory_mb": 300},
        {"name": "smol-2", "source": "smollm2-135m", "memory_mb": 300},
        {"name": "gemma-2", "source": "gemma3-270m", "memory_mb": 300},
    ]
    g1 = Gateway(smelt_bin, nodes, catalogue, node_mb=400)
    g2 = Gateway(smelt_bin, nodes, catalogue, node_mb=400)
    gws = (g1, g2)

    def within_room() -> None:
        for name, n in nodes.items():
            assert len(on_node(n)) <= 1, (name, on_node(n))
        for gw in gws:
            for n in gw.node_states().values():
                assert n["used_bytes"] <= n["room_bytes"], n

    def both_see(placement: dict[str, dict[str, str]]) -> None:
        for gw in gws:
            wait_for(f"{gw.url} saw {placement}", lambda: gw.placement() == placement, 30,
                     gw.log)

    try:
        for n in nodes.values():
            n.start()
        for gw in gws:
            gw.start()
        c1, c2 = make_client(g1.url), make_client(g2.url)

        # Loaded through g1; once the nodes say so, g2 routes there and loads nothing.
        ask(c1, "smol")
        [x] = g1.where("smol")
        y = "b" if x == "a" else "a"
        both_see({x: {"smol": "loaded"}, y: {}})
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            answers = list(pool.map(lambda i: ask((c1, c2)[i % 2], "smol"), range(8)))
        assert all(answers), answers
        assert (loads(g1, "smol"), loads(g2, "smol")) == (1, 0)
        for gw in gws:
            with httpx.Client(base_url=gw.url) as h:
                assert metric(h, "smelt_gateway_requests_total", model="smol", node=x) >= 4
        assert (on_node(nodes[x]), on_node(nodes[y])) == (["smol"], [])

        # Loaded through g2 on the node with room left; g1 then uses it where it is.
        ask(c2, "gemma")
        both_see({x: {"smol": "loaded"}, y: {"gemma": "loaded"}})
        ask(c1, "gemma")
        assert (loads(g1, "gemma"), loads(g2, "gemma")) == (0, 1)
        within_room()

        # No room left: g1 evicts the idle smol on x (equal room on both: the config's
        # first node), and g2, which saw only the nodes, adopts the change.
        ask(c1, "smol-2")
        both_see({x: {"smol-2": "loaded"}, y: {"gemma": "loaded"}})
        within_room()
        # smol again, through g2: it evicts smol-2, which g1 loaded, and loads smol there.
        ask(c2, "smol")
        both_see({x: {"smol": "loaded"}, y: {"gemma": "loaded"}})
        within_room()
        assert sum(loads(gw, m) for gw in gws for m in ("smol", "gemma", "smol-2")) == 4
        ask(c1, "smol")
        assert loads(g1, "smol") == 1, "g1 used the smol g2 loaded"

        # Both at once, each planning on the same view (both nodes full, equal room): both
        # pick x and would each load there. The node takes one load and refuses the other
        # (`expect_loaded`), whose gateway reads it again and plans anew; meanwhile no node
        # holds more than its room.
        most: dict[str, int] = {}
        stop = threading.Event()

        def watch() -> None:
            while not stop.is_set():
                for name, n in nodes.items():
                    most[name] = max(most.get(name, 0), len(on_node(n)))

        watcher = threading.Thread(target=watch)
        watcher.start()
        try:
            with concurrent.futures.ThreadPoolExecutor(2) as pool:
                both = list(pool.map(lambda cm: ask(*cm), [(c1, "smol-2"), (c2, "gemma-2")]))
        finally:
            stop.set()
            watcher.join()
        assert all(both), both
        assert most == {"a": 1, "b": 1}, most
        for gw in gws:
            gw.settle()
        within_room()
    finally:
        for gw in gws:
            gw.stop()
        for n in nodes.values():
            n.stop()
