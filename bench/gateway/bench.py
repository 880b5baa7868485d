"""The gateway's overhead (issue 22): one `smelt serve` node alone vs the same node behind
`smelt gateway`, C concurrent streamed completions of T tokens each (greedy, end of
generation suppressed so every stream does the same work). Rounds alternate direct and
gateway so drift hits both alike. Per mode: aggregate generated tokens/s (tokens over the
round's wall time) and the median time to first token over all streams; then one stream at a
time (max_tokens 1) for the gateway's added latency per request without batching noise.
Also the CPU time the gateway process used. Prints a table last; the bar is >= 95% of the node's throughput and < 1 ms added median TTFT.

Usage: bench.py SMELT_BIN MODEL [--streams 64] [--tokens 32] [--rounds 3] [--threads N]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import tempfile
import threading
import time

import httpx

PROMPTS = [
    "The history of the Roman Empire begins",
    "In a small village at the edge of the forest,",
    "The main components of a modern computer are",
    "Photosynthesis is the process by which",
    "The best way to learn a new language is",
    "On the first day of the expedition, the explorers",
    "A good recipe for bread needs",
    "The theory of relativity explains",
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_seconds(pid: int) -> float:
    """User plus system CPU time of a process so far (Linux /proc)."""
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def wait_ok(url: str, proc: subprocess.Popen, log: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"{url}: the process exited:\n{open(log).read()[-3000:]}")
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise SystemExit(f"{url} did not answer 200 within {timeout:.0f} s")


def one_stream(http: httpx.Client, url: str, k: int, tokens: int, out: list, lock) -> None:
    body = {"model": "m", "prompt": PROMPTS[k % len(PROMPTS)], "max_tokens": tokens,
            "temperature": 0, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}}
    t0 = time.perf_counter()
    ttft, n = None, 0
    with http.stream("POST", url + "/v1/completions", json=body) as r:
        if r.status_code != 200:
            raise SystemExit(f"{url}: {r.status_code} {r.read()[:300]!r}")
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if "error" in chunk:
                raise SystemExit(f"{url}: stream error {chunk}")
            if ttft is None:
                ttft = time.perf_counter() - t0
            if chunk.get("usage"):
                n = chunk["usage"]["completion_tokens"]
    with lock:
        out.append((ttft, n))


def round_(url: str, streams: int, tokens: int) -> tuple[float, list[float]]:
    """Aggregate tokens/s and every stream's TTFT for one round of `streams` at once."""
    out: list = []
    lock = threading.Lock()
    clients = [httpx.Client(timeout=600) for _ in range(streams)]
    threads = [threading.Thread(target=one_stream, args=(c, url, k, tokens, out, lock))
               for k, c in enumerate(clients)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    for c in clients:
        c.close()
    if len(out) != streams:
        raise SystemExit(f"{url}: {streams - len(out)} streams failed")
    total = sum(n for _, n in out)
    if total != streams * tokens:
        raise SystemExit(f"{url}: {total} tokens, expected {streams * tokens}")
    return total / wall, [t for t, _ in out]


def single(url: str, n: int) -> list[float]:
    """TTFT of `n` one-token streams sent one after another on one connection."""
    out: list = []
    lock = threading.Lock()
    with httpx.Client(timeout=600) as http:
        for k in range(n):
            one_stream(http, url, k, 1, out, lock)
    return [t for t, _ in out]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("smelt_bin")
    ap.add_argument("model")
    ap.add_argument("--streams", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--singles", type=int, default=40)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    a = ap.parse_args()

    work = tempfile.mkdtemp(prefix="smelt-gw-bench-")
    node_port, gw_port = free_port(), free_port()
    node_url, gw_url = f"http://127.0.0.1:{node_port}", f"http://127.0.0.1:{gw_port}"
    node_log, gw_log = f"{work}/node.log", f"{work}/gateway.log"
    # Served as `m` (the catalogue name) so the same body goes to both.
    node = subprocess.Popen(
        [a.smelt_bin, "serve", "--no-model", "--port", str(node_port), "--threads",
         str(a.threads), "--max-batch", str(max(a.streams, 1)), "--max-queue", "1024",
         "--ctx", "512", "--kv-tokens", str(max(a.streams, 1) * 128),
         "--models-dir", os.path.dirname(os.path.abspath(a.model))],
        stdout=open(node_log, "w"), stderr=subprocess.STDOUT)
    procs = [node]
    try:
        wait_ok(node_url + "/live", node, node_log)
        r = httpx.post(node_url + "/admin/models", json={"model": a.model, "id": "m"},
                       timeout=300)
        assert r.status_code == 200, r.text
        config = f"{work}/gateway.toml"
        with open(config, "w") as f:
            f.write(f'[[node]]\nname = "a"\nurl = "{node_url}"\n\n'
                    f'[[model]]\nname = "m"\nsource = "{a.model}"\n')
        gw = subprocess.Popen([a.smelt_bin, "gateway", "--config", config, "--port",
                               str(gw_port)], stdout=open(gw_log, "w"), stderr=subprocess.STDOUT)
        procs.append(gw)
        wait_ok(gw_url + "/health", gw, gw_log)
        # Warm both paths (connections, the gateway's view of the node).
        round_(node_url, min(a.streams, 4), 2)
        round_(gw_url, min(a.streams, 4), 2)

        cpu0 = {"node": cpu_seconds(node.pid), "gateway": cpu_seconds(gw.pid)}
        tps = {"node": [], "gateway": []}
        ttft = {"node": [], "gateway": []}
        for i in range(a.rounds):
            for mode, url in (("node", node_url), ("gateway", gw_url))[:: 1 if i % 2 == 0 else -1]:
                t, f = round_(url, a.streams, a.tokens)
                tps[mode].append(t)
                ttft[mode].extend(f)
                print(f"round {i} {mode:8s} {t:8.1f} tok/s  median TTFT "
                      f"{statistics.median(f) * 1e3:8.1f} ms", flush=True)
        cpu = {k: cpu_seconds(p.pid) - cpu0[k] for k, p in (("node", node), ("gateway", gw))}
        gw_tokens = a.rounds * a.streams * a.tokens
        one = {"node": [], "gateway": []}
        for i in range(a.singles):
            for mode, url in (("node", node_url), ("gateway", gw_url))[:: 1 if i % 2 == 0 else -1]:
                one[mode].extend(single(url, 1))

        def med(xs: list[float]) -> float:
            return statistics.median(xs) * 1e3

        n_tps, g_tps = statistics.mean(tps["node"]), statistics.mean(tps["gateway"])
        print()
        print(f"streams={a.streams} tokens={a.tokens} rounds={a.rounds} node threads={a.threads}")
        print(f"{'':28s}{'node':>12s}{'gateway':>12s}{'gateway/node':>14s}")
        print(f"{'aggregate tok/s (mean)':28s}{n_tps:12.1f}{g_tps:12.1f}{g_tps / n_tps:13.1%} ")
        print(f"{'median TTFT, C streams (ms)':28s}{med(ttft['node']):12.2f}"
              f"{med(ttft['gateway']):12.2f}{med(ttft['gateway']) - med(ttft['node']):+13.2f} ")
        print(f"{'median TTFT, 1 stream (ms)':28s}{med(one['node']):12.2f}"
              f"{med(one['gateway']):12.2f}{med(one['gateway']) - med(one['node']):+13.2f} ")
        print(f"CPU over the C-stream rounds: node {cpu['node']:.2f} s (both modes), gateway "
              f"{cpu['gateway']:.2f} s = {cpu['gateway'] / gw_tokens * 1e3:.3f} ms per streamed token")
    finally:
        for p in procs:
            p.terminate()
            p.wait()


if __name__ == "__main__":
    main()
